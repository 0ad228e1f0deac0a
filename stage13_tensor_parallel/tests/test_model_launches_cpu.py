"""CPU: the model's forward as launches, with a GPU that records instead of running. Every launcher's argument
checks run for real (kernels.py), so a step whose shapes, dtypes or buffers do not fit a kernel fails here, on
any machine; what the kernels compute is the GPU tier's. A small decode step takes the fused layer (gemv.cu's
kinds: five kernels a layer) at the sizes in fused_sizes and the unfused one (norms, cuBLAS, rope_kv_write,
silu_mul) at the others, and the step's end in one GEMV at the sizes in head_sizes; a prompt step of more rows
than a GEMV takes is never fused."""
from dataclasses import replace
from itertools import count
from types import SimpleNamespace

import numpy as np
import pytest

from common.device import DTYPES, DeviceArray, _dtype_name
from common.synthetic import PRESETS

from .. import kernels as kernels_module
from .. import model as model_module
from ..packing import StepInputs
from ..weights import FUSED, GpuWeights

BLOCK_SIZE, MAX_LEN, MAX_SEQS, MAX_ROWS = 16, 256, 8, 64


class RecordingGpu:
    """What Model, Kernels and KVCache ask of a Gpu; launches are recorded (kernel name, grid, arguments), not
    run."""

    arch, name = "sm_90", "recording"

    def __init__(self):
        self.device = SimpleNamespace(properties=SimpleNamespace(multiprocessor_count=132))
        self.stream = SimpleNamespace(record=lambda: SimpleNamespace(sync=lambda: None))
        self.launches, self.early, self._next = [], [], count(1)   # early: each launch's PDL attribute

    def empty(self, shape, dtype):
        nbytes = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype][0]
        ptr = 256 * next(self._next) << 32                 # far apart, 256-byte aligned
        return DeviceArray(ptr, tuple(shape), dtype, nbytes)

    def to_device(self, host, dtype=None):
        return self.empty(host.shape, dtype or _dtype_name(host.dtype))

    def launch(self, kernel, config, *args):
        self.launches.append((kernel, config.grid, args))
        self.early.append(config.programmatic_stream_serialization)

    def fill_bytes(self, arr, byte):
        pass

    def allow_shared_memory(self, kernel, nbytes):
        self.shared_memory = getattr(self, "shared_memory", {}) | {kernel: nbytes}

    def copy_to_device_async(self, dst, src, nbytes):
        pass

    def memory(self):
        return 1 << 40, 1 << 40


class RecordingCublas:
    def __init__(self, gpu):
        self.gpu = gpu

    def linear(self, x, w, y):
        assert x.shape[1] == w.shape[1] and y.shape == (x.shape[0], w.shape[0]), (x.shape, w.shape, y.shape)
        self.gpu.launches.append(("cublas", (x.shape[0], *w.shape), (x.ptr, w.ptr, y.ptr)))


class HostStaging:
    def __init__(self, nbytes):
        self.array, self.ptr, self.nbytes = np.zeros(nbytes, np.uint8), 0, nbytes


def weights(gpu, cfg) -> GpuWeights:
    """Every tensor of a checkpoint of cfg's shapes, as device arrays; FUSED groups back to back, as loaded."""
    H, inter, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    rows = {"self_attn.q_proj": cfg.num_attention_heads * hd, "self_attn.k_proj": cfg.num_key_value_heads * hd,
            "self_attn.v_proj": cfg.num_key_value_heads * hd, "mlp.gate_proj": inter, "mlp.up_proj": inter}
    tensors = {"model.embed_tokens.weight": gpu.empty((cfg.vocab_size, H), "bf16"),
               "model.norm.weight": gpu.empty((H,), "bf16")}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        for group in FUSED.values():
            base = gpu.empty((sum(rows[m] for m in group), H), "bf16")
            at = 0
            for m in group:
                tensors[p + m + ".weight"] = base.view(at * H * 2, (rows[m], H))
                at += rows[m]
        tensors[p + "self_attn.o_proj.weight"] = gpu.empty((H, cfg.num_attention_heads * hd), "bf16")
        tensors[p + "mlp.down_proj.weight"] = gpu.empty((H, inter), "bf16")
        tensors[p + "input_layernorm.weight"] = gpu.empty((H,), "bf16")
        tensors[p + "post_attention_layernorm.weight"] = gpu.empty((H,), "bf16")
    return GpuWeights(None, tensors, True, None)


def record_launches(monkeypatch) -> None:
    """Kernels that load nothing, cuBLAS that records, host memory for pinned buffers and tensor maps."""
    monkeypatch.setattr(kernels_module, "KernelModule", lambda path, arch: SimpleNamespace(kernel=lambda n: n))
    monkeypatch.setattr(model_module, "Cublas", RecordingCublas)
    monkeypatch.setattr(model_module, "PinnedBuffer", HostStaging)
    monkeypatch.setattr(model_module, "kv_tensor_maps", lambda gpu, cache: gpu.empty((2 * len(cache.k), 16), "u64"))


@pytest.fixture
def model(monkeypatch):
    record_launches(monkeypatch)
    gpu, cfg = RecordingGpu(), PRESETS["llama-3.2-1b"]
    m = model_module.Model(weights(gpu, cfg), cfg, gpu, kernels_module.Kernels(gpu), MAX_SEQS, MAX_LEN, MAX_ROWS,
                           BLOCK_SIZE)
    m.allocate_cache(64)
    return m


def decode_step(R: int, pos: int = 200) -> StepInputs:
    """R sequences in seq_slots 0..R-1, each decoding its token at `pos` (keys enough to split), that position in
    block r; its table's earlier entries are left as they were."""
    r = np.arange(R, dtype=np.int32)
    at = np.full(R, pos, np.int32)
    updates = np.stack([r * (MAX_LEN // BLOCK_SIZE) + pos // BLOCK_SIZE, r], 1)
    return StepInputs(r + 100, at, r * BLOCK_SIZE + pos % BLOCK_SIZE, r, r, r, np.zeros(R, np.int32),
                      np.stack([r, np.ones(R, np.int32), r, at], 1), updates, None)


def prompt_step(n: int) -> StepInputs:
    """One sequence's prompt of n tokens in seq_slot 0, its blocks 0, 1, ..."""
    pos = np.arange(n, dtype=np.int32)
    blocks = np.arange(-(-n // BLOCK_SIZE), dtype=np.int32)
    one = np.zeros(1, np.int32)
    return StepInputs(pos + 100, pos, pos, np.zeros(n, np.int32), np.array([n - 1], np.int32), one, one,
                      np.array([[0, n, 0, 0]], np.int32), np.stack([blocks, blocks], 1), None)


def layer_kernels(launches, layers: int = 16, tail: int = 3) -> list[str]:
    """The first layer's launches: those between the embedding and the last `tail` (the final norm, the gather of
    the logit rows, the LM head; or the gather and one GEMV) are the layers', as many each."""
    names = [k for k, *_ in launches]
    first = names.index("embedding_gather") + 1
    every = names[first:-tail]
    assert len(every) % layers == 0, every
    return every[:len(every) // layers]


@pytest.mark.parametrize("R", [1, 2, 5, 8])
def test_a_fused_decode_step_is_five_kernels_a_layer(model, R):
    model.fused_sizes = {1, 2, 4, 5, 8}
    model.forward(decode_step(R))
    assert layer_kernels(model.gpu.launches) == [f"gemv_norm_rope_m{R}", "attention_tiles_hd64",
                                                 f"gemv_residual_m{R}",
                                                 f"gemv_norm_silu_m{R}", f"gemv_residual_m{R}"]
    assert [k for k, *_ in model.gpu.launches[-3:]] == ["rms_norm", "embedding_gather", "cublas"]


@pytest.mark.parametrize("R", [1, 3, 8])
def test_a_step_of_a_size_not_fused_takes_the_separate_kernels(model, R):
    model.fused_sizes = {2, 4}
    model.forward(decode_step(R))
    assert layer_kernels(model.gpu.launches) == ["rms_norm", "cublas", "rope_kv_write", "attention_tiles_hd64",
                                                 "cublas", "add_rms_norm", "cublas",
                                                 "silu_mul", "cublas"]
    assert [k for k, *_ in model.gpu.launches[-3:]] == ["add_rms_norm", "embedding_gather", "cublas"]


def test_an_unfused_step_streams_the_gemms_the_plain_gemv_won_and_leaves_the_rest_to_cublas(model):
    """plain_shapes names (M, N, K) where gemv.cu's plain GEMV beat cuBLAS: at 1 row o and down take it, at its
    warps a column; qkv and gate_up, and a step of 2 rows, stay with cuBLAS."""
    model.plain_shapes = {(1, 2048, 2048): 2, (1, 2048, 8192): 8}
    model.forward(decode_step(1))
    assert layer_kernels(model.gpu.launches) == ["rms_norm", "cublas", "rope_kv_write", "attention_tiles_hd64",
                                                 "gemv_m1", "add_rms_norm", "cublas", "silu_mul", "gemv_m1"]
    o = next(grid for k, grid, _ in model.gpu.launches if k == "gemv_m1")
    assert o == (2048 // 4, 1, 1)                                 # 2 warps a column: 4 columns a block
    model.gpu.launches.clear()
    model.forward(decode_step(2))
    assert "gemv_m2" not in [k for k, *_ in model.gpu.launches]


def test_the_step_s_end_in_one_gemv_at_a_head_size(model):
    """At a size in head_sizes the final norm, the LM head and the argmax are one gemv_norm_head over the logit
    rows of x (no norm before the gather), and the sampler gets its ids; at a fused size not in head_sizes the
    end is the norm, the gather of h and cuBLAS, and the sampler reads the logits alone."""
    model.fused_sizes, model.head_sizes = {1, 4}, {4}
    model.forward(decode_step(4))
    model.queue_sample_rows(4)
    launches = model.gpu.launches
    assert [k for k, *_ in launches[-3:]] == ["embedding_gather", "gemv_norm_head_m4", "sample_tokens"]
    assert layer_kernels(launches[:-1], tail=2)[-1] == "gemv_residual_m4"
    gather, head, sample = (args for _, _, args in launches[-3:])
    assert gather[3] == model.x.arg and head[1] == gather[4]              # x's rows, gathered, into the GEMV
    assert head[2] == model.logits.arg and head[8:] == (model.head_best.arg, model.head_ticket.arg,
                                                        model.head_ids.arg)
    assert sample[-2] == model.head_ids.arg
    launches.clear()
    model.forward(decode_step(1))
    model.queue_sample_rows(1)
    assert [k for k, *_ in launches[-4:]] == ["rms_norm", "embedding_gather", "cublas", "sample_tokens"]
    assert launches[-1][2][-2] == 0                                    # no ids: the sampler reads the logits


def test_a_head_size_whose_layers_are_not_fused_keeps_the_step_s_end_apart(model):
    model.fused_sizes, model.head_sizes = set(), {4}
    model.forward(decode_step(4))
    assert [k for k, *_ in model.gpu.launches[-3:]] == ["add_rms_norm", "embedding_gather", "cublas"]
    assert model.greedy_ids is None


def test_pick_head_times_the_step_s_end_both_ways_at_each_fused_size(model, monkeypatch, tmp_path):
    """pick_head on a clock that runs the work (every launcher's checks) and calls the one GEMV faster at 1 row
    and slower at 4; what it timed is kept, and a second pick over the file times nothing."""
    from .. import graphs
    from ..gemm_timings import GemmTimings

    def fake_us(gpu, work, repeats=3):
        model.gpu.launches.clear()
        work()
        names = [k for k, *_ in model.gpu.launches]
        assert names[-1] == "sample_tokens"
        one = [k for k in names if str(k).startswith("gemv_norm_head")]
        assert names == (["embedding_gather", *one, "sample_tokens"] if one else
                         ["rms_norm", "embedding_gather", "cublas", "sample_tokens"])
        return {"gemv_norm_head_m1": 5.0, "gemv_norm_head_m4": 12.0}.get(one[0] if one else None, 10.0)

    monkeypatch.setattr(graphs, "gpu_us", fake_us)
    model.fused_sizes = {1, 4}
    timings = GemmTimings(tmp_path / "t.json")
    assert graphs.pick_head(model, timings) == {1: (10.0, 5.0), 4: (10.0, 12.0)} and model.head_sizes == {1}
    timings.save()
    monkeypatch.setattr(graphs, "gpu_us", lambda *a, **k: pytest.fail("timed although kept"))
    model.head_sizes = set()
    assert graphs.pick_head(model, GemmTimings(tmp_path / "t.json")) == {1: (10.0, 5.0), 4: (10.0, 12.0)}
    assert model.head_sizes == {1}


def test_prompt_tiles_take_the_hopper_kernel_with_their_layer_s_tensor_maps(model):
    """On sm_90 a prompt's tiles (192 M-rows: 48 rows of the 1B's 4 query heads a K/V head) go through
    attention_hopper_hd64, each layer with its own two tensor maps, the kernel allowed its shared memory; decode
    rows still take attention_tiles."""
    from ..kernels import hopper_shared_bytes

    assert model.hopper and model.tile_rows == 48
    model.forward(prompt_step(60))
    hopper = [(grid, args) for k, grid, args in model.gpu.launches if k == "attention_hopper_hd64"]
    assert len(hopper) == 16 and all(grid == (8, 2, 1) for grid, _ in hopper)   # 8 K/V heads; 48 + 12 rows
    assert [args[2] for _, args in hopper] == [model.kv_maps.ptr + 256 * i for i in range(16)]
    assert model.gpu.shared_memory == {"attention_hopper_hd64": hopper_shared_bytes(64),
                                       "attention_hopper_hd128": hopper_shared_bytes(128)}
    model.gpu.launches.clear()
    model.forward(decode_step(3))
    assert "attention_hopper_hd64" not in [k for k, *_ in model.gpu.launches]


def test_a_chunk_deep_in_a_prompt_splits_its_last_wave_s_tile_by_keys(model):
    """On a GPU of 6 SMs a chunk of 40 rows at position 300 is one tile x 8 K/V heads: 8 blocks, 2 in a second
    wave; cut into 3 pieces (24 blocks: 4 waves of a third of the tile), merged through the model's records."""
    gpu, cfg = RecordingGpu(), PRESETS["llama-3.2-1b"]                    # the fixture's patches, another GPU
    gpu.device.properties.multiprocessor_count = 6
    model = model_module.Model(weights(gpu, cfg), cfg, gpu, kernels_module.Kernels(gpu), MAX_SEQS, 512, MAX_ROWS,
                               BLOCK_SIZE)
    model.allocate_cache(64)
    n, first = 40, 300
    pos = np.arange(first, first + n, dtype=np.int32)
    one = np.zeros(1, np.int32)
    blocks = np.arange(-(-(first + n) // BLOCK_SIZE), dtype=np.int32)
    step = StepInputs(pos, pos, pos, np.zeros(n, np.int32), np.array([n - 1], np.int32), one, one,
                      np.array([[0, n, 0, first]], np.int32), np.stack([blocks, blocks], 1), None)
    model.forward(step)
    hopper = [(grid, args) for k, grid, args in model.gpu.launches if k == "attention_hopper_hd64"]
    assert len(hopper) == 16 and all(grid == (8, 3, 1) for grid, _ in hopper)
    assert all(args[-3:] == (model.hopper_partial.arg, model.hopper_arrivals.arg, 3) for _, args in hopper)


def test_blocks_under_8_positions_keep_prompts_on_attention_tiles(model, monkeypatch):
    """The TMA copies land whole 1,024-byte swizzle atoms: with 4 positions a block prompts take attention_tiles."""
    gpu, cfg = RecordingGpu(), PRESETS["llama-3.2-1b"]
    m = model_module.Model(weights(gpu, cfg), cfg, gpu, kernels_module.Kernels(gpu), MAX_SEQS, MAX_LEN, MAX_ROWS, 4)
    assert not m.hopper and m.tile_rows == 16


def test_every_kernel_after_the_table_write_starts_once_it_has_finished(model):
    """attention_tiles.cu reads the block tables, and a decode row's older keys, before its wait for the kernel
    ahead (kernels/pdl.cuh): the launch after block_table_write() is not early, and so no kernel after it starts
    before the tables are whole; every other launch is early."""
    model.forward(decode_step(2))
    names = [k for k, *_ in model.gpu.launches]
    after = names.index("block_table_write") + 1
    assert names[after] == "embedding_gather" and not model.gpu.early[after]
    assert all(early for i, early in enumerate(model.gpu.early) if i != after)
    model.gpu.launches.clear(), model.gpu.early.clear()
    model.forward(replace(decode_step(2), table_updates=np.zeros((0, 2), np.int32)))   # no table written
    assert "block_table_write" not in [k for k, *_ in model.gpu.launches] and all(model.gpu.early)


def test_a_prompt_step_is_never_fused(model):
    model.fused_sizes = set(range(1, 9))
    model.forward(prompt_step(40))
    names = [k for k, *_ in model.gpu.launches]
    assert not any(str(k).startswith("gemv") for k in names) and names.count("rope_kv_write") == 16


def test_the_paired_kinds_grid_covers_every_pair(model):
    """gemv_norm_rope at 1 row: (nh + 2 nkv) hd / 2 = 1,536 pairs of the 1B, 4 / column_warps pairs a block;
    gemv_norm_silu: 8,192 pairs (gate and up rows); both clamped to at most 4 warps a column."""
    model.fused_sizes = {1}
    model.gemv_shapes = {(1, 3072, 2048): 8, (1, 16384, 2048): 2}
    model.forward(decode_step(1))
    grids = {k: g for k, g, _ in model.gpu.launches if str(k).startswith("gemv_norm")}
    assert grids["gemv_norm_rope_m1"] == (1536, 1, 1)           # 8 warps taken as 4: one pair a block
    assert grids["gemv_norm_silu_m1"] == (4096, 1, 1)           # 2 warps: 2 pairs a block


def test_the_fused_qkv_reads_what_rope_kv_write_reads(model):
    """The same step unfused, then fused: layer 0's gemv_norm_rope gets the caches, slot mapping, rope tables and
    positions rope_kv_write got (the same device arrays, in its order), and reads x, the residual stream."""
    step = decode_step(4)
    model.fused_sizes = set()
    model.forward(step)
    unfused = next(args for k, _, args in model.gpu.launches if k == "rope_kv_write")
    model.gpu.launches.clear()
    model.fused_sizes = {4}
    model.forward(step)
    fused = next(args for k, _, args in model.gpu.launches if k == "gemv_norm_rope_m4")
    assert fused[8:14] == unfused[1:7] and fused[1] == model.x.arg


def test_the_picks_and_a_graph_s_body_launch_what_they_time(model, monkeypatch, tmp_path):
    """pick_gemms and pick_fused on a clock that runs the work once and calls it 1 us (every launcher's checks on
    padding rows, at every size and warps a column), then what a captured graph of 4 rows holds: the fused
    layer, at the warps the picks kept, on the graph's own input views."""
    from .. import graphs
    from ..gemm_timings import GemmTimings

    monkeypatch.setattr(graphs, "gpu_us", lambda gpu, work, repeats=3: (work(), 1.0)[1])
    sizes = [1, 2, 4, 8, 16]
    timings = GemmTimings(tmp_path / "t.json")
    assert len(graphs.pick_gemms(model, sizes, timings)) == 16
    assert graphs.pick_fused(model, sizes, timings) == {m: (1.0 / 16, 1.0 / 16) for m in (1, 2, 4, 8)}
    model.fused_sizes, model.gemv_shapes = {4}, {(4, 3072, 2048): 2}
    model.gpu.launches.clear()
    graphs.DecodeGraphs(model, sizes).body(4)
    names = [k for k, *_ in model.gpu.launches]
    assert names.count("gemv_norm_rope_m4") == 16 and names[-1] == "sample_tokens"
    qkv = next(grid for k, grid, _ in model.gpu.launches if k == "gemv_norm_rope_m4")
    assert qkv == (1536 // 2, 1, 1)                               # 2 warps a column: two pairs a block
