"""The joint-dynamics loss: blocked == jvp/vjp == dense jacfwd (values and gradients), gravity
torques of static poses against a per-joint loop, and sharded over time == unsharded."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from motionjax.core import dynamics
from motionjax.core import kinematics as K
from motionjax.core import rotations as rot
from motionjax.formats import deepmimic_clip_paths, read_deepmimic

WEIGHTS = {"velocity": 1.0, "force": 1e-2, "jerk": 1e-6}


@functools.cache
def clip_batch(frames=24, batch=4):
    """Real DeepMimic windows as target, a perturbed copy as prediction (unnormalised quaternions)."""
    pytest.importorskip("pybullet")  # the clips ship with it
    motion = read_deepmimic(deepmimic_clip_paths()[2])
    assert len(motion.rotations) >= frames + batch
    target_root = np.stack([motion.root_position[b:b + frames] for b in range(batch)]).astype(np.float32)
    target_rot = np.stack([motion.rotations[b:b + frames] for b in range(batch)]).astype(np.float32)
    rng = np.random.default_rng(0)
    pred_root = target_root + rng.normal(0, 0.01, target_root.shape).astype(np.float32)
    pred_raw = target_rot + rng.normal(0, 0.05, target_rot.shape).astype(np.float32)
    return motion.skeleton, motion.fps, pred_root, pred_raw, target_root, target_rot


def loss_fn(skeleton, fps, jacobian, time_axis_name=None, frames_per_pass=dynamics.PASS_FRAMES):
    """``(pred_root, raw rotations, target_root, target_rot) -> (loss, terms)``; rotations are
    normalised inside, as a model's decoder does, so gradients live in the tangent space."""
    def f(pred_root, pred_raw, target_root, target_rot):
        return dynamics.dynamics_loss(skeleton, pred_root, rot.quat_normalize(pred_raw), target_root,
                                      target_rot, fps, WEIGHTS, jacobian=jacobian,
                                      time_axis_name=time_axis_name, frames_per_pass=frames_per_pass)
    return f


def value_and_grads(f):
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))


def assert_same_loss_terms_and_grads(got, want, rtol=1e-5):
    """``((loss, terms), grads)`` of :func:`value_and_grads` equal: loss, every term, every gradient."""
    (loss, terms), grads = got
    (want_loss, want_terms), want_grads = want
    np.testing.assert_allclose(loss, want_loss, rtol=rtol)
    for name in dynamics.TERMS:
        np.testing.assert_allclose(terms[name], want_terms[name], rtol=rtol)
    for g, ref in zip(grads, want_grads, strict=True):
        assert_close_relative(g, ref, rtol)


def assert_close_relative(actual, expected, rtol):
    actual, expected = np.asarray(actual, float), np.asarray(expected, float)
    assert np.abs(actual - expected).max() <= rtol * np.abs(expected).max(), \
        f"max error {np.abs(actual - expected).max():.3g} vs scale {np.abs(expected).max():.3g}"


@pytest.fixture(scope="module")
def dense_reference():
    skeleton, fps, *args = clip_batch(frames=12, batch=2)
    return value_and_grads(loss_fn(skeleton, fps, "dense"))(*args)


@pytest.mark.parametrize("jacobian", ["blocked", "jvp"])
def test_loss_and_gradients_match_dense(jacobian, dense_reference):
    skeleton, fps, *args = clip_batch(frames=12, batch=2)
    (loss, terms), grads = value_and_grads(loss_fn(skeleton, fps, jacobian))(*args)
    (ref_loss, ref_terms), ref_grads = dense_reference
    assert float(ref_terms["force"]) > 1.0 and float(ref_terms["velocity"]) > 0.01  # non-trivial terms
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for name in dynamics.TERMS:
        np.testing.assert_allclose(terms[name], ref_terms[name], rtol=1e-5)
    for g, ref in zip(grads, ref_grads, strict=True):
        assert np.abs(np.asarray(ref)).max() > 0
        assert_close_relative(g, ref, 1e-5)  # #15: equal to jacfwd to 1e-5 (measured ~3e-7)


def test_static_poses_feel_only_gravity():
    """Held poses: no velocity residual, no jerk, and the generalized forces are the gravity
    torques Σ_subtree (p_j - p_k) × m_j·(-g), projected on each joint's DOF, from a loop."""
    skeleton, fps, _, _, target_root, target_rot = clip_batch()
    hold = lambda x, t: jnp.asarray(np.repeat(x[:1, t:t + 1], 8, axis=1))  # frame t of window 0, held
    pose_root, pose_rot, pred_rot = hold(target_root, 0), hold(target_rot, 0), hold(target_rot, 23)
    loss = jax.jit(functools.partial(dynamics.dynamics_loss, skeleton, fps=fps, weights=WEIGHTS))
    _, terms = loss(pred_root=pose_root, pred_rot=pred_rot, target_root=pose_root, target_rot=pose_rot)
    assert float(terms["velocity"]) < 1e-8 and float(terms["jerk"]) < 1e-3

    mass = skeleton.masses / skeleton.masses.sum()
    lift = np.zeros(3)
    lift[skeleton.up_axis] = dynamics.GRAVITY  # m·(a - g) with a = 0

    def gravity_torques(rotations):
        # FK in numpy (float64): op by op in jax it compiled ~100 small programs (6 CPU s)
        positions, world = (x[0, 0] for x in K.forward_kinematics(
            skeleton, np.asarray(rotations, np.float64), np.asarray(pose_root, np.float64)))
        basis = np.broadcast_to(np.eye(3, dtype=np.float32)[:, None, :], (3, skeleton.num_joints, 3))
        axes = np.moveaxis(np.asarray(K.dofs_to_world(skeleton, world.astype(np.float32), basis)), 0, -1)
        torques = [axes[k].T @ sum(np.cross(positions[j] - positions[k], mass[j] * lift)
                                   for j in range(skeleton.num_joints) if skeleton.ancestor_mask[j, k])
                   for k in range(skeleton.num_joints)]
        return np.concatenate([[lift], torques])  # root force (total mass 1) then joints

    difference = gravity_torques(pred_rot) - gravity_torques(pose_rot)
    expected = np.mean(np.sum(difference**2, -1))
    assert expected > 1e-3  # the two poses load the joints differently
    np.testing.assert_allclose(float(terms["force"]), expected, rtol=1e-4)


# 4 shards: shards with a neighbour on both sides and at the sequence's ends, over a data axis of 2; 8:
# shards of 3 frames, shorter than the 5-frame jerk stencil (each stencil reaches into both neighbours).
# (2 shards, one inner boundary between two end shards over data 4, showed nothing the 4 do not.)
@pytest.mark.parametrize("shards", [4, 8])
def test_sharded_over_time_equals_unsharded(shards):
    skeleton, fps, *args = clip_batch()  # B = 4, T = 24: 3 or 6 frames per time shard
    (loss, terms), grads = value_and_grads(loss_fn(skeleton, fps, "blocked"))(*args)
    mesh = jax.make_mesh((8 // shards, shards), ("data", "time"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)

    def sharded(pred_root, pred_raw, target_root, target_rot):
        return dynamics.sharded_dynamics_loss(mesh, skeleton, pred_root, rot.quat_normalize(pred_raw),
                                              target_root, target_rot, fps, WEIGHTS)

    assert_same_loss_terms_and_grads(value_and_grads(sharded)(*args), ((loss, terms), grads))


def test_bad_arguments_raise():
    skeleton, fps, pred_root, pred_raw, target_root, target_rot = clip_batch()
    with pytest.raises(ValueError, match="unknown dynamics loss terms"):
        dynamics.dynamics_loss(skeleton, pred_root, target_rot, target_root, target_rot, fps, {"jerkk": 1.0})
    with pytest.raises(ValueError, match="jacobian must be one of"):
        dynamics.dynamics_loss(skeleton, pred_root, target_rot, target_root, target_rot, fps, WEIGHTS,
                               jacobian="sparse")


def test_batch_chunks_equal_one_pass():
    """The loss taken in batch chunks (a loop, rematerialised) equals one pass, values and gradients,
    with FK inside each pass (test_passes_inside_shard_map_equal_one_unsharded_pass gives FK from
    outside). The loop wraps whichever backend (``dynamics_loss``'s ``sums``), so it is checked on the
    blocked one: with the jvp backend the looped program compiled in ~4x the time (its graph is ~3x
    the blocked one's) and checked nothing more; the jvp backend itself is checked against the dense
    Jacobian in test_loss_and_gradients_match_dense."""
    # The one-pass program is test_loss_and_gradients_match_dense's (same batch, same function): the
    # session's compilation cache serves it.
    skeleton, fps, *args = clip_batch(frames=12, batch=2)

    def f(frames_per_pass):
        return value_and_grads(loss_fn(skeleton, fps, "blocked", frames_per_pass=frames_per_pass))(*args)

    assert dynamics._num_passes(2, 12, 12) == 2 and dynamics._num_passes(2, 12, dynamics.PASS_FRAMES) == 1
    # "auto" (the default): one pass up to ONE_PASS_FRAMES, then passes of PASS_FRAMES
    assert dynamics._num_passes(32, 64, "auto") == 1 and dynamics._num_passes(64, 64, "auto") == 8
    assert_same_loss_terms_and_grads(f(12), f(dynamics.PASS_FRAMES))


def test_passes_inside_shard_map_equal_one_unsharded_pass():
    """Passes (a loop, rematerialised) inside shard_map over (data, time), with FK given by the
    caller (differentiated through, as the reconstruction loss does), per-window offsets, padding
    frames, and the target root differentiated but not its rotations: loss, terms and gradients
    equal one unsharded pass."""
    skeleton, fps, pred_root, pred_raw, target_root, target_rot = clip_batch(frames=12, batch=8)
    offsets = (skeleton.offsets[None] * np.linspace(0.9, 1.2, 8)[:, None, None]).astype(np.float32)
    valid = np.ones((8, 12), np.float32)
    valid[1, 9:] = valid[6, 10:] = 0  # edge padding past the end of two short segments

    def loss(pred_root, pred_raw, target_root, target_rot, offsets, valid, passes, axes=(None, None)):
        pred_rot = rot.quat_normalize(pred_raw)
        fk = lambda r, q: K.forward_kinematics(skeleton, q, r, offsets[:, None])
        return dynamics.dynamics_loss(skeleton, pred_root, pred_rot, target_root, target_rot, fps, WEIGHTS,
                                      pred_fk=fk(pred_root, pred_rot), target_fk=fk(target_root, target_rot),
                                      offsets=offsets, valid=valid, frames_per_pass=passes,
                                      batch_axis_name=axes[0], time_axis_name=axes[1])

    mesh = jax.make_mesh((4, 2), ("data", "time"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    motion = P("data", "time")
    sharded = jax.shard_map(functools.partial(loss, passes=6, axes=("data", "time")), mesh=mesh,
                            in_specs=(motion, motion, motion, motion, P("data"), motion), out_specs=P())
    assert dynamics._num_passes(2, 6, 6) == 2  # per shard: 2 windows of 6 frames, one per pass
    args = (pred_root, pred_raw, target_root, target_rot, offsets, valid)
    grads = lambda f: jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))(*args)
    want = grads(functools.partial(loss, passes=None))
    assert float(want[0][1]["force"]) > 1.0 and np.abs(np.asarray(want[1][2])).max() > 0
    assert_same_loss_terms_and_grads(grads(sharded), want)


def test_masked_mean_is_one_helper_and_zero_without_valid_frames():
    """motionjax.core.reduce.masked_mean equals numpy's mean over the mask (0 on an empty mask), and a
    3-frame window, which has no frame two away from both ends, gives a jerk term of 0, not NaN."""
    from motionjax.core.reduce import masked_mean
    rng = np.random.default_rng(0)
    x, mask = rng.normal(size=(4, 5)).astype(np.float32), rng.uniform(size=(4, 5)) < 0.5
    np.testing.assert_allclose(masked_mean(jnp.asarray(x), mask), x[mask].mean(), rtol=1e-6)
    assert float(masked_mean(jnp.asarray(x), np.zeros_like(mask))) == 0.0
    # The counts and means are the backends' shared ones (mean_of over _term_sums' counts); a backend
    # only changes the sums over the valid frames, equal to the others' (test_loss_and_gradients_match_dense).
    skeleton, fps, pred_root, pred_raw, target_root, target_rot = clip_batch()
    short = lambda x: jnp.asarray(x[:, :3])
    loss = jax.jit(functools.partial(dynamics.dynamics_loss, skeleton, fps=fps, weights=WEIGHTS))
    _, terms = loss(short(pred_root), rot.quat_normalize(short(pred_raw)), short(target_root),
                    short(target_rot))
    assert all(np.isfinite(float(v)) for v in terms.values()), terms
    assert float(terms["jerk"]) == 0.0 and float(terms["velocity"]) > 0  # frame 1 is valid for velocity


def test_per_window_offsets_reach_every_backend(dense_reference):
    """Windows of two performers (bones x0.9 and x1.2): each backend's loss equals the mean of the
    per-window losses on ``Skeleton.replace(offsets=...)`` (the independent reference: one body
    per call), and differs from the loss on the dataset skeleton (the dense reference's, the same
    windows: no program of its own)."""
    skeleton, fps, *args = clip_batch(frames=12, batch=2)
    offsets = (skeleton.offsets[None] * np.array([0.9, 1.2])[:, None, None]).astype(np.float32)
    pred_root, pred_raw, target_root, target_rot = args
    pred_rot = rot.quat_normalize(pred_raw)

    def loss(sk, jacobian, i=slice(None), offsets=None):
        return dynamics.dynamics_loss(sk, pred_root[i], pred_rot[i], target_root[i], target_rot[i], fps,
                                      WEIGHTS, jacobian=jacobian, offsets=offsets)[0]

    # The five losses below in one jitted program, each its own computation inside it: one compile
    # where a program per loss took five (6.8 CPU s more).
    @jax.jit
    def losses():
        # Each window has as many valid frames, so the batch mean is the mean of the two windows.
        per_window = [loss(skeleton.replace(offsets=offsets[b]), "blocked", slice(b, b + 1))
                      for b in range(2)]
        return per_window, {j: loss(skeleton, j, offsets=offsets) for j in dynamics.JACOBIANS}

    per_window, by_backend = jax.device_get(losses())
    reference = np.mean(per_window)
    for jacobian in dynamics.JACOBIANS:
        np.testing.assert_allclose(by_backend[jacobian], reference, rtol=1e-4, err_msg=jacobian)
    plain = float(dense_reference[0][0])  # the same windows on the dataset skeleton
    assert abs(plain - reference) > 1e-3 * reference


def test_generalized_forces_equal_the_dense_jacobian_transpose():
    """dynamics.generalized_forces (the blocked tree path, back in [B, T, J + 1, 3]) equals
    Jᵀ m (a − g) built by hand: numpy central differences of FK positions and the jacfwd matrix."""
    skeleton, fps, _, _, root, rotations = clip_batch()
    root, rotations = root[:2, :8], rotations[:2, :8]
    # Jitted: op by op, these three dispatch (and compile) hundreds of small programs (13 -> 3 CPU s).
    forces = jax.jit(dynamics.generalized_forces, static_argnums=(0, 3))
    got = np.asarray(forces(skeleton, root, rotations, fps), float)
    fk = jax.jit(K.forward_kinematics, static_argnums=0)
    positions = np.asarray(fk(skeleton, rotations, root)[0], float)  # [B, T, J, 3]
    padded = np.concatenate([positions[:, :1], positions, positions[:, -1:]], axis=1)  # edge copies
    acceleration = (padded[:, 2:] - 2 * padded[:, 1:-1] + padded[:, :-2]) * fps**2
    gravity = np.zeros(3)
    gravity[skeleton.up_axis] = -dynamics.GRAVITY
    mass = np.asarray(skeleton.masses, float) / np.sum(skeleton.masses)
    forces = mass[:, None] * (acceleration - gravity)  # [B, T, J, 3]
    jacfwd = jax.jit(K.jacfwd_jacobian, static_argnums=0)
    jac = np.asarray(jacfwd(skeleton, rotations, root), float)  # [B, T, 3J, dof]
    generalized = np.einsum("btmn,btm->btn", jac, forces.reshape(*forces.shape[:2], -1))
    root_force, torques = K.unpack_dofs(skeleton, generalized)
    want = np.concatenate([np.asarray(root_force)[..., None, :], np.asarray(torques)], axis=-2)
    assert got.shape == want.shape == (2, 8, skeleton.num_joints + 1, 3)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3 * np.abs(want).max())
