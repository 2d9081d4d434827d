"""The Grain input pipeline: clip records -> training spans on the mesh (``data.residency =
"stream"``), and the held-out batches of evaluation.

The host draws each training window's start and ships its span (the frames from the start,
:func:`transforms.read_span`); :mod:`motionjax.data.augment` reads the window at its speed and does
every other transform on the device (:mod:`motionjax.data.feed` puts the two together; with the corpus
on the device, :mod:`motionjax.data.resident` draws the spans there and Grain is not used).

Training graph (:func:`train_dataset`)::

  SlotBatches: global batch m = B slots      (train_slots: training segments, each repeated by its
                                             share of the windows; shuffled anew every epoch, repeated;
                                             one stream for any process count)
    -> random_map(SampleBatch)               this process's B / process_count rows of the batch: read
                                             each clip record (ArrayRecord or synthetic) through a host
                                             cache that keeps dynamic segments longest, check it (bad
                                             ones: skipped, counted, warned, another slot drawn;
                                             strict raises), draw a start (uniform/dynamics-score
                                             mixture), slice the span, stack the rows
    -> mp_prefetch(worker_count)             0 workers = in the main process (-1: feed.auto_workers)
    -> thread prefetch -> to global jax Arrays (make_array_from_process_local_data) -> prefetch

Grain's elements are whole batches: its per-element machinery (index shuffle, generator reset,
metrics) costs ~100 us a call, which per window capped the stream at ~140 batches/s of 32 (#53).
The draws come from Grain's per-batch generator of the global batch, so spans depend only on
``seed``, not on the process count, and the iterator state Grain checkpoints (``get_state``/
``set_state``, ``grain.checkpoint.CheckpointSave``) restores the exact stream. The prefetch stages
are Grain's own ``ThreadPrefetchIterDataset``: their state counts the batches the consumer took, not
those waiting in the buffers.

Spans: ``{"frames" [B, S, W] float32 (the rows of :func:`transforms.frame_rows`, which the next three view),
"root_position" [B, S, 3], "rotations" [B, S, J, 4] float32, "length" [B] int32}``, with
``data.bones = "clip"`` also ``"offsets" [B, J, 3]`` (each window's clip's rest offsets: its
performer's bones), with loss-aware sampling ``"segment" [B]``, and when windows take their floor
from their spans (:func:`transforms.floor_from_spans`) ``"lowest" [B, S]`` (each frame's lowest joint
height, :func:`transforms.frame_floor`, computed once a segment in the host cache)
(:mod:`motionjax.data.augment`).

Evaluation batches (:func:`make_eval_batches`) are made on the host with the same transforms
(:func:`transforms.make_example` in numpy): ``{"noisy", "clean": [B, N, C, F] float32 standardized
features, "valid": [B, N, C, 1] (0 = edge padding past the end of a short segment: every loss term
and metric weights frames by it), "mask": [B, N, C, 1] (1 = frame masked out of ``noisy``)}``; with
``data.bones = "clip"`` also ``"offsets": [B, J, 3]`` float32, for FK in losses and metrics.
``"canonical"``: no ``offsets``; every clip moves on the dataset skeleton (the per-joint median of the
clips' bones).
"""
from __future__ import annotations

import dataclasses
import functools
import sys

import grain
import jax
import numpy as np
from grain.experimental import ThreadPrefetchIterDataset
from jax.sharding import NamedSharding, PartitionSpec

from motionjax.data import prepare as prep
from motionjax.data import records, synthetic, transforms
from motionjax.data.info import DatasetInfo


def dataset_info(cfg) -> DatasetInfo:
    """The dataset ``cfg`` (``config.data``) names, preparing the shards first if needed (idempotent),
    with its feature std raised to ``cfg.std_floor`` (training, evaluation and inference all read it
    here, so they standardize alike)."""
    if cfg.source == "synthetic":
        info = synthetic.synthetic_info(cfg.synthetic_clips, window=cfg.window, frames=cfg.synthetic_frames,
                                        fps=cfg.fps, seed=cfg.synthetic_seed)
    else:
        info = prep.prepare(cfg.source, cfg.dir, settings=prep.Settings.from_config(cfg), strict=cfg.strict,
                            workers=cfg.prepare_workers, progress=False)
    if cfg.std_floor > 0:
        info = dataclasses.replace(info, std=np.maximum(info.std, np.float32(cfg.std_floor)))
    return info


BONES = ("clip", "canonical")


def _clip_bones(cfg) -> bool:
    """Whether batches carry each clip's rest offsets (``data.bones``)."""
    if cfg.bones not in BONES:
        raise ValueError(f"config.data.bones={cfg.bones!r}; expected one of {BONES}")
    return cfg.bones == "clip"


def _check(cfg, info: DatasetInfo) -> None:
    _clip_bones(cfg)
    if abs(cfg.fps - info.fps) > 1e-6 or cfg.window != info.window:
        raise ValueError(f"{info.data_dir or 'synthetic corpus'} was prepared at fps={info.fps}, "
                         f"window={info.window}; config asks fps={cfg.fps}, window={cfg.window}: re-run "
                         "motionjax prepare with matching --fps/--window")
    if cfg.window % cfg.chunk:
        raise ValueError(f"config.data.window={cfg.window} is not a multiple of chunk={cfg.chunk}")


class ClipSource:
    """Random access to clip records: the ArrayRecord shards, or the synthetic generator.

    Pickles as paths (the readers open lazily in each worker). One reader per shard, so a shard
    that fails to read is named (:class:`records.DamagedShardError`).
    """

    def __init__(self, info: DatasetInfo):
        self.paths = info.shard_paths()
        self.synthetic = info.synthetic and dict(info.synthetic, fps=info.fps, skeleton=info.skeleton)
        self._reader = None

    def __getstate__(self):
        return dict(self.__dict__, _reader=None)

    def __len__(self) -> int:
        return len(self._open()) if self.synthetic else int(self._open()[1][-1])

    def _open(self):
        if self._reader is None:
            if self.synthetic:
                s = self.synthetic
                self._reader = synthetic.SyntheticClips(s["num_clips"], frames=s["frames"], fps=s["fps"],
                                                        seed=s["seed"], skeleton=s["skeleton"])
            else:
                shards = []
                for path in self.paths:
                    try:
                        shards.append(grain.sources.ArrayRecordDataSource([path]))
                    except (RuntimeError, OSError) as e:  # Riegeli: truncated file, bad footer
                        raise records.DamagedShardError(path, e) from None
                self._reader = shards, np.cumsum([len(r) for r in shards])
        return self._reader

    def __getitem__(self, index: int) -> dict:
        if self.synthetic:
            return self._open()[int(index)]
        shards, ends = self._open()
        shard = int(np.searchsorted(ends, int(index), side="right"))
        if shard == len(shards):
            raise IndexError(f"clip {index} of {int(ends[-1])}")
        try:
            item = shards[shard][int(index) - (int(ends[shard - 1]) if shard else 0)]
        except (RuntimeError, OSError) as e:  # Riegeli: chunk hash mismatch, short read
            raise records.DamagedShardError(self.paths[shard], e) from None
        return records.decode_record(item)


SLOTS = 4096  # slots a segment's share of the windows is rounded to (at least one a segment)


def _window_totals(info: DatasetInfo) -> tuple[int, float]:
    """Number of training windows and the sum of their dynamics scores."""
    return sum(n for n, _ in info.train_windows), sum(s for _, s in info.train_windows)


def segment_shares(info: DatasetInfo, window: int, dynamics_sampling: float) -> np.ndarray:
    """``[S]`` each training segment's share ``p(c)`` of the window distribution (the uniform/dynamics
    mixture of :func:`transforms.window_weights`; 0 for a segment holding no window), in the order of
    ``info.splits[info.train_split]``."""
    num, total = _window_totals(info)
    if num == 0:
        raise ValueError(f"no training segment of {info.data_dir or 'the synthetic corpus'} "
                         f"holds {window} frames")
    n, score_sum = (np.array(c, np.float64) for c in zip(*info.train_windows, strict=True))
    hot = score_sum / total if total > 0 else n / num
    return np.where(n > 0, (1 - dynamics_sampling) * n / num + dynamics_sampling * hot, 0.0)


def train_slots(info: DatasetInfo, window: int, dynamics_sampling: float) -> np.ndarray:
    """``[S, 4]`` (slot id, clip, begin, end): one epoch of training draws.

    Segment ``c`` fills ``max(1, round(SLOTS·p(c)))`` slots with ``p(c)`` its share of the window
    distribution (:func:`segment_shares`); :class:`SampleWindow` then draws the start from
    ``p(start | c)``, so windows follow the global uniform/dynamics mixture. A segment shorter than a
    window is one padded window (:func:`transforms.segment_windows`)."""
    shares = segment_shares(info, window, dynamics_sampling)
    slots = np.repeat(_train_segments(info), [max(1, round(SLOTS * p)) if p > 0 else 0 for p in shares],
                      axis=0)
    return np.concatenate([np.arange(len(slots))[:, None], slots], axis=1)


def segment_rows(info: DatasetInfo, segments) -> np.ndarray:
    """``[K, 4]`` (segment, clip, begin, end) rows of the training segments ``segments [K]`` (indices
    into ``info.splits[info.train_split]``): draws :class:`SampleWindow` takes like slots, naming the
    segment in each window (loss-aware sampling, :mod:`motionjax.data.priority`)."""
    segments = np.asarray(segments, np.int64)
    return np.concatenate([segments[:, None], _train_segments(info)[segments]], axis=1)


def _train_segments(info: DatasetInfo) -> np.ndarray:
    """``[S, 3]`` (clip, begin, end) of the training segments, in ``info.splits`` order."""
    return np.asarray(info.splits[info.train_split], np.int64).reshape(-1, 3)


class SlotBatches(grain.MapDataset):
    """``[B, 4]`` global batch ``m`` of a table of slots (:func:`train_slots`, or the rows of
    :func:`segment_rows`): rows ``[m·B, (m+1)·B)`` of the table repeated forever, each epoch in the
    order of its own permutation (a function of ``(seed, epoch)``) or, with ``shuffle=False``, in
    table order. The same global stream for any number of processes (:class:`SampleBatch` takes each
    one's rows)."""

    def __init__(self, table: np.ndarray, batch_size: int, *, seed: int, shuffle: bool = True):
        super().__init__()
        self.table = np.asarray(table, np.int64)
        self._batch, self._seed, self._shuffle = batch_size, seed, shuffle
        self._orders: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return sys.maxsize

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            if len(self._orders) > 1:  # a batch spans at most two epochs
                del self._orders[min(self._orders)]
            self._orders[epoch] = np.random.default_rng((self._seed, epoch)).permutation(len(self.table))
        return self._orders[epoch]

    def __getitem__(self, m):
        if isinstance(m, slice):
            return self.slice(m)
        epochs, rows = np.divmod(np.arange(int(m) * self._batch, (int(m) + 1) * self._batch), len(self.table))
        if self._shuffle and epochs[0] == epochs[-1]:  # the batch inside one epoch (all but one an epoch)
            rows = self._order(int(epochs[0]))[rows]
        elif self._shuffle:
            rows = np.concatenate([self._order(int(e))[rows[epochs == e]] for e in np.unique(epochs)])
        return self.table[rows]

    def __str__(self) -> str:
        return f"SlotBatches({len(self.table)} slots, {self._batch} a batch)"


class SegmentCache:
    """Decoded training segments in host memory, up to ``capacity`` bytes.

    When a new segment does not fit, the cached ones with the calmest windows go first (lowest
    dynamics priority; the oldest among equals): the reference system's motion-aware eviction, which
    keeps the dynamic bursts (drawn most under dynamics sampling, and the windows a model learns
    last) resident longest. :meth:`stats` counts hits and misses."""

    def __init__(self, capacity: int):
        self.capacity, self.bytes, self.hits, self.misses, self.evictions = int(capacity), 0, 0, 0, 0
        self._items: dict = {}  # key -> (value, nbytes, priority); insertion order = age

    def get(self, key):
        item = self._items.get(key)
        if item is None:
            self.misses += 1
            return None
        self.hits += 1
        return item[0]

    def put(self, key, value, nbytes: int, priority: float) -> None:
        if nbytes > self.capacity:  # never fits: evict nothing for it
            return
        while self._items and self.bytes + nbytes > self.capacity:
            calm = min(self._items, key=lambda k: self._items[k][2])  # first among equals: the oldest
            self.bytes -= self._items.pop(calm)[1]
            self.evictions += 1
        self._items[key] = (value, nbytes, priority)
        self.bytes += nbytes

    def stats(self) -> dict:
        looks = self.hits + self.misses
        return {"hits": self.hits, "misses": self.misses, "hit_rate": self.hits / looks if looks else None,
                "evictions": self.evictions, "cached_mb": self.bytes / 2**20, "segments": len(self._items)}


class SampleWindow:
    """``(slot, rng) -> span`` (or None for a bad record), one training draw.

    The start is drawn from :func:`transforms.window_weights` restricted to the slot's segment
    (``dynamics_sampling`` mixes score-weighted and uniform); the span is the
    :func:`transforms.span_frames` frames from it (:func:`transforms.read_span`). Segments are read
    through a :class:`SegmentCache` of ``data.host_cache_mb`` (``cache``: one to share, e.g. across
    the pipelines loss-aware sampling opens block after block).
    """

    def __init__(self, source: ClipSource, info: DatasetInfo, cfg, name_segment: bool = False,
                 cache: SegmentCache | None = None):
        self.source, self.skeleton, self.name_segment = source, info.skeleton, name_segment
        self.window, self.dynamics_sampling = cfg.window, cfg.dynamics_sampling
        self.span = transforms.span_frames(cfg.window, cfg.speed_range)
        self.bones = info.skeleton.offsets if _clip_bones(cfg) else None
        self.floor = transforms.floor_from_spans(cfg)  # spans carry each frame's floor ("lowest")
        self.num_windows, self.total_score = _window_totals(info)
        self.bad = records.BadRecordCounter(cfg.strict)
        self.cache_bytes = int(cfg.host_cache_mb * 2**20)
        self.cache = SegmentCache(self.cache_bytes) if cache is None else cache

    def __getstate__(self):  # each worker process starts with an empty cache of its own
        return dict(self.__dict__, cache=SegmentCache(self.cache_bytes))

    def _segment(self, clip_id: int, begin: int, end: int) -> dict:
        """The segment's frames, bones and start CDF; raises BadRecordError for a bad record."""
        key = (clip_id, begin, end)
        segment = self.cache.get(key)
        if segment is None:
            clip = self.source[clip_id]
            records.check_clip(clip, self.skeleton)
            scores = transforms.segment_windows(clip["score"][begin:end], self.window)
            p = transforms.window_weights(scores, self.dynamics_sampling, self.num_windows, self.total_score)
            root = np.asarray(clip["root_position"][begin:end], np.float32)
            rotations = np.asarray(clip["rotations"][begin:end], np.float32)
            segment = {"cdf": np.cumsum(p)}
            if self.bones is not None:
                segment["offsets"] = np.asarray(clip.get("offsets", self.bones), np.float32)
            lowest = None
            if self.floor:  # once a segment, on the bones its windows move on (as the resident corpus)
                lowest = transforms.stored_floor(self.skeleton, root, rotations,
                                                 segment.get("offsets", self.skeleton.offsets))
            segment["frames"] = transforms.frame_rows(root, rotations, lowest)
            nbytes = sum(v.nbytes for v in segment.values())
            self.cache.put(key, segment, nbytes, float(scores.max()) if scores.size else 0.0)
        return segment

    def __call__(self, slot, rng: np.random.Generator):
        return self.draw(slot, rng.random())

    def locate(self, slot, u: float):
        """``(segment, start)`` of ``slot``'s draw whose start is the ``u``-quantile (``u`` in [0, 1))
        of the slot segment's start distribution (``segment``: :meth:`_segment`'s), or None for a bad
        record (skipped and counted)."""
        return self.locate_rows(np.asarray(slot, np.int64)[None], np.asarray([u], np.float64))[0]

    def locate_rows(self, slots, u) -> list:
        """:meth:`locate` of each row of ``slots [b, 4]`` at ``u [b]``: one lean loop over the rows (a
        cache lookup and an inverse-CDF search each), ~4x cheaper a row than a call a row."""
        out = []
        segment_of, bad = self._segment, self.bad
        for (_, clip_id, begin, end), q in zip(slots.tolist(), u.tolist(), strict=True):
            try:
                segment = segment_of(clip_id, begin, end)
            except records.BadRecordError as e:
                bad.skip(e, f"#{clip_id}")
                out.append(None)
                continue
            cdf = segment["cdf"]
            # Inverse-CDF draw (Generator.choice re-validates p on every call, ~10x slower).
            out.append((segment, min(int(cdf.searchsorted(q * cdf[-1], side="right")), cdf.size - 1)))
        return out

    def gather(self, found, slots, into: dict | None = None) -> dict:
        """The spans of ``found`` (:meth:`locate`'s ``(segment, start)`` of each row) and ``slots [b,
        4]`` (their first column names the segment, with ``name_segment``), stacked: each row's frames
        are copied once, as one slice of its segment's frame rows (:func:`transforms.frame_rows`)
        straight into the batch's ``"frames" [b, S, W]`` (the frames past the segment's end repeat its
        last, as :func:`transforms.read_rows`); ``root_position``, ``rotations`` and ``lowest`` are views
        of it (:func:`transforms.split_frames`). ``into``: arrays to write the leaves in
        (:meth:`Packed.empty`'s views of a wire: the batch is then packed as it is gathered, no copy
        of its own), returned with the views."""
        n, s = len(found), self.span
        into = {} if into is None else into
        frames = into.get("frames")
        if frames is None:
            frames = np.empty((n, s, found[0][0]["frames"].shape[1]), np.float32)
        length = into["length"] if "length" in into else np.empty(n, np.int32)
        for r, (segment, start) in enumerate(found):
            rows = segment["frames"]
            transforms.read_rows(rows, start, rows.shape[0], s, out=frames[r])
            length[r] = rows.shape[0] - start
        out = {**into, "frames": frames, **transforms.split_frames(frames, self.skeleton.num_joints),
               "length": length}
        if self.bones is not None:
            offsets = into["offsets"] if "offsets" in into else np.empty((n, *self.bones.shape), np.float32)
            for r, (segment, _) in enumerate(found):
                offsets[r] = segment["offsets"]
            out["offsets"] = offsets
        if self.name_segment:  # rows of segment_rows: the first column is the segment
            segment = into["segment"] if "segment" in into else np.empty(n, np.int32)
            segment[:] = np.asarray(slots, np.int64)[:, 0]
            out["segment"] = segment
        return out

    def draw(self, slot, u: float):
        """The span of ``slot`` whose start is the ``u``-quantile (``u`` in [0, 1)) of the slot
        segment's start distribution (None for a bad record): one row of :meth:`gather`."""
        found = self.locate(slot, u)
        return None if found is None else {k: v[0] for k, v in self.gather([found], [slot]).items()}


class SampleBatch:
    """``(slots [K·B, 4], rng) -> spans``: of each of the ``K = block`` global batches of slots, rows
    ``[index·b, (index+1)·b)`` (``b = B / count``, process ``index`` of ``count``), each located by
    :class:`SampleWindow` (its segment and start), then gathered into the arrays at once (``[K·b, ...]``
    leaves, batch after batch, :meth:`SampleWindow.gather`).

    Every process draws the whole batch's uniforms from the batch's generator and uses its rows', so
    the blocks, concatenated in process order (the mesh's ``data`` axis), are the one-process batch.
    A bad record's row takes another slot of ``table``, drawn from ``(a number of the batch's
    generator, row, attempt)``: the same in any process."""

    ATTEMPTS = 100

    def __init__(self, sample: SampleWindow, table: np.ndarray, index: int = 0, count: int = 1,
                 wire: Packed | None = None, block: int = 1):
        self.sample, self.table, self._index, self._count = sample, table, index, count
        self.wire = wire  # gather the spans straight into its layout (Packed.empty)
        self.block = block

    def __call__(self, slots: np.ndarray, rng: np.random.Generator) -> dict:
        u = rng.random(len(slots))
        spare = int(rng.integers(2**62))  # the replacement draws' seed
        size = len(slots) // self.block  # B, a global batch
        b = size // self._count
        first = self._index * b
        # This process's rows of each global batch of the block, batch after batch.
        local = (np.arange(self.block)[:, None] * size + first + np.arange(b)).ravel()
        rows = slots[local]
        found = self.sample.locate_rows(rows, u[local])
        for r, (i, hit) in enumerate(zip(local.tolist(), found, strict=True)):
            attempt = 0
            while hit is None:  # a bad record: skipped and counted by SampleWindow
                attempt += 1
                if attempt > self.ATTEMPTS:
                    raise records.BadRecordError(f"{self.ATTEMPTS} training draws in a row found no readable "
                                                 f"record (see the warnings above)")
                draw = np.random.default_rng((spare, i, attempt))  # i: the row's place in the global block
                rows[r] = self.table[draw.integers(len(self.table))]
                hit = self.sample.locate(rows[r], draw.random())
            found[r] = hit
        return self.sample.gather(found, rows, None if self.wire is None else self.wire.empty(len(local)))


def _window(clip: dict, start: int, end: int, window: int, bones=None, speed: float = 1.0) -> dict:
    """Frames ``[start, start + window)`` of a clip, edge-padded past the segment ``end``; with
    ``bones`` (the dataset skeleton's offsets ``[J, 3]``) also the clip's ``offsets`` (a record
    without its own has those). ``speed != 1`` plays the motion that much faster: frame ``i`` is
    the clip at frame ``start + i·speed``, root lerped and rotations nlerped between frames
    (:func:`transforms.read_window`, as on the device)."""
    span = transforms.read_span(clip["root_position"], clip["rotations"], start, end,
                                transforms.span_frames(window, max(speed, 1.0)))
    root, rotations, valid = transforms.read_window(*span, end - start, window,
                                                    None if speed == 1.0 else speed)
    out = {"root_position": root, "rotations": rotations, "valid": valid}
    if bones is not None:
        out["offsets"] = np.asarray(clip.get("offsets", bones), np.float32)
    return out


def host_window(span: dict, cfg, skeleton, rng: np.random.Generator) -> dict:
    """One span -> its training window on the host, with the draws of ``config.data`` (speed, reversal,
    pose offset) from ``rng``: the naive baseline loader's copy of what :class:`motionjax.data.augment.
    Augment` does on the device, with the same transforms."""
    log_speed = float(np.log(cfg.speed_range))
    speed = float(np.exp(rng.uniform(-log_speed, log_speed))) if log_speed else None
    root, rotations, valid = transforms.read_window(span["root_position"], span["rotations"], span["length"],
                                                    cfg.window, speed)
    if cfg.reverse_prob:
        root, rotations, valid = transforms.reverse_window(root, rotations, valid,
                                                           np.asarray(rng.random() < cfg.reverse_prob))
    if cfg.pose_offset:
        rotations = transforms.offset_pose(skeleton, rotations, rng.normal(0.0, cfg.pose_offset,
                                                                           (skeleton.num_joints, 3)))
    out = {"root_position": root, "rotations": rotations, "valid": valid}
    if "offsets" in span:
        out["offsets"] = span["offsets"]
    return out


class MakeExample:
    """``(windows [..., T, ...], rng) -> the batch dict``: the noise for all windows in one draw
    (:meth:`transforms.Noise.sample`), then :func:`transforms.make_example`."""

    def __init__(self, info: DatasetInfo, cfg, noise: transforms.Noise):
        self.skeleton, self.mean, self.std, self.noise = info.skeleton, info.mean, info.std, noise
        self.chunk, self.floor, self.observed = cfg.chunk, cfg.floor_align, cfg.observed
        self.scale = (cfg.canonical_height / transforms.rest_height(info.skeleton)
                      if cfg.canonical_height else 1.0)

    def __call__(self, w: dict, rng: np.random.Generator) -> dict:
        *batch, frames = w["valid"].shape
        return self.transform(w, self.noise.sample(rng, frames, self.skeleton, tuple(batch)))

    def transform(self, w: dict, draws: dict) -> dict:
        """Windows and given noise draws -> the batch dict."""
        out = transforms.make_example(self.skeleton, w["root_position"], w["rotations"], draws, self.mean,
                                      self.std, chunk_size=self.chunk, floor=self.floor, scale=self.scale,
                                      offsets=w.get("offsets"), observed=self.observed)
        out["valid"] = transforms.chunk(w["valid"][..., None], self.chunk)
        if "segment" in w:
            out["segment"] = np.asarray(w["segment"], np.int32)
        return out


def _local_batch_size(batch_size: int, process_count: int) -> int:
    if batch_size % process_count:
        raise ValueError(f"data.batch_size={batch_size} does not split over {process_count} processes")
    return batch_size // process_count


def train_dataset(cfg, info: DatasetInfo, *, seed: int, process_index: int | None = None,
                  process_count: int | None = None, rows: np.ndarray | None = None,
                  sampler: list | None = None, cache: SegmentCache | None = None,
                  wire: Packed | None = None, block: int = 1) -> grain.IterDataset:
    """The host-side training stream of this process (numpy span batches of ``batch_size /
    processes``; with ``block`` > 1 each element is ``block`` consecutive batches of the global stream,
    their rows one after the other: one Grain call and one transfer for that many steps, the fixed host
    cost of an element shared by all of them): over :func:`train_slots` (:class:`SlotBatches`), or over
    ``rows`` (:func:`segment_rows`, repeated in order; batches then hold each window's ``"segment" [B]``).
    ``sampler``: a list that gets the :class:`SampleWindow` (its cache statistics, when it runs in
    this process); ``cache``: the :class:`SegmentCache` it reads through (default a new one; worker
    processes always start their own); ``wire``: the :class:`Packed` layout the batches go to the
    devices in, to gather them straight into it (in this process only: a worker's batch is pickled,
    its views apart from the wire)."""
    _check(cfg, info)
    pi = jax.process_index() if process_index is None else process_index
    pc = jax.process_count() if process_count is None else process_count
    _local_batch_size(cfg.batch_size, pc)
    table = train_slots(info, cfg.window, cfg.dynamics_sampling) if rows is None else np.asarray(rows)
    ds = SlotBatches(table, cfg.batch_size * block, seed=seed, shuffle=rows is None)
    sample = SampleWindow(ClipSource(info), info, cfg, name_segment=rows is not None, cache=cache)
    if sampler is not None:
        sampler.append(sample)
    # A batch's generator is a function of its place in the global stream: any process count.
    ds = ds.random_map(SampleBatch(sample, table, pi, pc, wire if cfg.worker_count <= 0 else None, block),
                       seed=seed)
    # Records are small and local: reader threads only contend for the GIL (and busy-wait).
    ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    if cfg.worker_count > 0:
        from absl import flags
        if not flags.FLAGS.is_parsed():  # grain's multiprocessing reads absl flags
            flags.FLAGS.mark_as_parsed()
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=cfg.worker_count,
                                                         per_worker_buffer_size=cfg.worker_buffer))
    return ds


HOST_ALIGN = 64  # bytes: a host array XLA:CPU's device_put aliases instead of copying (numpy's are 16)


def aligned_empty(shape, dtype=np.float32, align: int = HOST_ALIGN) -> np.ndarray:
    """An uninitialized array whose data starts at a multiple of ``align`` bytes. On a CPU backend
    ``jax.device_put`` of such an array is zero-copy (the device buffer is the array: a streamed
    batch, ~1.1 MB for the headline autoencoder, is not copied again and its pages are not touched
    anew); elsewhere it is an ordinary host array."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + align, np.uint8)
    skip = (-raw.ctypes.data) % align
    return raw[skip:skip + nbytes].view(dtype).reshape(shape)


class Packed:
    """A batch's leaves ``keys`` as one ``[B, K]`` float32 array on the devices (``sharding``: over
    ``data``), so a batch is one host-to-device transfer, not one per leaf: :meth:`pack` (float32 and
    int32 leaves, each flattened per row; an int32's bits viewed as a float32's), :meth:`unpack`
    (traced, on the device) gives the leaves back bit for bit. ``shapes``: ``{key: (shape per row,
    dtype)}``.

    The wire is float32, not uint32, because nearly all of it is float32 frames: on the device they
    are then a slice of the wire that XLA fuses into their first reader, where a bitcast from uint32
    was a pass of its own, 0.6 ms of the streamed autoencoder's ~2.4 ms program on XLA:CPU
    (docs/input.md); only the int leaves (a few numbers a row) are bitcast back. Nothing reads an
    int's bits as a float: they are only copied, which keeps NaN payloads and denormals."""

    def __init__(self, shapes: dict, sharding, block: int = 1):
        self.shapes, self.sharding, self.block = dict(shapes), sharding, block
        self.widths = {k: int(np.prod(shape, dtype=np.int64)) for k, (shape, _) in self.shapes.items()}
        # A block of batches goes as [block, B, K], each batch's rows over data as one batch's (block 1:
        # the batch's own [B, K] and sharding).
        self.block_sharding = (NamedSharding(sharding.mesh, PartitionSpec(None, *sharding.spec)) if block > 1
                               else sharding)

    def empty(self, b: int) -> dict:
        """A new wire ``{"packed": [b, K]}`` (aligned, uninitialized) and a view of it for each key,
        ``{key: [b, *shape] dtype}``: leaves written into the views are packed as they are written
        (:meth:`pack` then returns the wire as it is: :class:`SampleBatch` gathers the spans so, one
        copy of a batch's frames, not two)."""
        wire = aligned_empty((b, sum(self.widths.values())))
        out, start = {"packed": wire}, 0
        for k, (shape, dtype) in self.shapes.items():
            out[k] = wire[:, start:start + self.widths[k]].view(dtype).reshape(b, *shape)
            start += self.widths[k]
        return out

    def pack(self, batch: dict) -> np.ndarray:
        """``{key: [b, *shape]}`` -> ``[b, K]`` float32, a new array aligned to :data:`HOST_ALIGN` bytes
        (XLA:CPU then takes it as the device buffer, no copy: nothing writes to it after); a batch
        written into :meth:`empty`'s views is its ``"packed"`` wire, returned as it is."""
        wire = batch.get("packed")
        if (isinstance(wire, np.ndarray) and wire.dtype == np.float32 and wire.ndim == 2
                and wire.shape[1] == sum(self.widths.values()) and wire.ctypes.data % HOST_ALIGN == 0
                and wire.flags.c_contiguous):
            return wire
        b = len(next(iter(batch.values())))
        out = aligned_empty((b, sum(self.widths.values())))
        return np.concatenate([np.ascontiguousarray(batch[k], dtype).reshape(b, -1).view(np.float32)
                               for k, (_, dtype) in self.shapes.items()], axis=1, out=out)

    def unpack(self, packed) -> dict:
        """``[B, K]`` float32 (a jax array) -> ``{key: [B, *shape] dtype}``."""
        import jax.numpy as jnp

        out, start = {}, 0
        for k, (shape, dtype) in self.shapes.items():
            x = packed[:, start:start + self.widths[k]]
            start += self.widths[k]
            if jnp.dtype(dtype) != packed.dtype:
                x = jax.lax.bitcast_convert_type(x, jnp.dtype(dtype))
            out[k] = x.reshape(packed.shape[0], *shape)
        return out


def to_global(shardings, batch: dict) -> dict:
    """This process's numpy batch -> global jax Arrays of the keys ``shardings`` names (``{key:
    NamedSharding}``, e.g. ``parallel.batch_shardings``), the others left on the host: each process
    holds ``[B / processes, ...]`` of a leaf. Processes split the batch only: the 'time' axis must
    not span hosts. ``shardings`` a :class:`Packed`: ``{"packed": [B, K]}``, one array (with its
    ``block`` > 1, ``[block, B, K]``: the element's batches, ``[block · B / processes, ...]`` here)."""
    if isinstance(shardings, Packed):
        wire, sharding = shardings.pack(batch), shardings.sharding
        if shardings.block > 1:
            wire, sharding = wire.reshape(shardings.block, -1, wire.shape[1]), shardings.block_sharding
        if jax.process_count() == 1:  # the same array, ~50 us less Python a batch
            return {"packed": jax.device_put(wire, sharding)}
        return {"packed": jax.make_array_from_process_local_data(sharding, wire)}
    return {k: jax.make_array_from_process_local_data(shardings[k], batch[k]) for k in shardings}


def device_prefetch(ds: grain.IterDataset, shardings: dict | None, depth: int) -> grain.IterDataset:
    """Host batches -> global jax Arrays (:func:`to_global`), ``depth`` batches ahead on both sides
    of the transfer."""
    if depth > 0:
        ds = ThreadPrefetchIterDataset(ds, prefetch_buffer_size=depth)
    if shardings is not None:
        ds = ds.map(functools.partial(to_global, shardings))
        if depth > 0:
            ds = ThreadPrefetchIterDataset(ds, prefetch_buffer_size=depth)
    return ds


def make_train_iterator(cfg, info: DatasetInfo, *, shardings: dict | None = None, seed: int = 0,
                        process_index=None, process_count=None, rows=None,
                        sampler=None, cache=None, block: int = 1) -> grain.DatasetIterator:
    """The training span iterator (a Grain ``DatasetIterator``: checkpoint it with
    ``grain.checkpoint.CheckpointSave/CheckpointRestore``). With ``shardings`` (``{key:
    NamedSharding}``), batches are global jax Arrays of those keys; without, numpy dicts of every
    key. ``rows``, ``sampler``, ``cache``, ``block``: see :func:`train_dataset`. Call ``.close()`` when
    done."""
    ds = train_dataset(cfg, info, seed=seed, process_index=process_index, process_count=process_count,
                       rows=rows, sampler=sampler, cache=cache,
                       wire=shardings if isinstance(shardings, Packed) else None, block=block)
    return iter(device_prefetch(ds, shardings, cfg.prefetch))


def make_naive_train_iterator(cfg, info: DatasetInfo, seed: int = 0):
    """The baseline loader: same windows, noise and transforms, one window at a time in numpy on
    the main thread, no Grain, no workers, no prefetch, no device (how a plain training script does
    it)."""
    _check(cfg, info)
    slots = train_slots(info, cfg.window, cfg.dynamics_sampling)
    sample = SampleWindow(ClipSource(info), info, cfg)
    make = MakeExample(info, cfg, transforms.Noise.from_config(cfg))
    rng = np.random.default_rng(seed)
    while True:
        examples = []
        while len(examples) < cfg.batch_size:
            span = sample(slots[rng.integers(len(slots))], rng)
            if span is not None:
                examples.append(make(host_window(span, cfg, info.skeleton, rng), rng))
        yield {k: np.stack([e[k] for e in examples]) for k in examples[0]}


def eval_windows(info: DatasetInfo, split: str, window: int, stride: int) -> list[tuple[int, int, int]]:
    """``(clip, start, segment end)`` of the sliding windows over ``split``; the last window of a
    segment ends at the segment end, so every frame is covered."""
    if split not in info.splits:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(info.splits)}")
    out = []
    for clip_id, begin, end in info.splits[split]:
        starts = list(range(begin, max(end - window, begin) + 1, stride))
        if starts[-1] + window < end:
            starts.append(end - window)
        out += [(clip_id, s, end) for s in starts]
    return out


def make_eval_batches(cfg, info: DatasetInfo, split: str, noise_level: float = 0.0,
                      seed: int = 0) -> list[dict]:
    """Deterministic batches of sliding windows (stride ``cfg.eval_stride``) covering ``split``.

    ``noise_level`` scales the training noise std (``rot_noise`` rad, ``pos_noise`` m): 0 = clean
    input, 1 = the training corruption; no masking, time warp or mirroring. A segment shorter than a
    window is edge-padded and the padding has ``valid = 0``; the last batch is filled up with
    ``valid = 0`` windows, so every batch has ``batch_size`` rows (one compiled shape). Each batch
    also holds ``"clip" [B]`` int32: the window's clip id (``info.names``, ``info.labels``; -1 for fill),
    and with ``data.bones = "clip"`` ``"offsets" [B, J, 3]``: its clip's rest offsets.
    """
    _check(cfg, info)
    t, source = cfg.window, ClipSource(info)
    bones = info.skeleton.offsets if _clip_bones(cfg) else None
    noise = transforms.Noise.evaluation(cfg, noise_level)
    windows, clip_ids = [], []
    for clip_id, start, end in eval_windows(info, split, t, cfg.eval_stride):
        clip_ids.append(clip_id)
        clip = source[clip_id]
        records.check_clip(clip, info.skeleton)
        rng = np.random.default_rng([seed, clip_id, start])  # a window's noise whatever its batch
        windows.append((_window(clip, start, end, t, bones), noise.sample(rng, t, info.skeleton)))
    if not windows:
        return []
    pad = (-len(windows)) % cfg.batch_size
    windows += [(dict(windows[0][0], valid=np.zeros(t, np.float32)), windows[0][1]) for _ in range(pad)]
    clip_ids = np.array(clip_ids + [-1] * pad, np.int32)
    make = MakeExample(info, cfg, noise)
    stack = lambda dicts: {k: np.stack([d[k] for d in dicts]) for k in dicts[0]}
    batches = []
    for i in range(0, len(windows), cfg.batch_size):
        group = windows[i:i + cfg.batch_size]
        batches.append(make.transform(stack([w for w, _ in group]), stack([d for _, d in group])))
        batches[-1]["clip"] = clip_ids[i:i + cfg.batch_size]
    return batches
