"""What the harness and the stages' pytest-benchmark files measure with: file read rate, device memory in use,
the GPU/host split of a queued step, tok/s of one generate(), the waste counters and growth rates.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from common.bench.workloads import BATCH_SIZES, GROWTH_LENGTHS


def plain_read_gbps(files: list[Path], buf: np.ndarray | None = None, repeats: int = 3) -> float:
    """Read the files' bytes into one buffer, already faulted in: the floor any loader that reads them pays."""
    total = sum(f.stat().st_size for f in files)
    if buf is None:
        buf = np.ones(total, dtype=np.uint8)   # ones, not empty: touch every page before the clock starts
    times = []
    for _ in range(repeats):
        t, pos = time.perf_counter(), 0
        for f in files:
            with open(f, "rb", buffering=0) as fh:
                pos += fh.readinto(memoryview(buf)[pos:])
        times.append(time.perf_counter() - t)
    return total / statistics.median(times) / 1e9


def device_memory_used() -> int | None:
    """Bytes in use on device 0 as the driver sees them (every process, every allocator pool), or None without a
    GPU. The primary context is retained first, so the figure after an engine starts counts the engine, not it."""
    try:
        from cuda.bindings import driver

        from common.device import check

        check(driver.cuInit(0), "cuInit")
        dev = check(driver.cuDeviceGet(0), "cuDeviceGet")
        check(driver.cuCtxSetCurrent(check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")),
              "cuCtxSetCurrent")
        free, total = check(driver.cuMemGetInfo(), "cuMemGetInfo")
        return int(total) - int(free)
    except Exception:
        return None


def warm_up(engine, workload: str, prompts, params, full: bool) -> None:
    """Compile the kernels and touch every shape the timed runs use, a few tokens each: every batch size (the
    first timed run was seen 13-31% slower without it at B = 64..8), and for `long` the whole prompt (warmed on
    a 128-token prompt, HF's first 2048- and 8192-token prefills were 2-4x slower than the next). `full`: the
    first request as timed (hf-compile compiles and captures the decode step for its cache length)."""
    def short(p):
        return replace(p, max_tokens=min(4, p.max_tokens))

    if full:
        engine.generate(prompts[:1], params[0])
    elif workload == "long":
        engine.generate(prompts[:1], replace(params[0], max_tokens=2))
    else:
        for n in (BATCH_SIZES if workload == "batch" else (min(len(prompts), 64),)):
            engine.generate(prompts[:n], [short(p) for p in params[:n]])


def generate_once(engine, prompts, params) -> tuple[float, list]:
    """Generated tokens per second of one generate(prompts, params), and the engine's per-request Timings. An
    engine with a prefix cache starts it empty (vLLM's reset_prefix_cache): a repeat of the same requests, or the
    warm-up's, would otherwise find every block computed and measure nothing but the cache."""
    reset = getattr(engine, "reset_prefix_cache", None)
    if reset is not None:
        reset()
    t = time.perf_counter()
    outs = engine.generate(prompts, params)
    rate = sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t)
    return rate, list(getattr(engine, "timings", []))


def chat_once(engine, conversations) -> dict:
    """Conversations through the step API, as a chat client sends them: every conversation's first turn at once,
    each later turn when the answer before it has finished, its prompt every earlier message and answer followed
    by its own message. The total time, output tok/s, and the median time to first token of each turn (from the
    turn's add_request to its first token). The prefix cache, where there is one, starts empty."""
    reset = getattr(engine, "reset_prefix_cache", None)
    if reset is not None:
        reset()
    history = [[] for _ in conversations]                 # each conversation's messages and answers so far
    turn, sent, ttft = [0] * len(conversations), {}, [[] for _ in conversations[0]]
    generated = 0

    def send(c: int) -> None:
        message, params = conversations[c][turn[c]]
        history[c] = history[c] + message
        rid = engine.add_request(history[c], params, request_id=f"chat-{c}-{turn[c]}", detokenize=False)
        sent[rid] = (c, time.perf_counter())

    t0 = time.perf_counter()
    for c in range(len(conversations)):
        send(c)
    while engine.has_unfinished_requests():
        for out in engine.step():
            c, at = sent[out.request_id]
            if at is not None and out.new_token_ids:        # the turn's first token
                ttft[turn[c]].append(time.perf_counter() - at)
                sent[out.request_id] = (c, None)
            if out.finished:
                history[c] = history[c] + list(out.token_ids)
                generated += len(out.token_ids)
                turn[c] += 1
                if turn[c] < len(conversations[c]):
                    send(c)
    total = time.perf_counter() - t0
    return {"total_s": total, "output_tok_per_s": generated / total,
            **{f"ttft_ms_turn{k + 1}": 1e3 * statistics.median(v) for k, v in enumerate(ttft) if v}}


def waste(engine) -> dict:
    """A batching engine's counts of the last generate() (its `stats`), where it keeps them."""
    stats = getattr(engine, "stats", None)
    out = {k: getattr(stats, k) for k in ("batches", "slot_waste", "padding_share", "prefill_time_share",
                                          "host_time_share", "max_running", "preemptions") if hasattr(stats, k)}
    if getattr(stats, "steps", 0) and hasattr(stats, "slot_steps_held"):   # sequences running, step by step
        out["mean_running"] = stats.slot_steps_held / stats.steps
    return out


def growth_rates(timings) -> dict:
    """Decode tok/s over the first n new tokens, n in GROWTH_LENGTHS (tokens 2..n come from decode steps);
    the median over the requests' Timings."""
    return {f"decode_tok_per_s_at_{n}": statistics.median((n - 1) / sum(t.step_s[:n - 1]) for t in timings)
            for n in GROWTH_LENGTHS}


def gpu_and_host_ms(gpu, enqueue, repeats: int = 5) -> dict:
    """Split one unit of queued GPU work (`enqueue()`, which must not wait for the GPU) into GPU time and the
    host's time to queue it. A spin kernel holds the GPU while the host queues, so the events around the work
    see it back to back, without launch gaps (common/kernels/spin.cu). Medians of `repeats`."""
    from cuda.core import LaunchConfig

    from common.compile import KernelModule

    spin = KernelModule(Path(__file__).parents[1] / "kernels" / "spin.cu", gpu.arch).kernel("spin")
    one = LaunchConfig(grid=1, block=1)
    gpu_ms, host_ms, hold_ns = [], [], 20_000_000
    while len(gpu_ms) < repeats:
        gpu.launch(spin, one, np.uint64(hold_ns))
        t = time.perf_counter()
        start = gpu.record()
        enqueue()
        end = gpu.record()
        queued = time.perf_counter() - t
        end.sync()
        if queued * 1e9 > 0.8 * hold_ns:           # the GPU caught up with the host: hold it longer, retry
            hold_ns *= 2
            continue
        gpu_ms.append(end - start)
        host_ms.append(queued * 1e3)
    return {"gpu_ms": statistics.median(gpu_ms), "host_queue_ms": statistics.median(host_ms)}
