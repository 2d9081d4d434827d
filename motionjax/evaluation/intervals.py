"""Bootstrap intervals over clips: the uncertainty every reported number carries (docs/protocol.md).

Windows cut from one clip overlap and share its performer, take and style, so they are not
independent draws: resampling windows would give intervals far too narrow. The unit of resampling
is the clip. Each bootstrap replicate draws ``C`` clips with replacement from the ``C`` clips of a
split and recomputes the statistic on every window of the drawn clips (a clip drawn twice counts
twice). The interval is the percentile interval of the replicates (Efron & Tibshirani 1993, §13).

Entry points:

* :func:`mean_interval` for per-window (or per-frame) values whose statistic is their (weighted)
  mean — MPJPE, accuracy, skating ratio — fast, from per-clip sums;
* :func:`statistic_interval` for a statistic of the whole set (FID, diversity), recomputed on the
  window indices of each replicate;
* :func:`ratio_interval` for the ratio of two methods' mean errors on the same windows (a forecaster
  against the held pose, a denoiser against its input), fast, from per-clip sums.

A difference between two methods scored on the same clips is judged by :func:`paired_difference`,
which resamples the clips once for both, so their shared difficulty cancels.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

REPLICATES = 1000  # enough for a 95% percentile interval's ends to settle at the 2nd significant digit
LEVEL = 0.95


def _clip_index(clips) -> tuple[np.ndarray, int]:
    """``clips [N]`` (any hashable ids) -> dense ids ``[N]`` in ``0..C-1`` and ``C``."""
    _, dense = np.unique(np.asarray(clips), return_inverse=True)
    return dense.reshape(-1), int(dense.max()) + 1 if dense.size else 0


def _percentiles(replicates: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.percentile(replicates, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def clip_draws(num_clips: int, replicates: int = REPLICATES, seed: int = 0) -> np.ndarray:
    """``[R, C]`` counts: how often each of ``C`` clips is drawn in each of ``R`` replicates."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, num_clips, size=(replicates, num_clips))
    counts = np.zeros((replicates, num_clips), np.int64)
    np.add.at(counts, (np.arange(replicates)[:, None], picks), 1)
    return counts


def mean_interval(values, clips, weights=None, *, replicates: int = REPLICATES, level: float = LEVEL,
                  seed: int = 0) -> dict:
    """Mean of ``values [N]`` (weighted by ``weights [N]``, e.g. valid frames) with its clip bootstrap.

    Returns ``{"mean", "lo", "hi", "clips", "n"}``; ``lo = hi = mean`` when there is one clip (no
    spread to resample: the interval is then not informative, and ``clips`` says so)."""
    num_clips, (sums, counts) = _per_clip(clips, weights, values, names=("values",))
    mean, lo, hi = _ratio_of_sums(sums, counts, replicates, level, seed)
    return {"mean": mean, "lo": lo, "hi": hi, "clips": num_clips, "n": int(np.size(values))}


def statistic_interval(statistic: Callable[[np.ndarray], float], clips, *, replicates: int = 200,
                       level: float = LEVEL, seed: int = 0) -> dict:
    """``statistic(indices [M]) -> float`` on the windows of resampled clips (FID, diversity).

    ``statistic`` gets integer indices into the ``N`` windows (a clip drawn twice contributes its
    windows twice). Fewer replicates by default than :func:`mean_interval`: each one recomputes the
    statistic. Returns ``{"value", "lo", "hi", "clips", "n"}``, ``value`` on all windows once."""
    ids, num_clips = _clip_index(clips)
    value = float(statistic(np.arange(ids.size)))
    out = {"value": value, "lo": value, "hi": value, "clips": num_clips, "n": int(ids.size)}
    if num_clips < 2:
        return out
    members = [np.flatnonzero(ids == c) for c in range(num_clips)]
    draws = clip_draws(num_clips, replicates, seed)
    reps = []
    for row in draws:
        reps.append(statistic(np.concatenate([np.tile(members[c], row[c]) for c in np.flatnonzero(row)])))
    out["lo"], out["hi"] = _percentiles(np.asarray(reps, np.float64), level)
    return out


def paired_difference(a, b, clips, weights=None, *, replicates: int = REPLICATES, level: float = LEVEL,
                      seed: int = 0) -> dict:
    """Mean of ``a - b`` (two methods' per-window values on the same windows) with its clip bootstrap.

    ``"gain"`` is ``"a lower"`` / ``"b lower"`` only when the whole interval is on one side of 0,
    else ``"no difference shown"``."""
    diff = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    out = mean_interval(diff, clips, weights, replicates=replicates, level=level, seed=seed)
    out["gain"] = ("a lower" if out["hi"] < 0 else "b lower" if out["lo"] > 0 else "no difference shown")
    return out


def ratio_interval(a, b, clips, weights=None, *, replicates: int = REPLICATES, level: float = LEVEL,
                   seed: int = 0) -> dict:
    """Ratio of the (weighted) means of ``a`` and ``b`` (two methods' per-window values on the same
    windows, e.g. a forecaster's error and the held pose's) with its paired clip bootstrap: each
    replicate draws clips once for both, so a clip that is hard for both moves both.

    Returns ``{"value", "lo", "hi", "clips", "n"}`` (``value = mean(a) / mean(b)``); ``"below_one"``
    is True only when the whole interval is below 1."""
    num_clips, (sum_a, sum_b) = _per_clip(clips, weights, a, b, names=("a", "b"))
    value, lo, hi = _ratio_of_sums(sum_a, sum_b, replicates, level, seed)
    return {"value": value, "lo": lo, "hi": hi, "clips": num_clips, "n": int(np.size(a)),
            "below_one": bool(hi < 1)}


def _per_clip(clips, weights, *columns, names):
    """Per-clip weighted sums of each ``column [N]``, then of the weights: ``(C, [sum_1, ..., w])``."""
    columns = [np.asarray(c, np.float64).reshape(-1) for c in columns]
    weights = (np.ones_like(columns[0]) if weights is None
               else np.asarray(weights, np.float64).reshape(-1))
    if any(c.shape != weights.shape for c in columns) or weights.shape[0] != np.asarray(clips).size:
        shapes = ", ".join(f"{n} {c.shape}" for n, c in zip(names, columns, strict=True))
        raise ValueError(f"{shapes}, weights {weights.shape} and clips {np.asarray(clips).shape} must "
                         "have one entry per window")
    ids, num_clips = _clip_index(clips)
    sums = [np.bincount(ids, weights=c * weights, minlength=num_clips) for c in columns]
    if len(columns) == 1:
        sums.append(np.bincount(ids, weights=weights, minlength=num_clips))
    return num_clips, sums


def _ratio_of_sums(num, den, replicates: int, level: float, seed: int) -> tuple[float, float, float]:
    """``sum(num) / sum(den)`` over per-clip sums ``[C]`` and its percentile interval over clip draws;
    the value itself as both ends when there is one clip or nothing to divide by."""
    total = float(den.sum())
    value = float(num.sum() / total) if total > 0 else float("nan")
    if num.size < 2 or total <= 0:
        return value, value, value
    draws = clip_draws(num.size, replicates, seed)
    n, d = draws @ num, draws @ den
    return (value, *_percentiles(n[d > 0] / d[d > 0], level))


def _scored(sums, counts, clips):
    """Per-window ``sums, counts [N]`` (a metric's form: :func:`motionjax.evaluation.metrics.metric_sums`)
    and ``clips [N]`` -> the windows that score something (fill windows have clip -1 and count 0)."""
    sums, counts = np.asarray(sums, np.float64).reshape(-1), np.asarray(counts, np.float64).reshape(-1)
    clips = np.asarray(clips).reshape(-1)
    keep = (counts > 0) & (clips >= 0)
    return sums[keep], counts[keep], clips[keep]


def from_sums(sums, counts, clips, **kwargs) -> dict:
    """:func:`mean_interval` of a metric given per window as ``sums, counts [N]`` (its value is
    ``sum(sums) / sum(counts)``, the pooled mean the tables print) on ``clips [N]`` (-1: fill)."""
    s, c, ids = _scored(sums, counts, clips)
    return mean_interval(s / c, ids, c, **kwargs)


def ratio_from_sums(sums_a, sums_b, counts, clips, **kwargs) -> dict:
    """:func:`ratio_interval` of two methods' per-window ``sums`` over the same ``counts [N]``."""
    a, c, ids = _scored(sums_a, counts, clips)
    b, _, _ = _scored(sums_b, counts, clips)
    return ratio_interval(a / c, b / c, ids, c, **kwargs)


def fmt(interval: dict, digits: int = 2) -> str:
    """``"0.43 [0.40, 0.47]"``: a value and its interval, as tables print them."""
    value = interval.get("mean", interval.get("value"))
    return f"{value:.{digits}f} [{interval['lo']:.{digits}f}, {interval['hi']:.{digits}f}]"
