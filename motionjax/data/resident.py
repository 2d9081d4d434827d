"""The training corpus resident on the devices: its frames go there once, windows are drawn and
gathered there every step (the purejaxrl / MJX pattern: the host moves no bytes per step).

:class:`Corpus` holds the training split's segments concatenated (``root [N, 3]``, ``rotations [N, J,
4]``), each segment's clip bones, and the tables of the window distribution the host pipeline draws
from (:func:`motionjax.data.pipeline.segment_shares` over segments, then
:func:`motionjax.data.transforms.window_weights` over a segment's windows: uniform/dynamics mixture).
:func:`sample_rows` draws ``B`` windows from them with one key each: the rows of their spans, from which
:class:`motionjax.data.augment.Augment` gathers each window's frames (:func:`sample_spans` gathers the
spans themselves, the streamed tier's input). The segment distribution is an argument, so loss-aware
sampling (:mod:`motionjax.data.priority`) changes it without recompiling.

Every device holds the whole corpus (replicated over the mesh): a gather then never crosses devices.
Bandai-1's ~32k frames are ~11 MB; 128k clips of a few hundred frames are ~10 GB, which one H200
holds; :mod:`motionjax.data.feed` decides whether a corpus fits (``data.residency``).
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from motionjax.data import records, transforms
from motionjax.data.info import DatasetInfo


@dataclasses.dataclass(frozen=True)
class Corpus:
    """The training segments on the host, ready to go to the devices (:meth:`arrays`).

    root ``[N, 3]``, rotations ``[N, J, 4]`` float32: every training segment's frames, one after another.
    lowest ``[N]`` float32: each frame's lowest joint height on the bones its windows move on (its clip's;
    the dataset's with ``data.bones = "canonical"``; :func:`~motionjax.data.transforms.frame_floor`): a
    window's floor comes from it (:func:`~motionjax.data.transforms.window_floor`), no FK a batch.
    first ``[S]`` int32: a segment's first frame in them; length ``[S]`` int32: its frames.
    offsets ``[S, J, 3]`` float32: its clip's rest offsets (the dataset skeleton's without clip bones).
    shares ``[S]`` float64: each segment's share of the windows (0: it holds none).
    window_first ``[S]`` int32, window_count ``[S]`` int32: its windows in ``window_cdf``.
    window_cdf ``[W]`` float32: within each segment, the cumulative probability of its windows (the last
    one of a segment is 1); window ``k`` of a segment starts at its frame ``k``.
    """

    root: np.ndarray
    rotations: np.ndarray
    lowest: np.ndarray
    first: np.ndarray
    length: np.ndarray
    offsets: np.ndarray
    shares: np.ndarray
    window_first: np.ndarray
    window_count: np.ndarray
    window_cdf: np.ndarray

    @property
    def nbytes(self) -> int:
        return sum(np.asarray(getattr(self, f.name)).nbytes for f in dataclasses.fields(self))

    @property
    def bisect_steps(self) -> int:
        """Bisection steps that find a window among a segment's (:func:`bisect_steps`)."""
        return bisect_steps(self.window_count)

    def arrays(self, sharding, skeleton=None, mirror: transforms.MirrorFrames | None = None) -> dict:
        """The tables as jax arrays with ``sharding`` (replicated), every process passing its copy.
        ``mirror`` (the frames of :func:`~motionjax.data.augment.mirrored_rows`, with the corpus's
        ``skeleton``): ``"frames"`` then holds the frames' mirror image after them, ``[2N, W]``
        (:func:`~motionjax.data.transforms.mirror`; the floor column as it is: a reflection across a
        vertical plane moves no height)."""
        from motionjax import parallel
        names = ("first", "length", "offsets", "window_first", "window_count", "window_cdf")
        tables = {n: getattr(self, n) for n in names}
        # The frames as one table of rows (root, rotations, floor: transforms.frame_rows), the layout the
        # window's frames are gathered in (sample_rows, transforms.read_window_rows): one row gather a frame.
        tables["frames"] = self.frames
        if mirror is not None:
            root, rotations = transforms.mirror(skeleton, self.root, self.rotations, mirror)
            mirrored = transforms.frame_rows(root, rotations, self.lowest)
            tables["frames"] = np.concatenate([tables["frames"], mirrored])
        return parallel.put(tables, {n: sharding for n in tables})

    @property
    def frames(self) -> np.ndarray:
        """``[N, 3 + 4J + 1]`` float32: the frames as rows (root, rotations, lowest;
        :func:`~motionjax.data.transforms.frame_rows`)."""
        return transforms.frame_rows(self.root, self.rotations, self.lowest)


def bisect_steps(window_count) -> int:
    """Bisection steps that find a window among a segment's, for ``window_count [S]`` (the windows each
    segment holds): enough for the most any segment holds."""
    return max(1, math.ceil(math.log2(max(int(np.max(window_count)), 1))) + 1)


def corpus_nbytes(info: DatasetInfo, mirrored: bool = False) -> int:
    """Bytes :func:`load_corpus` will hold for ``info``'s training split, from the index alone; on the
    devices, with ``mirrored`` (:meth:`Corpus.arrays`' mirror image), its frames twice."""
    segments = info.splits[info.train_split]
    frames = sum(e - b for _, b, e in segments) * (2 if mirrored else 1)
    j = info.skeleton.num_joints
    windows = sum(n for n, _ in info.train_windows)
    return frames * (3 + 4 * j + 1) * 4 + len(segments) * (4 * 5 + 12 * j + 8) + windows * 4


def load_corpus(info: DatasetInfo, cfg, source, shares: np.ndarray) -> Corpus:
    """Read every training segment of ``info`` through ``source`` (clip id -> record dict:
    :class:`motionjax.data.pipeline.ClipSource`) into a :class:`Corpus`. ``shares [S]``: each
    segment's share of the windows (:func:`~motionjax.data.pipeline.segment_shares`). A bad record
    raises :class:`~motionjax.data.records.BadRecordError` naming its clip: a resident corpus is read
    once, whole, so a damaged clip is an error here rather than a skipped window."""
    num, total = sum(n for n, _ in info.train_windows), sum(s for _, s in info.train_windows)
    roots, rots, lows, firsts, lengths, offsets, cdfs, counts = [], [], [], [], [], [], [], []
    frame, cache = 0, {}
    for clip_id, begin, end in info.splits[info.train_split]:
        if clip_id not in cache:
            cache = {clip_id: source[clip_id]}  # segments of a clip are consecutive in the split
            records.check_clip(cache[clip_id], info.skeleton)
        clip = cache[clip_id]
        roots.append(np.asarray(clip["root_position"][begin:end], np.float32))
        rots.append(np.asarray(clip["rotations"][begin:end], np.float32))
        offsets.append(np.asarray(clip.get("offsets", info.skeleton.offsets), np.float32))
        # On the bones the windows move on: the clip's, or with data.bones = "canonical" the dataset's.
        bones = offsets[-1] if cfg.bones == "clip" else info.skeleton.offsets
        lows.append(transforms.stored_floor(info.skeleton, roots[-1], rots[-1], bones))
        firsts.append(frame)
        lengths.append(end - begin)
        frame += end - begin
        scores = transforms.segment_windows(clip["score"][begin:end], cfg.window)
        p = transforms.window_weights(scores, cfg.dynamics_sampling, num, total)
        c = np.cumsum(np.asarray(p, np.float64))
        cdfs.append((c / c[-1]).astype(np.float32) if c.size else np.zeros(0, np.float32))
        counts.append(c.size)
    counts = np.asarray(counts, np.int32)
    j = info.skeleton.num_joints
    return Corpus(root=np.concatenate(roots) if roots else np.zeros((0, 3), np.float32),
                  rotations=np.concatenate(rots) if rots else np.zeros((0, j, 4), np.float32),
                  lowest=np.concatenate(lows) if lows else np.zeros(0, np.float32),
                  first=np.asarray(firsts, np.int32), length=np.asarray(lengths, np.int32),
                  offsets=np.stack(offsets) if offsets else np.zeros((0, j, 3), np.float32),
                  shares=np.asarray(shares, np.float64),
                  window_first=(np.cumsum(counts) - counts).astype(np.int32), window_count=counts,
                  window_cdf=np.concatenate(cdfs) if cdfs else np.zeros(0, np.float32))


def segment_cdf(probabilities) -> np.ndarray:
    """``[S]`` float32 cumulative segment distribution (last = 1) of ``probabilities [S]``."""
    c = np.cumsum(np.asarray(probabilities, np.float64))
    return (c / c[-1]).astype(np.float32)


def sample_rows(tables: dict, seg_cdf, keys, span: int, bisect_steps: int, start_key: int = 0) -> dict:
    """Draw one window per key: the table rows of its span, not the span (the program gathers only the
    rows its window reads, :func:`~motionjax.data.transforms.read_window_rows`).

    ``tables``: :meth:`Corpus.arrays`; ``seg_cdf [S]``: :func:`segment_cdf` of the segment distribution;
    ``keys [B]``. A window's segment comes from ``seg_cdf``, its start from the segment's window
    distribution (inverse CDF: ``bisect_steps`` bisection steps inside the segment's rows of
    ``window_cdf``). Returns ``{"rows" [B, span] int32 (the row of ``tables["frames"]`` of each span
    frame; frames past the segment's end repeat its last one, :func:`~motionjax.data.transforms.read_span`),
    "length" [B], "offsets" [B, J, 3], "segment" [B]}``."""
    cdf = tables["window_cdf"]

    def one(key):
        k_seg, k_win = jax.random.split(jax.random.fold_in(key, start_key))
        seg = jnp.searchsorted(seg_cdf, jax.random.uniform(k_seg), side="right")
        seg = jnp.minimum(seg, seg_cdf.shape[0] - 1)
        u = jax.random.uniform(k_win)
        lo = tables["window_first"][seg]
        hi = lo + tables["window_count"][seg] - 1

        def bisect(_, bounds):  # the first window whose cumulative probability exceeds u
            lo, hi = bounds
            mid = (lo + hi) // 2
            right = cdf[mid] > u
            return jnp.where(right, lo, mid + 1), jnp.where(right, mid, hi)

        lo, _ = jax.lax.fori_loop(0, bisect_steps, bisect, (lo, hi))
        start = lo - tables["window_first"][seg]
        length = tables["length"][seg]
        rows = tables["first"][seg] + jnp.minimum(start + jnp.arange(span), length - 1)
        return {"rows": rows.astype(jnp.int32), "length": length - start, "offsets": tables["offsets"][seg],
                "segment": seg.astype(jnp.int32)}

    return jax.vmap(one)(keys)


def sample_spans(tables: dict, seg_cdf, keys, span: int, bisect_steps: int, start_key: int = 0) -> dict:
    """:func:`sample_rows`' windows with their spans gathered: ``{"root_position" [B, span, 3], "rotations"
    [B, span, J, 4], "lowest" [B, span], "length" [B], "offsets" [B, J, 3], "segment" [B]}`` (the input
    of :class:`~motionjax.data.augment.Augment` as the streamed tier's spans are)."""
    drawn = sample_rows(tables, seg_cdf, keys, span, bisect_steps, start_key)
    frames = tables["frames"]
    out = transforms.split_frames(frames[drawn.pop("rows")], (frames.shape[-1] - 4) // 4)
    return {**out, **drawn}
