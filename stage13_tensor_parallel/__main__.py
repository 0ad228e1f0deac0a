"""python -m <this stage> --prompt TEXT [--model DIR|PRESET] [--tensor-parallel-size N] [--chat] ...: generate
text, streamed token by token, on the GPU (split over N GPUs); without one, through this stage's loop over the numpy
forward (cpu_engine.py; flags: common/cli.py)."""
from __future__ import annotations

import sys

from common.checkpoint import Checkpoint
from common.cli import FlagError, generate_main
from common.synthetic import resolve_model


def engine_flags(ap) -> list[str]:
    ap.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                    help="GPUs to split every layer over, one process each (default %(default)s)")
    return ["tensor_parallel_size"]


def check_split(model: str, size: int) -> None:
    """A size that cannot split the model, or more GPUs than the machine has: a FlagError, before any GPU work."""
    from common.device import gpu_count

    from .tensor_parallel import plan

    try:
        plan(Checkpoint(resolve_model(model)).config, size)
    except ValueError as e:
        raise FlagError(f"--tensor-parallel-size {size}: {e}") from None
    if size > (have := gpu_count()):
        raise FlagError(f"--tensor-parallel-size {size} needs {size} GPUs; this machine has {have}")


def gpu_engine(model: str, max_model_len: int | None, tensor_parallel_size: int = 1):
    from .engine import Engine

    check_split(model, tensor_parallel_size)
    return Engine(model, max_model_len=max_model_len, tensor_parallel_size=tensor_parallel_size, progress=True)


def cpu_engine(model: str, max_model_len: int | None, tensor_parallel_size: int = 1):
    from .cpu_engine import CpuEngine

    if tensor_parallel_size != 1:
        raise FlagError(f"--tensor-parallel-size {tensor_parallel_size} splits the model over GPUs; this machine "
                        "has none")
    return CpuEngine(model, max_model_len=max_model_len)


def main(argv=None) -> int:
    from .ranks import RankError

    try:
        return generate_main(__package__, gpu_engine, argv, cpu_engine, engine_flags)
    except RankError as e:                       # a rank failed: the engine has stopped every rank
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
