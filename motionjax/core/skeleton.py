"""Kinematic trees: joint names, parents in topological order, rest offsets, joint kinds, masses.

A :class:`Skeleton` is static, hashable metadata (it is closed over or passed as a static jit
argument); everything time-varying lives in arrays elsewhere. Joint 0 is the root; every parent
index is smaller than its child's, so one pass in index order visits parents first.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

BALL, HINGE, FIXED = "ball", "hinge", "fixed"
DOF = {BALL: 3, HINGE: 1, FIXED: 0}

# Left/right name pairs: "left_hip"/"right_hip", "LeftArm"/"RightArm", "L_Hip"/"R_Hip", "lhip"/"rhip",
# "Shoulder_L"/"Shoulder_R" (Bandai Namco).
# Each side is a regex; its replacement text is the regex without anchors and lookaheads.
_SIDE_PATTERNS = [(r"left", r"right"), (r"Left", r"Right"), (r"L(?=[_A-Z])", r"R(?=[_A-Z])"),
                  (r"^l(?=[a-z_])", r"^r(?=[a-z_])"), (r"_L(?=$|_)", r"_R(?=$|_)")]


def _side_text(pattern: str) -> str:
    return re.sub(r"\(\?=[^)]*\)|\^", "", pattern)


@dataclasses.dataclass(frozen=True, eq=False)
class Skeleton:
    """A kinematic tree of ``J`` joints.

    Attributes:
      names: ``J`` joint names.
      parents: ``J`` parent indices, ``-1`` for the root (index 0); ``parents[j] < j``.
      offsets: ``[J, 3]`` rest translation of each joint in its parent's frame (metres).
      kinds: ``J`` of ``"ball"`` (3 DOF), ``"hinge"`` (1 DOF about ``axes[j]``), ``"fixed"``.
      axes: ``[J, 3]`` unit hinge axes in the joint's own frame (zero for non-hinges).
      masses: ``[J]`` mass (kg) of the link that starts at each joint, lumped at the joint.
      up_axis: index of the vertical world axis (1 for y-up data such as BVH and DeepMimic).
    """

    names: tuple[str, ...]
    parents: tuple[int, ...]
    offsets: np.ndarray
    kinds: tuple[str, ...]
    axes: np.ndarray
    masses: np.ndarray
    up_axis: int = 1

    def __post_init__(self):
        j = len(self.names)
        offsets = np.asarray(self.offsets, np.float64).reshape(j, 3)
        axes = np.zeros((j, 3)) if self.axes is None else np.asarray(self.axes, np.float64)
        masses = np.ones(j) if self.masses is None else np.asarray(self.masses, np.float64)
        object.__setattr__(self, "names", tuple(self.names))
        object.__setattr__(self, "parents", tuple(int(p) for p in self.parents))
        object.__setattr__(self, "kinds", tuple(self.kinds))
        object.__setattr__(self, "offsets", offsets)
        object.__setattr__(self, "axes", axes.reshape(j, 3))
        object.__setattr__(self, "masses", masses.reshape(j))
        problems = []
        if not (len(self.parents) == len(self.kinds) == j and j > 0):
            problems.append(f"{j} names, {len(self.parents)} parents, {len(self.kinds)} kinds")
        elif self.parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(self.parents[1:], 1)):
            problems.append(f"parents must be topological with root 0: {self.parents}")
        if set(self.kinds) - set(DOF):
            problems.append(f"unknown joint kinds {set(self.kinds) - set(DOF)}")
        if len(set(self.names)) != j:
            problems.append("duplicate joint names")
        for i, kind in enumerate(self.kinds):
            if kind == HINGE and not np.isclose(np.linalg.norm(self.axes[i]), 1.0, atol=1e-6):
                problems.append(f"hinge {self.names[i]!r} needs a unit axis, got {self.axes[i]}")
        if problems:
            raise ValueError("invalid skeleton: " + "; ".join(problems))

    # Hashable by value so it can be a static jit argument.
    @functools.cached_property
    def _key(self):
        return (self.names, self.parents, self.kinds, self.up_axis, self.offsets.tobytes(),
                self.axes.tobytes(), self.masses.tobytes())

    def __hash__(self):
        return hash(self._key)

    def __eq__(self, other):
        return isinstance(other, Skeleton) and self._key == other._key

    def __repr__(self):
        return f"Skeleton(J={self.num_joints}, depth={len(self.levels)}, dof={self.num_dof})"

    @property
    def num_joints(self) -> int:
        return len(self.names)

    @property
    def dofs(self) -> np.ndarray:
        """``[J]`` rotational degrees of freedom per joint (3, 1 or 0)."""
        return np.array([DOF[k] for k in self.kinds])

    @property
    def num_dof(self) -> int:
        """Rotational DOF plus 3 for the root translation."""
        return int(self.dofs.sum()) + 3

    def index(self, name: str) -> int:
        return self.names.index(name)

    @functools.cached_property
    def depth(self) -> np.ndarray:
        """``[J]`` number of edges from the root."""
        d = np.zeros(self.num_joints, int)
        for j, p in enumerate(self.parents[1:], 1):
            d[j] = d[p] + 1
        return d

    @functools.cached_property
    def levels(self) -> tuple[np.ndarray, ...]:
        """Joint indices grouped by depth: ``levels[d]`` holds every joint at depth ``d``."""
        return tuple(np.flatnonzero(self.depth == d) for d in range(self.depth.max() + 1))

    @functools.cached_property
    def ancestor_mask(self) -> np.ndarray:
        """``[J, J]`` bool, ``mask[j, k]`` iff ``k`` is ``j`` or an ancestor of ``j``."""
        m = np.eye(self.num_joints, dtype=bool)
        for j, p in enumerate(self.parents[1:], 1):
            m[j] |= m[p]
        return m

    @functools.cached_property
    def rest_positions(self) -> np.ndarray:
        """``[J, 3]`` joint positions in the rest pose: every rotation identity, the root at the origin."""
        p = np.zeros((self.num_joints, 3))
        for j, parent in enumerate(self.parents[1:], 1):
            p[j] = p[parent] + self.offsets[j]
        return p

    @functools.cached_property
    def foot_joints(self) -> np.ndarray:
        """Leaf joints within 5 cm of the lowest rest-pose height: the ankles/feet of any biped (the
        joints of foot contact and foot skating)."""
        height = self.rest_positions[:, self.up_axis]
        leaves = np.array([j for j in range(self.num_joints) if not self.children[j]])
        return leaves[height[leaves] <= height[leaves].min() + 0.05]

    @functools.cached_property
    def ball_mask(self) -> np.ndarray:
        """``[J]`` bool: ball (3-DOF) joints."""
        return np.array([k == BALL for k in self.kinds])

    @functools.cached_property
    def hinge_axes(self) -> np.ndarray:
        """``[J, 3]`` the hinge axis of each hinge joint, zero for the other kinds."""
        return self.axes * np.array([k == HINGE for k in self.kinds])[:, None]

    @functools.cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        kids = [[] for _ in self.names]
        for j, p in enumerate(self.parents[1:], 1):
            kids[p].append(j)
        return tuple(tuple(k) for k in kids)

    @functools.cached_property
    def symmetry(self) -> np.ndarray:
        """``[J]`` index of each joint's left/right twin (itself for central joints)."""
        index = {n: i for i, n in enumerate(self.names)}
        out = np.arange(self.num_joints)
        for i, name in enumerate(self.names):
            for a, b in _SIDE_PATTERNS:
                for x, y in ((a, b), (b, a)):
                    twin = re.sub(x, _side_text(y), name, count=1)
                    if twin != name and twin in index and re.search(x, name):
                        out[i] = index[twin]
                        break
                if out[i] != i:
                    break
        return out

    @functools.cached_property
    def lateral_axis(self) -> int:
        """World axis along which left and right rest offsets differ most (the mirror axis)."""
        pairs = [(i, t) for i, t in enumerate(self.symmetry) if t != i]
        if not pairs:
            return (self.up_axis + 2) % 3
        spread = sum(np.abs(self.offsets[i] - self.offsets[t]) for i, t in pairs)
        return int(np.argmax(spread))

    def replace(self, **changes) -> Skeleton:
        return dataclasses.replace(self, **changes)


# --------------------------------------------------------------------------------------------
# Builders


def from_urdf(path, scale: float = 1.0, body_mass: float | None = None) -> Skeleton:
    """Build a skeleton from a URDF file: one joint per URDF link, root = the first link's child.

    Joint origins give the offsets (times ``scale``); ``spherical`` → ball, ``revolute`` and
    ``continuous`` → hinge (with their axis), ``fixed`` → fixed. A fixed joint from the URDF's
    base link to the first body is folded into the root. Link masses come from ``<inertial>``;
    with ``body_mass`` they are rescaled to sum to it.
    """
    path = Path(path)
    try:
        # pybullet's humanoid.urdf ends in a NUL byte, which XML parsers reject.
        tree = ET.fromstring(path.read_bytes().rstrip(b"\0 \r\n\t"))
    except (OSError, ET.ParseError) as e:
        raise ValueError(f"{path}: cannot read URDF: {e}") from e
    mass = {link.get("name"): float(link.find("inertial/mass").get("value"))
            if link.find("inertial/mass") is not None else 0.0 for link in tree.iter("link")}
    joints = list(tree.iter("joint"))
    child_of = {j.find("child").get("link"): j for j in joints}
    roots = [name for name in mass if name not in child_of]
    if len(roots) != 1:
        raise ValueError(f"{path}: expected one root link, found {roots}")
    root = roots[0]
    # A base link attached by one fixed joint is only a mounting point: skip it.
    base_kids = [j for j in joints if j.find("parent").get("link") == root]
    if len(base_kids) == 1 and base_kids[0].get("type") == "fixed":
        root = base_kids[0].find("child").get("link")

    def vec(elem, attr, default):
        return np.array((elem.get(attr, default) if elem is not None else default).split(), float)

    names, parents, kinds, masses = [root], [-1], [BALL], [mass[root]]
    offsets, axes = [np.zeros(3)], [np.zeros(3)]
    kind_of = {"spherical": BALL, "revolute": HINGE, "continuous": HINGE, "fixed": FIXED}
    queue = [root]
    while queue:  # breadth-first keeps parents before children
        parent = queue.pop(0)
        for j in joints:
            if j.find("parent").get("link") != parent:
                continue
            child, jtype = j.find("child").get("link"), j.get("type")
            if jtype not in kind_of:
                raise ValueError(f"{path}: joint {j.get('name')!r} has unsupported type {jtype!r}")
            xyz, rpy = vec(j.find("origin"), "xyz", "0 0 0"), vec(j.find("origin"), "rpy", "0 0 0")
            if np.any(np.abs(rpy) > 1e-9):
                raise ValueError(f"{path}: joint {j.get('name')!r} has a rotated origin rpy={rpy}; "
                                 "only translated joint frames are supported")
            axis = vec(j.find("axis"), "xyz", "1 0 0")  # URDF's default axis
            names.append(child)
            parents.append(names.index(parent))
            offsets.append(xyz * scale)
            kinds.append(kind_of[jtype])
            axes.append(axis / np.linalg.norm(axis) if kind_of[jtype] == HINGE else np.zeros(3))
            masses.append(mass[child])
            queue.append(child)
    masses = np.array(masses)
    if body_mass is not None:
        masses = masses * body_mass / masses.sum()
    return Skeleton(names, parents, np.array(offsets), kinds, np.array(axes), masses)


def deepmimic_urdf_path() -> Path:
    """Path of the DeepMimic humanoid URDF shipped by the ``pybullet`` package (extra ``data``)."""
    try:
        import pybullet_data
    except ImportError as e:
        raise ImportError("the DeepMimic humanoid ships with pybullet: pip install 'motionjax[data]'") from e
    return Path(pybullet_data.getDataPath()) / "humanoid" / "humanoid.urdf"


DEEPMIMIC_SCALE = 0.25  # DeepMimic's humanoid.urdf is authored 4x human size.


@functools.cache
def deepmimic_humanoid() -> Skeleton:
    """The 15-joint DeepMimic humanoid (y-up, metres): 8 ball joints, 4 hinges, 2 fixed wrists."""
    return from_urdf(deepmimic_urdf_path(), scale=DEEPMIMIC_SCALE)


# de Leva (1996), "Adjustments to Zatsiorsky-Seluyanov's segment inertia parameters",
# J. Biomech. 29(9):1223-1230, Table 4 (males): segment mass as a fraction of body mass.
DE_LEVA_MASS_FRACTION = {
    "head": 0.0694, "upper_trunk": 0.1596, "middle_trunk": 0.1633, "lower_trunk": 0.1117,
    "upper_arm": 0.0271, "forearm": 0.0162, "hand": 0.0061,
    "thigh": 0.1416, "shank": 0.0433, "foot": 0.0137,
}

# The SMPL body-model joint tree (public kinematic tree of SMPL, Loper et al. 2015): name,
# parent, and an approximate rest offset (m, y-up, +x = the body's left) for the left side /
# centre; right-side offsets mirror x. The last entry is the de Leva segment that starts there.
_SMPL = [
    ("pelvis", -1, (0.0, 0.0, 0.0), "lower_trunk"),
    ("left_hip", 0, (0.06, -0.09, -0.015), "thigh"),
    ("right_hip", 0, None, "thigh"),
    ("spine1", 0, (0.0, 0.12, -0.03), "middle_trunk"),
    ("left_knee", 1, (0.04, -0.385, 0.005), "shank"),
    ("right_knee", 2, None, "shank"),
    ("spine2", 3, (0.0, 0.14, 0.025), None),
    ("left_ankle", 4, (-0.015, -0.425, -0.035), "foot"),
    ("right_ankle", 5, None, "foot"),
    ("spine3", 6, (0.0, 0.055, 0.0), "upper_trunk"),
    ("left_foot", 7, (0.04, -0.06, 0.125), None),
    ("right_foot", 8, None, None),
    ("neck", 9, (0.0, 0.21, -0.035), None),
    ("left_collar", 9, (0.075, 0.115, -0.02), None),
    ("right_collar", 9, None, None),
    ("head", 12, (0.0, 0.09, 0.05), "head"),
    ("left_shoulder", 13, (0.12, 0.045, -0.015), "upper_arm"),
    ("right_shoulder", 14, None, "upper_arm"),
    ("left_elbow", 16, (0.26, -0.015, -0.03), "forearm"),
    ("right_elbow", 17, None, "forearm"),
    ("left_wrist", 18, (0.265, 0.01, -0.007), "hand"),
    ("right_wrist", 19, None, "hand"),
    ("left_hand", 20, (0.09, -0.01, -0.015), None),
    ("right_hand", 21, None, None),
]


def smpl_like(body_mass: float = 75.0) -> Skeleton:
    """A 24-joint SMPL-like body (all ball joints) with de Leva segment masses (kg)."""
    names = [n for n, *_ in _SMPL]
    offsets = []
    for name, _, off, _ in _SMPL:
        if off is None:  # mirror the left twin across x
            off = np.array(offsets[names.index(name.replace("right", "left"))]) * (-1, 1, 1)
        offsets.append(np.array(off, float))
    masses = np.array([DE_LEVA_MASS_FRACTION[s] if s else 0.0 for *_, s in _SMPL])
    return Skeleton(names, [p for _, p, *_ in _SMPL], np.array(offsets), [BALL] * 24, None,
                    masses * body_mass / masses.sum())


def random_tree(num_joints: int, seed: int = 0, chain_prob: float = 0.6,
                hinge_prob: float = 0.2) -> Skeleton:
    """A random skeleton of ``num_joints`` joints for tests and scaling benchmarks.

    Each new joint continues the previous one's chain with ``chain_prob`` and otherwise branches
    off a uniformly chosen earlier joint, which gives limb-like chains and a depth that grows
    sub-linearly with ``J``. Offsets are 5-30 cm, masses positive.
    """
    rng = np.random.default_rng(seed)
    parents = [-1] + [j - 1 if rng.random() < chain_prob else int(rng.integers(0, j))
                      for j in range(1, num_joints)]
    direction = rng.normal(size=(num_joints, 3))
    lengths = rng.uniform(0.05, 0.3, (num_joints, 1))
    offsets = direction / np.linalg.norm(direction, axis=1, keepdims=True) * lengths
    offsets[0] = 0
    kinds = [BALL] + [HINGE if rng.random() < hinge_prob else BALL for _ in range(num_joints - 1)]
    axes = np.zeros((num_joints, 3))
    for j, k in enumerate(kinds):
        if k == HINGE:
            axes[j, rng.integers(0, 3)] = 1.0
    return Skeleton([f"j{j}" for j in range(num_joints)], parents, offsets, kinds, axes,
                    rng.uniform(0.5, 5.0, num_joints))
