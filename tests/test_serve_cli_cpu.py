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
def test_a_gpu_option_on_a_cpu_says_what_runs_here_instead_in_one_line_and_exit_2(tiny_dir, where):
    """A GPU engine's option on a machine without a GPU serves nothing: one line, before any engine is announced,
    naming what the same command without it runs here."""
    done = run_cli("--model", str(tiny_dir), "--gpu-memory-utilization", "0.5", "--port", "1", *where)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert re.fullmatch(r"error: --gpu-memory-utilization is a GPU engine option and this machine has no GPU "
                        r"\(.+\): without it, the server runs stage\d\d_\w+'s loop over the numpy forward "
                        r"\(cpu_engine\.py\) on .+", done.stderr.strip()), done.stderr


@pytest.mark.skipif(has_gpu()[0], reason="the CPU engines' own refusals")
def test_an_option_neither_engine_of_the_stage_takes_names_the_engine(capsys, tiny_dir):
    """--block-size is no GPU option: stage05 has no blocks on either machine, and its CPU engine says so."""
    assert main(["--model", str(tiny_dir), "--stage", "05", "--block-size", "8", "--no-engine-process"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == \
        "error: stage05_continuous_batch's CPU engine takes no --block-size"


@pytest.mark.skipif(has_gpu()[0], reason="the CPU engine's KV cache")
@pytest.mark.parametrize("where", [[], ["--no-engine-process"]])
def test_a_cpu_kv_cache_too_small_for_one_sequence_is_one_line_and_exit_2(tiny_dir, where):
    """The CPU engine's MemoryError for a --kv-cache-memory-bytes that holds nothing was a traceback."""
    done = run_cli("--model", str(tiny_dir), "--stage", "05", "--kv-cache-memory-bytes", "1000", "--port", "1",
                   *where)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: kv_cache_memory_bytes=1000 holds 0 seq_slots")
