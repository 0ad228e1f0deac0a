"""CPU: the continuous-batching loop (llm_engine.py) over a numpy runner that keeps tokens in a paged cache, as
the GPU keeps their K/V: written through the slot mapping, read back through block tables kept from the step's
table updates. Whatever the packing, chunking, order of arrival and preemption, every request gets exactly the
tokens the numpy reference engine gives it alone."""
import numpy as np
import pytest

from common.prompts import PromptError, PromptPreparer
from common.reference import ReferenceEngine, sample_reference
from common.sampling import SamplingParams
from common.testing import remember_logits

from ..block_manager import BlockManager, blocks_for
from ..llm_engine import LLMEngine

BS = 4          # block_size


class NumpyRunner:
    """The forward of packed rows, on the numpy reference model, over a paged cache of tokens: row r writes its
    token to cache slot slot_mapping[r]; a logit row's logits are the model's over its sequence's tokens
    0..position, gathered through that seq_slot's block table (the device's copy, from table_updates only)."""

    def __init__(self, model, num_blocks, max_model_len):
        self.model, self.rows = model, []
        self.cache = np.full(num_blocks * BS, -1, np.int64)            # poisoned: an unwritten slot is -1
        self.width = blocks_for(max_model_len, BS)
        self.tables = np.full(256 * self.width, -1, np.int64)
        self.params, self.rngs = {}, {}

    def admit(self, seq):
        self.params[seq.seq_slot] = seq.params
        # one draw stream per request, kept over preemptions (the GPU's sampler counts draws per request)
        self.rngs.setdefault(seq.request_id, np.random.default_rng(seq.params.seed))
        self.rngs[seq.seq_slot] = self.rngs[seq.request_id]

    def run(self, x):
        self.rows.append(x.num_rows)
        self.tables[x.table_updates[:, 0]] = x.table_updates[:, 1]
        self.cache[x.slot_mapping] = x.tokens
        out = []
        for r, slot in zip(x.logit_rows, x.logit_seq_slots):
            pos = np.arange(x.positions[r] + 1)
            blocks = self.tables[slot * self.width + pos // BS]
            assert (blocks >= 0).all(), "a block-table entry never sent"
            history = self.cache[blocks * BS + pos % BS]
            assert (history >= 0).all(), "a cache slot never written"
            out.append(sample_reference(self.model.last_logits(history.tolist()), self.params[slot],
                                        self.rngs[slot]))
        return np.array(out, np.int32)


@pytest.fixture(scope="module")
def reference(tiny_dir):
    return remember_logits(ReferenceEngine(str(tiny_dir), max_model_len=96))


def engine(reference, max_num_seqs=3, max_num_batched_tokens=16, num_blocks=200):
    runner = NumpyRunner(reference.model, num_blocks, reference.max_model_len)
    prompts = PromptPreparer(reference.checkpoint.folder, reference.config, reference.max_model_len)
    return LLMEngine(runner, prompts, max_num_seqs, max_num_batched_tokens, BlockManager(num_blocks, BS)), runner


def workload(n=7, seed=0):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 128000, int(rng.integers(1, 40))).tolist() for _ in range(n)]
    params = [SamplingParams(max_tokens=int(rng.integers(1, 12)), temperature=float(rng.choice([0.0, 0.8])),
                             seed=int(rng.integers(1000)), ignore_eos=True) for _ in range(n)]
    return prompts, params


def test_generate_equals_each_request_alone_with_chunked_prefill(reference):
    prompts, params = workload()
    want = reference.generate(prompts, params)
    eng, runner = engine(reference)
    got = eng.generate(prompts, params)
    assert [o.request_id for o in got] == list(range(len(prompts)))
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason and g.text == w.text
    assert max(runner.rows) <= 16 and not eng.has_unfinished_requests()
    assert any(len(p) > 16 for p in prompts)                  # some prompt was prefilled in chunks


def test_generate_reports_each_request_once_when_it_finishes(reference):
    """generate()'s requests are final only (vLLM's FINAL_ONLY): no per-step output or text until they finish."""
    prompts, params = workload(n=5, seed=3)
    eng, _ = engine(reference)
    seen, step = [], eng.step

    def spy():                                               # every output step() gives
        outs = step()
        seen.extend(outs)
        return outs

    eng.step = spy
    got = eng.generate(prompts, params)
    assert sorted(o.request_id for o in seen) == sorted(set(o.request_id for o in seen))   # once each
    assert len(seen) == len(prompts) and all(o.finished for o in seen)
    assert [o.new_token_ids for o in seen] == [o.token_ids for o in seen]
    assert sorted(o.text for o in seen) == sorted(o.text for o in got)


def test_detokenize_false_gives_token_ids_and_no_text(reference):
    eng, _ = engine(reference)
    p = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    rid = eng.add_request("quiet please", p, detokenize=False)
    outs = []
    while eng.has_unfinished_requests():
        outs += eng.step()
    assert [t for o in outs for t in o.new_token_ids] == reference.generate("quiet please", p)[0].token_ids
    assert all(o.text == o.text_delta == "" and o.request_id == rid for o in outs) and outs[-1].finished


def test_requests_added_between_steps_get_the_same_tokens(reference):
    prompts, params = workload(seed=1)
    want = reference.generate(prompts, params)
    eng, _ = engine(reference, max_num_seqs=2, max_num_batched_tokens=8)
    ids, got, k = [], {}, 0
    while k < len(prompts) or eng.has_unfinished_requests():
        if k < len(prompts):                                 # one new request every step
            ids.append(eng.add_request(prompts[k], params[k]))
            k += 1
        for out in eng.step():
            if out.finished:
                got[out.request_id] = out
    assert [got[i].token_ids for i in ids] == [w.token_ids for w in want]


def test_stream_and_text_deltas(reference):
    eng, _ = engine(reference)
    p = SamplingParams(max_tokens=9, temperature=1.0, seed=5, ignore_eos=True)
    streamed = [t for t, _ in eng.stream("Hello there", p)]
    assert streamed == reference.generate("Hello there", p)[0].token_ids
    rid = eng.add_request("Once more", p)
    text = ""
    while eng.has_unfinished_requests():
        for out in eng.step():
            text += out.text_delta
    assert text == out.text and out.request_id == rid


def test_abort_mid_decode_frees_the_seq_slot_and_leaves_the_others_unchanged(reference):
    prompts, params = workload(n=4, seed=2)
    want = reference.generate(prompts, params)
    eng, _ = engine(reference, max_num_seqs=2)
    long = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    victim = eng.add_request([5, 6, 7], long)
    ids = [eng.add_request(p, sp) for p, sp in zip(prompts, params)]
    got = {}
    for _ in range(3):
        eng.step()
    eng.abort_request(victim)
    eng.abort_request("nobody")                               # a no-op
    while eng.has_unfinished_requests():
        for out in eng.step():
            assert out.request_id != victim
            if out.finished:
                got[out.request_id] = out
    assert [got[i].token_ids for i in ids] == [w.token_ids for w in want]
    assert len(eng.scheduler._free) == 2 and eng.blocks.num_free == 200     # every seq_slot and block free again


def test_bad_input_raises_at_once_and_changes_nothing(reference):
    eng, _ = engine(reference)
    with pytest.raises(PromptError):
        eng.add_request([], SamplingParams())
    with pytest.raises(PromptError):
        eng.add_request("x " * 200, SamplingParams())
    with pytest.raises(TypeError):
        eng.add_request("fine", {"max_tokens": 2})
    eng.add_request("fine", SamplingParams(max_tokens=2), request_id="r")
    with pytest.raises(ValueError, match="'r' is already in use"):
        eng.add_request("again", SamplingParams(max_tokens=2), request_id="r")
    with pytest.raises(PromptError):                          # generate validates every prompt before any runs
        eng.generate(["fine", []], SamplingParams(max_tokens=2))
    assert len(eng.scheduler.waiting) == 1 and eng.scheduler.waiting[0].request_id == "r"


def test_num_requests_counts_running_and_waiting(reference):
    eng, _ = engine(reference, max_num_seqs=2)
    greedy = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    for _ in range(3):
        eng.add_request([5, 6, 7], greedy)
    assert eng.num_requests() == (0, 3)
    eng.step()
    assert eng.num_requests() == (2, 1)           # two seq_slots: the third waits
    while eng.has_unfinished_requests():
        eng.step()
    assert eng.num_requests() == (0, 0)


@pytest.mark.parametrize("num_blocks", [14, 20, 40])
def test_preemption_on_a_small_pool_changes_no_request_s_tokens(reference, num_blocks):
    """14 blocks of 4 hold one request of the workload alone: requests are preempted and recomputed many
    times, and greedy and seeded requests alike get exactly their tokens."""
    prompts, params = workload(n=10, seed=4)
    params = [SamplingParams(max_tokens=20, temperature=p.temperature, seed=p.seed, ignore_eos=True) for p in params]
    assert max(blocks_for(len(p) + 19, BS) for p in prompts) <= 14
    want = reference.generate(prompts, params)
    eng, _ = engine(reference, max_num_seqs=6, max_num_batched_tokens=24, num_blocks=num_blocks)
    got = eng.generate(prompts, params)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert eng.scheduler.stats.preemptions >= (5 if num_blocks == 14 else 1)
    assert eng.blocks.num_free == num_blocks and eng.kv_cache_usage() == 0.0


def test_a_request_that_cannot_fit_alone_is_refused_at_add_request(reference):
    eng, _ = engine(reference, num_blocks=5)                 # 20 positions
    with pytest.raises(PromptError, match=r"needs 6 KV cache blocks of 4 positions \(21 positions\) and the "
                                          r"cache holds 5"):      # a PromptError: the server answers it with a 400
        eng.add_request(list(range(1, 12)), SamplingParams(max_tokens=11))
    eng.add_request(list(range(1, 12)), SamplingParams(max_tokens=10))       # 20 positions: fits
    assert eng.num_requests() == (0, 1)
