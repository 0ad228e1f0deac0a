"""One-off (2026-12-04, H200): where stage08's loop time goes on `ragged`, split by steps with and without prompt rows.
Run from the repository root: PYTHONPATH=$PWD python3 benchmarks/logs/2026-12-04-H200-stage08-ragged-steps/ragged_steps.py"""
from dataclasses import replace

import numpy as np

from common.bench import build_engine
from common.workloads import make_requests

engine = build_engine("08", "llama-3.2-1b", max_model_len=2048)
reqs = make_requests("ragged", 128000)
prompts, params = [r[0] for r in reqs], [r[1] for r in reqs]
engine.generate(prompts[:64], [replace(p, max_tokens=4) for p in params[:64]])   # warm-up
for run in range(2):
    engine.generate(prompts, params)
    st = engine.llm.scheduler.stats
    host, wait = np.array(st.host_s), np.array(st.forward_s)
    waited_prompt = np.array(st.forward_prefill_rows) > 0          # the wait was for a step with prompt rows
    launched_prompt = np.zeros(len(host), bool)                    # the call launched a step with prompt rows
    n = min(len(st.prefill_rows), len(host))
    launched_prompt[:n] = np.array(st.prefill_rows[:n]) > 0
    total = host.sum() + wait.sum()
    print(f"run {run}: {len(host)} calls, loop {total:.3f} s: host {host.sum():.3f} s, waits {wait.sum():.3f} s; "
          f"prefill_time_share {st.prefill_time_share:.3f}, host_time_share {st.host_time_share:.3f}")
    for name, m in (("calls that launched a step with prompt rows", launched_prompt),
                    ("calls that waited for a step with prompt rows", waited_prompt),
                    ("calls of decode rows only, both ways", ~launched_prompt & ~waited_prompt)):
        if m.any():
            print(f"  {name}: {m.sum()} calls, host {host[m].sum():.3f} s (median {np.median(host[m]) * 1e3:.2f} "
                  f"ms), waits {wait[m].sum():.3f} s (median {np.median(wait[m]) * 1e3:.2f} ms)")
    rows = np.array(st.prefill_rows[:n])
    print(f"  prompt rows a step with any: median {np.median(rows[rows > 0]):.0f}, max {rows.max()}")
