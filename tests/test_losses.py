"""motionjax.losses: per-window bone offsets reach forward kinematics."""
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
    _, terms = losses.reconstruction_loss(cfg, SKELETON, 30.0, pred, target, mean, std, offsets=offsets)
    each = [losses.reconstruction_loss(cfg, SKELETON.replace(offsets=offsets[i]), 30.0, pred[i:i + 1],
                                       target[i:i + 1], mean, std)[1]["position"] for i in range(2)]
    np.testing.assert_allclose(float(terms["position"]), np.mean([float(e) for e in each]), rtol=1e-5)
    _, plain = losses.reconstruction_loss(cfg, SKELETON, 30.0, pred, target, mean, std)
    assert abs(float(plain["position"]) - float(terms["position"])) > 1e-3
