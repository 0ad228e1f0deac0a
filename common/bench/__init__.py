"""The measuring tools: the harness and everything it measures with. The commands (each also under its old name,
`python -m common.bench_serving` and `python -m common.profile`):

    python -m common.bench ...            harness.py   every engine in its own process, medians of 3+ runs; --ladder
    python -m common.bench.serving ...    serving.py   the server under load, against the engine alone (client.py:
                                                       one streaming request, timed)
    python -m common.bench.profile ...    profile.py   a decode step kernel by kernel, each against its floor
    python -m common.bench.host_profile   host_profile.py   where the host's time goes in a step (cProfile)

table.py formats the harness's results, measure.py times what they hold, workloads.py defines the request sets
and each workload's ladder, hf_engine.py the transformers baselines (hf, hf-sdpa, hf-compile, hf-cb).

Every tool writes its result files (and the server's log) into USER_RESULTS unless --out names a folder:
`bench-results/`, which git ignores, so that a run of the README's commands leaves the tree clean. The results the
chapters show are copied into benchmarks/results/ and committed (scripts/gpu_check.sh passes --out LOGS).
"""
from pathlib import Path

USER_RESULTS = Path("bench-results")
