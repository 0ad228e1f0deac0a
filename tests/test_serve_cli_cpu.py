"""CPU tier: `python -m common.serve` refuses a bad flag, model or engine option with one line and exit 2, before
it serves anything (as every stage's command line does), whether the engine would have run in its own process or
on a thread."""
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("uvicorn", reason="the server needs fastapi and uvicorn (the serve extra)")

from common.device import has_gpu
from common.serve.__main__ import main


@pytest.mark.parametrize("argv, words", [
    (["--port", "70000"], "--port 70000: must be in [1, 65535]"),
    (["--port", "0"], "--port 0: must be in [1, 65535]"),
    (["--stage", "99"], "--stage 99: no such stage"),
    (["--stage", "03"], "--stage 03: stage03_kvcache has no step API"),
    (["--max-model-len", "-5"], "--max-model-len -5: must be >= 2"),
    (["--max-num-seqs", "0"], "--max-num-seqs 0: must be >= 1"),
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization 1.5: must be in (0, 1]"),
    (["--max-waiting", "-1"], "--max-waiting -1: must be >= 0"),
    (["--tensor-parallel-size", "2"], "--tensor-parallel-size 2 starts a process a GPU, which the engine's own "
                                      "process may not: add --no-engine-process"),
])
def test_a_bad_flag_is_one_line_and_exit_2(capsys, tiny_dir, argv, words):
    assert main(["--model", str(tiny_dir), *argv]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {words}" + err.split(words, 1)[1] and err.count("\n") == 1, err


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "common.serve", *argv], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.mark.parametrize("where", [[], ["--no-engine-process"]])
def test_a_model_that_is_not_there_is_one_line_and_exit_2(tmp_path, where):
    done = run_cli("--model", str(tmp_path / "nowhere"), "--port", "1", *where)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr == f"error: {tmp_path / 'nowhere'}: no such checkpoint folder\n"


@pytest.mark.skipif(has_gpu()[0], reason="on a GPU the stage's engine takes --gpu-memory-utilization")
@pytest.mark.parametrize("where", [[], ["--no-engine-process"]])
def test_an_option_the_numpy_engine_does_not_take_is_one_line_and_exit_2(tiny_dir, where):
    done = run_cli("--model", str(tiny_dir), "--gpu-memory-utilization", "0.5", "--port", "1", *where)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert re.fullmatch(r"error: stage\d\d_\w+'s CPU engine takes no --gpu-memory-utilization",
                        done.stderr.strip().splitlines()[-1]), done.stderr
