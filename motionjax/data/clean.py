"""Corrupted frames in well-formed clips: detect, repair short defects, cut long ones (prepare time).

Studio MoCap arrives parseable but not always right: a marker swap makes a limb pop for a few
frames, a solver flips a wrist by ~180°, tracking loss freezes the pose, a spliced take jumps.
Each detector here is a pure numpy function of one clip (metres, the prepare rate ``fps``)::

    root_position [T, 3]   rotations [T, J, 4] (w, x, y, z)   positions [T, J, 3] (FK)

returning a per-frame measure; :func:`detect` turns the measures into :class:`Defect` frame
ranges, :func:`plan` decides per range (repair if at most ``repair_frames`` long and bounded by
good frames, else cut) and :func:`apply` interpolates the repaired frames (slerp for rotations,
lerp for the root) and returns the good spans. A clip becomes its good spans (each kept if it
holds a window); a clip keeping less than ``min_kept`` of its frames is dropped. Prepare records
every range in the per-clip report (file, frames, kind, measure, action).

Kinds and measures (thresholds in :class:`Thresholds`; the defaults come from the 174 clips of
Bandai-1, see docs/data.md "Cleaning" for the measured distributions and the margins):

- ``nonfinite``: frames holding NaN or inf.
- ``sign_flip``: a joint's quaternion on the other hemisphere than the frame before (``q`` and
  ``-q`` are one rotation): made continuous, always; the motion is unchanged, so these frames
  are counted but never flagged as defects (Euler wraps disappear in the quaternion conversion
  the readers do, so they reach here as sign flips at most).
- ``pop``: for every span of 1 to 3 frames, how far all of a joint's positions in it lie from the
  cubic through the two frames either side, and its first and last frame from where the motion on
  each side was heading (m): a spike stands out by its own size, smooth motion, even fast, stays
  within centimetres, and a jump stays near one side. Spans are taken greatest first, and a span
  whose cubic leans on frames already taken is not counted (a pop also drags its neighbours' cubics).
- ``twist``: a joint's rotation step between frames (rad, sign-free); a twist and its return
  on the same joint within ``twist_frames`` form one range, a step alone is a cut point.
- ``teleport``: the root's displacement between frames minus its 7-frame median (m); a jump and
  its return within ``twist_frames`` form one range, a jump alone (a splice) is a cut point.
- ``frozen``: runs of at least ``frozen_frames`` frames in which no animated joint rotates and
  the root does not move (a held pose in a clip that moves elsewhere).
- ``stretch``: the largest per-frame deviation of a joint's position channels from their median
  (m, ``corpus.conform``'s ``stretch``), when the file has position channels.
- ``floor``: the lowest joint below the clip's floor (its median lowest-joint height) by more
  than ``penetration_m``, or above it by ``float_m`` for longer than ``float_s``.
"""
from __future__ import annotations

import collections
import dataclasses

import numpy as np
from scipy.ndimage import median_filter

from motionjax.core import rotations as rot

KINDS = ("nonfinite", "sign_flip", "pop", "twist", "teleport", "frozen", "stretch", "floor")
MODES = ("off", "report", "repair")
MEDIAN = 7  # frames of the median filter of root steps: a jump of up to 3 frames stands out
POP_FRAMES = 3  # the longest pop: longer defects are twists, freezes or floor contacts
STILL_RAD = 1e-6  # a joint whose rotation step is below this is not moving (float32 noise ~1e-7)
STILL_M = 1e-6  # a root step below this is not moving
CONTACT_SPEED = 0.3  # m/s: a slower lowest joint is planted on the floor (as loss.contact_speed)


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """The detectors' bounds (config ``data.clean_limits.*``, where each is explained)."""

    pop_m: float = 0.25
    twist_rad: float = 1.5
    twist_frames: int = 60
    teleport_m: float = 0.12
    frozen_frames: int = 8
    stretch_m: float = 0.01
    penetration_m: float = 0.14
    float_m: float = 0.25
    float_s: float = 1.0
    repair_frames: int = 5
    min_kept: float = 0.5


@dataclasses.dataclass
class Defect:
    """Frames ``[start, end)`` of one clip found by detector ``kind``; ``measure`` its worst value
    (units of the kind's measure), ``joint`` the joint index (``-1``: the whole frame)."""

    kind: str
    start: int
    end: int
    measure: float
    joint: int = -1
    action: str = ""  # "repair" | "cut" | "report" (set by :func:`plan`)
    cut_point: bool = False  # a jump that is never undone: the clip splits here (no repair)

    def to_dict(self, names=None) -> dict:
        d = {"kind": self.kind, "frames": [self.start, self.end], "measure": round(float(self.measure), 4),
             "action": self.action}
        if self.joint >= 0:
            d["joint"] = names[self.joint] if names is not None else self.joint
        return d


# --------------------------------------------------------------------------------------------
# Measures (per frame)


def runs(mask) -> list[tuple[int, int]]:
    """``[(start, end)]`` of the runs of True in a 1-D ``mask``."""
    m = np.concatenate([[False], np.asarray(mask, bool), [False]])
    edges = np.flatnonzero(m[1:] != m[:-1])
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist(), strict=True))


def nonfinite_frames(root_position, rotations):
    """``[T]`` bool: frames with a NaN or inf anywhere."""
    return ~(np.isfinite(root_position).all(-1) & np.isfinite(rotations).all((-1, -2)))


def fill_frames(root_position, rotations, bad):
    """The clip with frames ``bad [T]`` (bool) replaced by interpolation between the good frames
    around each bad run (held at the clip's ends). Returns new arrays; raises if no frame is good.

    A run between good frames ``a`` and ``b`` whose outer neighbours ``a - 1`` and ``b + 1`` are good
    too follows a cubic Hermite curve that meets the neighbours' velocities (the root in world
    coordinates, rotations in the tangent space at ``q_a``: ``q_a·exp(h(u))``); otherwise the root
    is lerped and rotations slerped. On fast motion the cubic halves the error of the linear
    interpolation (docs/data.md "Cleaning")."""
    bad = np.asarray(bad, bool)
    t = root_position.shape[0]
    good = ~bad
    if not good.any():
        raise ValueError("no good frame to interpolate from")
    root = root_position.astype(np.float64).copy()
    rots = rotations.astype(np.float64).copy()
    for s, e in runs(bad):
        a, b = s - 1, e
        if a < 0 or b >= t:  # at an end of the clip: hold the nearest good frame
            src = b if a < 0 else a
            root[s:e], rots[s:e] = root[src], rots[src]
            continue
        n = b - a
        u = (np.arange(s, e) - a)[:, None] / n  # [k, 1] in (0, 1)
        qa_inv = rot.quat_conj(rots[a])
        x_b = rot.quat_to_axis_angle(rot.quat_mul(qa_inv, rots[b]))  # [J, 3]
        if a >= 1 and b + 1 < t and good[a - 1] and good[b + 1]:
            h00, h10 = 2 * u**3 - 3 * u**2 + 1, u**3 - 2 * u**2 + u
            h01, h11 = -2 * u**3 + 3 * u**2, u**3 - u**2
            va, vb = root[a] - root[a - 1], root[b + 1] - root[b]
            root[s:e] = h00 * root[a] + h10 * n * va + h01 * root[b] + h11 * n * vb
            wa = rot.quat_to_axis_angle(rot.quat_mul(rot.quat_conj(rots[a - 1]), rots[a]))  # per frame
            wb = rot.quat_to_axis_angle(rot.quat_mul(qa_inv, rots[b + 1])) - x_b
            x = h10[..., None] * n * wa + h01[..., None] * x_b + h11[..., None] * n * wb  # [k, J, 3]
        else:
            root[s:e] = (1 - u) * root[a] + u * root[b]
            x = u[..., None] * x_b
        rots[s:e] = rot.quat_normalize(rot.quat_mul(rots[a], rot.axis_angle_to_quat(x)))
    return root.astype(root_position.dtype), rots.astype(rotations.dtype)


def hemisphere_continuity(rotations):
    """``rotations [T, J, 4]`` -> ``(continuous [T, J, 4], flips [T, J] bool)``: each quaternion
    on the hemisphere of the one before it (same rotations; ``flips`` marks where it changed
    side in the input)."""
    q = np.asarray(rotations)
    flip = np.zeros(q.shape[:2], bool)
    flip[1:] = (q[1:] * q[:-1]).sum(-1) < 0
    sign = np.where(np.cumsum(flip, axis=0) % 2 == 1, -1, 1).astype(q.dtype)
    return q * sign[..., None], flip


def step_angles(rotations):
    """``[T, J]`` rotation angle (rad) from frame ``t - 1`` to ``t`` (0 at ``t = 0``), sign-free."""
    q = np.asarray(rotations, np.float64)
    out = np.zeros(q.shape[:2])
    norm = np.linalg.norm(q, axis=-1)
    dots = np.abs((q[1:] * q[:-1]).sum(-1)) / (norm[1:] * norm[:-1])
    out[1:] = 2 * np.arccos(np.clip(dots, 0, 1))
    return out


def _cubic_weights(n: int) -> np.ndarray:
    """``[n, 4]`` Lagrange weights at frames ``0..n-1`` of the cubic through frames ``-2, -1, n, n+1``."""
    xs = np.array([-2.0, -1.0, n, n + 1.0])
    k = np.arange(n, dtype=np.float64)[:, None]
    w = np.ones((n, 4))
    for i in range(4):
        for m in range(4):
            if m != i:
                w[:, i] *= (k[:, 0] - xs[m]) / (xs[i] - xs[m])
    return w


def pop_spans(positions):
    """``positions [T, J, 3]`` -> ``{n: [T - n - 3, J]}`` for span lengths ``n = 1..POP_FRAMES``:
    row ``i`` is the span ``[i + 2, i + 2 + n)``, the value (m) the smallest of: its frames' distances
    from the cubic through the two frames either side of it, its first frame's from the line through
    the two before, its last frame's from the line through the two after (spans that lack them are
    not scored)."""
    p = np.asarray(positions, np.float32)
    t, out = p.shape[0], {}
    for n in range(1, POP_FRAMES + 1):
        count = t - n - 3
        if count <= 0:
            break
        # Frames -2, -1 before each span and n, n + 1 after it: [4, count, J, 3].
        support = np.stack([p[0:count], p[1:count + 1], p[n + 2:n + 2 + count], p[n + 3:n + 3 + count]])
        est = np.einsum("ki,itjc->ktjc", _cubic_weights(n).astype(np.float32), support)  # [n, count, J, 3]
        frames = np.stack([p[2 + k:2 + k + count] for k in range(n)])
        # A pop leaves and comes back: its first frame is far from where the motion before it was
        # heading, its last from where the motion after it comes from. A jump (a splice, the end of
        # a held pose) stays near one side, so it is not a pop.
        left = frames[0] - (2 * support[1] - support[0])
        right = frames[-1] - (2 * support[2] - support[3])
        out[n] = np.minimum(np.linalg.norm(frames - est, axis=-1).min(0),
                            np.minimum(np.linalg.norm(left, axis=-1), np.linalg.norm(right, axis=-1)))
    return out


def pop_measure(positions):
    """``positions [T, J, 3]`` -> ``[T, J]``: each frame's largest :func:`pop_spans` value over the
    spans that cover it (m; 0 at the two frames of each end)."""
    out = np.zeros(np.shape(positions)[:2], np.float32)
    for n, r in pop_spans(positions).items():
        for k in range(n):
            np.maximum(out[2 + k:2 + k + len(r)], r, out=out[2 + k:2 + k + len(r)])
    return out


def _pops(positions, thr: float) -> list[Defect]:
    """The pops of a clip: spans over ``thr`` taken greatest first, each unless its frames or the
    frames its cubic leans on were taken already (they are then the pop's shadow, not another)."""
    spans = pop_spans(positions)
    cands = [(float(r[i].max()), int(i) + 2, n, int(r[i].argmax())) for n, r in spans.items()
             for i in np.flatnonzero(r.max(-1) > thr)]
    taken = np.zeros(np.shape(positions)[0], bool)
    found = []
    for value, start, n, joint in sorted(cands, reverse=True):
        if not taken[start - 2:start + n + 2].any():
            taken[start:start + n] = True
            found.append(Defect("pop", start, start + n, value, joint))
    return found


def teleport_measure(root_position):
    """``root_position [T, 3]`` -> ``[T]``: the step from frame ``t - 1`` to ``t`` minus the median
    step over :data:`MEDIAN` steps (m; 0 at ``t = 0``): a jump of the root stands out of a walk."""
    step = np.diff(np.asarray(root_position, np.float64), axis=0)
    out = np.zeros(root_position.shape[0])
    if step.shape[0]:
        out[1:] = np.linalg.norm(step - median_filter(step, size=(MEDIAN, 1), mode="nearest"), axis=-1)
    return out


def frozen_frames(root_position, rotations, steps=None):
    """``[T]`` bool: the frame equals the one before it (no animated joint rotates by
    :data:`STILL_RAD`, the root moves less than :data:`STILL_M`). Joints that never rotate in
    the clip (end sites, unanimated joints) do not count."""
    steps = step_angles(rotations) if steps is None else steps
    animated = steps.max(0) > STILL_RAD
    still = (steps[:, animated] <= STILL_RAD).all(-1)
    move = np.zeros(root_position.shape[0])
    move[1:] = np.abs(np.diff(np.asarray(root_position, np.float64), axis=0)).max(-1)
    still &= move <= STILL_M
    still[0] = False
    return still


def floor_heights(positions, up_axis: int, fps: float):
    """``positions [T, J, 3]`` -> ``[T]`` height (m) of the lowest joint above the clip's floor: the
    median height of the lowest joint over the frames where it is planted (slower than
    :data:`CONTACT_SPEED`), so flight phases of a run and lying poses do not lift the floor; the
    median over all frames when fewer than a tenth are planted."""
    p = np.asarray(positions)
    low_joint = p[..., up_axis].argmin(-1)  # [T]
    low = p[np.arange(p.shape[0]), low_joint, up_axis]
    speed = np.full(p.shape[0], np.inf)
    if p.shape[0] >= 3:
        j = low_joint[1:-1]
        t = np.arange(1, p.shape[0] - 1)
        speed[1:-1] = np.linalg.norm(p[t + 1, j] - p[t - 1, j], axis=-1) * fps / 2
    planted = speed < CONTACT_SPEED
    floor = np.median(low[planted]) if planted.sum() >= 0.1 * p.shape[0] else np.median(low)
    return low - floor


# --------------------------------------------------------------------------------------------
# Ranges


def _peaks(measure, thr, kind) -> list[Defect]:
    """A :class:`Defect` per run of ``measure [T] > thr``."""
    return [Defect(kind, s, e, float(measure[s:e].max())) for s, e in runs(measure > thr)]


def _paired_steps(flagged, kind, measure, max_gap, returns, joint=-1) -> list[Defect]:
    """Steps at frames ``flagged`` (sorted): a step and the next one within ``max_gap`` frames
    that ``returns(a, b)`` says undoes it are one range ``[a, b)``; an unpaired step is a cut
    point ``[a, a + 1)``."""
    out, i = [], 0
    while i < len(flagged):
        a = flagged[i]
        j = next((j for j in range(i + 1, len(flagged)) if flagged[j] - a <= max_gap
                  and returns(a, flagged[j])), None)
        if j is not None:
            b = flagged[j]
            out.append(Defect(kind, a, b, float(measure[a:b + 1].max()), joint))
            i = j + 1
        else:
            out.append(Defect(kind, a, a + 1, float(measure[a]), joint, cut_point=True))
            i += 1
    return out


def detect(root_position, rotations, positions, *, fps: float, up_axis: int, th: Thresholds,
           stretch=None, nonfinite=None) -> list[Defect]:
    """The defects of one clip, sorted by start frame.

    ``root_position [T, 3]``, ``rotations [T, J, 4]`` (hemisphere-continuous), ``positions
    [T, J, 3]`` (FK of the two), finite (fill :func:`nonfinite_frames` first with
    :func:`fill_frames` and pass the mask as ``nonfinite``); ``stretch [T]`` (m) or ``None``.
    """
    t = root_position.shape[0]
    found: list[Defect] = []
    if nonfinite is not None:
        found += [Defect("nonfinite", s, e, float(e - s)) for s, e in runs(nonfinite)]
    if t < 3:
        return found
    for d in _pops(positions, th.pop_m):
        # One more frame each side: a real pop's edge frames can sit under the bound and must not
        # anchor the interpolation.
        d.start, d.end = max(d.start - 1, 0), min(d.end + 1, t)
        found.append(d)

    steps = step_angles(rotations)
    q = np.asarray(rotations, np.float64)
    for j in np.flatnonzero(steps.max(0) > th.twist_rad):
        flagged = np.flatnonzero(steps[:, j] > th.twist_rad).tolist()

        def back(a, b, j=j):  # the step at b undoes the one at a: together they are a small turn
            r_a = rot.quat_mul(rot.quat_conj(q[a - 1, j]), q[a, j])
            r_b = rot.quat_mul(rot.quat_conj(q[b - 1, j]), q[b, j])
            both = rot.quat_mul(r_a, r_b)
            cos_half = min(abs(float(both[0])) / float(np.linalg.norm(both)), 1.0)
            return 2 * np.arccos(cos_half) < th.twist_rad / 2
        found += _paired_steps(flagged, "twist", steps[:, j], th.twist_frames, back, int(j))

    tele = teleport_measure(root_position)
    flagged = np.flatnonzero(tele > th.teleport_m).tolist()
    step = np.zeros((t, 3))
    step[1:] = np.diff(np.asarray(root_position, np.float64), axis=0)
    found += _paired_steps(flagged, "teleport", tele, th.twist_frames,
                           lambda a, b: np.linalg.norm(step[a] + step[b]) < th.teleport_m)

    still = frozen_frames(root_position, rotations, steps)
    if still.any() and not still[1:].all():
        found += [Defect("frozen", s, e, float(e - s + 1)) for s, e in runs(still)
                  if e - s + 1 >= th.frozen_frames]

    if stretch is not None:
        found += _peaks(np.asarray(stretch), th.stretch_m, "stretch")

    h = floor_heights(positions, up_axis, fps)
    found += [Defect("floor", s, e, float(h[s:e].min())) for s, e in runs(h < -th.penetration_m)]
    found += [Defect("floor", s, e, float(h[s:e].max())) for s, e in runs(h > th.float_m)
              if e - s > th.float_s * fps]
    return sorted(found, key=lambda d: (d.start, d.end, d.kind))


def plan(defects: list[Defect], frames: int, th: Thresholds, *, mode: str, window: int):
    """Decide what happens to each defect and which frames are kept.

    The defects' frames are merged into bad runs; a run of at most ``repair_frames`` frames with a
    good frame on each side is repaired, any other run is cut. ``mode="report"`` changes nothing
    (every action is ``"report"``). Returns ``(repair [T] bool, spans [(start, end)], dropped)``:
    the frames to interpolate, the good spans of at least ``window`` frames, and why the clip
    is dropped (``""`` when kept).
    """
    bad = np.zeros(frames, bool)
    split = np.zeros(frames, bool)
    for d in defects:
        bad[d.start:d.end] = True
        split[d.start:d.end] |= d.cut_point
    repair = np.zeros(frames, bool)
    cut = np.zeros(frames, bool)
    for s, e in runs(bad):
        if e - s <= th.repair_frames and s > 0 and e < frames and not split[s:e].any():
            repair[s:e] = True
        else:
            cut[s:e] = True
    for d in defects:
        d.action = ("report" if mode == "report" else
                    "cut" if cut[d.start:d.end].any() else "repair")
    if mode == "report" or not cut.any():  # nothing cut: the clip as it is, however short
        return (np.zeros(frames, bool) if mode == "report" else repair), [(0, frames)], ""
    spans = [(s, e) for s, e in runs(~cut) if e - s >= window]
    kept = sum(e - s for s, e in spans)
    if kept < th.min_kept * frames or not spans:
        why = (f"cleaning kept {kept} of {frames} frames (< {th.min_kept:.0%}; spans of at least "
               f"{window} frames)")
        return repair, spans, why
    return repair, spans, ""


def summarize(reports: list[dict]) -> dict:
    """Per kind over clip reports (:func:`clean_clip`'s): ranges, frames, repaired/cut frames."""
    out: dict = collections.OrderedDict((k, {"ranges": 0, "frames": 0}) for k in KINDS)
    for r in reports:
        for d in r["defects"]:
            k = out[d["kind"]]
            k["ranges"] += 1
            k["frames"] += d["frames"][1] - d["frames"][0]
    return {k: v for k, v in out.items() if v["ranges"]}


def clean_clip(root_position, rotations, positions_fn, *, fps: float, up_axis: int, th: Thresholds,
               mode: str, window: int, stretch=None, names=None):
    """Detect, plan and apply on one clip.

    ``positions_fn(root, rotations) -> [T, J, 3]`` is the clip's FK (called once, again only if
    frames were repaired). Returns ``(root, rotations, positions, report)`` where ``report`` is
    ``{"frames", "defects": [Defect.to_dict], "sign_flips", "repaired", "cut", "spans",
    "dropped"}``; the arrays are finite in every mode but ``"report"`` (frames that are cut are
    filled by interpolation so the record stays finite; no window covers them).
    """
    if mode not in MODES or mode == "off":
        raise ValueError(f"clean mode {mode!r}: expected 'report' or 'repair' here")
    t = root_position.shape[0]
    rotations, flips = hemisphere_continuity(rotations)
    nonfinite = nonfinite_frames(root_position, rotations)
    if nonfinite.all():
        raise ValueError("every frame holds NaN or inf")
    root, rots = (fill_frames(root_position, rotations, nonfinite) if nonfinite.any()
                  else (root_position, rotations))
    positions = positions_fn(root, rots)
    defects = detect(root, rots, positions, fps=fps, up_axis=up_axis, th=th, stretch=stretch,
                     nonfinite=nonfinite if nonfinite.any() else None)
    repair, spans, dropped = plan(defects, t, th, mode=mode, window=window)
    cut = np.ones(t, bool)
    for s, e in spans:
        cut[s:e] = False
    if mode == "report":
        cut[:] = False
    fill = repair | (cut & nonfinite)
    if mode == "report":
        root, rots = root_position, rotations
    elif fill.any():
        root, rots = fill_frames(root, rots, fill | nonfinite)
        positions = positions_fn(root, rots)
    report = {"frames": t, "defects": [d.to_dict(names) for d in defects],
              "sign_flips": int(flips.sum()), "repaired": int(repair.sum()),
              "cut": int(cut.sum()), "spans": [list(s) for s in spans], "dropped": dropped}
    return root, rots, positions, report
