"""The benchmark harness: each stage in a fresh process, warm-up excluded, alternating order, medians.

    python -m common.bench --stages 01 --workload load [--model PRESET|DIR] [--repeats 3] [--out benchmarks/results]

Workloads are the design's seeded request sets (ignore_eos, so every run generates the same number of tokens),
plus `load` (stage01's: weights onto the GPU against a plain read of the same bytes). A stage plugs in by
exporting `Engine`; a workload a stage cannot run yet is reported as such, not faked. Results are JSON files
named by GPU and date; the table prints each stage's ratio to the previous one.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from common.checkpoint import Checkpoint
from common.sampling import SamplingParams
from common.synthetic import resolve_model


@dataclass(frozen=True)
class Workload:
    name: str
    requests: int
    prompt_tokens: tuple[int, int]   # (low, high), uniform; equal for a fixed length
    new_tokens: tuple[int, int]
    figure: str


WORKLOADS = {w.name: w for w in [
    Workload("load", 0, (0, 0), (0, 0), "weights onto the GPU, GB/s, against a plain read of the same file bytes"),
    Workload("latency", 1, (128, 128), (256, 256), "ms per decode step, time to first token, bandwidth use"),
    Workload("growth", 1, (512, 512), (1024, 1024), "decode tok/s at 64, 256, 1024 new tokens"),
    Workload("batch", 64, (128, 128), (128, 128), "output tok/s at B = 1, 8, 32, 64"),
    Workload("ragged", 256, (100, 1024), (100, 1024), "output tok/s (nano-vllm's bench.py workload)"),
    Workload("long", 1, (8192, 8192), (64, 64), "prefill tok/s at 2048 and 8192, attention memory"),
]}


GROWTH_LENGTHS = (64, 256, 1024)
BATCH_SIZES = (1, 8, 32, 64)      # `batch`: the first B of its 64 requests, given to generate() together


def make_requests(name: str, vocab_size: int = 128000, seed: int = 0) -> list[tuple[list[int], SamplingParams]]:
    """The workload's requests: random regular-token prompts (no special ids) and greedy ignore_eos params."""
    w = WORKLOADS[name]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(w.requests):
        p = int(rng.integers(w.prompt_tokens[0], w.prompt_tokens[1] + 1))
        n = int(rng.integers(w.new_tokens[0], w.new_tokens[1] + 1))
        out.append((rng.integers(0, vocab_size, p).tolist(),
                    SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)))
    return out


# ---------------------------------------------------------------------------- measurements (in the worker)
def plain_read_gbps(files: list[Path], buf: np.ndarray | None = None, repeats: int = 3) -> float:
    """Read the files' bytes into one buffer, already faulted in: the floor any loader that reads them pays."""
    total = sum(f.stat().st_size for f in files)
    if buf is None:
        buf = np.ones(total, dtype=np.uint8)   # ones, not empty: touch every page before the clock starts
    times = []
    for _ in range(repeats):
        t, pos = time.perf_counter(), 0
        for f in files:
            with open(f, "rb", buffering=0) as fh:
                pos += fh.readinto(memoryview(buf)[pos:])
        times.append(time.perf_counter() - t)
    return total / statistics.median(times) / 1e9


def run_load(stage: str, model: str, repeats: int) -> dict:
    mod = importlib.import_module(stage)
    mod.Engine(model)                      # warm-up: kernels compiled, files in the page cache, CUDA initialised
    runs = []
    for _ in range(repeats):
        engine = mod.Engine(model)
        runs.append(engine.weights.stats.gb_per_s)
        del engine
    files = Checkpoint(resolve_model(model)).files
    return {"load_gb_per_s": statistics.median(runs), "load_runs": runs,
            "plain_read_gb_per_s": plain_read_gbps(files)}


def run_generate(stage: str, model: str, workload: str, repeats: int) -> dict:
    mod = importlib.import_module(stage)
    engine = mod.Engine(model)
    reqs = make_requests(workload, min(engine.config.vocab_size, 128000))
    prompts, params = [r[0] for r in reqs], [r[1] for r in reqs]
    try:   # warm-up: kernels compiled, buffers touched; a few tokens are enough
        engine.generate(prompts[:1], replace(params[0], max_tokens=min(4, params[0].max_tokens)))
    except NotImplementedError as e:
        return {"unsupported": str(e)}
    if workload == "batch":
        return {f"output_tok_per_s_at_B{n}": output_rate(engine, prompts[:n], params[:n], repeats)[0]
                for n in BATCH_SIZES}
    rate, runs, timings = output_rate(engine, prompts, params, repeats)
    out = {"output_tok_per_s": rate, "runs": runs} | waste(engine)
    steps = [s for t in timings for s in t.step_s]
    if steps:   # engines that keep per-request Timings: latency figures
        out |= {"ms_per_decode_step": 1e3 * statistics.median(steps),
                "ttft_ms": 1e3 * statistics.median(t.ttft_s for t in timings),
                "weight_bytes": Checkpoint(resolve_model(model)).total_bytes}
    if workload == "growth" and steps:
        out |= growth_rates(timings)
    return out


def output_rate(engine, prompts, params, repeats: int) -> tuple[float, list[float], list]:
    """Generated tokens per second of generate(prompts, params): the median of `repeats` runs, the runs, and
    the engine's per-request Timings of all of them (where it keeps them)."""
    runs, timings = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        outs = engine.generate(prompts, params)
        runs.append(sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t))
        timings.extend(getattr(engine, "timings", []))
    return statistics.median(runs), runs, timings


def waste(engine) -> dict:
    """A batching engine's counts of the last generate() (its `stats`), where it keeps them."""
    stats = getattr(engine, "stats", None)
    if stats is None:
        return {}
    return {"batches": stats.batches, "slot_waste": stats.slot_waste, "padding_share": stats.padding_share}


def growth_rates(timings) -> dict:
    """Decode tok/s over the first n new tokens, n in GROWTH_LENGTHS (tokens 2..n come from decode steps);
    the median over the requests' Timings."""
    return {f"decode_tok_per_s_at_{n}": statistics.median((n - 1) / sum(t.step_s[:n - 1]) for t in timings)
            for n in GROWTH_LENGTHS}


def gpu_and_host_ms(gpu, enqueue, repeats: int = 5) -> dict:
    """Split one unit of queued GPU work (`enqueue()`, which must not wait for the GPU) into GPU time and the
    host's time to queue it. A spin kernel holds the GPU while the host queues, so the events around the work
    see it back to back, without launch gaps (common/kernels/spin.cu). Medians of `repeats`."""
    from cuda.core import LaunchConfig

    from common.compile import KernelModule

    spin = KernelModule(Path(__file__).parent / "kernels" / "spin.cu", gpu.arch).kernel("spin")
    one = LaunchConfig(grid=1, block=1)
    gpu_ms, host_ms, hold_ns = [], [], 20_000_000
    while len(gpu_ms) < repeats:
        gpu.launch(spin, one, np.uint64(hold_ns))
        t = time.perf_counter()
        start = gpu.record()
        enqueue()
        end = gpu.record()
        queued = time.perf_counter() - t
        end.sync()
        if queued * 1e9 > 0.8 * hold_ns:           # the GPU caught up with the host: hold it longer, retry
            hold_ns *= 2
            continue
        gpu_ms.append(end - start)
        host_ms.append(queued * 1e3)
    return {"gpu_ms": statistics.median(gpu_ms), "host_queue_ms": statistics.median(host_ms)}


def environment() -> dict:
    from common.device import has_gpu

    env = {"python": platform.python_version(), "gpu": has_gpu()[1] if has_gpu()[0] else None}
    for pkg in ("numpy", "cuda.core", "cuda.bindings", "nvmath", "safetensors", "tokenizers"):
        try:
            env[pkg] = importlib.import_module(pkg).__version__
        except Exception:
            env[pkg] = None
    if env["gpu"]:
        from common.device import get_gpu
        env["copy_bandwidth_gb_per_s"] = round(get_gpu().copy_bandwidth_gbps(), 1)
    try:
        from common.compile import nvrtc_version
        env["nvrtc"] = nvrtc_version()
    except Exception:
        env["nvrtc"] = None
    return env


# ---------------------------------------------------------------------------- the driver
BASELINES = {"hf": "common.hf_engine", "numpy": "common.reference"}   # exporting Engine, like a stage


def stage_module(tag: str) -> str:
    """"01" -> "stage01_loading"; "hf" and "numpy" -> the baselines' modules."""
    if tag in BASELINES:
        return BASELINES[tag]
    root = Path(__file__).resolve().parents[1]
    found = sorted(p.name for p in root.glob(f"stage{int(tag):02d}_*") if (p / "__init__.py").exists())
    if not found:
        raise SystemExit(f"no stage {tag} in {root}")
    return found[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m common.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", default="01",
                    help="comma-separated stage numbers, e.g. 02,03, and baselines: " + ", ".join(BASELINES))
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="load")
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per process, and processes per stage")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:  # one stage, one fresh process: print one JSON line
        result = (run_load(a.worker, a.model, a.repeats) if a.workload == "load"
                  else run_generate(a.worker, a.model, a.workload, a.repeats))
        print("RESULT " + json.dumps(result))
        return 0
    stages = [stage_module(s) for s in a.stages.split(",")]
    results: dict[str, list[dict]] = {s: [] for s in stages}
    for rep in range(a.repeats):
        order = stages if rep % 2 == 0 else stages[::-1]   # alternate, so drift does not favour one stage
        for s in order:
            proc = subprocess.run([sys.executable, "-m", "common.bench", "--worker", s, "--workload", a.workload,
                                   "--model", a.model, "--repeats", str(a.repeats)],
                                  capture_output=True, text=True)
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode or not line:
                raise SystemExit(f"{s} failed:\n{proc.stdout}\n{proc.stderr}")
            results[s].append(json.loads(line[0][7:]))
    summary = summarise(results)
    env = environment()
    for s in summary.values():   # model bandwidth utilisation: weight bytes read per step over the copy rate
        if "ms_per_decode_step" in s and env.get("copy_bandwidth_gb_per_s"):
            s["bandwidth_utilisation"] = s["weight_bytes"] / (s["ms_per_decode_step"] / 1e3) / (
                env["copy_bandwidth_gb_per_s"] * 1e9)
    record = {"workload": asdict(WORKLOADS[a.workload]), "model": a.model, "date": datetime.date.today().isoformat(),
              "environment": env, "stages": summary, "raw": results}
    a.out.mkdir(parents=True, exist_ok=True)
    gpu = (env["gpu"] or "cpu").replace(" ", "-")
    path = a.out / f"{gpu}_{record['date']}_{a.workload}-{a.stages.replace(',', '-')}.json"   # one file a comparison
    path.write_text(json.dumps(record, indent=2))
    print(format_table(summary))
    print(f"wrote {path}")
    return 0


def summarise(results: dict[str, list[dict]]) -> dict[str, dict]:
    out = {}
    for stage, runs in results.items():
        keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
        out[stage] = {k: statistics.median(r[k] for r in runs) for k in keys} or {"unsupported": runs[0]}
    return out


def format_table(summary: dict[str, dict]) -> str:
    stages = list(summary)
    keys = sorted({k for v in summary.values() for k in v if k != "unsupported"})
    lines = ["| stage | " + " | ".join(keys) + " | ratio to previous |", "|" + " --- |" * (len(keys) + 2)]
    for i, s in enumerate(stages):
        first = keys[0] if keys else None
        prev = summary[stages[i - 1]].get(first) if i and first else None
        ratio = f"{summary[s][first] / prev:.2f}x" if prev and first in summary[s] else "-"
        cells = [f"{summary[s][k]:.3f}" if k in summary[s] else "n/a" for k in keys]
        lines.append(f"| {s} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
