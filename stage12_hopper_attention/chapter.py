"""The generated parts of this stage's chapter (README.md); `python -m common.readme` renders them with the common,
data-driven ones.

  tile-plan   what one block of attention_hopper.cu holds and moves, for head_dim 64 and 128, beside
              attention_tiles.cu's: M-rows, shared memory, TMA copies a 64-key tile at each block size, wgmma or
              mma.sync instructions a tile; from kernels.py's and tma.py's constants
  measured    `long` with hf-sdpa, the previous stage and this one: prefill tok/s at 2,048, 8,192 and 32,768, from
              the newest harness run holding the three, or the command that measures it
  kernel      the prefill kernels alone (bench_attention.py::test_prefill_attention): TFLOP/s of each kernel at each
              length and head_dim, from the newest committed pytest-benchmark run, or the command
  builds      attention_hopper.cu's builds timed against each other, each set in one run: TFLOP/s from the
              pytest-benchmark files of their logs folders (whose READMEs say how each build was made)
"""
from __future__ import annotations

import json
from pathlib import Path

from common.course import results
from common.course.readme import RESULTS, ROOT, pytest_bench

from .kernels import HOPPER_STAGES, HOPPER_TILE_M, HOPPER_TILE_N, TILE_M, hopper_shared_bytes
from .tma import BOX_DIMS, box_rows

STAGE = Path(__file__).parent.name
PREVIOUS = max(p.name for p in ROOT.glob("stage[0-9][0-9]_*") if p.name < STAGE)
NN, PREV_NN = STAGE[5:7], PREVIOUS[5:7]
TILE_N = 64                       # attention_tiles.cu's keys a tile
LENGTHS = (2048, 8192, 32768)
LOGS = ROOT / "benchmarks" / "logs"
# (logs folder, [(build, its pytest-benchmark file's suffix after the GPU and date)]): builds timed in one run
BUILDS = [("2026-12-05-H100-fused-kernels-tested-pipelining-measured",
           [("main then", "attention12"), ("S of tile j before P V of j - 1 (hd 64); 3 stages (both)",
                                           "attention12-pipelined"),
            ("the same pipelining, again", "attention12-pipelined-again"), ("main then, again", "attention12-again")]),
          ("2026-12-05-H200-hopper-attention-variants",
           [("112 registers (hd 64); 3 stages (hd 128)", "attention12-capped"), ("main then", "attention12-main"),
            ("the same as 112, with ex2.approx.ftz and the scale in the FMA", "attention12-ex2-ftz")]),
          ("2026-12-05-H100-hd128-three-stages-first-token", [("3 stages at hd 128", "attention12")]),
          ("2026-12-05-H100-branches-landed-measured/builds",
           [("main then", "b_main"), ("three consumer warpgroups (hd 64)", "b_wip_hopper_three_warpgroups"),
            ("three warpgroups and ex2.approx.ftz", "b_wip_hopper_three_warpgroups_ex2_ftz"),
            ("ex2.approx.ftz, the scale in the FMA", "b_wip_softmax_ex2_ftz")]),
          ("2026-12-05-H100-lazy-rescale", [("main then", "b_main"),
                                            ("O rescaled only past 2^8", "b_wip_softmax_lazy_rescale")]),
          ("2026-12-05-H100-setmaxnreg-launch-ncu-long/builds",
           [("main then", "b_main"), ("128-key tiles, two warpgroups (hd 64)", "b_wip_hopper_128_key_tiles"),
            ("128-key tiles, three warpgroups, setmaxnreg", "b_wip_hopper_setmaxnreg")]),
          ("2026-12-05-H100-unmasked-tiles/builds",
           [("main then", "b_main"), ("no mask left of the diagonal", "b_wip_hopper_unmasked_tiles")]),
          ("2026-12-06-H100-tile-order",
           [("main then", "b_25a880b"), ("prompt tiles longest first (main now)", "b_wip_order"),
            ("longest first; Q in shared memory, S of j beside P V of j - 1, 3 stages", "b_wip_overlap")]),
          ("2026-12-06-H100-overlap-held-ladder-long-profiles",
           [("main then", "b_main"), ("that overlap, its wait held by a store of the row sums", "b_main_overlap_held")]),
          ("2026-12-06-H100-prompt-splits/builds",
           [("main then", "b_main"),
            ("last-wave tiles split by keys (main now; one launch over a whole prompt never splits)",
             "b_wip_prompt_splits")]),
          ("2026-12-06-H100-pingpong",
           [("main then", "b_main"), ("ping-pong: the warpgroups issue S in turn", "b_wip_pingpong")])]


def tile_plan() -> str:
    lines = ["| | head_dim | M-rows a block | keys a tile | shared memory | K/V tiles in flight | copies of a tile's "
             "K and V (block_size 8 / 16 / 32 / 64+) | matrix instructions a tile |", "|" + " --- |" * 8]
    for hd in (64, 128):
        keys = HOPPER_TILE_N[hd]
        copies = " / ".join(str(2 * (hd // BOX_DIMS) * (keys // box_rows(bs))) for bs in (8, 16, 32, 64))
        wgmma = hd // 16 + keys // 16                          # S: hd / 16 k-steps; P V: keys / 16
        lines.append(f"| `attention_hopper.cu` | {hd} | {HOPPER_TILE_M[hd]} | {keys} | "
                     f"{hopper_shared_bytes(hd) / 1024:.0f} KiB | {HOPPER_STAGES[hd]} | {copies} (TMA) | "
                     f"{wgmma} wgmma a warpgroup (m64n{keys}k16, m64n{hd}k16) |")
        stages = 2 if hd == 64 else 1                          # attention_tiles.cu's STAGES
        mma = (TILE_N // 8) * (hd // 16) + (TILE_N // 16) * (hd // 8)   # S: 8-key blocks x k-steps; P V
        lines.append(f"| `attention_tiles.cu` | {hd} | {TILE_M} | {TILE_N} | "
                     f"{stages * 2 * TILE_N * (hd + 8) * 2 / 1024:.0f} KiB | {stages} | {2 * TILE_N * hd // 8:,} "
                     f"(cp.async, 16 bytes each) | {mma} mma.sync a warp (m16n8k16) |")
    return "\n".join(lines)


def _newest_long() -> dict | None:
    runs = [results.load(p) for p in RESULTS.glob("*_long-*.json")]
    runs = [r for r in runs if {STAGE, PREVIOUS, "hf-sdpa"} <= set(r.get("stages", {}))]
    return max(runs, key=lambda r: (r["date"], r.get("time", "")), default=None)


def measured() -> str:
    r = _newest_long()
    if r is None:
        return (f"Not measured yet: `python -m common.bench --stages hf-sdpa,{PREV_NN},{NN} --workload long` "
                "measures it (H200; goal: 1.3x hf-sdpa at 2,048 and 8,192, 1.2x at 32,768).")
    engines = ("hf-sdpa", PREVIOUS, STAGE)
    lines = [f"`long`, {r['date']} {r.get('time', '')[:5]}, {r['environment']['gpu']}, prefill tok/s (min-max):",
             "", "| prompt tokens | " + " | ".join(f"`{e}`" for e in engines) + " | this stage / hf-sdpa | goal |",
             "|" + " --- |" * (len(engines) + 3)]
    for n, goal in zip(LENGTHS, ("1.3x", "1.3x", "1.2x")):
        key, cells = f"prefill_tok_per_s_at_{n}", []
        for e in engines:
            s = r["stages"][e]
            lo, hi = s.get("spread", {}).get(key, (s.get(key), s.get(key)))
            cells.append(f"{s[key]:,.0f} ({lo:,.0f}-{hi:,.0f})" if key in s else "-")
        ratio = r["stages"][STAGE].get(key, 0) / r["stages"]["hf-sdpa"].get(key, float("inf"))
        lines.append(f"| {n:,} | " + " | ".join(cells) + f" | {ratio:.2f}x | {goal} |")
    return "\n".join(lines)


def kernel() -> str:
    runs = pytest_bench(f"pytest-bench-attention{NN}")
    if not runs:
        return (f"Not measured yet: `pytest {STAGE}/bench_attention.py -k prefill --benchmark-only` measures it "
                "(goal: 400 TFLOP/s at 8,192 tokens, head_dim 64; FlashAttention-3 reaches about 460 on an H100).")
    when, gpu, bench = runs[-1]
    lines = [f"{gpu}, {when}, TFLOP/s of one layer's causal prefill attention (one launch over the whole prompt):",
             "", "| head_dim | kernel | " + " | ".join(f"{n:,}" for n in LENGTHS) + " |", "|" + " --- |" * 5]
    for hd in (64, 128):
        for k in ("hopper", "mma"):
            cells = [bench.get(f"test_prefill_attention[{n}-{hd}-{k}]", {}).get("extra_info", {}).get("tflop_per_s")
                     for n in LENGTHS]
            lines.append(f"| {hd} | {k} | " + " | ".join(f"{c:,.0f}" if c else "-" for c in cells) + " |")
    return "\n".join(lines)


def builds() -> str:
    lines = ["TFLOP/s of `attention_hopper.cu`'s builds by `bench_attention.py -k prefill`, a log folder's builds in "
             "one run\n(the run: its GPU, month-day and UTC time):", "",
             "| run | build | " + " | ".join(f"hd {hd}, {n // 1024}K" for hd in (64, 128) for n in LENGTHS) + " |",
             "|" + " --- |" * 8]
    for folder, runs in BUILDS:
        for build, suffix in runs:
            path = next((LOGS / folder).glob(f"*_pytest-bench-{suffix}.json"))
            run = json.loads(path.read_text())
            bench = {b["name"]: b["extra_info"]["tflop_per_s"] for b in run["benchmarks"]}
            gpu = path.name.split("_")[0].replace("NVIDIA-", "").split("-")[0]
            cells = [f"{bench[f'test_prefill_attention[{n}-{hd}-hopper]']:.0f}" for hd in (64, 128) for n in LENGTHS]
            when = f"{run['datetime'][5:10]} {run['datetime'][11:16]}"      # month-day, UTC time
            lines.append(f"| {gpu} {when} | {build} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


GENERATORS = {"tile-plan": tile_plan, "measured": measured, "kernel": kernel, "builds": builds}
