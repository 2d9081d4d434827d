"""Motion of any length through a fixed-window model: overlapping windows and their seamless blend.

A clip of ``L`` frames is cut into windows of ``T`` frames (:func:`window_starts`) whose neighbours
share at least ``overlap`` frames; the first starts at frame 0 and the last ends at frame ``L``.
Each window's output is weighted by :func:`blend_weights`: 1 where no other window reaches, and a
raised-cosine cross-fade over the frames two neighbours share (the pair's weights sum to 1 there, and
the fade has no corner, so the blend's velocity is continuous too). :func:`blend` and
:func:`blend_quaternions` form the per-frame weighted mean of the windows' values or rotations.

So a frame only one window covers is that window's output exactly, and where neighbouring windows
disagree by ``d``, the blend moves from one to the other by at most ``π/2 · d / (o + 1)`` per frame over
their ``o`` shared frames, instead of jumping by ``d`` at a border. Pure numpy.
"""
from __future__ import annotations

import numpy as np

from motionjax.core import rotations as rot


def window_starts(num_frames: int, window: int, overlap: int) -> np.ndarray:
    """``[K]`` start frames of windows of ``window`` frames covering ``[0, num_frames)``, spaced
    evenly with neighbours sharing at least ``overlap`` frames (``0 <= overlap < window``); one window
    at 0 when the clip is not longer than a window (the caller pads it)."""
    if not 0 <= overlap < window:
        raise ValueError(f"overlap {overlap} must be in [0, window={window})")
    if num_frames <= window:
        return np.zeros(1, np.int64)
    count = int(np.ceil((num_frames - window) / (window - overlap))) + 1
    return np.round(np.linspace(0, num_frames - window, count)).astype(np.int64)


def _fade(x):
    """Raised cosine from 0 (``x = 0``) to 1 (``x = 1``); ``fade(x) + fade(1 - x) = 1``."""
    return 0.5 - 0.5 * np.cos(np.pi * x)


def blend_weights(starts, window: int) -> np.ndarray:
    """``[K, T]`` weight of each frame of each window: a fade-in over the ``o`` frames it shares with
    the previous window (``fade((i + 1) / (o + 1))`` at its frame ``i``), a fade-out over those it
    shares with the next, 1 elsewhere; never 0, so every covered frame has weight."""
    starts = np.asarray(starts)
    i = np.arange(window)
    weights = np.ones((len(starts), window))
    for k in range(len(starts)):
        if k > 0:
            shared = starts[k - 1] + window - starts[k]
            if shared > 0:
                weights[k] *= np.where(i < shared, _fade((i + 1) / (shared + 1)), 1.0)
        if k + 1 < len(starts):
            shared = starts[k] + window - starts[k + 1]
            if shared > 0:
                weights[k] *= np.where(i >= window - shared, _fade((window - i) / (shared + 1)), 1.0)
    return weights


def _accumulate(values, starts, num_frames: int, weights, align: bool = False):
    """Weighted sums ``[L, ...]`` of the windows' ``values [K, T, ...]`` and the summed weights ``[L]``;
    ``align``: quaternions ``[..., 4]``, each flipped into the hemisphere of the sum so far."""
    values = np.asarray(values, np.float64)
    k, t = values.shape[:2]
    total = np.zeros((num_frames, *values.shape[2:]))
    norm = np.zeros(num_frames)
    for w, v, s in zip(weights, values, starts, strict=True):
        n = min(t, num_frames - s)  # a window past the clip's end (padding) is cut there
        v = v[:n]
        if align:  # q and -q are one rotation: add the one nearer the running sum
            v = v * np.where(np.sum(total[s:s + n] * v, -1, keepdims=True) < 0, -1.0, 1.0)
        total[s:s + n] += w[:n].reshape(n, *[1] * (v.ndim - 1)) * v
        norm[s:s + n] += w[:n]
    if np.any(norm <= 0):
        raise ValueError(f"windows starting at {list(starts)} do not cover all {num_frames} frames")
    return total, norm


def blend(values, starts, num_frames: int, weights=None) -> np.ndarray:
    """Per-frame weighted mean ``[L, ...]`` of overlapping windows ``values [K, T, ...]`` starting at
    ``starts [K]`` (weights: :func:`blend_weights` by default); for positions and other vectors."""
    weights = blend_weights(starts, np.shape(values)[1]) if weights is None else weights
    total, norm = _accumulate(values, starts, num_frames, weights)
    return total / norm.reshape(-1, *[1] * (total.ndim - 1))


def blend_quaternions(quats, starts, num_frames: int, weights=None) -> np.ndarray:
    """Per-frame weighted mean rotation ``[L, ..., 4]`` of overlapping windows of unit quaternions
    ``[K, T, ..., 4]``: the weighted sum of sign-aligned quaternions, normalized (the chordal mean;
    for the close rotations of neighbouring windows it is the nlerp between them)."""
    weights = blend_weights(starts, np.shape(quats)[1]) if weights is None else weights
    total, _ = _accumulate(quats, starts, num_frames, weights, align=True)
    return rot.quat_normalize(total)
