"""python -m <this stage> --prompt TEXT [--model DIR|PRESET] [--chat] [--max-tokens N] ...: generate text,
streamed token by token, on the GPU; without one, through this stage's loop over the numpy forward (cpu_engine.py;
flags: common/cli.py)."""
from __future__ import annotations

import sys

from common.cli import generate_main


def gpu_engine(model: str, max_model_len: int | None):
    from .engine import Engine

    return Engine(model, max_model_len=max_model_len, progress=True)


def cpu_engine(model: str, max_model_len: int | None):
    from .cpu_engine import CpuEngine

    return CpuEngine(model, max_model_len=max_model_len)


def main(argv=None) -> int:
    return generate_main(__package__, gpu_engine, argv, cpu_engine)


if __name__ == "__main__":
    sys.exit(main())
