"""The generation experiment end to end (``motionjax train`` with a config that has a ``generation``
section, e.g. ``experiments/generate.py``), readable top to bottom:

1. the frozen autoencoder (:mod:`.stages`: trained first in ``WORKDIR/autoencoder``, or a given run);
2. the windows of every split, with labels (:func:`.latents.split_windows`), the training ones encoded;
3. the evaluator (:mod:`motionjax.evaluation.generative`), trained once (``WORKDIR/evaluator.*``);
4. the generator (:mod:`.flow`), trained once (``WORKDIR/generator.npz``; with the dynamics loss on, also
   the same generator without it, ``WORKDIR/no_dynamics.npz``);
5. the guidance scales chosen on validation (lowest FID); with physics guidance on
   (``generation.physics_guidance``), the same generator sampled without it too (``no_physics``);
6. the table on test and on the unseen (content, style) pairs: the generator, the real windows (the
   ceiling), a retrieval baseline that copies a training window of the same labels, and the autoencoder's
   own reconstruction of the real windows; each with FID, label accuracy, diversity, multimodality and
   the plausibility metrics (:mod:`motionjax.evaluation.plausibility`);
7. samples as BVH, a figure and a video; ``summary.json``.

A stage whose result is on disk is not run again: running the same command resumes after the last
finished stage (a generator interrupted mid-training starts its training over).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from motionjax.data import pipeline
from motionjax.evaluation import artifacts, generative, plausibility
from motionjax.generation import flow, latents, stages

SPLITS = ("validation", "test", "unseen_pairs")


@dataclasses.dataclass
class Setup:
    """What every generator of one experiment shares: data, frozen autoencoder, evaluator, latents."""

    config: object
    workdir: Path
    info: object  # the experiment's dataset, standardized with the autoencoder's statistics
    codec: latents.Codec
    vocab: dict  # {label key: [values]}: class i of key k is vocab[k][i]
    train: latents.Windows
    splits: dict  # {split: Windows}
    feet: plausibility.Feet
    evaluator: generative.Evaluator
    stats: flow.LatentStats
    latents: np.ndarray  # [K, L, D] standardized training latents
    labels: np.ndarray  # [K, n_keys] class ids of the training windows
    real: dict  # {split: {"features", "predicted", "plausibility" (window sums)}} of the real windows
    timing: dict

    @property
    def classes(self) -> tuple[int, ...]:
        return tuple(len(v) for v in self.vocab.values())

    def encode_labels(self, windows: latents.Windows) -> np.ndarray:
        """``[K, n_keys]`` class ids; a value the training windows never had is an error naming it."""
        out = []
        for key, values in self.vocab.items():
            index = {v: i for i, v in enumerate(values)}
            unknown = sorted(set(windows.labels[key]) - set(index))
            if unknown:
                raise ValueError(
                    f"label {key}={unknown[0]!r} appears in no training window of "
                    f"{self.info.data_dir}: the generator cannot be asked for it"
                )
            out.append([index[v] for v in windows.labels[key]])
        return np.array(out, np.int32).T

    @functools.cached_property
    def guide(self):
        """:func:`.flow.physics_cost` of this experiment (one object: it keys the compiled sampler)."""
        return flow.physics_cost(self.codec, self.codec.state, self.stats, self.info, float(self.info.fps),
                                 self.feet)

    def score(self, x, offsets=None, valid=None) -> dict:
        """Evaluator features, predicted classes and plausibility window sums of standardized features
        ``[K, N, C, F]`` (on ``offsets``; None: the skeleton's bones)."""
        root, rotations, positions = latents.motion(self.info, x, offsets)
        inputs = generative.motion_inputs(positions, self.info.skeleton.up_axis, float(self.info.fps))
        features, predicted = generative.evaluate_features(self.evaluator, np.asarray(inputs))
        sums = plausibility.window_sums(
            self.info.skeleton, float(self.info.fps), self.feet, root, rotations, offsets, valid
        )
        return {"features": features, "predicted": predicted, "plausibility": sums}


def log(message: str) -> None:
    print(message, flush=True)


def dataset(config, ae):
    """The experiment's dataset with the autoencoder's feature statistics (its input is standardized as it
    was trained), checked against the autoencoder's skeleton, window and chunking, and the unseen pairs."""
    from motionjax.data import corpus

    info = pipeline.dataset_info(config.data)
    given = dict(config.generation.clip_labels)
    if given:  # labels for clips without label files
        keys = tuple(config.generation.labels)
        labels = [
            dict(zip(keys, given[n].split("/"), strict=True)) if n in given else dict(old)
            for n, old in zip(info.names, info.labels or [{}] * len(info.names), strict=True)
        ]
        info = dataclasses.replace(info, labels=tuple(labels))
    if corpus.topology(info.skeleton) != corpus.topology(ae.info.skeleton):
        raise ValueError(
            f"{config.data.dir}: skeleton differs from the autoencoder's ({ae.info.data_dir}): "
            f"{corpus.topology_difference(info.skeleton, ae.info.skeleton)}"
        )
    if config.data.chunk % ae.config.model.stride:
        raise ValueError(
            f"data.chunk={config.data.chunk} is not a multiple of the autoencoder's stride "
            f"{ae.config.model.stride}"
        )
    pairs = {tuple(p.split("/")) for p in config.generation.unseen_pairs}
    if "unseen_pairs" in info.splits:
        found = {
            tuple(info.labels[c].get(k, "none") for k in config.generation.labels)
            for c, _, _ in info.splits["unseen_pairs"]
        }
        if found != pairs:
            raise ValueError(
                f"{config.data.dir}: the unseen_pairs split holds {sorted(found)}, the config states "
                f"generation.unseen_pairs={sorted(pairs)}"
            )
    return dataclasses.replace(info, mean=ae.info.mean, std=ae.info.std)


def setup(config, workdir) -> Setup:
    """Stages 1-3 and the training latents (each read from ``workdir`` when done before)."""
    from motionjax.efficiency import trained

    g, workdir, timing = config.generation, Path(workdir), {}
    workdir.mkdir(parents=True, exist_ok=True)
    clock = time.perf_counter()
    ae_path = stages.train_autoencoder(config, workdir)
    step = g.autoencoder_step if g.autoencoder_step in ("best", "latest") else int(g.autoencoder_step)
    ae = trained.load(ae_path, step)
    timing["autoencoder_s"] = time.perf_counter() - clock
    log(f"autoencoder: {ae_path} step {ae.step}, {ae.model.latent_per_frame:g} latent numbers per frame")
    info = dataset(config, ae)
    codec = latents.Codec(ae.model, config.data.chunk)

    clock = time.perf_counter()
    keys = tuple(g.labels)
    train = latents.split_windows(
        config.data, info, info.train_split, g.window_stride, keys, g.mirror, dict(g.mirror_labels)
    )
    splits = {
        s: latents.split_windows(config.data, info, s, config.data.eval_stride, keys)
        for s in SPLITS
        if s in info.splits
    }
    vocab = {k: sorted(set(train.labels[k])) for k in keys}
    _, _, positions = latents.motion(info, train.features, train.offsets)
    feet = plausibility.Feet.fit(info.skeleton, positions)
    log(
        f"windows of {config.data.window} frames: {len(train)} training "
        f"({int(train.mirrored.sum())} mirrored), "
        + ", ".join(f"{len(w)} {s}" for s, w in splits.items())
        + f"; feet: {[info.skeleton.names[j] for j in feet.joints]}"
    )
    timing["windows_s"] = time.perf_counter() - clock

    clock = time.perf_counter()
    path = workdir / "evaluator"
    inputs = np.asarray(generative.motion_inputs(positions, info.skeleton.up_axis, float(info.fps)))
    del positions
    if path.with_suffix(".npz").exists():
        evaluator = generative.load(path)
    else:
        e = g.evaluator
        labels = {k: np.searchsorted(vocab[k], train.labels[k]) for k in keys}
        take = np.arange(0, len(train), max(e.stride // g.window_stride, 1))
        log(f"evaluator: training on {len(take)} windows ({e.steps} steps)")
        evaluator = generative.train_evaluator(
            inputs[take],
            {k: v[take] for k, v in labels.items()},
            {k: len(v) for k, v in vocab.items()},
            dim=e.dim,
            features=e.features,
            steps=e.steps,
            batch_size=e.batch_size,
            learning_rate=e.learning_rate,
            seed=config.seed,
            log=lambda i, loss: log(f"  evaluator step {i}: loss {loss:.3f}"),
        )
        generative.save(evaluator, path, {k: len(v) for k, v in vocab.items()}, e.dim, e.features)
    timing["evaluator_s"] = time.perf_counter() - clock

    clock = time.perf_counter()
    z = codec.encode(train.features)
    stats = flow.LatentStats.fit(z)
    timing["encode_s"] = time.perf_counter() - clock
    s = Setup(
        config,
        workdir,
        info,
        codec,
        vocab,
        train,
        splits,
        feet,
        evaluator,
        stats,
        stats.standardize(z),
        None,
        None,
        timing,
    )
    s.labels = s.encode_labels(train)
    s.real = {}
    for split, w in splits.items():
        s.real[split] = s.score(w.features, w.offsets)
    for split, w in splits.items():
        acc = generative.accuracy(
            s.real[split]["predicted"], dict(zip(keys, s.encode_labels(w).T, strict=True))
        )
        log(
            f"evaluator accuracy on real {split} windows: "
            + ", ".join(f"{k} {v:.2f}" for k, v in acc.items())
        )
    return s


# ---------------------------------------------------------------------------------------------------------
# Generators


def generator_config(config, dynamics_weight: float | None = None):
    """``config.generation`` (with another ``dynamics_weight`` if given)."""
    g = copy.deepcopy(config.generation)
    if dynamics_weight is not None:
        g.dynamics_weight = dynamics_weight
    return g


def fit_generator(s: Setup, g, seed: int, path: Path | None = None):
    """A generator of ``g`` trained on ``s``'s latents (read from ``path``.npz when there)."""
    model = flow.make_generator(g, s.latents.shape[1], s.latents.shape[2], s.classes, seed)
    if path is not None and path.with_suffix(".npz").exists():
        graphdef, state = nnx.split(model)
        arrays = np.load(path.with_suffix(".npz"))
        leaves = [arrays[f"arr_{i}"] for i in range(len(arrays.files))]
        return nnx.merge(graphdef, jax.tree.unflatten(jax.tree.structure(state), leaves)), {}
    physics = None
    if g.dynamics_weight > 0:
        physics = flow.physics_term(
            s.codec, s.codec.state, s.stats, s.info, float(s.info.fps), dict(s.config.loss.dynamics)
        )
    log(f"generator: {g.steps} steps, dynamics weight {g.dynamics_weight:g}, seed {seed}")
    model, report = flow.train_generator(
        g,
        s.latents,
        s.labels,
        s.classes,
        seed=seed,
        physics=physics,
        log=lambda i, m: log(f"  step {i}: " + ", ".join(f"{k} {v:.4f}" for k, v in m.items())),
    )
    if path is not None:
        np.savez(path.with_suffix(".npz"), *[np.asarray(x) for x in jax.tree.leaves(nnx.state(model))])
    return model, report


def generate(s: Setup, model, labels, scales, key, physics: float | None = None) -> np.ndarray:
    """Standardized features ``[B, N, C, F]`` of samples for class ids ``labels [B, n_keys]``; ``physics``:
    the physics guidance scale (None: ``generation.physics_guidance``)."""
    g = s.config.generation
    physics = g.get("physics_guidance", 0.0) if physics is None else physics
    z = flow.sample(model, labels, scales, g.sample_steps, key, guide=s.guide if physics > 0 else None,
                    guide_scale=physics, guide_from=g.get("physics_guidance_from", 0.5))
    return s.codec.decode(s.stats.raw(z))


# ---------------------------------------------------------------------------------------------------------
# Evaluation


def _row(s: Setup, split: str, scored: list[dict], labels: np.ndarray, mm: float, rng) -> dict:
    """Mean (and spread over repeats) of FID, accuracy, diversity and plausibility of ``scored`` repeats."""
    real = s.real[split]["features"]
    keys = list(s.vocab)
    per = []
    for r in scored:
        acc = generative.accuracy(r["predicted"], dict(zip(keys, labels.T, strict=True)))
        per.append(
            {
                "fid": generative.fid(r["features"], real),
                **{f"accuracy_{k}": v for k, v in acc.items()},
                "diversity": generative.diversity(r["features"], s.config.generation.diversity_size, rng),
                **plausibility.mean(r["plausibility"]),
            }
        )
    row = {k: float(np.mean([p[k] for p in per])) for k in per[0]}
    row.update({f"{k}_std": float(np.std([p[k] for p in per])) for k in ("fid", "diversity")})
    row["multimodality"] = mm
    return row


def _retrieve(s: Setup, labels: np.ndarray, rng) -> np.ndarray:
    """Indices of training windows copied for ``labels [B, n_keys]``: one with the same labels at random;
    for a combination no training window has (an unseen pair), one with the most leading keys equal (the
    same content, another style)."""
    out = np.empty(len(labels), np.int64)
    for i, y in enumerate(labels):
        for n in range(labels.shape[1], -1, -1):
            match = np.flatnonzero((s.labels[:, :n] == y[:n]).all(-1))
            if match.size:
                out[i] = rng.choice(match)
                break
    return out


def evaluate_split(
    s: Setup,
    split: str,
    generators: dict,
    scales,
    seed: int,
    repeats: int,
    multimodality: bool = True,
    references: bool = True,
    physics: float | None = None,
) -> dict:
    """``{method: row}`` on ``split``: each generator (``{name: model}``, or ``{name: (model, physics
    guidance scale)}``) and (``references``) ``real``, ``retrieval`` and ``autoencoder``. A generator
    samples one window per real window of the split, with its labels, ``repeats`` times; multimodality
    from ``multimodality_samples`` samples of each condition. ``physics``: the guidance scale of a bare
    model (None: the config's)."""
    g, w = s.config.generation, s.splits[split]
    labels = s.encode_labels(w)
    rng = np.random.default_rng(seed)
    conditions = np.unique(labels, axis=0)
    per_condition = np.repeat(conditions, g.multimodality_samples, axis=0)
    mm_ids = np.repeat(np.arange(len(conditions)), g.multimodality_samples)
    rows = {}
    key = jax.random.key(seed)
    for name, model in generators.items():
        model, guidance = model if isinstance(model, tuple) else (model, physics)
        scored = [
            s.score(generate(s, model, labels, scales, jax.random.fold_in(key, r), guidance))
            for r in range(repeats)
        ]
        mm = float("nan")
        if multimodality:
            f = s.score(generate(s, model, per_condition, scales, jax.random.fold_in(key, 10_000), guidance))[
                "features"
            ]
            mm = generative.multimodality(f, mm_ids, g.multimodality_size, rng)
        rows[name] = _row(s, split, scored, labels, mm, rng)
    if not references:
        return rows
    # Retrieval: copies of training windows (real motion on their own bones), scored like samples.
    copies = []
    for _ in range(repeats):
        pick = _retrieve(s, labels, rng)
        copies.append(s.score(s.train.features[pick], s.train.offsets[pick]))
    mm_pick = _retrieve(s, per_condition, rng)
    mm = s.score(s.train.features[mm_pick], s.train.offsets[mm_pick])["features"]
    rows["retrieval"] = _row(
        s, split, copies, labels, generative.multimodality(mm, mm_ids, g.multimodality_size, rng), rng
    )
    # The real windows: FID of one half against the other (the floor FID can reach at this sample size).
    real = s.real[split]
    half = rng.permutation(len(w))
    a, b = half[: len(w) // 2], half[len(w) // 2 :]
    rows["real"] = _row(s, split, [real], labels, float("nan"), rng)
    rows["real"]["fid"] = generative.fid(real["features"][a], real["features"][b])
    rows["real"].pop("fid_std"), rows["real"].pop("diversity_std")
    # The autoencoder's reconstruction of the real windows (what its decoder alone does to them).
    recon = s.score(s.codec.decode(s.codec.encode(w.features)))
    rows["autoencoder"] = _row(s, split, [recon], labels, float("nan"), rng)
    for row in rows.values():
        row["windows"] = len(w)
        row["conditions"] = int(len(conditions))
    return rows


def choose_guidance(s: Setup, model, seed: int) -> tuple[tuple[float, ...], list]:
    """The guidance scales of ``generation.guidance_grid`` with the lowest FID on validation (one sample per
    validation window each, physics guidance off)."""
    w = s.splits["validation"]
    labels = s.encode_labels(w)
    tried = []
    for scales in s.config.generation.guidance_grid:
        # Without physics guidance: the label scales are its own choice, and guided sampling costs ~8x.
        scored = s.score(generate(s, model, labels, scales, jax.random.key(seed), physics=0.0))
        tried.append(
            (
                tuple(float(x) for x in scales),
                generative.fid(scored["features"], s.real["validation"]["features"]),
            )
        )
        log(f"  guidance {tried[-1][0]}: validation FID {tried[-1][1]:.3f}")
    return min(tried, key=lambda x: x[1])[0], tried


COLUMNS = (
    ("fid", "FID", "{:7.2f}"),
    ("accuracy_content", "acc c", "{:6.2f}"),
    ("accuracy_style", "acc s", "{:6.2f}"),
    ("diversity", "div", "{:6.2f}"),
    ("multimodality", "MM", "{:6.2f}"),
    ("foot_skate", "skate", "{:6.1f}"),
    ("penetration", "pen", "{:5.2f}"),
    ("floating", "float", "{:5.2f}"),
    ("jitter", "jitter", "{:7.0f}"),
    ("bone_error", "bone", "{:5.2f}"),
    ("root_force", "F root", "{:6.2f}"),
    ("root_torque", "T root", "{:6.2f}"),
)


def table(results: dict) -> list[str]:
    """One line per split x method."""
    lines = [
        f"{'split':13s} {'method':12s} " + " ".join(f"{h:>{len(fmt.format(0.0))}s}" for _, h, fmt in COLUMNS)
    ]
    for split, rows in results.items():
        for method, row in rows.items():
            cells = []
            for key, _, fmt in COLUMNS:
                v = row.get(key, float("nan"))
                cells.append(fmt.format(v) if np.isfinite(v) else f"{'-':>{len(fmt.format(0.0))}s}")
            lines.append(f"{split:13s} {method:12s} " + " ".join(cells))
    return lines


# ---------------------------------------------------------------------------------------------------------
# The experiment


def run_experiment(config, workdir) -> dict:
    """Every stage (see the module docstring); prints and returns the summary (``WORKDIR/summary.json``)."""
    workdir = Path(workdir)
    g = config.generation
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
    s = setup(config, workdir)
    timing = s.timing
    clock = time.perf_counter()
    generators, reports = {}, {}
    generators["generator"], reports["generator"] = fit_generator(s, g, config.seed, workdir / "generator")
    if g.dynamics_weight > 0:  # the same generator without it, the reference of the verdict
        generators["no_dynamics"], reports["no_dynamics"] = fit_generator(
            s, generator_config(config, 0.0), config.seed, workdir / "no_dynamics"
        )
    timing["generator_s"] = time.perf_counter() - clock

    clock = time.perf_counter()
    scales, tried = choose_guidance(s, generators["generator"], config.seed)
    log(f"guidance chosen on validation: content {scales[0]:g}, style {scales[-1]:g}")
    if g.get("physics_guidance", 0.0) > 0:  # the same samples' generator without it: the verdict's reference
        generators["no_physics"] = (generators["generator"], 0.0)
    results = {}
    for split in ("test", "unseen_pairs"):
        if split in s.splits:
            results[split] = evaluate_split(s, split, generators, scales, config.seed + 1, g.repeats)
    timing["evaluation_s"] = time.perf_counter() - clock
    export_samples(s, generators["generator"], scales, workdir, config.seed)
    lines = table(results)
    lines.append(
        f"guidance (content, style) = {scales}, chosen on validation FID among {[t[0] for t in tried]}"
    )
    lines.append(
        "real: the split's own windows (FID: one half against the other); retrieval: a training window "
        "of the same labels (same content for an unseen pair); autoencoder: the real windows through the "
        "frozen autoencoder"
    )
    summary = {
        "workdir": str(workdir),
        "guidance": list(scales),
        "guidance_tried": tried,
        "results": results,
        "timing": timing,
        "generators": {
            k: {"steps_per_s": v.get("steps_per_s"), "history": v.get("history")} for k, v in reports.items()
        },
        "feet": [s.info.skeleton.names[j] for j in s.feet.joints],
        "table": lines,
    }
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
    print("\n".join(lines), flush=True)
    return summary


def load(workdir, name: str = "generator"):
    """A finished run's ``(setup, generator, summary)`` from ``workdir`` (its ``config.json``; nothing is
    trained: every stage is read from disk)."""
    import ml_collections

    workdir = Path(workdir)
    config = ml_collections.ConfigDict(json.loads((workdir / "config.json").read_text()))
    if not (workdir / f"{name}.npz").exists():
        raise FileNotFoundError(
            f"{workdir / name}.npz: no trained generator; run motionjax train --config "
            f"experiments/generate.py --workdir {workdir} first"
        )
    s = setup(config, workdir)
    model, _ = fit_generator(s, config.generation, config.seed, workdir / name)
    summary = (
        json.loads((workdir / "summary.json").read_text()) if (workdir / "summary.json").exists() else {}
    )
    return s, model, summary


def export_samples(s: Setup, model, scales, workdir: Path, seed: int) -> None:
    """``export_samples`` samples of test conditions and of each unseen pair as BVH
    (``WORKDIR/samples/<content>_<style>_<i>.bvh``, on the dataset skeleton), their skeletons beside a real
    window of the same labels (``samples.png``), and a video of them (``samples.mp4``)."""
    g, info = s.config.generation, s.info
    out = workdir / "samples"
    out.mkdir(exist_ok=True)
    picks = []
    for split in ("test", "unseen_pairs"):
        if split not in s.splits:
            continue
        w = s.splits[split]
        labels = s.encode_labels(w)
        _, first = np.unique(labels, axis=0, return_index=True)
        take = np.sort(first)[: g.export_samples]
        picks += [(split, labels[i], w.features[i]) for i in take]
    if not picks:
        return
    x = generate(s, model, np.stack([p[1] for p in picks]), scales, jax.random.key(seed + 7))
    clips, f = {}, info.feature_dim
    for i, (split, y, real) in enumerate(picks):
        name = "_".join(s.vocab[k][c] for k, c in zip(s.vocab, y, strict=True))
        artifacts.export_bvh(
            out / f"{name}_{i}.bvh",
            info.skeleton,
            float(info.fps),
            x[i].reshape(-1, f),
            info.mean,
            info.std,
            name=name,
        )
        if len(clips) < 8:
            _, _, pos = latents.motion(info, np.stack([x[i], real]))
            clips[f"{name} (sample)"] = pos[0]
            clips[f"{name} (real, {split})"] = pos[1]
    artifacts.plot_skeletons(
        info.skeleton, clips, workdir / "samples.png", title="samples beside real windows"
    )
    if g.video_s > 0:
        frames = int(round(g.video_s * info.fps))
        video = {k: v[:frames] for k, v in list(clips.items())[::2][:4]}
        artifacts.render_video(
            info.skeleton, video, workdir / "samples.mp4", float(info.fps), title="samples"
        )
