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
from motionjax.evaluation import artifacts, generative, inference, intervals, plausibility
from motionjax.generation import flow, latents, stages

SPLITS = ("validation", "test", "unseen_pairs", "unseen_validation", "unseen_test")
REPORTED = ("test", "unseen_pairs", "unseen_test")  # the splits the table scores, once each


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

    @property
    def guide(self):
        """:func:`.flow.physics_cost` of this experiment (``generation.physics_terms``)."""
        return self.guide_of(self.config.generation.get("physics_terms", flow.UNNAMED_TERMS))

    def guide_of(self, terms):
        """:func:`.flow.physics_cost` of those terms (a tuple, or names joined by "+"), one object per set
        of terms (it keys the compiled sampler)."""
        terms = tuple(terms.split("+")) if isinstance(terms, str) else tuple(terms)
        cache = self.__dict__.setdefault("_guides", {})
        if terms not in cache:
            cache[terms] = flow.physics_cost(self.codec, self.codec.state, self.stats, self.info,
                                             float(self.info.fps), self.feet, terms)
        return cache[terms]

    @functools.cached_property
    def fit(self):
        """:func:`.flow.reconstruction_cost` of this experiment (one object: it keys the compiled sampler)."""
        return flow.reconstruction_cost(self.codec, self.codec.state, self.stats, self.info)

    def score(self, x, offsets=None, valid=None) -> dict:
        """Evaluator features, predicted classes and plausibility window sums of standardized features
        ``[K, N, C, F]`` (on ``offsets``; None: the skeleton's bones) over the frames ``valid [K, T]`` (None:
        all; a short clip's edge padding is left out of every measure)."""
        root, rotations, positions = latents.motion(self.info, x, offsets)
        inputs = generative.motion_inputs(positions, self.info.skeleton.up_axis, float(self.info.fps))
        features, predicted = generative.evaluate_features(self.evaluator, np.asarray(inputs), valid=valid)
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
    unseen = [s for s in info.splits if s.startswith("unseen")]
    if unseen:
        found = {
            tuple(info.labels[c].get(k, "none") for k in config.generation.labels)
            for s in unseen
            for c, _, _ in info.splits[s]
        }
        if found != pairs:
            raise ValueError(
                f"{config.data.dir}: the splits {unseen} hold the pairs {sorted(found)}, the config states "
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
    # A mirrored window can carry a held-out pair (walk-turn-left/normal mirrored walks turning right,
    # normally: an unseen pair of Bandai-2): left out, so no stage sees those pairs.
    held = {tuple(p.split("/")) for p in g.unseen_pairs}
    keep = np.array([pair not in held for pair in zip(*(train.labels[k] for k in keys), strict=True)], bool)
    if not keep.all():
        log(f"{int((~keep).sum())} mirrored training windows of held-out pairs left out")
        train = train.take(np.flatnonzero(keep))
    splits = {
        s: latents.split_windows(config.data, info, s, config.data.eval_stride, keys)
        for s in SPLITS
        if s in info.splits
    }
    vocab = {k: sorted(set(train.labels[k])) for k in keys}
    _, _, positions = latents.motion(info, train.features, train.offsets)
    feet = plausibility.Feet.fit(info.skeleton, positions, standard=tuple(g.get("skating_joints", ())),
                                 band_m=float(g.get("skating_band_m", 0.05)), valid=train.valid)
    log(
        f"windows of {config.data.window} frames: {len(train)} training "
        f"({int(train.mirrored.sum())} mirrored), "
        + ", ".join(f"{len(w)} {s}" for s, w in splits.items())
        + f"; feet: {[info.skeleton.names[j] for j in feet.joints]}; skating ratio on "
        f"{[info.skeleton.names[j] for j in feet.standard]} within {100 * feet.band_m:g} cm of the floor"
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
            valid=train.valid[take],
        )
        generative.save(evaluator, path, {k: len(v) for k, v in vocab.items()}, e.dim, e.features)
    timing["evaluator_s"] = time.perf_counter() - clock

    clock = time.perf_counter()
    z = codec.encode(train.features)
    stats = flow.LatentStats.fit(z)
    timing["encode_s"] = time.perf_counter() - clock
    # What sampling from the run needs beyond the stages' files (load_sampler: no windows recomputed).
    (workdir / "sampler.json").write_text(json.dumps({
        "vocab": vocab, "latent_shape": list(z.shape[1:]), "latent_mean": stats.mean.tolist(),
        "latent_std": stats.std.tolist(), "feet": dataclasses.asdict(feet)}))
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
        s.real[split] = s.score(w.features, w.offsets, w.valid)
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


def generate(s: Setup, model, labels, scales, key, physics: float | None = None, terms=None,
             guide_from: float | None = None, sampler: str | None = None,
             steps: int | None = None) -> np.ndarray:
    """Standardized features ``[B, N, C, F]`` of samples for class ids ``labels [B, n_keys]``; ``physics``:
    the physics guidance scale, ``terms`` its cost's terms (:func:`.flow.physics_cost`,
    :meth:`Setup.guide_of`), ``guide_from`` the flow time it starts at, ``sampler`` and ``steps`` the ODE
    steps (:func:`.flow.sample`; None: ``generation.physics_guidance``, ``physics_terms``,
    ``physics_guidance_from``, ``sampler``, ``sample_steps``)."""
    g = s.config.generation
    physics = g.get("physics_guidance", 0.0) if physics is None else physics
    guide = None if physics <= 0 else s.guide if terms is None else s.guide_of(terms)  # built when used
    guide_from = g.get("physics_guidance_from", 0.5) if guide_from is None else guide_from
    z = flow.sample(model, labels, scales, steps or g.sample_steps, key, guide=guide, guide_scale=physics,
                    guide_from=guide_from, sampler=sampler or flow.sampler_of(g))
    return s.codec.decode(s.stats.raw(z))


# ---------------------------------------------------------------------------------------------------------
# Evaluation


def halves(w: latents.Windows, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    """Window indices ``(a, b)`` of two halves of a split's clips (whole clips, at random): FID compares a
    method's windows of ``a`` with the real windows of ``b``, the real reference the real windows of
    ``a`` with those of ``b``, so every FID of a split has the same sample sizes and the same reference
    set, and overlapping windows of one clip never land on both sides. A split of one clip is cut in
    time instead (first and second half of its windows; ``"windows"``)."""
    clips = np.unique(w.clip)
    if len(clips) < 2:
        n = len(w) // 2
        return np.arange(n), np.arange(n, len(w)), "windows"
    pick = np.random.default_rng(seed).permutation(clips)[: len(clips) // 2]
    inside = np.isin(w.clip, pick)
    return np.flatnonzero(inside), np.flatnonzero(~inside), "clips"


def _fid_statistic(fa, ra, rb, a_clips, b_clips, ratio: bool):
    """``(statistic(indices), clips)`` for :func:`intervals.statistic_interval`: FID of ``fa`` (a method's
    windows of half a) against ``rb`` (the real windows of half b), or its ratio to the real reference
    FID(``ra``, ``rb``) on the same resampled clips."""
    n = len(fa)

    def statistic(idx):
        ia, ib = idx[idx < n], idx[idx >= n] - n
        value = generative.fid(fa[ia], rb[ib])
        return value / generative.fid(ra[ia], rb[ib]) if ratio else value

    return statistic, np.concatenate([a_clips, b_clips])


def _row(s: Setup, split: str, scored: dict, labels: np.ndarray, mm: float, seed: int, cut) -> dict:
    """FID (this method's windows of half a against the real ones of half b, :func:`halves`), its ratio
    to the real reference, label accuracy, diversity and the plausibility metrics of ``scored`` (one
    window per real window of ``split``), each with a 95% bootstrap interval over the split's clips
    (:mod:`motionjax.evaluation.intervals`): ``row[k]`` the value, ``row[k + "_ci"]`` ``[lo, hi]``."""
    w, real = s.splits[split], s.real[split]["features"]
    a, b, _ = cut
    clips = w.clip
    row = {}

    def put(key, interval):
        row[key] = interval.get("mean", interval.get("value"))
        # None where a replicate left a half without windows (a split of a few clips: the tests' only)
        ends = [interval["lo"], interval["hi"]]
        row[key + "_ci"] = ends if np.isfinite(ends).all() else None

    f = scored["features"]
    for key, ratio in (("fid", False), ("fid_ratio", True)):
        statistic, ids = _fid_statistic(f[a], real[a], real[b], clips[a], clips[b], ratio)
        put(key, intervals.statistic_interval(statistic, ids, seed=seed))
    for i, key in enumerate(s.vocab):
        correct = scored["predicted"][key] == labels[:, i]
        put(f"accuracy_{key}", intervals.mean_interval(correct, clips, seed=seed))
    size = s.config.generation.diversity_size
    put("diversity", intervals.statistic_interval(
        lambda idx: generative.diversity(f[idx], size, np.random.default_rng(seed)), clips, seed=seed))
    for key, (sums, counts) in scored["plausibility"].items():
        put(key, intervals.mean_interval(sums / np.maximum(counts, 1.0), clips, counts, seed=seed))
    row["multimodality"] = mm
    row["windows"], row["fid_windows"] = len(w), [len(a), len(b)]
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
    multimodality: bool = True,
    references: bool = True,
    physics: float | None = None,
    scored_out: dict | None = None,
) -> dict:
    """``{method: row}`` on ``split`` (:func:`_row`): each generator (``{name: model}``, or ``{name: (model,
    physics guidance scale[, cost terms, from, sampler, steps])}``, :func:`generate`'s arguments) and
    (``references``) ``real`` (the split's own windows: FID the real reference at the same sample sizes,
    accuracy the evaluator's ceiling), ``retrieval`` and ``autoencoder``. A generator samples one window
    per real window of the split, with its labels, scored over that window's valid frames (the same
    frames as the real one); multimodality from ``multimodality_samples`` samples of each condition.
    ``physics``: the guidance scale of a bare model (None: the config's). ``scored_out``: filled with each
    method's per-window scores (:meth:`Setup.score`) for :func:`per_content`."""
    g, w = s.config.generation, s.splits[split]
    labels = s.encode_labels(w)
    rng = np.random.default_rng(seed)
    cut = halves(w, seed)
    conditions = np.unique(labels, axis=0)
    per_condition = np.repeat(conditions, g.multimodality_samples, axis=0)
    mm_ids = np.repeat(np.arange(len(conditions)), g.multimodality_samples)
    rows, scored_all = {}, {} if scored_out is None else scored_out
    key = jax.random.key(seed)
    for name, model in generators.items():
        model, *guidance = model if isinstance(model, tuple) else (model, physics)
        scored = s.score(generate(s, model, labels, scales, key, *guidance), None, w.valid)
        mm = float("nan")
        if multimodality:
            x = generate(s, model, per_condition, scales, jax.random.fold_in(key, 10_000), *guidance)
            f = s.score(x)["features"]
            mm = generative.multimodality(f, mm_ids, g.multimodality_size, rng)
        scored_all[name] = scored
        rows[name] = _row(s, split, scored, labels, mm, seed, cut)
    if not references:
        return rows
    # Retrieval: copies of training windows (real motion on their own bones and frames), scored like samples.
    pick = _retrieve(s, labels, rng)
    copies = s.score(s.train.features[pick], s.train.offsets[pick], s.train.valid[pick])
    mm_pick = _retrieve(s, per_condition, rng)
    mm = s.score(s.train.features[mm_pick], s.train.offsets[mm_pick])["features"]
    scored_all["retrieval"] = copies
    mm = generative.multimodality(mm, mm_ids, g.multimodality_size, rng)
    rows["retrieval"] = _row(s, split, copies, labels, mm, seed, cut)
    # The real windows: FID the reference (half a against half b), accuracy the evaluator's ceiling.
    scored_all["real"] = s.real[split]
    rows["real"] = _row(s, split, s.real[split], labels, float("nan"), seed, cut)
    rows["real"].pop("fid_ratio"), rows["real"].pop("fid_ratio_ci")
    # The autoencoder's reconstruction of the real windows (what its decoder alone does to them).
    scored_all["autoencoder"] = recon = s.score(s.codec.decode(s.codec.encode(w.features)), None, w.valid)
    rows["autoencoder"] = _row(s, split, recon, labels, float("nan"), seed, cut)
    for row in rows.values():
        row["conditions"] = int(len(conditions))
        row["clips"] = int(len(np.unique(w.clip)))
        row["fid_halves"] = cut[2]
    return rows


def per_content(s: Setup, split: str, scored: dict, seed: int) -> dict:
    """``{content: {method: {...}}}``: per content value of ``split``, each method's FID against the real
    windows of that content (halves by clip as :func:`halves`; the real reference beside it), accuracy
    and the skating ratio; ``scored``: :func:`evaluate_split`'s ``scored_out``."""
    w = s.splits[split]
    labels = s.encode_labels(w)
    a, b, _ = halves(w, seed)
    key = next(iter(s.vocab))
    out = {}
    for c, value in enumerate(s.vocab[key]):
        mine = labels[:, 0] == c
        if not mine.any():
            continue
        ia, ib = a[mine[a]], b[mine[b]]
        real = s.real[split]["features"]
        rows = {}
        for method, sc in scored.items():
            row = {"windows": int(mine.sum()), "fid": generative.fid(sc["features"][ia], real[ib])}
            for i, k in enumerate(s.vocab):
                row[f"accuracy_{k}"] = float(np.mean(sc["predicted"][k][mine] == labels[mine, i]))
            sums, counts = sc["plausibility"]["skate_ratio"]
            row["skate_ratio"] = float(sums[mine].sum() / max(counts[mine].sum(), 1.0))
            rows[method] = row
        out[value] = rows
    return out


def choose_guidance(s: Setup, model, seed: int) -> tuple[tuple[float, ...], list]:
    """The guidance scales of ``generation.guidance_grid`` with the lowest FID on validation (one sample per
    validation window each, over its valid frames, physics guidance off)."""
    w = s.splits["validation"]
    labels = s.encode_labels(w)
    tried = []
    for scales in s.config.generation.guidance_grid:
        # Without physics guidance: the label scales are its own choice, and guided sampling costs ~8x.
        scored = s.score(generate(s, model, labels, scales, jax.random.key(seed), physics=0.0), None, w.valid)
        tried.append(
            (
                tuple(float(x) for x in scales),
                generative.fid(scored["features"], s.real["validation"]["features"]),
            )
        )
        log(f"  guidance {tried[-1][0]}: validation FID {tried[-1][1]:.3f}")
    return min(tried, key=lambda x: x[1])[0], tried


COLUMNS = (  # (key, heading, digits): the printed table; summary.json has every metric
    ("fid", "FID", 1),
    ("fid_ratio", "FID/ref", 2),
    ("accuracy_content", "acc content", 2),
    ("accuracy_style", "acc style", 2),
    ("diversity", "diversity", 1),
    ("multimodality", "MM", 1),
    ("skate_ratio", "skate ratio", 3),
    ("skate_ratio_avg5", "skate ratio 5f", 3),
    ("contact", "contact", 2),
    ("foot_skate", "skate cm/s (ours)", 1),
    ("penetration", "penetr. cm", 2),
    ("floating", "float cm", 2),
    ("jitter", "jitter", 0),
    ("root_force", "F root N/kg", 1),
)


def cell(row: dict, key: str, digits: int) -> str:
    """``"v [lo, hi]"`` (``"v"`` without an interval, ``"-"`` when absent)."""
    v = row.get(key, float("nan"))
    if v is None or not np.isfinite(v):
        return "-"
    ci = row.get(key + "_ci")
    return f"{v:.{digits}f}" + (f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci else "")


def table(results: dict) -> list[str]:
    """A markdown table, one line per split x method, values with their 95% intervals over clips."""
    lines = ["| split | method | " + " | ".join(h for _, h, _ in COLUMNS) + " |",
             "|---|---|" + "---:|" * len(COLUMNS)]
    for split, rows in results.items():
        for method, row in rows.items():
            head = f"{split} ({row.get('windows', '?')} windows, {row.get('clips', '?')} clips)"
            cells = [cell(row, k, d) for k, _, d in COLUMNS]
            lines.append(f"| {head} | {method} | " + " | ".join(cells) + " |")
    return lines


def content_table(per: dict) -> list[str]:
    """:func:`per_content`'s ``{split: {content: {method: row}}}`` as a markdown table."""
    lines = ["| split | content | windows | method | FID | acc content | acc style | skate ratio |",
             "|---|---|---:|---|---:|---:|---:|---:|"]
    for split, contents in per.items():
        for content, rows in contents.items():
            for method, r in rows.items():
                lines.append(f"| {split} | {content} | {r['windows']} | {method} | {r['fid']:.1f} | "
                             f"{r['accuracy_content']:.2f} | {r.get('accuracy_style', float('nan')):.2f} | "
                             f"{r['skate_ratio']:.3f} |")
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
    results, contents = {}, {}
    for split in REPORTED:
        if split in s.splits:
            scored = {}
            results[split] = evaluate_split(s, split, generators, scales, config.seed + 1, scored_out=scored)
            contents[split] = per_content(s, split, scored, config.seed + 1)
    timing["evaluation_s"] = time.perf_counter() - clock
    export_samples(s, generators["generator"], scales, workdir, config.seed)
    lines = table(results)
    lines.append(
        f"guidance (content, style) = {scales}, chosen on validation FID among {[t[0] for t in tried]}"
    )
    names = s.info.skeleton.names
    lines.append(
        "FID: a method's windows of one half of the split's clips against the real windows of the other "
        "half; real: the real windows of the first half (the reference at the same sample sizes), its "
        "accuracy the evaluator's ceiling; FID/ref: the ratio to it on the same resampled clips; "
        "retrieval: a training window of the same labels (same content for an unseen pair); autoencoder: "
        "the real windows through the frozen autoencoder; [lo, hi]: 95% bootstrap over clips; skate "
        f"ratio: {[names[j] for j in s.feet.standard]} within {100 * s.feet.band_m:g} cm of the floor "
        "moving > 0.5 m/s (5f: also its 5-frame mean speed); padding frames are left out everywhere"
    )
    lines += ["", "per content (FID against the real windows of that content, halves by clip):"]
    lines += content_table(contents)
    summary = {
        "workdir": str(workdir),
        "guidance": list(scales),
        "guidance_tried": tried,
        "results": results,
        "timing": timing,
        "generators": {
            k: {"steps_per_s": v.get("steps_per_s"), "history": v.get("history")} for k, v in reports.items()
        },
        "per_content": contents,
        "feet": [s.info.skeleton.names[j] for j in s.feet.joints],
        "skating": {"joints": [s.info.skeleton.names[j] for j in s.feet.standard], "band_m": s.feet.band_m},
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


def load_sampler(workdir, name: str = "generator"):
    """:func:`load` without the windows: ``(setup, generator, summary)`` with what sampling and editing
    need (the autoencoder, the evaluator, the labels, the latent statistics, the feet, from
    ``WORKDIR/sampler.json``); ``setup.train``, ``splits``, ``real`` are empty. Falls back to :func:`load`
    for a run without ``sampler.json``."""
    import ml_collections

    from motionjax.efficiency import trained

    workdir = Path(workdir)
    if not (workdir / "sampler.json").exists():
        return load(workdir, name)
    config = ml_collections.ConfigDict(json.loads((workdir / "config.json").read_text()))
    if not (workdir / f"{name}.npz").exists():
        raise FileNotFoundError(f"{workdir / name}.npz: no trained generator; run motionjax train --config "
                                f"experiments/generate.py --workdir {workdir} first")
    g, meta = config.generation, json.loads((workdir / "sampler.json").read_text())
    step = g.autoencoder_step if g.autoencoder_step in ("best", "latest") else int(g.autoencoder_step)
    ae = trained.load(stages.autoencoder_dir(config, workdir), step)
    info = dataset(config, ae)
    feet = meta["feet"]
    s = Setup(config, workdir, info, latents.Codec(ae.model, config.data.chunk), meta["vocab"], None, {},
              plausibility.Feet(**{k: tuple(v) if isinstance(v, list) else v for k, v in feet.items()}),
              generative.load(workdir / "evaluator"),
              flow.LatentStats(meta["latent_mean"], meta["latent_std"]),
              np.zeros((0, *meta["latent_shape"]), np.float32), None, {}, {})
    model, _ = fit_generator(s, g, config.seed, workdir / name)
    done = workdir / "summary.json"
    summary = json.loads(done.read_text()) if done.exists() else {}
    return s, model, summary


def export_samples(s: Setup, model, scales, workdir: Path, seed: int) -> None:
    """``export_samples`` samples of test conditions and of each unseen pair as BVH
    (``WORKDIR/samples/<content>_<style>_<i>.bvh``, on the dataset skeleton), their skeletons beside a real
    window of the same labels (``samples.png``), and a video of them (``samples.mp4``)."""
    g, info = s.config.generation, s.info
    out = workdir / "samples"
    out.mkdir(exist_ok=True)
    picks = []
    for split in REPORTED:
        if split not in s.splits:
            continue
        w = s.splits[split]
        labels = s.encode_labels(w)
        _, first = np.unique(labels, axis=0, return_index=True)
        take = np.sort(first)[: g.export_samples]
        picks += [(split, labels[i], w.features[i], info.names[w.clip[i]]) for i in take]
    if not picks:
        return
    x = generate(s, model, np.stack([p[1] for p in picks]), scales, jax.random.key(seed + 7))
    clips, f = {}, info.feature_dim
    sources = inference.source_files(s.config.data, info)
    for i, (split, y, real, clip) in enumerate(picks):
        name = "_".join(s.vocab[k][c] for k, c in zip(s.vocab, y, strict=True))
        # In the units and hierarchy of the real clip of the same labels (the corpus's own files).
        artifacts.export_bvh(
            out / f"{name}_{i}.bvh",
            info.skeleton,
            float(info.fps),
            x[i].reshape(-1, f),
            info.mean,
            info.std,
            name=name,
            source=sources.get(clip),
            units=s.config.data.units,
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
