"""CPU tier: the load progress bar of every stage redraws in place on a terminal and writes only its final line
to a log file (a CLI run under `tee` once logged a hundred carriage-return redraws per load)."""
import importlib
import io
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = sorted(p.name for p in ROOT.glob("stage[0-9][0-9]_*") if (p / "weights.py").exists())


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("stream", [io.StringIO, Terminal])
def test_progress_draws_a_terminal_bar_and_logs_one_line(stage, stream, monkeypatch):
    err = stream()
    monkeypatch.setattr("sys.stderr", err)
    total = 1 << 30
    bar = importlib.import_module(f"{stage}.weights")._Progress(total, enabled=True)
    for i in range(1, 201):
        bar.update(total * i // 200)
    bar.close()
    text = err.getvalue()
    assert text.rstrip("\n").split("\r")[-1].startswith("  loading [" + "#" * 25 + "] 100%   1.07/1.07 GB")
    if stream is Terminal:
        assert text.count("\r") == 101 and text.count("\n") == 1          # 0% .. 100%, each drawn once
    else:
        assert "\r" not in text and text.count("\n") == 1
