"""Numerics of the default backend (the GPU where there is one) against float64 references on the CPU.

The dynamics loss and its gradient in float32 and bfloat16, the blocked Jacobian against
``jax.jacfwd``, and the ``shard_map`` halo exchange over every local device of each backend.
``benchmarks/gpu_check.py`` runs this file with ``JAX_PLATFORMS=cuda,cpu``: the default backend is
the GPU and the references run on the CPU in float64. On a CPU-only host the default backend is
the CPU itself, and float32 / bfloat16 against float64 is still a check of the same code.

Tolerances are relative errors, ``|got - want| / |want|`` (vector norms), stated per dtype below:
float32 leaves room for TF32 products (about 2^-10 relative), which XLA's default matmul precision
may use on NVIDIA GPUs since Ampere; bfloat16 for its 8-bit mantissa. Inputs are rounded to the
tested dtype first and the reference computes on the rounded values, so only the computation's
error is measured.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from benchmarks import measure
from motionjax import losses
from motionjax.core import dynamics, halo
from motionjax.core import kinematics as K
from motionjax.core import rotations as rot
from motionjax.core.skeleton import random_tree, smpl_like

CPU = jax.local_devices(backend="cpu")[0]
FPS = 30.0
WEIGHTS = dynamics.DEFAULT_WEIGHTS
# Relative error allowed of the loss and of each gradient, by dtype. Measured on 2 CPU cores (jax 0.12):
# float32 loss 1.3e-7, gradients 1.1e-6; bfloat16 loss 1.2e-3, gradients 7e-2 (the test prints them).
LOSS_RTOL = {"float32": 1e-3, "bfloat16": 3e-2}
GRAD_RTOL = {"float32": 3e-3, "bfloat16": 0.15}
JACOBIAN_RTOL = 1e-3  # float32 blocks; 2e-7 measured on the CPU


DTYPES = ("float32", "bfloat16")
SKELETONS = {"smpl": smpl_like(), "random20": random_tree(20, seed=3, hinge_prob=0.3)}


def _default(fn, dtype, *args):
    """``fn(*args)`` jitted on the default backend with every argument in ``dtype``; numpy float64."""
    args = tuple(jnp.asarray(a, dtype) for a in args)
    return jax.tree.map(lambda x: np.asarray(x.astype(jnp.float32), np.float64), jax.jit(fn)(*args))


def _rounded(dtype, *arrays):
    """The arrays rounded to ``dtype`` and back to float64: the values both sides compute on."""
    return tuple(np.asarray(jnp.asarray(a, dtype).astype(jnp.float32), np.float64) for a in arrays)


def _relative(got, want) -> float:
    return float(np.linalg.norm(np.ravel(got - want)) / np.linalg.norm(np.ravel(want)))


@functools.cache
def _motion(dtype: str, batch=2, frames=32):
    """A smooth random motion of the SMPL-like body as target, a perturbed copy as prediction:
    ``(pred_root [B, T, 3], pred_rot [B, T, J, 4], target_root, target_rot)``, float64 values
    rounded to ``dtype``."""
    skeleton = SKELETONS["smpl"]
    rng = np.random.default_rng(0)
    root, angles = measure.smooth_motion(rng, batch, frames, skeleton.num_joints, angle_std=0.08)
    target = np.asarray(rot.axis_angle_to_quat(angles.astype(np.float64)))
    pred = target + 0.01 * rng.normal(size=target.shape)
    pred /= np.linalg.norm(pred, axis=-1, keepdims=True)
    return _rounded(jnp.dtype(dtype), root + 0.003 * rng.normal(size=root.shape), pred, root, target)


@functools.cache
def _pose(name: str, frames=4):
    """``(rotations [F, J, 4], root [F, 3], joint forces [F, J, 3])`` of ``SKELETONS[name]``, float32
    values."""
    skeleton = SKELETONS[name]
    rng = np.random.default_rng(1)
    q = rng.normal(size=(frames, skeleton.num_joints, 4))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    forces = rng.normal(size=(frames, skeleton.num_joints, 3))
    return _rounded(jnp.float32, q, rng.normal(size=(frames, 3)), forces)


def _loss_and_grad(pred_root, pred_rot, target_root, target_rot):
    """The dynamics loss (blocked Jacobian, the default) and its gradient w.r.t. the prediction."""
    loss = lambda pr, pq: dynamics.dynamics_loss(SKELETONS["smpl"], pr, pq, target_root, target_rot, FPS,
                                                  WEIGHTS, jacobian="blocked")[0]
    return jax.value_and_grad(loss, argnums=(0, 1))(pred_root, pred_rot)


@pytest.fixture(scope="module")
def float64():
    """Every reference of this file, jitted in float64 on the CPU in one x64 session: numpy results.

    jax's caches of inner jitted functions (``jnp.take`` inside FK) do not key on the x64 mode: a
    trace from the other mode is reused with the wrong index width (an MLIR verifier error), so the
    caches are cleared before and after; one session keeps that to one recompile per program."""
    out = {}
    jax.clear_caches()  # 32-bit traces of earlier tests in this process
    try:
        with jax.enable_x64(True):
            put = lambda arrays: jax.device_put(tuple(np.asarray(a, np.float64) for a in arrays), CPU)
            for dtype in DTYPES:
                out["dynamics", dtype] = jax.jit(_loss_and_grad)(*put(_motion(dtype)))
            for name, skeleton in SKELETONS.items():
                jacfwd = jax.jit(functools.partial(K.jacfwd_jacobian, skeleton))
                out["jacfwd", name] = jacfwd(*put(_pose(name)[:2]))
            out = jax.tree.map(lambda x: np.asarray(x, np.float64), out)
    finally:
        jax.clear_caches()
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_dynamics_loss_and_gradient_match_float64_on_cpu(float64, dtype):
    want_loss, want_grads = float64["dynamics", dtype]
    got_loss, got_grads = _default(_loss_and_grad, jnp.dtype(dtype), *_motion(dtype))
    errors = {"loss": _relative(got_loss, want_loss),
              **{name: _relative(g, w) for name, g, w in zip(("root", "rotations"), got_grads, want_grads,
                                                              strict=True)}}
    message = f"{jax.default_backend()} {dtype}: relative errors {errors}"
    print(message)
    assert np.isfinite(want_loss) and want_loss > 0, message
    assert errors["loss"] <= LOSS_RTOL[dtype], message
    assert max(errors["root"], errors["rotations"]) <= GRAD_RTOL[dtype], message


@pytest.mark.parametrize("name", SKELETONS)
def test_blocked_jacobian_matches_jacfwd_in_float64(float64, name):
    """The Jacobian assembled from the blocks (float32, default backend) against ``jax.jacfwd`` of FK
    (float64, CPU), and the blocked transpose product against ``Jᵀ f`` of that reference."""
    skeleton = SKELETONS[name]
    rotations, root, forces = _pose(name)
    reference = float64["jacfwd", name]  # [F, 3J, num_dof]

    def blocked(rotations, root, forces):
        positions, world = K.forward_kinematics(skeleton, rotations, root)
        torques, root_force = K.jacobian_transpose_product(skeleton, positions, world, forces)
        return K.dense_jacobian(skeleton, positions, world), K.pack_dofs(skeleton, root_force, torques)

    dense, transpose = _default(blocked, jnp.float32, rotations, root, forces)
    want_transpose = np.einsum("fmn,fm->fn", reference, forces.reshape(len(forces), -1))
    errors = {"jacobian": _relative(dense, reference),
              "transpose_product": _relative(transpose, want_transpose)}
    print(f"{jax.default_backend()} {name}: relative errors {errors}")
    assert max(errors.values()) <= JACOBIAN_RTOL, f"{jax.default_backend()}: relative errors {errors}"


def _backends():
    """Each backend present: the default one (the GPU, where there is one) and the CPU."""
    return list(dict.fromkeys([jax.default_backend(), "cpu"]))


@pytest.mark.parametrize("backend", _backends())
def test_halo_exchange_over_all_local_devices(backend):
    """``pad_with_halos`` inside ``shard_map`` over every local device of ``backend`` (time split
    across them) equals edge-padding the whole sequence and slicing each shard's window; central
    differences across shard boundaries equal the unsharded ones. Data movement only: exact."""
    devices = jax.local_devices(backend=backend)
    if backend == "cpu":
        assert len(devices) >= 2, "tests/conftest.py asks for 8 CPU devices"
    n, local, width = len(devices), 6, 2
    mesh = Mesh(np.array(devices), ("time",))
    x = np.random.default_rng(2).normal(size=(3, n * local, 5)).astype(np.float32)
    pad = jax.shard_map(lambda x: halo.pad_with_halos(x, width, axis=1, axis_name="time"), mesh=mesh,
                        in_specs=P(None, "time"), out_specs=P(None, "time"))
    got = np.asarray(jax.jit(pad)(x)).reshape(3, n, local + 2 * width, 5)
    padded = np.pad(x, ((0, 0), (width, width), (0, 0)), mode="edge")
    for i in range(n):
        np.testing.assert_array_equal(got[:, i], padded[:, i * local:i * local + local + 2 * width],
                                      err_msg=f"shard {i} of {n} on {backend}")

    def sharded_velocity(x):
        return losses.velocity(x, FPS, time_axis_name="time")

    velocity = jax.shard_map(sharded_velocity, mesh=mesh, in_specs=P(None, "time"),
                             out_specs=(P(None, "time"), P("time")))
    got_v, got_valid = jax.jit(velocity)(x)
    want_v, want_valid = jax.jit(losses.velocity, static_argnums=1)(jax.device_put(x, devices[0]), FPS)
    np.testing.assert_array_equal(np.asarray(got_valid), np.asarray(want_valid))
    np.testing.assert_allclose(np.asarray(got_v), np.asarray(want_v), rtol=1e-6, atol=1e-5)
