"""Per-kernel profile of decode steps, each kernel against its floor: the bytes it must move at the measured
copy bandwidth.

    python -m common.profile --stage 08 --workload latency          (batch 1, as the `latency` workload)
    python -m common.profile --stage 08 --batch 64 --enforce-eager  (the same stage launching kernel by kernel)

B requests of `--cache-length` prompt tokens (1B preset) are prefilled; then `--steps` decode steps run through
the engine's own step(), with CUPTI's activity API (NVIDIA's cupti-python) recording every kernel the GPU runs,
inside CUDA graphs too. Each kernel is named by what it computes: this project's kernels by their own names,
cuBLAS's by their place in the step (every layer's qkv, o, gate_up and down GEMMs in that order, then the LM
head; a split-K reduction belongs to the GEMM before it). The floor of each group is computed from the model's
shapes, B and the rows' cache lengths:

    GEMM        weight N x K bf16 read once, plus the rows' inputs and outputs
    norms       x read (and written back, add_rms_norm), the sublayer's output read, h written
    rope        the q and k heads read and written, cos and sin read
    kv_write    k and v read, written into the cache
    rope + kv_write   the two in one kernel (FUSED): their floors added
    attention   the queries read, every cached key and value of each row read, the output written (the
                flash-decoding combine is part of it: its partials are traffic a perfect kernel would not make)
    silu_mul    gate and up read, the product written
    embedding   the rows gathered: read and written (the token embedding, and the logit rows' gather)
    sample      the logits read

A kernel's time is its time on the step's critical path (exposed_ns: kernels launched early overlap the one
before, and are counted from its end). A step's figures: its wall time (host, through step()), the GPU's span
(first kernel start to last kernel end), the kernels' critical-path and start-to-end times, and the sum of
the floors; medians over the steps. An engine that can schedule
asynchronously is profiled with async_scheduling=False, so that each step() call's window holds its own step's
kernels and no other; its wall time is then the step without the overlap (the `latency` workload measures it
with it). Writes <gpu>_<date>_profile-<stage>-b<B>[-eager]_<time>.json into --out.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import inspect
import json
import statistics
import sys
import time
from pathlib import Path

from common.synthetic import resolve_model

GEMMS = ("qkv", "o", "gate_up", "down")
GROUP_OF = {"rms_norm": "norms", "add_rms_norm": "norms", "rope_inplace": "rope", "kv_write": "kv_write",
            "rope_kv_write": "rope + kv_write", "attention_combine": "attention", "silu_mul": "silu_mul",
            "embedding_gather": "embedding", "sample_tokens": "sample", "block_table_write": "block tables"}
FUSED = {"rope + kv_write": ("rope", "kv_write")}   # one kernel doing the work of two groups: their floors added
ORDER = ["embedding", "norms", "gemm qkv", "rope", "kv_write", "rope + kv_write", "attention", "gemm o",
         "gemm gate_up", "silu_mul", "gemm down", "gemm lm_head", "sample", "block tables"]


def group_of(name: str) -> str | None:
    """This project's kernels by name (attention kernels by prefix); None for a cuBLAS kernel."""
    if name in GROUP_OF:
        return GROUP_OF[name]
    if name.startswith("attention"):
        return "attention"
    return None


def label_step(names: list[str], num_layers: int) -> list[str]:
    """The group of each kernel of one decode step, in launch order: cuBLAS kernels take the next GEMM of the
    step's fixed order (a reduction kernel stays with the GEMM before it)."""
    gemms = [f"gemm {g}" for _ in range(num_layers) for g in GEMMS] + ["gemm lm_head"]
    labels, k = [], -1
    for name in names:
        group = group_of(name)
        if group is None:
            if "reduce" not in name.lower() or k < 0:
                k += 1
            if k >= len(gemms):
                raise ValueError(f"more cuBLAS kernels than the step's {len(gemms)} GEMMs: {name}")
            group = gemms[k]
        labels.append(group)
    return labels


def floor_bytes(config, rows: int, keys: list[int]) -> dict[str, int]:
    """Bytes each group must move in one decode step of `rows` rows whose cache lengths (keys attended) are
    `keys`; bf16 activations and weights, f32 logits."""
    c = config
    H, nh, nkv, hd, inter, V = (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                c.intermediate_size, c.vocab_size)
    L, b = c.num_hidden_layers, 2
    shapes = {"qkv": ((nh + 2 * nkv) * hd, H), "o": (H, nh * hd), "gate_up": (2 * inter, H), "down": (H, inter)}
    out = {f"gemm {g}": L * (n * k + rows * (n + k)) * b for g, (n, k) in shapes.items()}
    out["gemm lm_head"] = V * H * b + rows * H * b + rows * V * 4
    out["norms"] = (2 * L + 1) * H * b + rows * H * b * (2 + 4 * 2 * L)   # rms_norm once; add_rms_norm 2L times
    out["rope"] = L * rows * ((nh + nkv) * hd * b * 2 + hd * 4)
    out["kv_write"] = L * rows * 2 * nkv * hd * b * 2
    out["attention"] = L * (rows * nh * hd * b * 2 + sum(keys) * nkv * hd * b * 2)
    out["silu_mul"] = L * rows * 3 * inter * b
    out["embedding"] = 2 * rows * H * b * 2
    out["sample"] = rows * V * 4
    out["block tables"] = 0
    for fused, parts in FUSED.items():
        out[fused] = sum(out[p] for p in parts)
    return out


class KernelRecorder:
    """CUPTI's kernel records between start() and stop(): (start ns, end ns, name), in the GPU's order."""

    def __init__(self):
        from cupti import cupti

        self.cupti, self.kernels = cupti, []

        def requested():
            return 8 << 20, 0                       # buffer bytes, no record limit

        def completed(activities):
            for a in activities:
                if a.kind == cupti.ActivityKind.CONCURRENT_KERNEL:
                    self.kernels.append((a.start, a.end, a.name))

        cupti.activity_register_callbacks(requested, completed)

    def start(self):
        self.cupti.activity_enable(self.cupti.ActivityKind.CONCURRENT_KERNEL)

    def stop(self):
        self.cupti.activity_flush_all(1)
        self.cupti.activity_disable(self.cupti.ActivityKind.CONCURRENT_KERNEL)
        return sorted(self.kernels)

    def now(self) -> int:
        return self.cupti.get_timestamp()


def exposed_ns(kernels: list[tuple]) -> list[int]:
    """Each kernel's time on the step's critical path: from the later of its start and the previous kernel's end
    to its own end. Kernels launched early (programmatic dependent launch) start while the one before still runs
    and wait for it inside, so their start-to-end durations overlap and add up to more than the step; this
    counts each nanosecond of the step once, for the kernel that finishes in it. Without overlap it is the
    kernel's duration. kernels: (start ns, end ns, name) in the stream's order."""
    out, prev_end = [], None
    for s, e, _ in kernels:
        out.append(max(0, e - (s if prev_end is None else max(s, prev_end))))
        prev_end = e if prev_end is None else max(e, prev_end)
    return out


def profile(stage: str, batch: int, cache_length: int, steps: int, enforce_eager: bool) -> dict:
    from common.device import get_gpu
    from common.sampling import SamplingParams

    module = importlib.import_module(stage)
    kwargs = {"max_model_len": 2048, "max_num_seqs": max(batch, 1)}
    if enforce_eager:
        if "enforce_eager" not in inspect.signature(module.Engine).parameters:
            raise SystemExit(f"{stage} has no enforce_eager: it launches kernel by kernel already")
        kwargs["enforce_eager"] = True
    if "async_scheduling" in inspect.signature(module.Engine).parameters:
        kwargs["async_scheduling"] = False          # one step's kernels in each window (the docstring says why)
    engine = module.Engine(str(resolve_model("llama-3.2-1b")), **kwargs)
    config, gpu = engine.config, get_gpu()
    greedy = SamplingParams(max_tokens=steps + 64, temperature=0.0, ignore_eos=True)
    prompt = [128000] + [1000 + i % 5000 for i in range(cache_length - 1)]
    for _ in range(batch):
        engine.add_request(prompt, greedy)
    outs = []
    while len(outs) < batch or engine.num_requests()[1]:   # prefilled: every request has its first token
        outs = engine.step()
    for _ in range(8):                              # warm: every kernel loaded, every shape seen
        engine.step()
    bandwidth = gpu.copy_bandwidth_gbps()
    recorder = KernelRecorder()
    recorder.start()
    windows = []
    for _ in range(steps):
        t0, w0 = recorder.now(), time.perf_counter()
        assert len(engine.step()) == batch
        windows.append((t0, recorder.now(), time.perf_counter() - w0))
    kernels = recorder.stop()
    first_keys = cache_length + 9                   # keys attended in the first profiled step: prompt, 9 tokens
    rows = []
    for i, (t0, t1, wall) in enumerate(windows):
        mine = sorted(k for k in kernels if t0 <= k[0] <= t1)
        labels = label_step([k[2] for k in mine], config.num_hidden_layers)
        exposed = exposed_ns(mine)
        by_group: dict[str, float] = {}
        for ns, label in zip(exposed, labels):
            by_group[label] = by_group.get(label, 0.0) + ns / 1e3
        rows.append({"wall_us": wall * 1e6, "span_us": (mine[-1][1] - mine[0][0]) / 1e3,
                     "busy_us": sum(e - s for s, e, _ in mine) / 1e3, "exposed_us": sum(exposed) / 1e3,
                     "kernels": len(mine), "groups_us": by_group, "keys": first_keys + i})
    floors = floor_bytes(config, batch, [rows[len(rows) // 2]["keys"]] * batch)
    med = statistics.median
    groups = {}
    for g in ORDER:
        times = [r["groups_us"].get(g, 0.0) for r in rows]
        floor_us = floors[g] / (bandwidth * 1e9) * 1e6
        groups[g] = {"us": med(times), "us_min": min(times), "us_max": max(times), "floor_us": floor_us,
                     "bytes": floors[g]}
    return {"stage": stage, "batch": batch, "cache_length": cache_length, "steps": steps,
            "enforce_eager": enforce_eager, "gpu": gpu.name, "copy_gb_per_s": bandwidth,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "wall_us": med(r["wall_us"] for r in rows), "span_us": med(r["span_us"] for r in rows),
            "busy_us": med(r["busy_us"] for r in rows), "exposed_us": med(r["exposed_us"] for r in rows),
            "kernels_per_step": med(r["kernels"] for r in rows),
            "floor_us": sum(v for g, v in floors.items() if g not in FUSED) / (bandwidth * 1e9) * 1e6,
            "weights_floor_us": engine.checkpoint.total_bytes / (bandwidth * 1e9) * 1e6,
            "gemv_shapes": sorted(getattr(engine.model, "gemv_shapes", ())),   # (M, N, K) not through cuBLAS
            "cublaslt_shapes": {"x".join(map(str, k)): str(a)             # (M, N, K) through a timed algorithm
                                for k, a in getattr(engine.model, "lt_algos", {}).items()},
            "groups": groups, "steps_detail": rows}


def format_profile(p: dict) -> str:
    lines = [f"{p['stage']}, batch {p['batch']}, cache ~{p['cache_length']} positions"
             f"{' (enforce_eager)' if p['enforce_eager'] else ''}: medians of {p['steps']} decode steps on "
             f"{p['gpu']}, floors at {p['copy_gb_per_s']:.0f} GB/s",
             "| kernels | us a step (min-max) | floor us | x floor | GB/s |", "| --- | --- | --- | --- | --- |"]
    for g, v in p["groups"].items():
        if v["us"] == 0:                              # no kernel of it ran (its work fused into another's)
            continue
        ratio = f"{v['us'] / v['floor_us']:.1f}" if v["floor_us"] > 0.05 else "-"
        rate = f"{v['bytes'] / v['us'] / 1e3:,.0f}" if v["us"] else "-"
        lines.append(f"| {g} | {v['us']:.1f} ({v['us_min']:.1f}-{v['us_max']:.1f}) | {v['floor_us']:.1f} | "
                     f"{ratio} | {rate} |")
    total = p.get("exposed_us", p["busy_us"])        # (profiles before exposed_us: no kernel overlapped)
    lines.append(f"| **all kernels** | {total:.1f} | {p['floor_us']:.1f} | {total / p['floor_us']:.1f} | |")
    lines.append(f"step: wall {p['wall_us']:.0f} us (host, through step()), GPU span {p['span_us']:.0f} us, "
                 f"kernels {total:.0f} us on the critical path ({p['busy_us']:.0f} us start to end, overlaps "
                 f"counted twice) in {p['kernels_per_step']:.0f} kernels; floor of the weights alone "
                 f"{p['weights_floor_us']:.0f} us")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m common.profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", required=True, help="two digits: the stage folder stageNN_*")
    ap.add_argument("--workload", choices=["latency"], default="latency", help="latency: batch 1")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--cache-length", type=int, default=256, help="prompt tokens of each request")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--enforce-eager", action="store_true", help="a stage with CUDA graphs, without them")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args(argv)
    root = Path(__file__).resolve().parents[1]
    found = sorted(p.name for p in root.glob(f"stage{int(args.stage):02d}_*") if (p / "__init__.py").exists())
    if not found:
        raise SystemExit(f"no stage {args.stage} in {root}")
    try:
        import cupti  # noqa: F401
    except ImportError:
        raise SystemExit("common.profile needs NVIDIA's cupti-python (pip install cupti-python)") from None
    p = profile(found[0], args.batch, args.cache_length, args.steps, args.enforce_eager)
    print(format_profile(p))
    args.out.mkdir(parents=True, exist_ok=True)
    day, clock = p["date"][:10], p["date"][11:19].replace(":", "")
    name = (f"{p['gpu'].replace(' ', '-')}_{day}_profile-{found[0][5:7]}-b{args.batch}"
            f"{'-eager' if args.enforce_eager else ''}_{clock}.json")
    (args.out / name).write_text(json.dumps(p, indent=1) + "\n")
    print(f"wrote {args.out / name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
