"""python -m <this stage> prints a model card, with or without a GPU."""
from common.device import has_gpu
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
