"""GPU tier: prefix caching changes no token. Requests sharing a 150-token prefix, most of them finding it in the
cache, get the numpy reference's greedy tokens wherever greedy is decided (common/testing.py), on the tiny and
small presets; so do a prompt found whole and requests preempted out of a pool so small that their cached blocks
are evicted or found again."""
import numpy as np
import pytest

from common.checkpoint import Checkpoint
from common.reference import ReferenceEngine, ReferenceModel
from common.sampling import SamplingParams
from common.testing import agreement_line, check_greedy, rel_l2

pytestmark = pytest.mark.gpu


def shared_prefix(seed, n=6, prefix=150):
    rng = np.random.default_rng(seed)
    system = [128000] + rng.integers(0, 128000, prefix).tolist()
    prompts = [system + rng.integers(0, 128000, int(k)).tolist() for k in rng.integers(1, 40, n)]
    params = [SamplingParams(max_tokens=int(m), temperature=0.0, ignore_eos=True) for m in rng.integers(4, 24, n)]
    return prompts, params


def check_reference_tokens(engine, folder, got, want) -> None:
    """Each output's greedy tokens are the reference's wherever greedy is decided: logits along the reference's
    tokens within the design's bound, and any parting explained by them (common/testing.py)."""
    ref = ReferenceModel(Checkpoint(folder))
    for g, w in zip(got, want):
        full = w.prompt_token_ids + w.token_ids
        steps = slice(len(w.prompt_token_ids) - 1, len(full) - 1)
        ref_logits, our_logits = ref.forward(full)[steps], engine.logits(full)[steps]
        assert rel_l2(our_logits, ref_logits) < 2e-2
        step = check_greedy(g.token_ids, w.token_ids, our_logits, ref_logits)
        print(f"{folder.name}: {agreement_line(our_logits, ref_logits, step, len(w.token_ids))}")


@pytest.mark.parametrize("fixture", ["tiny_dir", "small_dir"])
def test_requests_that_find_their_prefix_cached_get_the_reference_s_tokens(fixture, request):
    from .. import Engine

    folder = request.getfixturevalue(fixture)
    prompts, params = shared_prefix(seed=1)
    # 64 rows a step: the first request's prefix is cached before the others are admitted
    engine = Engine(str(folder), max_model_len=320, max_num_seqs=4, max_num_batched_tokens=64)
    got = engine.generate(prompts, params)
    assert engine.prefix_cache_hit_rate() > 0.5
    check_reference_tokens(engine, folder, got, ReferenceEngine(str(folder), max_model_len=320).generate(prompts,
                                                                                                         params))


def test_a_prompt_found_whole_and_a_pool_that_preempts(tiny_dir):
    """The reference's tokens (by the greedy rule: the runs' batch shapes differ, and with them the kernels a
    step takes, fused or not, and their rounding) for a prompt found whole, whose last block runs again, and
    for requests preempted out of a pool of 16 blocks, which find their blocks again or compute them anew."""
    from .. import Engine

    prompts, params = shared_prefix(seed=2, n=12)
    want = ReferenceEngine(str(tiny_dir), max_model_len=320).generate(prompts, params)
    roomy = Engine(str(tiny_dir), max_model_len=320, max_num_seqs=4, max_num_batched_tokens=64)
    roomy.generate(prompts, params)
    hits = roomy.llm.blocks.hit_tokens
    again = roomy.generate(prompts[:1], params[:1])             # every block of it cached: its last runs again
    assert roomy.llm.blocks.hit_tokens - hits >= len(prompts[0]) - 16
    check_reference_tokens(roomy, tiny_dir, again, want[:1])
    tight = Engine(str(tiny_dir), max_model_len=320, max_num_seqs=4, max_num_batched_tokens=64, num_gpu_blocks=16)
    check_reference_tokens(tight, tiny_dir, tight.generate(prompts, params), want)
    assert tight.stats.preemptions > 0 and tight.llm.blocks.hit_tokens > 0
