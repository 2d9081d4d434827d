"""The trainer: one jitted, sharded step and a loop around it.

The modules, in the order a run meets them: :mod:`.checks` (the config, before anything runs),
:mod:`.step` (optimizer, loss over the mesh, the jitted update, prediction, AOT lowering),
:mod:`.loop` (set up, train, evaluate with the evaluators ``config.evals`` declares, write),
:mod:`.checkpoints` (orbax: save, restore, keep-best, the non-finite guard), :mod:`.faults` (workdir
lock, failed writes, signals, watchdog), :mod:`.logs` (timing, metric history, TensorBoard) and
:mod:`.diagnostics` (what a compiled step communicates). The names below are the public API that
scripts, notebooks, benchmarks and the efficiency tools use.
"""
from motionjax.train.checkpoints import (
    CheckpointError,
    make_checkpoint_manager,
    restore_checkpoint,
    restore_latest,
    save_checkpoint,
)
from motionjax.train.checks import ConfigError, check_config, check_data
from motionjax.train.faults import LOCK_FILE, StorageError, WorkdirLockedError, storage_error, workdir_lock
from motionjax.train.loop import make_iterator, run_experiment, train_and_evaluate
from motionjax.train.step import (
    abstract_batch,
    batch_keys,
    build_train_step,
    evaluated_params,
    init_state,
    jit_train_step,
    lower_train_step,
    make_loss_fn,
    make_optimizer,
    make_predict,
    pure_train_step,
    reconstruction_objective,
)

__all__ = [
    "CheckpointError", "ConfigError", "LOCK_FILE", "StorageError", "WorkdirLockedError", "abstract_batch",
    "batch_keys", "build_train_step", "check_config", "check_data", "evaluated_params",
    "init_state", "jit_train_step", "lower_train_step", "make_checkpoint_manager", "make_iterator",
    "make_loss_fn", "make_optimizer", "make_predict", "pure_train_step", "reconstruction_objective",
    "restore_checkpoint",
    "restore_latest", "run_experiment", "save_checkpoint", "storage_error", "train_and_evaluate",
    "workdir_lock",
]
