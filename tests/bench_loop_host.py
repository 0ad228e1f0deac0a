"""The continuous-batching loop's own host work for one decode step, on the CPU (pytest-benchmark): schedule(),
pack() and update() for 256 running sequences that each decode one row, for every stage with a scheduler, in one
run. No GPU and no model: this is the Python the GPU waits for between two forwards (each stage's bench_batch.py
measures the whole step split on the H200).

    pytest tests/bench_loop_host.py --benchmark-only

Stages never import each other, so the comparison lives here, as tests/test_stage_agreement.py's does. A paged
stage (one with block_manager.py) gets a pool of blocks that never runs dry, so no preemption is timed.
"""
import importlib
import inspect
from pathlib import Path

import numpy as np
import pytest

from common.outputs import Timing
from common.sampling import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
LOOPS = sorted(p.name for p in ROOT.glob("stage[0-9][0-9]_*") if (p / "scheduler.py").exists())
ROWS, PROMPT, MAX_MODEL_LEN, BLOCK_SIZE = 256, 100, 4096, 16


def decoding(stage: str):
    """The stage's scheduler with ROWS sequences past their prompts, and its pack() with the stage's arguments."""
    scheduler, sequence = (importlib.import_module(f"{stage}.{m}") for m in ("scheduler", "sequence"))
    pack = importlib.import_module(f"{stage}.packing").pack
    paged = (ROOT / stage / "block_manager.py").exists()
    blocks = ({"blocks": importlib.import_module(f"{stage}.block_manager").BlockManager(
        ROWS * MAX_MODEL_LEN // BLOCK_SIZE, BLOCK_SIZE)} if paged else {})
    sched = scheduler.Scheduler(ROWS, ROWS * PROMPT, **blocks)          # every prompt in the first step
    params = SamplingParams(max_tokens=10**6, temperature=0.0, ignore_eos=True)
    for i in range(ROWS):
        sched.add(sequence.Sequence(i, list(range(1, PROMPT + 1)), params, frozenset(), 0, Timing(PROMPT)))
    extra = (BLOCK_SIZE,) if "block_size" in inspect.signature(pack).parameters else ()
    return sched, (lambda plan: pack(plan, MAX_MODEL_LEN, *extra))


@pytest.mark.parametrize("stage", LOOPS)
def test_loop_host_work_of_a_decode_step(benchmark, stage):
    sched, pack = decoding(stage)

    def step():
        plan = sched.schedule()
        x = pack(plan)
        sched.update(plan, np.ones(len(plan.sampling), np.int32), lambda s: None)
        return x

    x = step()                                   # the prompts, in one step of 25,600 rows
    assert x.num_rows == ROWS * PROMPT
    x = benchmark.pedantic(step, rounds=50, warmup_rounds=5)
    assert x.num_rows == ROWS                    # one decode row per sequence
    benchmark.extra_info.update(stage=stage, rows=ROWS)
