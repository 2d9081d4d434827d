"""Start-up checks of an experiment config: every bad value named by its key, with what was expected.

:func:`check_config` runs before any device or file is touched (types, ranges, the mesh against
the devices, the batch against the data axis, the best-checkpoint metric against the evaluated
splits); :func:`check_data` once the dataset is known (the
window against the longest training segment, the evaluated splits). Both collect every problem
and raise one :class:`ConfigError`, so a user fixes a config in one pass instead of meeting the
problems one library traceback at a time.
"""
from __future__ import annotations

import inspect
import json
import math
import numbers
from collections.abc import Sequence
from pathlib import Path

import ml_collections

from motionjax import parallel
from motionjax.data import transforms
from motionjax.evaluation import evaluators, metrics
from motionjax.train import grad_reduce


class ConfigError(ValueError):
    """Bad config values; the message has one line per key: ``key=value: expected ...``."""

    def __init__(self, problems: Sequence[str]):
        super().__init__("invalid config:\n  " + "\n  ".join(problems))
        self.problems = list(problems)


class ResumeError(ConfigError):
    """A run directory made by another config; the message names the keys that differ."""

    def __init__(self, workdir, differences: Sequence[str]):
        more = len(differences) - 4
        shown = "; ".join(differences[:4]) + (f"; and {more} more" if more > 0 else "")
        ValueError.__init__(self, f"{workdir} holds a run of another config ({shown}): resume it with its "
                            "own config (its config.json), or train in another --workdir")
        self.problems = list(differences)


# What resuming a run may change: how long and how often it trains, logs, evaluates and checkpoints, where
# its data and workers come from, the mesh (checkpoints restore onto any) and the evaluators. Anything
# else (model, loss, optimizer, data windows and noise, seed) makes another experiment.
RESUMABLE = ("train.steps", "train.eval_every", "train.checkpoint_every", "train.log_every",
             "train.progress_every", "train.input_check_steps", "train.keep_checkpoints",
             "train.stop_timeout_s", "train.compile_cache",
             "train.max_nonfinite_steps", "train.references", "train.reference_models", "data.source",
             "data.dir", "data.worker_count", "data.worker_buffer", "data.prefetch", "data.stream_block",
             "data.prepare_workers",
             "data.residency", "data.device_share", "data.host_cache_mb", "mesh", "evals")


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def check_resume(config, workdir) -> None:
    """One experiment per run directory: when ``workdir/config.json`` exists (the run that made it wrote
    it), ``config`` must equal it but for the :data:`RESUMABLE` keys; else :class:`ResumeError`. Keys
    only one of them has (a config of older code) are not compared."""
    path = Path(workdir) / "config.json"
    if not path.exists():
        return
    made, now = _flat(json.loads(path.read_text())), _flat(json.loads(config.to_json_best_effort()))
    resumable = lambda k: any(k == r or k.startswith(r + ".") for r in RESUMABLE)
    differ = [f"{k}: {made[k]!r} there, {now[k]!r} here" for k in sorted(made.keys() & now.keys())
              if not resumable(k) and made[k] != now[k]]
    if differ:
        raise ResumeError(workdir, differ)


def _get(config, key: str):
    node = config
    for part in key.split("."):
        node = node[part]
    return node


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


# Keys an older config may still set: without this they would be silently ignored.
_RENAMED = {"data.dynamics_weight": ("data.dynamics_sampling",
                                     "the window-sampling mix; loss.dynamics_weight is the loss weight"),
            "train.eval_splits": ("evals.heldout.splits", "the splits evaluated during training"),
            "train.final_splits": ("evals.final.splits", "the splits evaluated once at the end"),
            "train.eval_noise_level": ("evals.final.noise_level", "and evals.clip.noise_level")}


FLOAT_DTYPES = ("float32", "bfloat16", "float16")


def _is_float_dtype(v) -> bool:
    return isinstance(v, str) and v in FLOAT_DTYPES


def _split_names(v) -> bool:
    return (isinstance(v, Sequence) and not isinstance(v, str) and len(v) > 0
            and all(isinstance(s, str) for s in v))


def _has(config, key: str) -> bool:
    try:
        _get(config, key)
        return True
    except (KeyError, AttributeError):
        return False


# key -> (predicate, what was expected)
# The commonest rules, shared by many keys.
_POSITIVE_INT = (lambda v: _is_int(v) and v > 0, "a positive integer")
_NONNEGATIVE_INT = (lambda v: _is_int(v) and v >= 0, "an integer >= 0")
_POSITIVE_NUMBER = (lambda v: _is_number(v) and v > 0, "a positive number")
_RULES = {
    "seed": (_is_int, "an integer"),
    "data.source": (lambda v: isinstance(v, str) and bool(v.strip()), "'deepmimic', 'synthetic' or a folder "
                    "or glob of motion files (--config.data.source=DIR)"),
    "data.fps": _POSITIVE_NUMBER,
    "data.window": _POSITIVE_INT,
    "data.chunk": _POSITIVE_INT,
    "data.batch_size": _POSITIVE_INT,
    "data.worker_count": (lambda v: _is_int(v) and v >= -1, "an integer >= 0, or -1 (auto: measured)"),
    "data.residency": (lambda v: v in ("auto", "device", "stream"), "'auto', 'device' or 'stream'"),
    "data.device_share": (lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "data.host_cache_mb": (lambda v: _is_number(v) and v >= 0, "a number of MB >= 0"),
    "data.prefetch": _NONNEGATIVE_INT,
    "data.stream_block": _POSITIVE_INT,
    "data.eval_stride": _POSITIVE_INT,
    "data.std_floor": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "data.loader": (lambda v: v in ("grain", "naive"), "'grain' or 'naive'"),
    "data.dynamics_sampling": (lambda v: _is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "data.loss_sampling": (lambda v: _is_number(v) and 0 <= v < 1, "a number in [0, 1): 0 = off"),
    "data.loss_block": _POSITIVE_INT,
    "data.loss_staleness": (lambda v: _is_int(v) and v >= 0, "an integer >= 0 (0: never stale)"),
    "data.clean": (lambda v: v in ("off", "report", "repair"), "'off', 'report' or 'repair'"),
    "data.dedup_policy": (lambda v: v in ("copies", "prune"), "'copies' or 'prune'"),
    "model.name": (lambda v: v in ("transformer", "tconv", "dct_mlp"), "'transformer', 'tconv' or 'dct_mlp'"),
    "data.observed": (lambda v: _is_int(v) and v >= 0, "an integer >= 0 (0: no forecasting)"),
    "model.stride": _POSITIVE_INT,
    "model.dim": _POSITIVE_INT,
    "model.depth": _POSITIVE_INT,
    "model.heads": _POSITIVE_INT,
    "model.mlp_ratio": (lambda v: _is_number(v) and v >= 0, "a number >= 0 (0: no feature MLP, dct_mlp)"),
    "model.latent_dim": _POSITIVE_INT,
    "model.halo": _NONNEGATIVE_INT,
    "model.kernel": _POSITIVE_INT,
    "model.dropout": (lambda v: _is_number(v) and 0 <= v < 1, "a number in [0, 1)"),
    "model.dtype": (_is_float_dtype, f"one of {FLOAT_DTYPES}"),
    "model.param_dtype": (_is_float_dtype, f"one of {FLOAT_DTYPES}"),
    "train.steps": _POSITIVE_INT,
    "train.optimizer": (lambda v: v in ("adamw", "lion", "muon", "schedule_free"),
                        "'adamw', 'lion', 'muon' or 'schedule_free'"),
    "train.learning_rate": _POSITIVE_NUMBER,
    "train.warmup_steps": _NONNEGATIVE_INT,
    "train.grad_accum_steps": _POSITIVE_INT,
    "train.micro_batches": _POSITIVE_INT,
    "train.grad_reduce": (lambda v: v in ("fp32", "bf16", "int8"), "'fp32', 'bf16' or 'int8'"),
    "train.grad_reduce_levels": (lambda v: v in (1, 2), "1 (flat) or 2 (inside hosts, then across)"),
    "train.grad_reduce_host_size": (lambda v: _is_int(v) and v >= 0, "an integer >= 0 (0: per process)"),
    "train.grad_reduce_ordered": (lambda v: isinstance(v, bool), "True or False"),
    "train.grad_bucket_mb": (lambda v: _is_number(v) and v > 0, "a positive number of MiB"),
    "train.ema_decay": (lambda v: _is_number(v) and 0 <= v < 1, "a number in [0, 1): 0 = off"),
    "train.max_nonfinite_steps": _POSITIVE_INT,
    "train.log_every": _POSITIVE_INT,
    "train.progress_every": _POSITIVE_INT,
    "train.input_check_steps": _NONNEGATIVE_INT,
    "train.eval_every": _POSITIVE_INT,
    "train.checkpoint_every": _POSITIVE_INT,
    "train.keep_checkpoints": _POSITIVE_INT,
    "train.stop_timeout_s": (lambda v: _is_number(v) and v > 0, "a positive number of seconds"),
    "train.compile_cache": (lambda v: isinstance(v, str), "a directory, or \"\" for none"),
}


def check_config(config, num_devices: int, num_processes: int = 1) -> None:
    """Raise :class:`ConfigError` naming every bad value of ``config`` for ``num_devices`` devices."""
    problems, bad = [], set()
    for key, (ok, expected) in _RULES.items():
        try:
            value = _get(config, key)
        except (KeyError, AttributeError):
            problems.append(f"{key}: missing; expected {expected}")
            bad.add(key)
            continue
        if not ok(value):
            problems.append(f"{key}={value!r}: expected {expected}")
            bad.add(key)
    d = config.data
    for old, (new, what) in _RENAMED.items():
        if _has(config, old):
            problems.append(f"{old}: renamed {new} ({what})")
    try:
        sizes = parallel.mesh_shape(config.mesh.shape, num_devices)
    except (ValueError, TypeError) as e:
        sizes = None
        problems.append(f"mesh.shape={tuple(config.mesh.shape)!r}: expected (name, size) pairs whose sizes "
                        f"multiply to the {num_devices} devices (one size may be -1) [{e}]")
    if sizes is not None:
        for axis in (parallel.DATA_AXIS, parallel.TIME_AXIS):
            if axis not in sizes:
                problems.append(f"mesh.shape={tuple(config.mesh.shape)!r}: expected a {axis!r} axis")
        data_size, time_size = sizes.get(parallel.DATA_AXIS), sizes.get(parallel.TIME_AXIS)
        if "data.batch_size" not in bad and data_size and d.batch_size % data_size:
            problems.append(f"data.batch_size={d.batch_size}: expected a multiple of the 'data' mesh axis "
                            f"size {data_size} (mesh.shape={tuple(config.mesh.shape)!r} on "
                            f"{num_devices} devices)")
        if {"data.window", "data.chunk"}.isdisjoint(bad) and time_size and \
                d.window % d.chunk == 0 and (d.window // d.chunk) % time_size:
            problems.append(f"data.window={d.window}: expected window / chunk ({d.window // d.chunk} chunks) "
                            f"to be a multiple of the 'time' mesh axis size {time_size}")
    if "data.batch_size" not in bad and d.batch_size % num_processes:
        problems.append(f"data.batch_size={d.batch_size}: expected a multiple of the {num_processes} "
                        "processes")
    if {"data.window", "data.chunk"}.isdisjoint(bad) and d.window % d.chunk:
        problems.append(f"data.window={d.window}: expected a multiple of data.chunk={d.chunk}")
    if {"data.chunk", "model.stride"}.isdisjoint(bad) and d.chunk % config.model.stride:
        problems.append(f"data.chunk={d.chunk}: expected a multiple of model.stride={config.model.stride}")
    if {"data.window", "data.observed"}.isdisjoint(bad) and d.observed >= d.window:
        problems.append(f"data.observed={d.observed}: expected fewer frames than data.window={d.window} "
                        "(the rest of each window is the forecast)")
    problems += _check_evals(config)
    problems += _check_grad_reduce(config, sizes, bad, num_processes)
    if "data.loss_sampling" not in bad and d.loss_sampling > 0:
        if d.loader != "grain":
            problems.append(f"data.loss_sampling={d.loss_sampling} with data.loader={d.loader!r}: loss-aware "
                            "sampling is built on the Grain loader; expected data.loader='grain'")
        t = config.train
        if grad_reduce.is_explicit(t.grad_reduce, t.grad_reduce_levels, t.micro_batches):
            problems.append(f"data.loss_sampling={d.loss_sampling} with train.grad_reduce="
                            f"{t.grad_reduce!r}, levels={t.grad_reduce_levels}, "
                            f"micro_batches={t.micro_batches}: "
                            "the explicit reductions return scalars only, not each window's error; expected "
                            "XLA's fp32 all-reduce (grad_reduce='fp32', levels=1, micro_batches=1)")
    if config.train.optimizer == "schedule_free" and "train.ema_decay" not in bad and config.train.ema_decay:
        problems.append(f"train.ema_decay={config.train.ema_decay} with train.optimizer='schedule_free': it "
                        "averages its iterates itself, and evaluation reads that average; "
                        "expected ema_decay=0")
    if {"train.steps", "train.grad_accum_steps"}.isdisjoint(bad) and \
            config.train.steps < config.train.grad_accum_steps:
        problems.append(f"train.steps={config.train.steps}: expected at least train.grad_accum_steps="
                        f"{config.train.grad_accum_steps} (one optimizer update)")
    if "model.mlp_ratio" not in bad and config.model.mlp_ratio == 0 and config.model.name != "dct_mlp":
        problems.append(f"model.mlp_ratio=0: expected a positive number for model.name={config.model.name!r} "
                        "(only dct_mlp blocks run without their feature MLP)")
    if config.model.global_rotations and config.model.position_head:
        problems.append("model.global_rotations=True with model.position_head=True: two output heads; "
                        "expected one of them")
    if problems:
        raise ConfigError(problems)


def _check_grad_reduce(config, sizes, bad, num_processes: int) -> list[str]:
    """An explicit gradient reduction (:func:`.grad_reduce.is_explicit`) sums replicated parameters'
    per-device gradients: not with FSDP (XLA reduce-scatters those itself), nor with dropout (each
    data shard would draw the same masks inside the step's shard_map)."""
    keys = ("train.grad_reduce", "train.grad_reduce_levels", "train.grad_reduce_host_size",
            "train.micro_batches")
    t = config.train
    if not bad.isdisjoint(keys) or not grad_reduce.is_explicit(t.grad_reduce, t.grad_reduce_levels,
                                                                t.micro_batches):
        return []
    what = f"train.grad_reduce={t.grad_reduce!r}, train.grad_reduce_levels={t.grad_reduce_levels}"
    if t.micro_batches > 1:
        what += f", train.micro_batches={t.micro_batches}"
    problems = []
    if config.mesh.fsdp:
        problems.append(f"{what}: expected mesh.fsdp=False (an explicit reduction sums replicated "
                        "parameters' gradients)")
    if config.model.dropout:
        problems.append(f"{what}: expected model.dropout=0 (inside the step's shard_map every data shard "
                        "would draw the same dropout masks)")
    data = (sizes or {}).get(parallel.DATA_AXIS)
    batch = config.data.batch_size
    if data and "data.batch_size" not in bad and batch % data == 0 and (batch // data) % t.micro_batches:
        problems.append(f"train.micro_batches={t.micro_batches}: expected a divisor of the {batch // data} "
                        f"windows each device gets (data.batch_size={batch} over {data} 'data' devices)")
    host = t.grad_reduce_host_size or (data // num_processes if data else 0)
    if t.grad_reduce_levels == 2 and data and (not host or data % host):
        problems.append(f"train.grad_reduce_host_size={t.grad_reduce_host_size}: expected a divisor of the "
                        f"'data' axis size {data} ({num_processes} processes)")
    return problems


def _check_evals(config) -> list[str]:
    """``config.evals``: known kinds and settings, non-empty split tuples, and ``train.best_metric`` a
    ``SPLIT/METRIC`` that a ``during`` evaluator measures."""
    problems, during_splits, named = [], [], True
    # Prepared data has the splits its rules name (the synthetic corpus has its own): check them here,
    # before the data is prepared, so a misspelt split is blamed on the evaluator that names it.
    rules = config.data.get("splits") if config.data.get("source") != "synthetic" else None
    known = set(dict(rules)) if isinstance(rules, (dict, ml_collections.ConfigDict)) else None
    if "evals" not in config or not config.evals:
        return ["evals: missing; expected at least one evaluator (motionjax/configs/base.py declares them)"]
    for name, spec in config.evals.items():
        kind = spec.get("kind")
        if kind not in evaluators.KINDS:
            problems.append(f"evals.{name}.kind={kind!r}: expected one of {sorted(evaluators.KINDS)}")
            continue
        allowed = set(inspect.signature(evaluators.KINDS[kind]).parameters) - {"config", "info"}
        unknown = sorted(set(spec) - allowed - {"kind"})
        if unknown:
            problems.append(f"evals.{name}: unknown settings {unknown} for kind {kind!r}; expected some of "
                            f"{sorted(allowed)}")
        splits = spec.get("splits", (spec.get("split"),) if "split" in spec else ())
        if "splits" in spec and not _split_names(splits):
            problems.append(f"evals.{name}.splits={splits!r}: expected a non-empty tuple of split names")
            named = named and not spec.get("during")
        elif known is not None and any(s not in known for s in splits):
            key = f"evals.{name}.splits" if "splits" in spec else f"evals.{name}.split"
            value = tuple(splits) if "splits" in spec else splits[0]
            problems.append(f"{key}={value!r}: unknown {[s for s in splits if s not in known]}; expected "
                            f"splits of data.splits: {sorted(known)}")
            named = named and not spec.get("during")
        if spec.get("during"):
            during_splits += list(splits)
    best = config.train.best_metric
    split, _, metric = str(best).partition("/")
    if named and (any(s not in during_splits for s in split.split("+")) or metric not in metrics.METRICS):
        problems.append(f"train.best_metric={best!r}: expected 'SPLIT/METRIC' or 'SPLIT+SPLIT/METRIC' (their "
                        "mean), SPLIT one of the splits "
                        f"evaluated during training {tuple(dict.fromkeys(during_splits))!r} (evaluators "
                        f"with during=True) and METRIC one of {metrics.METRICS}")
    return problems


def check_data(config, info) -> None:
    """Raise :class:`ConfigError` when ``config`` asks for more than the dataset ``info`` holds."""
    problems = []
    where = info.data_dir or "the synthetic corpus"
    train = info.splits.get(getattr(info, "train_split", "train"), ())
    longest = max((end - begin for _, begin, end in train), default=0)
    # A segment shorter than a window still gives one edge-padded window down to this fraction.
    most = int(longest / transforms.SHORT_SEGMENT)
    if config.data.window > most:
        problems.append(f"data.window={config.data.window}: expected at most {most} frames (the longest "
                        f"training segment of {where} has {longest})")
    for name, spec in config.evals.items():
        splits = tuple(spec.get("splits", ())) + ((spec["split"],) if "split" in spec else ())
        unknown = [s for s in splits if s not in info.splits]
        if unknown:
            key = f"evals.{name}.splits" if "splits" in spec else f"evals.{name}.split"
            value = splits if "splits" in spec else splits[0]
            problems.append(f"{key}={value!r}: unknown {unknown}; expected splits of {where}: "
                            f"{sorted(info.splits)}")
    if problems:
        raise ConfigError(problems)
