"""GPU tier: every stage with decode graphs (stage08 on) gives every request the greedy tokens stage07 gives it
eagerly, while the running set changes under them: 40 requests of mixed lengths arriving three a step into 8
seq_slots, two aborted mid-way, on a pool of blocks small enough that sequences are preempted and recomputed.
Each step's rows replay a graph of another size than the last (or run eagerly when a prompt chunk is in it), so a
replay that read a stale input, a padding row that wrote somewhere, or a graph of the wrong size would part the
runs. The GEMMs differ (padded M, and stage10's fused gemv.cu at the sizes it won), and with asynchronous scheduling
(stage09 on) the batches differ step by step too (a stopped request holds its seq_slot a step longer), so top-1
must be equal at every decided step and the runs may part only where the logit error can flip the choice
(common/testing.py): the error between the stages along the same tokens, or, where larger, how far the later
stage's own logits of a request move between decoding it alone and with all the others (the batch-shape noise
its run saw)."""
import importlib
from pathlib import Path

import numpy as np
import pytest

from common.testing import agreement_line, check_greedy, mixed_greedy_requests

pytestmark = pytest.mark.gpu
ABORTED = (1, 4)
ROOT = Path(__file__).resolve().parents[1]
WITH_GRAPHS = sorted(p.name for p in ROOT.glob("stage[0-9][0-9]_*") if (p / "graphs.py").exists())


def run(stage, folder, prompts, params):
    """Every finished request's output (the aborted ones never finish) and the number of preemptions."""
    engine = importlib.import_module(stage).Engine(folder, max_model_len=512, max_num_seqs=8,
                                                   max_num_batched_tokens=64, num_gpu_blocks=40)
    got, k, steps = {}, 0, 0
    while k < len(prompts) or engine.has_unfinished_requests():
        for _ in range(min(3, len(prompts) - k)):
            engine.add_request(prompts[k], params[k], request_id=k)
            k += 1
        if steps == 6:
            for rid in ABORTED:
                engine.abort_request(rid)
        for out in engine.step():
            if out.finished:
                got[out.request_id] = out
        steps += 1
    return got, engine.stats.preemptions


def logits_along(stage, folder, outs, alone=False):
    """Each output's logits along its own tokens, teacher-forced, on an engine with room for all at once (no
    preemption: a recomputed sequence would sample its logits twice): all decoded together, or each alone."""
    engine = importlib.import_module(stage).Engine(folder, max_model_len=512, kv_cache_memory_bytes=2**28)
    seqs, n = [o.prompt_token_ids + o.token_ids[:-1] for o in outs], [len(o.prompt_token_ids) for o in outs]
    if alone:
        return [engine.decode_logits([s], [k])[0] for s, k in zip(seqs, n)]
    return engine.decode_logits(seqs, n)


@pytest.mark.parametrize("stage", WITH_GRAPHS)
@pytest.mark.parametrize("model", ["tiny_dir", "small_dir"])
def test_graphs_under_joins_aborts_and_preemption_give_stage07_s_tokens(stage, model, request):
    folder = str(request.getfixturevalue(model))
    prompts, params = mixed_greedy_requests(40, seed=8)
    params = [p if i not in ABORTED else type(p)(max_tokens=39, temperature=0.0, ignore_eos=True)
              for i, p in enumerate(params)]                    # long enough to be unfinished at step 6
    want, preempted = run("stage07_paged_attention", folder, prompts, params)
    got, _ = run(stage, folder, prompts, params)
    ids = sorted(want)
    assert preempted > 0 and sorted(got) == ids and not set(ABORTED) & set(ids)
    wanted = [want[i] for i in ids]
    want_logits = logits_along("stage07_paged_attention", folder, wanted)
    got_logits = logits_along(stage, folder, wanted)
    got_alone = logits_along(stage, folder, wanted, alone=True)
    equal = 0
    for i, gl, wl, ga in zip(ids, got_logits, want_logits, got_alone):
        noise = float(np.abs(ga - gl).max())
        step = check_greedy(got[i].token_ids, want[i].token_ids, gl, wl, noise)
        equal += step is None
        if step is not None:
            print(f"  request {i}: {agreement_line(gl, wl, step, len(want[i].token_ids), noise)}")
    print(f"{stage} on {model}: {preempted} preemptions in stage07; {equal} of {len(ids)} requests equal token for "
          "token")
