"""The joint-dynamics loss on ``[B, T, J, ...]`` motion, optionally sharded over time.

Per frame ``t`` (central differences at ``fps``; ``q`` local rotations, ``p`` FK positions):

* angular velocity of each joint relative to its parent, ``log(q_{t+1} q_{t-1}⁻¹)·fps/2`` (parent
  frame), projected on the joint's DOFs and expressed as generalized velocities ``θ̇_t``;
* ``ṗ_t = (p_{t+1} - p_{t-1})·fps/2``, ``a_t = (p_{t+1} - 2p_t + p_{t-1})·fps²``,
  jerk ``(p_{t+2} - 2p_{t+1} + 2p_{t-1} - p_{t-2})·fps³/2``.

Terms (each a mean over batch, valid frames and joints of a squared norm; weights from config):

* ``velocity``: kinematic consistency of the prediction, ``‖J(q_t)·[v_root, θ̇_t] - ṗ_t‖²``. It is
  O(Δt²) on smooth motion and grows when frames do not follow from one another;
* ``force``: generalized forces ``τ_t = Jᵀ m (a_t - g)`` (joint torques and the root force)
  matched between prediction and target;
* ``jerk``: squared jerk of the predicted joint positions (smoothness).

Masses are the skeleton's per-link masses normalised to body mass (fractions summing to 1), so
forces are per kg of body; skeleton builders take the defaults from de Leva (1996), "Adjustments
to Zatsiorsky-Seluyanov's segment inertia parameters", J. Biomech. 29(9), Table 4
(``motionjax.core.skeleton.DE_LEVA_MASS_FRACTION``). Gravity points along ``-up_axis``.

The products ``J·θ̇`` and ``Jᵀ·F`` come from one of three interchangeable backends
(``jacobian=``): ``"blocked"`` (tree prefix/subtree sums, :mod:`motionjax.core.kinematics`), ``"jvp"``
(``jax.jvp``/``jax.vjp`` of FK) and ``"dense"`` (the ``jax.jacfwd`` Jacobian, the reference).

Sharding: called inside ``jax.shard_map`` with ``T`` split over ``time_axis_name``, the frames the
stencils need come from the neighbouring shards (:func:`motionjax.core.halo.pad_with_halos`), frames
whose stencil crosses a global end or a padding frame (``valid = 0``) are masked
(:func:`motionjax.core.halo.stencil_valid`) and the means are taken with ``psum``, so the value
equals the unsharded one.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from motionjax.core import kinematics as K
from motionjax.core import rotations as rot
from motionjax.core.halo import pad_with_halos, stencil_valid
from motionjax.core.reduce import masked_sum, mean_of
from motionjax.core.skeleton import Skeleton

GRAVITY = 9.81  # m/s²
TERMS = ("velocity", "force", "jerk")
# The default term weights (config.loss.dynamics): they bring the terms to comparable size. Magnitudes on
# the DeepMimic windows (noisy vs clean input): velocity ~0.09 (m/s)^2, force ~400 (N/kg)^2, jerk ~7e6
# (m/s^3)^2 (~3e5 on clean motion).
DEFAULT_WEIGHTS = {"velocity": 1.0, "force": 1e-3, "jerk": 1e-7}
JACOBIANS = ("blocked", "jvp", "dense")
HALO = 2  # the jerk stencil reaches two frames each way
# Batches of more than ONE_PASS_FRAMES (local) frames go in passes of PASS_FRAMES (dynamics_loss). A pass
# loop (rematerialised) compiles 2.5-3x slower than one pass and runs slower up to ~2,048 frames; above,
# its small working set wins. CPU ms of loss + gradient, passes of 512 vs one pass (2 shared cores,
# 2026-12-04): J = 24: 1,024 frames 13.5 vs 9.8, 2,048 25.5 vs 20.5, 4,096 51.2 vs 60.9; J = 13 (15
# joints): 8,192 68 vs 85, 16,384 139 vs 188. Compile CPU s at J = 24, 4,096 frames: 30.8 vs 12.8.
PASS_FRAMES = 512
ONE_PASS_FRAMES = 2048


# The time stencils as (offset: coefficient) at a power of fps: velocity, acceleration, jerk.
_STENCILS = (({-1: -0.5, 1: 0.5}, 1), ({-1: 1.0, 0: -2.0, 1: 1.0}, 2),
             ({-2: -0.5, -1: 1.0, 1: -1.0, 2: 0.5}, 3))


def _stencil(x, stencil, start, length, axis):
    """``Σ_s c_s x[t + s]`` over ``{s: c_s}`` for the ``length`` frames ``t`` of ``x`` from ``start`` on."""
    frames = lambda s: jax.lax.slice_in_dim(x, start + s, start + s + length, axis=axis)
    return sum(c * frames(s) for s, c in stencil.items())


def _apply_stencils(x, start, length, fps, axis):
    """Every stencil of :data:`_STENCILS` on the ``length`` frames of ``x`` from ``start`` on."""
    return tuple(_stencil(x, stencil, start, length, axis) * fps**power for stencil, power in _STENCILS)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _stencils_tree(positions_pad, length, fps):
    """``(velocity, acceleration, jerk)`` ``[3, J, B, T]`` of halo-padded ``[3, J, B, T + 4]``
    positions. Its VJP is the transposed stencils (offsets negated) on the cotangents zero-padded
    once: XLA would transpose each of the five shifted reads into its own pad to ``T + 4``."""
    return _apply_stencils(positions_pad, HALO, length, fps, axis=3)


def _stencils_tree_vjp(length, fps, _, cotangents):
    wide = [jnp.pad(g, [(0, 0)] * 3 + [(2 * HALO, 2 * HALO)]) for g in cotangents]
    return (sum(_stencil(g, {-s: c for s, c in stencil.items()}, HALO, length + 2 * HALO, axis=3) * fps**power
                for g, (stencil, power) in zip(wide, _STENCILS, strict=True)),)


_stencils_tree.defvjp(lambda x, length, fps: (_stencils_tree(x, length, fps), None), _stencils_tree_vjp)


def _products(skeleton, jacobian, rotations, root_position, offsets, positions, world, joint_velocity,
              root_velocity, forces, forces_only):
    """``J·[v_root, θ̇]`` ``[3, J, B, T]`` (None with ``forces_only``) and ``Jᵀ·F`` as ``(torques
    [3, J, B, T], root force [3, B, T])``, all in the tree layout. The blocked backend works in it
    end to end; the autodiff ones differentiate FK of the ``[B, T, J, ...]`` motion (``rotations``,
    ``root_position``, ``offsets``), so their vectors go there and back."""
    if jacobian == "blocked":
        torques, root_force = K.jacobian_transpose_product_tree(skeleton, positions, world, forces,
                                                                custom_vjp=True)
        velocity = None if forces_only else K.jacobian_vector_product_tree(
            skeleton, positions, world, joint_velocity, root_velocity, custom_vjp=True)
        return velocity, (torques, root_force)
    to_batch = lambda x: K.from_tree_layout(skeleton, x, custom_vjp=True)
    to_tree = lambda x: K.to_tree_layout(skeleton, x, custom_vjp=True)
    omega, root_v, force = to_batch(joint_velocity), jnp.moveaxis(root_velocity, 0, -1), to_batch(forces)
    if jacobian == "jvp":
        velocity = None if forces_only else K.autodiff_jacobian_vector_product(
            skeleton, rotations, root_position, omega, root_v, offsets)
        torques, root_force = K.autodiff_jacobian_transpose_product(skeleton, rotations, root_position, force,
                                                                    offsets)
    else:  # dense: the jax.jacfwd Jacobian, the reference
        jac = K.jacfwd_jacobian(skeleton, rotations, root_position, offsets)  # [..., 3J, num_dof]
        velocity = None if forces_only else jnp.einsum(
            "...mn,...n->...m", jac, K.pack_dofs(skeleton, root_v, omega)).reshape(force.shape)
        generalized = jnp.einsum("...mn,...m->...n", jac, force.reshape(*force.shape[:-2], -1))
        root_force, torques = K.unpack_dofs(skeleton, generalized)
    velocity = None if velocity is None else to_tree(velocity)
    return velocity, (to_tree(torques), jnp.moveaxis(root_force, -1, 0))


def _motion_terms(skeleton, root_position, rotations, fps, jacobian, time_axis_name, forces_only, fk=None,
                  offsets=None):
    """Per-frame quantities of one motion ``[B, T, ...]`` (local frames), in the tree layout of
    :mod:`motionjax.core.kinematics` (``[C, J, B, T]``, joints in level order) from input to loss,
    with the reverse-mode algebra (:func:`motionjax.core.rotations.algebra`).

    ``fk``: the motion's ``(positions, world rotations)`` when the caller already ran FK on it.
    ``offsets``: ``[B, 1, J, 3]`` rest offsets of each window (None: the skeleton's).
    Returns ``(velocity residual [3, J, B, T], generalized forces [3, J + 1, B, T], jerk [3, J, B, T])``;
    with ``forces_only`` the residual and jerk are None.
    """
    ops = rot.algebra(custom_vjp=True)
    tree = lambda x: K.to_tree_layout(skeleton, x, custom_vjp=True)
    length = rotations.shape[1]
    q = tree(rotations)
    if fk is None:
        positions, world = K.forward_kinematics_tree(skeleton, rotations, root_position, offsets,
                                                     custom_vjp=True)
    else:
        positions, world = tree(fk[0]), tree(fk[1])
    # FK runs on the local frames only; the stencils' neighbour frames arrive as positions.
    time_axis = 3
    positions_pad = pad_with_halos(positions, HALO, axis=time_axis, axis_name=time_axis_name)
    rot_pad = pad_with_halos(q, 1, axis=time_axis, axis_name=time_axis_name)
    velocity, acceleration, jerk = _stencils_tree(positions_pad, length, fps)

    gravity = jnp.zeros((3, 1, 1, 1), q.dtype).at[skeleton.up_axis].set(-GRAVITY)
    mass = K.to_tree_layout(skeleton, np.asarray(skeleton.masses, float)[:, None] / np.sum(skeleton.masses))
    forces = jnp.asarray(mass[..., None, None], q.dtype) * (acceleration - gravity)

    # Relative angular velocity in the parent frame -> padded generalized velocity (world frame).
    before, after = rot_pad[..., :-2], rot_pad[..., 2:]
    local_omega = rot.quat_to_axis_angle_cm(ops.quat_mul(after, rot.quat_conj_cm(before)))
    parent = ops.quat_mul(world, rot.quat_conj_cm(q))
    joint_velocity = K.world_to_dofs_tree(skeleton, world, ops.quat_rotate(parent, local_omega * (fps / 2)),
                                          custom_vjp=True)
    predicted_velocity, (torques, root_force) = _products(
        skeleton, jacobian, rotations, root_position, offsets, positions, world, joint_velocity,
        velocity[:, 0], forces, forces_only)
    generalized = jnp.concatenate([root_force[:, None], torques], axis=1)
    if forces_only:
        return None, generalized, None
    return predicted_velocity - velocity, generalized, jerk


def generalized_forces(skeleton: Skeleton, root_position, rotations, fps: float, offsets=None, fk=None):
    """The loss's own ``τ = Jᵀ m (a − g)`` of a motion: ``root_position [B, T, 3]``, ``rotations
    [B, T, J, 4]`` -> ``[B, T, J + 1, 3]`` (N per kg of body: the root force, then each joint's
    torque; the blocked backend). Edge frames use edge copies: mask them with ``stencil_valid(.., 1)``.
    ``offsets``: optional ``[B, J, 3]`` rest offsets of each window's clip; ``fk``: the motion's
    ``(positions [B, T, J, 3], world rotations [B, T, J, 4])`` when the caller already ran
    :func:`motionjax.core.kinematics.forward_kinematics` on it (on the same offsets)."""
    if offsets is not None:
        offsets = jnp.asarray(offsets, rotations.dtype)[:, None]
    tau = _motion_terms(skeleton, root_position, rotations, fps, "blocked", None, forces_only=True, fk=fk,
                        offsets=offsets)[1]  # [3, J + 1, B, T]
    root_force, torques = jnp.moveaxis(tau[:, 0], 0, -1), K.from_tree_layout(skeleton, tau[:, 1:])
    return jnp.concatenate([root_force[..., None, :], torques], axis=-2)


def _num_passes(batch: int, length: int, frames_per_pass: int | None | str) -> int:
    """The fewest passes over ``batch`` (a divisor of it) of at most ``frames_per_pass`` frames each;
    ``"auto"``: one pass up to :data:`ONE_PASS_FRAMES` frames, else passes of :data:`PASS_FRAMES`."""
    if frames_per_pass == "auto":
        frames_per_pass = None if batch * length <= ONE_PASS_FRAMES else PASS_FRAMES
    if frames_per_pass is None or batch * length <= frames_per_pass:
        return 1
    fits = (n for n in range(2, batch + 1) if batch % n == 0 and batch // n * length <= frames_per_pass)
    return next(fits, batch)


def _term_sums(skeleton, pred_root, pred_rot, target_root, target_rot, pred_fk, target_fk, offsets, valid, *,
               fps, jacobian, time_axis_name):
    """``({term: sum of squares over valid frames}, {term: count})`` for one (local) batch; ``valid
    [B, T]`` bool: a frame counts where its whole stencil is valid (and inside the sequence)."""
    inner, outer = stencil_valid(valid, 1, time_axis_name), stencil_valid(valid, HALO, time_axis_name)
    sq = lambda x: jnp.sum(x * x, axis=0)  # [3, J, B, T] -> [J, B, T]
    terms_of = functools.partial(_motion_terms, skeleton, fps=fps, jacobian=jacobian,
                                 time_axis_name=time_axis_name)
    residual, pred_tau, jerk = terms_of(pred_root, pred_rot, forces_only=False, fk=pred_fk, offsets=offsets)
    _, target_tau, _ = terms_of(target_root, target_rot, forces_only=True, fk=target_fk, offsets=offsets)
    pairs = {"velocity": masked_sum(sq(residual), inner),  # [J, B, T] against a [B, T] mask
             "force": masked_sum(sq(pred_tau - target_tau), inner), "jerk": masked_sum(sq(jerk), outer)}
    return ({name: pair[0] for name, pair in pairs.items()},
            {name: pair[1].astype(jnp.float32) for name, pair in pairs.items()})


def dynamics_loss(skeleton: Skeleton, pred_root, pred_rot, target_root, target_rot, fps: float,
                  weights: Mapping[str, float], jacobian: str = "blocked", time_axis_name: str | None = None,
                  pred_fk=None, target_fk=None, frames_per_pass: int | None | str = "auto", offsets=None,
                  valid=None, batch_axis_name: str | None = None):
    """The weighted joint-dynamics loss.

    Args:
      skeleton: the kinematic tree (static).
      pred_root, target_root: ``[B, T, 3]`` root positions (m).
      pred_rot, target_rot: ``[B, T, J, 4]`` local joint rotations (unit quaternions, wxyz).
      fps: frame rate (Hz).
      weights: ``{"velocity": w, "force": w, "jerk": w}`` (missing keys count as 0).
      jacobian: ``"blocked"`` | ``"jvp"`` | ``"dense"``; all give the same value.
      time_axis_name: the mesh axis ``T`` is split over when called inside ``jax.shard_map``
        (local ``T >= 2`` frames per shard), else None.
      pred_fk, target_fk: optional ``(positions [B, T, J, 3], world rotations [B, T, J, 4])`` of
        the two motions, when the caller has run :func:`motionjax.core.kinematics.forward_kinematics`
        already (the reconstruction loss has): FK then runs once per motion per step.
      frames_per_pass: above this many (local) frames the batch is processed in passes of at most
        this many frames (whole windows; a divisor of ``B``), one after another, each
        recomputed in the backward pass, so the working set stays bounded as ``B·T`` grows.
        None: one pass; ``"auto"``: one pass up to :data:`ONE_PASS_FRAMES` frames, else passes of
        :data:`PASS_FRAMES` (the faster way on each side, and the faster compile below).
      offsets: optional ``[B, J, 3]`` rest offsets of each window's clip (m), used by every FK and
        Jacobian of both motions; None: the skeleton's. ``pred_fk``/``target_fk`` must match them.
      valid: optional ``[B, T]`` (0 = edge padding past a short segment's end): a frame counts only
        where its whole stencil is valid. None: every frame.
      batch_axis_name: the mesh axis ``B`` is split over inside ``jax.shard_map``: the means are then
        global (sums and counts summed over it), however the valid frames fall on the shards.

    Returns:
      ``(loss scalar, {term: unweighted scalar})``; means over frames at least two frames (one
      for velocity and force) from either end of the global sequence (0 where there is none:
      :func:`motionjax.core.reduce.mean_of`).
    """
    unknown = set(weights) - set(TERMS)
    if unknown:
        raise ValueError(f"unknown dynamics loss terms {sorted(unknown)}; expected {TERMS}")
    if jacobian not in JACOBIANS:
        raise ValueError(f"jacobian must be one of {JACOBIANS}, got {jacobian!r}")
    if offsets is not None:
        offsets = jnp.asarray(offsets, pred_rot.dtype)[:, None]  # [B, 1, J, 3]: the same bones every frame
    valid = jnp.ones(pred_rot.shape[:2], bool) if valid is None else jnp.asarray(valid).astype(bool)
    motion = (pred_root, pred_rot, target_root, target_rot, pred_fk, target_fk, offsets, valid)
    batch, length = pred_rot.shape[:2]
    passes = _num_passes(batch, length, frames_per_pass)
    sums = functools.partial(_term_sums, skeleton, fps=fps, jacobian=jacobian, time_axis_name=time_axis_name)
    if passes == 1:
        totals, counts = sums(*motion)
    else:  # a loop over batch passes, each recomputed in the backward pass: a bounded working set
        split = lambda x: x.reshape(passes, batch // passes, *x.shape[1:])
        per_pass, counts = jax.lax.map(lambda m: jax.checkpoint(sums)(*m), jax.tree.map(split, motion))
        totals, counts = jax.tree.map(lambda x: jnp.sum(x, axis=0), (per_pass, counts))
    axes = tuple(a for a in (batch_axis_name, time_axis_name) if a is not None)
    if axes:
        totals, counts = jax.lax.psum((totals, counts), axes)
    terms = {name: mean_of(totals[name], counts[name]) for name in TERMS}
    loss = sum(weights.get(name, 0.0) * value for name, value in terms.items())
    return loss, terms


def sharded_dynamics_loss(mesh, skeleton: Skeleton, pred_root, pred_rot, target_root, target_rot, fps: float,
                          weights: Mapping[str, float], jacobian: str = "blocked", data_axis: str = "data",
                          time_axis: str = "time"):
    """:func:`dynamics_loss` on global arrays, ``B`` split over ``data_axis`` and ``T`` over ``time_axis``.

    Returns the same ``(loss, terms)`` as the unsharded call (replicated scalars).
    """
    weights = dict(weights)

    def local(pr, pq, tr, tq):
        loss, terms = dynamics_loss(skeleton, pr, pq, tr, tq, fps, weights, jacobian, time_axis)
        # Every data shard holds the same number of frames, so the mean of means is the mean.
        return jax.lax.pmean((loss, terms), data_axis)

    motion = P(data_axis, time_axis)
    return jax.shard_map(local, mesh=mesh, in_specs=(motion, motion, motion, motion),
                         out_specs=P())(pred_root, pred_rot, target_root, target_rot)
