"""Faults a long run meets (issue #17), injected into the tiny ``runlocal`` config: a full disk, a
write that blocks, two trainers on one workdir, a damaged newest checkpoint, a damaged shard, bad
config values. Each must end the run within seconds with one ``error: ...`` line that names the
file or key, keep earlier checkpoints intact, and never hang."""
import errno
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest

from motionjax import parallel, train
from motionjax.data import pipeline, records
from motionjax.train import checks
from runs import REPO, committed, runlocal_config, train_cmd


@pytest.fixture(scope="module")
def data_dir(deepmimic_dir):
    return deepmimic_dir


# Few steps, a checkpoint every 2, no dynamics loss (short compiles; test_train.py covers it), one
# final split (the final evaluation's results are test_train.py's and test_eval.py's concern).
FAST = ("--config.train.steps=6", "--config.train.checkpoint_every=2", "--config.train.eval_every=3",
        "--config.loss.dynamics_weight=0", "--config.evals.final.splits=('validation',)")


def _patched_train(patch: str, workdir, data, *overrides) -> list[str]:
    """scripts/train.py in a fresh interpreter after running ``patch`` (a fault injector)."""
    argv = train_cmd(workdir, data, *overrides)[1:]
    code = (f"import sys, runpy\nsys.argv = {argv!r}\n{patch}\n"
            f"runpy.run_path({argv[0]!r}, run_name='__main__')\n")
    return [sys.executable, "-c", code]


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
def test_full_disk_ends_the_run_with_the_path(tmp_path, data_dir, env, writer):
    workdir = tmp_path / "run"
    proc = subprocess.Popen(_patched_train(DISK_FULL[writer], workdir, data_dir, *FAST), env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
def test_sigterm_during_a_blocked_write_ends_the_process(tmp_path, data_dir, env):
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
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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


@pytest.mark.slow  # a trainer subprocess
def test_second_trainer_on_a_workdir_refuses(tmp_path, data_dir, env):
    workdir = tmp_path / "run"
    with train.workdir_lock(workdir):  # this process is the first trainer
        result = subprocess.run(train_cmd(workdir, data_dir, *FAST), env=env, cwd=REPO, capture_output=True,
                                text=True, timeout=240)
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
def trained(tmp_path_factory, data_dir, env):
    """A finished run: checkpoints 4 and 6 (the last two) and the best one."""
    workdir = tmp_path_factory.mktemp("trained") / "run"
    subprocess.run(train_cmd(workdir, data_dir, *FAST), env=env, cwd=REPO, check=True, capture_output=True)
    return workdir


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
def test_run_resumes_past_a_damaged_checkpoint(tmp_path, trained, data_dir, env):
    workdir = tmp_path / "run"
    shutil.copytree(trained, workdir)
    newest = max(committed(workdir))
    DAMAGE["manifest"](workdir / "checkpoints" / str(newest))
    more = [*FAST[1:], "--config.train.steps=8"]
    result = subprocess.run(train_cmd(workdir, data_dir, *more), env=env, cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]  # the old trainer: 36 TensorStore tracebacks
    previous = max(s for s in committed(trained) if s < newest)
    assert f"checkpoint step {newest} does not read completely (" in result.stdout, result.stdout[-3000:]
    assert f"resuming from step {previous}" in result.stdout
    assert "Traceback" not in result.stderr
    assert len(list((workdir / "checkpoints_unreadable").iterdir())) == 1
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["status"] == "done" and summary["steps"] == 8
    # 2. the best step named in the summary is on disk, after a restart
    assert summary["best_step"] in committed(workdir)


@pytest.mark.slow  # a trainer subprocess
def test_every_checkpoint_unreadable_is_one_error(tmp_path, trained, data_dir, env):
    workdir = tmp_path / "run"
    shutil.copytree(trained, workdir)
    for step in committed(workdir):
        DAMAGE["manifest"](workdir / "checkpoints" / str(step))
    result = subprocess.run(train_cmd(workdir, data_dir, *FAST), env=env, cwd=REPO, capture_output=True,
                            text=True, timeout=300)
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
    assert f"scripts/prepare_data.py --out {copy} --force" in str(e.value)


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
     "evals.final.kind='bogus': expected one of ['clip', 'forecast', 'metrics']"),
    ("data.loader", "fast", "data.loader='fast': expected 'grain' or 'naive'"),
    ("data.observed", 32, "data.observed=32: expected fewer frames than data.window=32"),
    ("data.observed", -1, "data.observed=-1: expected an integer >= 0"),
    ("train.best_metric", "test/mpjpe", "train.best_metric='test/mpjpe': expected 'SPLIT/METRIC', SPLIT "
     "one of the splits evaluated during training ('validation',)"),
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
    ("--config.train.stepz=3", "error: unknown config key 'stepz'; Did you mean \"steps\""),
]


@pytest.mark.slow  # scripts/train.py subprocesses
@pytest.mark.parametrize("override,expected", CLI_BAD, ids=[o for o, _ in CLI_BAD])
def test_bad_override_is_one_error_line(tmp_path, data_dir, env, override, expected):
    result = subprocess.run(train_cmd(tmp_path / "run", data_dir, override), env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    assert expected in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "\\n" not in result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


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
