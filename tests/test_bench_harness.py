import json
from pathlib import Path

import pytest

from common.bench.harness import BASELINES, Progress, main, stage_module
from common.bench.table import format_table, merge, spread_warnings, summarise
from common.bench.measure import growth_rates
from common.bench.workloads import WORKLOADS, make_requests
from common.device import has_gpu
from common.outputs import Timing


def test_workloads_are_seeded_and_in_range():
    a, b = make_requests("ragged"), make_requests("ragged")
    assert [r[0] for r in a] == [r[0] for r in b] and len(a) == 256
    assert all(100 <= len(p) <= 1024 and 100 <= s.max_tokens <= 1024 and s.ignore_eos for p, s in a)
    assert all(len(p) == 128 and s.max_tokens == 256 for p, s in make_requests("latency"))
    assert set(WORKLOADS) >= {"latency", "growth", "batch", "ragged", "long", "load"}


def test_prefix_prompts_share_their_first_2048_tokens_and_only_those():
    reqs = make_requests("prefix")
    system = reqs[0][0][:2048]
    assert len(reqs) == 256 and all(p[:2048] == system and 32 <= len(p) - 2048 <= 512 for p, _ in reqs)
    assert len({tuple(p[2048:2052]) for p, _ in reqs}) == 256                  # each request's own part differs
    assert WORKLOADS["prefix"].max_model_len == 2048 + 512 + 256


def test_every_measured_run_starts_with_a_cold_prefix_cache():
    """A repeat of the same requests would otherwise find all of them cached (generate_once resets the cache of
    an engine that has one)."""
    from common.bench.measure import generate_once

    class Engine:
        calls: list = []

        def reset_prefix_cache(self):
            self.calls.append("reset")

        def generate(self, prompts, params):
            self.calls.append("generate")
            return []

    e = Engine()
    generate_once(e, [], [])
    generate_once(e, [], [])
    assert e.calls == ["reset", "generate"] * 2


def test_chat_sends_each_turn_after_the_answer_before_it_with_every_earlier_message_and_answer():
    """The chat driver over a fake step API that answers each request with [prompt length] * max_tokens, one
    token a step: turn k's prompt is turn k-1's prompt, its answer and turn k's message; every turn gets a time to
    first token."""
    from common.bench.measure import chat_once
    from common.sampling import SamplingParams

    class Engine:
        def __init__(self):
            self.live, self.sent = {}, []

        def add_request(self, prompt, params, request_id, detokenize):
            self.sent.append((request_id, list(prompt)))
            self.live[request_id] = (len(prompt), params.max_tokens, [])
            return request_id

        def has_unfinished_requests(self):
            return bool(self.live)

        def step(self):
            from common.outputs import RequestOutput
            outs = []
            for rid, (n, m, got) in list(self.live.items()):
                got.append(n)
                done = len(got) == m
                outs.append(RequestOutput(rid, [], got, "", "length" if done else None, [n], ""))
                if done:
                    del self.live[rid]
            return outs

    p = SamplingParams(max_tokens=2)
    conversations = [[([1, 2], p), ([3], p), ([4, 5, 6], p)], [([7], p), ([8], p), ([9], p)]]
    e = Engine()
    r = chat_once(e, conversations)
    sent = dict(e.sent)
    assert sent["chat-0-0"] == [1, 2] and sent["chat-0-1"] == [1, 2, 2, 2, 3]
    assert sent["chat-0-2"] == [1, 2, 2, 2, 3, 5, 5, 4, 5, 6] and sent["chat-1-2"] == [7, 1, 1, 8, 4, 4, 9]
    assert [k for k in r if k.startswith("ttft_ms_turn")] == ["ttft_ms_turn1", "ttft_ms_turn2", "ttft_ms_turn3"]
    assert r["output_tok_per_s"] > 0 and r["total_s"] > 0
    assert WORKLOADS["chat"].max_model_len == 4 * (256 + 256)


def test_max_model_len_is_sized_for_the_workload():
    """`long` asks for 32768 prompt tokens: the default max_model_len of 4096 would refuse it."""
    assert WORKLOADS["long"].max_model_len == 32768 + 64 and WORKLOADS["ragged"].max_model_len == 2048
    assert [len(p) for p, _ in make_requests("long", prompt_tokens=2048)] == [2048]


def test_every_workload_declares_its_headline_and_direction():
    for w in WORKLOADS.values():
        assert w.headline, w.name
    assert WORKLOADS["latency"].headline == ("ms_per_decode_step",) and WORKLOADS["latency"].lower_is_better
    sizes = (1, 8, 32, 64, 128, 256)                # 128 and 256: where the host's share of a step shows
    assert WORKLOADS["batch"].headline == tuple(f"output_tok_per_s_at_B{n}" for n in sizes)
    assert WORKLOADS["batch"].requests == 256
    assert not WORKLOADS["ragged"].lower_is_better


def _results(**runs):
    return {name: merge([{"runs": [{k: v} for v in vals] for k, vals in r.items()}]) for name, r in runs.items()}


def test_ratio_is_the_headline_figure_not_the_first_key():
    """On `latency` the speed-up compares ms per step (lower is better), never an alphabetically first key."""
    results = {"a": merge([{"runs": [{"ms_per_decode_step": 4.0, "bandwidth_utilisation": 0.1}] * 3}]),
               "b": merge([{"runs": [{"ms_per_decode_step": 2.0, "bandwidth_utilisation": 0.9}] * 3}])}
    table = format_table(summarise(results), WORKLOADS["latency"])
    assert table.splitlines()[-1].endswith("| 2.00x |"), table       # 4 ms -> 2 ms is twice as fast


def test_batch_has_one_ratio_per_batch_size():
    one = {f"output_tok_per_s_at_B{n}": float(n) for n in (1, 8, 32, 64, 128, 256)}
    forty = {f"output_tok_per_s_at_B{n}": float(n) * (1.4 if n == 1 else 40) for n in (1, 8, 32, 64, 128, 256)}
    table = format_table(summarise({"s03": merge([{"runs": [one] * 3}]), "s04": merge([{"runs": [forty] * 3}])}),
                         WORKLOADS["batch"])
    assert table.splitlines()[0].count("speed-up") == 6
    assert table.splitlines()[-1].endswith("| 1.40x | 40.00x | 40.00x | 40.00x | 40.00x | 40.00x |"), table


def test_median_spread_and_every_run_kept():
    s = summarise({"x": merge([{"runs": [{"output_tok_per_s": v} for v in (100.0, 130.0, 101.0)]}])})["x"]
    assert s["output_tok_per_s"] == 101.0 and s["spread"]["output_tok_per_s"] == [100.0, 130.0]
    assert s["repeats"] == 3
    assert "| 101 (100-130) |" in format_table({"x": s}, WORKLOADS["ragged"])
    notes = spread_warnings({"x": s}, WORKLOADS["ragged"])
    assert len(notes) == 1 and "spread 30%" in notes[0]
    tight = summarise({"y": merge([{"runs": [{"output_tok_per_s": v} for v in (100.0, 105.0, 102.0)]}])})
    assert spread_warnings(tight, WORKLOADS["ragged"]) == []


def test_unsupported_length_is_reported_not_crashed():
    results = {"s": merge([{"runs": [{"prefill_tok_per_s_at_2048": 10.0}], "prompt_tokens": 2048},
                           {"unsupported": "GpuMemoryError: cannot allocate 138 GB", "prompt_tokens": 32768}])}
    s = summarise(results)["s"]
    assert s["unsupported_at_32768"].startswith("GpuMemoryError")
    assert "unsupported" in format_table({"s": s}, WORKLOADS["long"]).splitlines()[-1]


def test_stage_lookup():
    assert stage_module("01") == "stage01_loading"


def test_a_stage_split_over_gpus_is_nn_tpk():
    from common.bench.harness import UnknownEngine, engine_name, engine_spec

    spec = engine_spec("13-tp2")
    assert spec.module == "stage13_tensor_parallel" and spec.kwargs == {"tensor_parallel_size": 2}
    assert engine_name("13-tp4") == "stage13_tensor_parallel-tp4" and engine_name("13") == "stage13_tensor_parallel"
    with pytest.raises(UnknownEngine, match="-tpK"):
        engine_spec("13-tpx")


def test_a_stage_s_tag_may_name_its_token_budget():
    from common.bench.harness import UnknownEngine, engine_name, engine_spec

    assert engine_spec("12-tok8192").kwargs == {"max_num_batched_tokens": 8192}
    assert engine_spec("13-tp2-tok4096").kwargs == {"tensor_parallel_size": 2, "max_num_batched_tokens": 4096}
    assert engine_name("12-tok8192") == "stage12_hopper_attention-tok8192"
    for bad in ("12-tok", "12-x8", "12-tok8k"):
        with pytest.raises(UnknownEngine, match="-tokT"):
            engine_spec(bad)


def test_baselines_load_like_stages():
    assert stage_module("hf") == "common.bench.hf_engine" and stage_module("numpy") == "common.reference"
    assert {"hf", "hf-sdpa", "hf-compile", "numpy"} <= set(BASELINES)


def test_growth_rates_count_decode_steps_only():
    """Token 1 comes from prefill (its time is the TTFT); tokens 2..n from n - 1 decode steps."""
    slow_later = Timing(512, ttft_s=1.0, step_s=[0.01] * 255 + [0.02] * 768)   # 1024 new tokens
    rates = growth_rates([slow_later])
    assert abs(rates["decode_tok_per_s_at_64"] - 100.0) < 1e-9
    assert abs(rates["decode_tok_per_s_at_256"] - 100.0) < 1e-9
    assert abs(rates["decode_tok_per_s_at_1024"] - 1023 / (2.55 + 15.36)) < 1e-9


@pytest.mark.skipif(has_gpu()[0], reason="checks the behaviour on a machine without a GPU")
def test_numpy_runs_and_a_gpu_stage_is_skipped_in_one_line(tmp_path, capsys):
    """The command, as a user without a GPU types it (about a minute: 3 runs of 256 numpy steps)."""
    assert main(["--stages", "numpy,04", "--workload", "latency", "--model", "tiny", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("stage04_static_batch: skipped: it needs a GPU (no NVIDIA driver") == 1 and "Traceback" not in out
    record = json.loads(next(tmp_path.glob("*.json")).read_text())
    numpy = record["stages"]["numpy"]
    assert numpy["repeats"] == 3 and len(record["raw"]["numpy"][0]["runs"]) == 3 and numpy["ms_per_decode_step"] > 0


@pytest.mark.skipif(has_gpu()[0], reason="runs the numpy engine, as on a machine without a GPU")
def test_a_long_point_over_the_budget_gets_fewer_runs_and_says_so(tmp_path, capsys):
    assert main(["--stages", "numpy", "--workload", "long", "--model", "tiny", "--lengths", "32", "--repeats", "3",
                 "--budget-s", "1e-6", "--out", str(tmp_path)]) == 0
    assert "numpy: at 32 tokens, 1 of 3 runs: one takes" in capsys.readouterr().out
    record = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert record["stages"]["numpy"]["repeats"] == 1 and "runs_cut_at_32" in record["stages"]["numpy"]


@pytest.mark.skipif(has_gpu()[0], reason="runs the numpy engine, as on a machine without a GPU")
def test_progress_is_one_stderr_line_per_engine_and_run_and_the_json_stays_in_the_file(tmp_path, capsys):
    """A ragged run on numpy ran minutes without a word, and the table opened with a line of raw JSON."""
    assert main(["--stages", "numpy", "--workload", "long", "--model", "tiny", "--lengths", "16,32", "--repeats", "2",
                 "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    runs = [x for x in err.splitlines() if " repeat " in x]
    assert [x.split(": ")[0] for x in runs] == ["[1/4] numpy at 16 tokens repeat 1 of 2",
                                                "[2/4] numpy at 16 tokens repeat 2 of 2",
                                                "[3/4] numpy at 32 tokens repeat 1 of 2",
                                                "[4/4] numpy at 32 tokens repeat 2 of 2"], err
    assert runs[0].split(": ")[1].startswith("prefill_tok_per_s_at_16 "), err
    assert "{" not in out + err and out.startswith("long: "), out + err
    assert json.loads(next(tmp_path.glob("*.json")).read_text())["raw"]["numpy"][0]["runs"]


def test_progress_total_drops_by_the_runs_a_worker_did_not_make(capsys):
    shown = Progress(6)
    shown.line("a", "repeat 1 of 3: x 1")
    shown.finished("a", {"runs": [{}]}, repeats=3)              # cut by the budget: 1 of 3
    shown.finished("b", {"unsupported": "too long"}, repeats=3)
    assert capsys.readouterr().err.splitlines() == ["[1/6] a repeat 1 of 3: x 1", "[1/1] b unsupported: too long"]


def test_a_ladder_is_every_stage_from_its_first_then_its_baselines():
    from common.bench.harness import ladder_stages
    from common.bench.workloads import LADDERS

    root = Path(__file__).resolve().parents[1]
    stages = sorted(p.name[5:7] for p in root.glob("stage[0-9][0-9]_*") if (p / "__init__.py").exists())
    for name, ladder in LADDERS.items():
        tags = ladder_stages(name).split(",")
        assert tags == [s for s in stages if int(s) >= ladder.first_stage] + list(ladder.baselines), name
        assert ladder.left_out, name                                # it says what it leaves out
    assert ladder_stages("ragged").split(",")[:2] == ["04", "05"] and "hf-sdpa" in ladder_stages("batch")
    assert "10" in ladder_stages("latency").split(",")                 # the newest stage is on every ladder


def test_ladder_run_names_its_engines_and_a_workload_without_one_is_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--ladder", "--workload", "cpu"])
    assert info.value.code == 2 and "cpu has no ladder" in capsys.readouterr().err


@pytest.mark.skipif(has_gpu()[0], reason="the CPU engines stand in only where there is no GPU")
def test_without_a_gpu_the_cpu_workload_runs_each_stage_s_own_loop(capsys):
    """`--workload cpu` on a CPU: a stage from 05 runs its CpuEngine (its loop over the numpy forward), so stage
    loops compare on any machine; an earlier stage, and every other workload, is skipped with the reason."""
    from common.bench.harness import engine_class, skip_reason

    assert engine_class("05", "cpu").__name__ == "CpuEngine" and skip_reason("09", "cpu") is None
    assert skip_reason("04", "cpu").startswith("skipped: it needs a GPU")
    assert skip_reason("09", "ragged").startswith("skipped: it needs a GPU")


def test_an_unknown_engine_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--stages", "05,99", "--workload", "cpu"])
    assert info.value.code == 2 and "--stages: no stage or baseline '99'" in capsys.readouterr().err
