"""CPU: the GEMM timings kept per machine (gemm_timings.py): written and read back, an unreadable file timed anew,
the first timing of an entry kept when two engines write, the file named by what a timing depends on, and the
picks made from kept timings without timing anything."""
from types import SimpleNamespace


from ..gemm_timings import GemmTimings
from ..graphs import pick_fused, pick_gemms


def test_entries_saved_are_read_back_by_the_next_engine(tmp_path):
    path = tmp_path / "t" / "timings.json"
    first = GemmTimings(path)
    assert first.get("gemv", (1, 64, 32, 2)) is None
    first.put("gemv", (1, 64, 32, 2), [6.0, 5.0, 2])
    first.save()
    assert first.new == {}
    assert GemmTimings(path).get("gemv", (1, 64, 32, 2)) == [6.0, 5.0, 2]
    assert GemmTimings(path).get("gemv", (2, 64, 32, 2)) is None


def test_an_unreadable_file_is_timed_anew_and_replaced(tmp_path):
    path = tmp_path / "timings.json"
    path.write_text("{ not json")
    t = GemmTimings(path)
    assert t.entries == {}
    t.put("gemv", (8, 64, 32, 2), [9.0, 7.5, 4])
    t.save()
    assert GemmTimings(path).get("gemv", (8, 64, 32, 2)) == [9.0, 7.5, 4]


def test_the_first_timing_of_an_entry_stays_when_two_engines_write(tmp_path):
    path = tmp_path / "timings.json"
    a, b = GemmTimings(path), GemmTimings(path)          # both read the file before either wrote
    a.put("gemv", (1, 64, 32, 2), [6.0, 5.0, 2])
    a.save()
    b.put("gemv", (1, 64, 32, 2), [6.0, 6.5, 4])
    b.put("gemv", (2, 64, 32, 2), [7.0, 6.0, 1])
    b.save()
    kept = GemmTimings(path)
    assert kept.get("gemv", (1, 64, 32, 2)) == [6.0, 5.0, 2] and kept.get("gemv", (2, 64, 32, 2)) == [7.0, 6.0, 1]
    assert not list(tmp_path.glob("*.tmp"))


def test_the_file_is_named_by_the_gpu_the_library_and_the_warps_tried(tmp_path, monkeypatch):
    monkeypatch.setenv("TINY_VLLM_CACHE", str(tmp_path))

    def model(gpu="NVIDIA H200", version=130100):
        return SimpleNamespace(gpu=SimpleNamespace(name=gpu), cublas=SimpleNamespace(version=version))

    path = GemmTimings.for_model(model(), (1, 2, 4, 8)).path
    assert path.parent == tmp_path / "gemm-timings"
    assert GemmTimings.for_model(model(), (1, 2, 4, 8)).path == path
    others = {GemmTimings.for_model(model(gpu="NVIDIA H100"), (1, 2, 4, 8)).path,
              GemmTimings.for_model(model(version=130200), (1, 2, 4, 8)).path,
              GemmTimings.for_model(model(), (1, 2, 4)).path}
    assert path not in others and len(others) == 3


class Untimeable:
    """Whatever a timing would touch: using it fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"timed although the timings were kept ({name})")


SHAPES = {"qkv": (48, 32), "o": (32, 32), "gate_up": (128, 32), "down": (32, 64)}
FUSED_KEY = (32, 64, 48, 32, 2)        # hidden, intermediate, qkv width, heads x head_dim, layers


def fake_model(shapes: dict):
    layers = [{name: SimpleNamespace(shape=shape, ptr=0) for name, shape in shapes.items()} for _ in range(2)]
    config = SimpleNamespace(hidden_size=32, intermediate_size=64, num_attention_heads=4, head_dim=8)
    return SimpleNamespace(layers=layers, gemv_shapes={}, plain_shapes={}, fusable=True, fused_sizes=set(),
                           config=config,
                           qkv_width=48, gpu=Untimeable(), cublas=Untimeable(), kernels=Untimeable(),
                           h=None, qkv=None, attn=None, d=None, gate_up=None, act=None,
                           row_view=lambda buf, first, n: SimpleNamespace(dtype="bf16"))


def test_kept_timings_pick_without_timing(tmp_path):
    """The fused kind's warps a column come from the kept gemm entries whatever cuBLAS took; the plain GEMV is
    taken only where it beat cuBLAS; a size is fused where its kept fused time beat the unfused one, and only
    fused sizes keep their fused warps."""
    timings = GemmTimings(tmp_path / "t.json")
    for name, (n, k) in SHAPES.items():
        for m in (1, 2):             # the fused kind slower than cuBLAS: timed all the same; plain faster at 1 row
            timings.put("gemm", (name, m, n, k, 2), [6.0, 5.0 if m == 1 else 7.0, 4, 9.0, m])
    timings.put("fused", (1, *FUSED_KEY), [30.0, 20.0])
    timings.put("fused", (2, *FUSED_KEY), [30.0, 31.0])
    model = fake_model(SHAPES)
    times = pick_gemms(model, [1, 2, 16], timings)
    assert sorted(times) == sorted((name, m) for name in SHAPES for m in (1, 2))   # 16 rows: not gemv.cu's
    assert model.gemv_shapes == {(m, n, k): m for n, k in SHAPES.values() for m in (1, 2)}
    assert model.plain_shapes == {(1, n, k): 4 for n, k in SHAPES.values()}
    assert pick_fused(model, [1, 2, 16], timings) == {1: (30.0, 20.0), 2: (30.0, 31.0)}
    assert model.fused_sizes == {1} and model.gemv_shapes == {(1, n, k): 1 for n, k in SHAPES.values()}


def test_no_gemv_where_the_weights_do_not_suit_it(tmp_path):
    model = fake_model(SHAPES)
    model.fusable = False
    timings = GemmTimings(tmp_path / "t.json")
    assert pick_gemms(model, [1, 2], timings) == {} and pick_fused(model, [1, 2], timings) == {}
    assert model.gemv_shapes == {} and model.plain_shapes == {} and model.fused_sizes == set()


def test_timing_anew_times_every_kind_at_every_size_and_keeps_it(tmp_path, monkeypatch):
    """With nothing kept, each GEMM is timed at each size up to 8 rows through cuBLAS and through each gemv.cu
    kind at each warps a column it may take, then each size's layer fused and unfused, on padding rows; a fake
    clock (a GEMV's time grows with M and the warps, the plain one's with the warps alone; a fused layer's with
    the size) decides. Every time is kept: a second pick over the same file times nothing."""
    from .. import graphs

    calls = []

    def fake_us(gpu, work, repeats=3):
        calls.clear()
        work()
        if calls[0][0] == "fused_gemm":
            return 5.0 + calls[0][2] + calls[0][3]          # 5 + M + warps: one warp a column is fastest
        if calls[0][0] == "gemv":
            assert len({w for _, w, *_ in calls}) == len(model.layers)   # each layer's own weights streamed
            return 7.0 + 2 * calls[0][3]                    # 7 + 2 warps: beats cuBLAS (10) at one warp only
        return 5.0 + 4 * calls[0][2] if calls[0][0] == "fused layer" else 10.0   # a fused layer wins at 1 row

    monkeypatch.setattr(graphs, "gpu_us", fake_us)
    model = fake_model(SHAPES)
    model.gpu = SimpleNamespace(fill_bytes=lambda a, v: None, to_device=lambda host: host)
    model.cublas = SimpleNamespace(linear=lambda x, w, y: calls.append(("cublas", None, 0)))
    model.kernels = SimpleNamespace(gemv=lambda x, w, y, warps: calls.append(("gemv", id(w), 0, warps)))
    model.fused_gemm = lambda name, i, m, rows, warps: calls.append(("fused_gemm", name, m, warps))
    model.project_qkv = lambda i, m, fused, rows: calls.append(("fused layer" if fused else "layer", None, m))
    model.finish_layer = lambda i, m, fused: None
    model.x = None
    timings = GemmTimings(tmp_path / "t.json")
    times = pick_gemms(model, [1, 2, 16], timings)
    assert sorted(times) == sorted((name, m) for name in SHAPES for m in (1, 2))
    assert times[("o", 2)] == (5.0, 4.5, 1, 4.0, 1) and times[("qkv", 1)] == (5.0, 4.5, 1, 3.5, 1)   # / 2 layers
    assert model.plain_shapes == {(m, n, k): 1 for n, k in SHAPES.values() for m in (1, 2)}
    layer = pick_fused(model, [1, 2, 16], timings)
    assert layer == {1: (5.0, 4.5), 2: (5.0, 6.5)} and model.fused_sizes == {1}
    assert model.gemv_shapes == {(1, n, k): 1 for n, k in SHAPES.values()}
    timings.save()
    again = fake_model(SHAPES)                               # Untimeable: any timing fails the test
    assert pick_gemms(again, [1, 2], GemmTimings(tmp_path / "t.json")) == times
    assert pick_fused(again, [1, 2], GemmTimings(tmp_path / "t.json")) == layer and again.fused_sizes == {1}
    assert again.plain_shapes == model.plain_shapes and again.gemv_shapes == model.gemv_shapes
