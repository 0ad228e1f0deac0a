"""GPU tier: the continuous-batching loop over the model: packed rows of prompt chunks and decode rows, sampled
by seq_slot. Every request's greedy tokens equal the numpy reference engine's run of it alone, wherever greedy is
decided (common/testing.py), with prompts longer than the token budget prefilled in chunks; requests added
between steps or sampled with their own seeds get the tokens they get alone; requests left running beside an
abort, and on a block pool so small that requests are preempted and recomputed many times, get the reference's
greedy tokens wherever greedy is decided (a step's rows may take the fused kernels at one batch size and the
separate ones at another: the tokens agree only where the logits' rounding cannot turn them), and seeded ones
exactly the tokens of a run with memory to spare."""
from types import SimpleNamespace

import numpy as np
import pytest

from common.checkpoint import Checkpoint
from common.reference import ReferenceEngine, ReferenceModel
from common.sampling import SamplingParams
from common.testing import check_reference_greedy

pytestmark = pytest.mark.gpu


def workload(seed, n=7):
    rng = np.random.default_rng(seed)
    prompts = [[128000] + rng.integers(0, 128000, int(k)).tolist() for k in rng.integers(0, 70, n)]
    params = [SamplingParams(max_tokens=int(m), temperature=0.0, ignore_eos=True) for m in rng.integers(1, 20, n)]
    return prompts, params


@pytest.fixture(scope="module")
def small_budget():
    """An engine per checkpoint with 4 seq_slots and 32 rows a step: prompts of up to 70 tokens go in chunks."""
    from .. import Engine

    made = {}

    def get(folder):                                         # None: drop the engine, free its memory
        if folder is None or str(folder) not in made:
            made.clear()
        if folder is None:
            return None
        if str(folder) not in made:
            made[str(folder)] = Engine(str(folder), max_model_len=128, max_num_seqs=4, max_num_batched_tokens=32)
        return made[str(folder)]

    return get


@pytest.mark.parametrize("fixture", ["tiny_dir", "small_dir"])
def test_each_request_equals_the_reference_alone(fixture, request, small_budget):
    folder = request.getfixturevalue(fixture)
    engine = small_budget(folder)
    prompts, params = workload(3)
    got = engine.generate(prompts, params)
    assert max(engine.stats.rows) <= 32 and any(len(p) > 32 for p in prompts)   # some prompt went in chunks
    want = ReferenceEngine(str(folder), max_model_len=128).generate(prompts, params)
    ref = ReferenceModel(Checkpoint(folder))
    check_reference_greedy(engine, ref, got, want, fixture)
    assert not engine.has_unfinished_requests() and sorted(engine.llm.scheduler._free) == [0, 1, 2, 3]


def test_requests_added_between_steps_get_the_tokens_of_all_at_once(tiny_dir, small_budget):
    """One request added per step, against the same requests submitted together: the same tokens (on the GPU
    the rows of a step are packed differently, so this holds where greedy is decided; the tiny checkpoint's
    margins are wide enough that every token is checked)."""
    engine = small_budget(tiny_dir)
    prompts, params = workload(4)
    together = [o.token_ids for o in engine.generate(prompts, params)]
    ids, got, k = [], {}, 0
    while k < len(prompts) or engine.has_unfinished_requests():
        if k < len(prompts):
            ids.append(engine.add_request(prompts[k], params[k]))
            k += 1
        for out in engine.step():
            if out.finished:
                got[out.request_id] = out.token_ids
    assert [got[i] for i in ids] == together


def test_seeded_requests_sample_the_same_tokens_whatever_runs_beside_them(tiny_dir, small_budget):
    engine = small_budget(tiny_dir)
    seeded = [SamplingParams(max_tokens=15, temperature=2.0, top_p=0.9, seed=s, ignore_eos=True) for s in (1, 2)]
    alone = [engine.generate("Once upon a time", p)[0].token_ids for p in seeded]
    prompts, params = workload(5, n=5)
    outs = engine.generate(prompts[:2] + ["Once upon a time"] + prompts[2:] + ["Once upon a time"],
                           params[:2] + [seeded[0]] + params[2:] + [seeded[1]])
    assert [outs[2].token_ids, outs[-1].token_ids] == alone and alone[0] != alone[1]


def test_abort_mid_decode_frees_the_seq_slot_and_leaves_the_others_unchanged(tiny_dir, small_budget):
    engine = small_budget(tiny_dir)
    prompts, params = workload(6, n=5)
    want = ReferenceEngine(str(tiny_dir), max_model_len=128).generate(prompts, params)
    victim = engine.add_request([128000, 5, 6, 7], SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True))
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    for _ in range(4):
        engine.step()
    engine.abort_request(victim)
    engine.abort_request("nobody")                             # a no-op
    got = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id != victim
            if out.finished:
                got[out.request_id] = out.token_ids
    outs = [SimpleNamespace(token_ids=got[i]) for i in ids]
    check_reference_greedy(engine, ReferenceModel(Checkpoint(tiny_dir)), outs, want, "beside an abort")
    assert sorted(engine.llm.scheduler._free) == [0, 1, 2, 3]


def test_preemption_on_a_tiny_pool_changes_no_request_s_tokens(tiny_dir, small_budget):
    """24 requests (prompts up to 70 tokens, up to 40 new, half greedy and half seeded at temperature 1) through
    8 seq_slots and a pool of 10 blocks of 16 positions, barely the largest request alone: preempted many times,
    each greedy request gets the reference's tokens wherever greedy is decided, and each seeded one exactly the
    tokens of the same requests run with an ample pool."""
    from .. import Engine

    rng = np.random.default_rng(11)
    prompts = [[128000] + rng.integers(0, 128000, int(k)).tolist() for k in rng.integers(0, 70, 24)]
    params = [SamplingParams(max_tokens=int(m), temperature=float(i % 2), top_p=0.95, seed=i, ignore_eos=True)
              for i, m in enumerate(rng.integers(1, 41, 24))]
    ample = small_budget(tiny_dir)
    want = [o.token_ids for o in ample.generate(prompts, params)]
    assert ample.llm.scheduler.stats.preemptions == 0
    small_budget(None)                                        # its engine gone: one on the GPU at a time
    tight = Engine(str(tiny_dir), max_model_len=128, max_num_seqs=8, max_num_batched_tokens=64, num_gpu_blocks=10)
    outs = tight.generate(prompts, params)
    stats = tight.llm.scheduler.stats
    print(f"tiny pool: {stats.preemptions} preemptions over {stats.steps} steps, at most {stats.max_running} "
          "running at once")
    assert stats.preemptions >= 10
    greedy = [i for i, p in enumerate(params) if p.temperature == 0.0]
    reference = ReferenceEngine(str(tiny_dir), max_model_len=128).generate([prompts[i] for i in greedy],
                                                                            [params[i] for i in greedy])
    check_reference_greedy(tight, ReferenceModel(Checkpoint(tiny_dir)), [outs[i] for i in greedy], reference,
                           "preempted")
    assert all(outs[i].token_ids == want[i] for i in range(len(params)) if i not in greedy)
    assert tight.llm.blocks.num_free == 10 and not tight.has_unfinished_requests()
