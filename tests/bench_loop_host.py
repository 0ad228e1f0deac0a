"""The continuous-batching loop's own host work for one decode step, on the CPU (pytest-benchmark): schedule(),
pack() and update() for 64 and 256 running sequences that each decode one row, for every stage with a scheduler,
in one run. No GPU and no model: this is the Python the GPU waits for between two forwards (each stage's bench_batch.py
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
PROMPT, MAX_MODEL_LEN, BLOCK_SIZE = 100, 4096, 16


def decoding(stage: str, rows: int):
    """The stage's scheduler with `rows` sequences past their prompts, and its pack() with the stage's arguments
    (with a persistent batch, the batch's prepare())."""
    scheduler, sequence = (importlib.import_module(f"{stage}.{m}") for m in ("scheduler", "sequence"))
    pack = importlib.import_module(f"{stage}.packing").pack
    paged = (ROOT / stage / "block_manager.py").exists()
    blocks = ({"blocks": importlib.import_module(f"{stage}.block_manager").BlockManager(
        rows * MAX_MODEL_LEN // BLOCK_SIZE, BLOCK_SIZE)} if paged else {})
    if "max_model_len" in inspect.signature(scheduler.Scheduler).parameters:
        blocks["max_model_len"] = MAX_MODEL_LEN
    sched = scheduler.Scheduler(rows, rows * PROMPT, **blocks)          # every prompt in the first step
    params = SamplingParams(max_tokens=10**6, temperature=0.0, ignore_eos=True)
    for i in range(rows):
        sched.add(sequence.Sequence(i, list(range(1, PROMPT + 1)), params, frozenset(), 0, Timing(PROMPT)))
    if hasattr(sched, "batch"):         # a persistent batch: the step's inputs gathered from its arrays
        return sched, sched.batch.prepare
    extra = (BLOCK_SIZE,) if "block_size" in inspect.signature(pack).parameters else ()
    return sched, (lambda plan: pack(plan, MAX_MODEL_LEN, *extra))


@pytest.mark.parametrize("rows", [64, 256])
@pytest.mark.parametrize("stage", LOOPS)
def test_loop_host_work_of_a_decode_step(benchmark, stage, rows):
    sched, pack = decoding(stage, rows)
    never = (lambda s: None,) if "finish_reason" in inspect.signature(sched.update).parameters else ()

    def step():                                  # a stage with a persistent batch checks stops over it, no callable
        plan = sched.schedule()
        x = pack(plan)
        sched.update(plan, np.ones(len(x.logit_rows), np.int32), *never)
        return x

    x = step()                                   # the prompts, in one step of rows * PROMPT rows
    assert x.num_rows == rows * PROMPT
    x = benchmark.pedantic(step, rounds=50, warmup_rounds=5)
    assert x.num_rows == rows                    # one decode row per sequence
    benchmark.extra_info.update(stage=stage, rows=rows)
