"""GPU tier: the GPU copy equals the file, and the embedding gather equals numpy."""
import numpy as np
import pytest

from common.bf16 import bf16_to_f32
from common.checkpoint import Checkpoint
from common.device import get_gpu

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def kernels():
    from ..kernels import Kernels

    return Kernels(get_gpu())


@pytest.mark.parametrize("fixture", ["tiny_dir", "tiny_sharded_dir", "tiny_untied_dir", "small_dir"])
def test_gpu_copy_equals_file(fixture, request):
    from .. import Engine

    engine = Engine(str(request.getfixturevalue(fixture)))
    assert engine.verify() == []
    ckpt = engine.checkpoint
    name = "model.layers.1.self_attn.k_proj.weight"
    assert np.array_equal(engine.gpu.to_host(engine.weights[name]), ckpt.raw(name))  # and byte for byte
    if ckpt.config.tie_word_embeddings:
        assert engine.weights.lm_head.ptr == engine.weights["model.embed_tokens.weight"].ptr  # shared, no copy
    else:
        assert np.array_equal(engine.gpu.to_host(engine.weights.lm_head), ckpt.raw("lm_head.weight"))


def test_verify_catches_a_corrupted_byte(tiny_dir):
    from .. import Engine

    engine = Engine(str(tiny_dir))
    target = engine.weights["model.layers.0.mlp.down_proj.weight"]
    engine.gpu.fill_bytes(target.view(1000, (1,), "u8"), 0x5A)  # one byte changed on the GPU only
    assert engine.verify() == ["model.layers.0.mlp.down_proj.weight"]


def test_checksum_kernel_equals_host_on_random_odd_sizes(kernels):
    from ..weights import host_checksum

    gpu = kernels.gpu
    rng = np.random.default_rng()
    for n in (1, 31, 257, 100_003, 3_000_001):
        words = rng.integers(0, 2**16, n, dtype=np.uint16)
        out = gpu.empty((1,), "u64")
        gpu.fill_bytes(out, 0)
        kernels.checksum(gpu.to_device(words, "u16"), out)
        assert int(gpu.to_host(out)[0]) == host_checksum(words), n


@pytest.mark.parametrize("T, V, H", [(1, 128256, 64), (37, 1000, 2056), (300, 50, 8), (5, 128256, 2048)])
def test_embedding_gather_equals_numpy(kernels, T, V, H):
    gpu = kernels.gpu
    rng = np.random.default_rng()
    table = rng.integers(0, 2**16, (V, H), dtype=np.uint16)     # any bit pattern: a copy must not change it
    ids = rng.integers(0, V, T).astype(np.int32)
    ids[0] = V - 1                                                # the last row too
    out = gpu.empty((T, H), "bf16")
    gpu.fill_bytes(out, 0xFF)                                     # poisoned: unwritten values stay NaN
    kernels.embedding(gpu.to_device(ids), gpu.to_device(table, "bf16"), out)
    got = gpu.to_host(out)
    assert np.array_equal(got, table[ids])


@pytest.mark.parametrize("T, n", [(1, 1), (37, 5), (300, 256)])
def test_embedding_takes_rows_named_by_prev_rows_from_the_sampled_ids(kernels, T, n):
    """Asynchronous scheduling's rows: where prev_rows[t] >= 0 the id is prev_ids[prev_rows[t]], else ids[t]."""
    gpu, V, H = kernels.gpu, 1000, 264
    rng = np.random.default_rng()
    table = rng.integers(0, 2**16, (V, H), dtype=np.uint16)
    ids, prev_ids = rng.integers(0, V, T).astype(np.int32), rng.integers(0, V, n).astype(np.int32)
    prev_rows = np.where(rng.random(T) < 0.5, rng.integers(0, n, T), -1).astype(np.int32)
    prev_rows[0] = n - 1
    out = gpu.empty((T, H), "bf16")
    gpu.fill_bytes(out, 0xFF)
    kernels.embedding(gpu.to_device(ids), gpu.to_device(table, "bf16"), out, gpu.to_device(prev_rows),
                      gpu.to_device(prev_ids))
    want = np.where(prev_rows >= 0, prev_ids[np.maximum(prev_rows, 0)], ids)
    assert np.array_equal(gpu.to_host(out), table[want])


def test_engine_embed_matches_reference(tiny_dir):
    from .. import Engine

    engine = Engine(str(tiny_dir))
    ids = [128000, 5, 127999, 42]
    expected = Checkpoint(tiny_dir).f32("model.embed_tokens.weight")[ids]
    assert np.array_equal(bf16_to_f32(engine.embed(ids)), expected)
    with pytest.raises(ValueError, match="token ids"):
        engine.embed([128256])


def test_embedding_launcher_rejects_bad_shapes(kernels):
    gpu = kernels.gpu
    with pytest.raises(ValueError, match="embedding"):
        kernels.embedding(gpu.empty((3,), "i32"), gpu.empty((10, 12), "bf16"), gpu.empty((3, 12), "bf16"))
    with pytest.raises(ValueError, match="embedding"):             # prev_rows of another length
        kernels.embedding(gpu.empty((3,), "i32"), gpu.empty((10, 16), "bf16"), gpu.empty((3, 16), "bf16"),
                          gpu.empty((2,), "i32"), gpu.empty((4,), "i32"))


@pytest.mark.slow
def test_1b_preset_loads_and_verifies():
    from .. import Engine

    engine = Engine("llama-3.2-1b")
    assert engine.weights.stats.bytes == 2 * 1_235_814_400
    assert engine.verify() == []


@pytest.mark.parametrize("buffers", [1, 2, 7])
def test_any_number_of_staging_buffers_copies_exactly(tiny_sharded_dir, kernels, buffers):
    from ..weights import load_weights, verify

    ckpt = Checkpoint(tiny_sharded_dir)
    weights = load_weights(ckpt, kernels.gpu, progress=False, buffers=buffers)
    assert verify(weights, ckpt, kernels) == []
