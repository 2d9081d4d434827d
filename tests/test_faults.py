"""Faults a long run meets (issue #17), injected into the tiny ``runlocal`` config: a full disk, a
write that blocks, two trainers on one workdir, a damaged newest checkpoint, a damaged shard, bad
config values. Each must end the run within seconds with one ``error: ...`` line that names the
file or key, keep earlier checkpoints intact, and never hang. The trainer subprocesses that train run
on one CPU device (``user_env``, as on a user's host: ~25% less CPU a run than the suite's eight); what
they prove is a process's behaviour, not a mesh, and the in-process tests restore their checkpoints
onto eight. The refused runs keep the eight (a batch of 6 is refused on the 8-device data axis)."""
import errno
import functools
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest

from motionjax import parallel, train
from motionjax.data import pipeline, records
from motionjax.train import checkpoints, checks, loop
from runs import REPO, committed, runlocal_config, train_cmd, train_flags, wait_for_checkpoint


@pytest.fixture(scope="module")
def data_dir(deepmimic_dir):
    return deepmimic_dir


# Few steps, a checkpoint every 2, no dynamics loss (short compiles; test_train.py covers it), one
# final split (the final evaluation's results are test_train.py's and test_eval.py's concern).
FAST = ("--config.train.steps=6", "--config.train.checkpoint_every=2", "--config.train.eval_every=3",
        "--config.loss.dynamics_weight=0", "--config.evals.final.splits=('validation',)")


def _patched_train(patch: str, workdir, data, *overrides) -> list[str]:
    """``motionjax train`` in a fresh interpreter after running ``patch`` (a fault injector)."""
    return _patched(patch, ["train", *train_flags(workdir, data, *overrides)])


def _patched(patch: str, argv: list[str]) -> list[str]:
    """``motionjax COMMAND`` (``argv[0]``) with flags ``argv[1:]`` in a fresh interpreter after ``patch``."""
    # The allocator first, as the trainer does: its re-execution then comes before the patch's imports.
    code = (f"from motionjax import malloc\nmalloc.configure()\nimport sys\n"
            f"{patch}\nfrom motionjax import cli\nsys.exit(cli.main({argv!r}))\n")
    return [sys.executable, "-c", code]


# Runs that end in an error before they train (a bad flag or value, a locked workdir, data prepared
# elsewhere or on a full disk, no readable checkpoint) prove what the command prints and its exit status,
# not how an interpreter starts: one interpreter pays the command's imports once (jax, flax, absl: ~1.5
# of the ~2 CPU s each such run cost in a fresh one) and forks a child per run. A child is a process of
# its own, with its own stdout, stderr, exit status and patch, that starts where ``python -m motionjax``
# is after its imports, before any device is touched (the parent never initializes a backend).
_FORKER = """
from motionjax import malloc
malloc.configure()  # first, as the trainer does (it may re-execute this process)
import json, os, sys, traceback
import motionjax.commands.train  # noqa: F401 - the imports every child would pay
from motionjax import cli
runs = json.loads(open(sys.argv[1]).read())
codes = {}
for name, (patch, argv, stem) in runs.items():
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for fd, suffix in ((1, ".out"), (2, ".err")):
            os.dup2(os.open(stem + suffix, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        try:
            exec(patch, {})
            code = cli.main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 99
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code or 0)
    codes[name] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(codes))
"""


def _forked(runs: dict, root: Path, env, timeout=600) -> dict:
    """Each of ``runs`` (``name: (patch, argv)``: ``motionjax argv[0]`` with flags ``argv[1:]`` after
    running ``patch``) in a child forked from one interpreter (:data:`_FORKER`), one after the other:
    ``name: CompletedProcess`` (its exit status, stdout and stderr)."""
    stems = {name: str(root / f"forked_{i}") for i, name in enumerate(runs)}
    plan = root / "forked.json"
    plan.write_text(json.dumps({name: (patch, list(map(str, argv)), stems[name])
                                for name, (patch, argv) in runs.items()}))
    done = subprocess.run([sys.executable, "-c", _FORKER, str(plan)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    codes = json.loads(done.stdout.strip().splitlines()[-1])
    read = lambda name, suffix: Path(stems[name] + suffix).read_text()
    return {name: subprocess.CompletedProcess(argv, codes[name], read(name, ".out"), read(name, ".err"))
            for name, (_, argv) in runs.items()}


def _restores(workdir, step) -> None:
    """Checkpoint ``step`` of ``workdir`` reads completely (its state and its history)."""
    mngr = ocp.CheckpointManager((Path(workdir) / "checkpoints").absolute())
    restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(),
                                                          history=ocp.args.JsonRestore()))
    assert jax.tree.leaves(restored["state"]["params"])
    mngr.close()


# ---------------------------------------------------------------------------------------------
# 1. A full disk: every writer of the loop fails with ENOSPC; the run ends, naming the path

_ENOSPC = "import errno, os\nENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
DISK_FULL = {
    # TensorBoard: tensorboardX's record writer (under SummaryWriter's thread and under EventWriter).
    "tensorboard": _ENOSPC + """
import tensorboardX.record_writer as rw
write, calls = rw.RecordWriter.write, [0]
def full(self, data):
    calls[0] += 1
    if calls[0] > 40:  # a few steps in
        raise ENOSPC
    return write(self, data)
rw.RecordWriter.write = full
""",
    # Checkpoint: orbax's save, failing as TensorStore reports it (text of a real 20 MB tmpfs run).
    "checkpoint": """
import orbax.checkpoint as ocp
save = ocp.CheckpointManager.save
def full(self, step, *args, **kwargs):
    if step >= 4:
        path = f"{self.directory}/{step}.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/d/ab12"
        raise ValueError(f'RESOURCE_EXHAUSTED: Error writing "params.x/0" in OCDBT database at local file '
                         f'"{self.directory}": Failed writing: "{path}": Failed to write 41684 bytes to '
                         "file 5: No space left on device [os_error_code='28']")
    return save(self, step, *args, **kwargs)
ocp.CheckpointManager.save = full
""",
}


@pytest.mark.slow  # trainer subprocesses
@pytest.mark.parametrize("writer", sorted(DISK_FULL))
def test_full_disk_ends_the_run_with_the_path(tmp_path, data_dir, user_env, writer):
    workdir = tmp_path / "run"
    proc = subprocess.Popen(_patched_train(DISK_FULL[writer], workdir, data_dir, *FAST), env=user_env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=240)  # the old trainer blocked here forever (tensorboard)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the trainer hung after a failed {writer} write")
    assert proc.returncode == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: No space left on device: "), err[-3000:]
    where = {"tensorboard": workdir / "tensorboard", "checkpoint": workdir / "checkpoints"}[writer]
    assert str(where) in last, last
    assert "Traceback" not in err, err[-3000:]
    steps = committed(workdir)
    assert steps, "the checkpoints before the failure must survive"
    _restores(workdir, steps[-1])


def test_storage_error_reads_orbax_and_os_errors():
    e = ValueError('RESOURCE_EXHAUSTED: Error writing local file "/r/ckpt/8.orbax-checkpoint-tmp/x": Failed '
                   "to write 35501 bytes to file 7: No space left on device [os_error_code='28']")
    assert str(train.storage_error(e, "/r")) == "No space left on device: /r/ckpt/8.orbax-checkpoint-tmp/x"
    e = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
    assert str(train.storage_error(e, "/r/summary.json")) == f"{os.strerror(errno.EDQUOT)}: /r/summary.json"
    assert train.storage_error(ValueError("shapes differ"), "/r") is None


# ---------------------------------------------------------------------------------------------
# SIGTERM while a write blocks (a dead NFS mount): the watchdog ends the process


@pytest.mark.slow  # a trainer subprocess
def test_sigterm_during_a_blocked_write_ends_the_process(tmp_path, data_dir, user_env):
    workdir, marker = tmp_path / "run", tmp_path / "blocked"
    patch = f"""
import pathlib, threading
import motionjax.train.checkpoints as checkpoints
save = checkpoints.save_checkpoint
def blocked(mngr, step, *args, **kwargs):
    if step >= 2:
        pathlib.Path({str(marker)!r}).write_text(str(step))
        threading.Event().wait()  # never returns
    return save(mngr, step, *args, **kwargs)
checkpoints.save_checkpoint = blocked
"""
    cmd = _patched_train(patch, workdir, data_dir, *FAST, "--config.train.stop_timeout_s=3")
    proc = subprocess.Popen(cmd, env=user_env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 240
    while not marker.exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.1)
    t = time.time()
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)  # the old trainer only set a flag and kept waiting
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("SIGTERM did not end a trainer blocked in a write")
    assert time.time() - t < 30
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "error: SIGTERM: the run did not stop within train.stop_timeout_s=3 s" in err, err[-3000:]
    assert committed(workdir) == [0]  # the step-0 checkpoint is intact
    _restores(workdir, 0)


# ---------------------------------------------------------------------------------------------
# 2. Keep-best survives restarts: the metric is on disk with its checkpoint


def test_best_checkpoint_survives_a_restart(tmp_path):
    cfg = runlocal_config(tmp_path).train
    cfg.keep_checkpoints = 1
    state = {"w": jnp.arange(4.0)}

    def save(step, metric):
        mngr = train.make_checkpoint_manager(tmp_path, cfg)
        metrics = None if metric is None else {cfg.best_metric: metric}
        train.save_checkpoint(mngr, step, state, None, {}, metrics)
        mngr.wait_until_finished()
        mngr.close()

    for step, metric in ((1, 5.0), (2, 1.0), (3, 3.0)):
        save(step, metric)  # each save in a new manager: a restart between every checkpoint
    for step in (4, 5):
        save(step, None)  # checkpoint-only steps
    mngr = train.make_checkpoint_manager(tmp_path, cfg)
    assert mngr.all_steps() == [2, 5]  # the best (lowest) and the last
    assert mngr.best_step() == 2


# ---------------------------------------------------------------------------------------------
# 4. One trainer per workdir


@pytest.mark.slow  # a trainer process (the refused fixture)
def test_second_trainer_on_a_workdir_refuses(refused):
    result, root = refused["second trainer"]
    workdir = root / "run"
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"error: workdir {workdir} is in use by another trainer (pid {os.getpid()} on " in result.stderr
    assert "Traceback" not in result.stderr
    assert not (workdir / "checkpoints").exists()  # it touched nothing


def test_stale_lock_is_taken_over(tmp_path, capsys):
    workdir = tmp_path / "run"
    workdir.mkdir()
    # A trainer killed with -9 leaves its pid in the file, but the kernel dropped its flock.
    (workdir / train.LOCK_FILE).write_text(json.dumps({"pid": 2**22 + 1, "host": "h", "started": "then"}))
    with train.workdir_lock(workdir):
        assert json.loads((workdir / train.LOCK_FILE).read_text())["pid"] == os.getpid()
        with pytest.raises(train.WorkdirLockedError, match=f"pid {os.getpid()}"):
            with train.workdir_lock(workdir):  # a second holder, here from another open file
                pass
    out = capsys.readouterr().out
    assert "taking over the stale lock" in out and f"pid {2**22 + 1} on h, started then" in out
    with train.workdir_lock(workdir):  # released on exit
        pass


# ---------------------------------------------------------------------------------------------
# 6. A damaged newest checkpoint: restore the previous one, saying which and why


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir, user_env):
    """A finished run: checkpoints 4 and 6 (the last two) and the best one."""
    workdir = tmp_path_factory.mktemp("trained") / "run"
    subprocess.run(train_cmd(workdir, data_dir, *FAST), env=user_env, cwd=REPO, check=True,
                   capture_output=True)
    return workdir


@pytest.fixture(scope="module")
def refused(tmp_path_factory, data_dir, env, trained):
    """The runs of this file that end in an error before training, forked from one interpreter
    (:func:`_forked`): ``name: (CompletedProcess, its directory)``. The second trainer's workdir is
    locked by this process (the first trainer) meanwhile."""
    root = tmp_path_factory.mktemp("refused")
    runs, dirs = {}, {}

    def add(name, argv, patch=""):
        dirs[name] = root / f"{len(runs)}"
        dirs[name].mkdir()
        runs[name] = (patch, argv(dirs[name]))

    add("second trainer", lambda d: ["train", *train_flags(d / "run", data_dir, *FAST)])
    for override, _ in CLI_BAD:
        add(override, lambda d, o=override: ["train", *train_flags(d / "run", data_dir, o)])
    add("prepared elsewhere", lambda d: ["train", *train_flags(d / "run", data_dir,
                                                              "--config.data.window=64")])
    add("full disk: prepare_data", lambda d: ["prepare", "--out", d / "data", "--workers", "0"], _WRITE_FULL)
    add("full disk: train", lambda d: ["train", *train_flags(d / "run", d / "data",
                                                            "--config.data.prepare_workers=0")], _WRITE_FULL)
    add("unreadable", lambda d: ["train", *train_flags(d / "run", data_dir, *FAST)])
    shutil.copytree(trained, dirs["unreadable"] / "run")  # the trained run, every checkpoint damaged
    for step in committed(dirs["unreadable"] / "run"):
        DAMAGE["manifest"](dirs["unreadable"] / "run" / "checkpoints" / str(step))
    with train.workdir_lock(dirs["second trainer"] / "run"):  # this process is the first trainer
        results = _forked(runs, root, env)
    return {name: (results[name], dirs[name]) for name in runs}


def _truncate_data(step_dir: Path) -> None:
    """Every array data file cut in half: a copy that ran out of space."""
    for path in (step_dir / "state").rglob("d/*"):
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 2)


DAMAGE = {
    "manifest": lambda d: [p.unlink() for p in d.rglob("manifest.ocdbt")],
    "truncated": _truncate_data,
    "history": lambda d: (d / "history" / "metadata").write_text('{"eval/'),  # a torn JSON write
}


@pytest.mark.slow  # the trained fixture: a trainer subprocess
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_newest_checkpoint_is_skipped(tmp_path, trained, data_dir, damage, capsys):
    workdir = tmp_path / "run"
    shutil.copytree(trained, workdir)
    steps = committed(workdir)
    DAMAGE[damage](workdir / "checkpoints" / str(steps[-1]))
    config = runlocal_config(data_dir)
    info = pipeline.dataset_info(config.data)
    _, _, template, _ = train.init_state(config, info, parallel.make_mesh(config.mesh))
    mngr = train.make_checkpoint_manager(workdir, config.train)
    step, state, history = train.restore_latest(mngr, workdir, template)
    assert step == steps[-2] and history
    assert f"checkpoint step {steps[-1]} does not read completely (" in capsys.readouterr().out
    assert mngr.all_steps() == steps[:-1]  # moved aside: a later save of that step does not collide
    assert len(list((workdir / "checkpoints_unreadable").iterdir())) == 1
    mngr.close()


@pytest.mark.slow  # a trainer subprocess
def test_run_resumes_past_a_damaged_checkpoint(tmp_path, trained, data_dir, user_env):
    workdir = tmp_path / "run"
    shutil.copytree(trained, workdir)
    newest = max(committed(workdir))
    DAMAGE["manifest"](workdir / "checkpoints" / str(newest))
    # The same command: it trains steps 5 and 6 again, and saves step 6 where the damaged one was.
    result = subprocess.run(train_cmd(workdir, data_dir, *FAST), env=user_env, cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]  # the old trainer: 36 TensorStore tracebacks
    previous = max(s for s in committed(trained) if s < newest)
    assert f"checkpoint step {newest} does not read completely (" in result.stdout, result.stdout[-3000:]
    assert f"resuming from step {previous}" in result.stdout
    assert "Traceback" not in result.stderr
    assert len(list((workdir / "checkpoints_unreadable").iterdir())) == 1
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["status"] == "done" and summary["steps"] == 6 and newest in committed(workdir)
    # 2. the best step named in the summary is on disk, after a restart
    assert summary["best_step"] in committed(workdir)


@pytest.mark.slow  # a trainer process (the refused fixture)
def test_every_checkpoint_unreadable_is_one_error(refused):
    result, root = refused["unreadable"]  # every checkpoint of the trained run with its manifest removed
    workdir = root / "run"
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"error: no checkpoint in {workdir / 'checkpoints'} reads completely: step ")
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------------------------------------
# 5. A damaged shard names its file and the command that rebuilds it


@pytest.mark.parametrize("damage", ["bitflip", "truncated"])
def test_damaged_shard_names_the_file(tmp_path, data_dir, damage):
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    config = runlocal_config(copy)
    info = pipeline.dataset_info(config.data)  # the index, before the damage
    shard = Path(info.shard_paths()[0])
    raw = bytearray(shard.read_bytes())
    if damage == "bitflip":
        raw[len(raw) // 3] ^= 0xFF
    else:
        raw = raw[: len(raw) // 2]
    shard.write_bytes(bytes(raw))
    with pytest.raises(records.DamagedShardError) as e:
        for split in info.splits:
            pipeline.make_eval_batches(config.data, info, split)
    assert str(shard) in str(e.value)
    assert f"motionjax prepare --out {copy} --force" in str(e.value)


# ---------------------------------------------------------------------------------------------
# 7. Config values: each bad one named by its key, with what was expected

BAD = [  # (key, value, expected text)
    ("data.batch_size", 0, "data.batch_size=0: expected a positive integer"),
    ("data.batch_size", 6, "data.batch_size=6: expected a multiple of the 'data' mesh axis size 8"),
    ("data.window", 36, "data.window=36: expected a multiple of data.chunk=8"),
    ("model.stride", 3, "data.chunk=8: expected a multiple of model.stride=3"),
    ("mesh.shape", (("data", 3), ("time", 1)), "mesh.shape=(('data', 3), ('time', 1)): expected (name, size) "
     "pairs whose sizes multiply to the 8 devices"),
    ("mesh.shape", (("data", 1), ("time", 8)), "data.window=32: expected window / chunk (4 chunks) to be a "
     "multiple of the 'time' mesh axis size 8"),
    ("train.steps", -5, "train.steps=-5: expected a positive integer"),
    ("train.learning_rate", 0.0, "train.learning_rate=0.0: expected a positive number"),
    ("train.checkpoint_every", 0, "train.checkpoint_every=0: expected a positive integer"),
    ("evals.heldout.splits", (), "evals.heldout.splits=(): expected a non-empty tuple of split names"),
    ("evals.final.splits", (), "evals.final.splits=(): expected a non-empty tuple of split names"),
    ("evals.final.kind", "bogus",
     "evals.final.kind='bogus': expected one of ['clip', 'corpus', 'forecast', 'metrics']"),
    ("data.loader", "fast", "data.loader='fast': expected 'grain' or 'naive'"),
    ("data.observed", 32, "data.observed=32: expected fewer frames than data.window=32"),
    ("data.observed", -1, "data.observed=-1: expected an integer >= 0"),
    ("model.mlp_ratio", -1, "model.mlp_ratio=-1: expected a number >= 0"),
    ("model.mlp_ratio", 0, "model.mlp_ratio=0: expected a positive number for model.name="),
    ("train.best_metric", "test/mpjpe", "train.best_metric='test/mpjpe': expected 'SPLIT/METRIC' or "
     "'SPLIT+SPLIT/METRIC' (their mean), SPLIT one of the splits evaluated during training ('validation',)"),
    ("train.best_metric", "validation+test/mpjpe", "train.best_metric='validation+test/mpjpe': expected"),
    ("train.best_metric", "validation/mpjpee", "train.best_metric='validation/mpjpee': expected"),
]


@pytest.mark.parametrize("key,value,expected", BAD, ids=[f"{k}={v}" for k, v, _ in BAD])
def test_bad_config_value_is_named(tmp_path, key, value, expected):
    config = runlocal_config(tmp_path)
    # A valid baseline the expected texts refer to, whatever the experiment's defaults become.
    config.data.update(batch_size=8, window=32, chunk=8)
    config.model.stride = 2
    checks.check_config(config, num_devices=8)
    *path, name = key.split(".")
    with config.unlocked():
        functools.reduce(lambda node, k: node[k], path, config)[name] = value
    with pytest.raises(checks.ConfigError) as e:
        checks.check_config(config, num_devices=8)
    assert expected in str(e.value)
    assert len(e.value.problems) == 1, e.value.problems


def test_two_output_heads_are_one_config_error(tmp_path):
    """Found by an ablation that asked for both: a traceback from model building before this check."""
    config = runlocal_config(tmp_path)
    config.data.update(batch_size=8, window=32, chunk=8)
    config.model.update(stride=2, position_head=True)
    checks.check_config(config, num_devices=8)  # one head: fine
    config.model.global_rotations = True
    with pytest.raises(checks.ConfigError, match="two output heads") as e:
        checks.check_config(config, num_devices=8)
    assert len(e.value.problems) == 1


def test_window_longer_than_every_training_segment(data_dir):
    config = runlocal_config(data_dir)
    info = pipeline.dataset_info(config.data)
    checks.check_data(config, info)  # the runlocal config itself is fine
    longest = max(e - b for _, b, e in info.splits[getattr(info, "train_split", "train")])
    config.data.window = 4 * longest
    with pytest.raises(checks.ConfigError, match=rf"data.window={4 * longest}: expected at most "
                       rf"{2 * longest} frames \(the longest training segment of .* has {longest}\)"):
        checks.check_data(config, info)


CLI_BAD = [  # (override, expected stderr line); the old trainer printed library tracebacks
    ("--config.train.steps=abc", "error: config key train.steps='abc': expected an integer"),
    ("--config.data.batch_size=6", "  data.batch_size=6: expected a multiple of the 'data' mesh axis size 8"),
    ("--config.train.stepz=3", "error: unknown config key 'train.stepz'; Did you mean \"steps\""),
    # issue #30, item 7
    ("--config.nosuchkey=1", "error: unknown config key 'nosuchkey'"),
    ("--config=experiments/nosuch.py", "error: --config experiments/nosuch.py: no such file"),
    ("--config=experiments/deepmimic_denoise.py:bogus", "error: --config experiments/deepmimic_denoise.py:"
     "bogus: ValueError: unknown config variant 'bogus'; expected 'runlocal' or nothing"),
    ("--config.model.dim=-1", "  model.dim=-1: expected a positive integer"),
    ("--config.model.dtype=float17",
     "  model.dtype='float17': expected one of ('float32', 'bfloat16', 'float16')"),
    ("--config.evals.heldout.splits=('nosuchsplit',)", "  evals.heldout.splits=('nosuchsplit',): unknown "
     "['nosuchsplit']; expected splits of data.splits: ['test', 'train', 'validation']"),
]


@pytest.mark.slow  # trainer processes (the refused fixture)
@pytest.mark.parametrize("override,expected", CLI_BAD, ids=[o for o, _ in CLI_BAD])
def test_bad_override_is_one_error_line(refused, override, expected):
    result, root = refused[override]
    assert result.returncode == 2, result.stderr[-3000:]
    assert expected in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "\\n" not in result.stderr
    assert "best_metric" not in result.stderr  # the key at fault is named, not the one depending on it
    assert not (root / "run" / "checkpoints").exists()


def test_config_checks_accept_the_experiments():
    from experiments import deepmimic_denoise

    for variant in (None, "runlocal"):
        checks.check_config(deepmimic_denoise.get_config(variant), num_devices=8)


@pytest.mark.parametrize("old,value,new", [("data.dynamics_weight", 0.0, "data.dynamics_sampling"),
                                           ("train.eval_splits", ("validation",), "evals.heldout.splits"),
                                           ("train.final_splits", ("test",), "evals.final.splits")])
def test_a_renamed_config_key_is_named_not_ignored(old, value, new):
    from experiments import deepmimic_denoise

    config = deepmimic_denoise.get_config()
    section, name = old.split(".")
    config[section][name] = value  # an older config's spelling
    with pytest.raises(checks.ConfigError, match=rf"{old}: renamed {new}"):
        checks.check_config(config, num_devices=8)


# =============================================================================================
# Issue #30: the faults a probe of main still got through (docs/reliability.md lists them all)


def _flip(path: Path, n: int = 64) -> None:
    """``n`` bytes in the middle of ``path`` inverted, the size unchanged (a bad sector, a bad copy)."""
    raw = bytearray(path.read_bytes())
    mid = len(raw) // 2
    raw[mid:mid + n] = bytes(b ^ 0xFF for b in raw[mid:mid + n])
    path.write_bytes(bytes(raw))


def _largest_array_file(step_dir: Path) -> Path:
    return max((step_dir / "state").rglob("d/*"), key=lambda p: p.stat().st_size)


# 1. A bit flip inside a checkpoint's array data: caught by the digest saved with it


def test_a_bit_flip_in_a_checkpoint_is_caught_and_the_guard_restores_older(tmp_path, capsys):
    cfg = runlocal_config(tmp_path).train
    cfg.keep_checkpoints = 10
    mngr = train.make_checkpoint_manager(tmp_path, cfg)
    # Random values (incompressible): the largest data file holds the array itself.
    states = {s: {"w": jax.random.normal(jax.random.key(s), (64, 64)), "nonfinite_total": jnp.int32(0)}
              for s in (2, 4, 6)}
    same = lambda a, b: bool(jnp.array_equal(a["w"], b["w"]))
    for s, state in states.items():
        train.save_checkpoint(mngr, s, state, None, {})
    mngr.wait_until_finished()
    _flip(_largest_array_file(tmp_path / "checkpoints" / "6"))
    with pytest.raises(checkpoints.CorruptCheckpointError, match=r"\['w'\] differ from the digest"):
        train.restore_checkpoint(mngr, 6, states[2])
    step, state, _ = train.restore_latest(mngr, tmp_path, states[2])
    assert step == 4 and same(state, states[4])
    assert "checkpoint step 6 does not read completely (CorruptCheckpointError: " in capsys.readouterr().out
    assert mngr.all_steps() == [2, 4]  # 6 moved aside

    # The non-finite guard: steps 5..7 non-finite; the checkpoint of step 6 was saved during them (the
    # state that produced them) and is never restored; step 4 is corrupt: moved aside, step 2 restored.
    train.save_checkpoint(mngr, 6, states[6], None, {})
    mngr.wait_until_finished()
    _flip(_largest_array_file(tmp_path / "checkpoints" / "4"))
    guard = checkpoints.NonfiniteGuard(mngr, limit=3, start=0)
    restored = guard(7, {"nonfinite_run": 3, "nonfinite_total": 3}, states[6], dispatched=8)
    assert same(restored, states[2]) and int(restored["nonfinite_total"]) == 3
    out = capsys.readouterr().out
    assert "checkpoint step 4 does not read completely (CorruptCheckpointError" in out
    assert "step 7: 3 non-finite steps in a row; restored the model and optimizer of step 2" in out
    assert mngr.all_steps() == [2, 6]
    mngr.close()


def test_the_checkpoint_digest_does_not_depend_on_the_sharding():
    """The digest is a modular sum: the same array split over 8 devices has the same digest."""
    from jax.sharding import NamedSharding, PartitionSpec

    x = jnp.arange(8 * 24, dtype=jnp.float32).reshape(8, 24) * 0.37
    mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    sharded = jax.device_put(x, NamedSharding(mesh, PartitionSpec("d")))
    assert checkpoints.state_digest({"x": x}) == checkpoints.state_digest({"x": sharded})
    flipped = x.at[3, 5].set(jax.lax.bitcast_convert_type(
        jax.lax.bitcast_convert_type(x[3, 5], jnp.uint32) ^ jnp.uint32(1), jnp.float32))  # one bit
    assert checkpoints.state_digest({"x": flipped}) != checkpoints.state_digest({"x": x})


def test_the_checkpoint_digest_reads_as_older_trainers_wrote_it():
    """Checkpoints written by earlier code verify: the digests of arrays of every kind a state holds
    (float, bfloat16, int8, bool, a PRNG key, a scalar) are those the digest of 3f1d2ad computed."""
    tree = {"f32": jnp.arange(12, dtype=jnp.float32).reshape(3, 4) * 0.37,
            "i8": jnp.arange(-3, 4, dtype=jnp.int8), "bf16": jnp.full((2, 3), 1.5, jnp.bfloat16),
            "key": jax.random.key(3), "mask": jnp.array([True, False, True]), "step": jnp.int32(7)}
    assert checkpoints.state_digest(tree) == {
        "['bf16']": "(2, 3) bfloat16 01ac85058fa8f983", "['f32']": "(3, 4) float32 dcac7499f558f3db",
        "['i8']": "(7,) int8 7d91c508927fe965", "['key']": "() key<fry> 0b318b8de727ee82",
        "['mask']": "(3,) bool 136c03bfd4d95359", "['step']": "() int32 8d4cb9d9c05e44c0"}


# 2. A non-finite metric is never best, across restarts


def test_a_nonfinite_metric_is_never_best(tmp_path):
    cfg = runlocal_config(tmp_path).train
    cfg.keep_checkpoints = 1
    for step, metric in ((1, 5.0), (2, 1.0), (3, float("nan")), (4, float("inf")), (5, float("nan"))):
        mngr = train.make_checkpoint_manager(tmp_path, cfg)  # a restart between every checkpoint
        train.save_checkpoint(mngr, step, {"w": jnp.arange(4.0)}, None, {}, {cfg.best_metric: metric})
        mngr.wait_until_finished()
        mngr.close()
    mngr = train.make_checkpoint_manager(tmp_path, cfg)
    assert mngr.all_steps() == [2, 5] and mngr.best_step() == 2  # the old trainer kept [5] and chose it
    history = {f"eval/{cfg.best_metric}": [(1, 5.0), (2, 1.0), (3, float("nan")), (5, float("nan"))]}
    assert loop.best_step(history, cfg.best_metric, mngr.all_steps()) == (2, 1.0)
    only_nan = {f"eval/{cfg.best_metric}": [(5, float("nan"))]}
    assert loop.best_step(only_nan, cfg.best_metric, [5]) == (None, None)
    mngr.close()


# 2, 3. The held-out metric turns NaN at the last evaluation: the final results are the best checkpoint's;
# NaN at every evaluation: the run ends non-finite, exit 3

NAN_EVAL = """
import math
from motionjax.evaluation import evaluators
from motionjax.train import loop
def nan_heldout(run, current):
    out = evaluators.Metrics.scalars(evaluators.run(run.heldout, lambda x: run.predict(run.state, x)))
    if current >= {first}:
        out = dict.fromkeys(out, math.nan)
    run.log(current, out, "eval")
    return out
loop._evaluate_heldout = nan_heldout
"""


def _nan_from(first: int, workdir, data_dir, env):
    """The FAST run whose held-out metrics are NaN from step ``first`` on."""
    cmd = _patched_train(NAN_EVAL.format(first=first), workdir, data_dir, *FAST)
    return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # a trainer subprocess
def test_final_results_are_the_best_checkpoints_and_nan_is_not_best(tmp_path, data_dir, user_env):
    workdir = tmp_path / "run"
    result = _nan_from(6, workdir, data_dir, user_env)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((workdir / "summary.json").read_text())
    history = dict(summary["history"]["eval/validation/mpjpe"])
    assert math.isnan(history[6]) and math.isfinite(history[3])
    assert summary["status"] == "done" and summary["best_step"] == 3 == summary["evaluated_step"]
    assert 3 in committed(workdir)  # kept: the NaN step did not trim it
    # The final evaluation's validation MPJPE (clean input: what the held-out evaluator measures) is
    # step 3's, to float precision: the old trainer reported the last model's.
    assert summary["results"]["validation"]["clean"]["model"]["mpjpe"] == pytest.approx(history[3], rel=1e-5)
    assert "the last evaluation (step 6) had validation/mpjpe = nan; the results are of the best " \
           "checkpoint, step 3" in result.stdout
    assert "model: the checkpoint of step 3 (of 6), chosen by validation/mpjpe = " in result.stdout


@pytest.mark.slow  # a trainer subprocess
def test_a_run_without_a_finite_evaluation_does_not_end_done(tmp_path, data_dir, user_env):
    workdir = tmp_path / "run"
    result = _nan_from(0, workdir, data_dir, user_env)
    assert result.returncode == 3, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "error: the run ended non-finite: every evaluation of validation/mpjpe was non-finite; see "
        f"{workdir}/summary.json")
    assert json.loads((workdir / "summary.json").read_text())["status"].startswith("non-finite: ")
    assert "Traceback" not in result.stderr


# 4. An unreadable metrics file of an older checkpoint: rewritten from the history, the run resumes


@pytest.mark.slow  # the trained fixture: a trainer subprocess
def test_an_empty_metrics_file_is_rebuilt_from_the_history(tmp_path, trained, data_dir, capsys):
    workdir = tmp_path / "run"
    shutil.copytree(trained, workdir)
    summary = json.loads((workdir / "summary.json").read_text())
    older = [s for s in committed(workdir) if (workdir / "checkpoints" / str(s) / "metrics").exists()][0]
    metrics = workdir / "checkpoints" / str(older) / "metrics" / "metrics"
    before = json.loads(metrics.read_text())
    metrics.write_text("")  # the old trainer: a raw orbax JSONDecodeError traceback
    config = runlocal_config(data_dir)
    mngr = train.make_checkpoint_manager(workdir, config.train)
    assert json.loads(metrics.read_text()) == pytest.approx(before)
    assert f"checkpoint step {older}: its metrics file {metrics} does not read; rewrote it from the run's " \
           "history" in capsys.readouterr().out
    assert mngr.best_step() == summary["best_step"]
    mngr.close()


# 5, 6. Data preparation on a full disk; data prepared with other settings: one error line each

_WRITE_FULL = """
import array_record.python.array_record_module as arm
class Full:
    def __init__(self, *args):
        pass
    def write(self, data):
        raise RuntimeError("write() failed: No space left on device")
    def close(self):
        pass
arm.ArrayRecordWriter = Full
"""


@pytest.mark.slow  # command processes (the refused fixture)
@pytest.mark.parametrize("script", ["prepare_data", "train"])
def test_preparing_on_a_full_disk_is_one_error_line(refused, script):
    result, root = refused[f"full disk: {script}"]  # prepare --out DIR, or train on a DIR not prepared yet
    out = root / "data"
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == \
        f"error: No space left on device: {out}.partial/clips-00000.array_record"
    assert "Traceback" not in result.stderr
    assert not out.exists() and not Path(f"{out}.partial").exists()  # what it wrote is removed


@pytest.mark.slow  # a trainer process (the refused fixture; it fails before compiling)
def test_data_prepared_elsewhere_is_one_error_line(refused, data_dir):
    result, _ = refused["prepared elsewhere"]  # --config.data.window=64
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"error: {data_dir} was prepared with other settings (window: 32 there, 64 asked)")
    assert "Traceback" not in result.stderr


# 8. Resuming with another model shape: the config keys (config.json) or, without it, the arrays differ


@pytest.mark.slow  # the trained fixture: a trainer subprocess
def test_resuming_another_model_shape_names_what_differs(tmp_path, trained, data_dir, capsys):
    workdir = tmp_path / "run"
    shutil.copytree(trained, workdir)
    config = runlocal_config(data_dir)
    config.model.dim = 32
    with pytest.raises(checks.ResumeError, match="model.dim: 16 there, 32 here"):
        checks.check_resume(config, workdir)
    (workdir / "config.json").unlink()  # a run killed before writing it, or of older code
    checks.check_resume(config, workdir)
    info = pipeline.dataset_info(config.data)
    _, _, template, _ = train.init_state(config, info, parallel.make_mesh(config.mesh))
    mngr = train.make_checkpoint_manager(workdir, config.train)
    newest = max(committed(workdir))
    with pytest.raises(checks.ResumeError, match=rf"holds a run of another config \(checkpoint step {newest} "
                       r"array \['opt_state'\].* \(\d+, 16\) float32 there, \(\d+, 32\) float32 here"):
        train.restore_latest(mngr, workdir, template)
    assert committed(workdir) == committed(trained)  # nothing moved aside: not damage
    assert "does not read completely" not in capsys.readouterr().out
    mngr.close()


# 9. Ctrl-C twice: out at once, no thread dump (once: tests/test_train.py, its SIGTERM takes the same path)


@pytest.mark.slow  # a trainer subprocess
def test_ctrl_c_twice_exits_at_once_without_a_thread_dump(tmp_path, data_dir, user_env):
    workdir = tmp_path / "run"
    # The stop the first Ctrl-C starts takes 20 s more here, so the next surely comes during it (a
    # tiny run otherwise can save and exit between two); each step takes 1.5 s more, so the FAST run
    # (its 6 steps: the programs the other runs here compiled) is still training when the Ctrl-Cs come.
    slow_stop = ("import time\nfrom motionjax.train import loop\nfinish = loop._finish\n"
                 "def slow(run, done, interrupted, stopped_early):\n"
                 "    if interrupted:\n        time.sleep(20)\n"
                 "    return finish(run, done, interrupted, stopped_early)\nloop._finish = slow\n"
                 "stepper = loop._stepper\n"
                 "def slow_steps(run):\n    advance = stepper(run)\n"
                 "    return lambda: (time.sleep(1.5), advance())[1]\nloop._stepper = slow_steps\n")
    command = _patched_train(slow_stop, workdir, data_dir, *FAST)
    proc = subprocess.Popen(command, env=user_env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    wait_for_checkpoint(proc, workdir, after=0)
    # Ctrl-C every half second until it exits: signals that come while the main thread is inside a
    # long C call reach Python's handler as one; the first handled starts the stop, the next ends it.
    deadline = time.time() + 15
    while proc.poll() is None and time.time() < deadline:
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: a second SIGINT; exiting without a final checkpoint"), err[-3000:]
    assert "Thread 0x" not in err and "File " not in err, err[-3000:]  # the old trainer: ~55 lines


# 10-14. Data: concurrent preparation, moved sources, an edited index, a bad label sidecar, absurd values


def _bvh_dir(tmp_path, clips=(8, 9)) -> Path:
    """DeepMimic clips as BVH files (kick, punch)."""
    from motionjax.formats import deepmimic_clip_paths, load, write_bvh

    src = tmp_path / "src"
    src.mkdir()
    for i in clips:
        m = load(deepmimic_clip_paths()[i])
        write_bvh(src / f"{m.name}.bvh", m)
    return src


SPLITS = {"train": "rest", "validation": "tail:0.2"}


def test_two_preparations_of_one_directory_take_turns(tmp_path, monkeypatch):
    import threading

    from motionjax.data import prepare

    src, out = _bvh_dir(tmp_path), tmp_path / "out"
    builds, write = [], prepare.write_converted
    monkeypatch.setattr(prepare, "write_converted", lambda *a, **k: builds.append(1) or write(*a, **k))
    results, errors = [], []

    def run():
        try:
            results.append(prepare.prepare(src, out, window=32, splits=SPLITS, progress=False, workers=0))
        except Exception as e:  # the old code: ENOENT on out.partial for the loser
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 2 and len(builds) == 1  # the second waited and used it
    assert results[0].names == results[1].names and prepare.verify_shards(out) == []


def test_prepared_data_trains_when_its_sources_are_gone(tmp_path, data_dir, caplog):
    from motionjax.configs import base
    from motionjax.data import info as info_mod
    from motionjax.data import prepare

    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    settings = prepare.Settings.from_config(base.get_config().data)
    gone = tmp_path / "moved_away"
    info = prepare.prepare(gone, copy, settings=settings, progress=False)
    assert info.names == info_mod.load_info(data_dir).names
    assert "the sources are needed only to rebuild it" in caplog.text
    # 12. An edited index (valid JSON, other statistics) is caught by its digest
    index = copy / info_mod.INDEX
    doc = json.loads(index.read_text())
    doc["stats"]["mean"][0] += 1.0
    index.write_text(json.dumps(doc))
    with pytest.raises(info_mod.DamagedIndexError, match=f"{index}: its contents differ from the digest"):
        info_mod.load_info(copy)
    with pytest.raises(prepare.NoSourcesError, match="differ from the digest"):  # nothing to rebuild from
        prepare.prepare(gone, copy, settings=settings, progress=False)
    del doc["digest"]  # an index of older code: read as it is
    index.write_text(json.dumps(doc))
    assert info_mod.load_info(copy).mean[0] == pytest.approx(doc["stats"]["mean"][0])


def test_a_moved_or_touched_corpus_is_not_rebuilt_but_an_edited_one_is(tmp_path, caplog, monkeypatch):
    """New paths and times with the same bytes (a copy, a re-mount): the prepared data is used as is
    and its index restamped; a changed byte rebuilds it."""
    from motionjax.data import info as info_mod
    from motionjax.data import prepare

    src, out = _bvh_dir(tmp_path, clips=(9,)), tmp_path / "out"
    first = prepare.prepare(src, out, window=32, splits=SPLITS, progress=False, workers=0)
    moved = tmp_path / "mounted_elsewhere"
    shutil.copytree(src, moved)
    for f in moved.iterdir():
        os.utime(f, (1e9, 1e9))  # other times too, not only another path
    builds, write = [], prepare.write_converted
    monkeypatch.setattr(prepare, "write_converted", lambda *a, **k: builds.append(1) or write(*a, **k))
    with caplog.at_level(logging.INFO):
        again = prepare.prepare(moved, out, window=32, splits=SPLITS, progress=False, workers=0)
    assert not builds and "times or paths changed, not their contents" in caplog.text
    assert again.names == first.names and again.std.tolist() == first.std.tolist()
    assert json.loads((out / info_mod.INDEX).read_text())["sources"] == prepare._sources_digest(
        prepare.resolve_sources(moved))  # restamped: the next call takes the quick check
    bvh = next(moved.glob("*.bvh"))
    text = bvh.read_text().rstrip("\n")
    bvh.write_text(text[:-1] + ("1" if text[-1] != "1" else "2") + "\n")  # one value of the last frame
    prepare.prepare(moved, out, window=32, splits=SPLITS, progress=False, workers=0)
    assert builds == [1] and "rebuilding: sources changed" in caplog.text
    # A directory prepared before the content digest existed gets it on its next use, not a rebuild.
    doc = json.loads((out / info_mod.INDEX).read_text())
    content = doc.pop("sources_content")
    doc["digest"] = info_mod.index_digest(doc)
    (out / info_mod.INDEX).write_text(json.dumps(doc))
    prepare.prepare(moved, out, window=32, splits=SPLITS, progress=False, workers=0)
    assert builds == [1] and json.loads((out / info_mod.INDEX).read_text())["sources_content"] == content


def test_an_edited_index_is_rebuilt_from_the_sources(tmp_path, caplog):
    from motionjax.data import info as info_mod
    from motionjax.data import prepare

    src, out = _bvh_dir(tmp_path, clips=(9,)), tmp_path / "out"
    before = prepare.prepare(src, out, window=32, splits=SPLITS, progress=False, workers=0)
    doc = json.loads((out / info_mod.INDEX).read_text())
    doc["stats"]["std"][3] *= 2
    (out / info_mod.INDEX).write_text(json.dumps(doc))
    after = prepare.prepare(src, out, window=32, splits=SPLITS, progress=False, workers=0)
    assert "rebuilding" in caplog.text and "differ from the digest" in caplog.text
    assert after.std[3] == before.std[3]


def test_a_malformed_label_sidecar_keeps_the_motion_unless_a_rule_needs_labels(tmp_path, caplog):
    from motionjax.data import prepare

    src = _bvh_dir(tmp_path, clips=(7, 8, 9))  # the first has no sidecar: it trains in both
    (src / "humanoid3d_kick.json").write_text('{"content": ')  # torn
    (src / "humanoid3d_punch.json").write_text('{"content": "punch"}')
    info = prepare.prepare(src, tmp_path / "a", window=32, splits=SPLITS, progress=False, workers=0)
    assert {"humanoid3d_kick", "humanoid3d_punch"} <= set(info.names) and not info.skipped
    assert info.labels[info.names.index("humanoid3d_kick")] == {}
    assert "humanoid3d_kick.json: labels are not readable JSON" in caplog.text
    assert "keeping the motion with unknown labels" in caplog.text
    by_label = {"train": "rest", "test": "label:content=punch"}
    info = prepare.prepare(src, tmp_path / "b", window=32, splits=by_label, progress=False, workers=0)
    assert "humanoid3d_kick" not in info.names and "humanoid3d_punch" in info.names
    (skipped,) = info.skipped
    assert skipped["path"].endswith("humanoid3d_kick.bvh")
    assert "the split rule test=label:content=punch needs its labels" in skipped["reason"]


def test_an_absurd_rotation_is_a_value_error_and_counts_agree(tmp_path, capsys):
    from motionjax.formats import MotionFormatError, read_bvh

    src = _bvh_dir(tmp_path)
    bvh = src / "humanoid3d_kick.bvh"
    lines = bvh.read_text().splitlines()
    frame = lines.index("MOTION") + 3 + 5  # frame 5
    values = lines[frame].split()
    values[3] = "1e30"  # the root's first rotation channel (after its 3 positions)
    lines[frame] = " ".join(values)
    bvh.write_text("\n".join(lines) + "\n")
    with pytest.raises(MotionFormatError, match=r"frame 5 .* is 1e\+30 degrees; expected a rotation of "
                       r"magnitude <= 1e\+06 degrees") as e:
        read_bvh(bvh)
    assert str(bvh) in str(e.value)
    # 14. Counts: the first line of the summary and the table agree when a duplicate is dropped.
    shutil.copy(src / "humanoid3d_punch.bvh", src / "punch_copy.bvh")
    from motionjax.commands import prepare as script
    script.main(["--source", str(src), "--out", str(tmp_path / "out"), "--workers", "0",
                 "--split", "train=rest", "--split", "validation=tail:0.2"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{tmp_path / 'out'}: 1 clips kept (1 more converted but not kept, below), ")
    kept = next(line for line in out if line.split()[:1] == ["kept"])
    assert kept.split()[1] == "1"
    assert any("humanoid3d_kick.bvh" in line and "is 1e+30 degrees" in line for line in out)
    assert any("punch_copy" in line and "exact duplicate" in line for line in out)


def test_sigusr1_prints_every_threads_stack_and_the_run_goes_on(capfd):
    """``kill -USR1`` on a trainer (inside :func:`faults.stop_on_signals`) prints where each thread
    waits, this one and a helper thread blocked on an event, and stops nothing."""
    from motionjax.train import faults

    blocked = threading.Event()
    helper = threading.Thread(target=blocked.wait, name="waits_on_an_event", daemon=True)
    helper.start()
    with faults.stop_on_signals(60) as stop:
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.2)
    blocked.set()
    err = capfd.readouterr().err
    assert stop["signal"] is None
    assert "test_sigusr1_prints_every_threads_stack_and_the_run_goes_on" in err, err
    assert err.count("Thread 0x") >= 2 and "in wait" in err, err
