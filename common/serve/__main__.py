"""python -m common.serve [--stage 05] [--model DIR|PRESET] [--host 127.0.0.1] [--port 8000] [--max-model-len N]

Serves the newest stage with the step API, or the one named; on a machine without a GPU, the numpy reference
engine (and says so). The engine runs on a thread of the server's process, or with --engine-process in a process
of its own (engine_process.py)."""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

STEP_API = ("add_request", "step", "abort_request", "has_unfinished_requests", "num_requests", "kv_cache_usage")


def has_step_api(module: str) -> bool:
    return all(hasattr(importlib.import_module(module).Engine, a) for a in STEP_API)


def build_engine(stage: str | None, model: str, max_model_len: int | None):
    from common.bench import stage_module
    from common.device import has_gpu

    usable, why = has_gpu()
    if not usable:
        from common.reference import ReferenceEngine

        print(f"{why}: serving the numpy reference engine on {model} (slow; for tests and reading)",
              file=sys.stderr)
        return ReferenceEngine(model, max_model_len=max_model_len)
    if stage is None:          # the newest stage that has the API
        root = Path(__file__).resolve().parents[2]
        names = sorted(p.name for p in root.glob("stage[0-9][0-9]_*") if (p / "__init__.py").exists())
        name = [n for n in names if has_step_api(n)][-1]
    elif not has_step_api(name := stage_module(stage)):
        raise SystemExit(f"--stage {stage}: {name} has no step API (add_request / step / abort_request); "
                         "stage05 and later have it")
    return importlib.import_module(name).Engine(model, max_model_len=max_model_len)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m common.serve", description=__doc__.splitlines()[0])
    ap.add_argument("--stage", help="a stage number from 05 on (default: the newest)")
    ap.add_argument("--model", default="llama-3.2-1b", help="a checkpoint folder or a preset name")
    ap.add_argument("--served-model-name", help="the name clients send as `model` (default: --model)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-model-len", type=int)
    ap.add_argument("--engine-process", action="store_true",
                    help="run the engine in a process of its own (engine_process.py), not on a thread of the "
                         "server's")
    ap.add_argument("--max-waiting", type=int, default=1024,
                    help="requests queued for a seq_slot beyond which a new one gets 503 (default 1024)")
    a = ap.parse_args(argv)
    from .app import build_app
    from .engine_loop import EngineLoop
    from .engine_process import EngineProcess
    from .server import Server

    engine = (EngineProcess(build_engine, a.stage, a.model, a.max_model_len) if a.engine_process
              else build_engine(a.stage, a.model, a.max_model_len))
    loop = EngineLoop(engine)
    loop.start()
    try:
        Server(build_app(loop, a.served_model_name or a.model, a.max_waiting), loop, host=a.host,
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
