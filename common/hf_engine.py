"""The Hugging Face transformers baselines, with the stage API, so the harness runs them like stages:

    hf          transformers eager attention, one request at a time, its own dynamic KV cache
    hf-sdpa     attention_implementation="sdpa", requests batched (batch_size at a time, left-padded)
    hf-compile  sdpa + StaticCache + torch.compile(mode="reduce-overhead"): the decode step is compiled and
                replayed as a CUDA graph (transformers' own `cache_implementation="static"` path); batch 1

`python -m common.bench --stages hf,hf-compile,04 --workload latency`. Needs torch with CUDA and transformers
(the `ref` extra); `device="cpu"` exists for the CPU tests only. It loads the same checkpoint folder as the stages.
Timings are taken the same way as the stages': the wall clock when each new token reaches the host.

A batch here is HF's static batch: it runs until its longest request's max_tokens; a row's tokens past its own
max_tokens (or after its stop id) are computed, then thrown away, and are not counted as output.
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
                 batch_size: int = 1, compile: bool = False, device: str = "cuda", dtype: str = "bfloat16"):
        import torch
        import transformers

        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("the HF baseline needs torch with CUDA")
        if compile and batch_size != 1:
            raise ValueError("hf-compile is measured at batch 1")
        self.torch, self.device, self.batch_size, self.compile = torch, device, batch_size, compile
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
        outs = []
        for first in range(0, len(requests), self.batch_size):
            outs += self._batch(requests[first:first + self.batch_size], first)
        return outs

    def _batch(self, requests: list[tuple[list[int], SamplingParams]], first: int) -> list[RequestOutput]:
        from transformers import CompileConfig, GenerationConfig

        torch, p = self.torch, requests[0][1]
        if any(replace(q, max_tokens=1) != replace(p, max_tokens=1) for _, q in requests):
            raise ValueError("the HF baseline batches only requests whose sampling parameters differ in "
                             "max_tokens alone")
        width = max(len(ids) for ids, _ in requests)
        budget = [min(q.max_tokens, self.max_model_len - len(ids)) for ids, q in requests]
        stop = sorted(self.prompts.stop_ids(p))
        extra = {"cache_implementation": "static",
                 "compile_config": CompileConfig(fullgraph=True, mode="reduce-overhead")} if self.compile else {}
        config = GenerationConfig(
            max_new_tokens=max(budget), min_new_tokens=max(budget) if p.ignore_eos else 0, do_sample=not p.greedy,
            temperature=p.temperature if not p.greedy else None, top_k=p.top_k if p.top_k > 0 else None,
            top_p=p.top_p, eos_token_id=stop or None, pad_token_id=PAD_TOKEN_ID, **extra)
        # left padding: every row's last prompt token is the batch's last column, where decoding starts
        ids = torch.tensor([[PAD_TOKEN_ID] * (width - len(x)) + x for x, _ in requests], device=self.device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x, _ in requests], device=self.device)
        timings = self.timings[first:first + len(requests)]
        if p.seed is not None:
            torch.manual_seed(p.seed)
        with torch.no_grad():
            seq = self.model.generate(ids, attention_mask=mask, generation_config=config,
                                      streamer=_Ticker(timings, budget))
        outs = []
        for row, ((prompt, _), n) in enumerate(zip(requests, budget)):
            new = seq[row, width:width + n].tolist()
            cut = next((i + 1 for i, t in enumerate(new) if t in stop), len(new))
            new = new[:cut]
            reason = "stop" if new and new[-1] in stop else "length"
            outs.append(RequestOutput(first + row, prompt, new, self.prompts.tokenizer.decode(new), reason))
        return outs


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
