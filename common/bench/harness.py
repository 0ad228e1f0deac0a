"""The benchmark harness: each engine in a fresh process, warm-up excluded, at least 3 timed runs, medians.

    python -m common.bench --stages 03,04 --workload batch [--model PRESET|DIR] [--repeats 3] [--processes 1]
    python -m common.bench --ladder --workload ragged       # every stage that runs it, and the baselines
    python -m common.bench --stages 13,13-tp2 --workload latency    # NN-tpK: stage NN split over K GPUs
    python -m common.bench --stages 12,12-tok8192 --workload long  # NN-tokT: a token budget of T a step

A ladder run (--ladder) is the README's table and chart: the workload's engines (workloads.LADDERS: the stages
from its first on, and its baselines; it says which it leaves out and why) in one run on one machine, since the
H200s differ by up to 1.4x from one machine or day to the next.

Workloads are the design's seeded request sets (ignore_eos, so every run generates the same number of tokens),
plus `load` (stage01's: weights onto the GPU against a plain read of the same bytes). Each declares its headline
figures and whether lower is better; the table shows every figure's median with its spread (min-max over all
runs) and, per headline figure, the speed-up against the previous engine of the same run. The JSON keeps every
run. An engine plugs in by exporting `Engine`; a workload it cannot run is reported as unsupported with the
reason, and a GPU engine on a machine without a GPU is skipped, in one line each.

Progress goes to stderr, one line per engine and timed run, numbered against the whole comparison
("[3/6] stage05_continuous_batch repeat 2 of 3: output_tok_per_s 41.2"); stdout has the table; the JSON with
every run goes to the result file only.

max_model_len is sized for the workload (its longest prompt plus its new tokens), so `long`'s 32768-token
prompt is asked of every engine; one that cannot hold it says why.

--kv-cache-gib G gives every engine the same KV cache memory: a paged engine (one that takes
kv_cache_memory_bytes, vLLM's option) gets G GiB of blocks; a contiguous one (max_num_seqs regions of
max_model_len positions) gets as many regions as G GiB holds, at least one.
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
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from common.bench import USER_RESULTS
from common.bench.measure import (chat_once, device_memory_used, generate_once, growth_rates, plain_read_gbps, warm_up,
                                  waste)
from common.bench.table import format_table, merge, spread_warnings, summarise
from common.bench.workloads import (BATCH_SIZES, LADDERS, LONG_LENGTHS, WORKLOADS, Workload, make_conversations,
                                    make_requests)
from common.checkpoint import Checkpoint
from common.prompts import PromptError
from common.synthetic import resolve_model


@dataclass(frozen=True)
class EngineSpec:
    """Where an engine lives and how the harness builds it."""

    module: str
    kwargs: dict = field(default_factory=dict)
    gpu: bool = True
    batch_one: bool = False          # measured at batch 1 only: workloads of several requests are unsupported


BASELINES = {
    "hf": EngineSpec("common.bench.hf_engine"),
    # 256 at a time: what a user of transformers would pick for `ragged` (its 256 requests in one left-padded
    # batch, ~1000 decode steps, where 64 at a time would take 4 batches of ~1000 steps each)
    "hf-sdpa": EngineSpec("common.bench.hf_engine", {"attn_implementation": "sdpa", "batch_size": 256}),
    "hf-compile": EngineSpec("common.bench.hf_engine", {"attn_implementation": "sdpa", "compile": True},
                             batch_one=True),
    # transformers' own continuous batching: the baseline a user of transformers would pick for many requests
    "hf-cb": EngineSpec("common.bench.hf_engine", {"attn_implementation": "sdpa", "continuous_batching": True}),
    "numpy": EngineSpec("common.reference", gpu=False),
}


PROGRESS = "PROGRESS "   # a worker's stderr line the driver numbers and shows; the rest only with --verbose


# ---------------------------------------------------------------------------- the worker: one engine, one process
def progress(text: str) -> None:
    """One progress line of a worker, for the driver: "repeat 2 of 3: ..." counts as a timed run done."""
    print(PROGRESS + text, file=sys.stderr, flush=True)


def run_figures(run: dict, workload: str) -> str:
    """A timed run's headline figures for its progress line ("output_tok_per_s 41.2"), not the run's JSON."""
    keys = [k for k in run if k in WORKLOADS[workload].headline or k.startswith("prefill_tok_per_s_at_")]
    return ", ".join(f"{k} {run[k]:.4g}" for k in keys)


def engine_class(tag: str, workload: str | None = None):
    """The class the harness builds for a stage or baseline: its Engine, or, for the `cpu` workload on a machine
    without a GPU, a stage's CpuEngine (its own loop over the numpy forward, cpu_engine.py, stage05 on)."""
    from common.device import has_gpu

    spec = engine_spec(tag)
    if workload == "cpu" and tag not in BASELINES and not has_gpu()[0]:
        try:
            return importlib.import_module(f"{spec.module}.cpu_engine").CpuEngine
        except ModuleNotFoundError:                  # a stage before 05: no loop of its own without a GPU
            pass
    return importlib.import_module(spec.module).Engine


def build_engine(tag: str, model: str, workload: str | None = None, **kwargs):
    """The engine of a stage or baseline, given only the keyword arguments its constructor takes."""
    cls = engine_class(tag, workload)
    accepted = inspect.signature(cls).parameters
    return cls(model, **engine_spec(tag).kwargs, **{k: v for k, v in kwargs.items() if k in accepted})


def kv_budget(tag: str, model: str, max_model_len: int, gib: float) -> dict:
    """The constructor arguments that give an engine `gib` GiB of KV cache (see the module's docstring)."""
    if not gib:
        return {}
    accepted = inspect.signature(importlib.import_module(engine_spec(tag).module).Engine).parameters
    budget = int(gib * 2**30)
    if "kv_cache_memory_bytes" in accepted:
        return {"kv_cache_memory_bytes": budget}
    c = Checkpoint(resolve_model(model)).config
    per_region = c.num_hidden_layers * 2 * max_model_len * c.num_key_value_heads * c.head_dim * 2   # K, V in bf16
    return {"max_num_seqs": max(1, budget // per_region)}


def run_load(tag: str, model: str, repeats: int) -> dict:
    build_engine(tag, model)              # warm-up: kernels compiled, files in the page cache, CUDA initialised
    runs = []
    for _ in range(repeats):
        engine = build_engine(tag, model)
        stats = getattr(getattr(engine, "weights", None), "stats", None)
        if stats is None:
            return {"unsupported": "it loads no weights onto a GPU"}
        runs.append({"load_gb_per_s": stats.gb_per_s})
        progress(f"repeat {len(runs)} of {repeats}: {run_figures(runs[-1], 'load')}")
        del engine
    read = plain_read_gbps(Checkpoint(resolve_model(model)).files)
    return {"runs": [r | {"plain_read_gb_per_s": read} for r in runs]}


def run_generate(tag: str, model: str, workload: str, repeats: int, prompt_tokens: int | None = None,
                 budget_s: float = 0.0, kv_cache_gib: float = 0.0, max_model_len: int = 0) -> dict:
    w = WORKLOADS[workload]
    if engine_spec(tag).batch_one and w.requests > 1:
        return {"unsupported": f"{tag} is measured at batch 1; {workload} has {w.requests} requests"}
    max_model_len = max_model_len or ((prompt_tokens + w.new_tokens[1]) if prompt_tokens else w.max_model_len)
    before = device_memory_used()
    # one sequence at a time for `long` (no engine needs 64 caches of 32K positions to prefill one prompt);
    # `batch` asks for all its requests at once (max_num_seqs 256, vLLM's default)
    seqs = {"long": 1, "batch": w.requests}.get(workload)
    try:
        engine = build_engine(tag, model, workload, max_model_len=max_model_len,
                              **kv_budget(tag, model, max_model_len, kv_cache_gib)
                              | ({"max_batch_size": seqs, "max_num_seqs": seqs} if seqs else {}))
    except (MemoryError, PromptError) as e:   # GpuMemoryError, max_model_len past the model's: cannot hold it
        return {"unsupported": f"{type(e).__name__}: {e}"}
    if workload == "chat" and not hasattr(engine, "add_request"):
        return {"unsupported": f"{tag} has no step API (add_request, step): a turn is sent when the one before ends"}
    reqs = make_requests(workload, min(engine.config.vocab_size, 128000), prompt_tokens=prompt_tokens)
    prompts, params = [r[0] for r in reqs], [r[1] for r in reqs]
    info: dict = {"max_model_len": max_model_len, "weight_bytes": Checkpoint(resolve_model(model)).total_bytes}
    if kv_cache_gib:
        info["kv_cache_gib"] = kv_cache_gib
        info |= {k: getattr(engine, k) for k in ("max_num_seqs",) if hasattr(engine, k)}
    t = time.perf_counter()
    progress("warming up (outside the figures)")
    try:
        warm_up(engine, workload, prompts, params, full=engine_spec(tag).batch_one)
    except NotImplementedError as e:
        return {"unsupported": str(e)}
    except MemoryError as e:
        return {"unsupported": f"{type(e).__name__}: {e}"}
    info["warmup_s"] = time.perf_counter() - t          # for hf-compile: the compile time, reported apart
    progress(f"warmed up in {info['warmup_s']:.1f} s")
    if budget_s and workload == "long" and repeats * info["warmup_s"] > budget_s:
        # the warm-up ran the whole prompt: it tells what a run costs (a 32K prefill of a naive attention, ~1 min)
        fewer = max(1, int(budget_s // info["warmup_s"]))
        info[f"runs_cut_at_{prompt_tokens}"] = (f"{fewer} of {repeats} runs: one takes ~{info['warmup_s']:.0f} s, "
                                                f"the budget is {budget_s:.0f} s")
        repeats = fewer
    runs = []
    for _ in range(repeats):
        if workload == "chat":
            runs.append(chat_once(engine, make_conversations(workload, min(engine.config.vocab_size, 128000))))
            progress(f"repeat {len(runs)} of {repeats}: {run_figures(runs[-1], workload)}")
            continue
        if workload == "batch":
            runs.append({f"output_tok_per_s_at_B{n}": generate_once(engine, prompts[:n], params[:n])[0]
                         for n in BATCH_SIZES})
            continue
        rate, timings = generate_once(engine, prompts, params)
        run = {"output_tok_per_s": rate} | waste(engine)
        steps = [s for t in timings for s in t.step_s]
        if steps:   # engines that keep per-request Timings: latency figures
            run |= {"ms_per_decode_step": 1e3 * statistics.median(steps),
                    "itl_p99_ms": 1e3 * float(np.percentile(steps, 99)),
                    "ttft_ms": 1e3 * statistics.median(t.ttft_s for t in timings)}
            if all(t.queue_s is not None for t in timings):   # engines that admit requests one by one
                run["queue_ms"] = 1e3 * statistics.median(t.queue_s for t in timings)
        if workload == "growth" and steps:
            run |= growth_rates(timings)
        if workload == "long" and timings:
            run = {f"prefill_tok_per_s_at_{prompt_tokens}": prompt_tokens / timings[0].ttft_s,
                   f"ms_per_decode_step_at_{prompt_tokens}": run.get("ms_per_decode_step", float("nan"))}
        runs.append(run)
        progress(f"repeat {len(runs)} of {repeats}: {run_figures(run, workload)}")
    after = device_memory_used()
    if workload == "long" and before is not None and after is not None:
        info[f"memory_beyond_weights_gb_at_{prompt_tokens}"] = (after - before - info["weight_bytes"]) / 1e9
    return {"runs": runs, "info": info}


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
# a stage's tag may name constructor arguments after its number: NN-tpK, NN-tokT, NN-tpK-tokT
VARIANTS = {"tp": "tensor_parallel_size", "tok": "max_num_batched_tokens"}


def _variant(tag: str) -> tuple[str, dict]:
    """"13-tp2-tok8192" -> ("13", {"tensor_parallel_size": 2, "max_num_batched_tokens": 8192})."""
    stage, *parts = tag.split("-")
    kwargs = {}
    for part in parts:
        key = next((k for k in VARIANTS if part.startswith(k)), None)
        if key is None or not part[len(key):].isdigit():
            raise UnknownEngine(f"{tag!r}: a stage's tag is NN, then any of -tpK (split over K GPUs) and -tokT "
                                "(a token budget of T a step)")
        kwargs[VARIANTS[key]] = int(part[len(key):])
    return stage, kwargs


def engine_spec(tag: str) -> EngineSpec:
    """A baseline's spec, or a stage's: "NN", "NN-tpK" for stage NN with tensor_parallel_size=K, "NN-tokT" with
    max_num_batched_tokens=T."""
    if tag in BASELINES:
        return BASELINES[tag]
    stage, kwargs = _variant(tag)
    return EngineSpec(stage_module(stage), kwargs)


class UnknownEngine(ValueError):
    """A --stages entry that is neither a stage number nor a baseline's tag."""


def stage_module(tag: str) -> str:
    """"01" -> "stage01_loading"; a baseline's tag -> its module. UnknownEngine for anything else."""
    if tag in BASELINES:
        return BASELINES[tag].module
    root = Path(__file__).resolve().parents[2]
    found = sorted(p.name for p in root.glob(f"stage{int(tag):02d}_*") if (p / "__init__.py").exists()) \
        if tag.isdigit() else []
    if not found:
        raise UnknownEngine(f"no stage or baseline {tag!r} in {root} (baselines: {', '.join(BASELINES)})")
    return found[0]


def ladder_stages(workload: str, at_budget: bool = False) -> str:
    """The --stages of a workload's ladder run: every stage from its first, then its baselines; at its KV budget
    (Ladder.budget), the stages from the budget's first."""
    ladder = LADDERS[workload]
    root = Path(__file__).resolve().parents[2]
    numbers = sorted(p.name[5:7] for p in root.glob("stage[0-9][0-9]_*") if (p / "__init__.py").exists())
    if at_budget:
        return ",".join(n for n in numbers if int(n) >= ladder.budget[2])
    return ",".join([n for n in numbers if int(n) >= ladder.first_stage] + list(ladder.baselines))


def engine_name(tag: str) -> str:
    """The name results are keyed by: the stage's folder, with its tag's -tpK and -tokT, or the baseline's tag."""
    if tag in BASELINES:
        return tag
    stage, _, variant = tag.partition("-")
    return engine_spec(tag).module + (f"-{variant}" if variant else "")


def skip_reason(tag: str, workload: str | None = None) -> str | None:
    """Why an engine cannot run this workload on this machine, or None."""
    from common.device import has_gpu

    ok, why = has_gpu()
    if ok or not engine_spec(tag).gpu or engine_class(tag, workload).__name__ == "CpuEngine":
        return None
    return f"skipped: it needs a GPU ({why})"


class Progress:
    """The driver's progress on stderr: each worker's progress lines, numbered against the timed runs of the whole
    comparison. A worker that runs fewer than asked (unsupported, or cut by --budget-s) lowers the total."""

    def __init__(self, total: int):
        self.done, self.total = 0, total

    def line(self, label: str, text: str) -> None:
        self.done += text.startswith("repeat ")
        print(f"[{self.done}/{self.total}] {label} {text}", file=sys.stderr, flush=True)

    def finished(self, label: str, result: dict, repeats: int) -> None:
        self.total -= repeats - len(result.get("runs", []))
        if "unsupported" in result:
            self.line(label, f"unsupported: {result['unsupported']}")


def run_worker(tag: str, model: str, workload: str, repeats: int, prompt_tokens: int | None, verbose: bool,
               budget_s: float = 0.0, kv_cache_gib: float = 0.0, max_model_len: int = 0,
               shown: Progress | None = None) -> dict:
    """One engine, one fresh process: its result dict (runs and info, or unsupported). Its progress lines are
    shown as they come; its other stderr lines live with --verbose, else only if it fails."""
    cmd = [sys.executable, "-m", "common.bench", "--worker", tag, "--workload", workload, "--model", model,
           "--repeats", str(repeats), "--budget-s", str(budget_s), "--kv-cache-gib", str(kv_cache_gib),
           "--max-model-len", str(max_model_len)] + (
               ["--prompt-tokens", str(prompt_tokens)] if prompt_tokens else [])
    label = engine_name(tag) + (f" at {prompt_tokens} tokens" if prompt_tokens else "")
    shown = shown or Progress(repeats)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kept: list[str] = []

    def relay() -> None:      # stderr on a thread of its own: stdout is read meanwhile, neither pipe fills up
        for line in proc.stderr:
            if line.startswith(PROGRESS):
                shown.line(label, line[len(PROGRESS):].rstrip("\n"))
            elif verbose:
                sys.stderr.write(line)
            else:
                kept.append(line)

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    out = proc.stdout.read()
    proc.wait()
    reader.join()
    if verbose:
        sys.stderr.write("".join(x + "\n" for x in out.splitlines() if not x.startswith("RESULT ")))
    line = [x for x in out.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not line:
        raise SystemExit(f"{engine_name(tag)} failed on {workload}:\n{out}\n{''.join(kept)}")
    result = json.loads(line[0][7:])
    shown.finished(label, result, repeats)
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m common.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", default="01",
                    help="comma-separated stage numbers, e.g. 02,03, and baselines: " + ", ".join(BASELINES))
    ap.add_argument("--ladder", action="store_true",
                    help="every stage that runs the workload and its baselines, in one run (workloads.LADDERS)")
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="load",
                    help="the requests (common/bench/workloads.py; default: %(default)s; cpu: stages' own loops on "
                         "the tiny preset (--model tiny) where there is no GPU)")
    ap.add_argument("--model", default="llama-3.2-1b", help="a preset or checkpoint folder (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per process (at least 3 for a figure)")
    ap.add_argument("--processes", type=int, default=1,
                    help="fresh processes per engine, in alternating order; their runs are pooled")
    ap.add_argument("--out", type=Path, default=USER_RESULTS,
                    help="where the result file goes (default: %(default)s/, which git ignores; the runs a chapter "
                         "shows are copied into benchmarks/results/ and committed)")
    ap.add_argument("--lengths", default=",".join(map(str, LONG_LENGTHS)),
                    help="`long`: the prompt lengths, comma-separated")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="`long`: a length whose warm-up shows that the runs would take longer than this gets fewer "
                         "(at least 1), and says so; 0: no budget")
    ap.add_argument("--kv-cache-gib", type=float, default=0.0,
                    help="the same KV cache memory for every engine, in GiB (0: each sizes its own)")
    ap.add_argument("--max-model-len", type=int, default=0,
                    help="every engine's max_model_len (0: the workload's longest prompt plus its new tokens)")
    ap.add_argument("--verbose", action="store_true",
                    help="show each worker's own output besides its progress lines")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--prompt-tokens", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:  # one engine, one fresh process: print one JSON line
        result = (run_load(a.worker, a.model, a.repeats) if a.workload == "load"
                  else run_generate(a.worker, a.model, a.workload, a.repeats, a.prompt_tokens, a.budget_s,
                                    a.kv_cache_gib, a.max_model_len))
        if a.prompt_tokens:
            result["prompt_tokens"] = a.prompt_tokens
        print("RESULT " + json.dumps(result))
        return 0
    workload = WORKLOADS[a.workload]
    if a.ladder:
        if a.workload not in LADDERS:
            ap.error(f"--ladder: {a.workload} has no ladder (workloads with one: {', '.join(LADDERS)})")
        budget = LADDERS[a.workload].budget
        if a.kv_cache_gib and (a.kv_cache_gib, a.max_model_len) != (budget or (None, None))[:2]:
            ap.error(f"--ladder --kv-cache-gib: {a.workload}'s ladder at a budget is "
                     + (f"--kv-cache-gib {budget[0]:g} --max-model-len {budget[1]}" if budget else "none"))
        a.stages = ladder_stages(a.workload, at_budget=bool(a.kv_cache_gib))
        print(f"{a.workload} ladder: {a.stages}; left out: {LADDERS[a.workload].left_out}", file=sys.stderr)
    a.started = datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S")
    tags = a.stages.split(",")
    try:
        names = {t: engine_name(t) for t in tags}
    except UnknownEngine as e:
        ap.error(f"--stages: {e}")
    raw: dict[str, list[dict]] = {names[t]: [] for t in tags}
    skipped = {names[t]: why for t in tags if (why := skip_reason(t, a.workload))}
    for name, why in skipped.items():
        print(f"{name}: {why}")
    lengths = tuple(int(n) for n in a.lengths.split(",")) if a.workload == "long" else (None,)
    if a.workload == "long":   # the figures are those of the lengths asked for
        workload = replace(workload, headline=tuple(f"prefill_tok_per_s_at_{n}" for n in lengths),
                           columns=tuple(f"memory_beyond_weights_gb_at_{n}" for n in lengths))
    env = environment()
    running = [t for t in tags if names[t] not in skipped]
    shown = Progress(len(running) * a.processes * len(lengths) * a.repeats)
    for rep in range(a.processes):
        order = running if rep % 2 == 0 else running[::-1]   # alternate, so drift does not favour one engine
        for t in order:
            for n in lengths:
                raw[names[t]].append(run_worker(t, a.model, a.workload, a.repeats, n, a.verbose, a.budget_s,
                                                a.kv_cache_gib, a.max_model_len, shown))
                write_record(a, workload, env, raw, skipped, complete=False)   # a cut-off run keeps these
    summary, notes, path = write_record(a, workload, env, raw, skipped, complete=True)
    if path is None:                                   # nothing ran: no result file
        from common.device import has_gpu

        print("nothing ran here: " + ("every engine was skipped (the lines above say why)" if has_gpu()[0] else
                                      "every engine needs a GPU; on this machine: python -m common.bench --stages "
                                      "05,09 --workload cpu --model tiny"), file=sys.stderr)
        return 2
    print(f"{a.workload}: {workload.figure}; {a.model}; medians (min-max) of {a.repeats} runs x {a.processes} "
          f"process(es)")
    print(format_table(summary, workload))
    if env.get("copy_bandwidth_gb_per_s") and a.workload == "latency":
        weights = Checkpoint(resolve_model(a.model)).total_bytes
        print(f"bandwidth floor of a batch-1 decode step: {weights / 1e9:.2f} GB of weights / "
              f"{env['copy_bandwidth_gb_per_s']:.0f} GB/s = {weights / env['copy_bandwidth_gb_per_s'] / 1e6:.3f} ms")
    for name, s in summary.items():
        if "warmup_s" in s:
            print(f"{name}: warm-up {s['warmup_s']:.1f} s (what an engine compiles, captures or times on its "
                  "first requests; hf-compile: torch.compile), outside every figure")
        for k, why in s.items():
            if k.startswith("unsupported_at_"):
                print(f"{name}: {k[len('unsupported_at_'):]} tokens unsupported: {why}")
            if k.startswith("runs_cut_at_"):
                print(f"{name}: at {k[len('runs_cut_at_'):]} tokens, {why}")
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
    record = {"workload": asdict(workload), "model": a.model, "date": now.date().isoformat(), "ladder": a.ladder,
              "time": a.started, "kv_cache_gib": a.kv_cache_gib or None,
              "max_model_len": a.max_model_len or None,
              "environment": env, "repeats": a.repeats, "processes": a.processes, "complete": complete,
              "stages": summary, "spread_warnings": notes, "raw": raw}
    if all("skipped" in s for s in summary.values()):
        return summary, notes, None
    a.out.mkdir(parents=True, exist_ok=True)
    gpu = (env["gpu"] or "cpu").replace(" ", "-")
    # one file a comparison: GPU, date, workload, engines, and the UTC time it started (two runs of a day differ)
    kv = (f"-kv{a.kv_cache_gib:g}GiB" if a.kv_cache_gib else "") + (f"-len{a.max_model_len}" if a.max_model_len
                                                                   else "")
    engines = "ladder" if a.ladder else a.stages.replace(",", "-")
    path = (a.out / f"{gpu}_{record['date']}_{a.workload}{kv}-{engines}_"
            f"{a.started.replace(':', '')}.json")
    path.write_text(json.dumps(record, indent=2))
    return summary, notes, path


if __name__ == "__main__":
    sys.exit(main())
