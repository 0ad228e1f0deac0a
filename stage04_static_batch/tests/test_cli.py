"""python -m stage04_static_batch streams generated text; without a GPU through the numpy reference on tiny."""
from common.device import has_gpu
from stage04_static_batch.__main__ import main


def test_generates_and_reports(tiny_dir, capsys):
    assert main(["--model", str(tiny_dir), "--prompt", "Hello, world!", "--chat", "--max-tokens", "5",
                 "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert "[5 tokens in" in out and "finish_reason='length'" in out
    if not has_gpu()[0]:
        assert out.count("no GPU") == 1 and "numpy reference engine" in out


def test_prompt_longer_than_max_model_len_is_one_clear_line(tiny_dir, capsys):
    assert main(["--model", str(tiny_dir), "--prompt", "word " * 40, "--max-model-len", "16"]) == 2
    err = capsys.readouterr().err
    assert "does not fit max_model_len=16" in err and "Traceback" not in err


def test_bad_sampling_parameter_is_one_clear_line(tiny_dir, capsys):
    assert main(["--model", str(tiny_dir), "--prompt", "hi", "--top-p", "0"]) == 2
    assert "SamplingParams.top_p=0.0" in capsys.readouterr().err
