#!/usr/bin/env bash
# End-to-end checks of `kcoral run compute-sanitizer` and `kcoral run ncu` on a real GPU
# (issue 6), and of `kcoral run python` importing `kcoral.builtins` and `kcoral_runtime`.
# Run it on a machine with nvcc and ncu, against a KCoral GPU server that is already running:
#
#   KCORAL_URL=http://127.0.0.1:8000 bash tests/gpu/cli_gpu.sh
#
# KCORAL_CMD overrides the kcoral command (default: deno run -A <repo>/cli.ts);
# NVCC_FLAGS adds nvcc flags (e.g. -arch=sm_90). Prints PASS/FAIL per check and a RESULT
# line; exits 1 if any check failed. run-iket is not checked here: IKET is not installable
# anywhere we can reach (tests/cli_run_test.ts uses a stand-in executable instead).

set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
KCORAL_CMD="${KCORAL_CMD:-deno run -A $ROOT/cli.ts}"
read -r -a KCORAL <<<"$KCORAL_CMD"
if [[ -z "${KCORAL_URL:-}" ]]; then
  echo "set KCORAL_URL to the URL of a running KCoral GPU server" >&2
  exit 2
fi
export KCORAL_URL

WORK="$(mktemp -d "${TMPDIR:-/tmp}/kcoral-cli-gpu.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" || exit 2
mkdir exp

PASSED=0
FAILED=0
pass() { echo "PASS $1"; PASSED=$((PASSED + 1)); }
fail() {
  echo "FAIL $1: $2"
  FAILED=$((FAILED + 1))
  if [[ -n "${3:-}" && -f "$3" ]]; then sed 's/^/    | /' "$3" | tail -n 40; fi
}

# kcoral_run NAME ARGS...: run `kcoral run ARGS...`; output in NAME.out, exit in $CODE.
kcoral_run() {
  local name="$1"
  shift
  "${KCORAL[@]}" run "$@" >"$name.out" 2>&1
  CODE=$?
  echo "  \$ kcoral run $* -> exit $CODE" >>"$WORK/commands.log"
}

# ---- programs -----------------------------------------------------------------------

cat >exp/kernels.cuh <<'CUDA'
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(call)                                                                    \
  do {                                                                                 \
    cudaError_t status_ = (call);                                                      \
    if (status_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(status_));            \
      return 2;                                                                        \
    }                                                                                  \
  } while (0)

// Writes out[i] = 2 * in[i] for i < limit; the launch covers `threads` threads.
__global__ void scale(const int *in, int *out, int limit) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < limit) out[i] = 2 * in[i];
}

// Runs `scale` over n elements with a bound of `limit` and checks the first n results.
inline int run_scale(int n, int limit) {
  int *in = nullptr, *out = nullptr;
  CHECK(cudaMalloc(&in, n * sizeof(int)));
  CHECK(cudaMalloc(&out, n * sizeof(int)));
  int *host = static_cast<int *>(std::malloc(n * sizeof(int)));
  for (int i = 0; i < n; ++i) host[i] = i;
  CHECK(cudaMemcpy(in, host, n * sizeof(int), cudaMemcpyHostToDevice));
  scale<<<(limit + 255) / 256, 256>>>(in, out, limit);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy(host, out, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    if (host[i] != 2 * i) {
      std::fprintf(stderr, "wrong result at %d\n", i);
      return 3;
    }
  }
  std::printf("scaled %d elements\n", n);
  std::free(host);
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  return 0;
}
CUDA
cat >exp/clean.cu <<'CUDA'
#include "kernels.cuh"
int main() { return run_scale(1000, 1000); }
CUDA
# Planted bug: the bound is 1024, the buffers hold 1000 ints: 24 reads and writes past the
# end of both allocations.
cat >exp/oob.cu <<'CUDA'
#include "kernels.cuh"
int main() { return run_scale(1000, 1024); }
CUDA
cat >exp/capture.py <<'PY'
import torch

x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
y = x * 2.0 + 1.0
torch.cuda.synchronize()
print("capture.py launched kernels, checksum", float(y[:4].sum()))
PY

echo "kcoral: ${KCORAL[*]}"
echo "server: $KCORAL_URL"
read -r -a EXTRA_NVCC <<<"${NVCC_FLAGS:-}"
if nvcc -lineinfo "${EXTRA_NVCC[@]}" -o exp/clean exp/clean.cu >build.out 2>&1 &&
  nvcc -lineinfo "${EXTRA_NVCC[@]}" -o exp/oob exp/oob.cu >>build.out 2>&1; then
  pass "nvcc builds the clean and the out-of-bounds programs"
else
  fail "nvcc builds the clean and the out-of-bounds programs" "see the compiler output" build.out
fi

# ---- kcoral and kcoral_runtime in a kcoral run script ------------------------------------

# Imports only: benchmark is not called here.
kcoral_run imports python --timeout 120 -- -c "
import kcoral, kcoral_runtime
from kcoral.builtins import benchmark
assert callable(benchmark)
print('kcoral', kcoral.__file__)
print('kcoral_runtime', kcoral_runtime.__file__)
print('imports ok')"
if [[ $CODE -eq 0 ]] && grep -q "^imports ok$" imports.out; then
  pass "kcoral run python imports kcoral.builtins.benchmark and kcoral_runtime"
  sed 's/^/    /' imports.out | grep -v "imports ok"
else
  fail "kcoral run python imports kcoral.builtins.benchmark and kcoral_runtime" "exit $CODE" \
    imports.out
fi

# ---- compute-sanitizer ----------------------------------------------------------------

if [[ -x exp/oob ]]; then
  kcoral_run sanitizer-oob compute-sanitizer --send exp/oob --timeout 600 \
    -- --tool memcheck --error-exitcode 1 ./oob
  if [[ $CODE -eq 1 ]] && grep -q "Invalid __global__ \(read\|write\)" sanitizer-oob.out &&
    grep -q "ERROR SUMMARY: [1-9]" sanitizer-oob.out; then
    pass "compute-sanitizer memcheck on ./oob exits 1 and reports the invalid access"
  else
    fail "compute-sanitizer memcheck on ./oob exits 1 and reports the invalid access" \
      "exit $CODE" sanitizer-oob.out
  fi

  kcoral_run sanitizer-log compute-sanitizer --send exp/oob --timeout 600 \
    --fetch sanitizer.log --out "$WORK/artifacts/log" \
    -- --tool memcheck --error-exitcode 1 --log-file sanitizer.log ./oob
  if [[ $CODE -eq 1 ]] && grep -q "Invalid __global__" "$WORK/artifacts/log/sanitizer.log"; then
    pass "--log-file sanitizer.log with --fetch returns the log (exit 1)"
  else
    fail "--log-file sanitizer.log with --fetch returns the log (exit 1)" "exit $CODE" \
      sanitizer-log.out
  fi
fi

if [[ -x exp/clean ]]; then
  kcoral_run sanitizer-clean compute-sanitizer --send exp/clean --timeout 600 \
    -- --tool memcheck --error-exitcode 1 ./clean
  if [[ $CODE -eq 0 ]] && grep -q "ERROR SUMMARY: 0 errors" sanitizer-clean.out &&
    grep -q "scaled 1000 elements" sanitizer-clean.out; then
    pass "compute-sanitizer memcheck on ./clean exits 0 with no errors"
  else
    fail "compute-sanitizer memcheck on ./clean exits 0 with no errors" "exit $CODE" \
      sanitizer-clean.out
  fi
fi

# ---- ncu ----------------------------------------------------------------------------

OUT="$WORK/artifacts/ncu"
kcoral_run ncu-capture ncu --send exp --out "$OUT" --timeout 600 \
  -- --set basic --launch-count 1 -- python exp/capture.py
if [[ $CODE -eq 0 && -s "$OUT/capture.ncu-rep" ]] &&
  grep -q "kcoral: saved artifacts to $OUT" ncu-capture.out; then
  pass "ncu --set basic --launch-count 1 returns OUT/capture.ncu-rep (exit 0)"
else
  fail "ncu --set basic --launch-count 1 returns OUT/capture.ncu-rep (exit 0)" "exit $CODE" \
    ncu-capture.out
fi

if [[ -s "$OUT/capture.ncu-rep" ]]; then
  if ! command -v ncu >/dev/null; then
    fail "ncu --import reads the report" "no local ncu on PATH"
  elif ncu --import "$OUT/capture.ncu-rep" --print-summary none >import.out 2>&1 &&
    grep -q "Speed Of Light" import.out; then
    pass "ncu --import reads the report ($(grep -c . import.out) lines)"
  else
    fail "ncu --import reads the report" "unreadable or empty report" import.out
  fi
fi

kcoral_run ncu-none ncu --out "$WORK/artifacts/ncu-none" --timeout 600 \
  -- --set basic -- python -c pass
if [[ $CODE -ne 0 ]] && grep -q "kcoral: missing artifacts: capture.ncu-rep" ncu-none.out; then
  pass "ncu on an application without kernels fails with a missing report (exit $CODE)"
else
  fail "ncu on an application without kernels fails with a missing report" "exit $CODE" \
    ncu-none.out
fi

echo "commands:"
cat "$WORK/commands.log"
echo "RESULT: $PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
