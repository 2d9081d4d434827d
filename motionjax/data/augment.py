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
int32 (the training segment, for loss-aware sampling), "lowest" [B, S] (optional: each frame's
lowest joint height, :func:`motionjax.data.transforms.frame_floor`, when
:func:`~motionjax.data.transforms.floor_from_spans`: the window's floor then comes from it,
:func:`~motionjax.data.transforms.window_floor`)}``,
``S = transforms.span_frames(window, speed_range)``. A resident corpus's spans are not gathered:
``{"table" [N, 3 + 4J + 1] (the corpus's frame rows, with its mirror image after them when
:func:`mirrored_rows`), "rows" [B, S] int32 (each span frame's row), "length", "offsets",
"segment"}`` (:func:`motionjax.data.resident.sample_rows`); the window's frames are gathered from the
table (:func:`~motionjax.data.transforms.read_window_rows`).
"""
from __future__ import annotations

import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import scipy.special

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


HALF_LEVELS = 1 << 16  # a 16-bit draw: two of them from each 32-bit threefry word


@functools.lru_cache(maxsize=1)
def normal_table() -> np.ndarray:
    """``[65536]`` float32: the standard normal at the midpoints of 65,536 equal-probability bins,
    ``ndtri((k + 0.5) / 65536)``, scaled to unit variance (the midpoints alone give 0.99998): a 16-bit
    draw ``k`` indexes it. Symmetric (mean 0), tails cut at 4.32 sigma (a normal passes that with
    probability 1.5e-5)."""
    z = scipy.special.ndtri((np.arange(HALF_LEVELS) + 0.5) / HALF_LEVELS)
    return (z / np.sqrt(np.mean(z * z))).astype(np.float32)


def halves(key, n: int):
    """``[4 ceil(n / 4)]`` uint32 in ``[0, 65536)``: at least ``n`` 16-bit draws, the low then the high
    halves of ``W = 2 ceil(n / 4)`` threefry words, one flat draw (:func:`draw`'s barrier). The words
    are the Threefry-2x32 hashes of the counter pairs ``(i, i + W/2)`` under ``key`` (both output words
    of a hash: ``jax.random.bits`` hashes one counter per word in jax's partitionable scheme and keeps
    one, ~1.8x the work for these ~770 words an example, docs/input.md seventh pass)."""
    count = jnp.arange(2 * ((n + 3) // 4), dtype=jnp.uint32)  # an even count: two words a hash
    words = rot.materialize(jax.extend.random.threefry_2x32(jax.random.key_data(key), count))
    return jnp.concatenate([words & 0xFFFF, words >> 16])  # not cut to n: a slice would copy it


def half_uniform(h):
    """16-bit draws ``h`` -> uniform in (0, 1): the midpoints ``(h + 0.5) / 65536``."""
    return (h.astype(jnp.float32) + 0.5) / HALF_LEVELS


def half_normal(h):
    """16-bit draws ``h`` -> standard normal (:func:`normal_table`)."""
    return jnp.asarray(normal_table())[h]


def rotation_dofs(skeleton) -> tuple[np.ndarray, np.ndarray]:
    """The rotation noise's free components: ``(source [J*3] int, weight [J*3] float32)`` such that
    ``eps[j, c] = z[source[j*3 + c]] * weight[j*3 + c]`` for ``K = 3*balls + hinges`` iid normals ``z``
    has the distribution :func:`transforms.rotation_noise` gives iid ``[J, 3]`` normals after its
    projection: a ball joint's three components as drawn, a hinge's one normal along its axis (the
    projection of iid normals on a unit axis is one normal), zero on fixed joints."""
    source, weight, k = [], [], 0
    for j in range(skeleton.num_joints):
        if skeleton.ball_mask[j]:
            source += [k, k + 1, k + 2]
            weight += [1.0, 1.0, 1.0]
            k += 3
        elif skeleton.hinge_axes[j].any():  # n·a/|a|: after the projection (n|a|) a, as iid noise gives
            a = skeleton.hinge_axes[j]
            source += [k] * 3
            weight += list(a / np.linalg.norm(a))
            k += 1
        else:
            source += [0, 0, 0]
            weight += [0.0, 0.0, 0.0]
    return np.asarray(source), np.asarray(weight, np.float32)


def sample_noise(keys, noise: transforms.Noise, frames: int, skeleton) -> dict:
    """The draws of :meth:`transforms.Noise.sample` for windows ``[B, frames]``, one key each: the same
    distributions to 16-bit resolution, drawn with jax. A draw whose probability or scale is 0 is
    left out, so :func:`transforms.make_example` skips its transform (no noise at all: the input is
    the clean window, computed once).

    Every draw of an example comes from one flat threefry draw of 16-bit halves (:func:`halves`), in a
    fixed order (rotation noise, root noise, joint mask, frame mask, warp, mirror, clean share; a
    draw left out takes no place): normals from :func:`normal_table`, uniforms from the halves'
    midpoints, and the rotation noise only on the components that move a joint
    (:func:`rotation_dofs`: 31 of the DeepMimic humanoid's 45). Its ~770 words an example replace the
    ~2,000 of one 32-bit float per draw, at half the hashing a word (docs/input.md, seventh pass)."""
    r, j = len(features.rotating_joints(skeleton)), skeleton.num_joints
    source, weight = rotation_dofs(skeleton)
    dofs = int(source.max()) + 1 if weight.any() else 0
    sizes = {"rot": frames * dofs if noise.rot_std else 0, "pos": frames * 3 if noise.pos_std else 0,
             "joint_mask": frames * r if noise.joint_mask_prob else 0,
             "frame_mask": frames if noise.frame_mask_prob else 0, "warp": int(bool(noise.time_warp)),
             "mirror": int(bool(noise.mirror_prob)), "corrupt": int(bool(noise.clean_prob))}
    ends = dict(zip(sizes, np.cumsum(list(sizes.values())), strict=True))
    part = lambda h, k: h[ends[k] - sizes[k]:ends[k]]  # noqa: E731

    def one(key):
        h = halves(key, int(ends["corrupt"]))
        d = {}
        if sizes["rot"]:
            # Each step materialized: fused into its consumers, XLA:CPU redid the table's gather per use.
            z = rot.materialize(half_normal(part(h, "rot"))).reshape(frames, dofs)
            d["rot"] = rot.materialize(z[:, source] * (weight * noise.rot_std)).reshape(frames, j, 3)
        if sizes["pos"]:
            d["pos"] = half_normal(part(h, "pos")).reshape(frames, 3) * noise.pos_std
        if sizes["joint_mask"]:
            d["joint_mask"] = half_uniform(part(h, "joint_mask")).reshape(frames, r) < noise.joint_mask_prob
        if sizes["frame_mask"]:
            d["frame_mask"] = half_uniform(part(h, "frame_mask")) < noise.frame_mask_prob
        if sizes["warp"]:
            d["warp"] = (2 * half_uniform(part(h, "warp")[0]) - 1) * noise.time_warp
        if sizes["mirror"]:
            d["mirror"] = half_uniform(part(h, "mirror")[0]) < noise.mirror_prob
        if sizes["corrupt"]:
            corrupt = half_uniform(part(h, "corrupt")[0]) >= noise.clean_prob
            for name in ("rot", "pos", "joint_mask", "frame_mask", "warp"):
                if name in d:
                    d[name] = d[name] * corrupt if d[name].dtype != bool else d[name] & corrupt
        return d

    return jax.vmap(one)(keys)


def mirrored_rows(cfg, info: DatasetInfo) -> transforms.MirrorFrames | None:
    """The frames of the mirror (:func:`transforms.mirror_frames`) when a resident corpus keeps its
    mirror image beside its frames, for ``config.data`` (``cfg``): windows are mirrored
    (``data.mirror_prob``), the rig can be, and no pose offset turns the joints before the mirror
    would (the mirror then commutes with everything before it: the speed read, a signed permutation of
    each quaternion's components keeping the nlerp's dot products, and the reversal). A mirrored
    window is then read from the mirror image's rows (:class:`Augment`; ~15% of the resident
    autoencoder's program on XLA:CPU, docs/input.md tenth pass), for twice the corpus's frames on
    the devices. None otherwise."""
    if not cfg.mirror_prob or cfg.pose_offset:
        return None
    return transforms.mirror_frames(info.skeleton, np.asarray(info.mean, np.float32))


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
        # The window's floor from its span's per-frame floor ("lowest": the resident corpus's, or the
        # host's with the streamed spans), read at the window's speed: no FK in the program.
        self.floor_from_span = transforms.floor_from_spans(cfg)
        # A resident corpus's mirror image kept beside its frames (Corpus.arrays): a mirrored window is
        # read from it, no mirror pass in the program.
        self.mirror_rows = mirrored_rows(cfg, info)

    def __call__(self, spans: dict, keys) -> dict:
        b = keys.shape[0]
        speed = None
        if self.speed_range != 1.0:  # log-uniform in [1/r, r], as the host's draw
            log = float(np.log(self.speed_range))
            speed = jnp.exp(jax.vmap(lambda k: jax.random.uniform(k, (), minval=-log, maxval=log))(
                purpose(keys, _SPEED)))
        draws = sample_noise(purpose(keys, _NOISE), self.noise, self.window, self.skeleton)
        lowest, offsets = None, spans.get("offsets")
        if "rows" in spans:  # a resident corpus's: the window's frames gathered from its table's rows
            rows, table = spans["rows"], spans["table"]
            if self.mirror_rows is not None:  # the table's second half is its first mirrored: one index
                m = draws.pop("mirror")
                rows = rows + jnp.where(m, table.shape[0] // 2, 0).astype(rows.dtype)[:, None]
                if offsets is not None:
                    offsets = jnp.where(m[:, None, None], transforms.mirror_offsets(
                        self.skeleton, offsets, self.mirror_rows), offsets)
            root, rots, valid, floor = transforms.read_window_rows(table, rows, spans["length"], self.window,
                                                                   self.skeleton.num_joints, speed)
            lowest = floor if self.floor_from_span else None
        else:
            root, rots, valid = transforms.read_window(spans["root_position"], spans["rotations"],
                                                       spans["length"], self.window, speed)
            if self.floor_from_span and "lowest" in spans:
                lowest = transforms.window_floor(spans["lowest"], spans["length"], self.window, speed)
        if self.reverse_prob:
            flip = jax.vmap(jax.random.uniform)(purpose(keys, _REVERSE)) < self.reverse_prob
            root, rots, valid = transforms.reverse_window(root, rots, valid, flip)
        if self.pose_offset:
            j = self.skeleton.num_joints
            eps = jax.vmap(lambda k: draw(jax.random.normal, k, (j, 3)))(purpose(keys, _POSE))
            rots = transforms.offset_pose(self.skeleton, rots, eps * self.pose_offset)
        out = transforms.make_example(self.skeleton, root, rots, draws, self.mean, self.std,
                                      chunk_size=self.chunk, floor=self.floor, scale=self.scale,
                                      offsets=offsets, observed=self.observed, lowest=lowest)
        del out["mask"]  # for inspection on the host; the step does not read it
        out["valid"] = transforms.chunk(valid[..., None], self.chunk)
        if "segment" in spans:
            out["segment"] = spans["segment"].astype(jnp.int32)
        assert out["noisy"].shape[0] == b
        return out
