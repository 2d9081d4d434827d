"""Loss-aware sampling (motionjax.data.priority): the stream restores exactly through a checkpoint,
every segment keeps a non-zero probability, draws follow the error table, and the trainer fills it."""
import json

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from motionjax.configs.base import get_config
from motionjax.data import pipeline, priority
from tests.runs import runlocal_config


@pytest.fixture(scope="module")
def cfg(deepmimic_dir):
    c = get_config().data
    c.update(dir=str(deepmimic_dir), batch_size=8, loss_sampling=0.6, loss_block=3, loss_staleness=0)
    return c


@pytest.fixture(scope="module")
def info(cfg):
    return pipeline.dataset_info(cfg)


def _error(segments):
    """A stand-in for the model's window errors: a fixed function of the segment (m)."""
    return 0.01 + 0.3 * (np.asarray(segments) % 7 == 3)


def _drive(it, first: int, last: int, checkpoint_at=None, recorded=None):
    """Steps ``first..last`` as the trainer runs them: each batch's errors recorded a step late, at
    once at the checkpoint step. Returns the batches (numpy)."""
    batches, recorded = {}, set() if recorded is None else recorded
    for step in range(first, last + 1):
        batches[step] = jax.tree.map(np.asarray, next(it))
        if step - 1 in batches and step - 1 not in recorded:
            it.record(step - 1, batches[step - 1]["segment"], _error(batches[step - 1]["segment"]))
            recorded.add(step - 1)
        if step == checkpoint_at:
            it.record(step, batches[step]["segment"], _error(batches[step]["segment"]))
            recorded.add(step)
    return batches


def test_the_stream_after_a_restore_equals_the_uninterrupted_one(cfg, info, tmp_path):
    """Saved at step 5 (mid-block, with prefetched batches and a pending error), restored by orbax
    into a fresh iterator: steps 6-10 (two more blocks drawn from the table) are the same batches."""
    it = priority.LossAwareIterator(cfg, info, seed=4)
    _drive(it, 1, 5, checkpoint_at=5)
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.save(5, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
        mngr.wait_until_finished()
        q_first = it.q
        expected = _drive(it, 6, 10, recorded={5})
        assert not np.allclose(it.q, q_first)  # the later blocks were drawn from the errors
        it.close()
        restored = priority.LossAwareIterator(cfg, info, seed=4)
        mngr.restore(5, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(restored)))
        got = _drive(restored, 6, 10, recorded={5})
        restored.close()
    for step in expected:
        for k in expected[step]:
            np.testing.assert_array_equal(got[step][k], expected[step][k], err_msg=f"step {step} {k}")


def test_every_segment_keeps_a_nonzero_probability():
    """Whatever the errors (zero, huge, unknown), q >= (1 - λ)·share > 0 for every segment with a
    window, 0 for one without, sums to 1; unknown errors count as the mean of the known ones."""
    shares = np.array([0.2, 0.3, 0.0, 0.1, 0.4])
    error = np.array([0.0, 1e6, 5.0, 0.0, 123.0])
    fresh = np.array([True, True, True, True, False])
    for weight in (0.0, 0.5, 0.99):
        q = priority.mixture(shares, error, fresh, weight)
        np.testing.assert_allclose(q.sum(), 1.0)
        assert q[2] == 0 and (q[[0, 1, 3, 4]] >= (1 - weight) * shares[[0, 1, 3, 4]] * (1 - 1e-12)).all()
    q = priority.mixture(shares, error, fresh, 0.5)
    mean = (0 + 1e6 + 0) / 3  # segment 4's error is stale: the mean of the fresh live ones
    np.testing.assert_allclose(q[4], 0.5 * 0.4 + 0.5 * mean / (1e6 + mean), rtol=1e-9)
    # Nothing known yet: today's shares.
    np.testing.assert_allclose(priority.mixture(shares, error, np.zeros(5, bool), 0.5), shares)


def test_draws_follow_the_error_table(cfg, info):
    """After one segment alone has a large error, the next block draws it at its mixture probability
    (binomial bounds), and each window comes from the segment its batch names."""
    it = priority.LossAwareIterator(cfg, info, seed=0)
    live = np.flatnonzero(it.table.shares > 0)
    hot = live[len(live) // 2]
    next(it)  # the first block: today's shares
    it.record(1, live, np.where(live == hot, 1.0, 0.01))  # step 1 saw every segment
    for _ in range(cfg.loss_block - 1):
        next(it)
    block = [jax.tree.map(np.asarray, next(it)) for _ in range(cfg.loss_block)]  # drawn from step 1
    q = it.q
    expected = priority.mixture(it.table.shares, np.where(np.arange(q.size) == hot, 1.0, 0.01),
                                np.isin(np.arange(q.size), live), cfg.loss_sampling)
    np.testing.assert_allclose(q, expected)
    draws = np.concatenate([b["segment"] for b in block])
    n, p = draws.size, q[hot]
    assert abs((draws == hot).mean() - p) < 5 * np.sqrt(p * (1 - p) / n) + 1e-9
    assert q[hot] > 10 * it.table.shares[hot] * (1 - cfg.loss_sampling)  # it is drawn far above its floor
    it.close()


@pytest.mark.e2e  # a trainer run with loss-aware sampling (~22 CPU s)
def test_the_trainer_feeds_each_windows_error_to_the_sampler(tmp_path, deepmimic_dir):
    """A short run with loss-aware sampling: the checkpointed sampler holds, for the segments the run
    drew, errors of the order of the training loss's position term, and a mixture off today's shares;
    a config that cannot return window errors is refused up front."""
    from motionjax import train
    from motionjax.train import checks

    config = runlocal_config(deepmimic_dir)
    config.update_from_flattened_dict({"train.steps": 6, "train.checkpoint_every": 3, "train.eval_every": 6,
                                       "data.loss_sampling": 0.5, "data.loss_block": 2})
    summary = train.train_and_evaluate(config, tmp_path / "run")
    assert summary["status"] == "done"
    (saved,) = (tmp_path / "run" / "checkpoints" / "6").glob("data/process_0-of-1.json")
    state = json.loads(saved.read_text())
    seen, error = np.array(state["seen"]), np.array(state["error"])
    # The last block (steps 5-6) was drawn from steps 1-3; 4-6 wait for the next block.
    assert state["served"] == 6 and seen.max() == 3 and [p[0] for p in state["pending"]] == [4, 5, 6]
    assert (error[seen >= 0] > 0).all() and len(state["pending"][0][1]) == config.data.batch_size
    assert (error[seen >= 0] < 1.0).all()  # metres: a root-relative joint error, not a sum
    shares = pipeline.segment_shares(pipeline.dataset_info(config.data), config.data.window,
                                     config.data.dynamics_sampling)
    assert not np.allclose(state["q"], shares)
    config.train.grad_reduce = "int8"
    with pytest.raises(checks.ConfigError, match="data.loss_sampling"):
        checks.check_config(config, 8)
