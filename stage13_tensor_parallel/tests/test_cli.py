"""python -m <this stage> streams generated text; without a GPU through this stage's loop over the numpy forward
(cpu_engine.py), on the model given."""
import io
import shutil
import sys

import pytest

from common.device import has_gpu

from ..__main__ import main


def test_generates_and_reports(tiny_dir, capsys):
    assert main(["--model", str(tiny_dir), "--prompt", "Hello, world!", "--chat", "--max-tokens", "5",
                 "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert "[5 tokens in" in out and "finish_reason='length'" in out and "time to first token" in out
    if not has_gpu()[0]:
        assert out.count("no GPU") == 1 and f"this stage's loop over the numpy forward on {tiny_dir}" in out


def test_prompt_longer_than_max_model_len_is_one_clear_line(tiny_dir, capsys):
    assert main(["--model", str(tiny_dir), "--prompt", "word " * 40, "--max-model-len", "16"]) == 2
    err = capsys.readouterr().err
    assert "does not fit max_model_len=16" in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["0", "1", "-3"])
def test_max_model_len_below_two_is_refused_in_one_line(tiny_dir, capsys, value):
    """0 was taken as "the default" (a falsy check) while 1 and -3 were refused."""
    assert main(["--model", str(tiny_dir), "--prompt", "hi", "--max-tokens", "1", "--max-model-len", value]) == 2
    out, err = capsys.readouterr()
    assert err == f"error: max_model_len={value} must be in [2, max_position_embeddings=131072]\n", err
    assert "tokens in" not in out


def test_prompt_that_is_not_utf8_is_one_line_naming_the_flag(tiny_dir, capsys):
    """A shell's $'\\xff\\xfe bad' reaches Python as lone surrogates; the tokenizer raised a TypeError on them."""
    assert main(["--model", str(tiny_dir), "--prompt", "\udcff\udcfe bad", "--max-tokens", "1"]) == 2
    out, err = capsys.readouterr()
    assert err == "error: --prompt: not valid UTF-8 text (byte 0xff at character 0)\n", err
    assert "tokens in" not in out


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stream", [io.StringIO, Terminal])
def test_control_characters_are_escaped_on_a_terminal_only(tiny_dir, monkeypatch, stream):
    """Random weights generate any byte: on a terminal ESC, CR, SO and a bidi override are shown escaped (newline
    and tab kept); a pipe or file gets the text unchanged."""
    generated = "\x1b[2J\r\x0e\u202eok\tend\n"
    monkeypatch.setattr("common.tokenizer.DetokenizeStream.step", lambda self, token: generated)
    out = stream()
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["--model", str(tiny_dir), "--prompt", "hi", "--max-tokens", "2", "--temperature", "0"]) == 0
    text = out.getvalue()
    if stream is Terminal:
        assert "\\x1b[2J\\r\\x0e\\u202eok\tend\n" * 2 in text
        assert not {"\x1b", "\r", "\x0e", "\u202e"} & set(text), text
    else:
        assert generated * 2 in text


@pytest.mark.parametrize("flag, value, why", [("--top-p", "0", "must be in (0, 1]"),
                                              ("--max-tokens", "-1", "must be an integer >= 1"),
                                              ("--temperature", "-1", "must be a finite number >= 0")])
def test_bad_sampling_parameter_names_the_flag(tiny_dir, capsys, flag, value, why):
    assert main(["--model", str(tiny_dir), "--prompt", "hi", flag, value]) == 2
    err = capsys.readouterr().err
    assert f"error: {flag} {float(value) if flag != '--max-tokens' else int(value)!r}: {why}" in err, err


def _broken(kind: str, tiny_dir, tmp_path):
    """A model folder that must be refused: (folder, the text the error names)."""
    if kind == "missing":
        return tmp_path / "nonexistent", "no such checkpoint folder"
    if kind == "empty":
        return tmp_path, "config.json: not found"
    folder = tmp_path / "m"
    shutil.copytree(tiny_dir, folder)
    if kind == "corrupt-config":
        (folder / "config.json").write_text("{not json")
        return folder, "config.json"
    f = folder / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    return folder, "model.safetensors: not a valid safetensors file"


@pytest.mark.parametrize("kind", ["missing", "empty", "corrupt-config", "truncated"])
def test_given_model_is_validated_never_swapped(kind, tiny_dir, tmp_path, capsys):
    folder, named = _broken(kind, tiny_dir, tmp_path)
    assert main(["--model", str(folder), "--prompt", "hi", "--max-tokens", "2"]) == 2
    out, err = capsys.readouterr()
    assert named in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "tokens in" not in out                                  # nothing was generated from another model
    assert "instead" not in out          # and no line said what would run on it: it was refused before that


@pytest.mark.skipif(has_gpu()[0], reason="the no-GPU line is printed only without a GPU")
def test_no_gpu_line_is_in_our_words(tiny_dir, capsys):
    main(["--model", str(tiny_dir), "--prompt", "hi", "--max-tokens", "1"])
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("no GPU (") and "Error" not in line and "detail" not in line
    main(["--model", str(tiny_dir), "--prompt", "hi", "--max-tokens", "1", "--verbose"])
    assert "  detail: " in capsys.readouterr().out


@pytest.mark.parametrize("size, line", [
    ("3", "error: --tensor-parallel-size 3: tensor_parallel_size=3 does not divide num_attention_heads=4\n"),
    ("0", "error: --tensor-parallel-size 0: tensor_parallel_size=0 must be an integer >= 1\n"),
])
def test_a_tensor_parallel_size_that_cannot_split_the_model_is_one_line(tiny_dir, capsys, size, line):
    if not has_gpu()[0]:
        line = f"error: --tensor-parallel-size {size} splits the model over GPUs; this machine has none\n"
    assert main(["--model", str(tiny_dir), "--prompt", "hi", "--max-tokens", "1", "-tp", size]) == 2
    out, err = capsys.readouterr()
    assert err == line and "tokens in" not in out


def test_more_gpus_than_the_machine_has_is_one_line(tiny_dir, capsys):
    from common.device import gpu_count

    n = gpu_count() + 2                       # tiny's 4 heads split over 2 ranks; over 4 where there are 2 GPUs
    assert main(["--model", str(tiny_dir), "--prompt", "hi", "--max-tokens", "1", "--tensor-parallel-size",
                 str(n if n in (2, 4) else 4)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --tensor-parallel-size") and err.count("\n") == 1
    assert ("needs" in err and "GPUs; this machine has" in err) if has_gpu()[0] else "has none" in err
