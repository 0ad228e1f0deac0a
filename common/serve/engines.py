"""Which engine `python -m common.serve` serves, and how it is built: in a module of its own, not in __main__,
because --engine-process sends build_engine to a spawned child by reference (module and name), and a child cannot
import the parent's __main__ when it was started with -m."""
from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

STEP_API = ("add_request", "step", "abort_request", "has_unfinished_requests", "num_requests", "kv_cache_usage")


class EngineOptionError(ValueError):
    """A --stage or an engine option the server cannot serve: one line on the command line, exit 2."""


def has_step_api(module: str) -> bool:
    return all(hasattr(importlib.import_module(module).Engine, a) for a in STEP_API)


def build_engine(stage: str | None, model: str, max_model_len: int | None, options: dict | None = None):
    """The engine to serve. `options` (vLLM's names: max_num_seqs, gpu_memory_utilization, block_size, ...) go to
    its constructor; one it does not take is refused, naming it and the engine (a silently ignored
    --gpu-memory-utilization would let two servers fight over one GPU)."""
    from common.device import has_gpu

    usable, why = has_gpu()
    cls, name = engine_class(stage, gpu=usable)
    if not usable:
        print(f"{why}: serving {name}'s loop over the numpy forward (cpu_engine.py) on {model}", file=sys.stderr)
        name = f"{name}'s CPU engine"
    return _construct(cls, name, model, max_model_len, options)


def engine_class(stage: str | None, gpu: bool = True) -> tuple[type, str]:
    """The Engine class of stage NN (None: the newest stage that has the step API), or with gpu=False the
    stage's CpuEngine (its own loop over the numpy forward, for a machine without a GPU), and its module's name."""
    if stage is None:
        root = Path(__file__).resolve().parents[2]
        names = sorted(p.name for p in root.glob("stage[0-9][0-9]_*") if (p / "__init__.py").exists())
        name = [n for n in names if has_step_api(n)][-1]
    else:
        name = check_stage(stage)
    if gpu:
        return importlib.import_module(name).Engine, name
    return importlib.import_module(f"{name}.cpu_engine").CpuEngine, name


def check_stage(stage: str) -> str:
    """The module of stage NN, which must exist and have the step API (checked on any machine: a CPU serves the
    same --stage values a GPU does)."""
    from common.bench.harness import BASELINES, UnknownEngine, stage_module

    try:
        name = stage_module(stage) if stage not in BASELINES else None
    except UnknownEngine:                    # no such stage folder
        name = None
    if name is None:
        raise EngineOptionError(f"--stage {stage}: no such stage (stage numbers from 05 on, e.g. --stage 05)")
    if not has_step_api(name):
        raise EngineOptionError(f"--stage {stage}: {name} has no step API (add_request / step / abort_request); "
                                "stage05 and later have it")
    return name


def refused_options(cls, options: dict | None) -> list[str]:
    """The options given (not None) that the engine class's constructor does not take, sorted."""
    return sorted({k for k, v in (options or {}).items() if v is not None} - set(inspect.signature(cls).parameters))


def gpu_only_options(stage: str | None, options: dict | None) -> list[str]:
    """The options given that the stage's GPU engine takes and its CPU engine (its loop over the numpy forward)
    does not: on a machine without a GPU, what the command asks for cannot run there."""
    on_cpu = refused_options(engine_class(stage, gpu=False)[0], options)
    return [k for k in on_cpu if k not in refused_options(engine_class(stage)[0], options)]


def _construct(cls, name: str, model: str, max_model_len: int | None, options: dict | None):
    options = {k: v for k, v in (options or {}).items() if v is not None}
    refused = refused_options(cls, options)
    if refused:
        raise EngineOptionError(f"{name} takes no {', '.join('--' + k.replace('_', '-') for k in refused)}")
    return cls(model, max_model_len=max_model_len, **options)
