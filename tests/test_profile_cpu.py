"""CPU: the profile's naming of a decode step's kernels from each stage's declaration, its floors, the cutting of a
generate() run into decode steps, and the GPU's gaps inside a step (common/bench/profile.py)."""
import ast
import importlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from common.checkpoint import Checkpoint
from common.bench.profile import (FLOORED, ORDER, Declaration, cut_steps, engine_kwargs, exposed_ns, floor_bytes,
                            format_profile, idle_ns, label_step, read_declaration, step_figures, summarize)
from common.synthetic import PRESETS

ROOT = Path(__file__).resolve().parents[1]
SHAPES = SimpleNamespace(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16)   # what floor_bytes reads
STAGES = sorted(p.parent.name for p in ROOT.glob("stage*_*/kernels.py") if int(p.parent.name[5:7]) >= 2)


def stage(number: str) -> str:
    return next(s for s in STAGES if s.startswith(f"stage{number}_"))


def loaded_kernels(name: str) -> set[str]:
    """The kernel names a stage's kernels.py loads: what follows the file in each load("file.cu", ...), string
    literals or a starred generator over the module's constants (evaluated with them)."""
    module = importlib.import_module(f"{name}.kernels")
    names = set()
    for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "load":
            for arg in node.args[1:]:
                if isinstance(arg, ast.Constant):
                    names.add(arg.value)
                else:
                    assert isinstance(arg, ast.Starred), ast.dump(arg)
                    names.update(eval(compile(ast.Expression(arg.value), name, "eval"), vars(module)))
    return names


def test_every_stage_from_02_is_found():
    assert [s[5:7] for s in STAGES] == [f"{n:02d}" for n in range(2, 2 + len(STAGES))] and len(STAGES) >= 9


@pytest.mark.parametrize("name", STAGES)
def test_every_kernel_a_stage_loads_is_declared_and_every_declared_group_has_a_floor(name):
    """Each loaded kernel has a group of its stage's own (an undeclared one would pass for a cuBLAS GEMM), each
    declared entry names a kernel the stage loads, and read_declaration() finds a floor for every group."""
    declared = read_declaration(name)                        # refuses a group without a floor
    loaded = loaded_kernels(name)
    assert loaded, name
    for kernel in loaded:
        assert kernel in declared.groups or any(p.endswith("*") and kernel.startswith(p[:-1])
                                                for p in declared.groups), f"{name}: {kernel} is not declared"
    for entry in declared.groups:
        assert any(k == entry or entry.endswith("*") and k.startswith(entry[:-1]) for k in loaded), \
            f"{name}: {entry} matches no kernel it loads"
    for group in declared.groups.values():
        assert group in (None, "gemm", *FLOORED, *declared.fused)
    assert declared.keeps_cache == (name != stage("02"))    # stage02 alone re-runs the whole sequence


def declaration_text(name: str) -> str:
    text = (ROOT / name / "kernels.py").read_text()
    return text[text.index("PROFILE_GROUPS = "):text.index("\nclass Kernels")]


@pytest.mark.parametrize("before, after", list(zip(STAGES, STAGES[1:])))
def test_consecutive_stages_that_load_the_same_kernels_declare_them_in_the_same_words(before, after):
    """The stages are copies: a declaration changes only where the kernels do, so a reader's diff shows it there."""
    same = loaded_kernels(before) == loaded_kernels(after)
    assert (declaration_text(before) == declaration_text(after)) == same, (before, after)


def test_a_declared_group_without_a_floor_is_refused_naming_the_stage_and_the_group():
    with pytest.raises(ValueError, match=r"stage99_x/kernels.py: PROFILE_GROUPS\['softmax'\] is group 'scores'"):
        Declaration("stage99_x", {"softmax": "scores"})
    with pytest.raises(ValueError, match=r"stage99_x/kernels.py: PROFILE_FUSED\['a \+ b'\] adds 'b'"):
        Declaration("stage99_x", {"ab": "a + b"}, {"a + b": ("rope", "b")})


def test_a_step_of_stage07_s_kernels_with_cublas_s_between_takes_the_gemms_in_order():
    """Undeclared kernels are cuBLAS's: each takes the next GEMM of the step's order, a split-K reduction stays
    with the GEMM before it; the stage's own kernels take their declared groups (attention_* by prefix)."""
    one = ["add_rms_norm", "nvjet_a", "rope_inplace", "kv_write", "attention_tiles_hd64", "attention_combine",
           "sm90_gemm_b", "splitKreduce_kernel", "add_rms_norm", "gemv2T_c", "silu_mul", "nvjet_d"]
    names = ["block_table_write", "embedding_gather", *one, *one, "add_rms_norm", "embedding_gather", "nvjet_head",
             "sample_tokens"]
    declared = read_declaration(stage("07"))
    labels = label_step(names, 2, declared)
    per_layer = ["norms", "gemm qkv", "rope", "kv_write", "attention", "attention", "gemm o", "gemm o", "norms",
                 "gemm gate_up", "silu_mul", "gemm down"]
    assert labels == ["block tables", "embedding", *per_layer, *per_layer, "norms", "embedding", "gemm lm_head",
                      "sample"]
    with pytest.raises(ValueError, match="GEMMs"):
        label_step(names + ["nvjet_extra"], 2, declared)
    with pytest.raises(ValueError, match="checksum_u16 ran in a decode step"):
        label_step(["checksum_u16"], 2, declared)


def test_a_step_of_stage10_s_kernels_takes_gemv_kernels_and_cublas_s_alike_as_the_next_gemm():
    one = ["add_rms_norm", "gemv_m1", "rope_kv_write", "attention_tiles_hd64", "gemv_m1", "add_rms_norm",
           "nvjet_gate_up", "silu_mul", "gemv_m1"]
    names = ["embedding_gather", *one, *one, "add_rms_norm", "embedding_gather", "sm90_xmma_head",
             "splitKreduce_kernel", "sample_tokens"]
    per_layer = ["norms", "gemm qkv", "rope + kv_write", "attention", "gemm o", "norms", "gemm gate_up",
                 "silu_mul", "gemm down"]
    assert label_step(names, 2, read_declaration(stage("10"))) == [
        "embedding", *per_layer, *per_layer, "norms", "embedding", "gemm lm_head", "gemm lm_head", "sample"]


@pytest.mark.parametrize("fixture", ["tiny_dir", "tiny_untied_dir"])
def test_the_floors_of_zero_rows_are_the_weights_each_read_once(fixture, request):
    """With no rows, only weights move: the GEMMs' and norms' floors add up to the checkpoint's bytes, less the
    embedding table where it is not the LM head (a gather reads only its rows)."""
    ckpt = Checkpoint(request.getfixturevalue(fixture))
    c = ckpt.config
    fused = read_declaration(stage("10")).fused
    floors = floor_bytes(c, 0, [], fused)
    untied = c.vocab_size * c.hidden_size * 2 if fixture == "tiny_untied_dir" else 0
    assert sum(v for g, v in floors.items() if g not in fused) == ckpt.total_bytes - untied
    more = floor_bytes(c, 4, [100] * 4, fused)
    assert more["attention"] - floors["attention"] >= c.num_hidden_layers * 4 * 100 * 2 * c.num_key_value_heads \
        * c.head_dim * 2                                     # every cached key and value read
    assert more["rope + kv_write"] == more["rope"] + more["kv_write"] > 0   # the fused kernel moves both's bytes
    assert set(floor_bytes(c, 1, [1])) == set(FLOORED) and set(FLOORED) <= set(ORDER)


def test_overlapping_kernels_count_once_each_from_the_previous_end():
    """Kernels launched early (programmatic dependent launch) start before the one ahead ends: each is counted
    from that end, so the step's nanoseconds are counted once; without overlap it is each kernel's duration."""
    assert exposed_ns([(0, 10, "a"), (12, 20, "b"), (20, 25, "c")]) == [10, 8, 5]          # serial, a gap
    assert exposed_ns([(0, 10, "a"), (3, 14, "b"), (5, 30, "c"), (6, 31, "d")]) == [10, 4, 16, 1]
    assert sum(exposed_ns([(0, 10, "a"), (3, 14, "b"), (5, 30, "c")])) == 30 - 0           # the span, no gaps


def test_the_gaps_are_the_span_less_the_union_of_the_kernels():
    assert idle_ns([(0, 10, "a"), (12, 20, "b"), (20, 25, "c"), (40, 41, "d")]) == 2 + 15   # two holes
    assert idle_ns([(0, 10, "a"), (3, 14, "b"), (5, 30, "c"), (6, 12, "d")]) == 0           # overlaps, none
    assert idle_ns([(5, 30, "c"), (0, 10, "a"), (33, 40, "e"), (31, 32, "d")]) == 1 + 1     # any order
    assert idle_ns([(0, 100, "long"), (10, 20, "inside"), (120, 130, "after")]) == 20
    assert idle_ns([]) == 0


# how stage02..04 differ in a forward: a cache written, the logit rows gathered, the sampler's name
LAUNCHES = {"02": (False, False, "sample_token"), "03": (True, False, "sample_token"),
            "04": (True, True, "sample_tokens")}


def forward(number: str, layers: int) -> list[str]:
    """One forward's kernel names and its sampling, as the stage launches them (cuBLAS's between)."""
    cache, gather, sampler = LAUNCHES[number]
    one = ["add_rms_norm", "nvjet_qkv", "rope_inplace", *(["kv_write"] if cache else []), "attention_naive",
           "nvjet_o", "add_rms_norm", "nvjet_gate_up", "silu_mul", "nvjet_down"]
    return ["embedding_gather", *one * layers, "add_rms_norm", *(["embedding_gather"] if gather else []),
            "nvjet_lm_head", sampler]


@pytest.mark.parametrize("number", sorted(LAUNCHES))
def test_a_generate_run_cuts_into_its_prefill_and_one_piece_a_decode_step(number):
    """A forward opens with the embedding gather after the last step's sampler; the logit rows' gather inside a
    forward (stage04 on) and a prefill in two forwards do not cut. Prefill, 8 warm-up and 5 steps: 14 pieces."""
    declared = read_declaration(stage(number))
    prefill = forward(number, 2)[:-1] + forward(number, 2)      # two forwards, one sampling
    names = prefill + forward(number, 2) * (8 + 5)
    kernels = [(10 * i, 10 * i + 7, n) for i, n in enumerate(names)]
    pieces = cut_steps(kernels, declared)
    assert len(pieces) == 1 + 8 + 5
    assert [k[2] for k in pieces[0]] == prefill
    for piece in pieces[1:]:
        assert [k[2] for k in piece] == forward(number, 2)
        assert label_step([k[2] for k in piece], 2, declared)[-2:] == ["gemm lm_head", "sample"]
    assert cut_steps([], declared) == []


def test_a_step_s_figures_and_their_medians_say_where_the_wall_time_was_not_measured():
    declared = read_declaration(stage("03"))
    names = forward("03", 1)
    kernels = [(10 * i, 10 * i + 8, n) for i, n in enumerate(names)]      # 2 ns idle after each but the last
    row = step_figures(kernels, declared, 1, None, 300)
    assert row["wall_us"] is None and row["gaps_us"] == 2 * (len(names) - 1) / 1e3
    assert row["span_us"] == (10 * (len(names) - 1) + 8) / 1e3 and row["kernels"] == len(names)
    assert step_figures(kernels, declared, 1, 0.002, 300)["wall_us"] == 2000
    floors = floor_bytes(SHAPES, 1, [300])
    p = summarize([row, row], floors, {}, 4000.0)
    assert p["wall_us"] is None and p["gaps_us"] == row["gaps_us"] and "rope + kv_write" not in p["groups"]
    assert list(p["groups"]) == [g for g in ORDER if g in floors]
    text = format_profile({**p, "stage": "s", "batch": 1, "cache_length": 300, "steps": 2, "enforce_eager": False,
                           "gpu": "g", "copy_gb_per_s": 4000.0, "weights_floor_us": 1.0,
                           "decode_step": "a full forward over every position (no KV cache)"})
    assert "wall not measured" in text and "idle between kernels" in text and "a full forward" in text


def test_each_engine_gets_its_batch_size_under_the_name_it_takes():
    """stage02 and stage03 run one sequence at a time; stage04 takes max_batch_size, stage05 on max_num_seqs."""
    engines = {n: importlib.import_module(stage(n)).Engine for n in ("02", "03", "04", "05", "10")}
    assert engine_kwargs("s", engines["02"], 1, 2048, False) == {"max_model_len": 2048}
    with pytest.raises(SystemExit, match="one sequence at a time"):
        engine_kwargs("s", engines["03"], 4, 2048, False)
    assert engine_kwargs("s", engines["04"], 8, 2048, False) == {"max_model_len": 2048, "max_batch_size": 8}
    assert engine_kwargs("s", engines["05"], 8, 2048, False) == {"max_model_len": 2048, "max_num_seqs": 8}
    with pytest.raises(SystemExit, match="no enforce_eager"):
        engine_kwargs("s", engines["05"], 1, 2048, True)
    assert engine_kwargs("s", engines["10"], 1, 2048, True)["enforce_eager"] is True


def test_a_split_model_s_step_counts_nccl_s_kernels_as_collectives_and_rank_0_s_share_of_the_weights():
    """Rank 0 of a model split over GPUs: NCCL's kernels (C++ names, mangled) are the collectives, taking no GEMM's
    place; its floors are its own shapes' and its slice of the LM head's; a stage without the split refuses it."""
    declared = read_declaration(stage("13"))
    one = ["rms_norm", "nvjet_qkv", "rope_kv_write", "attention_tiles_hd64", "nvjet_o",
           "_Z33ncclDevKernel_AllReduce_Sum_bf16_RING_LLP24ncclDevKernelArgsStorage", "add_rms_norm",
           "nvjet_gate_up", "silu_mul", "nvjet_down", "_Z33ncclDevKernel_AllReduce_Sum_bf16_RING_LLv"]
    names = ["embedding_gather", *one, "add_rms_norm", "embedding_gather", "nvjet_head",
             "_Z31ncclDevKernel_AllGather_RING_LLv", "sample_tokens"]
    labels = label_step(names, 1, declared)
    assert labels.count("collectives") == 3 and labels[-3:] == ["gemm lm_head", "collectives", "sample"]
    assert [g for g in labels if g.startswith("gemm")] == ["gemm qkv", "gemm o", "gemm gate_up", "gemm down",
                                                           "gemm lm_head"]
    c = PRESETS["llama-3.2-1b"]
    whole, slice_ = floor_bytes(c, 1, [1]), floor_bytes(c, 1, [1], head_rows=c.vocab_size // 2)
    assert slice_["gemm lm_head"] < whole["gemm lm_head"] and slice_["sample"] == whole["sample"]
    assert whole["collectives"] == 0
    assert engine_kwargs("s", importlib.import_module(stage("13")).Engine, 1, 2048, False, 2)[
        "tensor_parallel_size"] == 2
    with pytest.raises(SystemExit, match="runs on one GPU"):
        engine_kwargs("s", importlib.import_module(stage("12")).Engine, 1, 2048, False, 2)


def test_without_a_gpu_the_profile_says_so_in_one_line(capsys):
    """It needs the GPU's kernels: without a GPU it says so (and what profiles the host instead) before it writes
    any checkpoint; a stage that does not exist is one line too."""
    from common.bench.profile import main
    from common.device import has_gpu

    if has_gpu()[0]:
        pytest.skip("a GPU runs the profile")
    for argv, says in ((["--stage", "10"], "no GPU"), (["--stage", "99"], "--stage 99: no such stage")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, err
