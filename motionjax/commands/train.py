"""Train an experiment: ``motionjax train --config experiments/X.py[:VARIANT] [--workdir runs/x]``
(``--config X[:VARIANT]``: the experiment of that name that ships with the package).

The run directory defaults to ``runs/X[_VARIANT]`` (:func:`motionjax.configs.run_name`).

Any config field can be overridden on the command line (``--config.train.steps=100``); a key the
config does not have is an error. The dataset is prepared first when ``config.data.dir`` lacks it.
Re-running with the same ``--workdir`` resumes from its last checkpoint; SIGTERM/SIGINT save a
checkpoint and exit 0 (or, blocked for ``train.stop_timeout_s``, exit 128 + the signal number).

A user error (a missing config file or variant, a bad config value or override, a workdir in use
by another trainer or made by another config, data prepared with other settings, a damaged shard,
index or checkpoint) prints one ``error: ...`` line and exits 2; a failed write (``No space left on
device: PATH``) exits 1; a run that ends non-finite (no held-out evaluation with a finite
``train.best_metric``, or non-finite final results) exits 3. No tracebacks for any. Ctrl-C (or
SIGTERM) says where the checkpoint it saved is; a second Ctrl-C exits at once.
"""
from motionjax import malloc

malloc.configure()  # first: it may re-execute the process (motionjax/malloc.py)

import ast  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from motionjax import configs, parallel  # noqa: E402
from motionjax.commands import run_absl  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config (get_config)",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (checkpoints, plots, summary); default "
                                "runs/<config name>[_<variant>]")
flags.mark_flags_as_required(["config"])


def _run(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO; the progress bar says enough
    logging.get_absl_handler().addFilter(_one_line_library_logs)
    parallel.initialize()  # a no-op for one process; must precede any device use
    import jax
    from jax.experimental import multihost_utils

    from motionjax import train
    from motionjax.data import pipeline, prepare, records

    config = _CONFIG.value
    workdir = _WORKDIR.value or f"runs/{configs.run_name(flags.FLAGS['config'].config_filename)}"
    if parallel.is_main_process():
        print(f"run directory: {workdir}", flush=True)
    generation = "generation" in config  # a generator experiment (experiments/generate.py): its own stages
    try:
        if generation:
            from motionjax.generation import run, stages
            train.check_config(stages.autoencoder_config(config), jax.device_count(), jax.process_count())
        else:
            train.check_config(config, jax.device_count(), jax.process_count())
        if parallel.is_main_process():  # one process writes the prepared dataset, the others wait
            d = config.data
            if d.source != "synthetic" and not os.path.exists(os.path.join(d.dir, "index.json")):
                print(f"data: preparing {d.source} into {d.dir} (once: later runs reuse it)", flush=True)
            info = pipeline.dataset_info(d)
            if d.source != "synthetic":
                print(f"data: {prepare.summary_line(info)}", flush=True)
        multihost_utils.sync_global_devices("dataset prepared")
        summary = run.run_experiment(config, workdir) if generation else train.run_experiment(config, workdir)
    except (train.ConfigError, train.WorkdirLockedError, train.CheckpointError, records.DamagedShardError,
            prepare.PreparedElsewhere, prepare.DamagedIndexError, prepare.NoSourcesError) as e:
        _fail(e, 2)
    except Exception as e:
        error = train.storage_error(e, workdir)
        if error is None:
            raise
        _fail(error, 1)
    if str(summary.get("status", "")).startswith("non-finite"):
        _fail(f"the run ended {summary['status']}; see {workdir}/summary.json", 3)


def _one_line_library_logs(record) -> bool:
    """orbax logs a failed background save with full tracebacks from three threads before the run
    reports it as one ``error:`` line: keep their first lines only. Drops orbax's warning for every
    checkpoint saved without metrics (only evaluation steps have them)."""
    if "/orbax/" not in record.pathname:
        return True
    if "did not provide metrics" in str(record.msg):
        return False
    record.exc_info = record.exc_text = None
    record.msg, record.args = record.getMessage().split("\n")[0][:300], None
    return True


def _fail(error: Exception | str, code: int):
    """One line and out. The run has closed its files already; os._exit skips interpreter shutdown,
    where the callbacks of reads a failed orbax restore abandoned would print tracebacks."""
    print(f"error: {error}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code)


def parse_flags(argv):
    """absl parsing, with one ``error: ...`` line (exit 2) for an override of a key the config lacks
    or a value of the wrong type."""
    config_file = _config_file(argv)
    if config_file and not os.path.isfile(config_file.split(":")[0]):
        _fail(f"--config {config_file}: no such file", 2)
    try:
        return flags.FLAGS(argv)
    except (AttributeError, KeyError) as e:
        # KeyError's str() is the repr of its message ("'stepz'\nDid you mean ..."): use the message.
        message = str(e.args[0]) if e.args else str(e)
        while message[:1] in ("'", '"'):  # absl re-wraps it, str(KeyError) again: unquote each layer
            try:
                message = ast.literal_eval(message.split("\n")[0]) + message[len(message.split("\n")[0]):]
            except (ValueError, SyntaxError):
                break
        leaf, _, rest = message.partition("\n")
        hits = [a.split("=")[0].removeprefix("--config.") for a in argv[1:] if a.startswith("--config.")
                and leaf in a.split("=")[0].split(".")]
        name = hits[0] if len(hits) == 1 else leaf  # the whole dotted key the user typed
        _fail(f"unknown config key {name!r}" + (f"; {rest.strip()}" if rest.strip() else ""), 2)
    except flags.IllegalFlagValueError as e:
        text = str(e)
        if "Error whilst parsing config file" in text:  # get_config raised: its exception's last line
            last = [line.strip() for line in text.splitlines() if line.strip()][-1]
            _fail(f"--config {config_file}: {last}", 2)
        bad = re.match(r"flag --config\.([\w.]+)=(.*?): (.*)", text, re.S)
        if not bad:
            _fail(text.replace("\n", "; "), 2)
        key, value, why = bad.groups()
        expected = {"int": "an integer", "float": "a number", "bool": "true or false"}
        kind = next((v for k, v in expected.items() if re.search(rf"\b{k}\b", why)), "another type")
        _fail(f"config key {key}={value!r}: expected {kind} ({why.strip()})", 2)
    except flags.Error as e:
        _fail(str(e).replace("\n", "; "), 2)
    except OSError as e:  # config_flags: the file did not load
        _fail(f"--config {config_file}: {str(e).splitlines()[0]}", 2)


def _config_file(argv) -> str | None:
    """The ``--config`` value of ``argv`` (``path.py[:variant]``; the last one given wins)."""
    found = None
    for i, a in enumerate(argv):
        if a == "--config" and i + 1 < len(argv):
            found = argv[i + 1]
        elif a.startswith("--config="):
            found = a.split("=", 1)[1]
    return found


def main(argv: list[str] | None = None) -> int:
    """``motionjax train [flags]``; ``--config NAME[:VARIANT]`` is the shipped experiment NAME."""
    argv = sys.argv[1:] if argv is None else list(argv)
    for i, a in enumerate(argv):
        if a.startswith("--config="):
            argv[i] = "--config=" + configs.resolve(a.split("=", 1)[1])
        elif i and argv[i - 1] == "--config":
            argv[i] = configs.resolve(a)
    return run_absl(_run, argv, flags_parser=parse_flags)
