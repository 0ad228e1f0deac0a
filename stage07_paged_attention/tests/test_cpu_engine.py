"""CPU: this stage's engine without a GPU (cpu_engine.py): the stage's own loop over common's numpy runner, with a
real KV cache. Greedy requests get the plain reference's tokens whatever the chunking and arrivals; seeded sampled
requests get the same tokens however they are batched, and when blocks run out and sequences are preempted and
recomputed; the step API is the GPU engine's."""
import numpy as np
import pytest

from common.reference import ReferenceEngine
from common.sampling import SamplingParams
from common.testing import remember_logits

from ..cpu_engine import CpuEngine


@pytest.fixture(scope="module")
def reference(tiny_dir):
    return remember_logits(ReferenceEngine(str(tiny_dir), max_model_len=96))


def workload(n, seed, temperature=0.0):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 128000, int(rng.integers(1, 40))).tolist() for _ in range(n)]
    params = [SamplingParams(max_tokens=int(rng.integers(1, 12)), temperature=temperature,
                             seed=int(rng.integers(1000)), ignore_eos=True) for _ in range(n)]
    return prompts, params


def test_greedy_tokens_equal_the_reference_with_chunks_and_arrivals(reference, tiny_dir):
    prompts, params = workload(8, seed=0)
    want = [o.token_ids for o in reference.generate(prompts, params)]
    eng = CpuEngine(str(tiny_dir), max_model_len=96, max_num_seqs=3, max_num_batched_tokens=16)
    assert [o.token_ids for o in eng.generate(prompts, params)] == want
    assert max(eng.stats.rows) <= 16 and any(len(p) > 16 for p in prompts)   # prompts went in chunks
    ids, got = [], {}
    for p, sp in zip(prompts, params):                       # one arrival a step, tokens only (as the server)
        ids.append(eng.add_request(p, sp, detokenize=False))
        for out in eng.step():
            got.setdefault(out.request_id, []).extend(out.new_token_ids)
    while eng.has_unfinished_requests():
        for out in eng.step():
            got.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert [got[i] for i in ids] == want


def test_sampled_tokens_do_not_depend_on_the_batch(tiny_dir):
    prompts, params = workload(6, seed=1, temperature=0.9)
    together = CpuEngine(str(tiny_dir), max_model_len=96, max_num_seqs=6).generate(prompts, params)
    alone = CpuEngine(str(tiny_dir), max_model_len=96, max_num_seqs=1, max_num_batched_tokens=8)
    assert [o.token_ids for o in alone.generate(prompts, params)] == [o.token_ids for o in together]


def test_preempted_sequences_get_the_same_tokens(reference, tiny_dir):
    """14 blocks of 4 hold one request of the workload alone: requests are preempted and recomputed, and greedy
    ones get the reference's tokens, seeded sampled ones those a roomy pool gives them."""
    for temperature in (0.0, 0.9):
        prompts, params = workload(6, seed=4, temperature=temperature)
        params = [SamplingParams(max_tokens=16, temperature=temperature, seed=p.seed, ignore_eos=True)
                  for p in params]
        want = (reference if temperature == 0 else CpuEngine(str(tiny_dir), max_model_len=96, block_size=4)
                ).generate(prompts, params)
        eng = CpuEngine(str(tiny_dir), max_model_len=96, max_num_seqs=6, max_num_batched_tokens=24, block_size=4,
                        num_gpu_blocks=14)
        assert [o.token_ids for o in eng.generate(prompts, params)] == [o.token_ids for o in want]
        assert eng.stats.preemptions >= 2 and eng.kv_cache_usage() == 0.0


def test_abort_frees_the_seq_slot_by_the_next_step(tiny_dir):
    eng = CpuEngine(str(tiny_dir), max_model_len=96, max_num_seqs=1)
    long = eng.add_request([5, 6, 7], SamplingParams(max_tokens=80, temperature=0.0, ignore_eos=True))
    eng.step()
    short = eng.add_request([8, 9], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    assert eng.num_requests() == (1, 1)
    eng.abort_request(long)
    outs = eng.step()                                # admits the waiting request in long's place
    assert eng.num_requests() == (1, 0)
    while eng.has_unfinished_requests():
        outs += eng.step()
    assert {o.request_id for o in outs} == {short}


def test_sizes_out_of_range_are_refused_naming_them(tiny_dir):
    for name in ("max_num_seqs", "max_num_batched_tokens", "kv_cache_memory_bytes"):
        with pytest.raises(ValueError, match=f"{name}=0 must be an integer >= 1"):     # 0 is not "the default"
            CpuEngine(str(tiny_dir), max_model_len=96, **{name: 0})
    with pytest.raises(MemoryError, match="kv_cache_memory_bytes=1000 holds no block of 16 positions"):
        CpuEngine(str(tiny_dir), max_model_len=96, kv_cache_memory_bytes=1000)
