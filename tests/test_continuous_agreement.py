"""GPU tier: continuous batching (stage05) gives every request the greedy tokens that stage04 gives it alone, on
up to 64 requests of mixed prompt lengths and max_tokens, arriving a few per step, with prompts longer than the
token budget prefilled in chunks; and logits within the design's tolerance of stage04's along the same tokens.
The rows of a step are packed differently, so the GEMMs sum in another order: top-1 must be equal at every
decided step, and the runs may part only where the measured logit error can flip the choice and each engine's
own logits explain it (common/testing.py)."""
import importlib

import pytest

from common.testing import agreement_line, check_greedy, mixed_greedy_requests, rel_l2

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("model, n", [("tiny_dir", 64), ("small_dir", 40), ("llama-3.2-1b", 32)])
def test_every_request_equals_stage04_alone(model, n, request):
    folder = str(request.getfixturevalue(model)) if model.endswith("_dir") else model
    prompts, params = mixed_greedy_requests(n, seed=n)
    alone = importlib.import_module("stage04_static_batch").Engine(folder, max_model_len=512, max_batch_size=1)
    want = alone.generate(prompts, params)                      # batches of one: each request alone
    want_logits = [alone.decode_logits([w.prompt_token_ids + w.token_ids[:-1]], [len(w.prompt_token_ids)])[0]
                   for w in want]
    del alone
    loop = importlib.import_module("stage05_continuous_batch").Engine(folder, max_model_len=512, max_num_seqs=16,
                                                                      max_num_batched_tokens=128)
    ids, got, k = [], {}, 0
    while k < n or loop.has_unfinished_requests():
        for _ in range(min(3, n - k)):                          # three arrivals a step
            ids.append(loop.add_request(prompts[k], params[k]))
            k += 1
        for out in loop.step():
            if out.finished:
                got[out.request_id] = out
    stats = loop.stats
    assert max(stats.rows) <= 128 and max(stats.decode_rows) <= 16
    got_logits = loop.decode_logits([w.prompt_token_ids + w.token_ids[:-1] for w in want],
                                    [len(w.prompt_token_ids) for w in want])
    worst = max(rel_l2(gl, wl) for gl, wl in zip(got_logits, want_logits))
    print(f"{model}, {n} requests: worst request's logits rel L2 against stage04 alone {worst:.2e}")
    assert worst < 2e-2
    equal = 0
    for b, (rid, w, gl, wl) in enumerate(zip(ids, want, got_logits, want_logits)):
        step = check_greedy(got[rid].token_ids, w.token_ids, gl, wl)
        equal += step is None
        if step is not None:
            print(f"  request {b}: {agreement_line(gl, wl, step, len(w.token_ids))}")
    print(f"{model}, {n} requests: {equal} of {n} equal token for token")
