"""Editing motion with the trained generator's own sampler: style transfer and in-betweening.

Both start from a real motion's latent (the frozen encoder's, :mod:`.latents`) and run
:func:`.flow.sample` with a ``source`` (SDEdit on the flow's straight paths, Meng et al. 2022; inpainting by
replacement, Lugmayr et al. 2022):

* :func:`stylize`: the source noised to flow time ``1 − strength`` and integrated to 1 with the source's
  content and the target style: the larger ``strength``, the more of the motion is made anew in the new
  style, the less of the source is kept;
* :func:`extend`: a window continued past its end, window after window, each new one in-betweened from
  the last ``overlap`` frames before it (a motion longer than the generator's window);
* :func:`inbetween`: frames ``known [B, T]`` of a window given (the others missing: a gap to fill); the
  source's missing frames are first filled by :func:`interpolate` (the baseline it is scored against),
  so the encoder sees a whole window, its latent noised to ``1 − strength`` and integrated; the result
  meets the given frames by replacement of the latent frames they cover, by reconstruction guidance
  (:func:`.flow.reconstruction_cost`) and/or by :func:`join` (given frames exact, the residual at each
  gap's ends blended across it), optionally the mean of several samples; :func:`toward` moves such a result
  part of the way to the interpolation.

All features are standardized ``[B, N, C, F]`` windows of the experiment (:class:`.run.Setup`).
"""

from __future__ import annotations

import jax
import numpy as np

from motionjax.core import features as feat
from motionjax.data import transforms
from motionjax.generation import flow, latents


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


def decoded(s, model, labels, scales, key, samples: int = 1, sampler: str | None = None,
            **sample_args) -> np.ndarray:
    """Features ``[B, N, C, F]`` of :func:`.flow.sample`'s latents for ``labels [B, n_keys]``
    (``sample_args``: its editing and guidance arguments; the run's ``sample_steps``; ``sampler`` None:
    the run's), the mean of ``samples`` samples, each of its own noise (``key`` folded with its index;
    one sample: ``key``)."""
    g = s.config.generation
    made = 0.0
    for k in range(samples):
        draw = key if samples == 1 else jax.random.fold_in(key, k)
        z = flow.sample(model, labels, scales, g.sample_steps, draw, sampler=sampler or flow.sampler_of(g),
                        **sample_args)
        made = made + s.codec.decode(s.stats.raw(z)) / samples
    return made


# Style transfer's default strength: chosen on Bandai-2 validation as the method nearest its sources with
# target style >= 0.75 and content >= 0.9 (docs/generation.md); motionjax stylize and stylize_files use it.
STYLE_STRENGTH = 0.65


def stylize(s, model, x, labels, scales, key, strength: float = STYLE_STRENGTH, samples: int = 1,
            sampler: str | None = None) -> np.ndarray:
    """Windows ``x [B, N, C, F]`` rendered with ``labels [B, n_keys]`` (class ids: typically the source's
    content and another style) from their own latents noised to ``1 − strength``; ``samples``: the mean
    of that many samples' features (each of its own noise, as :func:`inbetween`'s); ``sampler``: a
    :data:`.flow.SAMPLERS` entry (None: the run's)."""
    source = s.stats.standardize(s.codec.encode(x))
    return decoded(s, model, labels, scales, key, samples, sampler, source=source, strength=strength)


def inbetween(s, model, x, known, labels, scales, key, strength: float = 1.0, hold: bool = True,
              fit_steps: int = 0, fit_rate: float = 0.0, join_ends: bool = False,
              samples: int = 1) -> np.ndarray:
    """Windows ``x [B, N, C, F]`` with the frames ``known [B, T]`` given, the others generated (labels
    ``[B, n_keys]``: the source's), from the interpolated window's latent noised to ``1 − strength``.
    ``hold``: the latent frames whose frames are all given held on the source's path (replacement);
    ``fit_steps``, ``fit_rate``: reconstruction guidance toward the given frames
    (:func:`.flow.reconstruction_cost`); ``join_ends``: the result :func:`join`-ed to the given frames;
    ``samples``: the mean of that many samples' features (each of its own noise; a Monte Carlo estimate
    of the posterior mean, which the error against one true motion rewards, at the cost of the
    samples' variety: a mean of motions moves less than each)."""
    filled = interpolate(s.info, x, known)
    source = s.stats.standardize(s.codec.encode(filled))
    held = latent_known(known, source.shape[1]) if hold else None
    target = weight = None
    if fit_steps > 0:  # the given frames' joint positions, every joint weighed
        target = latents.motion(s.info, x)[2]  # [B, T, J, 3]
        weight = np.broadcast_to(np.asarray(known, np.float32)[..., None, None], target.shape)
    made = decoded(s, model, labels, scales, key, samples, source=source, strength=strength, known=held,
                   fit=s.fit if fit_steps > 0 else None, target=target, weight=weight, fit_steps=fit_steps,
                   fit_rate=fit_rate)
    return join(x, made, known) if join_ends else made


def toward(made, base, share: float) -> np.ndarray:
    """``made`` moved ``share`` (in [0, 1]) of the way to ``base`` (both ``[B, N, C, F]`` standardized
    features; in-betweening: the generator's result toward the interpolation). Where the two err in
    different directions, the blend errs less than either (a shrinkage of the generator's estimate of the
    missing frames toward the baseline's, its share chosen on validation). Given frames that both hold
    exactly stay exact (the blend is affine: weights sum to 1)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share {share}: a share of the way, in [0, 1]")
    made = np.asarray(made, np.float32)
    if share == 0:
        return made
    return ((1 - share) * made + share * np.asarray(base, np.float32)).astype(np.float32)


def join(x, made, known) -> np.ndarray:
    """``made [B, N, C, F]`` joined to the given frames of ``x`` (``known [B, T]``; standardized features):
    the given frames are ``x``'s exactly, and each missing one is ``made``'s plus the residual ``x − made``
    at the nearest given frames on either side, blended linearly across the gap (so the generated
    middle meets the given motion with no jump; a gap at a window's end takes its one side's residual)."""
    x, made = np.asarray(x, np.float32), np.asarray(made, np.float32)
    shape, known = x.shape, np.asarray(known, bool)
    b, t = known.shape
    x, made = x.reshape(b, t, -1), made.reshape(b, t, -1)
    frames = np.broadcast_to(np.arange(t), (b, t))
    before = np.maximum.accumulate(np.where(known, frames, -1), axis=1)  # last given frame at or before
    after = np.minimum.accumulate(np.where(known, frames, t)[:, ::-1], axis=1)[:, ::-1]  # first at or after
    if (before[:, -1] < 0).any():
        raise ValueError("a window with no given frame cannot be joined")
    before_ = np.where(before < 0, after, before)
    after_ = np.where(after >= t, before_, after)
    rows = np.arange(b)[:, None]
    residual = x - made
    w = np.where(after_ > before_, (frames - before_) / np.maximum(after_ - before_, 1), 0.0)[..., None]
    blended = made + (1 - w) * residual[rows, before_] + w * residual[rows, after_]
    return np.where(known[..., None], x, blended).reshape(shape).astype(np.float32)


def follow_path(s, model, x, labels, scales, key, fit_steps: int = 2, fit_rate: float = 0.5,
                strength: float = 1.0, source=None) -> np.ndarray:
    """Trajectory control: windows that walk the root path of ``x [B, N, C, F]`` (the root's horizontal
    position at every frame, window frame), generated with ``labels [B, n_keys]`` by reconstruction
    guidance on the decoded root alone (:func:`.flow.reconstruction_cost`, weight on the root joint's
    horizontal coordinates); ``source`` (standardized latents): start from it noised to ``1 − strength``
    (None: from noise)."""
    target = latents.motion(s.info, x)[2]  # [B, T, J, 3]
    weight = np.zeros(target.shape, np.float32)
    weight[:, :, 0] = 1.0  # the root joint
    weight[..., s.info.skeleton.up_axis] = 0.0  # its path on the floor, not its height
    return decoded(s, model, labels, scales, key, source=source,
                   strength=strength if source is not None else 1.0, fit=s.fit, target=target, weight=weight,
                   fit_steps=fit_steps, fit_rate=fit_rate)


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
