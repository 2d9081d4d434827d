"""The cross-corpus analysis's helpers (benchmarks/cross_corpus_gap.py): which joints move no joint, and
the share of a set outside another's range."""
import numpy as np

from benchmarks.cross_corpus_gap import leaf_joints, outside_share
from motionjax.core.skeleton import BALL, FIXED, Skeleton


def test_leaf_joints_are_the_rotating_joints_nothing_below_them_moves():
    """root -> arm -> hand -> hand_end (end site at zero offset); root -> head -> head_end (zero);
    root -> leg -> foot (0.4 m) -> toe_end (0.1 m): the hand and the head move no joint; the arm
    moves the hand, the leg the foot, the foot the toe's end."""
    names = ("root", "arm", "hand", "hand_end", "head", "head_end", "leg", "foot", "toe_end")
    parents = (-1, 0, 1, 2, 0, 4, 0, 6, 7)
    offsets = np.array([[0, 0, 0], [0.2, 0, 0], [0.3, 0, 0], [0, 0, 0], [0, 0.5, 0], [0, 0, 0],
                        [0, -0.1, 0], [0, -0.4, 0], [0, 0, 0.1]], float)
    kinds = (BALL, BALL, BALL, FIXED, BALL, FIXED, BALL, BALL, FIXED)
    sk = Skeleton(names, parents, offsets, kinds, None, None)
    assert [names[j] for j in leaf_joints(sk)] == ["hand", "head"]


def test_outside_share_counts_values_beyond_the_reference_range_per_feature():
    rng = np.random.default_rng(0)
    reference = rng.uniform(-1, 1, size=(100_000, 2))
    # Feature 0: a quarter of the values beyond [-1, 1]; feature 1: all inside; a constant reference
    # feature tolerates float noise below 1e-3 only.
    frames = np.stack([np.r_[np.full(25, 1.5), np.zeros(75)], np.linspace(-0.9, 0.9, 100)], axis=1)
    np.testing.assert_allclose(outside_share(reference, frames), [0.25, 0.0])
    flat = np.zeros((1000, 1))
    np.testing.assert_allclose(outside_share(flat, np.array([[5e-4], [2e-3], [-2e-3], [0.0]])), [0.5])
