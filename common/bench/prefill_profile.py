"""Where one long prompt's prefill spends the GPU's time, kernel group by kernel group (the question `long` leaves).

    python -m common.bench.prefill_profile --stage 12 --prompt-tokens 32768
    python -m common.bench.prefill_profile --stage 12 --prompt-tokens 32768 --max-num-batched-tokens 8192

One request of N prompt tokens (the 1B preset, random weights) and one new token is prefilled twice, the first
time to warm up (kernels loaded, GEMMs timed), the second, another prompt (so that no cached prefix is reused),
recorded whole with CUPTI (common.bench.profile's KernelRecorder). The engine schedules as `long` runs it: from
stage09 asynchronously, the host planning and launching step t + 1 while the GPU runs step t, so the GPU's idle
time between kernels is `long`'s, not the host's planning between steps. Its kernels are grouped by the stage's
PROFILE_GROUPS: "gemm" is every GEMM (a kernel the stage does not name, cuBLAS's, or names a GEMM), a kernel it
declares outside decode steps (None: the prompt-only attention kernels) keeps its own name. Each group's time is
its time on the critical path (exposed_ns: overlapping kernels counted once), with its share of the prefill, and
where the model fixes the work its TFLOP/s:

    gemm        2 N K a row for each layer's qkv, o, gate_up and down, and the LM head's for the one logit row
    attention   4 hd a (query head, key) pair a row attends, causal: nh N (N + 1) / 2 pairs a layer; the groups
                whose name begins with "attention" together

and attention's TFLOP/s chunk by chunk (attention_by_chunk), where a chunk deep into the prompt reads more keys.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import sys
import time

from common.bench.profile import GEMM, Declaration, KernelRecorder, add_out_argument, engine_kwargs, exposed_ns, \
    idle_ns, read_declaration, recording_problem, stage_folder, write_result
from common.synthetic import resolve_model

ATTENTION = "attention"


def prefill_group(name: str, declared: Declaration) -> str:
    """A prefill kernel's group: the declared one ("gemm" for every GEMM), or its own name where the stage declares
    it outside decode steps."""
    group = declared.group_of(name)
    return name if group is None else group


def group_times(kernels: list[tuple], declared: Declaration) -> dict[str, float]:
    """ms on the critical path by group, for kernels (start ns, end ns, name) in the GPU's order."""
    out: dict[str, float] = {}
    for ns, (_, _, name) in zip(exposed_ns(kernels), kernels):
        g = prefill_group(name, declared)
        out[g] = out.get(g, 0.0) + ns / 1e6
    return out


def prefill_flops(config, n: int) -> dict[str, float]:
    """The FLOPs a prefill of n tokens must do: the GEMMs' (one logit row through the LM head) and attention's
    (causal, the products S = Q K^T and P V)."""
    c = config
    H, nh, nkv, hd, inter = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, \
        c.intermediate_size
    per_row = (nh + 2 * nkv) * hd * H + H * nh * hd + 2 * inter * H + H * inter      # qkv, o, gate_up, down
    return {GEMM: 2.0 * (c.num_hidden_layers * n * per_row + c.vocab_size * H),
            ATTENTION: 4.0 * hd * nh * n * (n + 1) / 2 * c.num_hidden_layers}


def summarize(kernels: list[tuple], declared: Declaration, config, n: int) -> dict:
    """The recorded prefill's figures: its span, idle gaps and each group's ms, share and (where fixed) TFLOP/s."""
    times = group_times(kernels, declared)
    total = sum(times.values())
    flops = prefill_flops(config, n)
    attention_ms = sum(ms for g, ms in times.items() if g.startswith(ATTENTION))
    groups = {g: {"ms": ms, "share": ms / total} for g, ms in sorted(times.items(), key=lambda kv: -kv[1])}
    if GEMM in groups:
        groups[GEMM]["tflop_per_s"] = flops[GEMM] / (times[GEMM] * 1e9)
    return {"span_ms": (max(e for _, e, _ in kernels) - kernels[0][0]) / 1e6, "gaps_ms": idle_ns(kernels) / 1e6,
            "exposed_ms": total, "kernels": len(kernels), "groups": groups, "flops": flops,
            "attention_ms": attention_ms,
            "attention_tflop_per_s": flops[ATTENTION] / (attention_ms * 1e9) if attention_ms else None}


def attention_by_chunk(kernels: list[tuple], config, n: int, budget: int) -> list[dict] | None:
    """Each prompt chunk's attention, for kernels (start ns, end ns, name) in the GPU's order: the chunks of `budget`
    rows, one attention launch a layer each (the kernels whose name begins with "attention", in order), their ms on
    the critical path and TFLOP/s (a chunk of r rows from position p attends r p + r (r + 1) / 2 pairs a head); None
    where the launches do not come one a layer a chunk."""
    # each launch's time on the critical path: from stage10 an attention launch starts early (PDL) and waits inside
    # for the kernel ahead of it, whose time that is
    launches = [ns / 1e6 for ns, (_, _, name) in zip(exposed_ns(kernels), kernels) if name.startswith(ATTENTION)]
    layers, firsts = config.num_hidden_layers, range(0, n, budget)
    if len(launches) != layers * len(firsts):
        return None
    per_pair = 4.0 * config.head_dim * config.num_attention_heads * layers
    out = []
    for c, first in enumerate(firsts):
        rows, ms = min(budget, n - first), sum(launches[c * layers:(c + 1) * layers])
        out.append({"first_position": first, "rows": rows, "ms": ms,
                    "tflop_per_s": per_pair * (rows * first + rows * (rows + 1) / 2) / (ms * 1e9)})
    return out


def format_prefill(p: dict) -> str:
    budget = p["max_num_batched_tokens"]
    lines = [f"{p['stage']}, one prompt of {p['prompt_tokens']:,} tokens, a budget of "
             f"{'?' if budget is None else f'{budget:,}'} rows a step ({p['steps']} step() calls), on {p['gpu']}: "
             "the GPU's time by kernel group",
             "| kernels | ms | share | TFLOP/s |", "| --- | --- | --- | --- |"]
    for g, v in p["groups"].items():
        rate = f"{v['tflop_per_s']:.0f}" if "tflop_per_s" in v else "-"
        lines.append(f"| {g} | {v['ms']:.2f} | {v['share']:.1%} | {rate} |")
    if p["attention_tflop_per_s"]:
        lines.append(f"| attention, every kernel | {p['attention_ms']:.2f} | "
                     f"{p['attention_ms'] / p['exposed_ms']:.1%} | {p['attention_tflop_per_s']:.0f} |")
    lines.append(f"| **all kernels** | {p['exposed_ms']:.2f} | | |")
    if p.get("attention_by_chunk"):
        lines.append("attention by chunk, TFLOP/s from its first position: " + ", ".join(
            f"{c['first_position']:,}: {c['tflop_per_s']:.0f}" for c in p["attention_by_chunk"]))
    lines.append(f"prefill: wall {p['wall_ms']:.1f} ms ({p['prompt_tokens'] / p['wall_ms'] * 1e3:,.0f} tok/s), GPU "
                 f"span {p['span_ms']:.1f} ms, {p['gaps_ms']:.1f} ms of it idle between kernels, {p['kernels']:,} "
                 "kernels")
    return "\n".join(lines)


def prompt_of(n: int, seed: int) -> list[int]:
    return [128000] + [1000 + (i * 7 + seed) % 5000 for i in range(n - 1)]


def prefill(engine, prompt: list[int], params) -> int:
    """One request prefilled and its first token sampled, through step(); the step() calls it took (with
    asynchronous scheduling one more than the forwards: the last only reads the first token back)."""
    engine.add_request(prompt, params)
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    return steps


def profile_prefill(stage: str, n: int, budget: int | None, model: str = "llama-3.2-1b") -> dict:
    from common.device import get_gpu
    from common.sampling import SamplingParams

    module = importlib.import_module(stage)
    declared = read_declaration(stage)
    kwargs = engine_kwargs(stage, module.Engine, 1, n + 16, False)
    # the engine's own scheduling, as `long` runs it (engine_kwargs turns asynchronous scheduling off for a decode
    # profile, whose windows each hold one step's kernels; this one records the whole prefill)
    kwargs.pop("async_scheduling", None)
    if budget is not None:
        kwargs["max_num_batched_tokens"] = budget
    engine = module.Engine(str(resolve_model(model)), **kwargs)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    prefill(engine, prompt_of(n, 0), params)                  # warm-up: kernels loaded, GEMMs timed
    recorder = KernelRecorder()
    recorder.start()
    t0 = time.perf_counter()
    steps = prefill(engine, prompt_of(n, 1), params)
    wall = time.perf_counter() - t0
    kernels = recorder.stop()
    scheduler = getattr(getattr(engine, "llm", engine), "scheduler", None)
    used = budget if budget is not None else getattr(scheduler, "max_num_batched_tokens", None)
    return {"stage": stage, "prompt_tokens": n, "max_num_batched_tokens": used, "steps": steps,
            "gpu": get_gpu().name, "wall_ms": wall * 1e3,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            **summarize(kernels, declared, engine.config, n),
            "attention_by_chunk": attention_by_chunk(kernels, engine.config, n, used) if used else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m common.bench.prefill_profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", required=True, help="two digits: the stage folder stageNN_* (one with step())")
    ap.add_argument("--prompt-tokens", type=int, default=32768, help="the prompt's length (default: %(default)s)")
    ap.add_argument("--max-num-batched-tokens", type=int, help="the token budget (default: the engine's)")
    add_out_argument(ap)
    args = ap.parse_args(argv)
    stage = stage_folder(ap.prog, args.stage)
    if stage is None:
        return 2
    if not hasattr(importlib.import_module(stage).Engine, "add_request"):
        print(f"{ap.prog}: --stage {args.stage}: {stage} has no step(); its prefill is not cut into steps",
              file=sys.stderr)
        return 2
    if args.prompt_tokens < 2:
        print(f"{ap.prog}: --prompt-tokens {args.prompt_tokens}: a prompt of at least 2 tokens", file=sys.stderr)
        return 2
    problem = recording_problem()
    if problem:
        print(f"{ap.prog}: {problem}", file=sys.stderr)
        return 2
    p = profile_prefill(stage, args.prompt_tokens, args.max_num_batched_tokens)
    print(format_prefill(p))
    write_result(args.out, f"{p['gpu'].replace(' ', '-')}_{p['date'][:10]}_prefill-profile-{stage[5:7]}-"
                 f"{args.prompt_tokens}-tok{p['max_num_batched_tokens']}_{p['date'][11:19].replace(':', '')}.json", p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
