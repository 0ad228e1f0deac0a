"""The benchmark harness: each engine in a fresh process, warm-up excluded, at least 3 timed runs, medians.

    python -m common.bench --stages 03,04 --workload batch [--model PRESET|DIR] [--repeats 3] [--processes 1]

Workloads are the design's seeded request sets (ignore_eos, so every run generates the same number of tokens),
plus `load` (stage01's: weights onto the GPU against a plain read of the same bytes). Each declares its headline
figures and whether lower is better; the table shows every figure's median with its spread (min-max over all
runs) and, per headline figure, the speed-up against the previous engine of the same run. The JSON keeps every
run. An engine plugs in by exporting `Engine`; a workload it cannot run is reported as unsupported with the
reason, and a GPU engine on a machine without a GPU is skipped, in one line each.

max_model_len is sized for the workload (its longest prompt plus its new tokens), so `long`'s 32768-token
prompt is asked of every engine; one that cannot hold it says why.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import inspect
import json
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from common.checkpoint import Checkpoint
from common.sampling import SamplingParams
from common.synthetic import resolve_model

GROWTH_LENGTHS = (64, 256, 1024)
BATCH_SIZES = (1, 8, 32, 64)        # `batch`: the first B of its 64 requests, given to generate() together
LONG_LENGTHS = (2048, 8192, 32768)  # `long`: one prompt of each length, each in its own process
SPREAD_WARNING = 0.10               # (max - min) / median of a headline figure above this is called out


@dataclass(frozen=True)
class Workload:
    name: str
    requests: int
    prompt_tokens: tuple[int, int]   # (low, high), uniform; equal for a fixed length
    new_tokens: tuple[int, int]
    figure: str
    headline: tuple[str, ...]        # the figures the ratio columns compare
    lower_is_better: bool = False
    columns: tuple[str, ...] = ()    # further figures the table shows

    @property
    def max_model_len(self) -> int:
        return self.prompt_tokens[1] + self.new_tokens[1]


WORKLOADS = {w.name: w for w in [
    Workload("load", 0, (0, 0), (0, 0), "weights onto the GPU, GB/s, against a plain read of the same file bytes",
             ("load_gb_per_s",), columns=("plain_read_gb_per_s",)),
    Workload("latency", 1, (128, 128), (256, 256), "ms per decode step, time to first token, bandwidth use",
             ("ms_per_decode_step",), lower_is_better=True,
             columns=("ttft_ms", "output_tok_per_s", "bandwidth_utilisation")),
    Workload("growth", 1, (512, 512), (1024, 1024), "decode tok/s over the first 64, 256, 1024 new tokens",
             tuple(f"decode_tok_per_s_at_{n}" for n in GROWTH_LENGTHS)),
    Workload("batch", 64, (128, 128), (128, 128), "output tok/s at B = 1, 8, 32, 64",
             tuple(f"output_tok_per_s_at_B{n}" for n in BATCH_SIZES)),
    Workload("ragged", 256, (100, 1024), (100, 1024), "output tok/s (nano-vllm's bench.py workload)",
             ("output_tok_per_s",), columns=("ttft_ms", "ms_per_decode_step", "slot_waste", "padding_share")),
    Workload("long", 1, (LONG_LENGTHS[-1], LONG_LENGTHS[-1]), (64, 64),
             "prefill tok/s (prompt tokens / time to first token) at 2048, 8192, 32768; memory beyond the weights",
             tuple(f"prefill_tok_per_s_at_{n}" for n in LONG_LENGTHS),
             columns=tuple(f"memory_beyond_weights_gb_at_{n}" for n in LONG_LENGTHS)),
]}


@dataclass(frozen=True)
class EngineSpec:
    """Where an engine lives and how the harness builds it."""

    module: str
    kwargs: dict = field(default_factory=dict)
    gpu: bool = True
    batch_one: bool = False          # measured at batch 1 only: workloads of several requests are unsupported


BASELINES = {
    "hf": EngineSpec("common.hf_engine"),
    # 256 at a time: what a user of transformers would pick for `ragged` (its 256 requests in one left-padded
    # batch, ~1000 decode steps, where 64 at a time would take 4 batches of ~1000 steps each)
    "hf-sdpa": EngineSpec("common.hf_engine", {"attn_implementation": "sdpa", "batch_size": 256}),
    "hf-compile": EngineSpec("common.hf_engine", {"attn_implementation": "sdpa", "compile": True}, batch_one=True),
    "numpy": EngineSpec("common.reference", gpu=False),
}


def make_requests(name: str, vocab_size: int = 128000, seed: int = 0, prompt_tokens: int | None = None
                  ) -> list[tuple[list[int], SamplingParams]]:
    """The workload's requests: random regular-token prompts (no special ids) and greedy ignore_eos params.
    `prompt_tokens` fixes the prompt length (`long` runs one per length)."""
    w = WORKLOADS[name]
    low, high = (prompt_tokens, prompt_tokens) if prompt_tokens else w.prompt_tokens
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(w.requests):
        p = int(rng.integers(low, high + 1))
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


def device_memory_used() -> int | None:
    """Bytes in use on device 0 as the driver sees them (every process, every allocator pool), or None without a
    GPU. The primary context is retained first, so the figure after an engine starts counts the engine, not it."""
    try:
        from cuda.bindings import driver

        from common.device import check

        check(driver.cuInit(0), "cuInit")
        dev = check(driver.cuDeviceGet(0), "cuDeviceGet")
        check(driver.cuCtxSetCurrent(check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")),
              "cuCtxSetCurrent")
        free, total = check(driver.cuMemGetInfo(), "cuMemGetInfo")
        return int(total) - int(free)
    except Exception:
        return None


def build_engine(tag: str, model: str, **kwargs):
    """The engine of a stage or baseline, given only the keyword arguments its constructor takes."""
    spec = engine_spec(tag)
    cls = importlib.import_module(spec.module).Engine
    accepted = inspect.signature(cls).parameters
    return cls(model, **spec.kwargs, **{k: v for k, v in kwargs.items() if k in accepted})


def run_load(tag: str, model: str, repeats: int) -> dict:
    build_engine(tag, model)              # warm-up: kernels compiled, files in the page cache, CUDA initialised
    runs = []
    for _ in range(repeats):
        engine = build_engine(tag, model)
        stats = getattr(getattr(engine, "weights", None), "stats", None)
        if stats is None:
            return {"unsupported": "it loads no weights onto a GPU"}
        runs.append({"load_gb_per_s": stats.gb_per_s})
        del engine
    read = plain_read_gbps(Checkpoint(resolve_model(model)).files)
    return {"runs": [r | {"plain_read_gb_per_s": read} for r in runs]}


def run_generate(tag: str, model: str, workload: str, repeats: int, prompt_tokens: int | None = None) -> dict:
    w = WORKLOADS[workload]
    if engine_spec(tag).batch_one and w.requests > 1:
        return {"unsupported": f"{tag} is measured at batch 1; {workload} has {w.requests} requests"}
    max_model_len = (prompt_tokens + w.new_tokens[1]) if prompt_tokens else w.max_model_len
    before = device_memory_used()
    try:   # one sequence at a time for `long`: no engine needs 64 caches of 32K positions to prefill one prompt
        engine = build_engine(tag, model, max_model_len=max_model_len,
                              **({"max_batch_size": 1} if workload == "long" else {}))
    except (MemoryError, ValueError) as e:   # GpuMemoryError, PromptError: the engine cannot hold this workload
        return {"unsupported": f"{type(e).__name__}: {e}"}
    reqs = make_requests(workload, min(engine.config.vocab_size, 128000), prompt_tokens=prompt_tokens)
    prompts, params = [r[0] for r in reqs], [r[1] for r in reqs]
    info: dict = {"max_model_len": max_model_len, "weight_bytes": Checkpoint(resolve_model(model)).total_bytes}
    t = time.perf_counter()
    try:
        warm_up(engine, workload, prompts, params, full=engine_spec(tag).batch_one)
    except NotImplementedError as e:
        return {"unsupported": str(e)}
    except MemoryError as e:
        return {"unsupported": f"{type(e).__name__}: {e}"}
    info["warmup_s"] = time.perf_counter() - t          # for hf-compile: the compile time, reported apart
    runs = []
    for _ in range(repeats):
        if workload == "batch":
            runs.append({f"output_tok_per_s_at_B{n}": generate_once(engine, prompts[:n], params[:n])[0]
                         for n in BATCH_SIZES})
            continue
        rate, timings = generate_once(engine, prompts, params)
        run = {"output_tok_per_s": rate} | waste(engine)
        steps = [s for t in timings for s in t.step_s]
        if steps:   # engines that keep per-request Timings: latency figures
            run |= {"ms_per_decode_step": 1e3 * statistics.median(steps),
                    "ttft_ms": 1e3 * statistics.median(t.ttft_s for t in timings)}
        if workload == "growth" and steps:
            run |= growth_rates(timings)
        if workload == "long" and timings:
            run = {f"prefill_tok_per_s_at_{prompt_tokens}": prompt_tokens / timings[0].ttft_s,
                   f"ms_per_decode_step_at_{prompt_tokens}": run.get("ms_per_decode_step", float("nan"))}
        runs.append(run)
    after = device_memory_used()
    if workload == "long" and before is not None and after is not None:
        info[f"memory_beyond_weights_gb_at_{prompt_tokens}"] = (after - before - info["weight_bytes"]) / 1e9
    return {"runs": runs, "info": info}


def warm_up(engine, workload: str, prompts, params, full: bool) -> None:
    """Compile the kernels and touch every shape the timed runs use, a few tokens each: every batch size (the
    first timed run was seen 30-50% slower without it at B = 8..64), and for `long` the whole prompt (warmed on
    a 128-token prompt, HF's first 2048- and 8192-token prefills were 2-4x slower than the next). `full`: the
    first request as timed (hf-compile compiles and captures the decode step for its cache length)."""
    def short(p):
        return replace(p, max_tokens=min(4, p.max_tokens))

    if full:
        engine.generate(prompts[:1], params[0])
    elif workload == "long":
        engine.generate(prompts[:1], replace(params[0], max_tokens=2))
    else:
        for n in (BATCH_SIZES if workload == "batch" else (min(len(prompts), 64),)):
            engine.generate(prompts[:n], [short(p) for p in params[:n]])


def generate_once(engine, prompts, params) -> tuple[float, list]:
    """Generated tokens per second of one generate(prompts, params), and the engine's per-request Timings."""
    t = time.perf_counter()
    outs = engine.generate(prompts, params)
    rate = sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t)
    return rate, list(getattr(engine, "timings", []))


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
    for pkg in ("numpy", "cuda.core", "cuda.bindings", "nvmath", "safetensors", "tokenizers", "torch",
                "transformers"):
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
def engine_spec(tag: str) -> EngineSpec:
    return BASELINES.get(tag) or EngineSpec(stage_module(tag))


def stage_module(tag: str) -> str:
    """"01" -> "stage01_loading"; a baseline's tag -> its module."""
    if tag in BASELINES:
        return BASELINES[tag].module
    root = Path(__file__).resolve().parents[1]
    found = sorted(p.name for p in root.glob(f"stage{int(tag):02d}_*") if (p / "__init__.py").exists()) \
        if tag.isdigit() else []
    if not found:
        raise SystemExit(f"no stage or baseline {tag!r} in {root} (baselines: {', '.join(BASELINES)})")
    return found[0]


def engine_name(tag: str) -> str:
    """The name results are keyed by: the stage's folder, or the baseline's tag."""
    return tag if tag in BASELINES else stage_module(tag)


def skip_reason(tag: str) -> str | None:
    """Why an engine cannot run on this machine at all, or None."""
    from common.device import has_gpu

    ok, why = has_gpu()
    return None if ok or not engine_spec(tag).gpu else f"skipped: it needs a GPU ({why})"


def run_worker(tag: str, model: str, workload: str, repeats: int, prompt_tokens: int | None, verbose: bool) -> dict:
    """One engine, one fresh process: its result dict (runs and info, or unsupported)."""
    cmd = [sys.executable, "-m", "common.bench", "--worker", tag, "--workload", workload, "--model", model,
           "--repeats", str(repeats)] + (["--prompt-tokens", str(prompt_tokens)] if prompt_tokens else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if verbose:
        sys.stderr.write(proc.stdout + proc.stderr)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not line:
        raise SystemExit(f"{engine_name(tag)} failed on {workload}:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(line[0][7:])


def merge(results: list[dict]) -> dict:
    """Several workers' results for one engine (processes, or `long`'s lengths) -> one: runs concatenated
    per figure, info merged, unsupported lengths kept by name."""
    out: dict = {"runs": [], "info": {}}
    for r in results:
        if "unsupported" in r:
            key = "unsupported" + (f"_at_{r['prompt_tokens']}" if "prompt_tokens" in r else "")
            out["info"][key] = r["unsupported"]
            continue
        out["runs"] += r["runs"]
        out["info"] |= r.get("info", {})
    return out


def summarise(results: dict[str, dict]) -> dict[str, dict]:
    """Per engine: the median of every figure over its runs, `spread` {figure: [min, max]}, the number of runs,
    and its info (warm-up time, memory, unsupported lengths)."""
    out = {}
    for name, r in results.items():
        if "skipped" in r:
            out[name] = {"skipped": r["skipped"]}
            continue
        s: dict = {k: v for k, v in r["info"].items()}
        keys = dict.fromkeys(k for run in r["runs"] for k, v in run.items() if isinstance(v, (int, float)))
        for k in keys:
            vals = [run[k] for run in r["runs"] if k in run]
            s[k] = statistics.median(vals)
            s.setdefault("spread", {})[k] = [min(vals), max(vals)]
        s["repeats"] = max([len([run for run in r["runs"] if k in run]) for k in keys] or [0])   # runs per figure
        if not r["runs"] and "unsupported" not in s:
            s["unsupported"] = "; ".join(f"{k[len('unsupported_at_'):]} tokens: {v}" for k, v in r["info"].items()
                                         if k.startswith("unsupported_at_"))
        out[name] = s
    return out


def spread_warnings(summary: dict[str, dict], workload: Workload) -> list[str]:
    notes = []
    for name, s in summary.items():
        for k in workload.headline:
            if k in s.get("spread", {}) and s[k]:
                lo, hi = s["spread"][k]
                if (hi - lo) / s[k] > SPREAD_WARNING:
                    notes.append(f"{name} {k}: spread {100 * (hi - lo) / s[k]:.0f}% over {s['repeats']} runs "
                                 f"(min {fmt(lo)}, max {fmt(hi)})")
    return notes


def fmt(x: float) -> str:
    if x != x:
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}" if abs(x) >= 0.1 \
        else f"{x:.3f}"


def speedup(workload: Workload, key: str, this: dict, prev: dict | None) -> str:
    """This engine against the previous one on a headline figure: >1 is better (faster or more tok/s)."""
    if not prev or key not in prev or key not in this or not this[key] or not prev[key]:
        return "-"
    r = prev[key] / this[key] if workload.lower_is_better else this[key] / prev[key]
    return f"{r:.2f}x"


def format_table(summary: dict[str, dict], workload: Workload) -> str:
    """Medians (min-max) of the headline and other figures, and the speed-up of each headline figure against
    the engine in the row above."""
    keys = [k for k in (*workload.headline, *workload.columns)
            if any(k in s or f"unsupported_at_{k.rsplit('_', 1)[-1]}" in s for s in summary.values())]
    short = {k: k.replace("output_tok_per_s_at_", "tok/s ").replace("prefill_tok_per_s_at_", "prefill tok/s ")
             .replace("decode_tok_per_s_at_", "decode tok/s ").replace("memory_beyond_weights_gb_at_", "GB beyond "
             "weights ") for k in keys}
    heads = [k for k in workload.headline if k in keys]
    if not keys:
        return "| engine | result |\n| --- | --- |\n" + "\n".join(
            f"| {name} | {s.get('skipped') or 'unsupported: ' + s.get('unsupported', '?')} |"
            for name, s in summary.items())
    lines = ["| engine | " + " | ".join(short[k] for k in keys) + " | "
             + " | ".join(f"speed-up: {short[k]}" for k in heads) + " |",
             "|" + " --- |" * (1 + len(keys) + len(heads))]
    prev = None
    for name, s in summary.items():
        if "skipped" in s or ("unsupported" in s and not s.get("repeats")):
            lines.append(f"| {name} | {s.get('skipped') or 'unsupported: ' + s['unsupported']} |")
            continue
        cells = []
        for k in keys:
            if k not in s:
                cells.append("unsupported" if f"unsupported_at_{k.rsplit('_', 1)[-1]}" in s else "n/a")
            elif k in s.get("spread", {}) and s["repeats"] > 1:
                lo, hi = s["spread"][k]
                cells.append(f"{fmt(s[k])} ({fmt(lo)}-{fmt(hi)})")
            else:
                cells.append(fmt(s[k]))
        lines.append(f"| {name} | " + " | ".join(cells) + " | "
                     + " | ".join(speedup(workload, k, s, prev) for k in heads) + " |")
        prev = s
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m common.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", default="01",
                    help="comma-separated stage numbers, e.g. 02,03, and baselines: " + ", ".join(BASELINES))
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="load")
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per process (at least 3 for a figure)")
    ap.add_argument("--processes", type=int, default=1,
                    help="fresh processes per engine, in alternating order; their runs are pooled")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--lengths", default=",".join(map(str, LONG_LENGTHS)),
                    help="`long`: the prompt lengths, comma-separated")
    ap.add_argument("--verbose", action="store_true", help="show each worker's own output")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--prompt-tokens", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:  # one engine, one fresh process: print one JSON line
        result = (run_load(a.worker, a.model, a.repeats) if a.workload == "load"
                  else run_generate(a.worker, a.model, a.workload, a.repeats, a.prompt_tokens))
        if a.prompt_tokens:
            result["prompt_tokens"] = a.prompt_tokens
        print("RESULT " + json.dumps(result))
        return 0
    workload = WORKLOADS[a.workload]
    a.started = datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S")
    tags = a.stages.split(",")
    names = {t: engine_name(t) for t in tags}
    raw: dict[str, list[dict]] = {names[t]: [] for t in tags}
    skipped = {names[t]: why for t in tags if (why := skip_reason(t))}
    for name, why in skipped.items():
        print(f"{name}: {why}")
    lengths = tuple(int(n) for n in a.lengths.split(",")) if a.workload == "long" else (None,)
    if a.workload == "long":   # the figures are those of the lengths asked for
        workload = replace(workload, headline=tuple(f"prefill_tok_per_s_at_{n}" for n in lengths),
                           columns=tuple(f"memory_beyond_weights_gb_at_{n}" for n in lengths))
    env = environment()
    for rep in range(a.processes):
        order = tags if rep % 2 == 0 else tags[::-1]   # alternate, so drift does not favour one engine
        for t in (t for t in order if names[t] not in skipped):
            for n in lengths:
                t0 = time.perf_counter()
                raw[names[t]].append(run_worker(t, a.model, a.workload, a.repeats, n, a.verbose))
                print(f"[{names[t]}{f' at {n} tokens' if n else ''}: {time.perf_counter() - t0:.0f} s] "
                      + json.dumps(raw[names[t]][-1])[:300], file=sys.stderr, flush=True)
                write_record(a, workload, env, raw, skipped, complete=False)   # a cut-off run keeps these
    summary, notes, path = write_record(a, workload, env, raw, skipped, complete=True)
    if path is None:
        return 0                                       # nothing ran: no result file
    print(f"{a.workload}: {workload.figure}; {a.model}; medians (min-max) of {a.repeats} runs x {a.processes} "
          f"process(es)")
    print(format_table(summary, workload))
    if env.get("copy_bandwidth_gb_per_s") and a.workload == "latency":
        weights = Checkpoint(resolve_model(a.model)).total_bytes
        print(f"bandwidth floor of a batch-1 decode step: {weights / 1e9:.2f} GB of weights / "
              f"{env['copy_bandwidth_gb_per_s']:.0f} GB/s = {weights / env['copy_bandwidth_gb_per_s'] / 1e6:.3f} ms")
    for name, s in summary.items():
        if "warmup_s" in s:
            print(f"{name}: warm-up {s['warmup_s']:.1f} s (kernel compiles; hf-compile: torch.compile and graph "
                  "capture), outside every figure")
        for k, why in s.items():
            if k.startswith("unsupported_at_"):
                print(f"{name}: {k[len('unsupported_at_'):]} tokens unsupported: {why}")
    for n in notes:
        print(f"note: {n}")
    print(f"wrote {path}")
    return 0


def write_record(a, workload: Workload, env: dict, raw: dict, skipped: dict, complete: bool):
    """Summarise what has run so far and write the result file (rewritten after every worker, so a run cut off
    by a time limit keeps what it measured, marked incomplete). Returns (summary, notes, path or None)."""
    results = {name: ({"skipped": skipped[name]} if name in skipped else merge(r)) for name, r in raw.items()
               if name in skipped or r}
    summary = summarise(results)
    for s in summary.values():   # model bandwidth utilisation: weight bytes read per step over the copy rate
        if "ms_per_decode_step" in s and env.get("copy_bandwidth_gb_per_s") and a.workload == "latency":
            s["bandwidth_utilisation"] = s["weight_bytes"] / (s["ms_per_decode_step"] / 1e3) / (
                env["copy_bandwidth_gb_per_s"] * 1e9)
    notes = spread_warnings(summary, workload)
    now = datetime.datetime.now(datetime.timezone.utc)
    record = {"workload": asdict(workload), "model": a.model, "date": now.date().isoformat(),
              "time": a.started,
              "environment": env, "repeats": a.repeats, "processes": a.processes, "complete": complete,
              "stages": summary, "spread_warnings": notes, "raw": raw}
    if all("skipped" in s for s in summary.values()):
        return summary, notes, None
    a.out.mkdir(parents=True, exist_ok=True)
    gpu = (env["gpu"] or "cpu").replace(" ", "-")
    # one file a comparison: GPU, date, workload, engines, and the UTC time it started (two runs of a day differ)
    path = a.out / f"{gpu}_{record['date']}_{a.workload}-{a.stages.replace(',', '-')}_{a.started.replace(':', '')}.json"
    path.write_text(json.dumps(record, indent=2))
    return summary, notes, path


if __name__ == "__main__":
    sys.exit(main())
