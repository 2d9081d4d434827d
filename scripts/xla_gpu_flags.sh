# XLA flags for GPU runs, sourced by scripts/launch_local.sh and scripts/slurm/train.sbatch: the
# gradient reduction overlaps the backward pass (train.grad_reduce* puts each bucket's collectives
# right where its gradients are ready; these let XLA run them asynchronously beside the compute).
# Names checked against the installed jaxlib (strings in jaxlib/libjax_common.so); set
# MOTIONJAX_XLA_GPU_FLAGS to replace them.
#   latency_hiding_scheduler: schedule async collectives early / their waits late, beside compute
#   highest_priority_async_stream: collectives on a high-priority stream, not queued behind kernels
#   *_combine_threshold_bytes: XLA merges collectives up to this size; at the bucket size
#     (train.grad_bucket_mb = 4 MiB) it does not fuse every bucket into one that waits for all gradients
MOTIONJAX_XLA_GPU_FLAGS=${MOTIONJAX_XLA_GPU_FLAGS:-"--xla_gpu_enable_latency_hiding_scheduler=true \
--xla_gpu_enable_highest_priority_async_stream=true \
--xla_gpu_all_reduce_combine_threshold_bytes=4194304 \
--xla_gpu_all_gather_combine_threshold_bytes=4194304 \
--xla_gpu_reduce_scatter_combine_threshold_bytes=4194304"}
export XLA_FLAGS="${XLA_FLAGS:-} $MOTIONJAX_XLA_GPU_FLAGS"
