"""The Hugging Face transformers baselines, with the stage API, so the harness runs them like stages:

    hf          transformers eager attention, one request at a time, its own dynamic KV cache
    hf-sdpa     attention_implementation="sdpa", requests batched (batch_size at a time, left-padded)
    hf-compile  sdpa + StaticCache + torch.compile(mode="reduce-overhead"): the decode step is compiled and
                replayed as a CUDA graph (transformers' own `cache_implementation="static"` path); batch 1
    hf-cb       transformers' own continuous batching (its ContinuousBatchingManager, as `generate_batch` uses
                it: a paged KV cache, requests joining and leaving every step), each request with its own
                max_tokens, on its defaults: with sdpa attention (flash attention is not on the H200's image)
                they capture no CUDA graphs and take no decode fast path, which need an attention without a
                mask (transformers 5.17's continuous_batching/initialization.py)

`python -m common.bench --stages hf,hf-compile,04 --workload latency`. Needs torch with CUDA and transformers
(the `ref` extra); `device="cpu"` exists for the CPU tests only. It loads the same checkpoint folder as the stages.
Timings are taken the same way as the stages': the wall clock when each new token reaches the host.

A batch of hf and hf-sdpa is HF's static batch: it runs until its longest request's max_tokens; a row's tokens past
its own max_tokens (or after its stop id) are computed, then thrown away, and are not counted as output. hf-cb's
manager is made once, at the first generate() (its warm-up, which captures its graphs, is the harness's warm-up,
outside the figures), sized for max_num_seqs requests of max_model_len positions, and kept for the next calls;
its timings are the times the manager's loop recorded each token.
"""
from __future__ import annotations

from dataclasses import replace

from common.config import LlamaConfig
from common.outputs import RequestOutput, Timing
from common.prompts import PromptPreparer
from common.sampling import SamplingParams
from common.synthetic import resolve_model

PAD_TOKEN_ID = 128004   # Llama 3's <|finetune_right_pad_id|>; 0 would be a real token


class Engine:
    def __init__(self, model: str, max_model_len: int | None = None, attn_implementation: str = "eager",
                 batch_size: int = 1, compile: bool = False, continuous_batching: bool = False,
                 max_num_seqs: int = 256, device: str = "cuda", dtype: str = "bfloat16"):
        import torch
        import transformers

        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("the HF baseline needs torch with CUDA")
        if compile and batch_size != 1:
            raise ValueError("hf-compile is measured at batch 1")
        self.torch, self.device, self.batch_size, self.compile = torch, device, batch_size, compile
        self.continuous_batching, self.max_num_seqs = continuous_batching, max_num_seqs
        self._manager_params = None          # hf-cb: the sampling parameters its kept manager was made with
        self.folder = resolve_model(model)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            self.folder, dtype=getattr(torch, dtype), attn_implementation=attn_implementation).to(device).eval()
        self.config = LlamaConfig.from_file(self.folder)
        self.prompts = PromptPreparer(self.folder, self.config, max_model_len)
        self.max_model_len = self.prompts.max_model_len
        self.timings: list[Timing] = []

    def generate(self, prompts, params: SamplingParams | list[SamplingParams]) -> list[RequestOutput]:
        """Every prompt to completion, batch_size at a time in arrival order; outputs in prompt order."""
        requests = self.prompts.requests(prompts, params)
        self.timings = [Timing(len(ids)) for ids, _ in requests]   # every clock starts now, as in stage04
        if self.continuous_batching:
            return self._continuous(requests)
        outs = []
        for first in range(0, len(requests), self.batch_size):
            outs += self._batch(requests[first:first + self.batch_size], first)
        return outs

    def _shared(self, requests) -> tuple[SamplingParams, list[int], list[int]]:
        """The one set of sampling parameters every request shares (max_tokens aside), each request's token
        budget (its max_tokens, cut at max_model_len) and the stop ids."""
        p = requests[0][1]
        if any(replace(q, max_tokens=1) != replace(p, max_tokens=1) for _, q in requests):
            raise ValueError("the HF baseline batches only requests whose sampling parameters differ in "
                             "max_tokens alone")
        budget = [min(q.max_tokens, self.max_model_len - len(ids)) for ids, q in requests]
        return p, budget, sorted(self.prompts.stop_ids(p))

    def _config(self, p: SamplingParams, max_new: int, stop: list[int], **extra):
        """A GenerationConfig for `p`; `extra` overrides or adds fields."""
        from transformers import GenerationConfig

        return GenerationConfig(**{
            "max_new_tokens": max_new, "min_new_tokens": max_new if p.ignore_eos else 0, "do_sample": not p.greedy,
            "temperature": p.temperature if not p.greedy else None, "top_k": p.top_k if p.top_k > 0 else None,
            "top_p": p.top_p, "eos_token_id": stop or None, "pad_token_id": PAD_TOKEN_ID, **extra})

    def _outputs(self, requests, first: int, tokens: list[list[int]], stop: list[int]) -> list[RequestOutput]:
        """Each request's new tokens up to and with its first stop id, and why it finished."""
        outs = []
        for row, ((prompt, _), new) in enumerate(zip(requests, tokens)):
            cut = next((i + 1 for i, t in enumerate(new) if t in stop), len(new))
            new = list(new[:cut])
            reason = "stop" if new and new[-1] in stop else "length"
            outs.append(RequestOutput(first + row, prompt, new, self.prompts.tokenizer.decode(new), reason))
        return outs

    def _cpu_cache(self):
        """On a CPU, the KV cache of max_num_seqs sequences of max_model_len (256-token pages): transformers would
        otherwise size it from the machine's whole memory (14 GB for a test's three tiny requests). On a GPU,
        transformers' own sizing from free memory, as its users get it: None."""
        if self.device != "cpu":
            return None
        from transformers.generation import ContinuousBatchingConfig

        pages = -(-self.max_model_len // 256)
        return ContinuousBatchingConfig(num_blocks=self.max_num_seqs * pages,
                                        max_batch_tokens=min(self.max_num_seqs * self.max_model_len, 2048))

    def _continuous(self, requests) -> list[RequestOutput]:
        """hf-cb: every request into transformers' continuous-batching manager at once, each with its own
        max_tokens; the outputs as its loop finishes them, put back in prompt order."""
        from transformers.generation.continuous_batching.utils import WorkloadHints

        p, budget, stop = self._shared(requests)
        key = replace(p, max_tokens=1)
        if self._manager_params not in (None, key):              # made for other sampling parameters
            self.model.destroy_cached_continuous_batching_manager()
        self._manager_params = key
        hints = WorkloadHints(max_prompt_length=self.max_model_len, max_generated_length=0,
                              num_requests=self.max_num_seqs)
        if p.seed is not None:
            self.torch.manual_seed(p.seed)
        done = {}
        with self.model.continuous_batching_context_manager(
                # each request brings its own max_tokens and stop ids (-1: none, ignore_eos)
                generation_config=self._config(p, self.max_model_len, stop, min_new_tokens=0,
                                               eos_token_id=stop or -1),
                block=True, timeout=5, persistent_manager=True, workload_hints=hints,
                **({"continuous_batching_config": cache} if (cache := self._cpu_cache()) else {})) as manager:
            for i, ((ids, _), n) in enumerate(zip(requests, budget)):
                manager.add_request(input_ids=ids, request_id=str(i), max_new_tokens=n, record_timestamps=True,
                                    eos_token_id=-1 if p.ignore_eos else stop or -1)
            while len(done) < len(requests):
                result = manager.get_result(timeout=1)
                if result is None and not manager.is_running():
                    raise RuntimeError("transformers' continuous batching loop stopped before every request "
                                       f"finished ({len(done)} of {len(requests)})")
                if result is not None and result.is_finished():
                    if result.error:
                        raise RuntimeError(f"transformers' continuous batching: request {result.request_id}: "
                                           f"{result.error}")
                    done[int(result.request_id)] = result
        for i, timing in enumerate(self.timings):
            stamps = done[i].timestamps or []
            if stamps:
                timing.ttft_s = stamps[0] - timing.start
                timing.step_s = [b - a for a, b in zip(stamps, stamps[1:])]
        return self._outputs(requests, 0, [done[i].generated_tokens for i in range(len(requests))], stop)

    def _batch(self, requests: list[tuple[list[int], SamplingParams]], first: int) -> list[RequestOutput]:
        from transformers import CompileConfig

        torch = self.torch
        p, budget, stop = self._shared(requests)
        width = max(len(ids) for ids, _ in requests)
        extra = {"cache_implementation": "static",
                 "compile_config": CompileConfig(fullgraph=True, mode="reduce-overhead")} if self.compile else {}
        config = self._config(p, max(budget), stop, **extra)
        # left padding: every row's last prompt token is the batch's last column, where decoding starts
        ids = torch.tensor([[PAD_TOKEN_ID] * (width - len(x)) + x for x, _ in requests], device=self.device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x, _ in requests], device=self.device)
        timings = self.timings[first:first + len(requests)]
        if p.seed is not None:
            torch.manual_seed(p.seed)
        with torch.no_grad():
            seq = self.model.generate(ids, attention_mask=mask, generation_config=config,
                                      streamer=_Ticker(timings, budget))
        return self._outputs(requests, first, [seq[row, width:width + n].tolist() for row, n in enumerate(budget)],
                             stop)


class _Ticker:
    """A transformers streamer that stamps the time each step's tokens reach the host, for every row still
    within its own max_tokens."""

    def __init__(self, timings: list[Timing], budget: list[int]):
        self.timings, self.budget, self.step, self.prompt_seen = timings, budget, 0, False

    def put(self, value) -> None:
        if not self.prompt_seen:          # generate() hands the streamer the prompt first
            self.prompt_seen = True
            return
        value.cpu()                       # waits for the GPU to produce it
        self.step += 1
        for timing, n in zip(self.timings, self.budget):
            if self.step <= n:
                timing.tick()

    def end(self) -> None:
        pass
