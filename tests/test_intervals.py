"""Clip bootstrap intervals against a direct resampling written out window by window."""
import numpy as np

from motionjax.evaluation import intervals


def _windows(seed=0, clips=12):
    rng = np.random.default_rng(seed)
    per_clip = rng.integers(1, 6, clips)
    clip_mean = rng.normal(2.0, 0.5, clips)  # clips differ: the spread a clip bootstrap must see
    ids = np.repeat(np.arange(clips), per_clip)
    values = clip_mean[ids] + rng.normal(0, 0.05, ids.size)
    return values, ids


def test_mean_interval_equals_direct_resampling():
    values, ids = _windows()
    weights = np.random.default_rng(1).integers(1, 64, values.size).astype(float)
    got = intervals.mean_interval(values, ids, weights, replicates=300, seed=4)
    # The reference: draw clips with the same generator, gather their windows, take the weighted mean.
    draws = intervals.clip_draws(12, 300, seed=4)
    reps = []
    for row in draws:
        idx = np.concatenate([np.flatnonzero(ids == c) for c in range(12) for _ in range(row[c])])
        reps.append(np.average(values[idx], weights=weights[idx]))
    assert np.isclose(got["mean"], np.average(values, weights=weights))
    assert np.allclose([got["lo"], got["hi"]], np.percentile(reps, [2.5, 97.5]))
    assert got["lo"] < got["mean"] < got["hi"] and got["clips"] == 12


def test_statistic_interval_matches_mean_interval_for_the_mean():
    values, ids = _windows(2)
    a = intervals.mean_interval(values, ids, replicates=200, seed=3)
    b = intervals.statistic_interval(lambda i: values[i].mean(), ids, replicates=200, seed=3)
    assert np.allclose([a["mean"], a["lo"], a["hi"]], [b["value"], b["lo"], b["hi"]])


def test_clip_bootstrap_is_wider_than_a_window_bootstrap():
    # Many overlapping windows per clip: resampling windows would claim a precision the clips lack.
    rng = np.random.default_rng(0)
    ids = np.repeat(np.arange(10), 50)
    values = rng.normal(0, 1, 10)[ids] + rng.normal(0, 0.01, ids.size)
    by_clip = intervals.mean_interval(values, ids, seed=1)
    by_window = intervals.mean_interval(values, np.arange(ids.size), seed=1)
    assert (by_clip["hi"] - by_clip["lo"]) > 5 * (by_window["hi"] - by_window["lo"])


def test_paired_difference_calls_a_gain_only_outside_zero():
    values, ids = _windows(3)
    better = intervals.paired_difference(values - 0.3, values, ids)
    assert better["gain"] == "a lower" and better["hi"] < 0
    noise = np.random.default_rng(5).normal(0, 0.5, values.size)
    same = intervals.paired_difference(values + noise, values, ids)
    assert same["gain"] == "no difference shown" and same["lo"] < 0 < same["hi"]


def test_one_clip_has_no_interval_and_mismatched_lengths_are_refused():
    out = intervals.mean_interval([1.0, 2.0], [7, 7])
    assert out["lo"] == out["hi"] == out["mean"] == 1.5 and out["clips"] == 1
    try:
        intervals.mean_interval([1.0, 2.0], [1])
    except ValueError as e:
        assert "one entry per window" in str(e)
    else:
        raise AssertionError("mismatched lengths were accepted")


def test_ratio_interval_equals_direct_paired_resampling():
    values, ids = _windows(6)
    other = values * np.random.default_rng(2).uniform(1.5, 2.5, values.size)  # a worse method, same windows
    weights = np.random.default_rng(3).integers(1, 30, values.size).astype(float)
    got = intervals.ratio_interval(values, other, ids, weights, replicates=300, seed=5)
    draws = intervals.clip_draws(12, 300, seed=5)
    reps = []
    for row in draws:  # the same clips drawn for both methods
        idx = np.concatenate([np.flatnonzero(ids == c) for c in range(12) for _ in range(row[c])])
        w = weights[idx]
        reps.append(np.average(values[idx], weights=w) / np.average(other[idx], weights=w))
    assert np.isclose(got["value"], np.average(values, weights=weights) / np.average(other, weights=weights))
    assert np.allclose([got["lo"], got["hi"]], np.percentile(reps, [2.5, 97.5]))
    assert got["below_one"] and got["hi"] < 1


def test_intervals_from_per_window_sums_ignore_fill_windows():
    """The evaluators' form: per-window sums and counts, fill windows with clip -1 and count 0. A method
    exactly half as wrong as another on every frame has the ratio 0.5 with no spread."""
    sums, counts = np.array([3.0, 5.0, 4.0, 9.0, 0.0]), np.array([2.0, 2.0, 1.0, 3.0, 0.0])
    clips = np.array([0, 0, 1, 2, -1])
    got = intervals.from_sums(sums, counts, clips, seed=1)
    assert got["mean"] == 21.0 / 8.0 and got["clips"] == 3 and got["n"] == 4
    ref = intervals.mean_interval(sums[:4] / counts[:4], clips[:4], counts[:4], seed=1)
    assert (got["lo"], got["hi"]) == (ref["lo"], ref["hi"])
    half = intervals.ratio_from_sums(sums / 2, sums, counts, clips)
    assert half["value"] == half["lo"] == half["hi"] == 0.5 and half["clips"] == 3
