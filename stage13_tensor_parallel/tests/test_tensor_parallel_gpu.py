"""Several GPUs (marker multigpu: skipped with the reason where there are fewer than two): the model split over 2
ranks against the same model on one GPU and the numpy reference. Logits within the design's bound at every
position (prefill in one forward and in chunks; tiny, small, untied, the 1B shape); greedy generation through
the loop (graphs, decode steps, the all-reduces captured) held to the reference by the greedy rule; the weights on
every rank its part of the file's; and a rank that dies mid-generation stops the engine with one line, no rank's
process left running."""
import os
import signal

import numpy as np
import pytest

from common.checkpoint import Checkpoint
from common.reference import ReferenceEngine, ReferenceModel
from common.sampling import SamplingParams
from common.testing import check_reference_greedy, mixed_greedy_requests, rel_l2, rel_l2_rows

from ..ranks import RankError

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]


def prompt_ids(n, seed=0, vocab=128000):
    return [128000] + np.random.default_rng(seed).integers(0, vocab, n - 1).tolist()


@pytest.fixture(scope="module")
def split():
    """An engine over 2 GPUs, one at a time (each holds both GPUs' memory), closed when the next is made."""
    from .. import Engine

    held = {}

    def get(folder, **kw):
        key = (str(folder), tuple(sorted(kw.items())))
        if key not in held:
            for engine in held.values():
                engine.close()
            held.clear()
            held[key] = Engine(str(folder), tensor_parallel_size=2, **{"max_model_len": 256, **kw})
        return held[key]

    yield get
    for engine in held.values():
        engine.close()


@pytest.mark.parametrize("fixture", ["tiny_dir", "small_dir", "tiny_untied_dir"])
def test_two_ranks_give_the_reference_s_logits_at_every_position(fixture, request, split):
    folder = request.getfixturevalue(fixture)
    ids = prompt_ids(77, seed=1)
    engine = split(folder)
    want = ReferenceModel(Checkpoint(folder)).forward(ids)
    for chunk in (None, 7):
        got = engine.logits(ids, chunk=chunk)
        print(f"{fixture}, chunks of {chunk or 'all'}: rel L2 {rel_l2(got, want):.2e}, worst row "
              f"{rel_l2_rows(got, want).max():.2e}")
        assert rel_l2(got, want) < 2e-2


def test_every_rank_holds_its_part_of_every_tensor(small_dir, split):
    assert split(small_dir).verify() == []


def test_greedy_generation_over_two_ranks_follows_the_reference(small_dir, split):
    """Twelve uneven greedy requests through the loop: decode steps replay graphs holding the all-reduces."""
    engine = split(small_dir, max_num_seqs=8)
    prompts, params = mixed_greedy_requests(12, seed=3)
    got = engine.generate(prompts, params)
    ref = ReferenceModel(Checkpoint(small_dir))
    want = ReferenceEngine(str(small_dir), max_model_len=256).generate(prompts, params)
    assert engine.graphs is not None and engine.stats.steps > 0
    check_reference_greedy(engine, ref, got, want, "TP=2")


@pytest.mark.slow
def test_the_1b_over_two_ranks_against_one_gpu(split):
    """The 1B shape's logits over 2 ranks against the same engine on one GPU and the float32 reference."""
    from .. import Engine
    from common.synthetic import resolve_model

    folder = resolve_model("llama-3.2-1b")
    ids = prompt_ids(200, seed=4)
    two = split(folder, max_model_len=512, kv_cache_memory_bytes=2**30).logits(ids)
    one = Engine(folder, max_model_len=512, kv_cache_memory_bytes=2**30, enforce_eager=True).logits(ids)
    ref = ReferenceModel(Checkpoint(folder)).forward(ids)
    print(f"1B: rel L2 against the reference: TP=2 {rel_l2(two, ref):.2e}, TP=1 {rel_l2(one, ref):.2e}; "
          f"TP=2 against TP=1 {rel_l2(two, one):.2e}")
    assert rel_l2(two, ref) < 2e-2 and rel_l2(two, one) < 3e-2


def test_a_rank_that_dies_stops_the_engine_with_one_line(tiny_dir, split):
    engine = split(tiny_dir, max_num_seqs=4)
    procs = engine.ranks.procs
    engine.generate([prompt_ids(20)], SamplingParams(max_tokens=4, temperature=0.0))   # it runs
    os.kill(procs[0].pid, signal.SIGKILL)
    with pytest.raises(RankError, match=r"^rank 1 exited \(code -9\)$"):
        engine.generate([prompt_ids(20, seed=2)] * 3, SamplingParams(max_tokens=200, temperature=0.0,
                                                                    ignore_eos=True))
    assert not any(p.is_alive() for p in procs)
