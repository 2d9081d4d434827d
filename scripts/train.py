"""Train an experiment: ``scripts/train.py --config experiments/X.py --workdir runs/x``.

Any config field can be overridden on the command line (``--config.train.steps=100``); a key the
config does not have is an error. The dataset is prepared first when ``config.data.dir`` lacks it.
Re-running with the same ``--workdir`` resumes from its last checkpoint.
"""
from absl import app, flags
from ml_collections import config_flags

from motionjax import parallel

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config (get_config)",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (checkpoints, plots, summary)")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    parallel.initialize()  # a no-op for one process; must precede any device use
    from motionjax import data, train

    config = _CONFIG.value
    data.prepare_if_missing(config.data)
    train.run_experiment(config, _WORKDIR.value)


if __name__ == "__main__":
    app.run(main)
