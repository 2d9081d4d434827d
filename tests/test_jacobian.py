"""The blocked kinematic Jacobian and its products against jax.jacfwd, finite differences of FK on
real DeepMimic clips, and a per-joint numpy loop."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from motionjax.core import kinematics as K
from motionjax.core import rotations as rot
from motionjax.core.skeleton import FIXED, HINGE, deepmimic_humanoid, random_tree
from motionjax.formats import deepmimic_clip_paths, read_deepmimic

# Compiled once per skeleton (static): eager dispatch of jacfwd costs far more than the maths.
fk = jax.jit(K.forward_kinematics, static_argnums=0)
jacfwd = jax.jit(K.jacfwd_jacobian, static_argnums=0)
blocks_of = jax.jit(K.block_jacobian, static_argnums=0)
dense_of = jax.jit(K.dense_jacobian, static_argnums=0)
jvp_blocked = jax.jit(K.jacobian_vector_product, static_argnums=0)
jvp_autodiff = jax.jit(K.autodiff_jacobian_vector_product, static_argnums=0)
vjp_blocked = jax.jit(K.jacobian_transpose_product, static_argnums=0)
vjp_autodiff = jax.jit(K.autodiff_jacobian_transpose_product, static_argnums=0)

def _deepmimic():
    """The DeepMimic humanoid; the test skips where pybullet (which ships its URDF) is missing."""
    pytest.importorskip("pybullet")
    return deepmimic_humanoid()


# Every joint kind (DeepMimic: ball, hinge and fixed joints on a real humanoid; the random tree: balls and
# hinges on random branching). The all-ball SMPL-like body added no kind or shape of tree (~20 CPU s of
# its own programs): its blocked Jacobian and transpose product are checked against float64 jacfwd in
# tests/test_backend_numerics.py.
SKELETONS = {"deepmimic": _deepmimic, "random20": lambda: random_tree(20, seed=3)}


def random_pose(skeleton, frames, seed):
    """Random rotations that respect joint kinds (hinges about their axis, fixed = identity)."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(frames, skeleton.num_joints, 4))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    angle = rng.uniform(-2, 2, size=(frames, skeleton.num_joints, 1))
    hinge = rot.axis_angle_to_quat(skeleton.axes * angle)  # numpy: no small programs compiled per shape
    kinds = np.array(skeleton.kinds)[:, None]
    q = np.where(kinds == HINGE, hinge, np.where(kinds == FIXED, [1.0, 0, 0, 0], q))
    return jnp.asarray(q, jnp.float32), jnp.asarray(rng.normal(size=(frames, 3)), jnp.float32)


@pytest.mark.parametrize("name", SKELETONS)
def test_blocks_equal_jacfwd(name):
    skeleton = SKELETONS[name]()
    rotations, root = random_pose(skeleton, 3, seed=0)
    positions, world = fk(skeleton, rotations, root)
    reference = np.asarray(jacfwd(skeleton, rotations, root))  # [3, 3J, num_dof]
    blocks = np.asarray(blocks_of(skeleton, positions, world))
    ancestors, valid = K.ancestor_table(skeleton)
    assert blocks.shape == (3, skeleton.num_joints, len(skeleton.levels), 3, 3)  # O(J·depth)
    first = 3 + np.concatenate([[0], np.cumsum(skeleton.dofs)])  # first column of each joint
    for j in range(skeleton.num_joints):
        np.testing.assert_allclose(reference[:, 3 * j:3 * j + 3, :3], np.broadcast_to(np.eye(3), (3, 3, 3)))
        for d in np.flatnonzero(valid[j]):
            k = ancestors[j, d]
            columns = slice(first[k], first[k] + skeleton.dofs[k])
            np.testing.assert_allclose(blocks[:, j, d, :, :skeleton.dofs[k]],
                                       reference[:, 3 * j:3 * j + 3, columns], atol=2e-5)
            assert not blocks[:, j, d, :, skeleton.dofs[k]:].any()  # padded DOF columns stay zero
        assert not blocks[:, j, ~valid[j]].any()
    dense = np.asarray(dense_of(skeleton, positions, world))
    np.testing.assert_allclose(dense, reference, atol=2e-5)


def test_dense_zero_pattern_is_the_ancestor_mask():
    skeleton = random_tree(24, seed=5, hinge_prob=0.3)
    rotations, root = random_pose(skeleton, 1, seed=1)
    dense = np.asarray(jacfwd(skeleton, rotations, root))[0, :, 3:]
    owner = np.repeat(np.arange(skeleton.num_joints), skeleton.dofs)  # joint of each DOF column
    nonzero = np.zeros((skeleton.num_joints,) * 2, bool)
    for column, k in enumerate(owner):
        nonzero[:, k] |= np.abs(dense[:, column]).reshape(-1, 3).max(-1) > 1e-7
    # A joint moves with every strict ancestor that has DOF; its own rotation does not move it.
    expected = skeleton.ancestor_mask & ~np.eye(skeleton.num_joints, dtype=bool) & (skeleton.dofs > 0)
    np.testing.assert_array_equal(nonzero, expected)


def test_pack_unpack_round_trip():
    skeleton = _deepmimic()
    q = jnp.arange(2 * skeleton.num_dof, dtype=jnp.float32).reshape(2, -1)
    root, joints = K.unpack_dofs(skeleton, q)
    assert joints.shape == (2, skeleton.num_joints, 3)
    np.testing.assert_array_equal(K.pack_dofs(skeleton, root, joints), q)
    # Unused padded slots (hinge components 1-2, fixed joints) are zero.
    np.testing.assert_array_equal(np.asarray(joints)[:, skeleton.dofs == 0], 0)


@pytest.mark.parametrize("clip", [0, 7])
def test_jvp_matches_finite_differences_of_fk_on_deepmimic(clip):
    """Along each clip's frame-to-frame motion (rotations slerped, root moved linearly), J·q̇ in
    float32 equals the central finite difference of FK run in numpy float64. The first 29 frames of
    each (the backflip's all, 16 fps; half a second of the jump, 60 fps): one shape, so the second
    clip runs the first one's compiled programs."""
    pytest.importorskip("pybullet")  # the clips ship with it
    motion = read_deepmimic(deepmimic_clip_paths()[clip])
    skeleton, fps = motion.skeleton, motion.fps
    rotations, root = motion.rotations[:29].astype(float), motion.root_position[:29].astype(float)
    assert len(rotations) == 29
    q0, q1 = rotations[:-1], rotations[1:]
    r0, r1 = root[:-1], root[1:]
    spatial = rot.relative_rotation_vector(q0, q1)  # parent-frame rotation vector per frame

    def fk_at(s):  # the motion s frames after each frame, numpy float64
        return K.forward_kinematics(skeleton, rot.quat_mul(rot.axis_angle_to_quat(s * spatial), q0),
                                    r0 + s * (r1 - r0))[0]

    h = 1e-5
    finite_difference = (fk_at(h) - fk_at(-h)) / (2 * h) * fps
    q0, r0 = jnp.asarray(q0, jnp.float32), jnp.asarray(r0, jnp.float32)
    positions, world = fk(skeleton, q0, r0)
    parent = rot.quat_mul(world, rot.quat_conj(q0))
    omega = rot.quat_rotate(parent, jnp.asarray(spatial * fps, jnp.float32))
    joint_velocity = K.world_to_dofs(skeleton, world, omega)
    root_velocity = jnp.asarray((r1 - r0.astype(float)) * fps, jnp.float32)
    blocked = jvp_blocked(skeleton, positions, world, joint_velocity, root_velocity)
    autodiff = jvp_autodiff(skeleton, q0, r0, joint_velocity, root_velocity)
    scale = np.abs(finite_difference).max()
    assert scale > 0.5  # the clip moves (m/s)
    np.testing.assert_allclose(blocked, finite_difference, atol=1e-5 * scale)
    np.testing.assert_allclose(autodiff, finite_difference, atol=1e-5 * scale)


def numpy_generalized_forces(skeleton, positions, world_axes_of, forces):
    """τ_k = D_kᵀ Σ_{j in subtree(k)} (p_j - p_k) × F_j by explicit loops over joints."""
    torques = np.zeros((skeleton.num_joints, 3))
    for k in range(skeleton.num_joints):
        moment = sum(np.cross(positions[j] - positions[k], forces[j])
                     for j in range(skeleton.num_joints) if skeleton.ancestor_mask[j, k])
        torques[k] = world_axes_of(k).T @ moment
    return torques, forces.sum(0)


@pytest.mark.parametrize("name", SKELETONS)
def test_products_match_dense_and_loop(name):
    """J·q̇ and Jᵀ·F (blocked, and jvp/vjp of FK) equal products with the jacfwd matrix; Jᵀ·F also
    equals an explicit loop over each joint's subtree."""
    skeleton = SKELETONS[name]()
    rotations, root = random_pose(skeleton, 3, seed=0)  # as above: reuses the compiled jacfwd
    rng = np.random.default_rng(3)
    forces = jnp.asarray(rng.normal(size=(3, skeleton.num_joints, 3)), jnp.float32)
    q_dot = jnp.asarray(rng.normal(size=(3, skeleton.num_dof)), jnp.float32)
    positions, world = fk(skeleton, rotations, root)
    dense = jacfwd(skeleton, rotations, root)

    root_velocity, joint_velocity = K.unpack_dofs(skeleton, q_dot)
    reference = jnp.einsum("fmn,fn->fm", dense, q_dot).reshape(3, -1, 3)
    np.testing.assert_allclose(jvp_blocked(skeleton, positions, world, joint_velocity, root_velocity),
                               reference, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(jvp_autodiff(skeleton, rotations, root, joint_velocity, root_velocity),
                               reference, rtol=1e-5, atol=1e-4)

    reference = np.asarray(jnp.einsum("fmn,fm->fn", dense, forces.reshape(3, -1)))
    blocked = K.pack_dofs(skeleton, *vjp_blocked(skeleton, positions, world, forces)[::-1])
    autodiff = K.pack_dofs(skeleton, *vjp_autodiff(skeleton, rotations, root, forces)[::-1])
    np.testing.assert_allclose(blocked, reference, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(autodiff, reference, rtol=1e-5, atol=1e-4)

    basis = jnp.broadcast_to(jnp.eye(3)[:, None, :], (3, skeleton.num_joints, 3))
    axes = np.moveaxis(np.asarray(K.dofs_to_world(skeleton, world[0], basis)), 0, -1)  # D_k [J, 3, 3]
    torques, root_force = numpy_generalized_forces(skeleton, np.asarray(positions[0], float),
                                                   lambda k: axes[k], np.asarray(forces[0], float))
    loop = np.concatenate([root_force, torques.reshape(-1)[K._dof_columns(skeleton)]])
    np.testing.assert_allclose(blocked[0], loop, rtol=1e-5, atol=1e-4)


def test_tree_sums_match_the_ancestor_mask_and_transpose_each_other():
    """prefix_sum / subtree_sum (numpy and jax, reverse mode with the custom gathers) equal products
    with the dense ancestor mask, in the tree layout."""
    skeleton = random_tree(40, seed=7)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, skeleton.num_joints, 5))  # [C, J, frames], joint ids in index order
    mask = skeleton.ancestor_mask.astype(float)  # mask[j, k]: k is j or an ancestor of j
    want_prefix, want_subtree = np.einsum("jk,ckf->cjf", mask, x), np.einsum("jk,cjf->ckf", mask, x)
    order = K.tree_plan(skeleton).order
    assert sorted(order) == list(range(skeleton.num_joints))
    assert np.all(np.diff(skeleton.depth[order]) >= 0)  # level order
    tree = x[:, order]
    for xp, atol in ((np, 1e-12), (jnp, 1e-5)):
        np.testing.assert_allclose(K.prefix_sum(skeleton, xp.asarray(tree)), want_prefix[:, order], atol=atol)
        np.testing.assert_allclose(K.subtree_sum(skeleton, xp.asarray(tree)), want_subtree[:, order],
                                   atol=atol)
    w = rng.normal(size=x.shape)
    for custom_vjp in (False, True):
        # jitted: op by op, each level's gather and scatter compiled on its own (~7 s for the test)
        weighted = lambda tree_sum, c=custom_vjp: lambda v: jnp.sum(w[:, order] * tree_sum(skeleton, v, c))
        grad_prefix = jax.jit(jax.grad(weighted(K.prefix_sum)))
        grad_subtree = jax.jit(jax.grad(weighted(K.subtree_sum)))
        t = jnp.asarray(tree, jnp.float32)
        np.testing.assert_allclose(grad_prefix(t), np.einsum("jk,cjf->ckf", mask, w)[:, order], atol=1e-5)
        np.testing.assert_allclose(grad_subtree(t), np.einsum("jk,ckf->cjf", mask, w)[:, order], atol=1e-5)


@pytest.mark.parametrize("name", SKELETONS)
def test_custom_vjp_gradients_equal_autodiff(name):
    """FK and the two products in the tree layout: reverse mode through the custom level gathers
    equals jax's own (scatter-add) reverse mode."""
    skeleton = SKELETONS[name]()
    rotations, root = random_pose(skeleton, 4, seed=2)
    rng = np.random.default_rng(1)
    velocity = jnp.asarray(rng.normal(size=(3, skeleton.num_joints, 4)), jnp.float32)
    shapes = [(3, skeleton.num_joints, 4)] * 3 + [(3, 4)]
    weights = [jnp.asarray(rng.normal(size=shape), jnp.float32) for shape in shapes]

    def f(rotations, root, velocity, custom_vjp):
        positions, world = K.forward_kinematics_tree(skeleton, rotations, root, custom_vjp=custom_vjp)
        jv = K.jacobian_vector_product_tree(skeleton, positions, world, velocity, velocity[:, 0], custom_vjp)
        torques, force = K.jacobian_transpose_product_tree(skeleton, positions, world, velocity, custom_vjp)
        return sum(jnp.sum(w * y) for w, y in zip(weights, (positions, jv, torques, force), strict=True))

    grad = jax.jit(jax.grad(f, argnums=(0, 1, 2)), static_argnums=3)
    ours, references = grad(rotations, root, velocity, True), grad(rotations, root, velocity, False)
    for g, reference in zip(ours, references, strict=True):
        scale = np.abs(np.asarray(reference)).max()
        assert scale > 0
        np.testing.assert_allclose(g, reference, rtol=1e-5, atol=1e-5 * scale)


def test_reverse_mode_algebra_vjps_equal_autodiff():
    """rotations.algebra(custom_vjp=True): the hand-written VJPs of cross, quat_mul and quat_rotate
    (non-unit quaternions, an operand broadcast against the other) equal JAX's reverse mode of the
    plain formulas."""
    rng = np.random.default_rng(3)
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
    plain, reverse = rot.algebra(), rot.algebra(custom_vjp=True)
    cases = [("cross", normal(3, 5, 2), normal(3, 5, 1)), ("quat_mul", normal(4, 1, 2), normal(4, 5, 2)),
             ("quat_rotate", normal(4, 5, 2), normal(3, 5, 1)),
             ("quat_rotate", normal(4, 5, 1), normal(3, 5, 2))]
    # jitted: op by op the two reverse passes compiled ~90 small programs (3.4 -> ~1 CPU s)
    vjp = jax.jit(lambda f, a, b, cotangent: jax.vjp(f, a, b)[1](cotangent), static_argnums=0)
    for name, a, b in cases:
        cotangent = normal(*getattr(plain, name)(a, b).shape)
        ours = vjp(getattr(reverse, name), a, b, cotangent)
        reference = vjp(getattr(plain, name), a, b, cotangent)
        for g, ref in zip(ours, reference, strict=True):
            assert g.shape == ref.shape
            np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-5 * np.abs(np.asarray(ref)).max())
