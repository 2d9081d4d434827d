"""Training batches made on the device: raw spans -> read at a speed, reversed, offset, mirrored,
canonicalized, noised, masked, standardized and chunked, in one jitted program.

The host ships only what it cannot avoid shipping, once: each window's *span* (the frames from its
start, :func:`motionjax.data.transforms.read_span`), or nothing at all when the corpus lives on the
device (:mod:`motionjax.data.resident` draws the spans there). :class:`Augment` turns a batch of spans
into the batch the train step reads, with the transforms of :mod:`motionjax.data.transforms` (the same
functions evaluation and inference run in numpy: one source). Every random choice of example ``i`` of
step ``s`` comes from ``fold_in(fold_in(key(seed), s), i)`` with ``i`` its index in the *global* batch,
so a batch is a function of the seed and the step alone, whatever the device or process count, and a
resumed run draws what the uninterrupted one drew.

Spans: ``{"root_position" [B, S, 3], "rotations" [B, S, J, 4], "length" [B] int32 (real frames from
the start; later ones repeat the last), "offsets" [B, J, 3] (data.bones = "clip"), "segment" [B]
int32 (the training segment, for loss-aware sampling)}``, ``S = transforms.span_frames(window,
speed_range)``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from motionjax.core import features
from motionjax.core import rotations as rot
from motionjax.data import transforms
from motionjax.data.info import DatasetInfo

# One stream per purpose: fold_in(example key, purpose). New draws get new numbers, so adding one
# never changes the others.
_START, _SPEED, _REVERSE, _POSE, _NOISE = range(5)


def example_keys(seed: int, step, batch_size: int):
    """``[B]`` keys of the examples of global batch ``step`` (traced or concrete int)."""
    base = jax.random.fold_in(jax.random.key(seed), step)
    return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.arange(batch_size, dtype=jnp.uint32))


def purpose(keys, which: int):
    """``[B]`` keys -> ``[B]`` keys of one purpose (the start draw, the speed, ...)."""
    return jax.vmap(lambda k: jax.random.fold_in(k, which))(keys)


def draw(sample, key, shape: tuple, **kw):
    """``sample(key, shape, **kw)`` (a ``jax.random`` draw), drawn flat and reshaped: the same numbers
    (the counters of a draw are its row-major indices), ~4x cheaper on XLA:CPU for an ``[..., 3]``
    shape. Drawn as ``shape``, or fused into an ``[..., 3]`` consumer, every element's counter is
    rebuilt from its multi-dimensional index in 2x32-bit arithmetic; the barrier keeps the draw its
    own flat loop (46k normals: 1.6 -> 0.3 ms)."""
    return rot.materialize(sample(key, (int(np.prod(shape)),), **kw)).reshape(shape)


def sample_noise(keys, noise: transforms.Noise, frames: int, skeleton) -> dict:
    """The draws of :meth:`transforms.Noise.sample` for windows ``[B, frames]``, one key each: the same
    distributions, drawn with jax. A draw whose probability or scale is 0 is left out, so
    :func:`transforms.make_example` skips its transform (no noise at all: the input is the clean
    window, computed once)."""
    r, j = len(features.rotating_joints(skeleton)), skeleton.num_joints

    def one(key):
        k = jax.random.split(key, 7)
        d = {}
        if noise.rot_std:
            d["rot"] = draw(jax.random.normal, k[0], (frames, j, 3)) * noise.rot_std
        if noise.pos_std:
            d["pos"] = draw(jax.random.normal, k[1], (frames, 3)) * noise.pos_std
        if noise.joint_mask_prob:
            d["joint_mask"] = draw(jax.random.uniform, k[2], (frames, r)) < noise.joint_mask_prob
        if noise.frame_mask_prob:
            d["frame_mask"] = jax.random.uniform(k[3], (frames,)) < noise.frame_mask_prob
        if noise.time_warp:
            d["warp"] = jax.random.uniform(k[4], (), minval=-noise.time_warp, maxval=noise.time_warp)
        if noise.mirror_prob:
            d["mirror"] = jax.random.uniform(k[5]) < noise.mirror_prob
        if noise.clean_prob:
            corrupt = jax.random.uniform(k[6]) >= noise.clean_prob
            for name in ("rot", "pos", "joint_mask", "frame_mask", "warp"):
                if name in d:
                    d[name] = d[name] * corrupt if d[name].dtype != bool else d[name] & corrupt
        return d

    return jax.vmap(one)(keys)


class Augment:
    """``(spans, keys [B]) -> batch``: the training transforms of ``config.data`` (``cfg``), pure jax.

    The batch holds ``"noisy"``, ``"clean" [B, N, C, F]``, ``"valid" [B, N, C, 1]``, with clip bones
    ``"offsets" [B, J, 3]`` and, when the spans name it, ``"segment" [B]`` (as the host pipeline's).
    """

    def __init__(self, cfg, info: DatasetInfo):
        self.skeleton, self.window, self.chunk = info.skeleton, cfg.window, cfg.chunk
        self.mean, self.std = np.asarray(info.mean, np.float32), np.asarray(info.std, np.float32)
        self.noise = transforms.Noise.from_config(cfg)
        self.speed_range, self.reverse_prob = float(cfg.speed_range), float(cfg.reverse_prob)
        self.pose_offset, self.floor, self.observed = float(cfg.pose_offset), cfg.floor_align, cfg.observed
        self.scale = (cfg.canonical_height / transforms.rest_height(info.skeleton)
                      if cfg.canonical_height else 1.0)
        self.span = transforms.span_frames(cfg.window, self.speed_range)

    def __call__(self, spans: dict, keys) -> dict:
        b = keys.shape[0]
        speed = None
        if self.speed_range != 1.0:  # log-uniform in [1/r, r], as the host's draw
            log = float(np.log(self.speed_range))
            speed = jnp.exp(jax.vmap(lambda k: jax.random.uniform(k, (), minval=-log, maxval=log))(
                purpose(keys, _SPEED)))
        root, rots, valid = transforms.read_window(spans["root_position"], spans["rotations"],
                                                   spans["length"], self.window, speed)
        if self.reverse_prob:
            flip = jax.vmap(jax.random.uniform)(purpose(keys, _REVERSE)) < self.reverse_prob
            root, rots, valid = transforms.reverse_window(root, rots, valid, flip)
        if self.pose_offset:
            j = self.skeleton.num_joints
            eps = jax.vmap(lambda k: draw(jax.random.normal, k, (j, 3)))(purpose(keys, _POSE))
            rots = transforms.offset_pose(self.skeleton, rots, eps * self.pose_offset)
        draws = sample_noise(purpose(keys, _NOISE), self.noise, self.window, self.skeleton)
        out = transforms.make_example(self.skeleton, root, rots, draws, self.mean, self.std,
                                      chunk_size=self.chunk, floor=self.floor, scale=self.scale,
                                      offsets=spans.get("offsets"), observed=self.observed)
        del out["mask"]  # for inspection on the host; the step does not read it
        out["valid"] = transforms.chunk(valid[..., None], self.chunk)
        if "segment" in spans:
            out["segment"] = spans["segment"].astype(jnp.int32)
        assert out["noisy"].shape[0] == b
        return out
