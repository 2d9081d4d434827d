#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py; docs/gpu.md): environment, GPU numerics tests, the headline
# autoencoder, MFU, the dynamics kernel and the PyTorch twin, in <= 8 minutes, into one JSON and one
# markdown table. Works offline: missing packages come from a wheel folder (--wheels, default .whl).
#
#   scripts/gpu_check.sh [--out results/gpu_check] [--wheels .whl] [--cpu] [--parts tests,mfu,...]
#
# The interpreter: $PYTHON, else the first of python3, python3.12, python3.13, .venv/bin/python whose
# jax sees a GPU (a GPU image's own jax and CUDA plugin), else python3 (then the check is a CPU dry run).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  for p in python3 python3.12 python3.13 .venv/bin/python; do
    if command -v "$p" >/dev/null && "$p" -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')" \
        2>/dev/null; then
      PYTHON=$p
      break
    fi
  done
fi
echo "[gpu_check] interpreter: $(command -v "$PYTHON")"
exec "$PYTHON" -m benchmarks.gpu_check "$@"
