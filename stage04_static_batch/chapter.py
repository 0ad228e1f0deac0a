"""The generated tables of this stage's chapter (README.md), from the committed results; `python -m common.readme`
renders them with the common, data-driven ones."""
from __future__ import annotations

from common.readme import split_table

H200_BF16_DENSE_TFLOPS = 989     # NVIDIA's H200 SXM datasheet figures (bf16 1979 TFLOP/s is with 2:4 sparsity)
H200_HBM_TB_PER_S = 4.8


def batch_arithmetic() -> str:
    """Bytes and FLOPs of one decode step of the 1B preset at batch B, 256 cached positions per sequence."""
    from common.synthetic import PRESETS

    c = PRESETS["llama-3.2-1b"]
    weights = 2 * c.num_parameters()
    kv_per_token = c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * 2
    attn_flops = 4 * c.num_attention_heads * c.head_dim * c.num_hidden_layers       # per sequence, per key
    rows = ["| B | bytes read (weights + KV) | FLOPs | FLOP per byte | time to read them | time to compute them |",
            "| --- | --- | --- | --- | --- | --- |"]
    for B in (1, 8, 32, 64):
        nbytes = weights + B * 256 * kv_per_token
        flops = B * (2 * c.num_parameters() + 256 * attn_flops)
        rows.append(f"| {B} | {nbytes / 1e9:.2f} GB | {flops / 1e9:.1f} G | {flops / nbytes:.1f} | "
                    f"{nbytes / (H200_HBM_TB_PER_S * 1e12) * 1e3:.2f} ms | "
                    f"{flops / (H200_BF16_DENSE_TFLOPS * 1e12) * 1e3:.3f} ms |")
    return "\n".join(rows)


def batch_split() -> str:
    return split_table("pytest-bench-batch", "batch_size", "B (256 cached positions each)")


GENERATORS = {"batch-arithmetic": batch_arithmetic, "batch-split": batch_split}
