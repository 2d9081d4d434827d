"""A procedural motion corpus of any size, deterministic from ``(seed, index)``, never stored.

Each clip: every rotating joint follows a sum of three random sinusoids (0.2-1.5 Hz) per degree
of freedom, kept inside joint limits (ball joints ±``BALL_LIMIT`` rad per axis; knees flex
backwards, elbows forwards, other hinges ±1 rad); the root walks: its yaw rate and forward speed
are smooth random signals, the position is integrated from the velocity, and the height bobs
around the standing height. Smooth, bounded, and cheap: a 240-frame clip takes ~1 ms.

:class:`SyntheticClips` is a Grain random-access source of the same records the ArrayRecord
shards hold; :func:`synthetic_motions` feeds :func:`motionjax.data.prepare.write_dataset` to put
the corpus on disk for I/O benchmarks.
"""
from __future__ import annotations

import numpy as np

from motionjax.core import rotations as rot
from motionjax.core.kinematics import forward_kinematics
from motionjax.core.skeleton import BALL, HINGE, Skeleton, deepmimic_humanoid
from motionjax.data import corpus, records, stats, transforms
from motionjax.data.info import DatasetInfo
from motionjax.formats import Motion

SPLITS = {"train": "rest", "validation": "tail:0.2"}
BALL_LIMIT = 0.5  # rad per axis
HINGE_LIMITS = {"knee": (-2.0, 0.0), "elbow": (0.0, 2.0)}  # DeepMimic sign conventions


def _smooth(rng, shape, t, fmin=0.2, fmax=1.5):
    """``[T, *shape]``: per channel a sum of 3 sinusoids whose amplitudes sum to 1 (range ±1)."""
    freq = rng.uniform(fmin, fmax, (*shape, 3))
    phase = rng.uniform(0, 2 * np.pi, (*shape, 3))
    amp = rng.dirichlet(np.ones(3), size=shape)
    t = t.reshape(-1, *([1] * (len(shape) + 1)))
    return (amp * np.sin((2 * np.pi * freq * t + phase).astype(np.float32))).sum(-1)


def synthetic_clip(skeleton: Skeleton, index: int, seed: int = 0, frames: int = 240, fps: float = 30.0):
    """Clip ``index`` of the corpus: ``(root_position [T, 3], rotations [T, J, 4])`` float32."""
    rng = np.random.default_rng([seed, index])
    t = np.arange(frames) / fps
    j = skeleton.num_joints
    vec = np.zeros((frames, j, 3))
    wave = _smooth(rng, (j, 3), t)  # [T, J, 3] in [-1, 1]
    for k, kind in enumerate(skeleton.kinds):
        if kind == BALL and k > 0:
            vec[:, k] = BALL_LIMIT * wave[:, k]
        elif kind == HINGE:
            lo, hi = next((v for key, v in HINGE_LIMITS.items() if key in skeleton.names[k]), (-1.0, 1.0))
            vec[:, k] = ((lo + hi) / 2 + (hi - lo) / 2 * wave[:, k, :1]) * skeleton.axes[k]
    up = skeleton.up_axis
    yaw_rate = rng.uniform(-1, 1) * 0.8 + 0.4 * wave[:, 0, 0]  # rad/s
    speed = np.clip(rng.uniform(0.3, 1.8) * (1 + 0.3 * wave[:, 0, 1]), 0, None)  # m/s
    yaw = np.cumsum(yaw_rate) / fps + rng.uniform(-np.pi, np.pi)
    axis = np.zeros(3)
    axis[up] = 1
    yaw_q = rot.axis_angle_to_quat(yaw[:, None] * axis)
    forward = np.zeros(3)
    forward[(up + 1) % 3] = 1
    velocity = rot.quat_rotate(yaw_q, np.broadcast_to(forward, (frames, 3))) * speed[:, None]
    root = np.cumsum(velocity, axis=0) / fps
    root[:, up] = transforms.rest_height(skeleton) * 0.97 + 0.03 * wave[:, 0, 2]
    rotations = rot.axis_angle_to_quat(vec)
    tilt = rot.axis_angle_to_quat(0.1 * wave[:, 0])  # small lean of the pelvis
    rotations[:, 0] = rot.quat_mul(yaw_q, tilt)
    return root.astype(np.float32), rotations.astype(np.float32)


class SyntheticClips:
    """Grain random-access source: record ``i`` = clip ``i`` (same dict as the shard records).

    Holds only ``(num_clips, frames, fps, seed)`` and the skeleton, so it pickles in bytes.
    """

    def __init__(self, num_clips: int, *, frames: int = 240, fps: float = 30.0, seed: int = 0,
                 skeleton: Skeleton | None = None):
        self.num_clips, self.frames, self.fps, self.seed = num_clips, frames, fps, seed
        self.skeleton = skeleton or deepmimic_humanoid()

    def __len__(self) -> int:
        return self.num_clips

    def __getitem__(self, index: int) -> dict:
        root, rotations = synthetic_clip(self.skeleton, index, self.seed, self.frames, self.fps)
        return {"name": f"synthetic_{self.seed}_{index:07d}", "root_position": root, "rotations": rotations,
                "score": transforms.dynamics_score(self.skeleton, root, rotations, self.fps)}


def synthetic_motions(num_clips: int, *, frames: int = 240, fps: float = 30.0, seed: int = 0,
                      skeleton: Skeleton | None = None):
    """The corpus as :class:`~motionjax.formats.Motion` objects (to write it to shards)."""
    skeleton = skeleton or deepmimic_humanoid()
    for i in range(num_clips):
        root, rotations = synthetic_clip(skeleton, i, seed, frames, fps)
        yield Motion(skeleton, fps, root, rotations, name=f"synthetic_{seed}_{i:07d}")


def synthetic_info(num_clips: int, *, window: int, frames: int = 240, fps: float = 30.0, seed: int = 0,
                   stats_clips: int = 64, skeleton: Skeleton | None = None) -> DatasetInfo:
    """Metadata of the generated corpus; stats from the first ``stats_clips`` clips' windows.

    Splits: the first 80% of every clip trains, the last 20% is ``validation``; no clip is held
    out whole (every synthetic clip is drawn from the same distribution).
    """
    source = SyntheticClips(num_clips, frames=frames, fps=fps, seed=seed, skeleton=skeleton)
    moments = stats.Moments(transforms.features.feature_dim(source.skeleton))
    rules = corpus.parse_rules(SPLITS)
    cut = corpus.train_cut(frames, corpus.tail_fraction(rules))
    score_sums = []
    for i in range(min(stats_clips, num_clips)):
        clip = source[i]
        records.check_clip(clip, source.skeleton)
        moments.update(stats.window_features(source.skeleton, clip["root_position"][:cut],
                                               clip["rotations"][:cut], window, max(window // 4, 1)))
        score_sums.append(transforms.segment_windows(clip["score"][:cut], window).sum())
    # Clips are alike by construction: every segment gets the sampled mean (uniform over clips).
    num = len(transforms.segment_windows(np.zeros(cut), window))
    train_windows = ((num, float(np.mean(score_sums))),) * num_clips
    names = [f"synthetic_{seed}_{i:07d}" for i in range(num_clips)]
    return DatasetInfo(
        data_dir="", skeleton=source.skeleton, fps=fps, mean=moments.mean.astype(np.float32),
        std=moments.std().astype(np.float32), names=tuple(names), frames=(frames,) * num_clips,
        splits=corpus.segments(rules, ["train"] * num_clips, [frames] * num_clips), window=window,
        train_windows=train_windows,
        synthetic={"num_clips": num_clips, "frames": frames, "seed": seed})


# --------------------------------------------------------------------------------------------
# Repeated takes (the dedup policy's test and benchmark corpus)

COPY_KINDS = ("exact", "noised", "mirrored", "resampled", "reexported")


def info_like(config, num_clips: int = 4) -> tuple[DatasetInfo, bool]:
    """``(info, real_rig)``: metadata to compile ``config``'s train step without preparing its data (the
    step depends on the rig's feature size, not on the clips): synthetic clips on the rig of the
    corpus's first BVH file where the config reads Bandai-1 or Bandai-2 (its archive, unpacked once)
    and it is there, else the synthetic skeleton."""
    from pathlib import Path

    from motionjax.data import archive
    from motionjax.formats import read_bvh_skeleton
    skeleton, source = None, str(config.data.source)
    if source.endswith("bandai-namco-1/data") or (archive.is_archive(source) and "bandai-namco" in source):
        files = (archive.motion_files(source) if archive.is_archive(source)
                 else sorted(Path(source).glob("*.bvh")))
        skeleton = read_bvh_skeleton(files[0], scale=0.01) if files else None
    window = config.data.window
    info = synthetic_info(num_clips, window=window, frames=2 * window, skeleton=skeleton)
    return info, skeleton is not None


def _stand(skeleton: Skeleton, rng, frames: int, fps: float):
    """``[T, J, 4]`` idle standing: one pose for every clip of a corpus (seeded by the caller),
    swaying by ~0.01 rad per joint."""
    t = np.arange(frames) / fps
    sway = 0.01 * _smooth(rng, (skeleton.num_joints, 3), t, 0.1, 0.4)
    pose = rot.axis_angle_to_quat(sway)
    return pose


def repeated_take(skeleton: Skeleton, action: int, take: int, *, seed: int = 0, frames: int = 134,
                  idle: int = 40, idle_end: int = 0, fps: float = 30.0, variation: float = 0.1):
    """Take ``take`` of action ``action``: ``idle`` frames standing still (the same idle for every
    action and take), the action, then ``idle_end`` frames standing again. Every take performs the
    action with its own variation: played at ±10% speed from its own phase, every joint off by a
    smooth ``variation`` rad (per axis) of its own. The body is lowered onto the floor (its lowest
    joint at height 0) every frame. Returns ``(root_position [T, 3], rotations [T, J, 4])`` float32."""
    base_root, base = synthetic_clip(skeleton, action, seed, frames=2 * frames, fps=fps)
    rng = np.random.default_rng([seed, action, take, 7])
    speed = rng.uniform(0.9, 1.1)
    start = rng.uniform(0, 0.1 * frames)
    moving = frames - idle - idle_end
    src = start + speed * np.arange(moving)
    root, rots = transforms.interpolate_frames(base_root.astype(np.float64), base.astype(np.float64), src)
    wobble = variation * _smooth(rng, (skeleton.num_joints, 3), np.arange(moving) / fps)
    wobble[:, 0] = 0.0  # the heading stays the action's
    rots = rot.quat_mul(rots, rot.axis_angle_to_quat(wobble))
    stand = _stand(skeleton, np.random.default_rng([seed, 99]), idle, fps)
    # Blend from the idle pose into the action over the first 8 frames of the action.
    w = np.clip(np.arange(moving) / 8, 0, 1)[:, None]
    rots = rot.quat_slerp(np.broadcast_to(stand[-1], rots.shape), rots, np.broadcast_to(w, rots.shape[:-1]))
    root = root - root[0]
    root[:, skeleton.up_axis] = base_root[0, skeleton.up_axis]
    idle_root = np.broadcast_to(root[0], (idle, 3))
    # Back to the idle pose over the last 8 frames of the action (takes start and end standing).
    w = np.clip((moving - 1 - np.arange(moving)) / 8, 0, 1)[:, None] if idle_end else np.ones((moving, 1))
    rots = rot.quat_slerp(np.broadcast_to(stand[0], rots.shape), rots, np.broadcast_to(w, rots.shape[:-1]))
    end_rots = _stand(skeleton, np.random.default_rng([seed, 99]), idle_end, fps)
    out_root = np.concatenate([idle_root, root, np.broadcast_to(root[-1], (idle_end, 3))])
    out_rots = rot.quat_normalize(np.concatenate([stand, rots, end_rots]))
    # On the floor: the lowest joint touches it every frame (the procedural limbs swing freely).
    low = np.asarray(forward_kinematics(skeleton, out_rots, out_root)[0])[..., skeleton.up_axis].min(-1)
    out_root[:, skeleton.up_axis] -= low
    return out_root.astype(np.float32), out_rots.astype(np.float32)


def plant_copy(skeleton: Skeleton, motion: Motion, kind: str, rng) -> Motion:
    """A copy of ``motion`` as corpora hold them: ``exact`` (the same frames), ``noised`` (3 mm per
    root coordinate, 0.005 rad per joint), ``mirrored`` (left and right swapped), ``resampled``
    (exported at twice the rate), ``reexported`` (turned about the vertical and moved elsewhere)."""
    root, rots = np.asarray(motion.root_position, np.float64), np.asarray(motion.rotations, np.float64)
    fps = motion.fps
    if kind == "noised":
        root = root + rng.normal(0, 3e-3, root.shape)
        rots = rot.quat_mul(rots, rot.axis_angle_to_quat(rng.normal(0, 5e-3, (*rots.shape[:-1], 3))))
    elif kind == "mirrored":
        root, rots = transforms.mirror(skeleton, root, rots, transforms.mirror_frames(skeleton))
    elif kind == "resampled":
        root, rots = transforms.interpolate_frames(root, rots, np.arange(2 * len(root) - 1) / 2)
        fps = 2 * fps
    elif kind == "reexported":
        axis = np.zeros(3)
        axis[skeleton.up_axis] = 1.0
        turn = rot.axis_angle_to_quat(rng.uniform(-np.pi, np.pi) * axis)
        shift = rng.normal(0, 2.0, 3)
        shift[skeleton.up_axis] = 0.0
        root = rot.quat_rotate(turn, root) + shift
        rots = rots.copy()
        rots[:, 0] = rot.quat_mul(np.broadcast_to(turn, rots[:, 0].shape), rots[:, 0])
    elif kind != "exact":
        raise ValueError(f"copy kind {kind!r}: expected one of {COPY_KINDS}")
    return Motion(skeleton, fps, root.astype(np.float32), rot.quat_normalize(rots).astype(np.float32),
                  name=f"{motion.name}_{kind}_copy")


def repeated_takes(actions: int, takes: int, *, frames: int = 134, idle: int = 40, idle_end: int = 0,
                   fps: float = 30.0, variation: float = 0.1, seed: int = 0, copies: int = 0,
                   skeleton: Skeleton | None = None):
    """``actions`` x ``takes`` :func:`repeated_take` clips named ``action{a:03d}_take{k:02d}``, then
    ``copies`` copies of each of :data:`COPY_KINDS` of takes chosen at random (named
    ``<take>_<kind>_copy``), as :class:`~motionjax.formats.Motion` objects."""
    skeleton = skeleton or deepmimic_humanoid()
    out = []
    for a in range(actions):
        for k in range(takes):
            root, rots = repeated_take(skeleton, a, k, seed=seed, frames=frames, idle=idle,
                                       idle_end=idle_end, fps=fps, variation=variation)
            out.append(Motion(skeleton, fps, root, rots, name=f"action{a:03d}_take{k:02d}"))
    rng = np.random.default_rng([seed, 1234])
    originals = list(out)
    for kind in COPY_KINDS:
        for i in rng.choice(len(originals), size=min(copies, len(originals)), replace=False):
            out.append(plant_copy(skeleton, originals[int(i)], kind, rng))
    return out
