"""Skeleton structure against brute-force references and pybullet's reading of the same URDF."""
import numpy as np
import pytest

from motionjax.core.skeleton import (
    BALL,
    FIXED,
    HINGE,
    Skeleton,
    deepmimic_humanoid,
    deepmimic_urdf_path,
    from_urdf,
    random_tree,
    smpl_like,
)


def _deepmimic():
    """The DeepMimic humanoid; the test skips where pybullet (which ships its URDF) is missing."""
    pytest.importorskip("pybullet")
    return deepmimic_humanoid()


SKELETONS = {"deepmimic": _deepmimic, "smpl": smpl_like,
             **{f"random{j}_{s}": (lambda j=j, s=s: random_tree(j, seed=s))
                for j in (1, 2, 37, 100) for s in (0, 1)}}


def _ancestors(parents, j):
    """Brute force: walk parent pointers up to the root."""
    out = [j]
    while parents[out[-1]] >= 0:
        out.append(parents[out[-1]])
    return out


@pytest.mark.parametrize("name", sorted(SKELETONS))
def test_derived_structure_matches_brute_force(name):
    sk = SKELETONS[name]()
    J = sk.num_joints
    assert sk.parents[0] == -1 and all(0 <= p < j for j, p in enumerate(sk.parents[1:], 1))
    mask = np.zeros((J, J), bool)
    for j in range(J):
        mask[j, _ancestors(sk.parents, j)] = True
    np.testing.assert_array_equal(sk.ancestor_mask, mask)
    np.testing.assert_array_equal(sk.depth, mask.sum(1) - 1)
    assert sorted(np.concatenate(sk.levels).tolist()) == list(range(J))
    for d, ids in enumerate(sk.levels):
        assert len(ids) and (sk.depth[ids] == d).all()
    for j, kids in enumerate(sk.children):
        assert list(kids) == [c for c in range(J) if sk.parents[c] == j]
    assert sk.num_dof == 3 + sum({BALL: 3, HINGE: 1, FIXED: 0}[k] for k in sk.kinds)
    hinge = np.array(sk.kinds) == HINGE
    np.testing.assert_allclose(np.linalg.norm(sk.axes[hinge], axis=-1), 1.0)
    assert (sk.masses > 0).all() or name == "smpl"  # SMPL's end joints carry no segment


def test_random_tree_is_deterministic_and_bushy():
    assert random_tree(100, seed=3) == random_tree(100, seed=3)
    assert random_tree(100, seed=3) != random_tree(100, seed=4)
    sk = random_tree(100, seed=0)
    assert 5 < len(sk.levels) < 100  # chains and branches: deeper than a star, shallower than a chain
    lengths = np.linalg.norm(sk.offsets[1:], axis=-1)
    assert ((lengths >= 0.05) & (lengths <= 0.3)).all()


def test_skeleton_is_hashable_by_value():
    a, b = smpl_like(), smpl_like()
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != a.replace(offsets=a.offsets * 2)


def test_deepmimic_symmetry_and_lateral_axis():
    pytest.importorskip("pybullet")  # the DeepMimic humanoid's URDF ships with it
    sk = deepmimic_humanoid()
    sym = sk.symmetry
    np.testing.assert_array_equal(sym[sym], np.arange(sk.num_joints))  # an involution
    for j, name in enumerate(sk.names):
        twin = name.replace("left", "@").replace("right", "left").replace("@", "right")
        assert sk.names[sym[j]] == twin
    assert sk.lateral_axis == 2  # DeepMimic: y up, x forward, z to the right
    mirror = sk.offsets.copy()
    mirror[:, 2] *= -1
    np.testing.assert_allclose(sk.offsets[sym], mirror, atol=1e-12)
    np.testing.assert_allclose(sk.masses[sym], sk.masses)


def test_smpl_like_symmetry_and_masses():
    sk = smpl_like(body_mass=80.0)
    assert sk.num_joints == 24 and len(sk.levels) == 9
    sym = sk.symmetry
    for j, name in enumerate(sk.names):
        want = name.replace("left", "right") if "left" in name else name.replace("right", "left")
        assert sk.names[sym[j]] == want
    assert sk.lateral_axis == 0
    mirror = sk.offsets * np.array([-1, 1, 1])
    np.testing.assert_allclose(sk.offsets[sym], mirror)
    assert sk.masses.sum() == pytest.approx(80.0)


def test_deepmimic_humanoid_matches_pybullet():
    """Joint kinds, hinge axes and link masses as pybullet itself reads the URDF."""
    p = pytest.importorskip("pybullet")
    sk = deepmimic_humanoid()
    client = p.connect(p.DIRECT)
    try:
        body = p.loadURDF(str(deepmimic_urdf_path()), globalScaling=0.25, flags=p.URDF_MAINTAIN_LINK_ORDER,
                          physicsClientId=client)
        kinds = {p.JOINT_SPHERICAL: BALL, p.JOINT_REVOLUTE: HINGE, p.JOINT_FIXED: FIXED}
        seen = set()
        for k in range(p.getNumJoints(body, physicsClientId=client)):
            info = p.getJointInfo(body, k, physicsClientId=client)
            j = sk.index(info[12].decode())
            seen.add(j)
            assert sk.masses[j] == pytest.approx(p.getDynamicsInfo(body, k, physicsClientId=client)[0])
            if j == 0:  # pybullet keeps the URDF's base link; we fold its fixed joint into the root
                continue
            assert sk.kinds[j] == kinds[info[2]]
            if sk.kinds[j] == HINGE:
                np.testing.assert_allclose(sk.axes[j], info[13])
        assert seen == set(range(sk.num_joints))
    finally:
        p.disconnect(client)
    assert sk.masses.sum() == pytest.approx(45.0, abs=0.5)


URDF = """<robot name="r">
  <link name="base"><inertial><mass value="1"/></inertial></link>
  <link name="a"><inertial><mass value="2"/></inertial></link>
  <joint name="j" type="{type}"><parent link="base"/><child link="a"/>
    <origin xyz="0 1 0" rpy="{rpy}"/><axis xyz="0 0 1"/></joint>
</robot>"""

BAD_URDF = {
    "unsupported type": (URDF.format(type="prismatic", rpy="0 0 0"), "unsupported type 'prismatic'"),
    "rotated origin": (URDF.format(type="revolute", rpy="0 0.5 0"), "rotated origin"),
    "not xml": ("<robot><link name='a'>", "cannot read URDF"),
    "two roots": ('<robot><link name="a"/><link name="b"/></robot>', "expected one root link"),
}


@pytest.mark.parametrize("case", sorted(BAD_URDF))
def test_from_urdf_errors_name_the_file(tmp_path, case):
    text, message = BAD_URDF[case]
    path = tmp_path / "bad.urdf"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as info:
        from_urdf(path)
    assert str(path) in str(info.value)


def test_from_urdf_reads_a_small_tree(tmp_path):
    path = tmp_path / "ok.urdf"
    path.write_text(URDF.format(type="revolute", rpy="0 0 0"))
    sk = from_urdf(path, scale=0.5)
    assert sk.names == ("base", "a") and sk.kinds == (BALL, HINGE)
    np.testing.assert_allclose(sk.offsets[1], [0, 0.5, 0])
    np.testing.assert_allclose(sk.masses, [1, 2])


@pytest.mark.parametrize("bad, message", [
    (dict(parents=(-1, 2, 1)), "topological"),
    (dict(kinds=(BALL, "slider", BALL)), "unknown joint kinds"),
    (dict(kinds=(BALL, HINGE, BALL)), "needs a unit axis"),
    (dict(names=("a", "b", "b")), "duplicate joint names"),
])
def test_invalid_skeletons_are_rejected(bad, message):
    args = dict(names=("a", "b", "c"), parents=(-1, 0, 1), offsets=np.ones((3, 3)), kinds=(BALL,) * 3,
                axes=None, masses=None)
    with pytest.raises(ValueError, match=message):
        Skeleton(**{**args, **bad})


def test_rest_pose_feet_and_joint_kind_masks():
    from motionjax.core.kinematics import forward_kinematics

    pytest.importorskip("pybullet")  # the DeepMimic humanoid's URDF ships with it
    humanoid = deepmimic_humanoid()
    assert [humanoid.names[j] for j in humanoid.foot_joints] == ["right_ankle", "left_ankle"]
    for skeleton in (humanoid, random_tree(13, seed=1)):
        rest = np.tile([1.0, 0.0, 0.0, 0.0], (skeleton.num_joints, 1))  # identity quaternions
        positions, _ = forward_kinematics(skeleton, rest, np.zeros(3))
        np.testing.assert_allclose(skeleton.rest_positions, positions, atol=1e-12)
        np.testing.assert_array_equal(skeleton.ball_mask, skeleton.dofs == 3)
        hinge = skeleton.dofs == 1
        np.testing.assert_array_equal(skeleton.hinge_axes[hinge], skeleton.axes[hinge])
        assert not skeleton.hinge_axes[~hinge].any()
