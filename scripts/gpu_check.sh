#!/usr/bin/env bash
# One prepared command for a lent GPU machine (under ~8 minutes): environment, the GPU-relevant tests,
# `bench.py --quick` on the accelerator, and the MFU line.
#
#   scripts/gpu_check.sh [results dir, default results/gpu_check]
#
# Uses .venv-gpu (created and installed with '.[cuda12,data,dev]' when it is missing or sees no GPU;
# set PIP_FIND_LINKS to a wheel folder on machines without PyPI). Every step runs even when an
# earlier one fails; the exit status is that of the first failure.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/gpu_check}
VENV=${VENV:-.venv-gpu}
mkdir -p "$OUT"
status=0
step() {  # step NAME TIMEOUT_S CMD...: run, log to $OUT/NAME.log, keep the first failure's status
  local name=$1 limit=$2; shift 2
  echo "== $name"
  local start=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log" | tail -n 25
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $((SECONDS - start)) s"
  [ "$status" -ne 0 ] || status=$rc
}

has_gpu() { "$VENV/bin/python" -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')" 2>/dev/null; }
if ! has_gpu; then
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  step install 300 "$VENV/bin/pip" install -q -e '.[cuda12,data,dev]'
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
step devices 60 "$VENV/bin/python" -c "import jax; print(jax.default_backend(), jax.devices())"

# Single-device tests that exercise jitted math on the accelerator (the mesh tests need 8 CPU devices
# and stay on CPU; tests/conftest.py keeps JAX_PLATFORMS when it is set).
tests=()
for f in tests/test_kinematics.py tests/test_jacobian.py tests/test_dynamics.py tests/test_models.py \
         tests/test_bench.py; do
  [ -f "$f" ] && tests+=("$f")
done
JAX_PLATFORMS=cuda step tests 240 "$VENV/bin/python" -m pytest -q "${tests[@]}"

# The torch peer is a CPU baseline; on the GPU the comparison is optimized vs baseline, MFU, growth.
step bench 300 "$VENV/bin/python" scripts/bench.py --quick --out "$OUT" --parts train,mfu,growth
grep -E "MFU|frames/s|T\^k" "$OUT/bench.md" || true
exit "$status"
