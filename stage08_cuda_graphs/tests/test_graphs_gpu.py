"""GPU tier, the decode graphs (graphs.py): for every captured batch size, a replay gives bit for bit the logits
and tokens of the same work launched eagerly on the same inputs, full or padded; padding rows change no real
row and write nothing to the cache; a replay follows each step's split of the keys; and an engine with graphs
gives every request the tokens of one without (enforce_eager) through joins, finishes, aborts and preemption."""
from dataclasses import replace

import numpy as np
import pytest

from common.sampling import SamplingParams
from common.testing import cases, rel_l2

from ..graphs import decode_layout, pack_decode
from ..packing import pack

pytestmark = pytest.mark.gpu
MAX_NUM_SEQS = 64


@pytest.fixture(scope="module")
def engine(tiny_dir):
    from .. import Engine

    return Engine(str(tiny_dir), max_model_len=512, max_num_seqs=MAX_NUM_SEQS, num_gpu_blocks=1024)


def planned_decode_step(engine, R, seed, lengths=(1, 60)):
    """R requests (half greedy, half sampled at temperature 0.8) prefilled and decoding: the next step planned
    and packed, not run. The caller aborts them (abort_all)."""
    rng = np.random.default_rng(seed)
    for i in range(R):
        prompt = [128000] + rng.integers(0, 128000, int(rng.integers(*lengths))).tolist()
        engine.add_request(prompt, SamplingParams(max_tokens=400, temperature=0.8 * (i % 2), seed=i,
                                                  ignore_eos=True))
    sched = engine.llm.scheduler
    while sched.waiting or any(s.prefilling for s in sched.running):
        engine.step()
    return pack(sched.schedule(), engine.max_model_len, engine.block_size)


def abort_all(engine):
    for s in list(engine.llm.scheduler.running) + list(engine.llm.scheduler.waiting):
        engine.abort_request(s.request_id)


def read_back(engine, size):
    m = engine.model
    return m.gpu.to_host(m.row_view(m.logits, 0, size)), m.gpu.to_host(m.next_ids.view(0, (size,)))


@pytest.mark.parametrize("full", [True, False])
@cases("size", [1, 2, 4, 8, 16, 32, 64])
def test_a_replay_is_the_eager_step_bit_for_bit(engine, size, full):
    assert size in engine.graphs.sizes
    R = size if full else size // 2 + 1
    if not full and R == size:
        pytest.skip("a graph of one row has no padded use")
    x = planned_decode_step(engine, R, seed=size)
    try:
        assert x.num_rows == R
        assert engine.graphs.launch(x, replay=False) == size
        eager_logits, eager_ids = read_back(engine, size)
        assert engine.graphs.launch(x, replay=True) == size
        logits, ids = read_back(engine, size)
        assert np.array_equal(logits, eager_logits) and np.array_equal(ids, eager_ids)
        assert np.isfinite(logits[:R]).all()
        greedy = np.arange(R) % 2 == 0                          # even requests are greedy
        assert (ids[:R][greedy] == logits[:R][greedy].argmax(-1)).all()
        # the same rows unpadded, launched kernel by kernel as stage07 does: within bf16 tolerance (other M)
        engine.model.forward(x)
        unpadded, _ = read_back(engine, R)
        assert rel_l2(logits[:R], unpadded) < 1e-2
    finally:
        abort_all(engine)


def test_padding_rows_change_no_real_row_and_write_nothing(engine):
    """3 real rows in the graph of 4, replayed once with the usual padding and once with a padding row of random
    token, position, seq_slot and counter: the real rows' logits and tokens are bit for bit the same, and the
    whole KV cache is unchanged by the second replay (the real rows rewrite what they wrote)."""
    x = planned_decode_step(engine, 3, seed=5)
    g, m = engine.graphs, engine.model
    try:
        g.launch(x)
        want_logits, want_ids = read_back(engine, 4)
        cache_before = m.gpu.to_host(m.cache.buffer)
        host = pack_decode(x, 4, g.keys_per_split(4, int(x.positions.max()) + 1))
        lay, rng = decode_layout(4), np.random.default_rng(0)
        pos = int(rng.integers(0, engine.max_model_len))
        for name, value in (("tokens", rng.integers(0, 128000)), ("positions", pos), ("logit_seq_slots", 7),
                            ("counters", 12345)):
            host[lay[name][0] + 3] = value
        host[lay["tiles"][0] + 12:lay["tiles"][0] + 16] = [3, 1, 7, pos]   # row 3 attends seq_slot 7's table
        m.copy_in(m.inputs, host)
        g.graphs[4].launch()
        logits, ids = read_back(engine, 4)
        assert np.array_equal(logits[:3], want_logits[:3]) and np.array_equal(ids[:3], want_ids[:3])
        assert not np.array_equal(logits[3], want_logits[3])     # the padding row did change
        assert np.array_equal(m.gpu.to_host(m.cache.buffer), cache_before)
    finally:
        abort_all(engine)


def test_a_replay_follows_the_step_s_split_of_the_keys(engine):
    """One row over 40 keys, then over 450: the graph of size 1 splits its keys as each step asks (its grid has
    the splits of max_model_len keys; past a row's keys they return), and both replays equal the eager step."""
    g = engine.graphs
    assert g.n_splits[1] > 1
    for lengths in ((39, 40), (449, 450)):
        x = planned_decode_step(engine, 1, seed=lengths[0], lengths=lengths)
        try:
            per_split = g.keys_per_split(1, int(x.positions.max()) + 1)
            assert -(-int(x.positions.max() + 1) // per_split) <= g.n_splits[1]
            g.launch(x, replay=False)
            want = read_back(engine, 1)
            g.launch(x)
            got = read_back(engine, 1)
            assert all(np.array_equal(a, b) for a, b in zip(got, want))
            engine.model.forward(x)
            assert rel_l2(got[0], read_back(engine, 1)[0]) < 1e-2
        finally:
            abort_all(engine)
    assert g.keys_per_split(1, 450) < 450                       # the long row was split


def test_graphs_and_enforce_eager_give_the_same_tokens_through_joins_aborts_and_preemption(tiny_dir, engine):
    """40 requests arriving three a step into 8 seq_slots and a pool of 24 blocks (preemption), two aborted
    mid-way: with graphs and with enforce_eager, every other request gets the same tokens (greedy and seeded), and
    with graphs most steps replayed a graph."""
    from .. import Engine

    rng = np.random.default_rng(3)
    prompts = [[128000] + rng.integers(0, 128000, int(k)).tolist() for k in rng.integers(0, 90, 40)]
    params = [SamplingParams(max_tokens=int(k), temperature=float(i % 2), seed=i, ignore_eos=True)
              for i, k in enumerate(rng.integers(1, 60, 40))]
    params[1], params[4] = (replace(params[i], max_tokens=59) for i in (1, 4))   # unfinished at step 6
    results = {}
    for eager in (False, True):
        e = Engine(str(tiny_dir), max_model_len=256, max_num_seqs=8, max_num_batched_tokens=64, num_gpu_blocks=24,
                   enforce_eager=eager)
        assert (e.graphs is None) == eager
        replays = []
        if not eager:                                        # count the steps that replayed a graph
            launch = e.graphs.launch
            e.graphs.launch = lambda step, replay=True: replays.append(launch(step, replay)) or replays[-1]
        got, k, steps = {}, 0, 0
        while k < len(prompts) or e.has_unfinished_requests():
            for _ in range(min(3, len(prompts) - k)):
                e.add_request(prompts[k], params[k], request_id=k)
                k += 1
            if steps == 6:
                e.abort_request(1)
                e.abort_request(4)
            for out in e.step():
                if out.finished:
                    got[out.request_id] = list(out.token_ids)
            steps += 1
        results[eager] = (got, e.llm.scheduler.stats.preemptions, sum(r is not None for r in replays), steps)
        del e
    (graphs, preempted, replayed, steps), (eager, _, _, _) = results[False], results[True]
    print(f"with graphs: {preempted} preemptions, {replayed} of {steps} steps replayed a graph")
    assert preempted > 0 and replayed > steps // 3
    assert 1 not in graphs and 4 not in graphs and len(graphs) == 38
    assert graphs == eager


def test_a_one_token_prompt_replays_a_graph_with_its_own_sampling_parameters(engine, monkeypatch):
    """A request whose prompt is one token decodes from its first step, so the step that admits it replays a
    graph: the parameters set at admission are on the GPU before it, and it samples the tokens the same request
    gets when every step runs eagerly."""
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=5, ignore_eos=True)
    sizes, launch = [], engine.graphs.launch
    monkeypatch.setattr(engine.graphs, "launch",
                        lambda step, replay=True: sizes.append(launch(step, replay)) or sizes[-1])
    replayed = engine.generate([[128000]], params)[0].token_ids
    assert sizes[0] == 1                                          # the admitting step was a replay
    monkeypatch.setattr(engine.graphs, "launch", lambda step, replay=True: None)   # every step eager
    assert engine.generate([[128000]], params)[0].token_ids == replayed
