"""Train an experiment: ``scripts/train.py --config experiments/X.py --workdir runs/x``.

Any config field can be overridden on the command line (``--config.train.steps=100``); a key the
config does not have is an error. The dataset is prepared first when ``config.data.dir`` lacks it.
Re-running with the same ``--workdir`` resumes from its last checkpoint; SIGTERM/SIGINT save a
checkpoint and exit 0.
"""
import sys
from pathlib import Path

# Experiment files import their base config as `experiments.base`: put the repo root on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from motionjax import parallel  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config (get_config)",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (checkpoints, plots, summary)")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO; the progress bar says enough
    parallel.initialize()  # a no-op for one process; must precede any device use
    from jax.experimental import multihost_utils

    from motionjax import train
    from motionjax.data import pipeline

    config = _CONFIG.value
    if parallel.is_main_process():  # one process writes the prepared dataset, the others wait
        pipeline.dataset_info(config.data)
    multihost_utils.sync_global_devices("dataset prepared")
    train.run_experiment(config, _WORKDIR.value)


def parse_flags(argv):
    """absl parsing, with a one-line error for an override of a key the config lacks."""
    try:
        return flags.FLAGS(argv)
    except (AttributeError, KeyError) as e:
        overrides = [a.split("=")[0] for a in argv[1:] if a.startswith("--config.")]
        sys.exit(f"error: unknown config key {e} in the overrides {overrides}")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
