"""Editing motion with the trained generator's own sampler: style transfer and in-betweening.

Both start from a real motion's latent (the frozen encoder's, :mod:`.latents`) and run
:func:`.flow.sample` with a ``source`` (SDEdit on the flow's straight paths, Meng et al. 2022; inpainting by
replacement, Lugmayr et al. 2022):

* :func:`stylize`: the source noised to flow time ``1 − strength`` and integrated to 1 with the source's
  content and the target style: the larger ``strength``, the more of the motion is made anew in the new
  style, the less of the source is kept;
* :func:`extend`: a window continued past its end, window after window, each new one in-betweened from
  the last ``overlap`` frames before it (a motion longer than the generator's window);
* :func:`inbetween`: frames ``known [B, T]`` of a window given (the others missing: a gap to fill, or
  every frame but the root path to follow); the latent frames whose frames are all given are held on the
  source's path while the others are generated around them, from noise (``strength`` 1). The source's
  missing frames are first filled by :func:`interpolate` (the baseline it is scored against), so the
  encoder sees a whole window.

All features are standardized ``[B, N, C, F]`` windows of the experiment (:class:`.run.Setup`).
"""

from __future__ import annotations

import jax
import numpy as np

from motionjax.core import features as feat
from motionjax.data import transforms
from motionjax.generation import flow


def interpolate(info, x, known) -> np.ndarray:
    """The baseline: each window of ``x [B, N, C, F]`` (standardized) with its frames where ``known [B, T]``
    is False replaced by interpolation between the nearest given frames on either side (the root lerped,
    every rotation slerped: :func:`motionjax.data.transforms.interpolate_frames`); frames before the first
    given one (after the last) hold it."""
    x = np.asarray(x, np.float32)
    b, n, c, f = x.shape
    flat = feat.destandardize(x.reshape(b, n * c, f), info.mean, info.std)
    out = np.empty_like(flat)
    for i in range(b):
        root, rotations = (np.asarray(a, np.float64) for a in feat.unpack(info.skeleton, flat[i]))
        given = np.flatnonzero(known[i])
        if not given.size:
            raise ValueError("a window with no given frame cannot be interpolated")
        where = np.interp(np.arange(n * c), given, np.arange(len(given), dtype=np.float64))
        r, q = transforms.interpolate_frames(root[given], rotations[given], where)
        out[i] = feat.pack(info.skeleton, r, q)
    return feat.standardize(out, info.mean, info.std).reshape(x.shape).astype(np.float32)


def latent_known(known, length: int) -> np.ndarray:
    """``known [B, T]`` frames -> ``[B, L]`` latent frames all of whose ``T / L`` frames are given."""
    known = np.asarray(known, bool)
    return known.reshape(known.shape[0], length, -1).all(-1)


def stylize(s, model, x, labels, scales, key, strength: float = 0.6) -> np.ndarray:
    """Windows ``x [B, N, C, F]`` rendered with ``labels [B, n_keys]`` (class ids: typically the source's
    content and another style) from their own latents noised to ``1 − strength``."""
    g = s.config.generation
    source = s.stats.standardize(s.codec.encode(x))
    z = flow.sample(model, labels, scales, g.sample_steps, key, source=source, strength=strength)
    return s.codec.decode(s.stats.raw(z))


def inbetween(s, model, x, known, labels, scales, key, strength: float = 1.0) -> np.ndarray:
    """Windows ``x [B, N, C, F]`` with the frames ``known [B, T]`` given, the others generated (labels
    ``[B, n_keys]``: the source's)."""
    g = s.config.generation
    source = s.stats.standardize(s.codec.encode(interpolate(s.info, x, known)))
    held = latent_known(known, source.shape[1])
    z = flow.sample(model, labels, scales, g.sample_steps, key, source=source, strength=strength, known=held)
    return s.codec.decode(s.stats.raw(z))


def gap(length: int, missing: int, count: int, rng, margin: int = 4) -> np.ndarray:
    """``[count, length]`` bool: every frame given but ``missing`` consecutive ones at a random place at
    least ``margin`` frames from either end (there is motion on both sides to join)."""
    if missing + 2 * margin > length:
        raise ValueError(f"{missing} missing frames and {margin} given at each end do not fit {length}")
    start = rng.integers(margin, length - margin - missing + 1, count)
    frames = np.arange(length)
    return ~((frames >= start[:, None]) & (frames < start[:, None] + missing))


def extend(s, model, x, labels, length: int, scales, key, overlap: int | None = None):
    """Windows ``x [B, N, C, F]`` (standardized, the window frame) continued to ``length`` frames:
    ``(root [B, length, 3], rotations [B, length, J, 4])`` in the first window's frame. Each continuation
    is a window whose first ``overlap`` frames (default a quarter window) are the motion's last ones,
    canonicalized as the data pipeline does a window and held (:func:`inbetween`), the rest generated
    with ``labels``; its new frames are put back in the motion's frame and appended."""
    info, sk, data = s.info, s.info.skeleton, s.config.data
    b, n, c, f = np.shape(x)
    t = n * c
    overlap = t // 4 if overlap is None else int(overlap)
    if not 0 < overlap < t:
        raise ValueError(f"overlap {overlap}: 1 to {t - 1} frames of a {t}-frame window")
    scale = data.canonical_height / transforms.rest_height(sk) if data.canonical_height else 1.0
    root, rotations = (np.asarray(a, np.float64) for a in transforms.denormalize(
        sk, transforms.unchunk(np.asarray(x, np.float32)), info.mean, info.std))
    known = np.zeros((b, t), bool)
    known[:, :overlap] = True
    hold = np.minimum(np.arange(t), overlap - 1)  # the tail, its last frame held to a whole window
    step = 0
    while root.shape[1] < length:
        r, q, yaw, origin = transforms.canonicalize(sk, root[:, -overlap:][:, hold],
                                                    rotations[:, -overlap:][:, hold],
                                                    floor=bool(data.floor_align), scale=scale)
        window = feat.standardize(feat.pack(sk, r, q), info.mean, info.std).astype(np.float32)
        y = inbetween(s, model, transforms.chunk(window, c), known, labels, scales,
                      jax.random.fold_in(key, step))
        r, q = (np.asarray(a, np.float64) for a in transforms.denormalize(
            sk, transforms.unchunk(y), info.mean, info.std))
        r, q = transforms.uncanonicalize(r, q, yaw, origin, scale=scale)
        root = np.concatenate([root, r[:, overlap:]], axis=1)
        rotations = np.concatenate([rotations, q[:, overlap:]], axis=1)
        step += 1
    return root[:, :length], rotations[:, :length]
