"""Rotation conversions against scipy's independent ``Rotation``, plus property tests (hypothesis).

numpy inputs run the float64 numpy path of each function; jax inputs the jitted float32 path —
both are checked.
"""
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.transform import Rotation, Slerp

from motionjax.core import rotations as rot

ORDERS = ("XYZ", "XZY", "YXZ", "YZX", "ZXY", "ZYX")
examples = settings(max_examples=40, deadline=None)  # per test: a global profile would leak


def _unit(v):
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


quats = hnp.arrays(np.float64, (6, 4), elements=st.floats(-1, 1)).filter(
    lambda q: (np.linalg.norm(q, axis=-1) > 0.1).all()).map(_unit)
rotvecs = hnp.arrays(np.float64, (6, 3), elements=st.floats(-3.1, 3.1)).filter(
    lambda v: (np.linalg.norm(v, axis=-1) < 3.1).all())  # below π: the log map's branch is unique


def _scipy(q):
    """scipy Rotation from wxyz quaternions (scipy stores xyzw)."""
    return Rotation.from_quat(np.roll(q, -1, axis=-1))


def _wxyz(r: Rotation):
    return np.roll(r.as_quat(), 1, axis=-1)


def _same_rotation(a, b, atol=1e-9):
    """Quaternions equal up to sign."""
    np.testing.assert_allclose(np.abs(np.sum(a * b, axis=-1)), 1.0, atol=atol)


@examples
@given(quats, quats)
def test_products_and_matrices_match_scipy(q, p):
    np.testing.assert_allclose(rot.quat_to_matrix(q), _scipy(q).as_matrix(), atol=1e-12)
    _same_rotation(rot.matrix_to_quat(_scipy(q).as_matrix()), q)
    _same_rotation(rot.quat_mul(q, p), _wxyz(_scipy(q) * _scipy(p)))
    v = np.linspace(-1, 2, 18).reshape(6, 3)
    np.testing.assert_allclose(rot.quat_rotate(q, v), _scipy(q).apply(v), atol=1e-12)
    _same_rotation(rot.quat_mul(q, rot.quat_conj(q)), rot.identity_quat((6,), xp=np))


@examples
@given(rotvecs)
def test_exp_log_match_scipy_and_invert(v):
    q = rot.axis_angle_to_quat(v)
    _same_rotation(q, _wxyz(Rotation.from_rotvec(v)))
    np.testing.assert_allclose(rot.quat_to_axis_angle(q), v, atol=1e-9)
    np.testing.assert_allclose(rot.quat_exp(rot.quat_log(-q)), rot.quat_canonical(q), atol=1e-9)


@examples
@given(quats)
def test_six_d_round_trip(q):
    np.testing.assert_allclose(rot.quat_to_6d(q), rot.matrix_to_6d(_scipy(q).as_matrix()), atol=1e-12)
    _same_rotation(rot.sixd_to_quat(rot.quat_to_6d(q)), q)
    np.testing.assert_allclose(rot.sixd_to_matrix(rot.matrix_to_6d(rot.quat_to_matrix(q))),
                               rot.quat_to_matrix(q), atol=1e-12)


@examples
@given(hnp.arrays(np.float64, (6, 6), elements=st.floats(-5, 5)))
def test_any_non_degenerate_6d_is_a_rotation(d6):
    a, b = d6[:, :3], d6[:, 3:]
    keep = (np.linalg.norm(a, axis=-1) > 1e-2) & (np.linalg.norm(np.cross(a, b), axis=-1) > 1e-2)
    m = rot.sixd_to_matrix(d6[keep])
    np.testing.assert_allclose(m @ np.swapaxes(m, -1, -2), np.broadcast_to(np.eye(3), m.shape), atol=1e-9)
    np.testing.assert_allclose(np.linalg.det(m), 1.0, atol=1e-9)


@pytest.mark.parametrize("order", ORDERS)
@examples
@given(angles=hnp.arrays(np.float64, (6, 3), elements=st.floats(-3.1, 3.1)))
def test_euler_matches_scipy_and_round_trips(order, angles):
    angles[:, 1] = np.clip(angles[:, 1], -1.5, 1.5)  # middle angle within (-π/2, π/2): unique angles
    q = rot.euler_to_quat(angles, order)
    _same_rotation(q, _wxyz(Rotation.from_euler(order, angles)))  # upper case = intrinsic in scipy
    np.testing.assert_allclose(rot.quat_to_euler(q, order), angles, atol=1e-9)


@pytest.mark.parametrize("order", ORDERS)
def test_euler_at_gimbal_lock_still_reproduces_the_rotation(order):
    angles = np.array([[0.3, np.pi / 2, -0.7], [1.0, -np.pi / 2, 0.2]])
    q = rot.euler_to_quat(angles, order)
    _same_rotation(rot.euler_to_quat(rot.quat_to_euler(q, order), order), q, atol=1e-7)


@examples
@given(quats, quats, st.floats(0, 1))
def test_slerp_matches_scipy(a, b, t):
    _same_rotation(rot.quat_slerp(a, b, np.zeros(6)), a)
    _same_rotation(rot.quat_slerp(a, b, np.ones(6)), b)
    mid = rot.quat_slerp(a, b, np.full(6, t))
    for i in range(6):
        ref = Slerp([0, 1], _scipy(np.stack([a[i], b[i]])))([t])
        _same_rotation(mid[i], _wxyz(ref)[0], atol=1e-7)


@pytest.mark.parametrize("angle", [0.05, 0.1, 0.3, 1.0])
def test_nlerp_is_within_its_stated_bound_of_slerp(angle):
    rng = np.random.default_rng(0)
    a = rot.axis_angle_to_quat(rng.normal(size=(500, 3)))
    b = rot.quat_mul(a, rot.axis_angle_to_quat(_unit(rng.normal(size=(500, 3))) * angle))
    t = rng.random(500)
    # -b: the same rotation on the far hemisphere; both take the shortest arc.
    gap = rot.relative_rotation_vector(rot.quat_slerp(a, b, t), rot.quat_nlerp(a, -b, t))
    gap = np.linalg.norm(gap, axis=-1)
    assert gap.max() <= angle**3 / 200


def test_small_angles_are_accurate_in_float32():
    """The Taylor branches keep float32 relative accuracy down to tiny angles (vs float64 scipy)."""
    v = np.outer(np.logspace(-8, -1, 15), _unit(np.array([0.3, -0.5, 0.8])))
    q = np.asarray(jax.jit(rot.axis_angle_to_quat)(jnp.asarray(v, jnp.float32)))
    np.testing.assert_allclose(q, _wxyz(Rotation.from_rotvec(v)), rtol=1e-6, atol=1e-12)
    back = np.asarray(jax.jit(rot.quat_to_axis_angle)(jnp.asarray(q)))
    np.testing.assert_allclose(back, v, rtol=1e-5)


def test_exp_log_gradients_at_exactly_zero():
    zero = jnp.zeros(3)
    d_exp = jax.jit(jax.jacfwd(rot.axis_angle_to_quat))(zero)
    np.testing.assert_allclose(d_exp, np.concatenate([np.zeros((1, 3)), 0.5 * np.eye(3)]), atol=1e-7)
    d_log = jax.jit(jax.jacfwd(rot.quat_to_axis_angle))(jnp.array([1.0, 0, 0, 0]))
    np.testing.assert_allclose(d_log, np.concatenate([np.zeros((3, 1)), 2 * np.eye(3)], axis=1), atol=1e-6)
    identity, identity_6d = jnp.array([1.0, 0, 0, 0]), jnp.array([1.0, 0, 0, 0, 1, 0])
    for f, x in ((rot.axis_angle_to_quat, zero), (rot.quat_to_axis_angle, identity),
                 (rot.quat_to_6d, identity), (rot.sixd_to_quat, identity_6d)):
        g = jax.jit(jax.grad(lambda x, f=f: jnp.sum(f(x) ** 2)))(x)
        assert np.isfinite(np.asarray(g)).all(), f.__name__


def test_jax_path_matches_numpy_path():
    rng = np.random.default_rng(0)
    q = _unit(rng.normal(size=(64, 4)))
    d6 = rng.normal(size=(64, 6))
    angles = rng.uniform(-1.5, 1.5, (64, 3))
    fns = {
        "matrix": (rot.quat_to_matrix, q), "from_matrix": (rot.matrix_to_quat, rot.quat_to_matrix(q)),
        "log": (rot.quat_to_axis_angle, q), "sixd": (rot.sixd_to_quat, d6),
        "euler": (lambda a: rot.euler_to_quat(a, "ZXY"), angles),
        "to_euler": (lambda x: rot.quat_to_euler(x, "YZX"), q),
    }
    for name, (f, x) in fns.items():
        got = np.asarray(jax.jit(f)(jnp.asarray(x, jnp.float32)))
        np.testing.assert_allclose(got, f(x), atol=2e-5, err_msg=name)
