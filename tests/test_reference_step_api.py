"""The numpy reference engine's step API (what the server drives on a machine without a GPU): requests join and
leave between steps, each gets the tokens generate() gives it alone, aborts and bad input leave no trace."""
import pytest

from common.prompts import PromptError
from common.reference import ReferenceEngine
from common.sampling import SamplingParams, SamplingParamsError


@pytest.fixture(scope="module")
def engine(tiny_dir):
    return ReferenceEngine(str(tiny_dir), max_model_len=64, max_num_seqs=2)


def run(engine):
    final, steps = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.new_token_ids == out.token_ids[-1:]
            if out.finished:
                assert out.request_id not in final, "finished twice"
                final[out.request_id] = out
        steps += 1
        assert steps < 1000
    return final


def test_each_request_gets_what_generate_gives_it_alone(engine):
    prompts = ["Hello there", [128000, 5, 6, 7], "A third one, longer than the others"]
    params = [SamplingParams(max_tokens=5, temperature=0.0), SamplingParams(max_tokens=3, temperature=1.0, seed=4),
              SamplingParams(max_tokens=4, temperature=0.7, top_p=0.9, seed=9)]
    want = engine.generate(prompts, params)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    first = engine.step()
    assert [o.request_id for o in first] == ids[:2]            # max_num_seqs = 2: the third waits
    got = run(engine)
    for i, w in zip(ids, want):
        assert got[i].token_ids == w.token_ids and got[i].finish_reason == w.finish_reason
        assert got[i].text == w.text


def test_text_deltas_add_up_to_the_text(engine):
    rid = engine.add_request("Stream me", SamplingParams(max_tokens=8, temperature=1.0, seed=1), request_id="s")
    text = ""
    while engine.has_unfinished_requests():
        for out in engine.step():
            text += out.text_delta
    assert rid == "s" and text == out.text


def test_abort_drops_a_request_at_any_point_and_unknown_ids_are_no_ops(engine):
    a = engine.add_request("first", SamplingParams(max_tokens=20, temperature=0.0))
    b = engine.add_request("second", SamplingParams(max_tokens=3, temperature=0.0))
    c = engine.add_request("waiting", SamplingParams(max_tokens=3, temperature=0.0))
    engine.step()
    engine.abort_request(a)                                    # running
    engine.abort_request(c)                                    # waiting
    engine.abort_request("nobody")
    got = run(engine)
    assert set(got) == {b}


@pytest.mark.parametrize("prompt, params, error", [
    ("x " * 100, SamplingParams(), PromptError),                       # longer than max_model_len
    ([], SamplingParams(), PromptError),
    ("fine", {"max_tokens": 3}, TypeError),
])
def test_bad_input_raises_at_once_and_queues_nothing(engine, prompt, params, error):
    with pytest.raises(error):
        engine.add_request(prompt, params)
    assert not engine.has_unfinished_requests()


def test_bad_sampling_values_and_duplicate_ids(engine):
    with pytest.raises(SamplingParamsError):
        engine.add_request("fine", SamplingParams(top_p=0.0))
    engine.add_request("one", SamplingParams(max_tokens=1), request_id="dup")
    with pytest.raises(ValueError, match="'dup' is already in use"):
        engine.add_request("two", SamplingParams(max_tokens=1), request_id="dup")
    run(engine)
    assert not engine.has_unfinished_requests()


def test_num_requests_counts_running_and_waiting(tiny_dir):
    eng = ReferenceEngine(str(tiny_dir), max_model_len=32, max_num_seqs=1)
    for _ in range(2):
        eng.add_request([5, 6], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    assert eng.num_requests() == (0, 2)
    eng.step()
    assert eng.num_requests() == (1, 1)
    while eng.has_unfinished_requests():
        eng.step()
    assert eng.num_requests() == (0, 0)
