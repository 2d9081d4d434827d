"""Overlapping windows and their blend (motionjax.core.windows): coverage, exactness where one window
reaches, no step at window borders, rotations blended as rotations."""
import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from motionjax.core import windows


@pytest.mark.parametrize("frames", [1, 40, 64, 65, 100, 301])
def test_windows_cover_the_clip_with_the_overlap_asked(frames):
    t, overlap = 64, 16
    starts = windows.window_starts(frames, t, overlap)
    assert starts[0] == 0
    if frames <= t:
        assert list(starts) == [0]
        return
    assert starts[-1] + t == frames                            # the last window ends at the clip's end
    assert np.all(np.diff(starts) <= t - overlap)              # neighbours share >= overlap frames
    assert np.all(np.diff(starts) > 0)
    assert np.ptp(np.diff(starts)) <= 1                        # evenly spaced
    covered = np.zeros(frames, bool)
    for s in starts:
        covered[s:s + t] = True
    assert covered.all()


def _per_window(signal, starts, t, offsets):
    """Windows of ``signal [L, ...]`` as a model with a per-window bias would output them."""
    return np.stack([signal[s:s + t] + c for s, c in zip(starts, offsets, strict=True)])


def test_blend_is_each_window_where_windows_do_not_overlap_and_has_no_step_at_borders():
    t, overlap, frames = 64, 16, 301
    rng = np.random.default_rng(0)
    signal = np.cumsum(rng.normal(0, 0.01, (frames, 5, 3)), axis=0)  # a smooth-ish trajectory
    starts = windows.window_starts(frames, t, overlap)
    offsets = rng.normal(0, 1.0, (len(starts), 1, 1, 3))          # the windows disagree by ~1
    per_window = _per_window(signal, starts, t, offsets)
    out = windows.blend(per_window, starts, frames)
    assert out.shape == signal.shape

    # Frames only one window covers are that window's output, exactly.
    owners = [[k for k, s in enumerate(starts) if s <= f < s + t] for f in range(frames)]
    alone = [f for f in range(frames) if len(owners[f]) == 1]
    assert len(alone) > frames / 2
    for f in alone:
        k = owners[f][0]
        np.testing.assert_array_equal(out[f], per_window[k, f - starts[k]])

    # No step: frame to frame, the blend moves by the signal's own step plus at most pi/2 * d / (o + 1)
    # of the neighbours' disagreement d, where cutting at the borders would jump by d.
    shared = starts[:-1] + t - starts[1:]
    d = np.abs(np.diff(offsets, axis=0)).max()
    step = np.abs(np.diff(out - signal, axis=0)).max()
    assert step <= np.pi / 2 * d / (shared.min() + 1) + 1e-9
    cut = np.concatenate([per_window[k, : (starts[k + 1] - starts[k]) if k + 1 < len(starts) else None]
                          for k in range(len(starts))])
    assert np.abs(np.diff(cut - signal, axis=0)).max() > 5 * step  # what the fade removes


def test_agreeing_windows_blend_to_the_signal_and_a_short_clip_to_its_padded_window():
    t, overlap, frames = 32, 8, 77
    signal = np.random.default_rng(1).normal(size=(frames, 4))
    starts = windows.window_starts(frames, t, overlap)
    np.testing.assert_allclose(windows.blend(_per_window(signal, starts, t, np.zeros(len(starts))),
                                             starts, frames), signal, atol=1e-12)
    short = signal[:20]
    padded = np.concatenate([short, np.repeat(short[-1:], t - 20, 0)])[None]  # edge padding to a window
    np.testing.assert_array_equal(windows.blend(padded, [0], 20), short)


def test_rotations_blend_as_rotations_whatever_the_quaternion_signs():
    t, overlap, frames = 32, 8, 90
    rng = np.random.default_rng(2)
    angles = np.cumsum(rng.normal(0, 0.05, (frames, 3, 3)), axis=0)  # smooth rotations of 3 joints
    rotations = Rotation.from_rotvec(angles.reshape(-1, 3))
    q = np.roll(rotations.as_quat().reshape(frames, 3, 4), 1, axis=-1)  # scipy's x,y,z,w -> w,x,y,z
    starts = windows.window_starts(frames, t, overlap)
    signs = rng.choice([-1.0, 1.0], size=(len(starts), t, 3, 1))    # q and -q: the same rotation
    per_window = np.stack([q[s:s + t] for s in starts]) * signs
    out = windows.blend_quaternions(per_window, starts, frames)
    # Agreeing windows: the blend is the rotation itself (up to the sign).
    np.testing.assert_allclose(np.abs(np.sum(out * q, -1)), 1.0, atol=1e-12)

    # Windows that disagree by a turn of 0.2 rad about a per-window axis: rotation angle between
    # consecutive output frames stays near the motion's own, where cutting would jump by ~0.2-0.4 rad.
    tilt = Rotation.from_rotvec(rng.normal(size=(len(starts), 3)) * 0.2 / np.sqrt(3))
    biased = [np.roll((tilt[k] * Rotation.from_quat(np.roll(per_window[k], -1, -1).reshape(-1, 4)))
                      .as_quat().reshape(t, 3, 4), 1, -1) for k in range(len(starts))]
    out = windows.blend_quaternions(np.stack(biased), starts, frames)
    angle = lambda a, b: 2 * np.arccos(np.clip(np.abs(np.sum(a * b, -1)), 0, 1))
    own = angle(q[1:], q[:-1]).max()
    d = max((tilt[k].inv() * tilt[k + 1]).magnitude() for k in range(len(starts) - 1))
    shared = (starts[:-1] + t - starts[1:]).min()
    assert angle(out[1:], out[:-1]).max() <= own + 1.05 * np.pi / 2 * d / (shared + 1)
    assert d > 5 * np.pi / 2 * d / (shared + 1)  # what cutting at the borders would jump by
