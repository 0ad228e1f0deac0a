"""GPU tier, across stages: every generating stage gives the same greedy tokens as the one before it, on the same
prompts and checkpoints (tiny, small and the 1B shape, 32 new tokens each), and logits within the design's
tolerance of each other along the earlier stage's tokens. Top-1 must be equal at every decided step; the runs may
part only at a step the measured logit error can flip, and there each stage's own logits must explain its choice
(common/testing.py). The logits are teacher-forced through the path that generated the tokens: decode steps
(`decode_logits`, stage03 on), not one prefill over the whole sequence, whose GEMMs round otherwise: where two
engines share every kernel their logits are equal, the flip bound is 0, and a near-tie the prefill path ranks
unlike the decode path would fail a run that is right. Stages never import each other,
so the comparison lives here: both engines load in this process, one after the other."""
import importlib
import inspect
from pathlib import Path

import numpy as np
import pytest

from common.sampling import SamplingParams
from common.testing import agreement_line, check_greedy, rel_l2

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]
GENERATING = sorted(p.name for p in ROOT.glob("stage[0-9][0-9]_*") if p.name >= "stage02")
PAIRS = list(zip(GENERATING, GENERATING[1:]))


def prompts():
    return [[128000] + np.random.default_rng(7).integers(0, 128000, 40).tolist(), "The quick brown fox"]


def along(engine, outs) -> list[np.ndarray]:
    """Each output's logits at the steps that chose its tokens, (len(token_ids), V), teacher-forced in decode steps
    batched as generate() ran them: stage03 decodes one sequence at a time, stage04 on all together; stage02 has no
    decode step: one forward pass."""
    seqs, n = [o.prompt_token_ids + o.token_ids[:-1] for o in outs], [len(o.prompt_token_ids) for o in outs]
    if not hasattr(engine, "decode_logits"):
        return [engine.logits(o.prompt_token_ids + o.token_ids)[k - 1:-1] for o, k in zip(outs, n)]
    if "sequences" in inspect.signature(engine.decode_logits).parameters:
        return engine.decode_logits(seqs, n)
    return [engine.decode_logits(s, k) for s, k in zip(seqs, n)]


@pytest.mark.parametrize("model", ["tiny_dir", "small_dir", "llama-3.2-1b"])
@pytest.mark.parametrize("before, after", PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_greedy_tokens_equal_the_previous_stage(before, after, model, request):
    folder = str(request.getfixturevalue(model)) if model.endswith("_dir") else model
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    outs, logits = {}, {}
    for stage in (before, after):
        engine = importlib.import_module(stage).Engine(folder, max_model_len=256)
        outs[stage] = engine.generate(prompts(), params)
        logits[stage] = along(engine, outs[before])      # both stages' logits along the earlier stage's tokens
        del engine
    for a, b, got_logits, want_logits in zip(outs[after], outs[before], logits[after], logits[before]):
        assert rel_l2(got_logits, want_logits) < 2e-2
        step = check_greedy(a.token_ids, b.token_ids, got_logits, want_logits)
        print(f"{before} -> {after} on {model}: {agreement_line(got_logits, want_logits, step, 32)}")
