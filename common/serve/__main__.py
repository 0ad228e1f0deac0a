"""python -m common.serve [--stage 05] [--model DIR|PRESET] [--host 127.0.0.1] [--port 8000] [--max-model-len N]

Serves the newest stage with the step API, or the one named; on a machine without a GPU, the numpy reference
engine (and says so)."""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from pathlib import Path

STEP_API = ("add_request", "step", "abort_request", "has_unfinished_requests")


def stages_with_step_api() -> list[str]:
    """Stage packages (stageNN_*) whose Engine has the step API, oldest first."""
    root = Path(__file__).resolve().parents[2]
    names = sorted(m.name for m in pkgutil.iter_modules([str(root)]) if m.name[:5] == "stage" and m.name[5:7].isdigit())
    return [n for n in names if all(hasattr(importlib.import_module(n).Engine, a) for a in STEP_API)]


def build_engine(stage: str | None, model: str, max_model_len: int | None):
    from common.device import has_gpu

    usable, why = has_gpu()
    if not usable:
        from common.reference import ReferenceEngine

        print(f"{why}: serving the numpy reference engine on {model} (slow; for tests and reading)",
              file=sys.stderr)
        return ReferenceEngine(model, max_model_len=max_model_len)
    names = stages_with_step_api()
    chosen = [n for n in names if stage is None or n[5:7] == stage.zfill(2)]
    if not chosen:
        raise SystemExit(f"--stage {stage}: no stage with the step API by that number (have: {', '.join(names)})")
    return importlib.import_module(chosen[-1]).Engine(model, max_model_len=max_model_len)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m common.serve", description=__doc__.splitlines()[0])
    ap.add_argument("--stage", help="a stage number from 05 on (default: the newest)")
    ap.add_argument("--model", default="llama-3.2-1b", help="a checkpoint folder or a preset name")
    ap.add_argument("--served-model-name", help="the name clients send as `model` (default: --model)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-model-len", type=int)
    ap.add_argument("--max-waiting", type=int, default=1024,
                    help="requests queued for a seq_slot beyond which a new one gets 503 (default 1024)")
    a = ap.parse_args(argv)
    from .app import build_app
    from .engine_loop import EngineLoop
    from .server import Server

    loop = EngineLoop(build_engine(a.stage, a.model, a.max_model_len))
    loop.start()
    try:
        Server(build_app(loop, a.served_model_name or a.model, a.max_waiting), loop, host=a.host,
               port=a.port).run()
    except KeyboardInterrupt:      # uvicorn re-raises Ctrl-C once it has shut down: that is the normal exit
        pass
    finally:
        loop.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
