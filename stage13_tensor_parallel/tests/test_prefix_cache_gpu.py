"""GPU tier: prefix caching changes no token. Requests sharing a 150-token prefix, most of them finding it in the
cache, get the numpy reference's greedy tokens wherever greedy is decided (common/testing.py), on the tiny and
small presets; so do a prompt found whole and requests preempted out of a pool so small that their cached blocks
are evicted or found again."""
import numpy as np
import pytest

from common.checkpoint import Checkpoint
from common.reference import ReferenceEngine, ReferenceModel
from common.sampling import SamplingParams
from common.testing import check_reference_greedy

pytestmark = pytest.mark.gpu


def shared_prefix(seed, n=6, prefix=150):
    rng = np.random.default_rng(seed)
    system = [128000] + rng.integers(0, 128000, prefix).tolist()
    prompts = [system + rng.integers(0, 128000, int(k)).tolist() for k in rng.integers(1, 40, n)]
    params = [SamplingParams(max_tokens=int(m), temperature=0.0, ignore_eos=True) for m in rng.integers(4, 24, n)]
    return prompts, params


@pytest.mark.parametrize("fixture", ["tiny_dir", "small_dir"])
def test_requests_that_find_their_prefix_cached_get_the_reference_s_tokens(fixture, request):
    from .. import Engine

    folder = request.getfixturevalue(fixture)
    prompts, params = shared_prefix(seed=1)
    # 64 rows a step: the first request's prefix is cached before the others are admitted
    engine = Engine(str(folder), max_model_len=320, max_num_seqs=4, max_num_batched_tokens=64)
    got = engine.generate(prompts, params)
    assert engine.prefix_cache_hit_rate() > 0.5
    want = ReferenceEngine(str(folder), max_model_len=320).generate(prompts, params)
    check_reference_greedy(engine, ReferenceModel(Checkpoint(folder)), got, want, fixture)


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
    ref = ReferenceModel(Checkpoint(tiny_dir))
    check_reference_greedy(roomy, ref, again, want[:1], "a prompt found whole")
    tight = Engine(str(tiny_dir), max_model_len=320, max_num_seqs=4, max_num_batched_tokens=64, num_gpu_blocks=16)
    check_reference_greedy(tight, ref, tight.generate(prompts, params), want, "a pool that preempts")
    assert tight.stats.preemptions > 0 and tight.llm.blocks.hit_tokens > 0
