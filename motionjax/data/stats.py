"""Per-feature statistics of prepared windows: streaming moments, and the canonicalized features of a
segment's windows that they are computed over (the normalization every batch is standardized with).

Used by preparation (:mod:`motionjax.data.prepare`) and by the synthetic corpus
(:mod:`motionjax.data.synthetic`), which computes the same statistics without writing shards.
"""
from __future__ import annotations

import numpy as np

from motionjax.core import features
from motionjax.core.skeleton import Skeleton
from motionjax.data import transforms

MIN_STD = 1e-3  # features constant in the data (e.g. hinge 6D components) standardize with std 1


class Moments:
    """Streaming per-feature mean/variance (Welford, merged chunk-wise after Chan et al. 1979)."""

    def __init__(self, dim: int):
        self.count, self.mean, self.m2 = 0, np.zeros(dim), np.zeros(dim)

    def update(self, x: np.ndarray) -> None:
        """Add rows ``x [n, F]``."""
        x = np.asarray(x, np.float64).reshape(-1, self.mean.size)
        if x.shape[0]:
            other = Moments(self.mean.size)
            other.count, other.mean, other.m2 = x.shape[0], x.mean(0), ((x - x.mean(0)) ** 2).sum(0)
            self.merge(other)

    def merge(self, other: Moments) -> None:
        """Add another set's moments (exact: the result equals one pass over both)."""
        if other.count == 0:
            return
        total = self.count + other.count
        delta = other.mean - self.mean
        self.mean = self.mean + delta * other.count / total
        self.m2 = self.m2 + other.m2 + delta**2 * self.count * other.count / total
        self.count = total

    def to_array(self) -> np.ndarray:
        """``[1 + 2F]`` float64: count, mean, m2 (what prepare spills per clip; :meth:`from_array`)."""
        return np.concatenate([[self.count], self.mean, self.m2])

    @classmethod
    def from_array(cls, a) -> Moments:
        m = cls((len(a) - 1) // 2)
        m.count, m.mean, m.m2 = int(a[0]), np.asarray(a[1:1 + m.mean.size]), np.asarray(a[1 + m.mean.size:])
        return m

    def std(self) -> np.ndarray:
        std = np.sqrt(self.m2 / max(self.count - 1, 1))
        return np.where(std < MIN_STD, 1.0, std)


def window_features(skeleton: Skeleton, root, rotations, window: int, stride: int, positions=None):
    """Canonicalized (unstandardized) features of the windows of one segment, ``[n·window, F]``.

    With the segment's FK ``positions [T, J, 3]``, the floor of each window comes from them: the
    height of the lowest joint does not change when the window turns about the up axis or slides
    horizontally, so no window needs FK of its own (the windows overlap 4x)."""
    starts = np.arange(0, root.shape[0] - window + 1, stride)
    if starts.size == 0:
        return np.zeros((0, features.feature_dim(skeleton)))
    idx = starts[:, None] + np.arange(window)
    if positions is None:
        r, q, _, _ = transforms.canonicalize(skeleton, root[idx], rotations[idx])
    else:
        r, q, _, _ = transforms.canonicalize(skeleton, root[idx], rotations[idx], floor=False)
        r[..., skeleton.up_axis] -= positions[idx][..., skeleton.up_axis].min(axis=(-1, -2))[:, None]
    return features.pack(skeleton, r, q).reshape(-1, features.feature_dim(skeleton))
