#!/usr/bin/env bash
# N processes of `motionjax train` on this machine, joined by jax.distributed: to test multi-host code
# on one box, and to train on a multi-GPU box with one process per GPU.
#
#   scripts/launch_local.sh N [motionjax train flags...]
#   scripts/launch_local.sh 2 --config experiments/deepmimic_denoise.py --workdir runs/mp
#
# GPUs present: process i sees GPU i. Else CPU: each process gets CPU_DEVICES_PER_PROCESS (default 2)
# virtual devices and gloo collectives. Process 0 prints to this terminal; process i>0 to
# $LOG_DIR/process_i.log. If one process fails the others are stopped (they would wait on it forever);
# Ctrl-C / SIGTERM is forwarded, so every process checkpoints and exits.
set -euo pipefail
N=${1:?usage: launch_local.sh N [motionjax train flags...]}
shift
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
PORT=${PORT:-$((20000 + RANDOM % 20000))}
LOG_DIR=${LOG_DIR:-runs/launch_local}
mkdir -p "$LOG_DIR"

gpus=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then gpus=1; fi
# GPUs: async collectives + the latency-hiding scheduler overlap the gradient reduction with backward.
if ((gpus)); then source scripts/xla_gpu_flags.sh; fi

pids=()
stop() { kill -TERM "${pids[@]}" 2>/dev/null || true; }
trap 'stop; wait' INT TERM
for ((i = 0; i < N; i++)); do
  if ((gpus)); then
    dev=("CUDA_VISIBLE_DEVICES=$i")
  else
    dev=(JAX_PLATFORMS=cpu "XLA_FLAGS=${XLA_FLAGS:-} --xla_force_host_platform_device_count=${CPU_DEVICES_PER_PROCESS:-2}")
  fi
  out=/dev/stdout
  if ((i > 0)); then out=$LOG_DIR/process_$i.log; fi
  env "${dev[@]}" JAX_COORDINATOR_ADDRESS=127.0.0.1:$PORT JAX_NUM_PROCESSES=$N JAX_PROCESS_ID=$i \
    "$PY" -m motionjax train "$@" >"$out" 2>&1 &
  pids+=($!)
done

status=0
for ((i = 0; i < N; i++)); do
  if ! wait -n; then
    status=1
    echo "launch_local.sh: a process failed; stopping the others (logs in $LOG_DIR)" >&2
    stop
  fi
done
exit $status
