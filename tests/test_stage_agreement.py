"""GPU tier, across stages: every generating stage gives the same greedy tokens as the one before it, on the same
prompts and checkpoints (tiny, small and the 1B shape, 32 new tokens each), up to a first divergence that must
sit at a near tie of the earlier stage's logits (common/testing.py: from stage04 on the GEMMs run at other
batch shapes, which round differently). Stages never import each other, so the comparison lives here: both
engines load in this process, one after the other."""
import importlib
from pathlib import Path

import numpy as np
import pytest

from common.sampling import SamplingParams
from common.testing import greedy_divergence

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]
GENERATING = sorted(p.name for p in ROOT.glob("stage[0-9][0-9]_*") if p.name >= "stage02")
PAIRS = list(zip(GENERATING, GENERATING[1:]))


def prompts():
    return [[128000] + np.random.default_rng(7).integers(0, 128000, 40).tolist(), "The quick brown fox"]


@pytest.mark.parametrize("model", ["tiny_dir", "small_dir", "llama-3.2-1b"])
@pytest.mark.parametrize("before, after", PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_greedy_tokens_equal_the_previous_stage(before, after, model, request):
    folder = str(request.getfixturevalue(model)) if model.endswith("_dir") else model
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    outs, logits = {}, []
    for stage in (before, after):
        engine = importlib.import_module(stage).Engine(folder, max_model_len=256)
        outs[stage] = engine.generate(prompts(), params)
        if stage == before:                          # the logits that chose each of the earlier stage's tokens
            logits = [engine.logits(o.prompt_token_ids + o.token_ids)[len(o.prompt_token_ids) - 1:-1]
                      for o in outs[stage]]
        del engine
    for a, b, want_logits in zip(outs[after], outs[before], logits):
        step = greedy_divergence(a.token_ids, b.token_ids, want_logits)
        print(f"{before} -> {after} on {model}: equal for {32 if step is None else step} of 32 tokens")
