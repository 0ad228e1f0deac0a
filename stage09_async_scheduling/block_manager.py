"""The paged KV cache's bookkeeping (vLLM's BlockManager / KVCacheManager): a pool of fixed-size blocks, a free
list, and a block table per sequence.

    the pool       num_blocks blocks of block_size token positions each; block b holds cache slots
                   b * block_size .. b * block_size + block_size - 1 (the slot mapping, kv_write.cu)
    a block table  seq.block_table[i] = the block holding the sequence's positions i * block_size ..
                   (i + 1) * block_size - 1; position p lives in slot
                       block_table[p // block_size] * block_size + p % block_size
    allocation     as a sequence grows: grow(seq, n) makes its table cover positions 0..n-1, one new block each
                   time the last is full; nothing is reserved ahead of need
    release        free(seq) on finish, abort or preemption: its blocks go back to the free list

The free list is a stack: the block freed last is reused first (warm in L2, and it makes reuse easy to see in a
test). Blocks never handed out are not listed one by one but counted from `_fresh` up (a pool sized from 0.9 of
an H200 holds 32 million blocks of the tiny test model's 4 KiB). A sequence's blocks need not be adjacent or in
order; the attention kernels read through the table.

Pure Python: tested on the CPU (tests/test_block_manager_cpu.py).
"""
from __future__ import annotations


def blocks_for(n_tokens: int, block_size: int) -> int:
    """Blocks that hold n_tokens positions."""
    return -(-n_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        for name, v in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be an integer >= 1")
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free: list[int] = []                           # blocks given back, a stack: the last freed on top
        self._fresh = 0                                      # blocks _fresh.. were never handed out
        self._owner: dict[int, object] = {}                  # block -> the sequence holding it (for the checks)

    @property
    def num_free(self) -> int:
        return len(self._free) + self.num_blocks - self._fresh

    def usage(self) -> float:
        """The share of the pool's blocks held by sequences."""
        return 1 - self.num_free / self.num_blocks

    def needed(self, seq, n_tokens: int) -> int:
        """Blocks seq must still get for its table to cover positions 0..n_tokens-1."""
        return max(0, blocks_for(n_tokens, self.block_size) - len(seq.block_table))

    def can_grow(self, seq, n_tokens: int) -> bool:
        return self.needed(seq, n_tokens) <= self.num_free

    def grow(self, seq, n_tokens: int) -> list[int]:
        """Extend seq.block_table to cover positions 0..n_tokens-1; returns the blocks it got (in table order).
        Raises MemoryError, taking nothing, when the free list is short (the scheduler asks can_grow first)."""
        need = self.needed(seq, n_tokens)
        if need > self.num_free:
            raise MemoryError(f"{need} blocks wanted for request {seq.request_id!r}, {self.num_free} free")
        reused = min(need, len(self._free))
        got = [self._free.pop() for _ in range(reused)] + list(range(self._fresh, self._fresh + need - reused))
        self._fresh += need - reused
        for b in got:
            self._owner[b] = seq
        seq.block_table.extend(got)
        return got

    def free(self, seq) -> None:
        """Every block of seq back to the free list (last block first, so its first block is reused first)."""
        for b in reversed(seq.block_table):
            if self._owner.pop(b, None) is not seq:
                raise RuntimeError(f"block {b} of request {seq.request_id!r} is not held by it")
            self._free.append(b)
        seq.block_table = []
