"""The evaluators an experiment declares (``config.evals``), as in big_vision: each entry names a
``kind`` and its settings, and the trainer runs them without knowing what they measure.

``config.evals.NAME = {"kind": KIND, ...settings}``; an entry with ``during = True`` also runs every
``train.eval_every`` steps (its ``SPLIT/METRIC`` scalars are the learning curves, and
``train.best_metric`` among them picks the best checkpoint); every entry runs once at the end, on
the test split too where it is named (nothing is chosen there). The kinds (:data:`KINDS`):

* ``metrics``: the motion metrics of :mod:`motionjax.evaluation.metrics` on ``splits`` x ``inputs``
  (``"clean"``, ``"noisy"`` at ``noise_level``), with reference rows (``references``: ``"input"``, the
  input's own error; ``"pca"``, a per-frame PCA with the model's numbers per frame) and the per-label
  breakdown (``by_label``, plotted per split and input);
* ``forecast``: a forecaster beside the zero- and constant-velocity baselines, per horizon
  (:class:`Forecast`, :mod:`motionjax.evaluation.forecast`);
* ``clip``: one held-out window of ``split`` at ``noise_level``, drawn as skeletons (input / output /
  truth) and exported as BVH, and its clip (``video_s`` seconds) as a video of the three side by side;
* ``corpus``: another corpus's motion files scored as ``final`` scores the run's splits (:class:`Corpus`:
  Bandai-1 for a Bandai-2 run, the cross-corpus test).

Every MPJPE carries its 95% bootstrap interval over clips (:mod:`.intervals`, docs/protocol.md).

Each evaluator is built once per run (its windows are cached) and called with ``predict``: ``x [B, N,
C, F] -> [B, N, C, F]`` (numpy, standardized features). Every process calls it (prediction is one
program over all devices); only the caller that passes ``workdir`` writes files (process 0).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from motionjax.data import pipeline, transforms
from motionjax.evaluation import artifacts, forecast, inference, intervals, metrics


class Metrics:
    """Motion metrics of the model (and reference rows) on ``splits`` x ``inputs``."""

    def __init__(self, config, info, *, splits, inputs=("clean",), noise_level: float = 0.0,
                 references=(), by_label: bool = False, during: bool = False, reference_info=None):
        """``reference_info``: the run's own dataset when ``info`` is another corpus (the PCA reference
        is fitted on the run's training frames, never on the frames it is scored on)."""
        self.info, self.during, self.references = info, during, tuple(references)
        self.labels = (getattr(info, "labels", None) or None) if by_label else None
        self.args = (info.skeleton, float(info.fps), info.mean, info.std, config.loss.contact_speed)
        levels = {"clean": 0.0, "noisy": noise_level}
        batches = lambda split, level: pipeline.make_eval_batches(config.data, info, split, level,
                                                                  seed=config.seed)
        self.sets = {(split, condition): batches(split, levels[condition])
                     for split in splits for condition in inputs}
        self.pca = _pca_reference(config, reference_info or info) if "pca" in self.references else None

    def __call__(self, predict, workdir: Path | None = None) -> dict:
        """``{split: {input: {"model": {metric: v}, "input": {...}, "pca": {...}}}}``; with ``workdir``
        the per-label plots are written there."""
        results = {}
        for (split, condition), batches in self.sets.items():
            model = metrics.evaluate(predict, batches, *self.args, labels=self.labels, per_window=True)
            windows = model.pop("windows", None)
            row = {"model": model, "input": {k: model.pop(f"input_{k}") for k in metrics.INPUT_METRICS}}
            if windows is not None:
                _add_intervals(row, windows)
            if "input" not in self.references:
                row.pop("input")
            if self.pca is not None:
                row["pca"] = {k: v for k, v in metrics.evaluate(self.pca, batches, *self.args).items()
                              if not k.startswith("input_")}
            results.setdefault(split, {})[condition] = row
            if workdir is not None and model.get("by_label"):
                path = workdir / f"by_label_{split}_{condition}.png"
                artifacts.plot_label_breakdown(model["by_label"], path, title=f"{split}, {condition} input:")
        return results

    @staticmethod
    def scalars(results: dict) -> dict:
        """The model's metrics as ``{"SPLIT/METRIC": v}`` (clean input) and ``{"SPLIT/INPUT/METRIC":
        v}`` (others): the learning curves and the best-checkpoint metric."""
        return {(f"{split}/{k}" if condition == "clean" else f"{split}/{condition}/{k}"): v
                for split, rows in results.items() for condition, row in rows.items()
                for k, v in row["model"].items() if isinstance(v, float)}


class Clip:
    """One held-out window of ``split``: skeleton figure and BVH of input / reconstruction / truth; and
    (``video_s > 0``) that window's clip, up to ``video_s`` seconds of its ``split`` segment, through the
    model window by window and blended (:func:`.inference.apply_motion`), as ``heldout_clip.mp4``."""

    def __init__(self, config, info, *, split: str, noise_level: float = 0.0, video_s: float = 10.0,
                 during: bool = False):
        self.info, self.split, self.noise_level, self.during = info, split, noise_level, during
        batches = pipeline.make_eval_batches(config.data, info, split, noise_level, seed=config.seed)
        self.batch = batches[0]
        self.video = None
        # The BVH files are written in the units and hierarchy of the window's own source file.
        first = info.names[info.splits[split][0][0]] if info.names else None
        self.source = inference.source_files(config.data, info).get(first) if config.data.get("source") \
            is not None and first is not None and info.data_dir else None
        self.units = config.data.get("units", "auto")
        if video_s > 0:
            clip_id, begin, end = info.splits[split][0]  # the first window's segment (make_eval_batches)
            end = min(end, begin + round(video_s * info.fps))
            motion = inference.prepared_clip(info, clip_id, begin, end)
            self.video = (inference.ModelSpec.from_run(config, info), motion,
                          transforms.Noise.evaluation(config.data, noise_level), config.seed)

    def __call__(self, predict, workdir: Path | None = None) -> dict:
        info, batch = self.info, self.batch
        output = predict(batch["noisy"])  # every process joins the prediction
        motions = None
        if self.video is not None:
            spec, motion, noise, seed = self.video
            motions = inference.compare(predict, spec, motion, noise, seed)
        if workdir is None:
            return {}
        if motions is not None:
            artifacts.render_video(info.skeleton, {k: m.positions() for k, m in motions.items()},
                                   workdir / "heldout_clip.mp4", info.fps,
                                   title=f"{motion.name}, noise level {self.noise_level}")
        pick = lambda x: np.asarray(x)[:1].reshape(-1, info.mean.shape[-1])  # first window -> [T, F]
        clip = {"noisy": pick(batch["noisy"]), "reconstructed": pick(output), "truth": pick(batch["clean"])}
        artifacts.plot_skeletons(
            info.skeleton, {k: metrics.feature_positions(info.skeleton, v, info.mean, info.std)
                            for k, v in clip.items()},
            workdir / "heldout_clip.png", title=f"{self.split}, noise level {self.noise_level}")
        for name, features in clip.items():
            artifacts.export_bvh(workdir / f"heldout_{name}.bvh", info.skeleton, float(info.fps), features,
                                 info.mean, info.std, name=name, source=self.source, units=self.units)
        return {}


class Forecast:
    """A forecaster (it sees ``data.observed`` frames of each window) beside the ``baselines``
    (:data:`motionjax.evaluation.forecast.BASELINES`) on ``splits``: MPJPE at each of ``horizons_ms``
    and over the predicted frames, their plausibility, and the truth's
    (:func:`motionjax.evaluation.forecast.evaluate`). Rows ``{split: {"clean": {"model": {...},
    BASELINE: {...}, "truth": {...}}}}`` (the scalars ``SPLIT/mpjpe``, ``SPLIT/mpjpe_400ms``, ...); the
    baselines and the truth are scored once and kept."""

    def __init__(self, config, info, *, splits, baselines=("zero_velocity", "constant_velocity"),
                 horizons_ms=forecast.HORIZONS_MS, during: bool = False):
        if not config.data.observed:
            raise ValueError("evals kind 'forecast' needs data.observed > 0 (the frames the model sees)")
        unknown = sorted(set(baselines) - set(forecast.BASELINES))
        if unknown:
            raise ValueError(f"forecast baselines {unknown}: expected some of {sorted(forecast.BASELINES)}")
        self.during, self.observed, self.horizons = during, int(config.data.observed), tuple(horizons_ms)
        self.args = (info.skeleton, float(info.fps), info.mean, info.std, config.loss.contact_speed)
        self.sets = {split: pipeline.make_eval_batches(config.data, info, split, 0.0, seed=config.seed)
                     for split in splits}
        bind = lambda f: lambda x: f(x, self.observed, info.skeleton, info.mean, info.std)
        self.baselines = {name: bind(forecast.BASELINES[name]) for name in baselines}
        self._kept = {}  # split -> the baselines' and the truth's rows

    def __call__(self, predict, workdir: Path | None = None) -> dict:
        results = {}
        for split, batches in self.sets.items():
            score = lambda methods, truth, batches=batches: forecast.evaluate(
                methods, batches, *self.args, observed=self.observed, horizons_ms=self.horizons, truth=truth,
                per_window=True)
            if split not in self._kept:
                self._kept[split] = score(self.baselines, True)
            results[split] = {"clean": _forecast_intervals({**score({"model": predict}, False),
                                                            **self._kept[split]})}
            if workdir is not None:
                artifacts.plot_forecast_horizons(results[split]["clean"], workdir / f"forecast_{split}.png",
                                                 title=f"{split}: {self.observed} frames observed")
        return results


class Corpus:
    """The model on another corpus's motion files, every clip in one split ``name`` (Bandai-1 for a
    Bandai-2 run: the cross-corpus test, docs/protocol.md): ``sources`` (directories or globs) prepared
    once with the run's settings and joint order (:func:`.inference.prepare_corpus`, into ``cache``),
    standardized with the run's statistics, and scored as ``evals.final`` scores the run's own splits
    (its kind and settings; no reference rows fitted on the run's data, no per-label breakdown). Rows
    ``{name: ...}`` as that evaluator's; none (a line says why) when none of the files is there (a
    clone without that corpus)."""

    def __init__(self, config, info, *, sources, name: str, cache: str = "data_cache/eval",
                 during: bool = False):
        import dataclasses

        from motionjax.data import prepare
        self.during, self.evaluator = during, None
        paths = sorted({p for s in sources for p in prepare.resolve_sources(str(s))})
        if not paths:
            print(f"evaluation {name}: no motion files at {list(sources)}; not scored", flush=True)
            return
        other = inference.prepare_corpus(paths, inference.ModelSpec.from_run(config, info),
                                         prepare.Settings.from_config(config.data), cache, name,
                                         log=lambda line: print(f"evaluation {name}: {line}", flush=True))
        scored = dataclasses.replace(other, mean=info.mean, std=info.std, window=config.data.window)
        final = dict(config.evals.final)
        kind = final.pop("kind")
        for key in ("splits", "during", "references", "by_label"):
            final.pop(key, None)
        self.evaluator = KINDS[kind](config, scored, splits=(name,), **final)

    def __call__(self, predict, workdir: Path | None = None) -> dict:
        return {} if self.evaluator is None else self.evaluator(predict, workdir)


def _add_intervals(row: dict, windows: dict) -> None:
    """95% intervals over clips (:mod:`.intervals`) of the model's :data:`metrics.INTERVAL_METRICS`
    (``row["model"]["intervals"]``) and, for a corrupted input, of the input's and of the model's
    error as a share of its input's, paired per clip (``row["model"]["ratio_to_input"]``), in place."""
    clips = windows["clip"]
    ci = lambda prefix: {k: intervals.from_sums(*windows[prefix + k], clips)
                         for k in metrics.INTERVAL_METRICS}
    row["model"]["intervals"] = ci("")
    if row["input"]["mpjpe"] > 0:
        row["input"]["intervals"] = ci("input_")
        row["model"]["ratio_to_input"] = {
            k: intervals.ratio_from_sums(windows[k][0], windows["input_" + k][0], windows[k][1], clips)
            for k in metrics.INTERVAL_METRICS}


def _forecast_intervals(rows: dict) -> dict:
    """The forecast ``rows`` with each method's per-window values (``windows``) turned into 95%
    intervals over clips of its MPJPE at each horizon and over the predicted frames (``intervals``),
    and, beside the zero-velocity baseline, of its ratio to that baseline, paired per clip
    (``ratio_to_zero_velocity``). The rows given are not changed (the baselines' are kept per split)."""
    zero = rows.get("zero_velocity", {}).get("windows")
    out = {}
    for method, row in rows.items():
        row = dict(row)
        windows = row.pop("windows", None)
        if windows is not None:
            keys = [k for k in windows if k != "clip"]
            row["intervals"] = {k: intervals.from_sums(*windows[k], windows["clip"]) for k in keys}
            if zero is not None and method != "zero_velocity":
                row["ratio_to_zero_velocity"] = {
                    k: intervals.ratio_from_sums(windows[k][0], zero[k][0], windows[k][1], windows["clip"])
                    for k in keys if k in zero}
        out[method] = row
    return out


KINDS = {"metrics": Metrics, "clip": Clip, "forecast": Forecast, "corpus": Corpus}


def build(config, info, during: bool | None = None) -> dict:
    """``{name: evaluator}`` of ``config.evals`` (with ``during``: only those that run, or do not run,
    during training)."""
    out = {}
    for name, spec in config.evals.items():
        spec = dict(spec)
        if during is not None and bool(spec.get("during", False)) != during:
            continue
        kind = spec.pop("kind")
        out[name] = KINDS[kind](config, info, **spec)
    return out


def run(evaluators: dict, predict, workdir: Path | None = None) -> dict:
    """Every evaluator's results, merged per split, input and method (``summary.json``'s ``results``):
    two evaluators of one split and input add their rows (the model's row is the same model's)."""
    results = {}
    # Another corpus's rows after the run's own splits (a config's evaluators come in name order).
    for evaluator in sorted(evaluators.values(), key=lambda e: isinstance(e, Corpus)):
        for split, rows in evaluator(predict, workdir).items():
            for condition, row in rows.items():
                results.setdefault(split, {}).setdefault(condition, {}).update(row)
    return results


def latent_per_frame(config) -> int:
    """The model's numbers per frame (either model): the size the PCA reference gets."""
    return max(int(round(config.model.latent_dim / config.model.stride)), 1)


def _pca_reference(config, info) -> metrics.PCA:
    """The per-frame PCA with the model's numbers per frame, fitted on every training frame."""
    f = info.feature_dim
    frames = np.concatenate([b["clean"].reshape(-1, f)[b["valid"].reshape(-1) > 0]
                             for b in pipeline.make_eval_batches(config.data, info, info.train_split)])
    return metrics.PCA(frames, latent_per_frame(config))


def results_table(results: dict) -> list[str]:
    """Text table: one line per split x input x method. MPJPE is root-relative (Human3.6M protocol
    #1), with its 95% interval over clips where the evaluation kept one (:mod:`.intervals`); global
    MPJPE adds the root trajectory's error (see :mod:`motionjax.evaluation.metrics`). Then, for each
    corrupted input, the model's MPJPE as a share of its input's, paired per clip."""
    lines = [f"{'split':17s} {'input':6s} {'method':12s} {'MPJPE cm [95% CI]':>20s} {'global cm':>9s} "
             f"{'PA-MPJPE':>9s} {'accel m/s2':>10s} {'jitter m/s3':>11s} {'skate cm/s':>10s} {'bone cm':>8s}"]
    shares = []
    for split, rows in results.items():
        if not isinstance(rows, dict):
            continue
        for condition, row in rows.items():
            # The input row: the (noisy) input's own error, 0 for clean input; reference models
            # (train.references, train.reference_models) after the model.
            order = ["input", "model", *(m for m in row if m not in ("input", "model", "pca")), "pca"]
            for method in order:
                m = row.get(method)
                if isinstance(m, dict) and "mpjpe" in m:
                    ci = m.get("intervals", {}).get("mpjpe")
                    mpjpe = intervals.fmt(ci) if ci else f"{m['mpjpe']:.2f}"
                    lines.append(f"{split:17s} {condition:6s} {method:12s} {mpjpe:>20s} "
                                 f"{m['mpjpe_global']:9.2f} {m['pa_mpjpe']:9.2f} {m['accel']:10.2f} "
                                 f"{m.get('jitter', float('nan')):11.1f} {m['foot_skate']:10.2f} "
                                 f"{m.get('bone_error', float('nan')):8.3f}")
                    share = m.get("ratio_to_input", {}).get("mpjpe")
                    if share:
                        shares.append(f"  {split} {condition} {method}: {intervals.fmt(share)} of the "
                                      f"input's MPJPE ({share['clips']} clips)")
    if shares:
        lines.append("model / input MPJPE, paired per clip [95% CI]:")
        lines += shares
    return lines


FORECAST_METHODS = ("model", "no_dynamics", "constant_velocity", "zero_velocity", "truth")


def forecast_table(results: dict) -> list[str]:
    """Text table of the :class:`Forecast` rows: one line per split x method, MPJPE (cm, root-relative)
    at each horizon and over the predicted frames, then their plausibility; [] when there are none.
    Reference models (``train.references``) appear under their names after the model. Then, where the
    evaluation kept per-window values, each method's MPJPE with its 95% interval over clips and its
    ratio to the zero-velocity baseline, paired per clip (:mod:`.intervals`)."""
    lines, spread, ratios = [], [], []
    cell = lambda ci: intervals.fmt(ci) if ci else "—"
    for split, rows in results.items():
        if not isinstance(rows, dict):
            continue
        for row in rows.values():
            horizons = sorted({h for m in row.values() for h, _ in forecast.horizon_errors(m)})
            if not horizons:
                continue
            if not lines:
                lines.append(f"{'split':17s} {'method':18s} " + " ".join(f"{f'{h}ms':>6s}" for h in horizons)
                             + f" {'mean':>6s} {'skate cm/s':>10s} {'floor cm':>8s} {'jitter m/s3':>11s} "
                             f"{'bone cm':>7s} {'force N/kg':>10s} {'force err':>9s}")
            order = [m for m in FORECAST_METHODS[:2] if m in row]  # the model, then reference models
            order += [m for m in row if m not in FORECAST_METHODS]
            order += [m for m in FORECAST_METHODS[2:] if m in row]
            counts = next((m for m in row.values() if "clips" in m), None)
            if counts is not None:  # how many clips each column averages (short clips reach fewer horizons)
                lines.append(f"{split:17s} {'(clips averaged)':18s} "
                             + " ".join(f"{counts.get(f'clips_{h}ms', '—'):>6}" for h in horizons)
                             + f" {counts['clips']:>6}")
            keys = [f"mpjpe_{h}ms" for h in horizons] + ["mpjpe"]
            for method in order:
                m = row[method]
                lines.append(f"{split:17s} {method:18s} "
                             + " ".join(f"{m[f'mpjpe_{h}ms']:6.2f}" if f"mpjpe_{h}ms" in m else f"{'—':>6s}"
                                        for h in horizons)
                             + f" {m['mpjpe']:6.2f} {m['foot_skate']:10.2f} {m['penetration']:8.2f} "
                             f"{m['jitter']:11.1f} {m['bone_error']:7.3f} {m['force']:10.2f} "
                             f"{m['force_error']:9.2f}")
                if "intervals" in m:
                    spread.append(f"{split:17s} {method:18s} "
                                  + " ".join(f"{cell(m['intervals'].get(k)):>20s}" for k in keys))
                if "ratio_to_zero_velocity" in m:
                    ratio = m["ratio_to_zero_velocity"]
                    ratios.append(f"{split:17s} {method:18s} "
                                  + " ".join(f"{cell(ratio.get(k)):>20s}" for k in keys))
            header = f"{'split':17s} {'method':18s} " + " ".join(
                f"{'mean' if k == 'mpjpe' else k.removeprefix('mpjpe_'):>20s}" for k in keys)
    if spread:
        lines += ["MPJPE cm [95% CI over clips]:", header, *spread]
    if ratios:
        lines += ["MPJPE / zero velocity's, paired per clip [95% CI]:", header, *ratios]
    return lines
