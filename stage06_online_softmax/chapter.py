"""The generated parts of this stage's chapter (README.md); `python -m common.readme` renders them with the common,
data-driven ones.

  bytes-per-row      what one query row reads from HBM per cached key, from the kernels' own tile parameters
  against-stage05    `long`, `ragged` and `latency`: this stage beside stage05 and HF sdpa in the runs that had them
                     both, read from the committed result files that each row names
  attention-kernels  the committed pytest-benchmark runs of bench_attention.py: decode against its floor, prefill's
                     achieved TFLOP/s against the tensor cores' ceiling
  ladder-pair        stage05 and this stage in each workload's newest complete ladder run (common.course.ladders)
"""
from __future__ import annotations

import json

from common.course import ladders
from common.course.readme import RESULTS, pytest_bench
from common.synthetic import PRESETS

from .kernels import ATTENTION_THREADS, TILE_M, tile_rows

ONE_B = PRESETS["llama-3.2-1b"]
# dense bf16 matrix ceilings of one H200 SXM: the datasheet's, and an 8192^3 bf16 GEMM through PyTorch on random
# data on the H200s these chapters were measured on (2026-10-28: 788 TFLOP/s)
DATASHEET_TFLOPS, MEASURED_GEMM_TFLOPS = 990, 788


def bytes_per_row() -> str:
    c = ONE_B
    nh, nkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    rows = tile_rows(nh, nkv, hd)
    naive = nh * (2 * 2 * hd + 6 * 4)              # stage05: K and V once per query head, the fp32 score 3x each way
    per_row = nkv * 2 * 2 * hd                      # attention_rows.cu: K and V once per K/V head
    tiled = per_row / rows                          # attention_tiles.cu: once per tile of `rows` query rows
    lines = ["| kernel | what one query row reads per cached key (1B: 32 heads over 8 K/V heads of 64) | bytes | "
             "against stage05 |", "| --- | --- | --- | --- |",
             f"| stage05's naive kernel | nh (4 hd + 24): K, V for every head, the fp32 score written and read | "
             f"{naive:,} | 1x |",
             f"| attention_rows.cu (a row a block) | nkv 4 hd: K, V once per K/V head, for its {nh // nkv} heads | "
             f"{per_row:,} | {naive / per_row:.1f}x fewer |",
             f"| attention_tiles.cu (a tile a block) | nkv 4 hd / {rows}: a {TILE_M}-M-row tile holds {rows} rows "
             f"x {nh // nkv} heads, {ATTENTION_THREADS} threads | {tiled:,.0f} | {naive / tiled:.0f}x fewer |"]
    return "\n".join(lines)


def attention_kernels() -> str:
    lines = []
    for date, gpu, b in pytest_bench("pytest-bench-attention"):
        decode = sorted((n for n in b if n.startswith("test_decode_attention")),
                        key=lambda n: (b[n]["extra_info"]["batch_size"], b[n]["extra_info"]["cached_positions"]))
        held = any("gpu_ms_min" in b[n]["extra_info"] for n in decode)    # the spin-kernel hold came with the spread
        how = ("events around 20 launches queued while a spin kernel held the GPU, so the host's launch cost is out"
               if held else "events around 20 launches as the host queued them: where a kernel is shorter than "
               "its launch, this timed the host")
        lines += [f"Measured {date} on {gpu} (`bench_attention.py`: GPU time from {how}; median of 5 rounds, "
                  "min-max where recorded; the floor reads the K/V once at the copy bandwidth measured in the same "
                  "run):", "",
                  "| decode rows | cached positions | splits | GPU time per layer | floor | times the floor | "
                  "achieved GB/s |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for n in decode:
            e = b[n]["extra_info"]
            spread = f" ({1e3 * e['gpu_ms_min']:.1f}-{1e3 * e['gpu_ms_max']:.1f})" if "gpu_ms_min" in e else ""
            lines.append(f"| {e['batch_size']} | {e['cached_positions']:,} | {e['n_splits']} | "
                         f"{e['us_per_layer']:.1f} us{spread} | {e['floor_us']:.2f} us | {e['times_floor']:.1f}x | "
                         f"{e['achieved_gb_per_s']:,.0f} |")
        lines += ["", "| prompt tokens | GPU time per layer | achieved TFLOP/s | of the datasheet's "
                  f"{DATASHEET_TFLOPS} | of a bf16 GEMM's {MEASURED_GEMM_TFLOPS} |", "| --- | --- | --- | --- | --- |"]
        for n in sorted((n for n in b if n.startswith("test_prefill_attention")),
                        key=lambda n: b[n]["extra_info"]["prompt_tokens"]):
            e = b[n]["extra_info"]
            spread = f" ({e['gpu_ms_min']:.2f}-{e['gpu_ms_max']:.2f})" if "gpu_ms_min" in e else ""
            lines.append(f"| {e['prompt_tokens']:,} | {e['ms_per_layer']:.2f} ms{spread} | {e['tflop_per_s']:.0f} | "
                         f"{100 * e['tflop_per_s'] / DATASHEET_TFLOPS:.0f}% | "
                         f"{100 * e['tflop_per_s'] / MEASURED_GEMM_TFLOPS:.0f}% |")
        lines.append("")
    return "\n".join(lines).rstrip()


# The runs of the code as it stands (the tiles kernel with cp.async), each beside stage05 or HF sdpa: `long` at
# 2048 and 8192 (hf-sdpa, 05, 06) and at 32768 (hf-sdpa, 06), `ragged` (05, 06), and `latency` four times (05 and
# 06 in both orders, then 05, 06, 07 on another machine), since batch 1 moves more between runs than between the
# engines
LONG = ("long-hf-sdpa-05-06_004652", "long-hf-sdpa-06_004853")
RAGGED = ("ragged-05-06_005053",)
LATENCY = ("latency-05-06_004835", "latency-06-05_005316", "latency-05-06_005335", "latency-05-06-07_130608")
THIS = __package__                    # this stage's folder: the engine name its results carry
ENGINES = ("stage05_continuous_batch", THIS, "hf-sdpa")


def _result(name: str) -> dict:
    return json.loads((RESULTS / f"NVIDIA-H200_2026-12-04_{name}.json").read_text())


def against_stage05() -> str:
    """One row per figure: stage05, stage06 and hf-sdpa where the run had them (median of its repeats, min-max),
    stage06's gain on each (above 1: stage06 better, whichever way the figure points), and the run's file."""
    def cell(s, key, fmt):
        if key not in s:
            return "-"
        lo, hi = s.get("spread", {}).get(key, (None, None))
        return fmt(s[key]) + (f" ({fmt(lo)}-{fmt(hi)})" if lo is not None and fmt(lo) != fmt(hi) else "")

    runs = [_result(name) for name in LONG + RAGGED + LATENCY]
    (gpu,), (repeats,) = {r["environment"]["gpu"] for r in runs}, {r["repeats"] for r in runs}
    weight_gb = runs[-1]["stages"][THIS]["weight_bytes"] / 1e9
    rows = [f"Measured 2026-12-04 on {gpu} (`common.bench`, each engine in its own process; the median of "
            f"{repeats} repeats, min-max; a result file is `benchmarks/results/NVIDIA-H200_2026-12-04_<name>.json`; "
            f"the floor of a batch-1 step reads the {weight_gb:.2f} GB of weights once at the copy bandwidth "
            "measured in the run):", "",
            "| workload | figure | `stage05` | `stage06` | `hf-sdpa` | stage06's gain on stage05 | on hf-sdpa | "
            "floor | result file |", "|" + " --- |" * 9]

    def add(workload, figure, name, r, key, fmt, lower_is_better=False, floor="-"):
        s = r["stages"]
        values = [s.get(e, {}).get(key) for e in ENGINES]
        gains = ["-" if v is None or values[1] is None else
                 f"{(v / values[1] if lower_is_better else values[1] / v):.2f}x" for v in (values[0], values[2])]
        rows.append(f"| {workload} | {figure} | " + " | ".join(cell(s.get(e, {}), key, fmt) for e in ENGINES)
                    + f" | {gains[0]} | {gains[1]} | {floor} | `{name}` |")

    for name in LONG:
        r = _result(name)
        for n in (2048, 8192, 32768):
            if f"prefill_tok_per_s_at_{n}" not in r["stages"][THIS]:
                continue
            what = f"long, {n:,}-token prompt"
            add(what, "prefill tok/s", name, r, f"prefill_tok_per_s_at_{n}", lambda x: f"{x:,.0f}")
            add(what, "GB beyond the weights", name, r, f"memory_beyond_weights_gb_at_{n}", lambda x: f"{x:.2f}",
                lower_is_better=True)
            add(what, "ms per decode step after it", name, r, f"ms_per_decode_step_at_{n}", lambda x: f"{x:.2f}",
                lower_is_better=True)
    for name in RAGGED:
        r = _result(name)
        add("ragged", "output tok/s", name, r, "output_tok_per_s", lambda x: f"{x:,.0f}")
        add("ragged", "median time to first token, s", name, r, "ttft_ms", lambda x: f"{x / 1e3:.2f}",
            lower_is_better=True)
        add("ragged", "ms per decode step (median)", name, r, "ms_per_decode_step", lambda x: f"{x:.2f}",
            lower_is_better=True)
    for name in LATENCY:
        r = _result(name)
        weights = r["stages"][THIS]["weight_bytes"]
        floor = weights / (r["environment"]["copy_bandwidth_gb_per_s"] * 1e9) * 1e3
        add("latency", "ms per decode step", name, r, "ms_per_decode_step", lambda x: f"{x:.2f}",
            lower_is_better=True, floor=f"{floor:.2f} ms")
    return "\n".join(rows)


GENERATORS = {"bytes-per-row": bytes_per_row, "against-stage05": against_stage05,
              "attention-kernels": attention_kernels, "ladder-pair": lambda: ladders.pair(ENGINES[0], THIS)}
