"""motionjax.losses: per-window bone offsets reach forward kinematics."""
import jax
import jax.numpy as jnp
import numpy as np

from experiments.base import get_config
from motionjax import features as feat
from motionjax import losses
from motionjax import rotations as rot
from motionjax.skeleton import deepmimic_humanoid

SKELETON = deepmimic_humanoid()


def test_reconstruction_loss_runs_fk_on_each_windows_offsets():
    """A batch whose windows carry their own offsets scores like each window alone on a skeleton
    with those rest offsets (the independent reference: Skeleton.replace)."""
    cfg = get_config().loss
    cfg.dynamics_weight = 0.0
    rng = np.random.default_rng(0)
    f = feat.feature_dim(SKELETON)
    mean, std = np.zeros(f, np.float32), np.ones(f, np.float32)
    x = lambda: feat.encode(SKELETON, rng.normal(size=(2, 6, 3)),
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
    from motionjax.kinematics import forward_kinematics
    cfg = get_config().loss
    cfg.update(dynamics_weight=0.0, pose=3.0)
    rng = np.random.default_rng(1)
    f = feat.feature_dim(SKELETON)
    mean, std = np.zeros(f, np.float32), np.ones(f, np.float32)
    root = rng.normal(size=(2, 6, 3))
    quats = rot.quat_normalize(rng.normal(size=(2, 6, SKELETON.num_joints, 4)))
    target = jnp.asarray(feat.encode(SKELETON, root, quats), jnp.float32)
    pred = jnp.asarray(feat.encode(SKELETON, root + 0.1, rot.quat_normalize(quats + 0.2)), jnp.float32)
    loss, terms = losses.reconstruction_loss(cfg, SKELETON, 30.0, pred, target, mean, std)
    shifted = pred.at[..., :3].add(jnp.array([0.5, -0.2, 0.3]))
    _, moved = losses.reconstruction_loss(cfg, SKELETON, 30.0, shifted, target, mean, std)
    np.testing.assert_allclose(float(moved["pose"]), float(terms["pose"]), rtol=1e-5)
    assert float(moved["position"]) > float(terms["position"]) + 0.1
    fk = lambda x: np.asarray(forward_kinematics(SKELETON, *feat.decode(SKELETON, x)[::-1])[0])
    rel = lambda x: fk(x) - np.asarray(x)[..., None, :3]
    expected = np.linalg.norm(rel(pred) - rel(target), axis=-1).mean()
    np.testing.assert_allclose(float(terms["pose"]), expected, rtol=1e-4)
    weighted = sum(cfg[k] * float(terms[k]) for k in ("rotation", "position", "pose", "foot"))
    np.testing.assert_allclose(float(loss), weighted, rtol=1e-5)
