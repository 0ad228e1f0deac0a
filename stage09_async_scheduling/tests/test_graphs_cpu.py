"""CPU: which captured graph a step replays, and the fixed layout its inputs are copied into (graphs.py)."""
import numpy as np
import pytest

from common.outputs import Timing
from common.sampling import SamplingParams
from common.testing import cases

from ..graphs import CAPTURE_SIZES, FIELDS, capture_sizes, decode_layout, graph_size, is_decode_step, pack_decode
from ..packing import pack
from ..scheduler import ScheduledChunk, SchedulerOutput
from ..sequence import Sequence

L, BS = 100, 4


def decoding(rid, slot, length, table, synced=None):
    s = Sequence(rid, list(range(10, 10 + length - 1)), SamplingParams(max_tokens=50, temperature=0.0), frozenset(),
                 0, Timing(length - 1))
    s.new = [99 + slot]
    s.seq_slot, s.num_computed, s.block_table = slot, length - 1, table
    s.blocks_synced = len(table) if synced is None else synced
    return s


@pytest.mark.parametrize("max_num_seqs, want", [(256, list(CAPTURE_SIZES)), (64, [1, 2, 4, 8, 16, 32, 64]),
                                                (48, [1, 2, 4, 8, 16, 32, 48]), (1, [1]), (300, [*CAPTURE_SIZES, 300])])
def test_the_ladder_ends_at_max_num_seqs(max_num_seqs, want):
    assert capture_sizes(max_num_seqs) == want


def test_a_step_replays_the_smallest_graph_that_holds_its_rows():
    sizes = capture_sizes(48)
    assert [graph_size(r, sizes) for r in (1, 2, 3, 4, 5, 17, 32, 33, 48)] == [1, 2, 4, 4, 8, 32, 32, 48, 48]
    assert graph_size(49, sizes) is None


@pytest.mark.parametrize("size", [1, 3, 64])
def test_the_layout_packs_every_field_once_without_overlap(size):
    layout = decode_layout(size)
    spans = sorted(layout.values())
    assert [name for name, _, _ in FIELDS] == list(layout)[:len(FIELDS)]
    for (a, n), (b, _) in zip(spans, spans[1:]):
        assert a + n == b                                     # back to back, no gap, no overlap
    assert layout["tiles"][1] == 4 * size and layout["keys_per_split"] == (11 * size, 1)
    assert layout["updates"][0] == 11 * size + 1


def test_a_decode_step_is_padded_with_rows_that_write_nowhere():
    a = decoding("a", 3, 6, [7, 2], synced=1)                 # decodes position 5, in its second block: unsent
    b = decoding("b", 0, 3, [4])
    x = pack(SchedulerOutput.from_chunks([ScheduledChunk(a, 5, 1), ScheduledChunk(b, 2, 1)]), L, BS)
    assert is_decode_step(x)
    host = pack_decode(x, 4, keys_per_split=96)
    lay = decode_layout(4)

    def field(name, width=1):
        first, count = lay[name]
        return host[first:first + count].reshape(-1, width) if width > 1 else host[first:first + count]

    assert field("tokens").tolist() == [99 + 3, 99, 0, 0]
    assert field("positions").tolist() == [5, 2, 0, 0]
    assert field("slot_mapping").tolist() == [2 * 4 + 1, 4 * 4 + 2, -1, -1]   # padding: -1, the cache write skips it
    assert field("logit_rows").tolist() == [0, 1, 2, 3]
    assert field("logit_seq_slots").tolist() == [3, 0, 0, 0]
    assert field("counters").tolist() == [1, 1, 0, 0]
    assert field("prev_rows").tolist() == [-1, -1, -1, -1]      # every token is in tokens
    assert field("tiles", 4).tolist() == [[0, 1, 3, 5], [1, 1, 0, 2], [2, 1, 0, 0], [3, 1, 0, 0]]
    assert field("keys_per_split").tolist() == [96]
    assert host[lay["updates"][0]:].reshape(-1, 2).tolist() == [[3 * 25 + 1, 2]]   # seq_slot 3's entry 1 -> block 2
    assert host.dtype == np.int32


def test_a_token_still_on_the_gpu_is_named_by_its_sampled_row():
    """Asynchronous scheduling: b's newest token is the placeholder of the step before's 3rd sampled id (-1 - 2);
    its row's token is 0 and prev_rows points at that id, in the packed step and in the graph's layout."""
    a, b = decoding("a", 3, 6, [7, 2]), decoding("b", 0, 3, [4])
    b.new = [-3]
    x = pack(SchedulerOutput.from_chunks([ScheduledChunk(a, 5, 1), ScheduledChunk(b, 2, 1)]), L, BS)
    assert x.tokens.tolist() == [102, 0] and x.prev_rows.tolist() == [-1, 2]
    host, (first, count) = pack_decode(x, 4, keys_per_split=96), decode_layout(4)["prev_rows"]
    assert host[first:first + count].tolist() == [-1, 2, -1, -1]
    b.new = [99]
    assert pack(SchedulerOutput.from_chunks([ScheduledChunk(b, 2, 1)]), L, BS).prev_rows is None


def test_a_step_with_a_prompt_chunk_is_not_a_decode_step():
    a = decoding("a", 0, 6, [7, 2])
    p = Sequence("p", [1, 2, 3, 4, 5], SamplingParams(max_tokens=5), frozenset(), 0, Timing(5))
    p.seq_slot, p.block_table = 1, [5, 6]
    assert not is_decode_step(pack(SchedulerOutput.from_chunks([ScheduledChunk(a, 5, 1), ScheduledChunk(p, 0, 5)]), L, BS))
    # a one-row chunk in the middle of a prompt samples nothing: not a decode row either
    assert not is_decode_step(pack(SchedulerOutput.from_chunks([ScheduledChunk(a, 5, 1), ScheduledChunk(p, 0, 1)]), L, BS))


@cases("max_model_len", [16, 300, 2048, 3000, 4096, 131072])
@cases("max_num_seqs", [1, 3, 8, 64, 256])
def test_a_step_s_split_never_needs_more_blocks_than_the_captured_grid(max_model_len, max_num_seqs):
    """The grid of a size's graph has decode_split()'s splits for max_model_len keys; every step's keys_per_split
    (any longest row up to max_model_len) covers its keys in at most that many splits, in whole 32-key tiles, and
    is never smaller than what decode_split() asks (the splits' partials fit the buffer). decode_split() alone
    would not do: at max_num_seqs=256 and max_model_len=2048 the graph of 8 rows has 8 splits, and a step whose
    longest row holds 1,152 keys asks for 9 of 128 keys; the ninth block would not exist and its keys would be
    skipped."""
    from types import SimpleNamespace

    from ..graphs import DecodeGraphs
    from ..kernels import decode_split

    config, sms = SimpleNamespace(num_key_value_heads=8), 132
    model = SimpleNamespace(config=config, kernels=SimpleNamespace(sms=sms), partial_rows=4 * max_num_seqs)
    for size in capture_sizes(max_num_seqs):
        n_splits = decode_split(size, max_model_len, 8, sms, 4 * max_num_seqs)[0]
        graphs = SimpleNamespace(model=model, n_splits={size: n_splits})
        for max_keys in range(1, max_model_len + 1, max(1, max_model_len // 700)):
            per_split = DecodeGraphs.keys_per_split(graphs, size, max_keys)
            assert -(-max_keys // per_split) <= n_splits
            assert per_split >= decode_split(size, max_keys, 8, sms, 4 * max_num_seqs)[1]
            assert n_splits == 1 or per_split % 32 == 0 or per_split == max_keys
            assert size * n_splits <= 4 * max_num_seqs or n_splits == 1
