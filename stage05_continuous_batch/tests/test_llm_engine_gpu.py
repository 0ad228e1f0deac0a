"""GPU tier: the continuous-batching loop over the model (runner.py): packed rows of prompt chunks and decode rows,
sampled by seq_slot. Every request's greedy tokens equal the numpy reference engine's run of it alone, wherever
greedy is decided (common/testing.py), with prompts longer than the token budget prefilled in chunks."""
import numpy as np
import pytest

from common.checkpoint import Checkpoint
from common.reference import ReferenceEngine, ReferenceModel
from common.sampling import SamplingParams
from common.testing import agreement_line, check_greedy, rel_l2

from ..llm_engine import LLMEngine
from ..runner import GpuRunner

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("fixture", ["tiny_dir", "small_dir"])
def test_each_request_equals_the_reference_alone(fixture, request):
    from .. import Engine

    folder = request.getfixturevalue(fixture)
    static = Engine(str(folder), max_model_len=128, max_batch_size=4)
    loop = LLMEngine(GpuRunner(static.model), static.prompts, max_num_seqs=4, max_num_batched_tokens=32)
    rng = np.random.default_rng(3)
    prompts = [[128000] + rng.integers(0, 128000, int(n)).tolist() for n in (5, 70, 12, 40, 1, 33, 9)]
    params = [SamplingParams(max_tokens=int(m), temperature=0.0, ignore_eos=True) for m in (20, 6, 1, 12, 9, 3, 15)]
    got = loop.generate(prompts, params)
    want = ReferenceEngine(str(folder), max_model_len=128).generate(prompts, params)
    ref = ReferenceModel(Checkpoint(folder))
    for g, w in zip(got, want):
        full = w.prompt_token_ids + w.token_ids
        steps = slice(len(w.prompt_token_ids) - 1, len(full) - 1)
        ref_logits, our_logits = ref.forward(full)[steps], static.logits(full)[steps]
        assert rel_l2(our_logits, ref_logits) < 2e-2
        step = check_greedy(g.token_ids, w.token_ids, our_logits, ref_logits)
        print(f"{fixture}: {agreement_line(our_logits, ref_logits, step, len(w.token_ids))}")
    assert not loop.has_unfinished_requests() and len(loop.scheduler._free) == 4
