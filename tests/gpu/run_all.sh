#!/usr/bin/env bash
# Every GPU check, on the GPU machine, from the project root after ../shared/tools/gpu-pack.sh:
#   bash tests/gpu/run_all.sh checks   # end-to-end tests, compile flow, CLI tools, sandbox
#   bash tests/gpu/run_all.sh bench    # deno task bench --mode gpu
#   bash tests/gpu/run_all.sh two      # two-GPU checks (a machine with 2 GPUs)
#   bash tests/gpu/run_all.sh router   # a GPU node behind kcoral router; CLI tools through it
#   bash tests/gpu/run_all.sh router-bench  # bench/router_bench.ts --mode gpu
#   bash tests/gpu/run_all.sh mcp      # kcoral mcp: benchmark_kernel and profile on the GPU
#   bash tests/gpu/run_all.sh default-config  # fresh workers and the sandbox: their rows, fidelity
#   bash tests/gpu/run_all.sh trust    # activity timer, GPU-state receipt, GPU gate, deferred
#                                      # worker contexts, script lease
#   bash tests/gpu/run_all.sh eval     # kcoral eval: honest = reference, time to verdict, the zoo
#   bash tests/gpu/run_all.sh operators  # /metrics and /status of a GPU server; the runtime from a URL
# Logs go to $OUT (or ./gpu-logs); a summary goes to stdout.
set -u
cd "$(dirname "$0")/../.."
# shellcheck disable=SC1091
[ -f .gpu/env.sh ] && source .gpu/env.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
part=${1:-all}

step() { # name, timeout seconds, command...
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc ($((SECONDS - start)) s)"
  grep -E "PASS|FAIL|RESULT|passed|failed|median|ms/|target" "$OUT/$name.log" | grep -v "^\s*$" | tail -40
}

if [ "$part" = checks ] || [ "$part" = all ]; then
  step server_gpu 240 deno test -A --filter "gpu server (" tests/gpu/server.gpu.ts
  KCORAL_TEST_SANDBOX=bubblewrap step server_gpu_sandbox 240 \
    deno test -A --filter "gpu server (" tests/gpu/server.gpu.ts
  step compile_gpu 240 deno run -A tests/gpu/compile_gpu.ts --expect-arch sm_90a
  step nondumpable_cuinit 240 python3 tests/gpu/nondumpable_cuinit.py
  deno run -A cli.ts server --device gpu --gpus 0 --port 8123 --log-dir '' --no-log-console \
    >"$OUT/cli_server.log" 2>&1 &
  server=$!
  for _ in $(seq 1 120); do
    grep -q "Application startup complete." "$OUT/cli_server.log" && break
    sleep 1
  done
  KCORAL_URL=http://127.0.0.1:8123 step cli_gpu 240 bash tests/gpu/cli_gpu.sh
  kill -TERM "$server"
  wait "$server"
  echo "== cli server exit: $?"
  step sandbox_gpu 300 deno run -A tests/gpu/sandbox_gpu.ts --requests 60
fi
if [ "$part" = eval ]; then # issue 40: split-trust verdicts on the GPU
  step eval_gpu 1800 deno run -A tests/gpu/eval_gpu.ts --runs 7
  step eval_bench 900 deno run -A bench/eval_bench.ts --mode gpu --runs 7 \
    --reference evals/problems/gemm_fp32/reference.py \
    --candidate evals/problems/gemm_fp32/honest/torch_same.py
fi
if [ "$part" = operators ]; then # issue 42: build info, process metrics, durations, runtime from a URL
  step operators_gpu 600 deno run -A tests/gpu/operators_gpu.ts
fi
if [ "$part" = two ]; then # two GPUs: gpu_count=2, NCCL all-reduce, cpu_only, scheduling, isolation
  step two_gpu 400 deno run -A tests/gpu/two_gpu.ts
  KCORAL_TEST_SANDBOX=bubblewrap step two_gpu_sandbox 400 deno run -A tests/gpu/two_gpu.ts
fi
if [ "$part" = router ]; then # one GPU node behind a Router: tensors, CUDA-event times, CLI tools
  rm -f "$OUT/router.done"
  deno run -A tests/gpu/router_gpu.ts --hold-until "$OUT/router.done" >"$OUT/router_gpu.log" 2>&1 &
  checks=$!
  for _ in $(seq 1 240); do
    grep -q "ROUTER_URL=\|RESULT" "$OUT/router_gpu.log" && break
    sleep 1
  done
  url=$(sed -n 's/^ROUTER_URL=//p' "$OUT/router_gpu.log")
  if [ -n "$url" ]; then
    for _ in $(seq 1 120); do grep -q "holding the deployment" "$OUT/router_gpu.log" && break; sleep 1; done
    KCORAL_URL=$url step cli_gpu_routed 300 bash tests/gpu/cli_gpu.sh
  fi
  touch "$OUT/router.done"
  wait "$checks"
  echo "== router_gpu: rc=$?"
  grep -E "PASS|FAIL|RESULT" "$OUT/router_gpu.log"
fi
if [ "$part" = mcp ]; then # kcoral mcp through the SDK's client: health, benchmark_kernel, profile
  step mcp_gpu 600 deno run -A tests/gpu/mcp_gpu.ts --expect-arch sm_90a
  sed -n '/^PASS\|^FAIL/,/^}/p' "$OUT/mcp_gpu.log" | grep -E '"(median|min|max|device|arch|summary|errors|nvcc_command)"' | head -40
fi
if [ "$part" = default-config ]; then # the default configuration's rows (fresh, bubblewrap)
  step fresh_workers 300 deno run -A bench/probes/fresh_workers_ab.ts . --rounds 3 gpu
  step trivial_bubblewrap 120 deno run -A bench/probes/trivial_latency.ts gpu bubblewrap
  step closed_loop_bubblewrap 120 deno run -A bench/probes/closed_loop.ts gpu bubblewrap
  step sandbox_worker_time 120 python3 bench/probes/sandbox_worker_time.py gpu
  start=$SECONDS
  timeout 560 deno run -A bench/main.ts --mode gpu --only fidelity >"$OUT/bench-fidelity.md" 2>&1
  echo "== bench fidelity: rc=$? ($((SECONDS - start)) s)"
  cat "$OUT/bench-fidelity.md"
fi
if [ "$part" = trust ]; then # timings nothing slips past; the gate's lease at the first CUDA call
  PYTHONPATH=runtime_py:runtime_py/kcoral_runtime/compat step timing_gpu 400 \
    python3 tests/gpu/timing_gpu.py
  grep -E "^\|" "$OUT/timing_gpu.log"
  PYTHONPATH=runtime_py step gpu_state_gpu 120 python3 runtime_py/tests/gpu_state_gpu_check.py
  step gate_gpu 300 python3 tests/gpu/gate_gpu.py
  step deferred_context_gpu 300 python3 tests/gpu/deferred_context_gpu.py
  start=$SECONDS
  timeout 500 deno run -A bench/script_lease_bench.ts --mode gpu >"$OUT/bench-script-lease.md" \
    2>"$OUT/bench-script-lease.err"
  echo "== bench script lease: rc=$? ($((SECONDS - start)) s)"
  cat "$OUT/bench-script-lease.md"
  tail -5 "$OUT/bench-script-lease.err"
fi
if [ "$part" = router-bench ]; then
  start=$SECONDS
  timeout 540 deno run -A bench/router_bench.ts --mode gpu >"$OUT/bench-router.md" 2>"$OUT/bench-router.err"
  echo "== bench router: rc=$? ($((SECONDS - start)) s)"
  cat "$OUT/bench-router.md"
  tail -5 "$OUT/bench-router.err"
fi
if [ "$part" = final2 ]; then
  step compile_gpu 100 deno run -A tests/gpu/compile_gpu.ts --expect-arch sm_90a
  for only in server fidelity; do
    start=$SECONDS
    timeout 200 deno run -A bench/main.ts --mode gpu --only "$only" >"$OUT/bench-$only.md" 2>&1
    echo "== bench $only: rc=$? ($((SECONDS - start)) s)"
    cat "$OUT/bench-$only.md"
  done
fi
if [ "$part" = final ]; then
  start=$SECONDS
  timeout 330 deno run -A bench/main.ts --mode gpu >"$OUT/bench.md" 2>&1
  echo "== bench: rc=$? ($((SECONDS - start)) s)"
  cat "$OUT/bench.md"
  step compile_gpu 100 deno run -A tests/gpu/compile_gpu.ts --expect-arch sm_90a
  step sandbox_gpu 130 deno run -A tests/gpu/sandbox_gpu.ts --requests 40
fi
if [ "$part" = bench ] || [ "$part" = all ]; then
  start=$SECONDS
  timeout 560 deno run -A bench/main.ts --mode gpu >"$OUT/bench.md" 2>&1
  echo "== bench: rc=$? ($((SECONDS - start)) s)"
  cat "$OUT/bench.md"
fi
