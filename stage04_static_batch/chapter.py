"""The generated tables of this stage's chapter (README.md), from the committed results; `python -m common.readme`
renders them with the common, data-driven ones."""
from __future__ import annotations

from common.course import results
from common.course.readme import RESULTS, split_table

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


def runs_with_this_stage(workload: str, also: str | None = None) -> list[tuple[str, dict]]:
    """(run name, result) of every committed harness run of `workload` that had this stage (and `also`), oldest
    first, each engine under its name of today."""
    runs = [(path.stem.split("_", 2)[2], results.load(path)) for path in RESULTS.glob(f"*_{workload}-*.json")]
    runs = [(name, r) for name, r in runs if __package__ in r["stages"] and (also is None or also in r["stages"])]
    return sorted(runs, key=lambda run: (run[1]["date"], run[1].get("time", "")))


def batch_runs() -> str:
    """`batch`: output tok/s at each B of the previous stage and this one in every run that had both; this
    stage's cells carry its ratio to the previous stage's."""
    previous = "stage03_kvcache"
    rows = ["| run | engine | " + " | ".join(f"B = {b}" for b in (1, 8, 32, 64)) + " |", "|" + " --- |" * 6]
    for name, r in runs_with_this_stage("batch", also=previous):
        before, now = ([r["stages"][e][f"output_tok_per_s_at_B{b}"] for b in (1, 8, 32, 64)]
                       for e in (previous, __package__))
        rows.append(f"| {r['date']}, `{name}` | `{previous}` | " + " | ".join(f"{x:,.0f}" for x in before) + " |")
        rows.append(f"| | `{__package__}` | " + " | ".join(f"{y:,.0f} ({y / x:.2f}x)" for x, y in zip(before, now))
                    + " |")
    return "\n".join(rows)


def ragged_runs() -> str:
    """`ragged`: this stage, and the baselines run beside it, in every run that had this stage: throughput and
    its spread, the batches' waste, the decode step and the wait for a first token."""
    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}%"

    rows = ["| run | engine | max_model_len | output tok/s (min-max) | batches | slot waste | padding share | "
            "ms per decode step | median time to first token |", "|" + " --- |" * 9]
    for name, r in runs_with_this_stage("ragged"):
        for engine, s in r["stages"].items():
            if engine.startswith("stage") and engine != __package__:
                continue                             # a later stage's figures are its own chapter's
            spread = s.get("spread", {}).get("output_tok_per_s")
            spread = f" ({spread[0]:,.0f}-{spread[1]:,.0f})" if spread else ""     # a run of one has none
            length = f"{s['max_model_len']:,}" if "max_model_len" in s else "-"     # not recorded by the first run
            rows.append(f"| {r['date']}, {r['environment']['gpu']}, `{name}` | `{engine}` | {length} | "
                        f"{s['output_tok_per_s']:,.0f}{spread} | {s.get('batches', '-')} | "
                        f"{pct(s.get('slot_waste'))} | {pct(s.get('padding_share'))} | "
                        f"{s['ms_per_decode_step']:.2f} | {s['ttft_ms'] / 1e3:.1f} s |")
    return "\n".join(rows)


GENERATORS = {"batch-arithmetic": batch_arithmetic, "batch-split": batch_split, "batch-runs": batch_runs,
              "ragged-runs": ragged_runs}
