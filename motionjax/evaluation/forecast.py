"""Forecasting: the baselines a motion predictor is judged against and its per-horizon evaluation.

A forecast window is ``T`` frames of standardized features ``[B, N, C, F]`` of which the first
``observed = P`` are seen (``data.observed``); a forecaster returns the whole window, its first
``P`` frames the input's. The baselines (:data:`BASELINES`) are such forecasters, pure numpy:

* ``zero_velocity``: the last observed pose held (root and every local rotation);
* ``constant_velocity``: the last observed velocity carried on, the root linearly and each local
  rotation by its last frame-to-frame rotation, ``q_{P-1+k} = (q_{P-1} q_{P-2}⁻¹)^k q_{P-1}``
  (a hinge keeps its axis), a motion on the same bones.

:func:`evaluate` scores forecasters on eval batches: root-relative MPJPE at each horizon (the frame
``P - 1 + round(h·fps)``) and over all predicted frames, and the plausibility of the predicted
frames (:func:`motionjax.evaluation.metrics.metric_sums` and
:func:`~motionjax.evaluation.metrics.physics_sums` restricted to them, the time differences reaching
back over the seam: :func:`motionjax.data.transforms.forecast_frames`), with the truth's own row.
"""
from __future__ import annotations

import numpy as np

from motionjax.core import features
from motionjax.core import rotations as rot
from motionjax.core.skeleton import Skeleton
from motionjax.data import transforms
from motionjax.evaluation import metrics

HORIZONS_MS = (80, 160, 320, 400, 560, 1000)  # siMLPe's (Guo et al., WACV 2023) short- and long-term
# Scored over the predicted frames only: errors (from metric_sums) and plausibility (over the seam too).
ERROR_METRICS = ("mpjpe", "mpjpe_global", "root_error", "pa_mpjpe", "bone_error")
MOTION_METRICS = ("accel", "jitter", "foot_skate")


def _frames(x):
    """``[B, N, C, F]`` -> ``[B, T, F]`` float64."""
    x = np.asarray(x, np.float64)
    return x.reshape(x.shape[0], -1, x.shape[-1])


def zero_velocity(x, observed: int):
    """The last observed frame held: ``x [B, N, C, F]`` -> the same shape (standardized features)."""
    return transforms.hold_last(_frames(x), observed).reshape(np.shape(x)).astype(np.float32)


def constant_velocity(x, observed: int, skeleton: Skeleton, mean, std):
    """The last observed velocity carried on (root: linear; local rotations: the last frame-to-frame
    rotation repeated), ``x [B, N, C, F]`` -> the same shape. Needs ``observed >= 2``."""
    if observed < 2:
        raise ValueError(f"constant velocity needs 2 observed frames, got observed={observed}")
    frames = _frames(x)
    root, quats = features.unpack(skeleton, features.destandardize(frames, mean, std))
    k = np.arange(frames.shape[1] - observed + 1, dtype=np.float64)[None, :, None]  # 0, 1, .. T - P
    step = root[:, observed - 1] - root[:, observed - 2]  # [B, 3]
    future_root = root[:, observed - 1, None] + k * step[:, None]
    delta = rot.relative_rotation_vector(quats[:, observed - 2], quats[:, observed - 1])  # [B, J, 3]
    turn = rot.axis_angle_to_quat(k[..., None] * delta[:, None])  # [B, T - P + 1, J, 4]
    future_rot = rot.quat_mul(turn, np.broadcast_to(quats[:, observed - 1, None], turn.shape))
    root = np.concatenate([root[:, :observed - 1], future_root], axis=1)
    quats = np.concatenate([quats[:, :observed - 1], future_rot], axis=1)
    out = features.standardize(features.pack(skeleton, root, quats), mean, std)
    # The observed frames exactly as given (a decode/encode round trip would change them by rounding).
    out[:, :observed] = frames[:, :observed]
    return out.reshape(np.shape(x)).astype(np.float32)


BASELINES = {"zero_velocity": lambda x, observed, skeleton, mean, std: zero_velocity(x, observed),
             "constant_velocity": constant_velocity}


def horizon_frames(observed: int, window: int, fps: float, horizons_ms=HORIZONS_MS) -> dict[int, int]:
    """``{horizon ms: frame index}`` of the horizons inside the window (frame ``P - 1 + round(h·fps)``)."""
    out = {}
    for h in horizons_ms:
        ahead = max(int(round(h * fps / 1000)), 1)
        if observed - 1 + ahead < window:
            out[int(h)] = observed - 1 + ahead
    return out


def horizon_errors(row: dict) -> list[tuple[int, float]]:
    """``[(horizon ms, MPJPE)]`` of one method's row (its ``mpjpe_<h>ms`` entries), by horizon."""
    return sorted((int(k[len("mpjpe_"):-2]), v) for k, v in row.items()
                  if k.startswith("mpjpe_") and k.endswith("ms"))


class _Sums:
    """Per-method sums and counts over windows, and MPJPE per frame index."""

    def __init__(self):
        self.sums, self.frame = {}, None
        self.windows = {}  # per_window: {"mpjpe" | "mpjpe_<h>ms": ([sums [B]], [counts [B]])}

    def add(self, sums: dict, keys) -> None:
        for k in keys:
            s, c = self.sums.get(k, (0.0, 0.0))
            self.sums[k] = (s + float(np.sum(sums[k][0])), c + float(np.sum(sums[k][1])))

    def add_frames(self, err, valid) -> None:
        s, c = np.sum(err * valid, 0), np.sum(valid, 0)
        self.frame = (s, c) if self.frame is None else (self.frame[0] + s, self.frame[1] + c)

    def add_windows(self, err, valid, horizons: dict[int, int]) -> None:
        """Per window ``err [B, T]`` (MPJPE per frame) over the scored ``valid [B, T]`` frames, and at
        each horizon's frame."""
        pieces = {"mpjpe": (np.sum(err * valid, 1), np.sum(valid, 1)),
                  **{f"mpjpe_{h}ms": (err[:, t] * valid[:, t], valid[:, t]) for h, t in horizons.items()}}
        for k, (s, c) in pieces.items():
            self.windows.setdefault(k, ([], []))
            self.windows[k][0].append(np.asarray(s, np.float64))
            self.windows[k][1].append(np.asarray(c, np.float64))

    def result(self, horizons: dict[int, int]) -> dict:
        # nan where nothing was scored; a horizon past every segment's end of the split is left out (a
        # split of short clips measures fewer horizons), not nan: nan means a diverged model
        out = {k: s / c if c else float("nan") for k, (s, c) in self.sums.items()}
        s, c = self.frame
        out.update({f"mpjpe_{h}ms": float(s[t] / c[t]) for h, t in horizons.items() if c[t]})
        return out


def evaluate(forecasters: dict, batches, skeleton: Skeleton, fps: float, mean, std, contact_speed: float,
             observed: int, horizons_ms=HORIZONS_MS, truth: bool = True, per_window: bool = False) -> dict:
    """``{method: {metric: value}}`` of each forecaster (``{name: x [B, N, C, F] -> [B, N, C, F]}``) on
    eval ``batches`` (``noisy``, ``clean``, ``valid``, optional ``offsets``), plus (``truth``) the row
    ``"truth"``: the true motion's own plausibility (its errors are 0). Metrics: ``mpjpe_<h>ms`` at each
    horizon, the :data:`ERROR_METRICS` over the predicted frames, the :data:`MOTION_METRICS` and
    :data:`~motionjax.evaluation.metrics.PHYSICS_METRICS` over them and the seam; and how many clips
    (batches' ``clip`` ids) each averages: ``clips_<h>ms`` (a clip shorter than the window reaches
    fewer horizons) and ``clips`` (those with a predicted frame), ints in every row.

    ``per_window`` (and the batches carry ``clip``): each forecaster's row also holds ``windows =
    {"clip": [N], "mpjpe": (sums [N], counts [N]), "mpjpe_<h>ms": (...)}``, one entry per window (fill
    windows: clip -1, count 0), from which the intervals over clips are drawn."""
    totals = {name: _Sums() for name in (*forecasters, *(("truth",) if truth else ()))}
    window, reached = None, None  # reached[t]: the clips with a predicted frame t
    clip_ids = []
    for batch in batches:
        clean = _frames(batch["clean"])
        window = clean.shape[1]
        valid = _frames(batch["valid"])[..., 0]
        future = valid * transforms.forecast_frames(window, observed)
        keep = per_window and "clip" in batch
        if keep:
            clip_ids.append(np.asarray(batch["clip"]).reshape(-1))
        if "clip" in batch:
            ids = np.asarray(batch["clip"])
            reached = reached or [set() for _ in range(window)]
            for t in np.flatnonzero(future.any(0)):
                reached[t].update(ids[future[:, t] > 0].tolist())
        seam = valid * transforms.forecast_frames(window, observed, seam=True)
        offsets = batch.get("offsets")
        true_pos = metrics.feature_positions(skeleton, clean, mean, std, offsets)
        true_root, true_rot = features.unpack(skeleton, features.destandardize(clean, mean, std))
        outputs = {name: f(batch["noisy"]) for name, f in forecasters.items()}
        if truth:
            outputs["truth"] = batch["clean"]
        for name, out in outputs.items():
            pred = _frames(out)
            pos = metrics.feature_positions(skeleton, pred, mean, std, offsets)
            for mask, keys in ((future, ERROR_METRICS), (seam, MOTION_METRICS)):
                sums = metrics.metric_sums(skeleton, float(fps), pos, true_pos, mask, contact_speed)
                totals[name].add(sums, keys)
            root, rotations = features.unpack(skeleton, features.destandardize(pred, mean, std))
            physics = metrics.physics_sums(skeleton, float(fps), np.float32(root), np.float32(rotations),
                                           np.float32(true_root), np.float32(true_rot), valid, seam, offsets)
            totals[name].add(physics, metrics.PHYSICS_METRICS)
            err = np.asarray(metrics.mpjpe_per_frame(pos, true_pos))
            totals[name].add_frames(err, future)
            if keep and name != "truth":
                totals[name].add_windows(err, future, horizon_frames(observed, window, fps, horizons_ms))
    if window is None:
        raise ValueError("forecast evaluate: no eval batches (is the held-out split empty?)")
    horizons = horizon_frames(observed, window, fps, horizons_ms)
    clips = {}
    if reached is not None:
        clips = {f"clips_{h}ms": len(reached[t]) for h, t in horizons.items()}
        clips["clips"] = len(set().union(*reached))
    out = {name: {**t.result(horizons), **clips} for name, t in totals.items()}
    for name, t in totals.items():
        if t.windows:
            per_key = {k: (np.concatenate(s), np.concatenate(c)) for k, (s, c) in t.windows.items()}
            out[name]["windows"] = {"clip": np.concatenate(clip_ids), **per_key}
    return out
