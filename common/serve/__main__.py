"""python -m common.serve [--stage 05] [--model DIR|PRESET] [--host 127.0.0.1] [--port 8000] [--max-model-len N]
                         [--max-num-seqs N] [--gpu-memory-utilization F] [--kv-cache-memory-bytes N] [--block-size N]
                         [--no-engine-process]

Serves the newest stage with the step API, or the one named; on a machine without a GPU, that stage's own loop
over the numpy forward (its cpu_engine.py; and says so), on the tiny preset unless --model names another, as
every stage's command line. The engine
runs in a process of its own (engine_process.py), or with --no-engine-process on a thread of the server's process.
A bad flag, model or engine option is one line and exit 2."""
from __future__ import annotations

import argparse
import sys

# flag -> (the least value it takes, the greatest): checked before any engine is built
BOUNDS = {"port": (1, 65535), "max_model_len": (2, None), "max_num_seqs": (1, None),
          "max_num_batched_tokens": (1, None), "kv_cache_memory_bytes": (1, None), "block_size": (1, None),
          "max_waiting": (0, None)}


def check_flags(a, model: str, options: dict | None = None) -> None:
    """Every flag, and the model's folder and config (a preset is written on first use), before an engine is
    built: the engine's process would say the same, after its start. On a machine without a GPU, an option only
    the stage's GPU engine takes (--gpu-memory-utilization, --tensor-parallel-size) is refused in one line that
    says what runs here instead: nothing is served in its place."""
    from common.checkpoint import Checkpoint
    from common.device import has_gpu
    from common.synthetic import resolve_model

    from .engines import EngineOptionError, check_stage, engine_class, gpu_only_options

    for name, (low, high) in BOUNDS.items():
        value = getattr(a, name)
        if value is not None and (value < low or high is not None and value > high):
            raise EngineOptionError(f"--{name.replace('_', '-')} {value}: must be "
                                    + (f"in [{low}, {high}]" if high is not None else f">= {low}"))
    if a.gpu_memory_utilization is not None and not 0 < a.gpu_memory_utilization <= 1:
        raise EngineOptionError(f"--gpu-memory-utilization {a.gpu_memory_utilization}: must be in (0, 1]")
    if a.stage is not None:
        check_stage(a.stage)
    if (a.tensor_parallel_size or 1) > 1 and a.engine_process:
        raise EngineOptionError(f"--tensor-parallel-size {a.tensor_parallel_size} starts a process a GPU, which the "
                                "engine's own process may not: add --no-engine-process")
    usable, why = has_gpu()
    if not usable and (gpu_only := gpu_only_options(a.stage, options)):
        name = engine_class(a.stage, gpu=False)[1]
        flags = " and ".join("--" + k.replace("_", "-") for k in gpu_only)
        one = len(gpu_only) == 1
        raise EngineOptionError(f"{flags} {'is a GPU engine option' if one else 'are GPU engine options'} and this "
                                f"machine has no GPU ({why}): without {'it' if one else 'them'}, the server runs "
                                f"{name}'s loop over the numpy forward (cpu_engine.py) on {model}")
    Checkpoint(resolve_model(model))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m common.serve", description=__doc__.splitlines()[0])
    ap.add_argument("--stage", help="a stage number from 05 on (default: the newest)")
    ap.add_argument("--model", help="a checkpoint folder or a preset name (default: llama-3.2-1b on a GPU, tiny "
                                    "without one)")
    ap.add_argument("--served-model-name", help="the name clients send as `model` (default: --model)")
    ap.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: %(default)s)")
    ap.add_argument("--port", type=int, default=8000, help="(default: %(default)s)")
    ap.add_argument("--max-model-len", type=int,
                    help="the longest prompt plus output (default: the model's, at most 4096)")
    engine = ap.add_argument_group("engine options (vLLM's names; a stage that does not take one refuses it)")
    engine.add_argument("--max-num-seqs", type=int, help="sequences running at once (seq_slots)")
    engine.add_argument("--max-num-batched-tokens", type=int, help="rows of one forward: the token budget")
    engine.add_argument("--gpu-memory-utilization", type=float, help="the share of the GPU the engine may use")
    engine.add_argument("--kv-cache-memory-bytes", type=int, help="the KV cache's size (a paged engine's pool)")
    engine.add_argument("--block-size", type=int, help="positions per KV cache block (a paged engine)")
    engine.add_argument("--tensor-parallel-size", "-tp", type=int,
                        help="GPUs to split every layer over, a process each (needs --no-engine-process)")
    ap.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=True,
                    help="run the engine in a process of its own (engine_process.py; the default, as vLLM's "
                         "engine core), or with --no-engine-process on a thread of the server's")
    ap.add_argument("--max-waiting", type=int, default=1024,
                    help="requests queued for a seq_slot beyond which a new one gets 503 (default 1024)")
    a = ap.parse_args(argv)
    from common.cli import NO_GPU_PRESET
    from common.device import GpuMemoryError, has_gpu
    from common.synthetic import DEFAULT_PRESET

    from .app import build_app
    from .engine_loop import EngineLoop
    from .engine_process import EngineProcess, EngineStartError
    from .engines import build_engine
    from .server import Server

    model = a.model or (DEFAULT_PRESET if has_gpu()[0] else NO_GPU_PRESET)
    options = {k: getattr(a, k) for k in ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
                                          "kv_cache_memory_bytes", "block_size", "tensor_parallel_size")}
    try:
        check_flags(a, model, options)
        engine = (EngineProcess(build_engine, a.stage, model, a.max_model_len, options) if a.engine_process
                  else build_engine(a.stage, model, a.max_model_len, options))
    except (ValueError, GpuMemoryError, MemoryError, EngineStartError) as e:
        cause = e.__cause__ if isinstance(e, EngineStartError) else e
        sized = isinstance(cause, MemoryError) and bool(cause.args)   # a CPU engine's KV cache too small for one
        if not (isinstance(cause, (ValueError, GpuMemoryError)) or sized):
            raise                            # not the user's error: the traceback is the report
        print(f"error: {cause}", file=sys.stderr)
        return 2
    loop = EngineLoop(engine)
    loop.start()
    try:
        Server(build_app(loop, a.served_model_name or model, a.max_waiting), loop, host=a.host,
               port=a.port).run()
    except KeyboardInterrupt:      # uvicorn re-raises Ctrl-C once it has shut down: that is the normal exit
        pass
    finally:
        loop.stop()
        if a.engine_process:
            engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
