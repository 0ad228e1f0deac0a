"""This stage's engine where there is no GPU: the same loop (llm_engine.py: scheduler, block manager and packing)
over the numpy forward of common/numpy_runner.py, its KV cache a pool of float32 blocks in host memory read
through the block tables, as the GPU's (cache.py); asynchronous scheduling as on the GPU (the runner reads each
placeholder's id from the step before), no graphs (they are the GPU's). `python -m` this stage and `python -m
common.serve --stage` pick it on a machine without a GPU, so a reader can watch this stage's scheduler hand out
blocks and preempt anywhere, and a server on a laptop keeps up with a few dozen clients of the tiny preset. Its
tokens are the numpy reference's (tests/test_cpu_engine.py).
"""
from __future__ import annotations

from common.checkpoint import Checkpoint
from common.numpy_runner import NumpyRunner, kv_bytes_per_position
from common.prompts import PromptPreparer
from common.reference import ReferenceModel
from common.synthetic import resolve_model

from .block_manager import BlockManager
from .cache import BLOCK_SIZE, check_count
from .engine import Engine, check_sizes
from .llm_engine import LLMEngine

KV_CACHE_MEMORY_BYTES = 2**30      # host memory the K/V may take when not told: float32, so twice the GPU's


class CpuEngine(Engine):
    """The Engine's step API, generate() and stream(), on the CPU; the GPU's own checks (embed, logits, verify)
    are not here. The pool: as many blocks as kv_cache_memory_bytes holds, or num_gpu_blocks (vLLM's name, kept
    for the tests that preempt on purpose)."""

    def __init__(self, model: str, max_model_len: int | None = None, max_num_seqs: int | None = None,
                 max_num_batched_tokens: int | None = None, block_size: int = BLOCK_SIZE,
                 num_gpu_blocks: int | None = None, kv_cache_memory_bytes: int = KV_CACHE_MEMORY_BYTES,
                 async_scheduling: bool = True, enable_prefix_caching: bool = True,
                 progress: bool = False):
        self.folder = resolve_model(model)
        self.checkpoint = Checkpoint(self.folder)
        self.config = self.checkpoint.config
        self.prompts = PromptPreparer(self.folder, self.config, max_model_len)
        self.tokenizer, self.max_model_len = self.prompts.tokenizer, self.prompts.max_model_len
        B, tokens, bs = check_sizes(max_num_seqs, max_num_batched_tokens, block_size)
        self.max_num_seqs, self.block_size = B, bs
        reference = ReferenceModel(self.checkpoint)
        per_block = bs * kv_bytes_per_position(reference)
        if num_gpu_blocks is None:
            num_gpu_blocks = check_count("kv_cache_memory_bytes", kv_cache_memory_bytes) // per_block
            if num_gpu_blocks < 1:
                raise MemoryError(f"kv_cache_memory_bytes={kv_cache_memory_bytes} holds no block of {bs} "
                                  f"positions ({per_block} bytes)")
        runner = NumpyRunner(reference, B, self.max_model_len, num_slots=num_gpu_blocks * bs, block_size=bs)
        self.llm = LLMEngine(runner, self.prompts, B, tokens,
                             BlockManager(num_gpu_blocks, bs, enable_prefix_caching), async_scheduling)
