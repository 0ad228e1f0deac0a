"""CPU: prefix caching. The hash chain names a block by every token up to its end; a request finds the blocks an
earlier one computed and runs only the rest, never its last token from the cache; freed blocks stay cached until
evicted, least recently freed first. A property test drives the scheduler over random workloads with shared
prefixes, arrivals, aborts, preemption and eviction, and keeps a model of every block's contents: after every step
no block is lost or held past its count, and every cached block holds what its hash names. The numpy engine gives
the same tokens with caching on and off."""
import numpy as np
import pytest

from common.outputs import Timing
from common.reference import ReferenceEngine
from common.sampling import SamplingParams
from common.testing import for_each_seed, remember_logits, seed_ranges

from ..block_manager import BlockManager, block_hashes
from ..cpu_engine import CpuEngine
from ..scheduler import Scheduler
from ..sequence import Sequence


def seq(rid, prompt, max_tokens=4):
    return Sequence(rid, list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0.0), frozenset(), 0,
                    Timing(len(prompt)))


def run_to_end(sched, token=7):
    while sched.has_unfinished():
        plan = sched.schedule()
        sched.update(plan, np.full(len(plan.sampling_seqs), token, np.int32))


def test_a_hash_names_the_block_and_everything_before_it():
    a, b, c = seq("a", [1] * 8 + [2] * 4), seq("b", [1] * 8 + [3] * 4), seq("c", [9] + [1] * 7 + [2] * 4)
    ha, hb, hc = (block_hashes(s, 4, 12) for s in (a, b, c))
    assert ha[:2] == hb[:2] and ha[2] != hb[2]            # the same first 8 tokens, then not
    assert ha[0] != ha[1]                                   # same tokens, other parents: other blocks
    assert all(x != y for x, y in zip(ha, hc))              # one token differs in block 0: every hash after too


def test_a_later_request_runs_only_what_the_cache_lacks():
    sched = Scheduler(4, 64, BlockManager(20, 4), 64)
    first = seq("first", range(1, 11))                      # 10 tokens: blocks 0, 1 full, block 2 partial
    sched.add(first)
    run_to_end(sched)
    second = seq("second", list(range(1, 9)) + [50, 51, 52])   # shares 8 tokens: 2 full blocks
    sched.add(second)
    plan = sched.schedule()
    (chunk,) = plan.prefill
    assert (chunk.start, chunk.n) == (8, 3) and second.num_cached_tokens == 8
    assert second.block_table[:2] == first_blocks(sched, first)
    assert sched.blocks.query_tokens == 10 + 11 and sched.blocks.hit_tokens == 8


def first_blocks(sched, s):
    """The blocks the cache holds for s's first full blocks."""
    return [sched.blocks.cached[h] for h in s.block_hashes[:2]]


def test_a_prompt_found_whole_still_computes_its_last_token():
    """Every block of an 8-token prompt is cached: the last block is computed again (its last token's logits
    choose the next), into a block of its own; the cache keeps the first copy."""
    sched = Scheduler(4, 64, BlockManager(20, 4), 64)
    sched.add(seq("a", range(1, 9)))
    run_to_end(sched)
    again = seq("b", range(1, 9))
    sched.add(again)
    plan = sched.schedule()
    (chunk,) = plan.prefill
    assert (chunk.start, chunk.n) == (4, 4) and plan.admitted == [again]
    last = block_hashes(again, 4, 8)[1]
    cached_copy = sched.blocks.cached[last]
    sched.update(plan, np.array([7], np.int32))
    assert sched.blocks.cached[last] == cached_copy != again.block_table[1]


def test_freed_blocks_stay_cached_until_evicted_least_recently_freed_first():
    pool = BlockManager(4, 2)
    a, b = seq("a", [1, 2, 3, 4, 5]), seq("b", [6, 7, 8])
    pool.grow(a, 4)
    pool.cache_blocks(a, 4)                                 # a's blocks 0, 1 full and cached
    pool.free(a)
    assert pool.num_free == 4 and len(pool.cached) == 2
    pool.grow(b, 3)                                         # two never-used blocks first: nothing evicted
    assert b.block_table == [2, 3] and len(pool.cached) == 2
    c = seq("c", [9, 9, 9])
    pool.grow(c, 1)                                         # now the least recently freed cached block: a's last
    assert c.block_table == [1] and len(pool.cached) == 1   # (freed first, tail first), so a's first block stays
    again = seq("a2", [1, 2, 3, 4, 5])
    assert pool.lookup(again) == [0]


@pytest.mark.parametrize("enable", [True, False])
def test_the_switch(enable):
    sched = Scheduler(4, 64, BlockManager(20, 4, enable_caching=enable), 64)
    sched.add(seq("a", range(1, 11)))
    run_to_end(sched)
    b = seq("b", range(1, 11))
    sched.add(b)
    assert sched.schedule().prefill[0].start == (8 if enable else 0)


# ---------------------------------------------------------------------- random workloads, contents modelled
def random_prefix_workload(seed) -> int:
    rng = np.random.default_rng(seed)
    bs, L = int(rng.choice([1, 2, 4, 8])), 96
    max_seqs, budget = int(rng.integers(1, 7)), int(rng.integers(8, 49))
    budget = max(budget, max_seqs)
    prefixes = [rng.integers(0, 50, int(rng.integers(0, 30))).tolist() for _ in range(3)]
    reqs = []
    for i in range(int(rng.integers(2, 20))):
        own = rng.integers(0, 50, int(rng.integers(1, 20))).tolist()
        reqs.append(seq(i, prefixes[int(rng.integers(3))] + own, int(rng.integers(1, 10))))
    need = max(-(-(len(s.prompt) + s.params.max_tokens) // bs) for s in reqs)
    pool = BlockManager(int(need * rng.choice([1, 1.5, 3, 10])), bs)
    sched = Scheduler(max_seqs, budget, pool, L)
    content: dict[int, dict[int, tuple]] = {}               # block -> offset -> the tokens up to that position
    arrive = sorted(int(x) for x in rng.integers(0, 25, len(reqs)))
    pending, t, hits = list(zip(arrive, reqs)), 0, 0
    while pending or sched.has_unfinished():
        assert t < 20_000, "a request waits forever"
        while pending and pending[0][0] <= t:
            sched.add(pending.pop(0)[1])
        if sched.running and rng.random() < 0.03:
            sched.abort(sched.running[int(rng.integers(len(sched.running)))].request_id)
        plan = sched.schedule()
        for s in plan.admitted:                             # what it found in the cache is its own prefix's K/V
            for p in range(s.num_computed):
                assert content[s.block_table[p // bs]][p % bs] == tuple(s.tokens(0, p + 1)), f"{s.request_id}@{p}"
            hits += s.num_computed > 0
        for c in plan.chunks:                               # the step writes its rows' K/V
            for p in range(c.start, c.start + c.n):
                content.setdefault(c.seq.block_table[p // bs], {})[p % bs] = tuple(c.seq.tokens(0, p + 1))
        sched.update(plan, rng.integers(0, 50, len(plan.sampling_seqs)).astype(np.int32))
        held: dict[int, int] = {}
        for s in sched.running:
            for b in s.block_table:
                held[b] = held.get(b, 0) + 1
        assert held == pool.refs, "reference counts are the holders"
        assert pool.num_free == pool.num_blocks - len(held)
        for h, b in pool.cached.items():                    # a cached block holds what its hash names
            assert len(content[b]) == bs
            tokens = content[b][bs - 1]
            probe = seq("probe", tokens)
            assert block_hashes(probe, bs, len(tokens))[-1] == h
        t += 1
    assert not pool.refs and pool.num_free == pool.num_blocks
    return hits


@seed_ranges(200, 2000, copy_seeds=20, test_file=__file__)
def test_random_workloads_with_shared_prefixes_keep_the_cache_true(seeds):
    hits = for_each_seed(seeds, random_prefix_workload)
    assert sum(h > 0 for h in hits) > len(seeds) / 2        # not vacuous: most workloads hit the cache


# ---------------------------------------------------------------------- the engine, caching on and off
@pytest.fixture(scope="module")
def reference(tiny_dir):
    return remember_logits(ReferenceEngine(str(tiny_dir), max_model_len=96))


def shared_prefix_requests(n, seed):
    rng = np.random.default_rng(seed)
    system = rng.integers(0, 128000, 37).tolist()
    prompts = [system + rng.integers(0, 128000, int(rng.integers(1, 20))).tolist() for _ in range(n)]
    params = [SamplingParams(max_tokens=int(rng.integers(1, 12)), temperature=0.0, ignore_eos=True)
              for _ in range(n)]
    return prompts, params


@pytest.mark.parametrize("num_gpu_blocks", [None, 30])
def test_cached_prefixes_give_the_reference_s_tokens(reference, tiny_dir, num_gpu_blocks):
    """Requests sharing a 37-token prefix, with caching on and off (and a pool small enough to preempt and evict):
    the reference's greedy tokens every time, and the cache is hit when it is on."""
    prompts, params = shared_prefix_requests(10, seed=3)
    want = [o.token_ids for o in reference.generate(prompts, params)]
    for enable in (True, False):
        eng = CpuEngine(str(tiny_dir), max_model_len=96, max_num_seqs=3, max_num_batched_tokens=24, block_size=4,
                        num_gpu_blocks=num_gpu_blocks, enable_prefix_caching=enable)
        assert [o.token_ids for o in eng.generate(prompts, params)] == want, f"caching {enable}"
        assert (eng.llm.blocks.hit_tokens > 0) == enable


def test_a_reset_forgets_every_cached_block_and_is_refused_while_requests_run(tiny_dir):
    """What benchmarks call between runs (common/bench/measure.generate_once): a repeat of the same requests
    computes them again. The hit rate counts tokens found at first admissions."""
    prompts, params = shared_prefix_requests(4, seed=5)
    eng = CpuEngine(str(tiny_dir), max_model_len=96, max_num_seqs=4, max_num_batched_tokens=40, block_size=4)
    eng.generate(prompts, params)              # the first request's prefix is cached before the others come in
    rate = eng.prefix_cache_hit_rate()
    assert 0 < rate < 1 and eng.llm.blocks.cached
    eng.reset_prefix_cache()
    assert not eng.llm.blocks.cached and eng.llm.blocks.num_free == eng.llm.blocks.num_blocks
    eng.add_request(prompts[0], params[0])
    with pytest.raises(RuntimeError, match="no unfinished requests"):
        eng.reset_prefix_cache()


def test_a_conversation_s_later_turns_find_its_earlier_ones(tiny_dir):
    """The chat workload's driver (common/bench/measure.chat_once) over this engine: a turn's prompt is every earlier
    message and answer, whose blocks the turns before computed and left cached."""
    from common.bench.measure import chat_once

    rng = np.random.default_rng(6)
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    conversations = [[(rng.integers(0, 128000, 10).tolist(), greedy) for _ in range(3)] for _ in range(3)]
    eng = CpuEngine(str(tiny_dir), max_model_len=96, max_num_seqs=3, block_size=4)
    r = chat_once(eng, conversations)
    assert {"ttft_ms_turn1", "ttft_ms_turn2", "ttft_ms_turn3"} <= set(r)
    assert eng.llm.blocks.hit_tokens >= 2 * 3 * 12           # turns 2 and 3 find at least 3 blocks each
