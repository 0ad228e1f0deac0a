import sys
import threading
from pathlib import Path

import pytest

from common.prompts import PromptError, PromptPreparer
from common.sampling import SamplingParams
from common.synthetic import PRESETS, build_tokenizer, llama3_special_tokens
from common.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]

TEXTS = ["Hello, world!", "naïve café — 東京 🙂", "  spaces\n\nand newlines\t", "1234567"]


@pytest.fixture(scope="module")
def synthetic_tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    build_tokenizer().save(str(path))
    return Tokenizer(path)


def test_synthetic_tokenizer_has_llama3_special_ids(synthetic_tok):
    t = synthetic_tok
    assert [t.token_to_id(s) for s in ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                       "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>")] == [
        128000, 128001, 128006, 128007, 128008, 128009]
    assert t.token_to_id(llama3_special_tokens()[-1]) == 128255
    assert t.encode("hi")[0] == 128000 and t.encode("hi", add_special_tokens=False)[0] != 128000


def test_encode_lets_other_threads_run_while_it_works(synthetic_tok):
    """A long prompt keeps the tokenizer busy for a while (4 s for 5 MB), and a server's event loop must run
    meanwhile. With a switch interval longer than the encode, a thread that waits for the interpreter lock gets
    it before the encode ends only if the encode let go of it: then the main thread wakes with the encode still
    running. Same ids as the one-shot encode."""
    text = "the quick brown fox jumps " * 40_000                           # 1 MB
    started, done = threading.Event(), threading.Event()

    def work():
        started.set()
        work.ids = synthetic_tok.encode(text)
        done.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(60)
    try:
        thread = threading.Thread(target=work)
        thread.start()
        started.wait()
        ran_meanwhile = not done.is_set()
        thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert ran_meanwhile, "the encode held the interpreter lock to its end"
    assert work.ids == synthetic_tok._tok.encode(text).ids


@pytest.mark.parametrize("text", TEXTS)
def test_synthetic_round_trip(synthetic_tok, text):
    assert synthetic_tok.decode(synthetic_tok.encode(text)) == text


def test_real_tokenizer_known_ids(llama3_tokenizer):
    t = Tokenizer(llama3_tokenizer)
    assert t.encode("Hello, world!") == [128000, 9906, 11, 1917, 0]
    assert t.encode("Hello, world!", add_special_tokens=False) == [9906, 11, 1917, 0]
    for text in TEXTS:
        assert t.decode(t.encode(text)) == text


def test_real_chat_template_ids(llama3_tokenizer):
    t = Tokenizer(llama3_tokenizer)
    ids = t.encode_chat("Hi")
    # one BOS only, system header first, and the prompt ends on the assistant header + "\n\n"
    assert ids[:2] == [128000, 128006] and ids.count(128000) == 1
    assert ids[-4:-1] == [128006, 78191, 128007] and t.decode([ids[-1]]) == "\n\n"
    assert "Today Date: 26 Jul 2024" in t.decode(ids)
    assert t.decode(ids, skip_special_tokens=False) == t.chat_prompt("Hi")


@pytest.mark.parametrize("text", TEXTS)
def test_streaming_detokenisation_equals_decode(synthetic_tok, text, request):
    toks = [synthetic_tok]
    if (request.config.rootpath.parent / "shared" / "llama3-tokenizer" / "tokenizer.json").exists():
        toks.append(Tokenizer(request.config.rootpath.parent / "shared" / "llama3-tokenizer"))
    for t in toks:
        ids = t.encode(text, add_special_tokens=False)
        stream = t.stream()
        pieces = [stream.step(i) for i in ids]
        assert "".join(pieces) == t.decode(ids) == text
        assert all("\ufffd" not in p for p in pieces)  # never half a UTF-8 character


def test_chat_template_with_system_and_turns(synthetic_tok):
    text = synthetic_tok.chat_prompt([{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "Hi"},
                                      {"role": "assistant", "content": "Hello."},
                                      {"role": "user", "content": "Bye"}])
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge")
    assert "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" in text
    assert text.endswith("Bye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


def test_prompt_rules(tiny_dir):
    prep = PromptPreparer(tiny_dir, PRESETS["tiny"], max_model_len=16)
    assert prep.model_stop_ids == (128001, 128008, 128009)
    assert prep.stop_ids(SamplingParams(ignore_eos=True, stop_token_ids=[7])) == {7}
    with pytest.raises(PromptError, match="does not fit max_model_len=16"):
        prep.encode(list(range(16)))
    with pytest.raises(PromptError, match="outside the vocabulary"):
        prep.encode([1, 128256])
    with pytest.raises(PromptError, match="empty prompt"):
        prep.encode([])
    p = SamplingParams(max_tokens=3)
    stop = prep.stop_ids(p)
    assert prep.finish_reason([5, 128009], 10, p, stop) == "stop"
    assert prep.finish_reason([5, 6, 7], 10, p, stop) == "length"
    assert prep.finish_reason([5], 16, p, stop) == "length"
    assert prep.finish_reason([5], 10, p, stop) is None


CHAPTER_EXAMPLES = {"Hello, world!": [128000, 9906, 11, 1917, 0], " Hello": [128000, 22691],
                    "🙂": [128000, 9468, 19044]}   # stage02_forward/README.md, section 3


def test_the_chapter_examples_are_the_real_tokenizers(llama3_tokenizer):
    t = Tokenizer(llama3_tokenizer)
    chapter = (ROOT / "stage02_forward" / "README.md").read_text()
    for text, ids in CHAPTER_EXAMPLES.items():
        assert t.encode(text) == ids
        assert ", ".join(map(str, ids)) in chapter
    assert len(t.encode(t.chat_prompt("Hi"))) == 37 and len(t.encode_chat("Hi")) == 36   # the BOS pitfall
    stream = t.stream()
    assert [stream.step(i) for i in t.encode("🙂", add_special_tokens=False)] == ["", "🙂"]
