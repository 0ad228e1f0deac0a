"""CPU: the block manager hands out blocks as a sequence grows (one each time its last block is full), takes them
back on free, never grows two sequences into one block (sharing comes only from the prefix cache:
tests/test_prefix_cache_cpu.py), refuses what the free list cannot cover without taking any,
and loses nothing over random grow / free operations (200 seeds of 300 each in every run, 2000 under the slow
marker)."""
import numpy as np
import pytest

from common.testing import for_each_seed, seed_ranges

from ..block_manager import BlockManager, blocks_for


class Seq:
    """What the block manager reads of a sequence: its id and its block table."""

    def __init__(self, request_id):
        self.request_id, self.block_table = request_id, []


def test_blocks_for_rounds_up():
    assert [blocks_for(n, 16) for n in (0, 1, 15, 16, 17, 32, 33)] == [0, 1, 1, 1, 2, 2, 3]
    assert [blocks_for(n, 1) for n in (0, 1, 7)] == [0, 1, 7]


def test_a_table_grows_a_block_at_each_boundary_and_only_there():
    pool, s = BlockManager(10, 4), Seq("a")
    sizes = []
    for n in range(1, 14):                      # positions 0..n-1, as a sequence decodes one token a step
        got = pool.grow(s, n)
        sizes.append(len(s.block_table))
        assert len(got) == (1 if n % 4 == 1 else 0)
    assert sizes == [1] * 4 + [2] * 4 + [3] * 4 + [4]
    assert s.block_table == [0, 1, 2, 3] and pool.num_free == 6      # a fresh pool gives 0, 1, 2, ... in order
    assert pool.grow(s, 5) == [] and len(s.block_table) == 4        # asking for fewer positions takes nothing


def test_free_gives_every_block_back_and_the_last_freed_is_reused_first():
    pool, a, b = BlockManager(6, 2), Seq("a"), Seq("b")
    pool.grow(a, 5)                             # blocks 0, 1, 2
    pool.grow(b, 2)                             # block 3
    assert pool.usage() == pytest.approx(4 / 6)
    pool.free(a)
    assert a.block_table == [] and pool.num_free == 5
    c = Seq("c")
    assert pool.grow(c, 6) == [0, 1, 2]         # a's blocks, its first one first
    pool.free(b)
    pool.free(c)
    assert pool.num_free == 6 and pool.usage() == 0.0


def test_exhaustion_is_refused_and_takes_nothing():
    pool, a, b = BlockManager(3, 4), Seq("a"), Seq("b")
    pool.grow(a, 8)
    assert not pool.can_grow(b, 5) and pool.can_grow(b, 4) and pool.needed(b, 5) == 2
    with pytest.raises(MemoryError, match="2 blocks wanted for request 'b', 1 free"):
        pool.grow(b, 5)
    assert b.block_table == [] and pool.num_free == 1


def test_freeing_a_block_nobody_holds_is_refused():
    """Blocks are counted, not owned (prefix caching shares them): a free after the last holder let go is caught."""
    pool, a = BlockManager(4, 4), Seq("a")
    pool.grow(a, 4)
    stolen = Seq("thief")
    stolen.block_table = list(a.block_table)
    pool.free(a)
    with pytest.raises(RuntimeError, match="block 0 of request 'thief' is not held"):
        pool.free(stolen)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_sizes_are_refused(bad):
    with pytest.raises(ValueError, match=f"num_blocks={bad!r}"):
        BlockManager(bad, 16)
    with pytest.raises(ValueError, match=f"block_size={bad!r}"):
        BlockManager(16, bad)


@seed_ranges(200, 2000, copy_seeds=20, test_file=__file__)
def test_random_grows_and_frees_never_share_or_lose_a_block(seeds):
    for_each_seed(seeds, random_grows_and_frees)


def random_grows_and_frees(seed):
    """300 random grows and frees of 8 sequences on a pool of 1..39 blocks: after each, no block is held twice or
    lost, and each table has exactly the blocks its length needs; at the end every block is free."""
    rng = np.random.default_rng(seed)
    n_blocks, bs = int(rng.integers(1, 40)), int(rng.choice([1, 2, 4, 16]))
    pool = BlockManager(n_blocks, bs)
    seqs = [Seq(i) for i in range(8)]
    lengths = [0] * 8
    for _ in range(300):
        i = int(rng.integers(8))
        if rng.random() < 0.2:
            pool.free(seqs[i])
            lengths[i] = 0
        else:
            n = lengths[i] + int(rng.integers(1, 3 * bs))
            if pool.can_grow(seqs[i], n):
                pool.grow(seqs[i], n)
                lengths[i] = n
            else:
                with pytest.raises(MemoryError):
                    pool.grow(seqs[i], n)
        held = [b for s in seqs for b in s.block_table]
        assert len(held) == len(set(held)) == n_blocks - pool.num_free        # no block twice, none lost
        assert all(0 <= b < n_blocks for b in held)
        assert all(len(s.block_table) == blocks_for(n, bs) for s, n in zip(seqs, lengths))
    for s in seqs:
        pool.free(s)
    assert pool.num_free == n_blocks
