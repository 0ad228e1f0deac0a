#!/usr/bin/env bash
# The one GPU entry point: every GPU test and benchmark, in parts that one run combines.
#   bash scripts/gpu_check.sh tests,ladder-batch,ladder-ragged      (comma- or space-separated; default: all)
# The parts a run of the course needs:
#   tests            every stage's GPU tests in one pytest process (-m gpu, slow ones included), and
#                    <GPU>_<date>_gpu-tests.json: passed, failed and skipped per stage (common/bench/gpu_tests.py);
#                    tests-NN-MM (stages NN to MM) and tests-cross (tests/) run a shard of it; TEST_PATHS and
#                    TEST_ARGS (-k ...) narrow it (the summary then says so: a subset, not complete); CLI_STAGES
#                    ("01 13"): each stage's command line once on the 1B, after the tests (default: none)
#   ladder-W         `common.bench --ladder --workload W`, W: load, latency, batch, ragged, long; ladder-ragged-kv:
#                    ragged at its KV budget (workloads.LADDERS: every engine the same KV cache memory)
#   hf-cb            transformers' continuous batching on ragged, alone (one repeat, about 170 s)
#   serve-W          the server over stage $SERVE_STAGE (default 11) under the harness's clients on workload W
#                    (ragged, prefix, chat), the engine alone in the same run, then the fault run
#   profile          a decode step kernel by kernel (common.profile; needs cupti-python): PROFILE_RUNS of stage:batch
# and the specialised ones, for a chapter's question: bench01-02, bench03 .. bench12, bench10-gemv, launch (pytest-
# benchmark files), ncu10, ncu12 (Nsight Compute), builds (scripts/stage_builds.sh's folders, one after another),
# prefill-profile, host-profile, latency, batch, long, long-hf-32k, prefix, ragged, ragged-kv (the harness on
# chosen engines: LATENCY_STAGES, BATCH_STAGES, LONG_STAGES, RAGGED_STAGES, PREFIX_STAGES), serve, serve-rate,
# multigpu (stage13 split over the machine's GPUs).
# Each part prints one line `== PART: rc, wall time, its summary` and writes its log, and its result files, into one
# folder: $GPU_LOGS, default gpu-logs/<date>-<GPU>/ (git-ignored); the result files a chapter shows are copied into
# benchmarks/results/ and committed. Compiled kernels go to $TINY_VLLM_KERNEL_CACHE, default .kernel-cache/ (git-
# ignored): carried to the next machine, it spares that run NVRTC (common/compile.py says why no stale cubin can be
# used). LOGS_TAR=F, KERNELS_TAR=F: the logs and the kernels as one archive each, to copy off the machine.
# `bash scripts/gpu_check.sh LOGS PARTS` (a folder first) is the same with $GPU_LOGS=LOGS.
# COMMIT: the commit the tree is (default: git's HEAD, or a file COMMIT), named in the tests part's summary. PART_LIMIT_S: each
# step's time limit (default 540 s), so a hang still leaves the other logs behind.
set -uo pipefail
command -v nvidia-smi >/dev/null || { echo "$0: no NVIDIA GPU on this machine (nvidia-smi not found); it runs the GPU tests and benchmarks; on a CPU: python -m pytest"; exit 2; }
# `gpu_check.sh LOGS PARTS`, the older form the chapters' commands use, names the log folder first
is_part() { [[ $1 =~ ^(all|tests|tests-[0-9][0-9]-[0-9][0-9]|tests-cross|ladder-[a-z-]+|hf-cb|serve|serve-[a-z]+|profile|bench[0-9a-z-]*|launch|ncu1[02]|builds|prefill-profile|host-profile|latency|batch|long|long-hf-32k|prefix|ragged|ragged-kv|multigpu)(,.*)?$ ]]; }
if [ $# -ge 2 ] && ! is_part "$1"; then GPU_LOGS=$1; shift; fi
part=$(echo "${*:-all}" | tr ' ' ,)
for p in ${part//,/ }; do   # a misspelt part would run nothing and pass
  is_part "$p" || { echo "$0: no part '$p' (the parts are listed at the top of $0)"; exit 2; }
done
want() { [ "$part" = all ] || [[ ",$part," == *",$1,"* ]]; }
export PYTHONUNBUFFERED=1 TINY_VLLM_CACHE=${TINY_VLLM_CACHE:-/tmp/tiny-vllm-cache}
export TINY_VLLM_KERNEL_CACHE=${TINY_VLLM_KERNEL_CACHE:-$PWD/.kernel-cache}
export NCCL_NVLS_ENABLE=0    # NVLink multicast off, as stage13's communicator.py sets it (it says why)
if [ -d .whl ]; then  # a machine without nvmath-python installed: install the wheels in .whl/
  rm -rf /tmp/site    # a warm machine keeps the last run's; two versions of a package would break the import
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
status=0
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr " " -)
day=$(date -u +%F)
logs=${GPU_LOGS:-gpu-logs/$day-$gpu}
commit=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || cat COMMIT 2>/dev/null || echo unknown)}   # COMMIT: a tree without .git
mkdir -p "$logs" "$TINY_VLLM_KERNEL_CACHE"
limit=${PART_LIMIT_S:-540}
# run NAME CMD...: CMD under the time limit, its output in $logs/NAME.log, then one summary line
run() {
  local name=$1; shift; local t0=$SECONDS
  echo "== $name: $*"
  timeout "$limit" "$@" 2>&1 | tee "$logs/$name.log"; local rc=${PIPESTATUS[0]}
  local said; said=$(grep -E "^=+ .* in [0-9.]+s|^[0-9]+ (passed|failed).* in [0-9.]+s|^wrote " "$logs/$name.log" \
      | tail -1 | sed -E 's/^=+ | =+$//g')
  echo "== $name: rc=$rc, $((SECONDS - t0)) s${said:+: $said}"
  [ "$rc" = 0 ] || status=1
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$logs/gpu.txt"
{ date -u; echo "day $day"; echo "commit $commit"; } | tee -a "$logs/gpu.txt"
echo "== kernels cached at the start: $(ls "$TINY_VLLM_KERNEL_CACHE" | wc -l)"
# tests: every stage's GPU tests; tests-NN-MM: stages NN to MM alone, tests-cross: tests/ alone (the whole tier
# took about 25 minutes in one process on an H100, 2026-12-08: more than one command, so it also runs in shards)
shards=(); want tests && shards+=("gpu-tests:${TEST_PATHS:-}")
for p in ${part//,/ }; do
  if [[ $p =~ ^tests-([0-9][0-9])-([0-9][0-9])$ ]]; then
    paths=$(for d in stage[0-9][0-9]_*; do n=${d:5:2}; [ "$((10#$n))" -ge "$((10#${BASH_REMATCH[1]}))" ] \
        && [ "$((10#$n))" -le "$((10#${BASH_REMATCH[2]}))" ] && echo "$d"; done)
    [ -n "$paths" ] || { echo "$0: $p: no stage folder in that range"; exit 2; }
    shards+=("gpu-$p:$(echo $paths)")
  elif [ "$p" = tests-cross ]; then shards+=("gpu-tests-cross:tests"); fi
done
shard_logs=()
for shard in "${shards[@]}"; do   # each case's outcome as it runs (-v), so a run cut off still says what passed
  name=${shard%%:*}; shard_logs+=("$logs/$name.log")
  run "$name" python3 -m pytest -m gpu -p no:cacheprovider -v -ra --durations=30 --junitxml="$logs/$name.xml" \
      ${TEST_ARGS:-} ${shard#*:}
done
if [ ${#shards[@]} -gt 0 ]; then   # the per-stage summary of this run's shards, a cut-off one included
  python3 -m common.bench.gpu_tests "${shard_logs[@]}" --commit "$commit" --gpu "$(head -2 "$logs/gpu.txt" \
      | tail -1 | cut -d, -f1)" --selected "$(echo ${TEST_ARGS:-} ${TEST_PATHS:-})" --out "$logs"
  for st in ${CLI_STAGES-}; do   # CLI_STAGES="01 13": each stage's command line once on the 1B
    if [ "$st" = 01 ]; then args=(); else args=(--max-tokens 24 --seed 1); fi
    run "cli-$st" python3 -m "$(basename stage${st}_*)" --prompt "Hello, world!" --chat "${args[@]}"
  done
fi
# a ladder: every stage that runs the workload and its baselines in one run (the README's table and chart)
for w in load latency batch ragged long; do
  want "ladder-$w" && run "ladder-$w" python3 -m common.bench --ladder --workload "$w" --out "$logs"
done
if want ladder-ragged-kv; then   # ragged at the budget its ladder names: what paging buys when memory is short
  read -r gib len <<< "$(python3 -c 'from common.bench.workloads import LADDERS; b = LADDERS["ragged"].budget; print(b[0], b[1])')"
  run ladder-ragged-kv python3 -m common.bench --ladder --workload ragged --kv-cache-gib "$gib" --max-model-len "$len" \
      --out "$logs"
fi
want hf-cb && run harness-ragged-hf-cb python3 -m common.bench --stages hf-cb --workload ragged --repeats 1 --out "$logs"
for w in ragged prefix chat; do   # the server under the harness's clients, then the fault run (nothing held after)
  want "serve-$w" && run "serve-$w-${SERVE_STAGE:-11}" python3 -m common.bench_serving --stage "${SERVE_STAGE:-11}" \
      --workload "$w" --fault ${SERVE_ARGS:-} --out "$logs"
done
if want bench01-02; then
  run bench-load python3 -m pytest stage01_loading/bench_load.py --benchmark-only -p no:cacheprovider \
      --benchmark-json "$logs/${gpu}_${day}_pytest-bench-load.json" -q
  run bench-forward python3 -m pytest stage02_forward/bench_forward.py --benchmark-only -p no:cacheprovider \
      --benchmark-json "$logs/${gpu}_${day}_pytest-bench-forward.json" -q
  run harness-load python3 -m common.bench --stages 01 --workload load --repeats 3 --out "$logs"
fi
if want bench03; then
  run bench-kvcache python3 -m pytest stage03_kvcache/bench_kvcache.py --benchmark-only -p no:cacheprovider \
      --benchmark-json "$logs/${gpu}_${day}_pytest-bench-kvcache.json" -q
  # one repeat: stage02 recomputes the whole sequence each step, so 1024 new tokens take it minutes
  run harness-growth python3 -m common.bench --stages 02,03 --workload growth --repeats 1 --out "$logs"
fi
if want bench04; then
  run bench-batch python3 -m pytest stage04_static_batch/bench_batch.py --benchmark-only -p no:cacheprovider \
      --benchmark-json "$logs/${gpu}_${day}_pytest-bench-batch.json" -q
fi
if want bench05; then
  run bench-continuous python3 -m pytest stage05_continuous_batch/bench_batch.py --benchmark-only -p no:cacheprovider \
      --benchmark-json "$logs/${gpu}_${day}_pytest-bench-continuous.json" -q
fi
if want bench06; then
  run bench-attention python3 -m pytest stage06_online_softmax/bench_attention.py --benchmark-only -p no:cacheprovider \
      --benchmark-json "$logs/${gpu}_${day}_pytest-bench-attention.json" -q
fi
if want bench07; then
  run bench-paged-attention python3 -m pytest stage07_paged_attention/bench_attention.py --benchmark-only \
      -p no:cacheprovider --benchmark-json "$logs/${gpu}_${day}_pytest-bench-paged-attention.json" -q
fi
if want bench10-gemv; then   # gemv.cu's kinds alone at the 1B's layer shapes: what each fusion adds to the stream
  run bench-gemv-10 python3 -m pytest stage10_fused_kernels/bench_gemv.py --benchmark-only -p no:cacheprovider \
      --benchmark-json "$logs/${gpu}_${day}_pytest-bench-gemv10.json" -q
fi
if want launch; then    # chain.cu launched 64 times in a graph: the fixed cost of a kernel boundary, PDL or not
  run bench-launch python3 -m pytest tests/bench_launch.py --benchmark-only -p no:cacheprovider \
      --benchmark-json "$logs/${gpu}_${day}_pytest-bench-launch.json" -q
fi
if want ncu10; then     # Nsight Compute on stage10's decode attention at batch 1 (256 keys in 1 and 4 splits): where
  for splits in 1 4; do  # its 6-9 us a layer go, against a floor of 0.15: stall reasons, memory, the launch
    run "ncu-decode-256-split$splits" ncu --clock-control none -k "regex:attention_tiles" --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
        --section LaunchStats --section Occupancy python3 -m pytest stage10_fused_kernels/bench_attention.py \
        -k "decode_split and $splits-256" --benchmark-only -p no:cacheprovider -q
  done
fi
if want ncu12; then     # Nsight Compute on one launch of each prefill kernel at 8,192 tokens: pipes, occupancy, stalls
  for spec in "hopper 64" "hopper 128" "mma 64"; do
    read -r kernel hd <<< "$spec"
    [ "$kernel" = hopper ] && name=attention_hopper || name=attention_tiles
    run "ncu-$kernel-hd$hd-8k" ncu --clock-control none -k "regex:$name" --launch-count 1 --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats \
        python3 -m pytest stage12_hopper_attention/bench_attention.py -k "prefill and 8192-$hd-$kernel" \
        --benchmark-only -p no:cacheprovider -q
    # how busy each pipe was: the tensor cores (wgmma and mma.sync), MUFU's exponentials (xu), FP32, integer
    pipes=sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active
    for p in xu fma alu; do pipes+=,sm__inst_executed_pipe_$p.avg.pct_of_peak_sustained_active; done
    run "ncu-pipes-$kernel-hd$hd-8k" ncu --clock-control none -k "regex:$name" --launch-count 1 --metrics "$pipes" \
        python3 -m pytest stage12_hopper_attention/bench_attention.py -k "prefill and 8192-$hd-$kernel" \
        --benchmark-only -p no:cacheprovider -q
  done
fi
if want builds; then    # one stage's builds from several revisions (scripts/stage_builds.sh), tested then timed in one run
  for d in builds/*/; do
    b=$(basename "$d")
    tests=${BUILD_TESTS:-prompt_tiles or chunked or packed or boundaries or prefill or huge}
    [ "$tests" = none ] || run "gpu-tests-$b" python3 -m pytest -m gpu -p no:cacheprovider -q -rs \
        "$d/tests/test_kernels_gpu.py" -k "$tests"
    [ "${BUILD_BENCH:-}" = none ] && continue
    benches=(); for f in ${BUILD_BENCH:-bench_attention.py}; do benches+=("$d/$f"); done
    run "bench-$b" python3 -m pytest "${benches[@]}" -k "${BUILD_BENCH_K:-prefill}" \
        --benchmark-only -p no:cacheprovider -q --benchmark-json "$logs/${gpu}_${day}_pytest-bench-$b.json"
  done
fi
if want bench12; then   # the prefill kernels alone: attention_hopper (wgmma, TMA) beside attention_tiles
  run bench-attention-12 python3 -m pytest stage12_hopper_attention/bench_attention.py -k prefill --benchmark-only \
      -p no:cacheprovider --benchmark-json "$logs/${gpu}_${day}_pytest-bench-attention12.json" -q
fi
# a decode step's GPU and host time, kernel by kernel and replayed (and, from 09, without asynchronous scheduling)
for st in 08 09 10 11; do
  if want "bench$st"; then
    run "bench-step-$st" python3 -m pytest stage${st}_*/bench_batch.py --benchmark-only -p no:cacheprovider \
        --benchmark-json "$logs/${gpu}_${day}_pytest-bench-step-$st.json" -q
  fi
done
if want prefill-profile; then   # one long prompt's prefill by kernel group: PREFILL_RUNS of stage:tokens[:budget]
  for spec in ${PREFILL_RUNS:-12:32768 12:32768:8192}; do
    IFS=: read -r st n budget <<< "$spec"
    name="prefill-profile-$st-$n${budget:+-tok$budget}"
    # the SM clock, power and throttle reasons every 20 ms beside it: a long prompt runs under the power cap
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
        --format=csv -lms 20 > "$logs/clocks-$name.csv" 2>&1 & sampler=$!
    run "$name" python3 -m common.bench.prefill_profile --stage "$st" \
        --prompt-tokens "$n" ${budget:+--max-num-batched-tokens "$budget"} --out "$logs"
    kill "$sampler"
  done
fi
if want profile; then   # needs cupti-python: carried as a wheel in .whl like nvmath
  for spec in ${PROFILE_RUNS:-07:1 08:1 09:1 10:1 10:64}; do
    IFS=: read -r st b eager <<< "$spec"
    run "profile-$st-b$b${eager:+-eager}" python3 -m common.profile --stage "$st" --batch "$b" \
        ${eager:+--enforce-eager} --out "$logs"
  done
fi
# the harness: every figure a median of 3 runs with its spread, against the previous stage and the baselines
want latency && run harness-latency python3 -m common.bench --stages ${LATENCY_STAGES:-hf,hf-compile,03,04,05} \
    --workload latency --out "$logs"
want batch && run harness-batch python3 -m common.bench --stages ${BATCH_STAGES:-03,04,05} --workload batch \
    --out "$logs"
want long && run harness-long python3 -m common.bench --stages ${LONG_STAGES:-hf-sdpa,03,04,05,06} --workload long --lengths ${LONG_LENGTHS:-2048,8192,32768} \
    --budget-s ${LONG_BUDGET_S:-0} --out "$logs"
# the naive attention of stages 02-05 needs ~1 min per 32K prefill: long-hf-32k measures the baseline alone there
want long-hf-32k && run harness-long-hf-32k python3 -m common.bench --stages hf-sdpa --workload long --lengths 32768 \
    --out "$logs"
# the server under load: 256 concurrent streaming clients against the engine alone, then a fault run;
# serve-rate: the same requests arriving at a fixed rate (Poisson, SERVE_RATE per second)
# SERVE_ARGS: more flags for both (e.g. --no-engine-process: the engine on a thread of the server's process)
want serve && run serve-ragged python3 -m common.bench_serving --stage ${SERVE_STAGE:-05} --fault ${SERVE_ARGS:-} \
    --out "$logs"
want serve-rate && run serve-ragged-rate python3 -m common.bench_serving --stage ${SERVE_STAGE:-05} --no-direct \
    --request-rate ${SERVE_RATE:-16} ${SERVE_ARGS:-} --out "$logs"
# where the host's time goes in a decode step of 256 sequences: cProfile over step(), the runner timed apart
# (token ids, as the server asks; and streamed text, as generate() callers ask)
if want host-profile; then
  for st in ${HOST_PROFILE_STAGES:-08 09 10}; do
    run "host-profile-$st" python3 -m common.bench.host_profile --stage "$st" --batch 256 \
        --out "$logs/host-profile-$st.txt"
    run "host-profile-$st-text" python3 -m common.bench.host_profile --stage "$st" --batch 256 --text \
        --out "$logs/host-profile-$st-text.txt"
  done
fi
# prefix caching: stage11 against stage10 on requests that share a 2048-token system prompt, and on conversations
# whose every turn repeats the turns before it
if want prefix; then
  for w in prefix chat; do
    run "harness-$w" python3 -m common.bench --stages ${PREFIX_STAGES:-10,11} --workload "$w" --out "$logs"
  done
fi
want ragged && run harness-ragged python3 -m common.bench --stages ${RAGGED_STAGES:-04,05} --workload ragged --verbose --out "$logs"
if want ragged-kv; then   # the same KV cache memory for every engine: what paging buys at a fixed budget
  for gib in ${KV_GIBS:-4 16}; do
    run "harness-ragged-kv$gib" python3 -m common.bench --stages ${RAGGED_STAGES:-06,07} --workload ragged \
        --kv-cache-gib "$gib" --max-model-len ${RAGGED_LEN:-4096} --out "$logs"
  done
fi
gpus=$(nvidia-smi -L | wc -l)
if want multigpu && [ "$gpus" -lt 2 ]; then
  echo "== multigpu: $gpus GPU here, nothing to split over"
elif want multigpu; then    # a machine of several GPUs: stage13's split, tested then measured
  tps=13; for k in 2 4; do [ "$gpus" -ge "$k" ] && tps="$tps,13-tp$k"; done
  run gpu-tests-multigpu python3 -m pytest -m multigpu -p no:cacheprovider -q -rs stage13_tensor_parallel
  run profile-13-b1-tp2 python3 -m common.profile --stage 13 --batch 1 --tensor-parallel-size 2 --out "$logs"
  run profile-13-b1-tp2-8b python3 -m common.profile --stage 13 --batch 1 --tensor-parallel-size 2 \
      --model llama-3.1-8b --out "$logs"
  run harness-latency-1b-tp python3 -m common.bench --stages 13,13-tp2 --workload latency --out "$logs"
  run harness-latency-8b-tp python3 -m common.bench --model llama-3.1-8b --stages "$tps" --workload latency \
      --out "$logs"
  run harness-ragged-8b-tp python3 -m common.bench --model llama-3.1-8b --stages "$tps" --workload ragged \
      --out "$logs"
fi
if [ "$part" = all ]; then
  run cpu-tests python3 -m pytest -m "not gpu" -p no:cacheprovider -q
fi
[ -n "${LOGS_TAR:-}" ] && tar czf "$LOGS_TAR" -C "$logs" .   # all the logs as one file, to copy off the machine
[ -n "${KERNELS_TAR:-}" ] && tar czf "$KERNELS_TAR" -C "$TINY_VLLM_KERNEL_CACHE" .
echo "== overall status $status ($(ls "$TINY_VLLM_KERNEL_CACHE" | wc -l) kernels cached, logs in $logs)"
exit $status
