"""CPU: a step's plan becomes packed rows (no padding), each with its own position, cache slot (through its block
table) and seq_slot, the rows whose logits choose a token, and the block-table entries the GPU lacks."""
import numpy as np
import pytest

from common.outputs import Timing
from common.sampling import SamplingParams

from ..block_manager import BlockManager
from ..kernels import MIN_KEYS_PER_SPLIT, decode_split, tile_rows
from ..packing import pack, plan_attention
from ..scheduler import Scheduler, ScheduledChunk, SchedulerOutput
from ..sequence import Sequence

L = 100   # max_model_len
BS = 4    # block_size: the GPU's tables hold 25 entries a seq_slot


def seq(rid, prompt, new=()):
    s = Sequence(rid, list(prompt), SamplingParams(max_tokens=50, temperature=0.0), frozenset(), 0, Timing(len(prompt)))
    s.new = list(new)
    return s


def test_decode_rows_and_prefill_chunks_pack_without_padding_through_their_block_tables():
    decoding = seq("d", [11, 12, 13], new=[14, 15])            # 5 tokens, 4 cached: decodes token 15 at position 4
    decoding.seq_slot, decoding.num_computed = 2, 4
    decoding.block_table, decoding.blocks_synced = [9, 3], 1    # position 4 starts its second block, not yet sent
    long = seq("p", range(100, 110))                            # a 10-token prompt, first chunk of 6
    long.seq_slot, long.block_table = 0, [5, 0]
    tail = seq("t", [7, 8, 9])                                  # a 3-token prompt, its last 2 tokens
    tail.seq_slot, tail.num_computed, tail.block_table, tail.blocks_synced = 5, 1, [7], 1
    plan = SchedulerOutput.from_chunks([ScheduledChunk(decoding, 4, 1), ScheduledChunk(long, 0, 6), ScheduledChunk(tail, 1, 2)])
    x = pack(plan, L, BS)
    assert x.tokens.tolist() == [15, 100, 101, 102, 103, 104, 105, 8, 9]
    assert x.positions.tolist() == [4, 0, 1, 2, 3, 4, 5, 1, 2]
    assert x.seq_slots.tolist() == [2, 0, 0, 0, 0, 0, 0, 5, 5]
    # slot = block_table[p // 4] * 4 + p % 4
    assert x.slot_mapping.tolist() == [3 * 4 + 0] + [20, 21, 22, 23, 0, 1] + [7 * 4 + 1, 7 * 4 + 2]
    assert x.logit_rows.tolist() == [0, 8]                      # the middle chunk samples nothing yet
    assert x.logit_seq_slots.tolist() == [2, 5] and x.counters.tolist() == [2, 0]
    assert x.num_rows == 9
    assert x.spans.tolist() == [[0, 1, 2, 4], [1, 6, 0, 0], [7, 2, 5, 1]]    # first row, rows, seq_slot, position
    # (seq_slot * 25 + entry, block) for the entries not yet on the GPU; none for tail, whose one block was sent
    assert x.table_updates.tolist() == [[2 * 25 + 1, 3], [0, 5], [1, 0]]
    assert (decoding.blocks_synced, long.blocks_synced, tail.blocks_synced) == (2, 2, 1)
    assert pack(SchedulerOutput.from_chunks([ScheduledChunk(decoding, 4, 1)]), L, BS).table_updates.shape == (0, 2)


def test_rows_past_the_sequence_its_blocks_or_max_model_len_are_refused():
    s = seq("a", [1, 2, 3])
    s.seq_slot, s.block_table = 0, [0]
    with pytest.raises(IndexError, match="past its 3 tokens"):
        pack(SchedulerOutput.from_chunks([ScheduledChunk(s, 2, 2)]), L, BS)
    with pytest.raises(IndexError, match="max_model_len=2"):
        pack(SchedulerOutput.from_chunks([ScheduledChunk(s, 0, 3)]), 2, BS)
    with pytest.raises(IndexError, match="or its 1 blocks"):
        pack(SchedulerOutput.from_chunks([ScheduledChunk(s, 0, 3)]), L, 2)


def test_what_the_scheduler_plans_packs_to_its_budget():
    sched = Scheduler(max_num_seqs=3, max_num_batched_tokens=16, blocks=BlockManager(100, BS), max_model_len=L)
    for i, n in enumerate((5, 30, 2)):
        sched.add(seq(i, range(1, n + 1)))
    x = pack(sched.schedule(), L, BS)
    assert x.num_rows == 16 and x.seq_slots.tolist() == [0] * 5 + [1] * 11
    assert x.logit_rows.tolist() == [4]                         # only the 5-token prompt completed
    # a fresh pool hands out blocks 0, 1, 2, ... in order: request 0 gets blocks 0-1, request 1 blocks 2-4
    assert x.slot_mapping.tolist() == list(range(5)) + list(range(8, 19))
    assert x.table_updates.tolist() == [[0, 0], [1, 1], [25, 2], [26, 3], [27, 4]]


def test_attention_plan_tiles_prompt_chunks_longest_first_and_gives_decode_rows_tiles_of_one():
    spans = np.array([[0, 1, 2, 4], [1, 40, 0, 0], [41, 2, 5, 1], [43, 1, 7, 90], [44, 16, 3, 16]], np.int32)
    prompt, decode = plan_attention(spans, 16)
    # keys each tile reads: 40, 32, 32 (in the order the chunks came), 16, 3
    assert prompt.tolist() == [[33, 8, 0, 32], [17, 16, 0, 16], [44, 16, 3, 16], [1, 16, 0, 0], [41, 2, 5, 1]]
    assert decode.tolist() == [[0, 1, 2, 4], [43, 1, 7, 90]]
    assert prompt.dtype == decode.dtype == np.int32
    prompt, decode = plan_attention(spans, 0)                   # no tensor-core kernel: every row a tile of one
    assert prompt.shape == (0, 4) and decode[:, 0].tolist() == list(range(60)) and (decode[:, 1] == 1).all()
    assert decode[[0, 1, 40, 41, 42, 43, 59]].tolist() == [[0, 1, 2, 4], [1, 1, 0, 0], [40, 1, 0, 39], [41, 1, 5, 1],
                                                          [42, 1, 5, 2], [43, 1, 7, 90], [59, 1, 3, 31]]
    prompt, decode = plan_attention(spans[[0, 3]], 16)          # a decode-only step
    assert prompt.shape == (0, 4) and decode.tolist() == [[0, 1, 2, 4], [43, 1, 7, 90]]


def test_tiles_hold_64_query_heads_and_need_a_tensor_core_head_dim():
    assert tile_rows(32, 8, 64) == 16 and tile_rows(24, 8, 128) == 21     # 64 // 3: one M-row spare
    assert tile_rows(32, 1, 64) == 2 and tile_rows(8, 8, 128) == 64
    assert tile_rows(32, 8, 80) == 0 and tile_rows(32, 8, 256) == 0


@pytest.mark.parametrize("n_rows, max_keys", [(1, 128), (1, 1000), (1, 4096), (1, 32768), (2, 8192), (64, 128),
                                              (64, 4096), (256, 4096), (300, 30000)])
def test_decode_split_covers_the_keys_in_whole_tiles(n_rows, max_keys):
    n, per = decode_split(n_rows, max_keys, 8, 132, 1024)
    assert 1 <= n <= 32 and n * per >= max_keys > (n - 1) * per    # every split but the last full, none empty
    assert n == 1 or (per % 32 == 0 and per >= MIN_KEYS_PER_SPLIT and n_rows * n <= 1024)
    if n_rows * 8 >= 4 * 132 or max_keys < 2 * MIN_KEYS_PER_SPLIT:   # enough blocks already, or too few keys
        assert n == 1


def covered(pieces: np.ndarray, tiles: np.ndarray, tile_n: int) -> None:
    """Every tile's key tiles, up to its last row's, are run exactly once by its pieces, a split tile's pieces each
    holding a key of every row (their first key tile is at or before the one of the tile's first position)."""
    for tile in tiles:
        mine = pieces[(pieces[:, :4] == tile).all(1)]
        runs = sorted(zip(mine[:, 4], mine[:, 5]))
        end = (tile[3] + tile[1] - 1) // tile_n + 1
        assert runs[0][0] == 0 and runs[-1][1] == end and all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
        assert (mine[:, 4] <= tile[3] // tile_n).all() and (mine[:, 4] < mine[:, 5]).all()
        assert len(mine) == 1 and mine[0, 6] == -1 or sorted(mine[:, 7]) == list(range(len(mine)))


def test_the_last_wave_s_tiles_of_a_deep_chunk_are_split_by_keys():
    """A 2,048-row chunk at position 30,720 (the 1B: 48 rows a tile, 8 K/V heads, 132 SMs, 128-key tiles): 43 tiles,
    344 blocks, 80 in the last wave; its last 10 tiles split in 3 (240 pieces: two rounds of a third of a tile, where
    2 parts would still take a whole tile and 4 three quarters), each split tile a merge slot of its own."""
    from ..packing import split_tail

    prompt, _ = plan_attention(np.array([[0, 2048, 0, 30720]], np.int32), 48)
    pieces, parts = split_tail(prompt, 128, 8, 132)
    assert parts == 3 and len(pieces) == 33 + 3 * 10 and pieces.dtype == np.int32
    assert (pieces[:33, :4] == prompt[:33]).all() and (pieces[:33, 6] == -1).all()
    assert sorted(set(pieces[33:, 6])) == list(range(10))
    covered(pieces, prompt, 128)
    assert (np.diff(pieces[33:, 5] - pieces[33:, 4]) <= 0).all()             # the longest pieces first


@pytest.mark.parametrize("spans, why", [
    ([[0, 2048, 0, 0]], "a first chunk: the last wave's tiles are its shortest"),
    ([[0, 1584, 0, 30720]], "33 tiles x 8 = 264 blocks: two whole waves"),
    ([[0, 60, 0, 0]], "a tile that reaches one key tile cannot be split"),
])
def test_tiles_stay_whole_where_a_split_would_not_pay(spans, why):
    from ..packing import split_tail

    prompt, _ = plan_attention(np.array(spans, np.int32), 48)
    pieces, parts = split_tail(prompt, 128, 8, 132)
    assert parts == 1 and (pieces[:, :4] == prompt).all() and (pieces[:, 6] == -1).all(), why
    covered(pieces, prompt, 128)


def test_random_launches_cover_every_key_once(seeds=range(200)):
    """Random steps of prompt chunks (head_dim 64 or 128's tiles, GQA, SM counts): every tile's keys run once."""
    from ..packing import split_tail

    for seed in seeds:
        rng = np.random.default_rng(seed)
        n = int(rng.integers(1, 6))
        lengths = rng.integers(2, 3000, n)
        starts = rng.integers(0, 40000, n)
        spans = np.stack([np.cumsum(lengths) - lengths, lengths, np.arange(n), starts], 1).astype(np.int32)
        rows, tile_n = int(rng.choice([48, 64, 96, 32])), int(rng.choice([64, 128]))
        prompt, _ = plan_attention(spans, rows)
        pieces, parts = split_tail(prompt, tile_n, int(rng.choice([1, 2, 4, 8])), int(rng.choice([78, 114, 132])))
        try:
            covered(pieces, prompt, tile_n)
            assert len(pieces) == len(prompt) + (parts - 1) * len(set(pieces[:, 6]) - {-1})
        except AssertionError as e:
            raise AssertionError(f"seed {seed}") from e


def test_a_tile_is_cut_only_into_as_many_parts_as_it_reaches_key_tiles():
    from ..packing import cut_tile

    assert [p[4:6] for p in cut_tile(np.array([0, 48, 0, 300]), 3, 128, 0)] == [(0, 1), (1, 2), (2, 3)]
    with pytest.raises(ValueError, match="reaches 3 key tiles of 128: not 4 parts"):
        cut_tile(np.array([0, 48, 0, 300]), 4, 128, 0)
