"""The paged KV cache's bookkeeping with prefix caching (vLLM V1's KVCacheManager and BlockPool): a pool of
fixed-size blocks, reference counts, a table of cached blocks by hash, and a block table per sequence.

    the pool       num_blocks blocks of block_size token positions each; block b holds cache slots
                   b * block_size .. b * block_size + block_size - 1 (the slot mapping, rope_kv_write.cu)
    a block table  seq.block_table[i] = the block holding the sequence's positions i * block_size ..
                   (i + 1) * block_size - 1
    a block's hash sha256(parent's hash + its block_size token ids): a full block is named by its own tokens and,
                   through the chain, every token before it, since its K/V depend on all of them
                   (block_hashes); two requests whose first k blocks of tokens agree share those k hashes
    the cache      hash -> block, for full blocks whose K/V are computed (cache_blocks, as they fill); a block
                   stays cached after its last holder lets go, until its slot is needed for something else
    sharing        lookup(seq) finds the cached blocks of a new sequence's first full blocks; take() puts them at
                   the front of its table, each holder counted (refs)
    allocation     grow(seq, n) makes its table cover positions 0..n-1 with blocks that hold nothing cached:
                   freed ones (the last freed first), then never-used ones; only when none is left, cached ones
                   nobody holds, the least recently freed first (evicting it from the cache)
    release        free(seq) drops its holds; a block nobody holds becomes free again, keeping its cached K/V
                   (the sequence's last blocks are freed first, so a prefix outlives its tails)

A cached block is never written: only full blocks are cached, and a sequence writes only positions past the ones
it found cached (at least its last token is always computed). Pure Python: tested on the CPU
(tests/test_block_manager_cpu.py, tests/test_prefix_cache_cpu.py).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np


def blocks_for(n_tokens: int, block_size: int) -> int:
    """Blocks that hold n_tokens positions."""
    return -(-n_tokens // block_size)


def block_hashes(seq, block_size: int, n_tokens: int) -> list[bytes]:
    """seq.block_hashes, extended to cover its full blocks within its first n_tokens tokens (each block is hashed
    once; the list may already reach further)."""
    hashes = seq.block_hashes
    for i in range(len(hashes), n_tokens // block_size):
        parent = hashes[-1] if hashes else b""
        tokens = np.asarray(seq.tokens(i * block_size, block_size), np.int32)
        hashes.append(hashlib.sha256(parent + tokens.tobytes()).digest())
    return hashes


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True):
        for name, v in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be an integer >= 1")
        self.num_blocks, self.block_size, self.enable_caching = num_blocks, block_size, enable_caching
        self._free: list[int] = []                           # free blocks holding nothing cached, a stack
        self._evictable: OrderedDict[int, None] = OrderedDict()   # free blocks still cached, least recent first
        self._fresh = 0                                      # blocks _fresh.. were never handed out
        self.refs: dict[int, int] = {}                       # block -> sequences holding it
        self.cached: dict[bytes, int] = {}                   # hash -> block
        self._hash_of: dict[int, bytes] = {}                 # block -> its hash, while cached
        self.query_tokens = self.hit_tokens = 0              # tokens looked up at first admissions, and found

    @property
    def num_free(self) -> int:
        """Blocks a sequence could get now (free ones that are still cached count: they can be evicted)."""
        return len(self._free) + len(self._evictable) + self.num_blocks - self._fresh

    def usage(self) -> float:
        """The share of the pool's blocks held by sequences."""
        return 1 - self.num_free / self.num_blocks

    # ------------------------------------------------------------------ sharing
    def lookup(self, seq) -> list[int]:
        """The cached blocks of seq's first full blocks, in order, up to the first miss; never the block of its
        last token, which must run to give the next one its logits. Takes nothing."""
        if not self.enable_caching:
            return []
        found = []
        for h in block_hashes(seq, self.block_size, seq.length - 1):
            b = self.cached.get(h)
            if b is None:
                break
            found.append(b)
        return found

    def cost(self, blocks: list[int]) -> int:
        """Free blocks that taking these cached blocks uses up: those nobody holds now."""
        return sum(1 for b in blocks if b not in self.refs)

    def take(self, seq, blocks: list[int]) -> None:
        """Start seq's (empty) table with cached blocks, each held once more, and count the lookup."""
        if seq.block_table:
            raise RuntimeError(f"request {seq.request_id!r} already holds blocks")
        for b in blocks:
            if b not in self.refs:
                del self._evictable[b]
            self.refs[b] = self.refs.get(b, 0) + 1
        seq.block_table.extend(blocks)
        seq.blocks_offered = len(blocks)                     # cached already

    def count_lookup(self, seq, hit_blocks: int) -> None:
        """A first admission's lookup, for the hit rate (in tokens, as vLLM counts them)."""
        self.query_tokens += seq.length
        self.hit_tokens += hit_blocks * self.block_size

    def cache_blocks(self, seq, n_computed: int) -> None:
        """seq's K/V are (being) computed for its first n_computed positions: cache its full blocks among them.
        A block whose hash is cached already (computed twice: the same prefix prefilled by two requests at once)
        stays uncached and is freed as plain memory."""
        if not self.enable_caching:
            return
        hashes, full = block_hashes(seq, self.block_size, n_computed), n_computed // self.block_size
        for i in range(seq.blocks_offered, full):          # (hashes may run further: lookup() hashes the prompt)
            b = seq.block_table[i]
            if b not in self._hash_of and hashes[i] not in self.cached:
                self.cached[hashes[i]] = b
                self._hash_of[b] = hashes[i]
        seq.blocks_offered = max(seq.blocks_offered, full)

    def reset_cache(self) -> None:
        """Forget every cached block (vLLM's reset_prefix_cache): they become plain free blocks. Only when no
        sequence holds a block, so nothing running loses what it found."""
        if self.refs:
            raise RuntimeError(f"the prefix cache cannot be reset while {len(self.refs)} blocks are held")
        self._free += list(self._evictable)
        self._evictable.clear()
        self.cached.clear()
        self._hash_of.clear()

    # ------------------------------------------------------------------ allocation and release
    def needed(self, seq, n_tokens: int) -> int:
        """Blocks seq must still get for its table to cover positions 0..n_tokens-1."""
        return max(0, blocks_for(n_tokens, self.block_size) - len(seq.block_table))

    def can_grow(self, seq, n_tokens: int) -> bool:
        return self.needed(seq, n_tokens) <= self.num_free

    def grow(self, seq, n_tokens: int) -> list[int]:
        """Extend seq.block_table to cover positions 0..n_tokens-1; returns the blocks it got (in table order).
        Raises MemoryError, taking nothing, when the free blocks are too few (the scheduler asks can_grow first)."""
        need = self.needed(seq, n_tokens)
        if need > self.num_free:
            raise MemoryError(f"{need} blocks wanted for request {seq.request_id!r}, {self.num_free} free")
        got = [self._take_free() for _ in range(need)]
        for b in got:
            self.refs[b] = 1
        seq.block_table.extend(got)
        return got

    def _take_free(self) -> int:
        if self._free:                                       # the block freed last (warm in L2)
            return self._free.pop()
        if self._fresh < self.num_blocks:
            self._fresh += 1
            return self._fresh - 1
        b, _ = self._evictable.popitem(last=False)           # the least recently freed cached block
        del self.cached[self._hash_of.pop(b)]
        return b

    def free(self, seq) -> None:
        """Drop seq's hold on every block of its table, its last block first; a block nobody holds is free."""
        for b in reversed(seq.block_table):
            n = self.refs.get(b, 0)
            if n == 0:
                raise RuntimeError(f"block {b} of request {seq.request_id!r} is not held")
            if n > 1:
                self.refs[b] = n - 1
                continue
            del self.refs[b]
            if b in self._hash_of:
                self._evictable[b] = None
            else:
                self._free.append(b)
        seq.block_table, seq.blocks_offered = [], 0
