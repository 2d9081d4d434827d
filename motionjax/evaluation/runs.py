"""A trained run on another corpus (``motionjax evaluate``): the trainer's final metrics table on
any prepared directory or motion files, with the run's own normalization and PCA reference.

:func:`corpus_for` finds or prepares the corpus (a prepared directory as it is, when its skeleton and
frame rate are the run's; motion files through :func:`.inference.prepare_corpus`, once, in the run's
units, frame rate, window and joint order); :func:`evaluate` scores the run on one of its splits with
the settings of the run's ``evals.final`` evaluator (inputs, noise level, references).
"""
from __future__ import annotations

import collections
import dataclasses
from pathlib import Path

from motionjax.data import corpus, prepare
from motionjax.data.info import INDEX, load_info
from motionjax.evaluation import evaluators, forecast, inference


def corpus_for(run, data, split: str = "test", cache_dir="data_cache/eval", log=print, dedup: bool = False):
    """The :class:`~motionjax.data.info.DatasetInfo` of ``data`` for ``run`` (a
    :class:`~motionjax.efficiency.trained.Trained`): a prepared directory (with ``index.json``), or motion
    files (a file, a directory or a glob) prepared under ``cache_dir`` with every clip in split ``split``
    and (unless ``dedup``) none dropped as a copy of another. ``log`` names each file left out and each
    clip scored on fewer frames or horizons than the others (:func:`coverage_notes`).
    Raises :class:`.inference.SkeletonMismatchError` naming the directory and what differs, or
    ``ValueError`` for a missing split or another frame rate."""
    spec = inference.ModelSpec.from_run(run.config, run.info)
    path = Path(data)
    if not (path / INDEX).exists():
        paths = prepare.resolve_sources(str(data))
        if not paths:
            raise FileNotFoundError(f"{data}: neither a prepared directory (no {INDEX}) nor motion files")
        info = inference.prepare_corpus(paths, spec, prepare.Settings.from_config(run.config.data), cache_dir,
                                        split, log, dedup=dedup)
    else:
        info = load_info(path)
        if corpus.topology(info.skeleton) != corpus.topology(run.info.skeleton):
            raise inference.SkeletonMismatchError(
                f"{path}: skeleton differs from the run's: "
                f"{corpus.topology_difference(info.skeleton, run.info.skeleton)} (the same tree in another "
                "joint order evaluates from its motion files, which are put in the run's order)")
        if abs(info.fps - spec.fps) > 1e-6:
            raise ValueError(f"{path} was prepared at {info.fps:g} fps, the run at {spec.fps:g}: evaluate "
                             "its motion files instead (they are resampled)")
        if split not in info.splits:
            raise ValueError(f"{path} has no split {split!r}; it has {sorted(info.splits)}")
        for s in info.skipped:
            log(f"skipped (when {path} was prepared) {s['path']}: {s['reason']}")
    for line in coverage_notes(run.config, info, split):
        log(line)
    return info


def coverage_notes(config, info, split: str) -> list[str]:
    """One line per clip of ``info``'s ``split`` that the run's final evaluation (``config.evals.final``)
    scores on less than the others: shorter than the window (padded; the padding is not scored; a
    forecaster's horizons past its end are not scored, and with no frame past the observed ones it is not
    scored at all), or frames cut by cleaning (``data.clean``)."""
    window, final = int(config.data.window), dict(config.evals.final)
    observed = int(config.data.observed) if final.get("kind") == "forecast" else 0
    horizons = forecast.horizon_frames(observed, window, info.fps,
                                       final.get("horizons_ms", forecast.HORIZONS_MS)) if observed else {}
    segments = info.splits[split]
    count = collections.Counter(c for c, _, _ in segments)
    covered = collections.Counter()
    for rows in info.splits.values():
        for c, b, e in rows:
            covered[c] += e - b
    lines = []
    for clip, begin, end in segments:
        n = end - begin
        name = info.names[clip] + (f" frames {begin}-{end}" if count[clip] > 1 else "")
        if n >= window:
            continue
        short = f"short: {name}: {n} frames, fewer than the run's {window}-frame window"
        if observed and n <= observed:
            lines.append(f"{short}, no more than the {observed} it observes: nothing to forecast, not scored")
        elif observed:
            missed = [f"{h} ms" for h, t in horizons.items() if t >= n]
            lines.append(f"{short}: scored on its {n - observed} predicted frames"
                         + (f", not at {', '.join(missed)}" if missed else ""))
        else:
            lines.append(f"{short}: scored on its {n} frames (the padding past them is not scored)")
    for clip in dict.fromkeys(c for c, _, _ in segments):
        if covered[clip] < info.frames[clip]:
            lines.append(f"cut: {info.names[clip]}: {covered[clip]} of its {info.frames[clip]} frames kept; "
                         f"cleaning (data.clean) left out the rest ({Path(info.data_dir) / 'cleaning.json'})")
    return lines


def evaluate(run, info, split: str = "test", references: dict | None = None) -> dict:
    """``{split: {input: {"model" | "input" | "pca": {metric: value}}}}`` (a forecasting run's
    ``evals.final.kind = "forecast"``: ``{split: {"clean": {"model" | BASELINE | "truth": ...}}}``,
    :class:`.evaluators.Forecast`): the run's model on ``info``'s
    ``split`` as its final evaluation scores it (``config.evals.final``: inputs, noise level,
    references, labels), the features standardized with the run's statistics (whatever window
    ``info`` was prepared with: its clips are cut into the run's windows) and the PCA reference fitted
    on the run's training data. ``references``: ``{name: run}``, the reference models trained beside
    it (:func:`motionjax.efficiency.trained.references` loads them), scored too, their ``model`` rows
    joining as ``name`` (as the trainer's table has them)."""
    results = _evaluate(run, info, split)
    for name, reference in (references or {}).items():
        for condition, rows in _evaluate(reference, info, split)[split].items():
            results[split][condition][name] = rows["model"]
    return results


def _evaluate(run, info, split: str) -> dict:
    final = dict(run.config.evals.final)
    kind = final.pop("kind", "metrics")
    for key in ("during", "splits"):
        final.pop(key, None)
    scored = dataclasses.replace(info, mean=run.info.mean, std=run.info.std, window=run.config.data.window)
    if kind == "forecast":  # a predictor: its horizon table beside the baselines
        return evaluators.Forecast(run.config, scored, splits=(split,), **final)(run.predict)
    metrics = evaluators.Metrics(run.config, scored, splits=(split,), reference_info=run.info, **final)
    return metrics(run.predict)


def heldout_motions(run, split: str = "test", clip: str | None = None, seconds: float | None = None,
                    noise_level: float | None = None) -> dict:
    """``{"input", "output", "truth"}`` motions of one clip of the run's ``split`` (named ``clip``, else the
    one whose frames move most: the highest mean dynamics score), up to ``seconds`` long: its input noised
    at ``noise_level`` (default the run's ``evals.clip.noise_level``), the model's output through
    overlapping windows, and the clip itself."""
    from motionjax.data import pipeline, transforms

    info, config = run.info, run.config
    segments = info.splits.get(split)
    if not segments:
        raise ValueError(f"the run's data has no split {split!r}; it has {sorted(info.splits)}")
    if clip is not None:
        segments = [s for s in segments if info.names[s[0]] == clip]
        if not segments:
            raise ValueError(f"no clip {clip!r} in split {split!r}")
    source = pipeline.ClipSource(info)
    clip_id, begin, end = max(segments, key=lambda s: float(source[s[0]]["score"][s[1]:s[2]].mean()))
    if seconds is not None:
        end = min(end, begin + round(seconds * info.fps))
    motion = inference.prepared_clip(info, clip_id, begin, end)
    noise = transforms.Noise.evaluation(config.data, config.evals.clip.noise_level if noise_level is None
                                        else noise_level)
    spec = inference.ModelSpec.from_run(config, info)
    return inference.compare(run.predict, spec, motion, noise, config.seed)
