"""The latent dataset: windows of a split with their labels, encoded once by the frozen autoencoder.

:func:`split_windows` cuts every clip of a split into sliding windows (as
:func:`motionjax.data.pipeline.make_eval_batches` does; a segment shorter than a window is edge-padded,
its padding frames hold the last pose), canonicalized and standardized as the trainer's input
(:func:`motionjax.data.transforms.make_example`), optionally with each window's mirror image beside it
(its labels mapped, e.g. walk-left becomes walk-right). :func:`encode` / :func:`decode` run the frozen
autoencoder over them: features ``[K, N, C, F]`` <-> latent sequences ``[K, L, D]`` (``L = N·C/stride``
latent frames of ``D = latent_dim`` numbers).
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import numpy as np
from flax import nnx

from motionjax.core import features as feat
from motionjax.data import pipeline, transforms
from motionjax.evaluation import generative, metrics


@dataclasses.dataclass
class Windows:
    """Windows of one split: ``features [K, N, C, F]`` (standardized), ``offsets [K, J, 3]`` (each clip's
    bones, m), ``valid [K, T]`` (0 on padding past a short clip's end), ``labels {key: [K] str}``, ``clip
    [K]`` (clip id), ``mirrored [K]``."""

    features: np.ndarray
    offsets: np.ndarray
    valid: np.ndarray
    labels: dict
    clip: np.ndarray
    mirrored: np.ndarray

    def __len__(self) -> int:
        return len(self.features)

    def take(self, index) -> Windows:
        return Windows(
            self.features[index],
            self.offsets[index],
            self.valid[index],
            {k: v[index] for k, v in self.labels.items()},
            self.clip[index],
            self.mirrored[index],
        )


def split_windows(
    data_cfg,
    info,
    split: str,
    stride: int,
    label_keys=("content", "style"),
    mirror: bool = False,
    mirror_labels=None,
    batch: int = 256,
) -> Windows:
    """Sliding windows (``data_cfg.window`` frames, every ``stride``) over ``info``'s ``split``, with the
    clips' labels (``info.labels``; a clip without a key gets ``"none"``); ``mirror``: each window's mirror
    image too, its labels mapped by ``mirror_labels`` (``{value: value}``; others unchanged). Standardized
    with ``info.mean`` / ``info.std``."""
    t, chunk, sk = int(data_cfg.window), int(data_cfg.chunk), info.skeleton
    spans = pipeline.eval_windows(info, split, t, stride)
    if not spans:
        raise ValueError(f"{info.data_dir}: split {split!r} holds no window of {t} frames")
    if mirror:
        if transforms.mirror_frames(sk, info.mean) is None:
            logging.warning("mirrored windows are off: %s cannot be mirrored", sk)
            mirror = False
    source, clips = pipeline.ClipSource(info), {}
    roots, rots, offsets, valid, ids = [], [], [], [], []
    for clip_id, start, end in spans:
        if clip_id not in clips:
            clips[clip_id] = source[clip_id]
        record = clips[clip_id]
        frames = np.arange(start, start + t)
        idx = np.minimum(frames, end - 1)
        roots.append(record["root_position"][idx])
        rots.append(record["rotations"][idx])
        offsets.append(np.asarray(record.get("offsets", sk.offsets), np.float32))
        valid.append((frames <= end - 1).astype(np.float32))
        ids.append(clip_id)
    roots, rots, offsets = np.stack(roots), np.stack(rots), np.stack(offsets)
    valid, ids = np.stack(valid), np.array(ids, np.int32)
    flip = np.zeros(len(ids), bool)
    if mirror:
        roots, rots, offsets = (np.concatenate([x, x]) for x in (roots, rots, offsets))
        valid, ids, flip = (
            np.concatenate([valid, valid]),
            np.concatenate([ids, ids]),
            np.repeat([False, True], len(ids)),
        )
    scale = data_cfg.canonical_height / transforms.rest_height(sk) if data_cfg.canonical_height else 1.0
    out, offs = [], []
    for i in range(0, len(ids), batch):
        part = slice(i, i + batch)
        draws = transforms.Noise().sample(np.random.default_rng(0), t, sk, (len(ids[part]),))
        draws["mirror"] = flip[part]
        ex = transforms.make_example(
            sk,
            roots[part],
            rots[part],
            draws,
            info.mean,
            info.std,
            chunk_size=chunk,
            floor=data_cfg.floor_align,
            scale=scale,
            offsets=offsets[part],
        )
        out.append(ex["clean"])
        offs.append(ex["offsets"])
    mapping = dict(mirror_labels or {})
    labels = {}
    for key in label_keys:
        values = np.array([str(info.labels[c].get(key, "none")) if info.labels else "none" for c in ids])
        labels[key] = np.where(flip, [mapping.get(v, v) for v in values], values) if mirror else values
    return Windows(np.concatenate(out), np.concatenate(offs), valid, labels, ids, flip)


def motion(info, x, offsets=None):
    """Standardized features ``[K, N, C, F]`` (or ``[K, T, F]``) -> ``(root [K, T, 3], rotations [K, T, J,
    4], positions [K, T, J, 3])`` numpy float32 on ``offsets [K, J, 3]`` (None: the skeleton's bones)."""
    x = np.asarray(x, np.float32).reshape(len(x), -1, np.shape(x)[-1])
    root, rotations = feat.unpack(info.skeleton, feat.destandardize(x, info.mean, info.std))
    positions = generative.in_batches(
        lambda f, o: metrics.feature_positions(info.skeleton, f, info.mean, info.std, o),
        256,
        x,
        None if offsets is None else np.asarray(offsets, np.float32),
    )
    return np.asarray(root, np.float32), np.asarray(rotations, np.float32), positions


class Codec:
    """The frozen autoencoder's two halves, jitted: :meth:`encode` features ``[K, N, C, F]`` -> latents
    ``[K, L, D]``, :meth:`decode` back (its output is a motion's features: rotations that decode to unit
    quaternions, through the IK head onto the bones when the model has one)."""

    def __init__(self, model: nnx.Module, chunk: int):
        self.graphdef, self.state = nnx.split(model)
        self.chunk, self.stride = chunk, model.stride
        self.latent_dim = model.latent_dim
        self._encode = jax.jit(lambda state, x: nnx.merge(self.graphdef, state).encode(x))
        self._decode = jax.jit(self.decode_fn)

    def decode_fn(self, state, z):
        """Traceable: latents ``[B, L, D]`` -> features ``[B, N, C, F]`` (the generator's loss calls it)."""
        b, length, d = z.shape
        per_chunk = self.chunk // self.stride
        return nnx.merge(self.graphdef, state).decode(z.reshape(b, length // per_chunk, per_chunk, d))

    def encode(self, x, batch: int = 128) -> np.ndarray:
        z = generative.in_batches(lambda x: self._encode(self.state, x), batch, np.asarray(x, np.float32))
        return z.reshape(len(z), -1, z.shape[-1])

    def decode(self, z, batch: int = 128) -> np.ndarray:
        return generative.in_batches(lambda z: self._decode(self.state, z), batch, np.asarray(z, np.float32))
