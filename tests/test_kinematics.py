"""Forward kinematics against independent references: pybullet's own FK and a naive per-joint loop."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from motionjax.core import rotations as rot
from motionjax.core.kinematics import forward_kinematics
from motionjax.core.skeleton import (
    BALL,
    HINGE,
    Skeleton,
    deepmimic_humanoid,
    deepmimic_urdf_path,
    random_tree,
)
from motionjax.formats import deepmimic_clip_paths, read_deepmimic
from motionjax.formats.deepmimic import JOINT_ORDER


def _xyzw(q):
    q = np.asarray(q, float)
    return (np.roll(q, -1) / np.linalg.norm(q)).tolist()


def pybullet_positions(clip_path) -> dict[str, np.ndarray]:
    """World link positions ``{joint name: [T, 3]}`` computed by pybullet from the raw clip file.

    Independent of our reader: the frame layout is taken from the file format (duration, root
    xyz, root wxyz, then per joint a wxyz quaternion or a hinge angle) and fed to pybullet.
    """
    p = pytest.importorskip("pybullet")
    frames = np.asarray(json.loads(clip_path.read_text())["Frames"], float)
    client = p.connect(p.DIRECT)
    try:
        body = p.loadURDF(str(deepmimic_urdf_path()), globalScaling=0.25, flags=p.URDF_MAINTAIN_LINK_ORDER,
                          physicsClientId=client)
        link = {p.getJointInfo(body, k, physicsClientId=client)[12].decode(): k
                for k in range(p.getNumJoints(body, physicsClientId=client))}
        out = {name: np.zeros((len(frames), 3)) for name in link}
        for t, frame in enumerate(frames):
            p.resetBasePositionAndOrientation(body, frame[1:4], _xyzw(frame[4:8]), physicsClientId=client)
            col = 8
            for name in JOINT_ORDER:
                if p.getJointInfo(body, link[name], physicsClientId=client)[2] == p.JOINT_REVOLUTE:
                    p.resetJointState(body, link[name], frame[col], physicsClientId=client)
                    col += 1
                else:
                    p.resetJointStateMultiDof(body, link[name], _xyzw(frame[col:col + 4]),
                                              physicsClientId=client)
                    col += 4
            for name, k in link.items():
                out[name][t] = p.getLinkState(body, k, computeForwardKinematics=True,
                                              physicsClientId=client)[4]
    finally:
        p.disconnect(client)
    return out


def test_fk_matches_pybullet_on_every_deepmimic_clip():
    """Every frame of every clip, our reader + float32 jitted FK vs pybullet, within 1 mm."""
    pytest.importorskip("pybullet")
    clips = [read_deepmimic(path) for path in deepmimic_clip_paths()]
    sk = clips[0].skeleton
    ours, _ = jax.jit(forward_kinematics, static_argnums=0)(  # all 1620 frames in one call
        sk, jnp.asarray(np.concatenate([c.rotations for c in clips]), jnp.float32),
        jnp.asarray(np.concatenate([c.root_position for c in clips]), jnp.float32))
    ours = np.split(np.asarray(ours), np.cumsum([c.num_frames for c in clips])[:-1])
    errors = {}
    for path, pos in zip(deepmimic_clip_paths(), ours, strict=True):
        ref = pybullet_positions(path)
        assert set(ref) == set(sk.names)
        errors[path.stem] = max(np.abs(pos[:, sk.index(n)] - ref[n]).max() for n in ref)
    assert max(errors.values()) < 1e-3, {k: f"{v * 1e3:.3f} mm" for k, v in errors.items()}


def naive_fk(skeleton: Skeleton, rotations, root_position, offsets):
    """Reference FK: one joint at a time with scipy rotation matrices, float64."""
    T, J = rotations.shape[:2]
    world = [None] * J
    pos = np.zeros((T, J, 3))
    for j in range(J):
        local = Rotation.from_quat(np.roll(rotations[:, j], -1, axis=-1)).as_matrix()
        parent = skeleton.parents[j]
        if parent < 0:
            world[j], pos[:, j] = local, root_position
        else:
            world[j] = world[parent] @ local
            pos[:, j] = pos[:, parent] + np.einsum("tab,tb->ta", world[parent], offsets[:, j])
    return pos, np.stack(world, axis=1)


def _random_motion(skeleton: Skeleton, shape, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(*shape, skeleton.num_joints, 4))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    return q, rng.normal(size=(*shape, 3))


def test_fk_matches_a_naive_per_joint_loop():
    sk = random_tree(50, seed=2)
    q, root = _random_motion(sk, (7,))
    offsets = sk.offsets * np.random.default_rng(1).uniform(0.5, 2.0, (7, 50, 1))  # per-frame offsets
    want_pos, want_rot = naive_fk(sk, q, root, offsets)
    fk_np = lambda *args: forward_kinematics(sk, *args)  # noqa: E731  the float64 numpy path
    fk_jax = jax.jit(lambda *args: forward_kinematics(sk, *(jnp.asarray(a, jnp.float32) for a in args)))
    for fk, atol in ((fk_np, 1e-12), (fk_jax, 2e-5)):
        pos, world = fk(q, root, offsets)
        np.testing.assert_allclose(pos, want_pos, atol=atol)
        np.testing.assert_allclose(rot.quat_to_matrix(np.asarray(world, float)), want_rot, atol=atol)


def test_fk_jits_with_leading_batch_dims():
    pytest.importorskip("pybullet")  # the DeepMimic humanoid's URDF ships with it
    sk = deepmimic_humanoid()
    q, root = _random_motion(sk, (2, 3, 5))  # [B, T, ...] and one more
    fk = jax.jit(forward_kinematics, static_argnums=0)
    pos, world = fk(sk, jnp.asarray(q, jnp.float32), jnp.asarray(root, jnp.float32))
    assert pos.shape == (2, 3, 5, 15, 3) and world.shape == (2, 3, 5, 15, 4)
    rest = np.broadcast_to(sk.offsets, (30, 15, 3))
    want, _ = naive_fk(sk, q.reshape(30, 15, 4), root.reshape(30, 3), rest)
    np.testing.assert_allclose(np.asarray(pos).reshape(30, 15, 3), want, atol=2e-5)


def _chain(J):
    return Skeleton([f"j{i}" for i in range(J)], [-1, *range(J - 1)], np.tile([0, 0.1, 0], (J, 1)),
                    [BALL] * J, None, None)


def _star(J):
    return Skeleton([f"j{i}" for i in range(J)], [-1] + [0] * (J - 1), np.tile([0, 0.1, 0], (J, 1)),
                    [BALL] * J, None, None)


def _num_equations(skeleton):
    q, root = _random_motion(skeleton, (4,))
    jaxpr = jax.make_jaxpr(lambda q, r: forward_kinematics(skeleton, q, r))(
        jnp.asarray(q, jnp.float32), jnp.asarray(root, jnp.float32))
    return len(jaxpr.jaxpr.eqns)


def test_traced_program_grows_with_depth_not_joint_count():
    """One batched op per level: a star of any size traces the same program, a chain grows per level."""
    star8, star64, chain8, chain16 = (_num_equations(s) for s in (_star(8), _star(64), _chain(8), _chain(16)))
    assert star8 == star64
    assert chain16 > chain8 > star8
    per_level = (chain16 - chain8) / 8
    assert chain8 - star8 == pytest.approx(per_level * 6, rel=0.2)  # 8 levels vs the star's 2


def test_fk_hinges_and_offsets_rotate_with_their_parent():
    """A hand-checkable pose: root turned 90° about y, a hinge bent 90° about z."""
    sk = Skeleton(["root", "a", "b"], [-1, 0, 1], [[0, 0, 0], [1, 0, 0], [0, 2, 0]], [BALL, HINGE, BALL],
                  [[0, 0, 0], [0, 0, 1], [0, 0, 0]], None)
    q = np.stack([rot.axis_angle_to_quat(np.array([0, np.pi / 2, 0])),
                  rot.axis_angle_to_quat(np.array([0, 0, np.pi / 2])), rot.identity_quat(xp=np)])
    pos, _ = forward_kinematics(sk, q, np.array([1.0, 0, 0]))
    # a = root + R_y(90°)·(1,0,0) = (1,0,-1);  b = a + R_y(90°)·R_z(90°)·(0,2,0) = a + (0,0,2).
    np.testing.assert_allclose(pos, [[1, 0, 0], [1, 0, -1], [1, 0, 1]], atol=1e-12)


def _ik_skeleton():
    """Ball joints with what the IK must handle: a fixed joint with a length (its child hangs off the
    ball joint above it), zero-length end sites, and branching joints (the Bandai/BVH shape)."""
    tree = random_tree(16, seed=4, hinge_prob=0.0)
    parents, offsets = list(tree.parents), list(tree.offsets)
    kinds = list(tree.kinds)
    leaf = max(set(range(16)) - set(parents))
    rng = np.random.default_rng(0)
    for parent, kind, offset in [(5, "fixed", rng.normal(size=3) * 0.1), (16, BALL, rng.normal(size=3) * 0.1),
                                 (leaf, "fixed", np.zeros(3)), (17, "fixed", np.zeros(3))]:
        parents.append(parent), kinds.append(kind), offsets.append(offset)
    return Skeleton([f"j{j}" for j in range(len(parents))], parents, np.array(offsets), kinds, None, None)


def _fixed_as_identity(skeleton, q):
    q = np.array(q)
    q[..., [k == "fixed" for k in skeleton.kinds], :] = [1, 0, 0, 0]
    return q


@pytest.mark.parametrize("name", ["ball tree", "smpl"])
def test_ik_reaches_fk_positions_from_any_hint(name):
    """IK of FK positions (independent reference: FK itself): from the true rotations it returns
    them; from the identity or a perturbed hint the positions are reached all the same, and the
    rotations differ only by twists about single bones (joints with two non-collinear targets are
    fully determined)."""
    from motionjax.core.kinematics import ik_plan, inverse_kinematics
    from motionjax.core.skeleton import smpl_like
    sk = _ik_skeleton() if name == "ball tree" else smpl_like()
    q, root = _random_motion(sk, (5, 4))
    q, root = _fixed_as_identity(sk, q).astype(np.float32), root.astype(np.float32)
    # FK (the reference) in numpy: op by op in jax each call compiled dozens of small programs
    positions = forward_kinematics(sk, q, root)[0]
    ik = jax.jit(lambda hint: inverse_kinematics(sk, positions, hint))
    got = np.asarray(ik(jnp.asarray(q)))
    np.testing.assert_allclose(np.abs(np.sum(got * q, -1)), 1.0, atol=1e-5)  # q and -q are one rotation
    _, rest, _, weights = ik_plan(sk)
    determined = weights.sum(1) > 0  # ball joints with secondary targets (the pelvis, the chest)
    assert determined.any()
    noise = _fixed_as_identity(sk, _random_motion(sk, (5, 4), seed=3)[0])
    for hint in (np.broadcast_to([1.0, 0, 0, 0], q.shape), rot.quat_normalize(q + 0.3 * noise)):
        got = np.asarray(ik(jnp.asarray(hint, jnp.float32)))
        reached = forward_kinematics(sk, got, root)[0]
        np.testing.assert_allclose(reached, positions, atol=2e-5)
        world = lambda r: forward_kinematics(sk, r, np.zeros((5, 4, 3), np.float32))[1]
        np.testing.assert_allclose(np.abs(np.sum(world(got) * world(q), -1))[..., determined], 1.0, atol=1e-4)


def test_ik_turns_a_hinge_about_its_axis_only():
    """DeepMimic's knees and elbows: with the parents' rotations right, the hinge angle is recovered
    from the positions alone (hint: the identity at every hinge), and the result stays a rotation
    about the hinge axis."""
    from motionjax.core.kinematics import inverse_kinematics
    pytest.importorskip("pybullet")  # the DeepMimic humanoid's URDF ships with it
    sk = deepmimic_humanoid()
    hinge = np.array([k == HINGE for k in sk.kinds])
    rng = np.random.default_rng(5)
    q = _fixed_as_identity(sk, _random_motion(sk, (6,))[0])
    angle = rng.uniform(-2.5, 2.5, (6, hinge.sum(), 1))
    q[:, hinge] = np.concatenate([np.cos(angle / 2), np.sin(angle / 2) * sk.axes[hinge]], -1)
    q = q.astype(np.float32)
    positions = forward_kinematics(sk, q, np.zeros((6, 3), np.float32))[0]  # numpy: no small programs
    hint = q.copy()
    hint[:, hinge] = [1, 0, 0, 0]
    got = np.asarray(jax.jit(inverse_kinematics, static_argnums=0)(sk, positions, jnp.asarray(hint)))
    np.testing.assert_allclose(np.abs(np.sum(got[:, hinge] * q[:, hinge], -1)), 1.0, atol=1e-5)


def test_ik_aims_each_bone_at_an_unreachable_target():
    """Positions no skeleton can reach (every joint moved at random): each single-target bone points
    from the joint FK placed towards its target, so an error does not pile up down a chain; IK is
    differentiable there, its JVP matching central differences."""
    from motionjax.core.kinematics import ik_plan, inverse_kinematics
    sk = _ik_skeleton()
    q, root = _random_motion(sk, (8,))
    q = _fixed_as_identity(sk, q).astype(np.float32)
    noisy = forward_kinematics(sk, jnp.asarray(q), jnp.asarray(root, jnp.float32))[0]
    noisy = noisy + jnp.asarray(np.random.default_rng(6).normal(size=noisy.shape) * 0.03, jnp.float32)
    ik = jax.jit(lambda p: inverse_kinematics(sk, p, jnp.asarray(q)))
    reached = np.asarray(forward_kinematics(sk, ik(noisy), noisy[:, 0])[0])
    targets, rest, swing, weights = ik_plan(sk)
    single = np.flatnonzero(swing & (weights.sum(1) == 0))
    assert len(single) >= 4
    for j in single:
        k = targets[j, 0]
        bone, aim = reached[:, k] - reached[:, j], np.asarray(noisy)[:, k] - reached[:, j]
        cos = np.sum(bone * aim, -1) / np.linalg.norm(bone, axis=-1) / np.linalg.norm(aim, axis=-1)
        np.testing.assert_allclose(cos, 1.0, atol=1e-5)
    placed = lambda p: forward_kinematics(sk, ik(p), p[:, 0])[0]  # sign-free: q and -q place alike
    direction = jnp.asarray(np.random.default_rng(7).normal(size=noisy.shape), jnp.float32)
    _, tangent = jax.jvp(placed, (noisy,), (direction,))
    eps = 1e-3
    fd = (placed(noisy + eps * direction) - placed(noisy - eps * direction)) / (2 * eps)
    np.testing.assert_allclose(np.asarray(tangent), np.asarray(fd), atol=2e-2 * float(jnp.abs(fd).max()))
