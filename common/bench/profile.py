"""Per-kernel profile of decode steps, each kernel against its floor: the bytes it must move at the measured
copy bandwidth.

    python -m common.profile --stage 10 --workload latency          (batch 1, as the `latency` workload)
    python -m common.profile --stage 10 --batch 64 --enforce-eager  (the same stage launching kernel by kernel)
    python -m common.profile --stage 03                             (a stage with generate() alone)

B requests of `--cache-length` prompt tokens (1B preset) are prefilled, 8 decode steps warm up, then `--steps`
decode steps are profiled, with CUPTI's activity API (NVIDIA's cupti-python) recording every kernel the GPU runs,
inside CUDA graphs too. Two ways to drive a stage:

  step()      an engine with the step API (add_request / step): each step() is a window of its own, its
              wall time measured on the host. An engine that can schedule asynchronously is profiled with
              async_scheduling=False, so that each window holds its own step's kernels and no other; its wall time
              is then the step without the overlap (the `latency` workload measures it with it).
  generate()  an engine without it: one generate() of B copies of the prompt, for 1 + 8 + steps new tokens,
              recorded whole and cut into forwards at each one's first kernel, the embedding gather (see
              cut_steps()); the prefill and the warm-up steps are dropped. A step's wall time is not measured
              (wall_us null). A stage that keeps no KV cache (it declares no kv_write group) re-runs the whole
              sequence each step: its "decode step" is a full forward over every position, held to the floor of
              a step that computes the one new token.

Each stage names its own kernels, in its kernels.py (the profiler imports it):

    PROFILE_GROUPS = {"rms_norm": "norms", "attention_*": "attention", "gemv_m*": "gemm", "checksum_u16": None}
    PROFILE_FUSED = {"rope + kv_write": ("rope", "kv_write")}

PROFILE_GROUPS maps a kernel name (one ending in "*" is a prefix) to its group; "gemm" is a GEMM, which takes the
next GEMM of the step's fixed order (every layer's qkv, o, gate_up and down, then the LM head), as every kernel the
stage does not name (cuBLAS's) does, a split-K reduction staying with the GEMM before it; None is a kernel that
never runs in a decode step. PROFILE_FUSED names a group one kernel does for several: its floor is theirs added.
The floors are facts of the model, not of a stage: one formula per group, here, from the model's shapes, B and
the rows' cache lengths (a stage declaring a group without one is refused, naming both):

    GEMM        weight N x K bf16 read once, plus the rows' inputs and outputs
    norms       x read (and written back, add_rms_norm), the sublayer's output read, h written
    rope        the q and k heads read and written, cos and sin read
    kv_write    k and v read, written into the cache
    attention   the queries read, every cached key and value of each row read, the output written (the
                flash-decoding combine is part of it: its partials are traffic a perfect kernel would not make)
    silu_mul    gate and up read, the product written
    embedding   the rows gathered: read and written (the token embedding, and the logit rows' gather)
    sample      the logits read
    block tables  nothing a decode step needs
    collectives NCCL's kernels (a model split over GPUs, --tensor-parallel-size): none of memory; their floor is
                the links', and the table shows their time, the all-reduces' share of the step

Split over N GPUs the profile is rank 0's: its share of every GEMM (the floors from its shapes, the LM head its
slice of the vocabulary) and the collectives that join it to the others.

A kernel's time is its time on the step's critical path (exposed_ns: kernels launched early overlap the one
before, and are counted from its end). A step's figures: its wall time (host, through step(); None where
generate() drove), the GPU's span (first kernel start to last kernel end), its gaps (the GPU idle inside the
span: what launching kernel by kernel leaves between them, and CUDA graphs close), the kernels' critical-path and
start-to-end times, and the sum of the floors; medians over the steps. Writes
<gpu>_<date>_profile-<stage>-b<B>[-eager]_<time>.json into --out.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import inspect
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from common.bench import USER_RESULTS
from common.synthetic import resolve_model

GEMMS = ("qkv", "o", "gate_up", "down")
GEMM = "gemm"                     # a declared GEMM kernel: it takes the next GEMM of the step's fixed order
FLOORED = ("embedding", "norms", "gemm qkv", "rope", "kv_write", "attention", "gemm o", "gemm gate_up", "silu_mul",
           "gemm down", "gemm lm_head", "sample", "block tables", "collectives")   # the groups floor_bytes() has a formula for
# the order of a table's groups: every group with a floor, and the fused ones where their parts would be
ORDER = ["embedding", "norms", "gemm qkv", "rope", "kv_write", "rope + kv_write", "attention", "gemm o",
         "gemm gate_up", "silu_mul", "gemm down", "gemm lm_head", "sample", "block tables", "collectives"]
WARM_STEPS = 8                    # decode steps before the profiled ones: every kernel loaded, every shape seen
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Declaration:
    """A stage's PROFILE_GROUPS and PROFILE_FUSED (see the module's docstring)."""

    stage: str
    groups: dict[str, str | None]
    fused: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self):
        where = f"{self.stage}/kernels.py"
        for group, parts in self.fused.items():
            for part in parts:
                if part not in FLOORED:
                    raise ValueError(f"{where}: PROFILE_FUSED[{group!r}] adds {part!r}, a group with no floor in "
                                     f"common/bench/profile.py (those with one: {', '.join(FLOORED)})")
        for name, group in self.groups.items():
            if group not in (None, GEMM, *FLOORED, *self.fused):
                raise ValueError(f"{where}: PROFILE_GROUPS[{name!r}] is group {group!r}, which has no floor in "
                                 f"common/bench/profile.py (those with one: {', '.join(FLOORED)}; or {GEMM!r}, a "
                                 "GEMM; or a PROFILE_FUSED group)")

    def group_of(self, name: str) -> str | None:
        """The group of kernel `name`: as declared, exactly or by the longest prefix ("p*"); GEMM for a kernel
        the stage does not declare (cuBLAS's); None for one it declares outside decode steps."""
        if name in self.groups:
            return self.groups[name]
        if "nccl" in name.lower():                # NCCL's own kernels (mangled C++ names): a split model's
            return "collectives"
        prefixes = [p for p in self.groups if p.endswith("*") and name.startswith(p[:-1])]
        return self.groups[max(prefixes, key=len)] if prefixes else GEMM

    @property
    def keeps_cache(self) -> bool:
        """Whether the stage writes a KV cache (a kv_write group, alone or fused): without one each decode step
        re-runs the whole sequence."""
        return any(g == "kv_write" or "kv_write" in self.fused.get(g, ()) for g in self.groups.values())


def read_declaration(stage: str) -> Declaration:
    """The declaration in <stage>/kernels.py."""
    module = importlib.import_module(f"{stage}.kernels")
    if not isinstance(getattr(module, "PROFILE_GROUPS", None), dict):
        raise ValueError(f"{stage}/kernels.py declares no PROFILE_GROUPS: the profiler cannot name its kernels")
    return Declaration(stage, module.PROFILE_GROUPS, getattr(module, "PROFILE_FUSED", {}))


def label_step(names: list[str], num_layers: int, declared: Declaration) -> list[str]:
    """The group of each kernel of one decode step, in launch order: GEMM kernels (the stage's, and every kernel
    it does not name) take the next GEMM of the step's fixed order (a reduction kernel stays with the GEMM before
    it)."""
    gemms = [f"gemm {g}" for _ in range(num_layers) for g in GEMMS] + ["gemm lm_head"]
    labels, k = [], -1
    for name in names:
        group = declared.group_of(name)
        if group is None:
            raise ValueError(f"{name} ran in a decode step, but {declared.stage}/kernels.py declares it outside "
                             "one (None in PROFILE_GROUPS)")
        if group == GEMM:
            if "reduce" not in name.lower() or k < 0:
                k += 1
            if k >= len(gemms):
                raise ValueError(f"more GEMM kernels than the step's {len(gemms)} GEMMs: {name}")
            group = gemms[k]
        labels.append(group)
    return labels


def cut_steps(kernels: list[tuple], declared: Declaration) -> list[list[tuple]]:
    """A generate() run's kernels (start ns, end ns, name) in the GPU's order, cut into its forwards: a new one at
    each embedding kernel that follows a sampler. Every forward opens with the embedding gather and every step
    ends sampling; the gather inside a forward (the logit rows') follows no sampler, and a prefill in several
    forwards, with no sampling between them, stays one piece. So the first piece is the prefill (with its first
    token's sampling, and whatever ran before it), then one a decode step."""
    pieces: list[list[tuple]] = [[]]
    prev = None
    for kernel in kernels:
        group = declared.group_of(kernel[2])
        if group == "embedding" and prev == "sample":
            pieces.append([])
        pieces[-1].append(kernel)
        prev = group
    return pieces if pieces[0] else []


def floor_bytes(config, rows: int, keys: list[int], fused: dict | None = None,
                head_rows: int | None = None) -> dict[str, int]:
    """Bytes each group must move in one decode step of `rows` rows whose cache lengths (keys attended) are
    `keys`; bf16 activations and weights, f32 logits. `fused`: a stage's PROFILE_FUSED, whose groups' floors
    are their parts' added. `head_rows`: the LM head's rows where it is a slice of the vocabulary (a rank's)."""
    c = config
    H, nh, nkv, hd, inter, V = (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                c.intermediate_size, c.vocab_size)
    L, b = c.num_hidden_layers, 2
    shapes = {"qkv": ((nh + 2 * nkv) * hd, H), "o": (H, nh * hd), "gate_up": (2 * inter, H), "down": (H, inter)}
    out = {f"gemm {g}": L * (n * k + rows * (n + k)) * b for g, (n, k) in shapes.items()}
    Vh = head_rows or V
    out["gemm lm_head"] = Vh * H * b + rows * H * b + rows * Vh * 4
    out["norms"] = (2 * L + 1) * H * b + rows * H * b * (2 + 4 * 2 * L)   # rms_norm once; add_rms_norm 2L times
    out["rope"] = L * rows * ((nh + nkv) * hd * b * 2 + hd * 4)
    out["kv_write"] = L * rows * 2 * nkv * hd * b * 2
    out["attention"] = L * (rows * nh * hd * b * 2 + sum(keys) * nkv * hd * b * 2)
    out["silu_mul"] = L * rows * 3 * inter * b
    out["embedding"] = 2 * rows * H * b * 2
    out["sample"] = rows * V * 4
    out["block tables"] = 0
    out["collectives"] = 0
    for group, parts in (fused or {}).items():
        out[group] = sum(out[p] for p in parts)
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


def idle_ns(kernels: list[tuple]) -> int:
    """The GPU's idle time inside the kernels' span (first start to last end): the span less the union of their
    (start ns, end ns, ...) intervals, so that overlapping kernels cover their time once."""
    if not kernels:
        return 0
    covered, reach = 0, None
    for s, e, *_ in sorted(kernels):
        if reach is None or s >= reach:
            covered, reach = covered + e - s, e
        elif e > reach:
            covered, reach = covered + e - reach, e
    return max(e for _, e, *_ in kernels) - min(s for s, *_ in kernels) - covered


def step_figures(kernels: list[tuple], declared: Declaration, num_layers: int, wall_s: float | None,
                 keys: int) -> dict:
    """One decode step's figures from its kernels (start ns, end ns, name) in the GPU's order; wall_s None where
    the step's wall time was not measured."""
    labels = label_step([k[2] for k in kernels], num_layers, declared)
    exposed = exposed_ns(kernels)
    by_group: dict[str, float] = {}
    for ns, label in zip(exposed, labels):
        by_group[label] = by_group.get(label, 0.0) + ns / 1e3
    return {"wall_us": None if wall_s is None else wall_s * 1e6,
            "span_us": (max(e for _, e, _ in kernels) - kernels[0][0]) / 1e3,
            "gaps_us": idle_ns(kernels) / 1e3, "busy_us": sum(e - s for s, e, _ in kernels) / 1e3,
            "exposed_us": sum(exposed) / 1e3, "kernels": len(kernels), "groups_us": by_group, "keys": keys}


def summarize(rows: list[dict], floors: dict[str, int], fused: dict, bandwidth_gbps: float) -> dict:
    """The medians over the steps' figures, and each group's time against its floor: the groups of ORDER that have
    a floor, then any other the steps ran (a stage's fused group ORDER does not list)."""
    med = statistics.median
    walls = [r["wall_us"] for r in rows]
    out = {"wall_us": None if None in walls else med(walls)}
    for key in ("span_us", "busy_us", "exposed_us", "gaps_us"):
        out[key] = med(r[key] for r in rows)
    out["kernels_per_step"] = med(r["kernels"] for r in rows)
    out["floor_us"] = sum(v for g, v in floors.items() if g not in fused) / (bandwidth_gbps * 1e9) * 1e6
    ran = [g for r in rows for g in r["groups_us"] if g not in ORDER]
    groups = {}
    for g in dict.fromkeys([g for g in ORDER if g in floors] + ran):
        times = [r["groups_us"].get(g, 0.0) for r in rows]
        groups[g] = {"us": med(times), "us_min": min(times), "us_max": max(times),
                     "floor_us": floors[g] / (bandwidth_gbps * 1e9) * 1e6, "bytes": floors[g]}
    out["groups"] = groups
    return out


def engine_kwargs(stage: str, engine_class, batch: int, max_model_len: int, enforce_eager: bool,
                  tensor_parallel_size: int = 1) -> dict:
    """The engine's constructor arguments for a profile of `batch` sequences (its batch size under the name it
    takes), split over tensor_parallel_size GPUs where that is not 1."""
    params = inspect.signature(engine_class).parameters
    kwargs = {"max_model_len": max_model_len}
    if tensor_parallel_size != 1:
        if "tensor_parallel_size" not in params:
            raise SystemExit(f"{stage} runs on one GPU (its Engine takes no tensor_parallel_size)")
        kwargs["tensor_parallel_size"] = tensor_parallel_size
    size = next((n for n in ("max_num_seqs", "max_batch_size") if n in params), None)
    if size:
        kwargs[size] = max(batch, 1)
    elif batch != 1:
        raise SystemExit(f"{stage} runs one sequence at a time (its Engine takes no max_num_seqs or "
                         f"max_batch_size): --batch {batch} needs --batch 1")
    if enforce_eager:
        if "enforce_eager" not in params:
            raise SystemExit(f"{stage} has no enforce_eager: it launches kernel by kernel already")
        kwargs["enforce_eager"] = True
    if "async_scheduling" in params:
        kwargs["async_scheduling"] = False          # one step's kernels in each window (the docstring says why)
    return kwargs


def record_by_step(engine, recorder, prompt: list[int], batch: int, steps: int, params) -> list[tuple]:
    """Drive step(): the prefill, WARM_STEPS steps, then `steps` recorded ones; (kernels, wall s) a step."""
    for _ in range(batch):
        engine.add_request(prompt, params)
    outs = []
    while len(outs) < batch or engine.num_requests()[1]:   # prefilled: every request has its first token
        outs = engine.step()
    for _ in range(WARM_STEPS):
        engine.step()
    recorder.start()
    windows = []
    for _ in range(steps):
        t0, w0 = recorder.now(), time.perf_counter()
        assert len(engine.step()) == batch
        windows.append((t0, recorder.now(), time.perf_counter() - w0))
    kernels = recorder.stop()
    return [(sorted(k for k in kernels if t0 <= k[0] <= t1), wall) for t0, t1, wall in windows]


def record_by_generate(engine, recorder, prompt: list[int], batch: int, steps: int, params,
                       declared: Declaration) -> list[tuple]:
    """Drive generate() (params.max_tokens = 1 + WARM_STEPS + steps): one record of the whole run, cut into
    forwards; the prefill and the warm-up steps dropped. (kernels, None) a step: no wall time of its own."""
    recorder.start()
    engine.generate([prompt] * batch, params)
    pieces = cut_steps(recorder.stop(), declared)
    if len(pieces) != 1 + WARM_STEPS + steps:
        raise SystemExit(f"{declared.stage}: the run's kernels cut into {len(pieces)} forwards at the embedding "
                         f"gather, not the prefill, {WARM_STEPS} warm-up and {steps} decode steps")
    return [(piece, None) for piece in pieces[1 + WARM_STEPS:]]


def profile(stage: str, batch: int, cache_length: int, steps: int, enforce_eager: bool,
            model: str = "llama-3.2-1b", tensor_parallel_size: int = 1) -> dict:
    from common.device import get_gpu
    from common.sampling import SamplingParams

    module = importlib.import_module(stage)
    declared = read_declaration(stage)
    by_step = hasattr(module.Engine, "add_request")
    kwargs = engine_kwargs(stage, module.Engine, batch, max(2048, cache_length + steps + 80), enforce_eager,
                           tensor_parallel_size)
    engine = module.Engine(str(resolve_model(model)), **kwargs)
    config, gpu = engine.config, get_gpu()
    head_rows, weight_bytes = None, engine.checkpoint.total_bytes
    if tensor_parallel_size != 1:                  # rank 0's share: its shapes, its slice of the LM head
        config, head_rows = engine.model.config, engine.weights.lm_head.shape[0]
        weight_bytes = engine.weights.stats.bytes
    prompt = [128000] + [1000 + i % 5000 for i in range(cache_length - 1)]
    recorder = KernelRecorder()
    if by_step:
        params = SamplingParams(max_tokens=steps + 64, temperature=0.0, ignore_eos=True)
        recorded = record_by_step(engine, recorder, prompt, batch, steps, params)
    else:
        params = SamplingParams(max_tokens=1 + WARM_STEPS + steps, temperature=0.0, ignore_eos=True)
        recorded = record_by_generate(engine, recorder, prompt, batch, steps, params, declared)
    bandwidth = gpu.copy_bandwidth_gbps()           # measured on the GPU the run has warmed
    first_keys = cache_length + 1 + WARM_STEPS      # keys attended in the first profiled step: prompt, 9 tokens
    rows = [step_figures(kernels, declared, config.num_hidden_layers, wall, first_keys + i)
            for i, (kernels, wall) in enumerate(recorded)]
    floors = floor_bytes(config, batch, [rows[len(rows) // 2]["keys"]] * batch, declared.fused, head_rows)
    return {"stage": stage, "batch": batch, "cache_length": cache_length, "steps": steps,
            **({"model": model} if model != "llama-3.2-1b" else {}),
            **({"tensor_parallel_size": tensor_parallel_size} if tensor_parallel_size != 1 else {}),
            "enforce_eager": enforce_eager, "gpu": gpu.name, "copy_gb_per_s": bandwidth,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "decode_step": "one new token a sequence" if declared.keeps_cache else
            "a full forward over every position (no KV cache), against the floor of one new token",
            **summarize(rows, floors, declared.fused, bandwidth),
            "weights_floor_us": weight_bytes / (bandwidth * 1e9) * 1e6,
            "gemv_shapes": sorted(getattr(engine.model, "gemv_shapes", ())),    # (M, N, K) through a fused GEMV
            "plain_shapes": sorted(getattr(engine.model, "plain_shapes", ())),  # (M, N, K) an unfused step streams
            "steps_detail": rows}


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
    wall = ("wall not measured (generate() drove the run: its steps were cut from one record)"
            if p["wall_us"] is None else f"wall {p['wall_us']:.0f} us (host, through step())")
    gaps = f" ({p['gaps_us']:.0f} us of it the GPU idle between kernels)" if "gaps_us" in p else ""
    lines.append(f"step: {wall}, GPU span {p['span_us']:.0f} us{gaps}, "
                 f"kernels {total:.0f} us on the critical path ({p['busy_us']:.0f} us start to end, overlaps "
                 f"counted twice) in {p['kernels_per_step']:.0f} kernels; floor of the weights alone "
                 f"{p['weights_floor_us']:.0f} us")
    if p.get("decode_step", "").startswith("a full forward"):
        lines.append(f"a decode step here is {p['decode_step']}")
    return "\n".join(lines)


def stage_folder(prog: str, arg: str) -> str | None:
    """The stage folder `--stage NN` names (stageNN_*, a package), or None, having said so in one line."""
    found = sorted(p.name for p in ROOT.glob(f"stage{int(arg):02d}_*") if (p / "__init__.py").exists()) \
        if arg.isdigit() else []
    if not found:
        print(f"{prog}: --stage {arg}: no such stage in {ROOT}", file=sys.stderr)
    return found[0] if found else None


def add_out_argument(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", type=Path, default=USER_RESULTS,
                    help="where the profile's JSON goes (default: %(default)s/, which git ignores)")


def recording_problem() -> str | None:
    """What keeps this machine from recording kernels, in a few words (no GPU, no cupti-python), or None."""
    from common.device import has_gpu

    ok, why = has_gpu()
    if not ok:
        return f"no GPU ({why}): the profile records the GPU's kernels (CUPTI)"
    if importlib.util.find_spec("cupti") is None:
        return "it needs NVIDIA's cupti-python: pip install -e \".[profile]\""
    return None


def write_result(out: Path, name: str, result: dict) -> None:
    """A profile's JSON into out/name (out made if need be), and a line saying where."""
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out / name}", file=sys.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m common.profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", required=True, help="two digits: the stage folder stageNN_*")
    ap.add_argument("--workload", choices=["latency"], default="latency", help="latency: batch 1")
    ap.add_argument("--batch", type=int, default=1, help="sequences decoding at once (default: %(default)s)")
    ap.add_argument("--cache-length", type=int, default=256, help="prompt tokens of each request")
    ap.add_argument("--steps", type=int, default=30, help="decode steps recorded (default: %(default)s)")
    ap.add_argument("--enforce-eager", action="store_true", help="a stage with CUDA graphs, without them")
    ap.add_argument("--model", default="llama-3.2-1b", help="a preset or checkpoint folder (default: %(default)s)")
    ap.add_argument("--tensor-parallel-size", type=int, default=1,
                    help="GPUs the model is split over (a stage that takes it); the profile is rank 0's")
    add_out_argument(ap)
    args = ap.parse_args(argv)
    stage = stage_folder(ap.prog, args.stage)
    if stage is None:
        return 2
    problem = recording_problem()
    if problem:     # what the machine lacks, in one line (not the usage: the command was right)
        hint = ("; on a CPU, `python -m common.bench.host_profile --free-runner` profiles the loop's host work"
                if problem.startswith("no GPU") else "")
        print(f"{ap.prog}: {problem}{hint}", file=sys.stderr)
        return 2
    p = profile(stage, args.batch, args.cache_length, args.steps, args.enforce_eager, args.model,
                args.tensor_parallel_size)
    print(format_profile(p))
    day, clock = p["date"][:10], p["date"][11:19].replace(":", "")
    name = (f"{p['gpu'].replace(' ', '-')}_{day}_profile-{stage[5:7]}-b{args.batch}"
            f"{'-eager' if args.enforce_eager else ''}"
            f"{f'-tp{args.tensor_parallel_size}' if args.tensor_parallel_size != 1 else ''}"
            f"{'' if args.model == 'llama-3.2-1b' else '-' + Path(args.model).name}_{clock}.json")
    write_result(args.out, name, p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
