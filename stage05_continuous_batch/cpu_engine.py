"""This stage's engine where there is no GPU: the same loop (llm_engine.py: scheduler and packing) over the numpy
forward of common/numpy_runner.py, its KV cache one float32 region per seq_slot in host memory, laid out as the
GPU's (cache.py). `python -m` this stage and `python -m common.serve --stage` pick it on a machine without a
GPU, so a reader can watch this stage's scheduler at work anywhere, and a server on a laptop keeps up with a few
dozen clients of the tiny preset. Its tokens are the numpy reference's (tests/test_cpu_engine.py).
"""
from __future__ import annotations

from common.checkpoint import Checkpoint
from common.numpy_runner import NumpyRunner, kv_bytes_per_position
from common.prompts import PromptPreparer
from common.reference import ReferenceModel
from common.synthetic import resolve_model

from .cache import MAX_NUM_SEQS, check_count
from .engine import MAX_NUM_BATCHED_TOKENS, Engine
from .llm_engine import LLMEngine

KV_CACHE_MEMORY_BYTES = 2**30      # host memory the K/V may take when not told: float32, so twice the GPU's


class CpuEngine(Engine):
    """The Engine's step API, generate() and stream(), on the CPU; the GPU's own checks (embed, logits, verify)
    are not here. max_num_seqs: as many seq_slots of max_model_len positions as kv_cache_memory_bytes holds, at
    most MAX_NUM_SEQS, or exactly the number asked for (refused when it does not fit)."""

    def __init__(self, model: str, max_model_len: int | None = None, max_num_seqs: int | None = None,
                 max_num_batched_tokens: int | None = None, kv_cache_memory_bytes: int = KV_CACHE_MEMORY_BYTES,
                 progress: bool = False):
        self.folder = resolve_model(model)
        self.checkpoint = Checkpoint(self.folder)
        self.config = self.checkpoint.config
        self.prompts = PromptPreparer(self.folder, self.config, max_model_len)
        self.tokenizer, self.max_model_len = self.prompts.tokenizer, self.prompts.max_model_len
        reference = ReferenceModel(self.checkpoint)
        per_seq = self.max_model_len * kv_bytes_per_position(reference)
        fits = check_count("kv_cache_memory_bytes", kv_cache_memory_bytes) // per_seq
        B = min(fits, MAX_NUM_SEQS) if max_num_seqs is None else check_count("max_num_seqs", max_num_seqs)
        if not 1 <= B <= fits:
            raise MemoryError(f"kv_cache_memory_bytes={kv_cache_memory_bytes} holds {fits} seq_slots of "
                              f"max_model_len={self.max_model_len} ({per_seq / 2**20:.1f} MiB each); raise it or "
                              f"lower max_model_len" + (f" or max_num_seqs={B}" if max_num_seqs else ""))
        tokens = check_count("max_num_batched_tokens", max(MAX_NUM_BATCHED_TOKENS, B) if max_num_batched_tokens is None
                             else max_num_batched_tokens)
        if tokens < B:
            raise ValueError(f"max_num_batched_tokens={tokens} must be >= max_num_seqs={B}: each running "
                             "sequence decodes one row per step")
        self.max_num_seqs = B
        runner = NumpyRunner(reference, B, self.max_model_len, num_slots=B * self.max_model_len)
        self.llm = LLMEngine(runner, self.prompts, B, tokens)
