"""The generated tables of this stage's chapter (README.md), from the committed results; `python -m common.readme`
renders them with the common, data-driven ones."""
from __future__ import annotations

from common.course import results
from common.course.readme import RESULTS, pytest_bench


def forward_results() -> str:
    """bench_forward.py's figures: prefill tok/s, decode ms per step, and the decode-step split."""
    lines = []
    for date, gpu, b in pytest_bench("pytest-bench-forward"):
        def info(name, key):
            return b[name]["extra_info"][key] if name in b else float("nan")

        lines += [f"Measured {date} on {gpu} (`bench_forward.py`, medians):", "",
                  "| prefill tokens | stage02, small | numpy reference, small | stage02, 1B | HF eager, 1B | "
                  "stage02 / HF, 1B |", "| --- | --- | --- | --- | --- | --- |"]
        for n in (128, 512, 2048):
            ours, hf = info(f"test_prefill_stage02[{n}-llama-3.2-1b]", "tok_per_s"), info(
                f"test_prefill_hf_eager[{n}]", "tok_per_s")
            lines.append(f"| {n} | {info(f'test_prefill_stage02[{n}-small]', 'tok_per_s'):,.0f} tok/s | "
                         f"{info(f'test_prefill_numpy_reference[{n}]', 'tok_per_s'):,.0f} tok/s | {ours:,.0f} tok/s | "
                         f"{hf:,.0f} tok/s | {ours / hf:.2f}x |")
        lines += ["", "| decode, `latency` (128 + 256 tokens) | ms per step | time to first token |",
                  "| --- | --- | --- |"]
        for label, name in [("stage02, small", "test_decode_stage02[small]"),
                            ("numpy reference, small", "test_decode_numpy_reference"),
                            ("stage02, 1B (re-runs the whole sequence)", "test_decode_stage02[llama-3.2-1b]"),
                            ("HF eager, 1B (with its KV cache)", "test_decode_hf_eager")]:
            lines.append(f"| {label} | {info(name, 'ms_per_decode_step'):.2f} | {info(name, 'ttft_ms'):.2f} ms |")
        lines += ["", "| one stage02 decode step, 1B, over T tokens | wall | GPU work alone | host time to queue it "
                  "| GPU idle share of the wall time |", "| --- | --- | --- | --- | --- |"]
        for n in (128, 384):
            name = f"test_decode_step_split[{n}]"
            lines.append(f"| T = {n} | {info(name, 'wall_ms'):.2f} ms | {info(name, 'gpu_ms'):.2f} ms | "
                         f"{info(name, 'host_queue_ms'):.2f} ms | {100 * info(name, 'gpu_idle_share'):.0f}% |")
    return "\n".join(lines)


def latency_runs() -> str:
    """`latency` (a 128-token prompt, 256 new tokens, batch 1) in every committed harness run that had this stage:
    this stage and the HF baselines of the run (a ladder's other stages have their own chapters); the floor reads
    the weights once at the copy bandwidth measured in that run."""
    rows = ["| run | engine | ms per decode step | floor | time to first token | output tok/s |",
            "| --- | --- | --- | --- | --- | --- |"]
    for path in sorted(RESULTS.glob("*_latency-*.json"), key=lambda p: p.name.split("_")[1:]):   # by date
        r = results.load(path)
        if __package__ not in r["stages"] or r.get("kv_cache_gib"):
            continue
        bandwidth = r["environment"]["copy_bandwidth_gb_per_s"]
        for name, s in r["stages"].items():
            if name != __package__ and not name.startswith("hf"):
                continue
            rows.append(f"| {r['date']}, {r['environment']['gpu']}, `{path.stem.split('_', 2)[2]}` | `{name}` | "
                        f"{s['ms_per_decode_step']:.2f} | {s['weight_bytes'] / bandwidth / 1e6:.2f} ms | "
                        f"{s['ttft_ms']:.2f} ms | {s['output_tok_per_s']:.1f} |")
    return "\n".join(rows)


GENERATORS = {"forward-results": forward_results, "latency-runs": latency_runs}
