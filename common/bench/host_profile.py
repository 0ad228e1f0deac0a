"""Where the host's time goes in a decode step: cProfile over the engine's own step() with B sequences decoding.

    python -m common.bench.host_profile --stage 09 --batch 256             # the GPU engine, 1B preset
    python -m common.bench.host_profile --stage 09 --batch 256 --text      # streamed as text, not token ids
    python -m common.bench.host_profile --stage 09 --free-runner           # the loop alone (any machine)

B requests of 100 prompt tokens (greedy, ignore_eos) are prefilled, the loop warms up, then --steps decode steps
run under cProfile and again without it. Printed: the step's wall time; the runner's share (its launch() or
run(), timed apart: on the GPU engine that is packing the graph's inputs, the copy, block-table updates and the
replay's launch, and with a synchronous loop also the wait); the loop's own host time (schedule, pack, advance,
record, outputs); and the functions that take the most time of their own. With --free-runner the runner costs
nothing (random ids, no model), so what remains is the loop's Python alone, the part the persistent batch
(vLLM's InputBatch) is for; without a GPU the stage's CPU engine is used with such a runner. Ids-only outputs
are what the server asks for (it detokenises elsewhere); --text streams text as generate() callers do.
The profile's full listing goes to --out when given.
"""
from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import pstats
import sys
import time
from pathlib import Path

import numpy as np

from common.sampling import SamplingParams

PROMPT_TOKENS = 100


class FreeRunner:
    """A runner that costs nothing: every logit row samples a random id, at once (no model, no GPU)."""

    def __init__(self):
        self.rng = np.random.default_rng(0)

    def admit(self, seq) -> None:
        pass

    def run(self, x) -> np.ndarray:                  # a synchronous loop's runner
        return self.rng.integers(1000, 2000, len(x.logit_rows)).astype(np.int32)

    def launch(self, x):                             # an asynchronous loop's: a handle whose result() is ready
        return _Ready(self.run(x))


class _Ready:
    def __init__(self, ids):
        self.ids = ids

    def result(self):
        return self.ids


class TimedRunner:
    """The engine's runner, its launch() or run() timed: the host time it takes (and for run(), the wait)."""

    def __init__(self, runner):
        self.runner, self.seconds, self.calls = runner, 0.0, 0

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def _timed(self, fn, x):
        t = time.perf_counter()
        try:
            return fn(x)
        finally:
            self.seconds += time.perf_counter() - t
            self.calls += 1

    def run(self, x):
        return self._timed(self.runner.run, x)

    def launch(self, x):
        return self._timed(self.runner.launch, x)


def build(stage: str, batch: int, free_runner: bool, model: str):
    """The stage's engine for `batch` sequences: the GPU engine, or where there is none (or --free-runner with
    no GPU) its CPU engine; with free_runner its runner replaced by one that costs nothing."""
    from common.device import has_gpu

    gpu, why = has_gpu()
    if not gpu and not free_runner:
        print(f"no GPU ({why}): the stage's CPU engine on tiny, with a runner that costs nothing (the loop alone)",
              file=sys.stderr)
    module = importlib.import_module(f"{stage}.engine" if gpu else f"{stage}.cpu_engine")
    cls = module.Engine if gpu else module.CpuEngine
    kwargs = {"max_model_len": 2048, "max_num_seqs": batch}
    engine = cls(model if gpu else "tiny", **kwargs)
    if free_runner or not gpu:
        engine.llm.runner = FreeRunner()
    engine.llm.runner = TimedRunner(engine.llm.runner)
    return engine


def profile(engine, batch: int, steps: int, text: bool) -> dict:
    params = SamplingParams(max_tokens=10**5, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        engine.add_request([128000] + [1000 + (i + k) % 5000 for k in range(PROMPT_TOKENS - 1)], params,
                           detokenize=text)
    while engine.num_requests()[1] or any(s.prefilling for s in engine.llm.scheduler.running):
        engine.step()
    for _ in range(5):
        engine.step()
    runner, stats = engine.llm.runner, engine.llm.scheduler.stats
    walls = []
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        engine.step()
    profiler.disable()
    runner.seconds, runner.calls, n_host = 0.0, 0, len(stats.host_s)
    for _ in range(steps):
        t = time.perf_counter()
        engine.step()
        walls.append(time.perf_counter() - t)
    return {"wall_ms": 1e3 * float(np.median(walls)), "runner_ms": 1e3 * runner.seconds / max(runner.calls, 1),
            "loop_host_ms": 1e3 * float(np.median(stats.host_s[n_host:])), "profiler": profiler}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m common.bench.host_profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", required=True, help="a stage number from 05 on (the step API)")
    ap.add_argument("--batch", type=int, default=256, help="sequences decoding at once (default 256)")
    ap.add_argument("--steps", type=int, default=50, help="decode steps profiled, then timed (default 50)")
    ap.add_argument("--text", action="store_true", help="stream text (default: token ids, as the server asks)")
    ap.add_argument("--free-runner", action="store_true", help="a runner that costs nothing: the loop alone")
    ap.add_argument("--model", default="llama-3.2-1b", help="the GPU engine's model (default: the 1B preset)")
    ap.add_argument("--out", type=Path, help="write the profile's full listing here")
    a = ap.parse_args(argv)
    root = Path(__file__).resolve().parents[2]
    found = sorted(p.name for p in root.glob(f"stage{a.stage.zfill(2)}_*") if (p / "llm_engine.py").exists()) \
        if a.stage.isdigit() else []
    if not found:
        ap.error(f"--stage {a.stage}: no stage with the step API by that number (05 on)")
    if a.batch < 1 or a.steps < 1:
        ap.error(f"--batch {a.batch} and --steps {a.steps} must be at least 1")
    engine = build(found[0], a.batch, a.free_runner, a.model)
    r = profile(engine, a.batch, a.steps, a.text)
    listing = io.StringIO()
    pstats.Stats(r["profiler"], stream=listing).sort_stats("tottime").print_stats(40 if a.out else 15)
    runner = type(engine.llm.runner.runner).__name__
    summary = (f"{found[0]}, {a.batch} sequences decoding, {'text' if a.text else 'token ids'}, runner {runner}: "
               f"medians of {a.steps} steps without the profiler\n"
               f"  step wall {r['wall_ms']:.2f} ms; the runner's launch/run {r['runner_ms']:.2f} ms a step; the "
               f"loop's host time (host_s) {r['loop_host_ms']:.2f} ms a step\n")
    print(summary + listing.getvalue())
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(summary + listing.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
