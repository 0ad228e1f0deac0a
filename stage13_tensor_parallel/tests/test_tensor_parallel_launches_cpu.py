"""CPU: a rank's forward as launches and collectives, on a recording GPU and a recording communicator (the
launchers' checks run for real). Split over N ranks, each layer meets the others twice, by all-reduces of R x H
rows after o and after down: of d, unfused (the norm then adds it into x), or of x, fused (rank 0's GEMVs add x
into their partial, the others' store theirs alone); the step's end gathers every rank's slice of the logits and
puts each slice in its columns. Timing one rank alone (Model.alone) runs no collective."""
from dataclasses import replace

import numpy as np
import pytest

from common.synthetic import PRESETS

from .. import graphs
from .. import model as model_module
from ..tensor_parallel import plan, rank_config
from .test_model_launches_cpu import (BLOCK_SIZE, MAX_LEN, MAX_ROWS, MAX_SEQS, RecordingGpu, decode_step,
                                      layer_kernels, record_launches, weights)


class RecordingComm:
    def __init__(self, gpu, rank: int, size: int):
        self.gpu, self.rank, self.size = gpu, rank, size

    def all_reduce(self, buf):
        self.gpu.launches.append(("all_reduce", buf.shape, (buf.ptr, buf.dtype)))

    def all_gather(self, src, dst):
        assert dst.nbytes == self.size * src.nbytes and dst.dtype == src.dtype
        self.gpu.launches.append(("all_gather", src.shape, (src.ptr, dst.ptr)))


class SplitGpu(RecordingGpu):
    def copy_columns(self, dst, first_col, src):
        assert src.shape[0] == dst.shape[0] and 0 <= first_col <= dst.shape[1] - src.shape[1]
        self.launches.append(("copy_columns", src.shape, (dst.ptr, first_col, src.ptr)))


def rank_model(rank: int, size: int, vocab: int = 128256):
    """Rank `rank` of `size` of the 1B shape (its vocabulary `vocab`): its shard's weights, a recording comm."""
    cfg = replace(PRESETS["llama-3.2-1b"], vocab_size=vocab)
    shard = plan(cfg, size)[rank]
    gpu = SplitGpu()
    w = weights(gpu, rank_config(cfg, shard))
    w.vocab = shard.vocab                                 # tied: the LM head is the shard's rows of the embedding
    kernels = model_module.Kernels(gpu)
    m = model_module.Model(w, rank_config(cfg, shard), gpu, kernels, MAX_SEQS, MAX_LEN, MAX_ROWS, BLOCK_SIZE,
                           comm=RecordingComm(gpu, rank, size))
    m.allocate_cache(64)
    return m


@pytest.fixture
def split(monkeypatch):
    record_launches(monkeypatch)
    return rank_model


def test_an_unfused_layer_all_reduces_d_after_o_and_after_down(split):
    m = split(1, 2)
    m.forward(decode_step(3))
    layer = layer_kernels(m.gpu.launches, tail=3 + 1 + 2)  # the end: norm, gather, cuBLAS, all-gather, 2 copies
    assert layer == ["rms_norm", "cublas", "rope_kv_write", "attention_tiles_hd64", "cublas", "all_reduce",
                     "add_rms_norm", "cublas", "silu_mul", "cublas", "all_reduce"]
    reduces = [(shape, args) for k, shape, args in m.gpu.launches if k == "all_reduce"]
    assert len(reduces) == 2 * 16 and all(r == ((3, 2048), (m.d.ptr, "bf16")) for r in reduces)


@pytest.mark.parametrize("rank, o_kind", [(0, "gemv_residual_m2"), (1, "gemv_m2")])
def test_a_fused_layer_all_reduces_x_and_rank_0_alone_adds_it(split, rank, o_kind):
    m = split(rank, 2)
    m.fused_sizes = {2}
    m.forward(decode_step(2))
    layer = layer_kernels(m.gpu.launches, tail=3 + 1 + 2)
    assert layer == ["gemv_norm_rope_m2", "attention_tiles_hd64", o_kind, "all_reduce", "gemv_norm_silu_m2",
                     o_kind, "all_reduce"]
    o = next(args for k, _, args in m.gpu.launches if k == o_kind)
    assert o[2] == m.x.arg                                 # into x: rank 0 adds to it, the others overwrite it
    assert all(args == (m.x.ptr, "bf16") for k, _, args in m.gpu.launches if k == "all_reduce")


@pytest.mark.parametrize("vocab, size", [(128256, 2), (1001, 4)])
def test_the_step_s_end_gathers_every_slice_into_its_columns(split, vocab, size):
    """Each rank's (n, V_r) logits are gathered as slices of ceil(V / N) columns, back to back; slice r goes to
    columns r P .. r P + V_r of the step's logits (the last slice shorter where N does not divide V)."""
    m = split(size - 1, size, vocab)
    P = -(-vocab // size)
    m.forward(decode_step(3))
    tail = m.gpu.launches[-(3 + 1 + size):]
    assert [k for k, *_ in tail] == ["add_rms_norm", "embedding_gather", "cublas", "all_gather"] + ["copy_columns"] * size
    _, (rows, V_r, H), (_, head, mine) = tail[2]
    assert (rows, H) == (3, 2048) and V_r == vocab - (size - 1) * P and mine == m.slice_logits.ptr
    assert tail[3][1] == (3 * P,) and tail[3][2] == (m.slice_logits.ptr, m.gathered.ptr)
    for r, (_, shape, (dst, col, src)) in enumerate(tail[4:]):
        assert (dst, col, src) == (m.logits.ptr, r * P, m.gathered.ptr + 4 * r * 3 * P)
        assert shape == (3, min(P, vocab - r * P))


def test_a_rank_timed_alone_runs_no_collective_and_takes_no_one_gemv_head(split, monkeypatch, tmp_path):
    from ..gemm_timings import GemmTimings

    m = split(0, 2)
    m.fused_sizes = {1}
    with m.alone():
        m.forward(decode_step(1))
    assert not any(k in ("all_reduce", "all_gather") for k, *_ in m.gpu.launches)
    assert m.comm is not None                              # back after the `with`
    monkeypatch.setattr(graphs, "gpu_us", lambda *a, **k: pytest.fail("the head was timed"))
    assert graphs.pick_head(m, GemmTimings(tmp_path / "t.json")) == {} and m.head_sizes == set()


def test_more_logit_rows_than_seq_slots_gather_in_rounds(split):
    """logits() asks for a chunk's every row: max_num_seqs rows at a time (the gather's buffers hold that many)."""
    m = split(0, 2)
    n = MAX_SEQS + 3
    h = m.gpu.empty((n, 2048), "bf16")
    out = m.gpu.empty((n, 128256), "f32")
    m.gathered_logits(h, out)
    kinds = [k for k, *_ in m.gpu.launches]
    assert kinds == ["cublas", "all_gather", "copy_columns", "copy_columns"] * 2
    gathers = [shape for k, shape, _ in m.gpu.launches if k == "all_gather"]
    assert gathers == [(MAX_SEQS * 64128,), (3 * 64128,)]
    assert np.array_equal([args[0] for k, _, args in m.gpu.launches if k == "copy_columns"],
                          [out.ptr] * 2 + [out.ptr + 4 * MAX_SEQS * 128256] * 2)
