"""CPU: common/numpy_runner.py, the runner of every stage's engine without a GPU, against the plain reference.

Packed rows of two sequences, prefilled in chunks and decoded a row at a time, give the logits the reference
computes over each whole sequence, with a contiguous cache and with a paged one whose block table is shuffled;
a poisoned cache slot changes them (the keys are read back from the cache, not recomputed); placeholders read
the step before's ids."""
from types import SimpleNamespace

import numpy as np
import pytest

from common.checkpoint import Checkpoint
from common.numpy_runner import NumpyRunner
from common.reference import ReferenceModel
from common.sampling import SamplingParams

L, BS = 64, 4


def step(rows, tables=None, bs=BS, **extra):
    """StepInputs of rows [(seq_slot, position, token)], every row a logit row; slots through `tables` (paged)
    or seq_slot * L + position (contiguous)."""
    slot, pos, tok = (np.array(c, np.int64) for c in zip(*rows))
    where = slot * L + pos if tables is None else tables[slot, pos // bs] * bs + pos % bs
    return SimpleNamespace(tokens=tok, positions=pos, slot_mapping=where, seq_slots=slot,
                           logit_rows=np.arange(len(rows)), logit_seq_slots=slot,
                           counters=np.zeros(len(rows), np.int64), **extra)


def schedule(seqs, chunk):
    """Steps over sequences {seq_slot: tokens}: prompts of 20 in chunks of `chunk`, then one row each a step."""
    steps, done = [], {s: 0 for s in seqs}
    while any(done[s] < len(t) for s, t in seqs.items()):
        rows = []
        for s, t in seqs.items():
            n = chunk if done[s] < 20 else 1
            rows += [(s, p, t[p]) for p in range(done[s], min(done[s] + n, len(t)))]
            done[s] = min(done[s] + n, len(t))
        steps.append(rows)
    return steps


@pytest.fixture(scope="module", params=["tiny", "small"])
def model(request, tiny_dir, small_dir):      # head_dim 16 and 32, GQA 2 and 4
    return ReferenceModel(Checkpoint(tiny_dir if request.param == "tiny" else small_dir))


def forward(runner, x):
    return runner.forward(x.tokens, x.positions, x.slot_mapping, x.seq_slots, x.logit_rows)


def admit(runner, *seq_slots):
    for s in seq_slots:
        runner.admit(SimpleNamespace(seq_slot=s, params=SamplingParams(temperature=0.0), seed=s))


@pytest.mark.parametrize("paged", [False, True])
def test_packed_chunked_rows_give_the_reference_logits(model, paged):
    rng = np.random.default_rng(0)
    seqs = {1: rng.integers(0, 128000, 27).tolist(), 3: rng.integers(0, 128000, 23).tolist()}
    tables = None
    if paged:                                  # each seq_slot's blocks scattered over the pool
        tables = rng.permutation(4 * (L // BS)).reshape(4, L // BS)
        runner = NumpyRunner(model, 4, L, num_slots=tables.size * BS, block_size=BS)
    else:
        runner = NumpyRunner(model, 4, L, num_slots=4 * L)
    admit(runner, *seqs)
    got = {s: [] for s in seqs}
    for n, rows in enumerate(schedule(seqs, chunk=7)):
        x = step(rows, tables)
        if paged and n == 0:                   # the tables reach the runner as the engine sends them
            x.table_updates = np.stack([np.arange(tables.size), tables.reshape(-1)], 1)
        ids = runner.run(x)
        logits = forward(runner, x)            # the same rows again: they rewrite the same slots
        assert (ids == logits.argmax(1)).all()  # greedy
        for (s, _, _), row in zip(rows, logits):
            got[s].append(row)
    for s, t in seqs.items():
        want = model.forward(t)
        err = np.linalg.norm(np.stack(got[s]) - want) / np.linalg.norm(want)
        assert err < 1e-5, f"seq_slot {s}: relative error {err:.2e}"


def test_keys_are_read_from_the_cache(model):
    t = np.random.default_rng(1).integers(0, 128000, 21).tolist()
    runner = NumpyRunner(model, 1, L, num_slots=L)
    forward(runner, step([(0, p, t[p]) for p in range(20)]))
    last = step([(0, 20, t[20])])
    clean = forward(runner, last)
    runner.v_cache[:, 5] = 1e3                 # position 5's values, poisoned after they were written
    assert np.abs(forward(runner, last) - clean).max() > 1e-2


def test_placeholders_read_the_step_before_s_ids(model):
    runner = NumpyRunner(model, 2, L, num_slots=2 * L)
    admit(runner, 0, 1)
    first = runner.run(step([(0, 0, 7), (1, 0, 9)]))
    placeholders = runner.run(step([(0, 1, -2), (1, 1, -1)], prev_rows=np.array([1, 0])))   # ids 1 and 0
    runner = NumpyRunner(model, 2, L, num_slots=2 * L)
    admit(runner, 0, 1)
    runner.run(step([(0, 0, 7), (1, 0, 9)]))
    assert (placeholders == runner.run(step([(0, 1, int(first[1])), (1, 1, int(first[0]))]))).all()
