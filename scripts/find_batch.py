"""The largest per-device train batch that fits memory, and the fastest one:
``scripts/find_batch.py --config experiments/X.py [--mode throughput] [--memory_limit BYTES] [--out DIR]``.

Memory comes from XLA's compiled memory analysis of the trainer's step (nothing runs out of memory);
the limit is the device's (GPU/TPU) or, on CPU, ``--memory_limit`` bytes per device (default: half
the host's memory over its devices). ``--mode throughput`` also times the step at each power of two
that fits and writes the frames/s vs batch curve (``batch_curve.png``) next to ``batch_finder.json``.
"""


from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config (get_config)")
_MODE = flags.DEFINE_enum("mode", "throughput", ["memory", "throughput"], "what to choose")
_LIMIT = flags.DEFINE_integer("memory_limit", 0,
                              "bytes per device (0: the device's, or on CPU half the host's)")
_STEPS = flags.DEFINE_integer("steps", 5, "timed steps per batch size (throughput mode)")
_OUT = flags.DEFINE_string("out", "runs/find_batch", "directory for batch_finder.json and batch_curve.png")
flags.mark_flag_as_required("config")


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
    from motionjax import parallel
    from motionjax.data import pipeline
    from motionjax.train import batch_finder

    parallel.initialize()
    config = _CONFIG.value
    info = pipeline.dataset_info(config.data)
    r = batch_finder.find(config, info, _MODE.value, _LIMIT.value or None, _STEPS.value, _OUT.value)
    gib = 2.0**30
    print(f"limit {r['limit_bytes'] / gib:.2f} GiB per device; largest that fits: "
          f"{r['max_per_device_batch']} per device (global {r['max_global_batch']}, "
          f"peak {r['peak_bytes'] / gib:.3f} GiB)")
    for row in r.get("curve", []):
        print(f"  batch {row['per_device_batch']:6d} per device: {row['frames_per_s']:10.0f} frames/s "
              f"({1e3 * row['step_s']:.1f} ms/step, peak {row['peak_bytes'] / gib:.3f} GiB)")
    print(f"chosen ({r['mode']}): {r['per_device_batch']} per device, data.batch_size={r['global_batch']}; "
          f"written to {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
