"""Prepare-time dedup: exact and near-duplicate clips, and leakage of duplicates across splits.

A corpus gathered from many sessions repeats itself: the same take exported twice, a clip and a
trimmed copy of it, a retake that moves the same way. Training on the copies overweights them;
a copy on both sides of a train/test split inflates the test score. This module finds them from
joint positions only (any skeleton, any format), so it runs after decoding, before writing.

Pipeline (the prepare step calls the first three per clip, then the rest once per corpus):

1. :func:`body_frame` picks, from the skeleton, the hip pair (the shallowest pair of sibling
   joints whose rest offsets mirror each other; names are not used) and the body joints (the
   subtree of the hips' parent: a static ``joint_Root`` above ``Hips`` does not move with the
   body and is left out).
2. :func:`clip_descriptor`: the body joints of every frame, ``[T, Jb, 3]`` float32 (~250
   bytes a frame: 100 MB for a 400k-frame corpus).
3. :func:`exact_hash`: the whole clip canonicalized at its first frame (hip midpoint to the
   origin, hip axis turned onto a fixed horizontal axis), quantized to ``tol`` (0.1 mm),
   SHA-256. Equal hashes = the same motion, wherever and however it faces.
4. :func:`find_duplicates`: equal hashes are exact duplicates. For near-duplicates it cuts
   :func:`windows` (``window`` frames, every ``subsample``-th pose, canonicalized in the
   window's own body frame and scaled so that Euclidean distance = RMS joint distance in m):
   an index of every clip's windows every ``stride`` frames, queried with every clip's windows
   at *every* start frame (a copy trimmed by a few frames lines up exactly; with both sides
   strided, a 1-frame misalignment alone costs ~1.5 cm RMS on Bandai's motions). Neighbours
   within ``threshold_m`` in other clips come from a radius query on a KD-tree; two clips are
   near-duplicates when at least ``min_fraction`` of either one's index windows have a
   neighbour in the other. Clips linked by either kind form groups (union-find).
5. :func:`resolve_leakage` (groups + split assignment): a group spread over several splits is
   moved into one, and each move is reported.

Nearest-neighbour library: SciPy (``cKDTree.query_ball_point``). It is well kept, already a
dependency of JAX, and answers *exact* radius queries, which is what a threshold on a distance
needs (approximate indexes may miss a pair); on these windows it answers in half the time of
scikit-learn's ``KDTree.query_radius`` (1.1 vs 2.4 s for 103k queries into 14k windows).
Descriptors are first projected with PCA (``pca_dim`` components): a projection onto
orthonormal axes never lengthens a distance, so the radius query in PCA space returns a superset
of the true neighbours, which are then checked with the full windows. faiss-cpu would pay off
for corpora orders of magnitude larger (millions of windows, approximate search, GPUs); 3,000
clips / 400k frames index ~50k windows.

Why the exact hash alone is not enough: quantizing *every* coordinate to a grid makes a hash
fragile to re-encoding noise (a float32 round trip or a 6-decimal text format moves some of the
~10^4 coordinates of a clip across a grid boundary, with probability ~noise/grid each). So
:func:`find_duplicates` also reports as exact two clips whose windows all match within
``exact_tol_m`` RMS (found by the near-duplicate search at no extra cost). The hash still catches
byte-identical copies cheaply, including clips too short for a window.
"""
from __future__ import annotations

import collections
import collections.abc
import concurrent.futures
import dataclasses
import functools
import hashlib
import itertools
import mmap
import os
import tempfile

import numpy as np
import threadpoolctl

from motionjax.core.skeleton import Skeleton
from motionjax.data.records import ArrayFile

WINDOW = 32  # frames per descriptor window (~1 s at 30 fps)
STRIDE = 8  # frames between window starts: a copy shifted in time is at most 4 frames off
SUBSAMPLE = 4  # keep every 4th frame of a window (8 poses): poses 4 frames apart are redundant
THRESHOLD_M = 0.02  # m RMS: windows of "similar takes" (redundancy pruning, an opt-in: policy="prune")
# m RMS: windows of copies. Calibrated on Bandai-1: the moving windows of different files are never
# closer than 3.3 cm (0.1st percentile of nearest-neighbour distances; 1st: 4.4 cm), a copy with 3 mm
# of noise per coordinate stays within 1.03 cm. 1.2 cm sits above the copies, far below distinct takes.
COPY_M = 0.012
COPY_FRACTION = 0.8  # a clip is a copy when this share of its moving windows matches one other clip
MIN_FRACTION = 0.5  # share of either clip's moving windows that makes two clips near-identical (grouped)
IDLE_M = 0.03  # m: a window whose poses stay this close (RMS) to their mean pose is idle: no evidence
POLICIES = ("copies", "prune")  # drop copies only (default) | also drop similar takes (opt-in)
EXACT_TOL_M = 1e-4  # 0.1 mm: quantization of the exact hash; RMS tolerance of "exact"
PCA_DIM = 10  # KD-tree dims: 8 is ~5% faster, but lets 3.5x the candidates through on Bandai-1


# --------------------------------------------------------------------------------------------
# Per clip


@dataclasses.dataclass(frozen=True)
class BodyFrame:
    """Which joints describe the body and how to canonicalize it.

    Attributes:
      joints: skeleton indices of the joints kept (the body subtree).
      left, right: positions in ``joints`` of the hip pair: their midpoint is the origin, and
        the horizontal part of ``right - left`` is turned onto a fixed axis (heading removed).
      up_axis: index of the vertical world axis.
    """

    joints: tuple[int, ...]
    left: int
    right: int
    up_axis: int = 1
    mirror: tuple[int, ...] | None = None  # position in ``joints`` of each body joint's left/right twin


def _mirrored(a, b) -> bool:
    """Rest offsets ``a``, ``b`` [3] mirror each other across a coordinate plane (a hip pair).

    Any axis: offsets are in the parent's frame, which need not be world-aligned at rest (on
    Bandai the hip frame's x runs up the spine and the legs part along its y)."""
    size = max(np.linalg.norm(a), np.linalg.norm(b))
    if size < 1e-6:
        return False
    for axis in range(3):
        if abs(a[axis]) < 0.25 * size:
            continue
        flip = b.copy()
        flip[axis] = -flip[axis]
        if np.linalg.norm(a - flip) <= 0.15 * size:
            return True
    return False


@functools.lru_cache(maxsize=64)
def body_frame(skeleton: Skeleton, mirror: bool = True) -> BodyFrame:
    """The :class:`BodyFrame` of a skeleton, found from its rest offsets (names are not needed).

    The hip pair is the shallowest pair of siblings whose rest offsets mirror each other (ties:
    the widest apart); the body joints are the subtree of their parent. Both depend on the tree
    only (and on which bones mirror), not on bone lengths: every performer of a corpus on one
    tree gets the same frame. ``mirror``: also find each body joint's left/right twin by name (the
    corpus-level search needs them; a per-clip descriptor does not, and skips the name matching).
    """
    best = None
    for parent, kids in enumerate(skeleton.children):
        for i, k in itertools.combinations(kids, 2):
            a, b = skeleton.offsets[i], skeleton.offsets[k]
            if _mirrored(a, b):
                key = (skeleton.depth[i], -np.linalg.norm(a - b))
                if best is None or key < best[0]:
                    best = (key, parent, i, k)
    if best is None:
        raise ValueError(f"skeleton {skeleton} with joints {list(skeleton.names)} has no pair of sibling "
                         "joints with mirrored rest offsets (hips) to canonicalize the heading with; "
                         "build a dedup.BodyFrame by hand")
    _, parent, left, right = best
    in_body = np.arange(skeleton.num_joints) == parent
    for j in range(parent + 1, skeleton.num_joints):  # parents precede children
        in_body[j] |= in_body[skeleton.parents[j]]
    joints = tuple(int(j) for j in np.flatnonzero(in_body))
    twins = None
    if mirror:  # by joint names: mirrored copies are searched when every twin is in the body
        twin = skeleton.symmetry
        closed = all(int(twin[j]) in joints for j in joints)
        if closed and {int(twin[left]), int(twin[right])} == {left, right}:
            twins = tuple(joints.index(int(twin[j])) for j in joints)
            if twins == tuple(range(len(joints))):
                twins = None
    return BodyFrame(joints, joints.index(left), joints.index(right), skeleton.up_axis, twins)


def clip_descriptor(positions, body: BodyFrame):
    """``positions [T, J, 3]`` (metres) -> the clip's dedup descriptor ``[T, Jb, 3]`` float32:
    its body joints, every frame (~250 bytes a frame; what a prepare worker hands to
    :func:`find_duplicates`, which cuts and canonicalizes windows from it at every alignment)."""
    pos = np.asarray(positions)
    if pos.ndim != 3 or pos.shape[-1] != 3 or pos.shape[0] == 0:
        raise ValueError(f"positions must be [T>0, J, 3], got shape {pos.shape}")
    if max(body.joints) >= pos.shape[1]:
        raise ValueError(f"positions have {pos.shape[1]} joints; the body frame uses joint "
                         f"{max(body.joints)}")
    return pos[:, body.joints].astype(np.float32)


class _Clips(collections.abc.Sequence):
    """``descriptors`` (a mapping) in the order of ``names``, each read when indexed (a
    :class:`~motionjax.data.records.ArrayFile` reads it from disk), with its shape known without
    reading it."""

    def __init__(self, descriptors, names):
        self._d, self._names = descriptors, names

    def shape(self, k: int) -> tuple:
        d, name = self._d, self._names[k]
        return tuple(d.shape(name) if isinstance(d, ArrayFile) else np.shape(d[name]))

    def __getitem__(self, k):
        return np.asarray(self._d[self._names[k]], np.float32)

    def __len__(self) -> int:
        return len(self._names)


def window_starts(num_frames: int, window: int = WINDOW, stride: int = STRIDE):
    """``[n]`` start frames of the windows of a clip of ``num_frames``: every ``stride`` frames,
    plus one window ending at the last frame so the tail is covered (``[0]`` for a clip shorter
    than a window, which :func:`windows` pads)."""
    starts = np.arange(0, max(num_frames - window, 0) + 1, stride)
    if starts[-1] < num_frames - window:
        starts = np.append(starts, num_frames - window)
    return starts


def windows(desc, body: BodyFrame, starts, *, window: int = WINDOW, subsample: int = SUBSAMPLE):
    """Canonical windows of a clip descriptor ``desc [T, Jb, 3]`` -> ``[n, D]`` float32.

    Window ``i`` covers frames ``starts[i] + [0, window)``; its origin is the mean hip midpoint
    over those frames and its heading the mean hip axis (means, not the first frame: one
    frame's hips would turn mocap noise into a heading error that grows with arm's length).
    Every ``subsample``-th pose, rotated about the up axis so the hip axis lies along a fixed
    horizontal axis, is flattened and divided by ``sqrt(F·Jb)`` (``F = ceil(window/subsample)``,
    ``D = F·Jb·3``): the Euclidean distance of two rows is their RMS joint distance (m).
    A clip shorter than ``window`` is padded with its last frame.
    """
    pos = np.asarray(desc, np.float64)
    if pos.shape[0] < window:
        pos = np.concatenate([pos, np.repeat(pos[-1:], window - pos.shape[0], axis=0)])
    starts = np.asarray(starts)
    hip = pos[:, [body.left, body.right]]  # [T, 2, 3]
    csum = np.concatenate([np.zeros((1, 2, 3)), np.cumsum(hip, axis=0)])
    mean = (csum[starts + window] - csum[starts]) / window  # [n, 2, 3] window means
    origin = mean.mean(axis=1)  # [n, 3]
    lat = mean[:, 1] - mean[:, 0]
    w = pos[starts[:, None] + np.arange(0, window, subsample)[None, :]]  # [n, F, Jb, 3]
    w -= origin[:, None, None]
    # A proper rotation in the horizontal plane h1-h2 taking the hip axis onto +h1.
    h1, h2 = (body.up_axis + 2) % 3, (body.up_axis + 1) % 3
    norm = np.hypot(lat[:, h1], lat[:, h2])
    ok = norm > 1e-6  # hips stacked vertically the whole window (lying on the side): no heading
    c = np.where(ok, lat[:, h1] / np.where(ok, norm, 1), 1.0)[:, None, None]
    s = np.where(ok, lat[:, h2] / np.where(ok, norm, 1), 0.0)[:, None, None]
    x1, x2 = w[..., h1].copy(), w[..., h2]
    w[..., h1] = c * x1 + s * x2
    w[..., h2] = -s * x1 + c * x2
    n, f, j, _ = w.shape
    return (w.reshape(n, -1) / np.sqrt(f * j)).astype(np.float32)


def window_dim(body: BodyFrame, window: int = WINDOW, subsample: int = SUBSAMPLE) -> int:
    """``D``, the length of a canonical window (:func:`windows`): ``ceil(window/subsample)·Jb·3``."""
    return -(-window // subsample) * len(body.joints) * 3


def window_motion(w, body: BodyFrame, *, window: int = WINDOW, subsample: int = SUBSAMPLE):
    """``[n]`` how much each canonical window ``w [n, D]`` (:func:`windows`) moves: the RMS distance
    (m) of its poses from their mean pose. Below :data:`IDLE_M` a window is idle (standing still):
    idle poses look alike across any two clips, so they are no evidence of duplication."""
    f = -(-window // subsample)
    r = np.asarray(w).reshape(len(w), f, -1)
    return np.sqrt(((r - r.mean(1, keepdims=True)) ** 2).sum((1, 2)))


def mirror_windows(w, body: BodyFrame, *, window: int = WINDOW, subsample: int = SUBSAMPLE):
    """Canonical windows ``w [n, D]`` of a clip -> those of its mirror image (left and right
    swapped): the lateral coordinate negated and each joint replaced by its twin. Needs
    ``body.mirror``."""
    f = -(-window // subsample)
    r = np.asarray(w).reshape(len(w), f, len(body.joints), 3)[:, :, list(body.mirror)].copy()
    r[..., (body.up_axis + 2) % 3] *= -1  # the hip axis lies along this one after canonicalization
    return r.reshape(len(w), -1)


def exact_hash(desc, body: BodyFrame, *, tol: float = EXACT_TOL_M) -> str:
    """SHA-256 (hex) of a clip descriptor ``desc [T, Jb, 3]`` canonicalized at its first frame
    (hip midpoint to the origin, hip axis onto a fixed axis) and quantized to ``tol`` metres;
    the shape is hashed too."""
    pos = np.asarray(desc, np.float64)
    pos = pos - 0.5 * (pos[0, body.left] + pos[0, body.right])
    lat = pos[0, body.right] - pos[0, body.left]
    h1, h2 = (body.up_axis + 2) % 3, (body.up_axis + 1) % 3
    norm = np.hypot(lat[h1], lat[h2])
    c, s = (lat[h1] / norm, lat[h2] / norm) if norm > 1e-6 else (1.0, 0.0)
    x1, x2 = pos[..., h1].copy(), pos[..., h2].copy()
    pos[..., h1], pos[..., h2] = c * x1 + s * x2, -s * x1 + c * x2
    q = np.rint(pos / tol).astype(np.int64)
    h = hashlib.sha256(np.asarray(q.shape, np.int64).tobytes())
    h.update(q.tobytes())
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# Corpus


@dataclasses.dataclass
class DedupReport:
    """What :func:`find_duplicates` found.

    Attributes:
      drop: clip name -> why it is dropped (``"exact duplicate of X"`` or
        ``"near duplicate of X (RMS d cm over f% of windows)"``); X is a kept clip.
      groups: clips linked by duplicate pairs (connected components, >= 2 clips each), each
        listed kept-first in keep order (longest, then input order). A group can hold more
        than one kept clip when it is a chain (a~b, b~c, but c is no duplicate of a).
      pairs: every duplicate pair found, ``{"a", "b", "kind": "exact"|"near", "rms_cm",
        "fraction"}``: ``rms_cm`` the mean over matched windows of the RMS distance to the
        nearest window of the other clip, ``fraction`` the larger of the two clips' fractions
        of matched windows (1.0 for hash matches).
      stats: counts (clips, windows, candidate and verified window pairs, pca_dim).
    """

    drop: dict[str, str]
    groups: list[list[str]]
    pairs: list[dict]
    stats: dict

    def to_dict(self) -> dict:
        """JSON-ready, for the dataset index and the prepare summary."""
        return dataclasses.asdict(self)


class _UnionFind:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, i: int, j: int) -> None:
        self.parent[self.find(i)] = self.find(j)


def _pca_projection(x, pca_dim: int, seed: int):
    """``(project, dim)``: ``x [N, D]``'s projection onto its ``pca_dim`` leading principal axes
    (the identity where ``D`` or ``N`` is not above ``pca_dim``). An orthonormal projection only
    shrinks distances, so a KD-tree on it finds every pair within a radius (and some more)."""
    n, d = x.shape
    if d <= pca_dim or n <= pca_dim:
        return (lambda a: a[:]), d  # a[:]: an array, also for the rows of a file
    # PCA by an eigendecomposition of the covariance of <= 5000 windows ([D, D], D ~ 650):
    # ~10x faster than a randomized SVD here, and the basis only has to prune well.
    rows = np.sort(np.random.default_rng(seed).choice(n, size=min(n, 5000), replace=False))
    fit = x[rows].astype(np.float64)
    center = fit.mean(0)
    _, vecs = np.linalg.eigh((fit - center).T @ (fit - center))
    basis = np.ascontiguousarray(vecs[:, ::-1][:, :pca_dim], np.float32)  # [D, k] orthonormal
    center = center.astype(np.float32)

    def project(a):  # in row blocks of ~20 MB: no full-size temporary of the index
        return np.concatenate([(a[i:i + 8192] - center) @ basis for i in range(0, max(len(a), 1), 8192)])

    return project, pca_dim


def _query_batches(descs: list, body: BodyFrame, window: int, subsample: int, idle_m: float, batch: int,
                   stats: dict):
    """``(queries [M, D], clip [M], mirrored [M])`` batches of about ``batch`` windows: each clip's
    moving windows at every start frame, and their mirror images when ``body.mirror`` is known; a
    clip's queries never straddle two batches."""
    pending, size = [], 0
    for k, desc in enumerate(descs):
        t = max(len(desc), window)
        q = windows(desc, body, np.arange(t - window + 1), window=window, subsample=subsample)
        q = q[window_motion(q, body, window=window, subsample=subsample) >= idle_m]
        stats["query_windows"] += len(q)
        pending.append((q, np.full(len(q), k), np.zeros(len(q), bool)))
        size += len(q)
        if body.mirror is not None and len(q):
            pending.append((mirror_windows(q, body, window=window, subsample=subsample).astype(np.float32),
                            np.full(len(q), k), np.ones(len(q), bool)))
            size += len(q)
        if size >= batch or k == len(descs) - 1:
            if size:
                yield tuple(np.concatenate(a) for a in zip(*pending, strict=True))
            pending, size = [], 0


def _window_matches(descs: list, body: BodyFrame, threshold: float, window: int, stride: int,
                    subsample: int, pca_dim: int, seed: int, stats: dict, idle_m: float,
                    batch: int = 4096, scratch_dir=None):
    """For clip descriptors ``descs`` (one skeleton width): every (moving index window ``i``,
    clip ``b``, mirrored) such that a moving window of clip ``b`` at *any* start frame (mirrored
    or not) lies within ``threshold`` of window ``i`` (of another clip), with the smallest such
    distance. Idle windows (:func:`window_motion` below ``idle_m``) are neither indexed nor queried.

    Index: each clip's windows every ``stride`` frames (full descriptors for the check, their
    PCA projection in a KD-tree). Queries: each clip's windows at every start frame, and their
    mirror images when ``body.mirror`` is known, streamed clip by clip, so a copy trimmed by any
    number of frames still lines up with the index.
    Returns ``(window_owner [N], window [M], clip [M], mirrored [M], dist [M])`` (``N`` moving
    index windows). The index's scratch file goes in ``scratch_dir`` (``None``: the temp dir).
    """
    # The index of full windows (~2.5 KB each) is the one array of the corpus's size dedup needs: it
    # goes to an anonymous scratch file clip by clip, and memory holds only its PCA projection (40 B
    # a window) and the KD-tree over that. Rows are read back through a read-only memory map whose
    # pages are dropped after each block (they stay in the page cache, not in this process's RSS).
    with tempfile.TemporaryFile(dir=scratch_dir) as f:
        counts, idle = np.zeros(len(descs), np.int64), 0
        for k, d in enumerate(descs):
            w = windows(d, body, window_starts(len(d), window, stride), window=window, subsample=subsample)
            moving = window_motion(w, body, window=window, subsample=subsample) >= idle_m
            counts[k], idle = moving.sum(), idle + int((~moving).sum())
            f.write(np.ascontiguousarray(w[moving]).tobytes())
        stats["index_windows"] = int(counts.sum())
        stats["idle_index_windows"] = idle
        owner = np.repeat(np.arange(len(descs)), counts)
        if not counts.sum():
            empty = np.zeros(0, np.int64)
            return owner, empty, empty, np.zeros(0, bool), np.zeros(0, np.float32)
        f.flush()
        with _RowFile(f, window_dim(body, window, subsample)) as x:
            return _search(descs, body, x, owner, threshold, window, subsample, pca_dim, seed, stats, idle_m,
                           batch)


class _RowFile:
    """The rows ``[N, D]`` float32 of an open file, gathered through a read-only memory map whose
    pages are released after every gather (``x[rows]`` copies; ``len(x)``; ``x.shape``)."""

    def __init__(self, f, dim: int):
        self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.shape = (len(self._map) // (4 * dim), dim)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows) -> np.ndarray:
        x = np.frombuffer(self._map, np.float32).reshape(self.shape)
        try:
            return np.array(x[rows])
        finally:
            del x
            self._map.madvise(mmap.MADV_DONTNEED)  # clean file pages: re-read from the cache if needed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._map.close()


def _search(descs, body: BodyFrame, x: _RowFile, owner, threshold: float, window: int, subsample: int,
            pca_dim: int, seed: int, stats: dict, idle_m: float, batch: int):
    """:func:`_window_matches`'s search, over the index rows ``x`` (owned by clips ``owner [N]``)."""
    from scipy.spatial import cKDTree

    project, stats["pca_dim"] = _pca_projection(x, pca_dim, seed)
    tree = cKDTree(project(x))
    # The projection only shrinks distances; the slack covers float32 rounding in it.
    radius = threshold * (1 + 1e-3) + 1e-6

    def run(queries, q_clip, q_mirror):
        zq = project(queries)
        hits = tree.query_ball_point(zq, r=radius, return_sorted=False)
        lens = np.fromiter((len(h) for h in hits), np.int64, len(hits))
        q = np.repeat(np.arange(len(hits)), lens)
        i = np.concatenate(hits).astype(np.int64) if len(hits) else np.zeros(0, np.int64)
        other = owner[i] != q_clip[q]
        q, i = q[other], i[other]
        candidates = int(q.size)
        dist = np.empty(q.size, np.float32)
        for a in range(0, q.size, 8192):  # full-dimension distances, in blocks of ~20 MB
            dist[a:a + 8192] = np.linalg.norm(queries[q[a:a + 8192]] - x[i[a:a + 8192]], axis=1)
        keep = dist <= threshold
        i, b, mir, dist = i[keep], q_clip[q[keep]], q_mirror[q[keep]], dist[keep]
        return candidates, int(i.size), _min_per_key(i, b, mir, dist, len(descs))

    # Query batches run on threads (the KD-tree search and numpy release the GIL), a few in flight
    # at a time so memory stays bounded; results are collected in submission order.
    threads = max(1, min(4, os.cpu_count() or 1))
    jobs: collections.deque = collections.deque()
    out = []

    def collect(job):
        candidates, verified, found = job.result()
        stats["candidate_pairs"] += candidates
        stats["verified_pairs"] += verified
        out.append(found)

    # The pool is shut down (its gathers finished) before the caller closes the index's memory map,
    # also when a batch fails.
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for queries in _query_batches(descs, body, window, subsample, idle_m, batch, stats):
            jobs.append(pool.submit(run, *queries))
            if len(jobs) > 2 * threads:
                collect(jobs.popleft())
        while jobs:
            collect(jobs.popleft())
    if not out:
        empty = np.zeros(0, np.int64)
        return owner, empty, empty, np.zeros(0, bool), np.zeros(0, np.float32)
    i, b, mir, dist = (np.concatenate(parts) for parts in zip(*out, strict=True))
    return owner, i, b, mir, dist  # each clip's queries ran in one batch: (i, b, mirrored) are unique


def _min_per_key(i, b, mirrored, dist, num_clips: int):
    """Keep the smallest ``dist`` per ``(i, b, mirrored)``."""
    key = (i * num_clips + b) * 2 + mirrored
    order = np.lexsort((dist, key))
    first = np.ones(order.size, bool)
    first[1:] = key[order][1:] != key[order][:-1]
    sel = order[first]
    return i[sel], b[sel], mirrored[sel], dist[sel]


def _hash_edges(names: list, hashes: dict) -> dict:
    """``{(i, j): pair record}`` of clips with equal :func:`exact_hash` (``i < j``)."""
    missing = set(names) ^ set(hashes)
    if missing:
        raise ValueError(f"descriptors and hashes name different clips: {sorted(missing)[:5]}")
    by_hash: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        by_hash.setdefault(hashes[name], []).append(i)
    return {(i, j): {"kind": "exact", "rms_cm": 0.0, "fraction": 1.0, "alike": [i, j], "mirrored": False}
            for members in by_hash.values() for i, j in itertools.combinations(members, 2)}


def _keep_rule(names: list, rank: list, edges: dict) -> tuple[dict, list]:
    """``(drop {name: reason}, groups [[name, ...]])`` by :func:`find_duplicates`'s keep rule: clips
    in ``rank`` order, each dropped when it is alike with a partner kept already (the closest kind
    first: exact, copy, similar); groups are the connected components of ``edges``."""
    uf = _UnionFind(len(names))
    linked: dict[int, list[int]] = collections.defaultdict(list)
    for i, j in edges:
        uf.union(i, j)
        linked[i].append(j)
        linked[j].append(i)
    kept: set[int] = set()  # the partners of a clip only: no scan of every kept clip per clip
    place = {i: n for n, i in enumerate(rank)}
    order = {"exact": 0, "copy": 1, "similar": 2}
    drop: dict[str, str] = {}
    for i in rank:
        # Partners kept already, of which i is a copy (or a similar take when pruning).
        partners = [(k, edges[(min(i, k), max(i, k))]) for k in sorted(linked[i], key=place.__getitem__)
                    if k in kept]
        partners = [(k, e) for k, e in partners if i in e["alike"]]
        if not partners:
            kept.add(i)
            continue
        k, e = min(partners, key=lambda p: (order[p[1]["kind"]], -p[1]["fraction"], p[1]["rms_cm"]))
        how = f"RMS {e['rms_cm']:.2f} cm over {100 * e['fraction']:.0f}% of moving windows"
        drop[names[i]] = ("exact duplicate of " + names[k] if e["kind"] == "exact" else
                          f"{'mirrored ' if e['mirrored'] else ''}copy of {names[k]} ({how})"
                          if e["kind"] == "copy" else f"similar take to {names[k]} ({how})")
    components: dict[int, list[int]] = {}
    for i in rank:
        components.setdefault(uf.find(i), []).append(i)
    groups = sorted(([names[i] for i in g] for g in components.values() if len(g) > 1),
                    key=lambda g: names.index(g[0]))
    return drop, groups


def find_duplicates(descriptors: dict, hashes: dict | None = None, *, body: BodyFrame,
                    threshold_m: float = THRESHOLD_M, copy_m: float = COPY_M,
                    copy_fraction: float = COPY_FRACTION, min_fraction: float = MIN_FRACTION,
                    idle_m: float = IDLE_M, policy: str = "copies", window: int = WINDOW,
                    stride: int = STRIDE, subsample: int = SUBSAMPLE, exact_tol_m: float = EXACT_TOL_M,
                    pca_dim: int = PCA_DIM, seed: int = 0) -> DedupReport:
    """Copies and near-identical clips of a corpus.

    Args:
      descriptors: clip name -> :func:`clip_descriptor` ``[T, Jb, 3]``, in corpus order (a dict, or
        a :class:`~motionjax.data.records.ArrayFile`, read one clip at a time). All on
        skeletons with the same :class:`BodyFrame` ``body`` (bone lengths may differ); call once
        per skeleton group.
      hashes: clip name -> :func:`exact_hash`; ``None`` skips hash matching.
      copy_m: two moving windows match when their RMS joint distance is at most this (m); see
        :data:`COPY_M` for how the default is calibrated.
      copy_fraction: a clip whose moving windows match one other clip at this share or more is
        alike with it as a whole: a copy (exact, re-exported, resampled, mirrored, trimmed or
        slightly noised) and dropped.
      min_fraction: two clips of which either has this share of its moving windows matched in
        the other are near-identical (one contains much of the other): kept, grouped into one
        split.
      idle_m: windows moving less (:func:`window_motion`) are left out of the index, the queries
        and the shares: standing still is no evidence. A clip with no moving window is matched
        by its hash only.
      policy: ``"copies"`` (default) drops copies only; ``"prune"`` also drops *similar takes*,
        clips with ``min_fraction`` of their moving windows within ``threshold_m`` of another clip
        (redundancy pruning of repeated takes: an explicit opt-in).
      window, stride, subsample: windows of ``window`` frames every ``stride`` frames in the
        index (the shares count these), every ``subsample``-th pose kept; queries use every
        start frame, and each query's mirror image when ``body.mirror`` is known.
      exact_tol_m: copies of equal length whose windows all match within this RMS are reported
        as exact (re-encoded copies that the hash misses).
      pca_dim: components of the projection the KD-tree searches in.

    Keep rule: clips go in order longest first (ties: corpus order); a clip is dropped when it is
    a copy (or, with ``"prune"``, a similar take) of a clip already kept, and its reason names that
    clip. A clip linked only to dropped clips is kept (a chain is not collapsed), but stays in
    their group, so the splits keep the group together.
    """
    if policy not in POLICIES:
        raise ValueError(f"dedup policy {policy!r}: expected one of {POLICIES}")
    names = list(descriptors)
    descs = _Clips(descriptors, names)  # read clip by clip (from disk for an ArrayFile)
    shapes = [descs.shape(k) for k in range(len(names))]
    width = {sh[1:] for sh in shapes}
    if len(width) > 1 or (shapes and shapes[0][1:] != (len(body.joints), 3)):
        raise ValueError(f"descriptors must all be [T, {len(body.joints)}, 3] for this body frame; "
                         f"got shapes {sorted(width)}")
    frames = [sh[0] for sh in shapes]
    rank = sorted(range(len(names)), key=lambda i: (-frames[i], i))
    stats = {"clips": len(names), "frames": int(sum(frames)), "index_windows": 0, "query_windows": 0,
             "candidate_pairs": 0, "verified_pairs": 0, "copy_m": copy_m, "threshold_m": threshold_m,
             "copy_fraction": copy_fraction, "min_fraction": min_fraction, "idle_m": idle_m,
             "policy": policy}
    edges: dict[tuple[int, int], dict] = {}  # (i, j) with i < j -> pair record

    if hashes is not None:
        edges.update(_hash_edges(names, hashes))

    if len(names) > 1:
        radius = max(copy_m, threshold_m) if policy == "prune" else copy_m
        # One BLAS thread: the matrices are small, and on shared cores OpenBLAS threads spinning
        # against other processes made the [D, D] eigh 60x slower (6.5 s instead of 0.1 s).
        with threadpoolctl.threadpool_limits(1, user_api="blas"):
            scratch = os.path.dirname(descriptors.path) if isinstance(descriptors, ArrayFile) else None
            owner, row, clip, mirrored, dist = _window_matches(descs, body, radius, window, stride,
                                                               subsample, pca_dim, seed, stats, idle_m,
                                                               scratch_dir=scratch)
        for key, e in _pair_edges(owner, row, clip, mirrored, dist, frames, len(names), copy_m=copy_m,
                                  threshold_m=threshold_m, copy_fraction=copy_fraction,
                                  min_fraction=min_fraction, exact_tol_m=exact_tol_m, policy=policy).items():
            edges.setdefault(key, e)

    drop, groups = _keep_rule(names, rank, edges)
    pairs = [{"a": names[i], "b": names[j], **e, "alike": [names[k] for k in e["alike"]]}
             for (i, j), e in sorted(edges.items())]
    stats["kinds"] = dict(collections.Counter(e["kind"] for e in edges.values()))
    return DedupReport(drop, groups, pairs, stats)


def _pair_edges(owner, row, clip, mirrored, dist, frames, m: int, *, copy_m, threshold_m, copy_fraction,
                min_fraction, exact_tol_m, policy) -> dict:
    """Window matches -> pair records ``{(i, j): {"kind": "exact"|"copy"|"overlap"|"similar",
    "rms_cm", "fraction", "alike": the clips alike with the other as a whole (may be dropped; none
    for an overlap), "mirrored"}}``; shares over each clip's moving index windows."""
    nwin = np.bincount(owner, minlength=m)
    a = owner[row]
    directed: dict = {}  # (a, b) -> best over direct / mirrored of (share at copy_m, mean, worst, share
    for mir in (False, True):  # at threshold_m, mean at threshold_m)
        sel = mirrored == mir
        if not sel.any():
            continue
        aa, bb, dd = a[sel], clip[sel], dist[sel]
        code, inv = np.unique(aa * m + bb, return_inverse=True)
        close = dd <= copy_m
        count = np.bincount(inv, close, minlength=code.size)
        mean = np.bincount(inv, np.where(close, dd, 0), minlength=code.size) / np.maximum(count, 1)
        worst = np.zeros(code.size)
        np.maximum.at(worst, inv, np.where(close, dd, 0))
        loose = dd <= threshold_m
        count2 = np.bincount(inv, loose, minlength=code.size)
        mean2 = np.bincount(inv, np.where(loose, dd, 0), minlength=code.size) / np.maximum(count2, 1)
        for k, c in enumerate(code):
            i, j = int(c // m), int(c % m)
            rec = (count[k] / nwin[i], mean[k], worst[k], count2[k] / nwin[i], mean2[k], mir)
            if (i, j) not in directed or rec[:1] > directed[(i, j)][:1]:
                directed[(i, j)] = rec
    edges = {}
    for (i, j) in directed:
        key = (min(i, j), max(i, j))
        if key in edges:
            continue
        f_ij = directed.get((i, j), (0.0,) * 5 + (False,))
        f_ji = directed.get((j, i), (0.0,) * 5 + (False,))
        best = f_ij if f_ij[0] >= f_ji[0] else f_ji
        alike = [x for x, f in ((i, f_ij), (j, f_ji)) if f[0] >= copy_fraction]
        if alike:
            exact = (f_ij[0] == 1 and f_ji[0] == 1 and frames[i] == frames[j]
                     and max(f_ij[2], f_ji[2]) <= exact_tol_m and not best[5])
            edges[key] = {"kind": "exact" if exact else "copy", "rms_cm": round(100 * float(best[1]), 3),
                          "fraction": round(float(best[0]), 3), "alike": alike, "mirrored": bool(best[5])}
        elif best[0] >= min_fraction:
            edges[key] = {"kind": "overlap", "rms_cm": round(100 * float(best[1]), 3),
                          "fraction": round(float(best[0]), 3), "alike": [], "mirrored": bool(best[5])}
        elif policy == "prune":
            loose = f_ij if f_ij[3] >= f_ji[3] else f_ji
            alike = [x for x, f in ((i, f_ij), (j, f_ji)) if f[3] >= min_fraction]
            if alike:
                edges[key] = {"kind": "similar", "rms_cm": round(100 * float(loose[4]), 3),
                              "fraction": round(float(loose[3]), 3), "alike": alike,
                              "mirrored": bool(loose[5])}
    return edges


def resolve_leakage(groups, split_of: dict, *, into: str | None = None):
    """Keep every duplicate group inside one split.

    Args:
      groups: :attr:`DedupReport.groups` (kept-first lists of clip names).
      split_of: clip name -> split name (e.g. ``"train"``, ``"validation"``, ``"test"``).
      into: where a leaking group goes: ``None`` (default) the split of its first member (the
        clip the group keeps), so the split that holds the kept copy keeps the content; or a
        split name (e.g. ``"train"``) for all leaking groups.

    Returns ``(new_split_of, leakage)``: a new mapping (the input is not changed) and one report
    per leaking group: ``{"group", "splits": {name: old split}, "moved_to", "moved": [names]}``.
    Clips of a group missing from ``split_of`` are ignored.
    """
    new = dict(split_of)
    leakage = []
    for group in groups:
        members = [name for name in group if name in split_of]
        splits = {name: split_of[name] for name in members}
        if len(set(splits.values())) <= 1:
            continue
        target = into if into is not None else splits[members[0]]
        moved = [name for name in members if splits[name] != target]
        for name in moved:
            new[name] = target
        leakage.append({"group": members, "splits": splits, "moved_to": target, "moved": moved})
    return new, leakage
