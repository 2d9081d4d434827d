"""A trained generator as a tool: samples of given labels, and a motion file restyled, as BVH files.

:func:`sample_files` (``motionjax sample``) and :func:`stylize_files` (``motionjax stylize``) read a
finished run of ``experiments/generate.py`` (:func:`.run.load_sampler`: nothing is trained or
recomputed) and write BVH files in the corpus's own units and hierarchy
(:func:`motionjax.evaluation.inference.write_like_source`; ``apply``'s path for a whole file).
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from motionjax.core import features as feat
from motionjax.evaluation import artifacts, generative, inference
from motionjax.generation import edit, latents


def label_ids(s, values: dict) -> np.ndarray:
    """``{key: value}`` (e.g. ``{"content": "walk", "style": "elderly"}``) -> class ids ``[n_keys]``; a value
    the generator never trained on is an error that lists the ones it knows."""
    out = []
    for key, known in s.vocab.items():
        value = values.get(key)
        if value is None:
            raise ValueError(f"no {key} given; one of {', '.join(known)}")
        if value not in known:
            raise ValueError(f"{key} {value!r} is not one the generator was trained on; "
                             f"one of {', '.join(known)}")
        out.append(known.index(value))
    return np.asarray(out, np.int32)


def _source_for(s, ids: np.ndarray):
    """A corpus file of the same labels (else the same first label, else any): its header is the samples'."""
    files = inference.source_files(s.config.data, s.info)
    if not files or not s.info.labels:
        return None
    keys = list(s.vocab)
    want = [s.vocab[k][i] for k, i in zip(keys, ids, strict=True)]
    for n in range(len(keys), -1, -1):
        for name, labels in zip(s.info.names, s.info.labels, strict=True):
            if name in files and [labels.get(k) for k in keys[:n]] == want[:n]:
                return files[name]
    return None


def sample_files(workdir, labels: dict, out_dir, *, count: int = 4, seed: int = 0, length: int | None = None,
                 guidance=None, physics: float | None = None, video: bool = True, loaded=None, log=print):
    """``count`` samples of ``labels`` (``{key: value}``) written as ``out_dir/<values>_<i>.bvh`` of
    ``length`` frames (default the run's window; cut from one window, or longer: continued window after
    window, :func:`.edit.extend`), and side by side as ``out_dir/samples.mp4`` (``video``).
    ``guidance``: the label guidance scales (None: the run's choice on validation); ``physics``: the physics
    guidance scale (None: the run's). ``loaded``: :func:`.run.load`'s result, to reuse. Returns the paths."""
    from motionjax.generation import run

    s, model, summary = loaded or run.load_sampler(workdir)
    window = int(s.config.data.window)
    length = window if length is None else int(length)
    if length < 1:
        raise ValueError(f"length {length} frames: at least 1")
    if count < 1:
        raise ValueError(f"count {count}: at least one sample")
    scales = tuple(guidance or summary.get("guidance") or (s.config.generation.content_scale,
                                                           s.config.generation.style_scale))
    ids = label_ids(s, labels)
    labels_ = np.repeat(ids[None], count, 0)
    x = run.generate(s, model, labels_, scales, jax.random.key(seed), physics)
    if length > window:  # continued window after window (edit.extend), back to standardized features
        root, rotations = edit.extend(s, model, x, labels_, length, scales, jax.random.key(seed + 1))
        x = feat.standardize(feat.pack(s.info.skeleton, root, rotations), s.info.mean, s.info.std)
        x = x.astype(np.float32)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    source, info, f = _source_for(s, ids), s.info, s.info.feature_dim
    stem = "_".join(labels[k] for k in s.vocab)
    paths = []
    for i in range(count):
        path = out_dir / f"{stem}_{i}.bvh"
        artifacts.export_bvh(path, info.skeleton, float(info.fps), x[i].reshape(-1, f)[:length], info.mean,
                             info.std, name=stem, source=source, units=s.config.data.units)
        paths.append(path)
        log(f"wrote {path}")
    if video:
        pos = latents.motion(info, x[: min(count, 4)])[2][:, :length]  # [K, T, J, 3]
        path = out_dir / "samples.mp4"
        artifacts.render_video(info.skeleton, {f"{stem} {i}": p for i, p in enumerate(pos)}, path,
                               float(info.fps), title=f"{stem}, guidance {scales}")
        paths.append(path)
        log(f"wrote {path}")
    return paths


def stylize_files(workdir, paths, style: str, out_dir, *, content: str | None = None,
                  strength: float = edit.STYLE_STRENGTH,
                  seed: int = 0, guidance=None, loaded=None, log=print):
    """Each motion file of ``paths`` rendered in ``style`` (:func:`.edit.stylize`, window by window as
    ``motionjax apply`` runs a model over a file, :func:`motionjax.evaluation.inference.apply_files`) and
    written as ``out_dir/<stem>.bvh`` with the input's hierarchy, units and frame rate. ``content``: the
    content label kept (None: each window's, as the run's evaluator recognizes it). Returns ``(written,
    errors)``; a file that does not read or has another skeleton is an error line naming it."""
    from motionjax.generation import run

    s, model, summary = loaded or run.load_sampler(workdir)
    scales = tuple(guidance or summary.get("guidance") or (s.config.generation.content_scale,
                                                           s.config.generation.style_scale))
    keys = list(s.vocab)
    target = label_ids(s, {keys[0]: content or s.vocab[keys[0]][0], keys[1]: style})
    key = jax.random.key(seed)

    def predict(x):
        labels = np.repeat(target[None], len(x), 0)
        if content is None:  # the content each window shows, as the evaluator sees it
            pos = latents.motion(s.info, x)[2]
            inputs = generative.motion_inputs(pos, s.info.skeleton.up_axis, float(s.info.fps))
            labels[:, 0] = generative.evaluate_features(s.evaluator, np.asarray(inputs))[1][keys[0]]
        return edit.stylize(s, model, x, labels, scales, key, strength)

    spec = inference.ModelSpec.from_run(s.config, s.info)
    written, errors = inference.apply_files(predict, spec, paths, out_dir, log=log)
    for path in written:
        log(f"wrote {path}")
    return written, errors
