"""Tables in the READMEs, generated from code and committed results (never typed by hand).

    python -m common.readme          # rewrite every generated block
    python -m common.readme --check  # exit 1 if a README is out of date (tests/test_readme.py runs this)

A generated block sits between `<!-- generated:NAME -->` and `<!-- end:NAME -->`; NAME picks the generator.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def stage_ladder() -> str:
    """The stage table of the top README: every stage folder with the first line of its chapter."""
    rows = ["| stage | the one idea | chapter |", "| --- | --- | --- |"]
    for stage in sorted(p for p in ROOT.glob("stage[0-9][0-9]_*") if (p / "README.md").exists()):
        title = (stage / "README.md").read_text().splitlines()[0].lstrip("# ").strip()
        idea = title.split(":", 1)[-1].strip()
        rows.append(f"| `{stage.name}` | {idea} | [{stage.name}/README.md]({stage.name}/README.md) |")
    return "\n".join(rows)


def presets() -> str:
    from common.synthetic import PRESETS

    rows = ["| preset | layers | hidden | heads / KV heads | head_dim | MLP | vocab | parameters | bf16 bytes |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, c in PRESETS.items():
        n = c.num_parameters()
        rows.append(f"| `{name}` | {c.num_hidden_layers} | {c.hidden_size} | {c.num_attention_heads} / "
                    f"{c.num_key_value_heads} | {c.head_dim} | {c.intermediate_size} | {c.vocab_size:,} | "
                    f"{n:,} | {2 * n / 1e9:.3f} GB |")
    return "\n".join(rows)


def load_results() -> str:
    """stage01's figures: every committed load result (harness JSON and pytest-benchmark JSON)."""
    rows = ["| date | GPU | measured by | load to GPU, GB/s | plain read of the same bytes, GB/s |",
            "| --- | --- | --- | --- | --- |"]
    for path in sorted(RESULTS.glob("*_load-*.json")):
        r = json.loads(path.read_text())
        s = r["stages"]["stage01_loading"]
        rows.append(f"| {r['date']} | {r['environment']['gpu']} | `common.bench` (median of "
                    f"{len(r['raw']['stage01_loading'])} processes) | {s['load_gb_per_s']:.2f} | "
                    f"{s['plain_read_gb_per_s']:.2f} |")
    for path in sorted(RESULTS.glob("*_pytest-bench-load.json")):
        r = json.loads(path.read_text())
        read = next(b for b in r["benchmarks"] if b["name"] == "test_plain_read")
        gpu = path.name.split("_")[0].replace("-", " ")
        for load in (b for b in r["benchmarks"] if b["name"].startswith("test_load_to_gpu")):
            variant = load["name"].partition("[")[2].rstrip("]") or "default"
            gbps = [b["extra_info"]["bytes"] / b["stats"]["median"] / 1e9 for b in (load, read)]
            rows.append(f"| {r['datetime'][:10]} | {gpu} | `bench_load.py` {variant} (median of "
                        f"{load['stats']['rounds']}) | {gbps[0]:.2f} | {gbps[1]:.2f} |")
    return "\n".join(rows)


def _pytest_bench(suffix: str) -> list[tuple[str, str, dict]]:
    """(date, GPU, {test name: benchmark}) of every committed pytest-benchmark JSON named *_{suffix}.json."""
    out = []
    for path in sorted(RESULTS.glob(f"*_{suffix}.json")):
        r = json.loads(path.read_text())
        out.append((r["datetime"][:10], path.name.split("_")[0].replace("-", " "),
                    {b["name"]: b for b in r["benchmarks"]}))
    return out


def forward_results() -> str:
    """stage02's bench_forward.py figures: prefill tok/s, decode ms per step, and the decode-step split."""
    lines = []
    for date, gpu, b in _pytest_bench("pytest-bench-forward"):
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


def latency_results() -> str:
    """Every committed harness result of the `latency` workload."""
    rows = ["| date | GPU | engine | ms per decode step | time to first token | output tok/s | bandwidth use |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for path in sorted(RESULTS.glob("*_latency-*.json")):
        r = json.loads(path.read_text())
        for stage, s in r["stages"].items():
            rows.append(f"| {r['date']} | {r['environment']['gpu']} | `{stage}` | {s['ms_per_decode_step']:.2f} | "
                        f"{s['ttft_ms']:.2f} ms | {s['output_tok_per_s']:.1f} | "
                        f"{100 * s.get('bandwidth_utilisation', float('nan')):.1f}% of "
                        f"{r['environment']['copy_bandwidth_gb_per_s']:.0f} GB/s |")
    return "\n".join(rows)


def _harness(workload: str) -> list[dict]:
    """Every committed harness result of one workload, oldest first."""
    return [json.loads(p.read_text()) for p in sorted(RESULTS.glob(f"*_{workload}-*.json"))]


def growth_results() -> str:
    """stage03's speed-up over stage02 by generated length (`growth`: a 512-token prompt, 1024 new tokens)."""
    rows = ["| date | GPU | engine | decode tok/s, first 64 new | first 256 | first 1024 |",
            "| --- | --- | --- | --- | --- | --- |"]
    for r in _harness("growth"):
        stages = list(r["stages"].values())
        for name, s in r["stages"].items():
            rows.append(f"| {r['date']} | {r['environment']['gpu']} | `{name}` | " + " | ".join(
                f"{s[f'decode_tok_per_s_at_{n}']:.1f}" for n in (64, 256, 1024)) + " |")
        if len(stages) == 2:
            rows.append(f"| | | ratio, second / first | " + " | ".join(
                f"{stages[1][f'decode_tok_per_s_at_{n}'] / stages[0][f'decode_tok_per_s_at_{n}']:.2f}x"
                for n in (64, 256, 1024)) + " |")
    return "\n".join(rows)


def _split_table(suffix: str, param: str, label: str) -> str:
    """The decode-step split of a pytest-benchmark file: one row per test_decode_step_split[...] case."""
    lines = []
    for date, gpu, b in _pytest_bench(suffix):
        lines += [f"Measured {date} on {gpu} (`test_decode_step_split`, median of 20 steps):", "",
                  f"| {label} | wall | GPU work alone | host time to queue it | bandwidth floor | GPU / floor |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for name in sorted((n for n in b if n.startswith("test_decode_step_split")),
                           key=lambda n: b[n]["extra_info"][param]):
            e = b[name]["extra_info"]
            lines.append(f"| {e[param]} | {e['wall_ms']:.2f} ms | {e['gpu_ms']:.2f} ms | {e['host_queue_ms']:.2f} ms"
                         f" | {e['bandwidth_floor_ms']:.2f} ms | {e['gpu_ms'] / e['bandwidth_floor_ms']:.1f}x |")
    return "\n".join(lines)


def kvcache_split() -> str:
    return _split_table("pytest-bench-kvcache", "cache_length", "cached positions")


def batch_split() -> str:
    return _split_table("pytest-bench-batch", "batch_size", "B (256 cached positions each)")


def batch_results() -> str:
    """`batch`: output tok/s at each B, every engine of each committed run, and the ratio of the last to the first."""
    rows = ["| date | GPU | B | " + " | ".join(f"`{s}`" for s in _harness("batch")[-1]["stages"]) + " | ratio |",
            "| --- | --- | --- | " + " | ".join("---" for _ in _harness("batch")[-1]["stages"]) + " | --- |"]
    for r in _harness("batch"):
        stages = list(r["stages"].values())
        for n in (1, 8, 32, 64):
            rates = [s[f"output_tok_per_s_at_B{n}"] for s in stages]
            rows.append(f"| {r['date']} | {r['environment']['gpu']} | {n} | "
                        + " | ".join(f"{x:,.0f}" for x in rates) + f" | {rates[-1] / rates[0]:.1f}x |")
    return "\n".join(rows)


def ragged_results() -> str:
    """`ragged` (256 requests, prompts and outputs of 100..1024 tokens): throughput and the waste counters."""
    rows = ["| date | GPU | engine | output tok/s | batches | slot waste | padding share | ms per decode step |"
            " median time to first token |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in _harness("ragged"):
        for name, s in r["stages"].items():
            rows.append(f"| {r['date']} | {r['environment']['gpu']} | `{name}` | {s['output_tok_per_s']:,.0f} | "
                        f"{s.get('batches', '-')} | {100 * s['slot_waste']:.1f}% | {100 * s['padding_share']:.1f}% | "
                        f"{s['ms_per_decode_step']:.2f} | {s['ttft_ms'] / 1e3:.1f} s |")
    return "\n".join(rows)


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


GENERATORS = {"stage-ladder": stage_ladder, "presets": presets, "load-results": load_results,
              "forward-results": forward_results, "latency-results": latency_results,
              "batch-arithmetic": batch_arithmetic, "growth-results": growth_results,
              "kvcache-split": kvcache_split, "batch-split": batch_split, "batch-results": batch_results,
              "ragged-results": ragged_results}
BLOCK = re.compile(r"(<!-- generated:([\w-]+) -->\n)(.*?)(<!-- end:\2 -->)", re.S)


def render(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + GENERATORS[m.group(2)]() + "\n" + m.group(4), text)


def readmes() -> list[Path]:
    return [ROOT / "README.md", *sorted(ROOT.glob("stage[0-9][0-9]_*/README.md"))]


def main(argv=None) -> int:
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    stale = []
    for path in readmes():
        old = path.read_text()
        new = render(old)
        if new != old:
            stale.append(path)
            if not check:
                path.write_text(new)
    if check and stale:
        print("out of date (run python -m common.readme): " + ", ".join(str(p.relative_to(ROOT)) for p in stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
