"""motionjax.losses: per-window bone offsets reach forward kinematics."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from motionjax import losses
from motionjax.configs.base import get_config
from motionjax.core import features as feat
from motionjax.core import rotations as rot
from motionjax.core.skeleton import deepmimic_humanoid

pytest.importorskip("pybullet")  # every test here computes on the DeepMimic humanoid (its URDF ships with it)
SKELETON = deepmimic_humanoid()


def test_reconstruction_loss_runs_fk_on_each_windows_offsets():
    """A batch whose windows carry their own offsets scores like each window alone on a skeleton
    with those rest offsets (the independent reference: Skeleton.replace)."""
    cfg = get_config().loss
    cfg.dynamics_weight = 0.0
    rng = np.random.default_rng(0)
    f = feat.feature_dim(SKELETON)
    mean, std = np.zeros(f, np.float32), np.ones(f, np.float32)
    x = lambda: feat.pack(SKELETON, rng.normal(size=(2, 6, 3)),
                            rot.quat_normalize(rng.normal(size=(2, 6, SKELETON.num_joints, 4))))
    pred, target = jnp.asarray(x(), jnp.float32), jnp.asarray(x(), jnp.float32)
    offsets = (SKELETON.offsets[None] * np.array([0.8, 1.3])[:, None, None]).astype(np.float32)

    def loss(skeleton, pred, target, offsets=None):  # jitted: op by op this test took ~14 s
        return jax.jit(lambda p, t, o: losses.reconstruction_loss(cfg, skeleton, 30.0, p, t, mean, std,
                                                                  offsets=o))(pred, target, offsets)

    _, terms = loss(SKELETON, pred, target, offsets)
    each = [loss(SKELETON.replace(offsets=offsets[i]), pred[i:i + 1], target[i:i + 1])[1]["position"]
            for i in range(2)]
    np.testing.assert_allclose(float(terms["position"]), np.mean([float(e) for e in each]), rtol=1e-5)
    _, plain = loss(SKELETON, pred, target)
    assert abs(float(plain["position"]) - float(terms["position"])) > 1e-3


def test_pose_term_is_root_relative_mpjpe_and_weighted_into_the_loss():
    """``pose`` ignores a shift of the whole predicted motion (``position`` does not), equals the
    root-relative joint error of both motions' FK positions (numpy), and the
    loss is the weighted sum of the terms."""
    from motionjax.core.kinematics import forward_kinematics
    cfg = get_config().loss
    cfg.update(dynamics_weight=0.0, pose=3.0)
    rng = np.random.default_rng(1)
    f = feat.feature_dim(SKELETON)
    mean, std = np.zeros(f, np.float32), np.ones(f, np.float32)
    root = rng.normal(size=(2, 6, 3))
    quats = rot.quat_normalize(rng.normal(size=(2, 6, SKELETON.num_joints, 4)))
    target = jnp.asarray(feat.pack(SKELETON, root, quats), jnp.float32)
    pred = jnp.asarray(feat.pack(SKELETON, root + 0.1, rot.quat_normalize(quats + 0.2)), jnp.float32)
    loss, terms = losses.reconstruction_loss(cfg, SKELETON, 30.0, pred, target, mean, std)
    shifted = pred.at[..., :3].add(jnp.array([0.5, -0.2, 0.3]))
    _, moved = losses.reconstruction_loss(cfg, SKELETON, 30.0, shifted, target, mean, std)
    np.testing.assert_allclose(float(moved["pose"]), float(terms["pose"]), rtol=1e-5)
    assert float(moved["position"]) > float(terms["position"]) + 0.1
    fk = lambda x: np.asarray(forward_kinematics(SKELETON, *feat.unpack(SKELETON, x)[::-1])[0])
    rel = lambda x: fk(x) - np.asarray(x)[..., None, :3]
    expected = np.linalg.norm(rel(pred) - rel(target), axis=-1).mean()
    np.testing.assert_allclose(float(terms["pose"]), expected, rtol=1e-4)
    weighted = sum(cfg[k] * float(terms[k]) for k in ("rotation", "position", "pose", "foot"))
    np.testing.assert_allclose(float(loss), weighted, rtol=1e-5)


def test_padding_frames_weigh_nothing_in_any_term_sharded_or_not():
    """A window padded past its segment's end (``valid = 0``, edge copies as the loader makes them)
    scores exactly like the same window cut to its real frames, in every term (the stencils of the
    dynamics and foot terms included); in a batch with an unpadded window the per-frame terms are the
    frame-weighted mean of the two; and the trainer's loss over a data x time mesh gives the same."""
    from experiments.deepmimic_denoise import get_config as denoise_config
    from motionjax import parallel
    from motionjax.data.info import stand_in
    from motionjax.train import step

    cfg = get_config().loss
    cfg.update(dynamics_weight=1.0, foot=1.0, pose=1.0, contact_speed=5.0)  # every term on and non-zero
    rng = np.random.default_rng(2)
    f, t, real = feat.feature_dim(SKELETON), 32, 24
    mean, std = np.zeros(f, np.float32), np.ones(f, np.float32)
    root = np.cumsum(rng.normal(scale=0.02, size=(2, t, 3)), axis=1)
    quats = rot.quat_normalize(rng.normal(size=(2, t, SKELETON.num_joints, 4)) * 0.1 + [1, 0, 0, 0])
    noisy = rot.quat_normalize(quats + rng.normal(scale=0.05, size=quats.shape))
    pred, target = (np.asarray(feat.pack(SKELETON, r, q), np.float32) for r, q in ((root + 0.01, noisy),
                                                                                      (root, quats)))
    for x in (pred, target):  # window 0 is padded after `real` frames with copies of its last real frame
        x[0, real:] = x[0, real - 1]
    valid = np.ones((2, t), np.float32)
    valid[0, real:] = 0
    loss = jax.jit(lambda p, g, v: losses.reconstruction_loss(cfg, SKELETON, 30.0, p, g, mean, std, valid=v))
    cut = jax.jit(lambda p, g: losses.reconstruction_loss(cfg, SKELETON, 30.0, p, g, mean, std))
    alone = [cut(pred[:1, :real], target[:1, :real])[1], cut(pred[1:], target[1:])[1]]
    one = loss(pred[:1], target[:1], valid[:1])[1]
    for name in ("rotation", "position", "pose", "foot", "dynamics"):
        np.testing.assert_allclose(float(one[name]), float(alone[0][name]), rtol=1e-5, err_msg=name)
    both = loss(pred, target, valid)[1]
    # Each window's own error (loss-aware sampling): the pose term of that window alone.
    window = jax.jit(lambda p, g, v: losses.reconstruction_loss(cfg, SKELETON, 30.0, p, g, mean, std, valid=v,
                                                                per_window=True)[2])(pred, target, valid)
    np.testing.assert_allclose(window, [float(a["pose"]) for a in alone], rtol=1e-5)
    for name in ("rotation", "position", "pose"):  # means over frames: weighted by 24 and 32 frames
        expected = (float(alone[0][name]) * real + float(alone[1][name]) * t) / (real + t)
        np.testing.assert_allclose(float(both[name]), expected, rtol=1e-5, err_msg=name)
    # The trainer's loss: [B, N, C, F] windows split over data x time, valid [B, N, C, 1].
    config = denoise_config()
    config.loss = cfg
    config.mesh.shape = (("data", 2), ("time", 4))
    loss_fn = step.make_loss_fn(config, stand_in(SKELETON), parallel.make_mesh(config.mesh))
    chunk = lambda x: jnp.asarray(x).reshape(2, 4, t // 4, -1)
    sharded = jax.jit(loss_fn)(chunk(pred), chunk(target), None, chunk(valid))[1]
    for name in both:
        np.testing.assert_allclose(float(sharded[name]), float(both[name]), rtol=1e-4, err_msg=name)
    config.data.loss_sampling = 0.5  # the step then also returns each window's error, over data
    loss_fn = step.make_loss_fn(config, stand_in(SKELETON), parallel.make_mesh(config.mesh))
    terms = jax.jit(loss_fn)(chunk(pred), chunk(target), None, chunk(valid))[1]
    np.testing.assert_allclose(terms["window_pose"], window, rtol=1e-4)
