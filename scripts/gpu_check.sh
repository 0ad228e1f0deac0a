#!/usr/bin/env bash
# Every GPU test and benchmark in one call (the H200 is lent by the half hour). Logs go into $1 (default
# gpu-logs/). On the lent machine: bash scripts/gpu_check.sh "$OUT"
set -uo pipefail
logs=${1:-gpu-logs}
mkdir -p "$logs"
export PYTHONUNBUFFERED=1 TINY_VLLM_CACHE=${TINY_VLLM_CACHE:-/tmp/tiny-vllm-cache}
if [ -d .whl ]; then  # the lent machine lacks nvmath-python: install the carried wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
status=0
run() { local name=$1; shift; echo "== $name: $*"; "$@" 2>&1 | tee "$logs/$name.log"; local rc=${PIPESTATUS[0]}; echo "== $name rc=$rc"; [ "$rc" = 0 ] || status=1; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$logs/gpu.txt"
date -u | tee -a "$logs/gpu.txt"
run gpu-tests python3 -m pytest -m gpu -p no:cacheprovider -q -rs
run cli python3 -m stage01_loading --prompt "Hello, world!" --chat
run bench-load python3 -m pytest stage01_loading/bench_load.py --benchmark-only -p no:cacheprovider \
    --benchmark-json "$logs/$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr " " -)_$(date -u +%F)_pytest-bench-load.json" -q
run harness python3 -m common.bench --stages 01 --workload load --repeats 3 --out "$logs"
run cpu-tests python3 -m pytest -m "not gpu" -p no:cacheprovider -q
echo "== overall status $status"
exit $status
