"""python -m <this stage> prints a model card, with or without a GPU."""
import pytest

from common.cli import NO_GPU_PRESET
from common.device import has_gpu

from .. import __main__ as cli
from ..__main__ import main


def test_model_card_on_tiny(tiny_dir, capsys):
    assert main(["--model", str(tiny_dir)]) == 0
    out = capsys.readouterr().out
    assert "2 layers, hidden 64" in out and "total" in out and "GB in bf16" in out
    if has_gpu()[0]:
        assert "tensors on the GPU equal the file bytes" in out
    else:
        assert out.count("no GPU") == 1


def test_bad_folder_is_one_clear_line(tmp_path, capsys):
    assert main(["--model", str(tmp_path)]) == 2
    assert "config.json: not found" in capsys.readouterr().err


def test_prompt_shows_ids_and_gpu_rows(tiny_dir, capsys):
    assert main(["--model", str(tiny_dir), "--prompt", "Hello, world!", "--chat"]) == 0
    out = capsys.readouterr().out
    if has_gpu()[0]:
        assert "prompt     " in out and "rows equal the file's: True" in out
    else:   # tokenising needs no GPU: the ids are shown on any machine
        assert "no GPU" in out and "prompt     " in out and "(tokenised on the CPU)" in out
        assert "Error" not in out.split("no GPU")[1].splitlines()[0]   # the reason in the project's words


def test_prompt_that_is_not_utf8_is_one_line_naming_the_flag(tiny_dir, capsys):
    """A shell's $'ok\\xff' reaches Python as a lone surrogate; the tokenizer raised a TypeError on it."""
    assert main(["--model", str(tiny_dir), "--prompt", "ok\udcff"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --prompt: not valid UTF-8 text (byte 0xff at character 2)\n", err


def test_without_a_gpu_the_default_model_is_the_one_help_names(tiny_dir, capsys, monkeypatch):
    """--help promises the tiny preset without a GPU (add_model_flags is every stage's): the model card is tiny's,
    not the 2.47 GB 1B-shape checkpoint written to be validated."""
    with pytest.raises(SystemExit):
        main(["--help"])
    assert f"{NO_GPU_PRESET} without one" in " ".join(capsys.readouterr().out.split())
    asked = []
    monkeypatch.setattr(cli, "has_gpu", lambda: (False, "no GPU in this test"))
    monkeypatch.setattr(cli, "resolve_model", lambda model: asked.append(model) or tiny_dir)
    assert main([]) == 0
    assert asked == [NO_GPU_PRESET] and f"[{NO_GPU_PRESET}] synthetic checkpoint" in capsys.readouterr().out
