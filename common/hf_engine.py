"""The Hugging Face transformers baseline (bf16, eager attention, its own KV cache) with the stage API, so the
benchmark harness can run it like a stage: `python -m common.bench --stages hf,02 --workload latency`.

Needs torch with CUDA and transformers (the `ref` extra); it loads the same checkpoint folder as the stages.
Its timings are taken the same way as the stages': the wall clock when each new token reaches the host.
"""
from __future__ import annotations

from common.config import LlamaConfig
from common.outputs import RequestOutput, Timing
from common.prompts import PromptPreparer
from common.sampling import SamplingParams
from common.synthetic import resolve_model

PAD_TOKEN_ID = 128004   # Llama 3's <|finetune_right_pad_id|>; 0 would be a real token


class Engine:
    def __init__(self, model: str, max_model_len: int | None = None, attn_implementation: str = "eager"):
        import torch
        import transformers

        if not torch.cuda.is_available():
            raise RuntimeError("the HF baseline needs torch with CUDA")
        self.torch = torch
        self.folder = resolve_model(model)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            self.folder, dtype=torch.bfloat16, attn_implementation=attn_implementation).cuda().eval()
        self.config = self.model.config
        self.prompts = PromptPreparer(self.folder, LlamaConfig.from_file(self.folder), max_model_len)
        self.timings: list[Timing] = []

    def generate(self, prompts, params: SamplingParams | list[SamplingParams]) -> list[RequestOutput]:
        from transformers import GenerationConfig

        torch = self.torch
        outs, self.timings = [], []
        for rid, (ids, p) in enumerate(self.prompts.requests(prompts, params)):
            timing = Timing(len(ids))
            self.timings.append(timing)
            stop = sorted(self.prompts.stop_ids(p))
            config = GenerationConfig(
                max_new_tokens=min(p.max_tokens, self.prompts.max_model_len - len(ids)),
                min_new_tokens=p.max_tokens if p.ignore_eos else 0, do_sample=not p.greedy,
                temperature=p.temperature if not p.greedy else None, top_k=p.top_k if p.top_k > 0 else None,
                top_p=p.top_p, eos_token_id=stop or None, pad_token_id=PAD_TOKEN_ID)
            if p.seed is not None:
                torch.manual_seed(p.seed)
            with torch.no_grad():
                seq = self.model.generate(torch.tensor([ids], device="cuda"), generation_config=config,
                                          streamer=_Ticker(timing))
            new = seq[0, len(ids):].tolist()
            reason = "stop" if new and new[-1] in stop else "length"
            outs.append(RequestOutput(rid, ids, new, self.prompts.tokenizer.decode(new), reason))
        return outs


class _Ticker:
    """A transformers streamer that stamps the time each new token reaches the host."""

    def __init__(self, timing: Timing):
        self.timing, self.prompt_seen = timing, False

    def put(self, value) -> None:
        if not self.prompt_seen:          # generate() hands the streamer the prompt first
            self.prompt_seen = True
            return
        value.cpu()                       # waits for the GPU to produce it
        self.timing.tick()

    def end(self) -> None:
        pass
