"""The generated parts of this stage's chapter (README.md); `python -m common.readme` renders them with the common,
data-driven ones.

  bytes-per-row      what one query row reads from HBM per cached key, from the kernels' own tile parameters
  attention-kernels  the committed pytest-benchmark runs of bench_attention.py: decode against its floor, prefill's
                     achieved TFLOP/s against the tensor cores' ceiling
"""
from __future__ import annotations

from common.readme import pytest_bench
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


GENERATORS = {"bytes-per-row": bytes_per_row, "attention-kernels": attention_kernels}
