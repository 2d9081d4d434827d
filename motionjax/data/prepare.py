"""Motion files -> ArrayRecord shards + ``index.json`` (clips, labels, splits, skeleton, feature stats).

Layout of a prepared directory::

    clips-00000-of-0000N.array_record   one record per converted clip (:mod:`motionjax.data.records`):
                                        resampled, in metres, with its own bone offsets and
                                        per-frame dynamics scores
    index.json                          written last (atomically): its presence means complete

What :func:`prepare` does, streaming (peak memory: a few clips per worker, plus small per-clip
summaries), in ``workers`` processes:

1. Each file is read and conformed (:func:`motionjax.data.corpus.conform`: units detected from
   the bone lengths or given, a static root folded, constant per-joint position channels baked
   into bone offsets), resampled to ``fps``, checked, scored; its sidecar labels are read.
2. Clips on one tree with other bone lengths (several performers) are one skeleton: each record
   keeps its own offsets and the dataset skeleton gets the per-joint median (the training body).
   A clip on another tree is skipped with a reason saying what differs; the kept tree is the one
   most clips share (never the first file's), and the summary lists every group.
3. Corrupted frames (:mod:`motionjax.data.clean`, in the workers): short defects are repaired,
   long ones cut (a clip becomes its good spans), clips with little left dropped; every range is
   in ``cleaning.json``.
4. Duplicates (:mod:`motionjax.data.dedup`): copies of a take (exact, re-exported, resampled,
   mirrored, slightly noised) are dropped; near-identical clips are grouped, and each group is one
   unit when the splits are drawn (repeated takes are data: only ``dedup_policy="prune"`` drops them).
5. Splits come from the config's rules (:mod:`motionjax.data.corpus`, ``config.data.splits``);
   the feature statistics merge per-clip moments of the training split (Chan et al. 1979).

Prepared data is never destroyed: a rebuild writes a sibling ``<out>.partial`` directory and only
replaces ``out`` once complete; a complete directory prepared with other settings is refused (not
overwritten) unless ``force``. Shards are checked against their recorded sizes and CRC-32s.
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import errno
import fcntl
import glob
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from motionjax.core import features
from motionjax.core.kinematics import forward_kinematics
from motionjax.core.skeleton import Skeleton
from motionjax.data import archive, corpus, records, transforms
from motionjax.data import clean as clean_mod
from motionjax.data.info import (
    FORMAT_VERSION,
    INDEX,
    DamagedIndexError,
    DatasetInfo,
    index_digest,
    load_info,
    read_index,
    skeleton_to_dict,
)
from motionjax.data.stats import Moments, window_features
from motionjax.formats import Motion, MotionFormatError, deepmimic_clip_paths, load

# DeepMimic's default splits: three clips never trained on (each has a sibling motion in training) are
# the test split; the last 20% of every other clip is the validation split.
DEEPMIMIC_SPLITS = {"train": "rest", "validation": "tail:0.2",
                    "test": "clips:humanoid3d_dance_b,humanoid3d_getup_faceup,humanoid3d_spinkick"}
# One record per chunk (random access per clip). zstd level 1 compresses motion as well as the default
# level (to 78%) at a third of the write time, which is the writer process's largest cost.
RECORD_OPTIONS = "group_size:1,zstd:1"
CLEANING = "cleaning.json"  # the per-clip cleaning report: file, frames, kind, measure, action
DESCRIPTORS = "dedup_descriptors.f32"  # scratch while building: every clip's dedup descriptor
MOMENTS = "moments.f64"  # scratch while building: every clip's training-statistics moments


# --------------------------------------------------------------------------------------------
# Settings and sources


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything that decides the content of a prepared directory (recorded in the index)."""

    fps: float = 30.0
    window: int = 32
    units: str = "auto"        # "auto" | "m" | "cm" | "mm" | "inch"
    up_axis: str = "auto"      # "auto" (the reader's: y for BVH and DeepMimic) | "x" | "y" | "z"
    splits: tuple = tuple(DEEPMIMIC_SPLITS.items())  # ((split, rule), ...): corpus split rules
    dedup: bool = True         # drop copies of a take; near-identical clips share one split
    near_threshold: float = 0.02  # m: RMS window distance of similar takes (dedup_policy="prune" only)
    copy_threshold: float = 0.012  # m: RMS window distance of copies (motionjax.data.dedup.COPY_M)
    dedup_policy: str = "copies"  # "copies": drop copies only | "prune": also similar takes (opt-in)
    clean: str = "repair"      # corrupted frames (motionjax.data.clean): "off" | "report" | "repair"
    clean_limits: tuple = tuple(dataclasses.asdict(clean_mod.Thresholds()).items())  # ((key, value), ...)

    def to_json(self) -> dict:
        d = dict(dataclasses.asdict(self), splits=dict(self.splits), clean_limits=dict(self.clean_limits))
        if self.clean == "off":  # as directories prepared before cleaning existed recorded it
            del d["clean"], d["clean_limits"]
        if (self.copy_threshold, self.dedup_policy) == (Settings.copy_threshold, Settings.dedup_policy):
            del d["copy_threshold"], d["dedup_policy"]  # likewise: the defaults are not recorded
        return d

    @property
    def thresholds(self) -> clean_mod.Thresholds:
        return clean_mod.Thresholds(**dict(self.clean_limits))

    @classmethod
    def from_config(cls, cfg) -> Settings:
        """From ``config.data`` (a run's saved config.json gains the keys it predates on load:
        :func:`motionjax.efficiency.trained.load_config`)."""
        mode = cfg.clean
        if mode not in clean_mod.MODES:
            raise ValueError(f"config.data.clean={mode!r}: expected one of {clean_mod.MODES}")
        limits = dict(cfg.clean_limits)
        known = {f.name for f in dataclasses.fields(clean_mod.Thresholds)}
        bad = sorted(k for k, v in limits.items() if k not in known or not isinstance(v, (int, float))
                     or isinstance(v, bool) or v < 0)
        if bad:
            raise ValueError(f"config.data.clean_limits: {', '.join(f'{k}={limits.get(k)!r}' for k in bad)}: "
                             f"expected non-negative numbers for the keys {sorted(known)}")
        return cls(fps=float(cfg.fps), window=int(cfg.window), units=cfg.units, up_axis=cfg.up_axis,
                   splits=tuple(dict(cfg.splits).items()), dedup=bool(cfg.dedup),
                   near_threshold=float(cfg.near_threshold), clean=mode,
                   copy_threshold=float(cfg.copy_threshold), dedup_policy=cfg.dedup_policy,
                   clean_limits=tuple(clean_mod.Thresholds(**limits).__dict__.items()))


def resolve_sources(source=None) -> list[Path]:
    """``None`` -> the DeepMimic clips of pybullet; a directory -> its motion files; an archive
    (``*.tar.xz`` with ``SHA256SUMS`` beside it) -> its motion files, checked and unpacked once
    (:func:`motionjax.data.archive.motion_files`); else a glob."""
    if source is None or source == "deepmimic":
        return deepmimic_clip_paths()
    if archive.is_archive(source):
        return archive.motion_files(source)
    p = Path(source)
    if p.is_dir():
        # .json files in a directory are label sidecars; a JSON DeepMimic clip is read by naming it.
        return sorted(q for q in p.rglob("*") if q.suffix.lower() in (".bvh", ".txt"))
    return sorted(Path(q) for q in glob.glob(str(source), recursive=True))


def _source_files(paths):
    """Every source file and its label sidecar (which counts as a source too), in order."""
    for p in paths:
        for q in (Path(p), Path(p).with_suffix(".json")):
            if q.exists():
                yield q


def _sources_digest(paths) -> str:
    """The quick check: paths, sizes and modification times."""
    h = hashlib.sha256()
    for q in _source_files(paths):
        st = os.stat(q)
        h.update(f"{q}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()


def _content_digest(paths) -> str:
    """What the files hold: each one's name under the corpus root and its bytes. A corpus copied,
    re-mounted or moved keeps it (its times or paths change, not this)."""
    files = list(_source_files(paths))
    root = os.path.commonpath([q.absolute().parent for q in files]) if files else ""
    h = hashlib.sha256()
    for q in files:
        with open(q, "rb") as f:
            content = hashlib.file_digest(f, "sha256").hexdigest()
        h.update(f"{os.path.relpath(q.absolute(), root)}|{content}\n".encode())
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# One clip (runs in a worker process)


def convert(motion: Motion, settings: Settings, labels: dict | None = None) -> dict:
    """A motion -> the compact record + summaries the writer needs (no file I/O).

    Raises :class:`records.BadRecordError` for a clip that cannot train (zero frames, NaNs).
    """
    from motionjax.data import dedup

    motion, decided = corpus.conform(motion, units=settings.units, up_axis=settings.up_axis)
    sk = motion.skeleton
    if motion.num_frames == 0:
        raise records.BadRecordError(f"clip {motion.name!r}: zero frames")
    root, rots = transforms.resample(motion.root_position, motion.rotations, motion.fps, settings.fps)
    root, rots = root.astype(np.float32), rots.astype(np.float32)
    cleaning, spans = None, [(0, root.shape[0])]
    if settings.clean == "off":
        positions, _ = forward_kinematics(sk, rots, root)  # once per clip: score, stats floor, dedup
    else:
        root, rots, positions, cleaning = clean_mod.clean_clip(
            root, rots, lambda r, q: np.asarray(forward_kinematics(sk, q, r)[0]), fps=settings.fps,
            up_axis=sk.up_axis, th=settings.thresholds, mode=settings.clean, window=settings.window,
            stretch=_at_rate(decided["stretch"], root.shape[0]), names=sk.names)
        spans = [tuple(s) for s in cleaning["spans"]]
    score = transforms.dynamics_score(sk, root, rots, settings.fps, positions)
    clip = {"name": motion.name, "root_position": root, "rotations": rots, "score": score}
    records.check_clip(clip, sk)
    body = dedup.body_frame(sk, mirror=False)
    descriptor = dedup.clip_descriptor(positions, body)
    tail = corpus.tail_fraction(corpus.parse_rules(dict(settings.splits)))
    cut = corpus.train_cut(root.shape[0], tail)
    # One canonicalization serves both parts: the windows of frames [0, cut) are a prefix of the clip's.
    stride = max(settings.window // 4, 1)
    feats = window_features(sk, root, rots, settings.window, stride, positions).reshape(
        -1, settings.window, features.feature_dim(sk))
    starts = np.arange(feats.shape[0]) * stride
    inside = np.zeros(starts.shape, bool)  # windows inside a kept span (cleaning cuts the others)
    for b, e in spans:
        inside |= (starts >= b) & (starts + settings.window <= e)
    moments = []  # [2, 1 + 2F]: the whole clip's windows, and those before the train cut
    for end in (root.shape[0], cut):
        m = Moments(features.feature_dim(sk))
        m.update(feats[inside & (starts + settings.window <= end)])
        moments.append(m.to_array())
    return {"name": motion.name, "record": records.encode_record(motion.name, root, rots, score, sk.offsets),
            "frames": int(root.shape[0]), "source_fps": float(motion.fps), "skeleton": sk,
            "units": decided["units"], "notes": decided["notes"], "labels": dict(labels or {}),
            "moments": np.stack(moments),
            "up_axis": corpus.detect_up_axis(positions[:: max(1, len(positions) // 64)]),
            "hash": dedup.exact_hash(descriptor, body), "descriptor": descriptor, "score": score,
            "spans": spans, "cleaning": cleaning}


def _at_rate(per_frame, frames: int):
    """A per-frame measure of the source clip (``[T0]`` or ``None``) at the ``frames`` of the
    resampled clip (linear in time over the same duration)."""
    if per_frame is None:
        return None
    src = np.linspace(0, len(per_frame) - 1, frames) if frames > 1 else np.zeros(1)
    return np.interp(src, np.arange(len(per_frame)), per_frame)


def _convert_file(task) -> dict:
    """Worker entry: ``(path, settings)`` -> :func:`convert`'s dict, or ``{"path", "error"}``. A label
    sidecar that does not read leaves the motion with unknown labels (``"label_error"``)."""
    path, settings = task
    try:
        try:
            labels, label_error = corpus.read_labels(path), None
        except ValueError as e:
            labels, label_error = {}, str(e)
        return dict(convert(load(path), settings, labels), path=str(path), label_error=label_error)
    except (MotionFormatError, OSError, ValueError) as e:  # BadRecordError is a ValueError
        return {"path": str(path), "error": str(e)}


def _converted(paths, settings: Settings, workers: int) -> Iterator[dict]:
    """Converted clips in file order, from ``workers`` spawned processes (0: this process)."""
    tasks = [(p, settings) for p in paths]
    if workers <= 1 or len(tasks) < 4:
        yield from map(_convert_file, tasks)
        return
    # spawn: the parent may hold JAX's threads, which fork would copy in a locked state. An executor,
    # not a Pool: a Pool respawns workers that die at start-up forever (a silent hang); this raises.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        try:
            yield from pool.map(_convert_file, tasks, chunksize=4)
        except concurrent.futures.process.BrokenProcessPool as e:
            raise RuntimeError(
                f"prepare: a worker process died ({e}). Spawned workers re-import the __main__ module: "
                "a script that prepares data at import time needs its top level under "
                "`if __name__ == '__main__':`; or prepare in this process with workers=0 "
                "(config.data.prepare_workers = 0)") from e


# --------------------------------------------------------------------------------------------
# Writing


def _crc32(path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            crc = zlib.crc32(block, crc)
    return crc


def verify_shards(data_dir) -> list[str]:
    """Problems with the shards of a complete directory (missing, other size or CRC-32); [] if intact."""
    doc = json.loads((Path(data_dir) / INDEX).read_text())
    problems = []
    for shard in doc["shards"]:
        path = Path(data_dir) / shard["file"]
        if not path.exists():
            problems.append(f"{path}: missing")
        elif path.stat().st_size != shard["bytes"]:
            problems.append(f"{path}: {path.stat().st_size} bytes, the index recorded {shard['bytes']}")
        elif _crc32(path) != shard["crc32"]:
            problems.append(f"{path}: CRC-32 differs from the index (the file is damaged)")
    return problems


def _describe(skeleton: Skeleton) -> str:
    return f"{skeleton.num_joints} joints from {skeleton.names[0]!r}"


def write_dataset(motions: Iterable[Motion], out_dir, *, settings: Settings | None = None,
                  strict: bool = False,
                  records_per_shard: int = 4096, progress: bool = True, total: int | None = None,
                  skipped: list | None = None, **fields) -> DatasetInfo:
    """Prepare in-memory motions (e.g. :func:`motionjax.data.synthetic.synthetic_motions`) in this
    process; ``fields`` override :class:`Settings` fields (``window=64``). ``skipped``: ``[{"path",
    "reason"}]`` files the caller already left out, listed in the index with the clips left out here."""
    settings = dataclasses.replace(settings or Settings(), **fields)

    def converted():
        for m in motions:
            try:
                yield convert(m, settings)
            except (MotionFormatError, ValueError) as e:
                yield {"path": m.name, "error": str(e)}

    with _build_lock(Path(out_dir)):
        return write_converted(converted(), out_dir, settings=settings, strict=strict,
                               records_per_shard=records_per_shard, progress=progress, total=total,
                               skipped=None if skipped is None else list(skipped))


def write_converted(clips: Iterable[dict], out_dir, *, settings: Settings, strict: bool = False,
                    records_per_shard: int = 4096, skipped: list | None = None, sources: dict | None = None,
                    progress: bool = True, total: int | None = None) -> DatasetInfo:
    """Write converted clips (:func:`convert`; dicts with ``"error"`` are skipped and listed) into
    ``out_dir`` via a ``.partial`` sibling; dedup, split, merge the training stats, write the index
    (with ``sources``, what :func:`prepare` checks the sources against: ``{"sources": quick digest,
    "sources_content": content digest}``).
    Returns the new directory's :class:`DatasetInfo`. A failed write (a full disk) raises ``OSError``
    naming the file, after removing the partial directory."""
    from tqdm import tqdm

    rules = corpus.parse_rules(dict(settings.splits))
    out = Path(out_dir)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # a previous build that never finished
    partial.mkdir(parents=True)
    skipped = [] if skipped is None else skipped
    kept: list[dict] = []  # per written record: summaries (the record bytes are on disk)
    shard_files, writer, seen = [], None, set()
    # What stays in memory per clip is what the index needs (~6 KB): the record is written to its shard,
    # the dedup descriptor and the statistics' moments to scratch files (removed before the rename), and
    # clips on the same skeleton share one Skeleton.
    spill = {"moments": records.ArrayFile(partial / MOMENTS)}
    if settings.dedup:
        spill["descriptor"] = records.ArrayFile(partial / DESCRIPTORS)
    skeletons: dict = {}
    # Clips whose label sidecar did not read: kept with unknown labels unless a rule splits by labels.
    by_label = [f"{k}={v}" for k, v in dict(settings.splits).items()
                if rules[k].kind in ("label", "stratified")]
    try:
        # disable=None: a bar on a terminal only (in a log file, carriage-return updates)
        for clip in tqdm(clips, total=total, desc="prepare", unit="clip", disable=not progress or None):
            if clip.get("label_error") and by_label and "error" not in clip:
                clip = {"path": clip["path"], "error": f"{clip['label_error']}; the split rule "
                        f"{by_label[0]} needs its labels"}
            elif clip.get("label_error"):
                logging.warning("%s: %s; keeping the motion with unknown labels", clip["path"],
                                clip["label_error"])
                clip["notes"] = [*clip["notes"], f"labels unknown: {clip['label_error']}"]
            writer = _write_clip(clip, partial, writer, shard_files, kept, seen, skipped, strict,
                                 records_per_shard, spill, skeletons)
        if writer is not None:
            writer.close()
        for f in spill.values():
            f.close()
    except (RuntimeError, OSError) as e:  # ArrayRecord reports a failed write as RuntimeError
        shutil.rmtree(partial, ignore_errors=True)  # frees what it took; out is untouched
        failed = _os_error(e, partial / shard_files[-1] if shard_files else partial)
        if failed is None:
            raise
        raise failed from e
    if not kept:
        shutil.rmtree(partial, ignore_errors=True)
        raise ValueError(f"{out}: no clip converted; skipped: {skipped}")
    try:  # dedup's scratch index and the index files are written here: a full disk is one clear error too
        return _finish_dataset(kept, partial, out, shard_files, settings, rules, skipped, sources or {},
                               strict, spill)
    except OSError as e:
        shutil.rmtree(partial, ignore_errors=True)
        failed = _os_error(e, partial)
        if failed is None or failed is e:
            raise
        raise failed from e


def _os_error(e: BaseException, path) -> OSError | None:
    """``e`` as an ``OSError`` naming ``path`` when it is a file-system failure: an ``OSError`` with an
    errno, or a library's text of one (ArrayRecord: ``write() failed: No space left on device``)."""
    if isinstance(e, OSError) and e.errno:
        return e if e.filename else OSError(e.errno, e.strerror, str(path))
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EACCES):
        if os.strerror(code) in str(e):
            return OSError(code, os.strerror(code), str(path))
    return None


def _write_clip(clip, partial: Path, writer, shard_files, kept, seen, skipped, strict, records_per_shard,
                spill: dict, skeletons: dict | None = None):
    """Append one converted clip (or list why it is skipped); returns the open shard writer. Its
    dedup descriptor and moments go to ``spill["descriptor"]`` and ``spill["moments"]`` (each a
    :class:`~motionjax.data.records.ArrayFile`; no ``"descriptor"``: dedup is off, it is dropped); an
    equal skeleton already in ``skeletons`` replaces its own."""
    from array_record.python.array_record_module import ArrayRecordWriter

    if "error" in clip or clip["name"] in seen:
        reason = clip.get("error") or f"duplicate clip name {clip['name']!r}"
        if strict:
            raise ValueError(f"{clip.get('path', clip.get('name'))}: {reason}")
        logging.warning("skipping %s: %s", clip.get("path", clip.get("name")), reason)
        skipped.append({"path": clip.get("path", clip.get("name")), "reason": reason})
        return writer
    for note in clip["notes"]:
        if "vary" in note:
            logging.warning("%s: %s", clip.get("path", clip["name"]), note)
    if writer is None or len(kept) % records_per_shard == 0:
        if writer is not None:
            writer.close()
        shard_files.append(f"clips-{len(shard_files):05d}.array_record")
        writer = ArrayRecordWriter(str(partial / shard_files[-1]), RECORD_OPTIONS)
    writer.write(clip.pop("record"))
    for key in ("descriptor", "moments"):
        array = clip.pop(key)
        if key in spill:
            spill[key].append(clip["name"], array)
    if skeletons is not None:
        sk = clip["skeleton"]
        key = (corpus.topology(sk), sk.offsets.tobytes(), sk.masses.tobytes())
        clip["skeleton"] = skeletons.setdefault(key, sk)
    seen.add(clip["name"])
    kept.append(clip)
    return writer


def _one_skeleton(kept, partial: Path, out: Path, strict: bool):
    """``(skeleton, status, tree count)``: the tree most clips share (ties: the first seen), never the
    first file's by order, on the per-joint median bones of its clips; clips on another tree get a
    status saying what differs (``strict``: a ValueError naming each tree's files)."""
    groups = collections.OrderedDict()
    for i, c in enumerate(kept):
        groups.setdefault(corpus.topology(c["skeleton"]), []).append(i)
    main_key = max(groups, key=lambda k: len(groups[k]))
    main = kept[groups[main_key][0]]["skeleton"]
    status = ["kept"] * len(kept)
    if len(groups) > 1:
        lines = [f"{len(v)} clips on {_describe(kept[v[0]]['skeleton'])} (e.g. "
                 f"{', '.join(kept[i]['name'] for i in v[:3])})"
                 for v in sorted(groups.values(), key=len, reverse=True)]
        message = f"{out}: the clips use {len(groups)} different skeleton trees: " + "; ".join(lines)
        if strict:
            shutil.rmtree(partial, ignore_errors=True)
            raise ValueError(message + ". Prepare each tree into its own directory.")
        logging.warning("%s. Keeping the %d clips of the most common tree.", message, len(groups[main_key]))
        for key, members in groups.items():
            if key != main_key:
                for i in members:
                    why = corpus.topology_difference(kept[i]["skeleton"], main)
                    status[i] = f"skeleton tree differs from the dataset's ({why})"
    skeleton = main.replace(offsets=corpus.canonical_offsets(
        [kept[i]["skeleton"].offsets for i in groups[main_key]]))
    return skeleton, status, len(groups)


def _cleaning_reports(kept, status: list) -> list:
    """The per-clip cleaning reports of clips where anything was found (popped from ``kept``); a clip
    cleaning dropped gets that reason as its ``status``."""
    cleaning = []
    for i, c in enumerate(kept):
        report = c.pop("cleaning")
        if report and (report["defects"] or report["sign_flips"]):
            cleaning.append({"file": c.get("path", c["name"]), "clip": c["name"], **report})
        if report and report["dropped"] and status[i] == "kept":
            status[i] = report["dropped"]
    return cleaning


def _dedup_and_assign(kept, status: list, skeleton, settings: Settings, rules, spill=None) -> dict:
    """Copies dropped (their ``status`` says of what), near-identical clips grouped, and every clip
    assigned to a split with each group whole; ``spill``: the clips' dedup descriptors (a
    :class:`~motionjax.data.records.ArrayFile`). Returns ``clip_splits`` and the dedup record."""
    from motionjax.data import dedup

    names, labels = [c["name"] for c in kept], [c["labels"] for c in kept]
    live = [i for i, s in enumerate(status) if s == "kept"]
    leakage, near_groups, pairs, stats = [], [], [], {}
    index_of = {n: i for i, n in enumerate(names)}
    if settings.dedup:
        report = dedup.find_duplicates(spill.subset([names[i] for i in live]),
                                       {names[i]: kept[i]["hash"] for i in live},
                                       body=dedup.body_frame(skeleton), threshold_m=settings.near_threshold,
                                       copy_m=settings.copy_threshold, policy=settings.dedup_policy)
        for name, reason in report.drop.items():
            status[index_of[name]] = reason
        near_groups = [g for g in report.groups if len(g) > 1]
        pairs, stats = report.pairs, report.stats
    # Near-identical clips are one unit when splits are drawn (no group straddles two splits).
    clip_splits = corpus.assign_clips(rules, names, labels, [[index_of[n] for n in g] for g in near_groups])
    if settings.dedup and near_groups:  # a check: assignment kept every group whole
        split_of = {n: s for n, s in zip(names, clip_splits, strict=True)}
        split_of, leakage = dedup.resolve_leakage(near_groups, split_of)
        clip_splits = [split_of[n] for n in names]
    return dict(clip_splits=clip_splits, near_groups=near_groups, pairs=pairs, leakage=leakage,
                stats=stats, index_of=index_of)


def _train_statistics(kept, moment_file, skeleton, splits: dict, train: str, tail, settings: Settings,
                      partial: Path, out: Path):
    """``(Moments, train_windows)`` of the ``train`` split's segments from the per-clip moments the
    workers computed (``moment_file``: clip name -> ``[2, 1 + 2F]``, the whole clip's and the cut
    variant's; each clip once, the cut one where a ``tail`` rule takes its end), and each segment's
    ``[window count, score sum]`` for dynamics-weighted sampling."""
    moments, train_windows = Moments(features.feature_dim(skeleton)), []
    for clip_id in dict.fromkeys(c for c, _, _ in splits[train]):  # each clip's moments once
        frames = kept[clip_id]["frames"]
        cut = tail and corpus.train_cut(frames, tail) < frames
        moments.merge(Moments.from_array(moment_file[kept[clip_id]["name"]][1 if cut else 0]))
    for clip_id, begin, end in splits[train]:
        scores = transforms.segment_windows(kept[clip_id]["score"][begin:end], settings.window)
        train_windows.append([int(scores.size), float(scores.sum())])
    if moments.count == 0:
        shutil.rmtree(partial, ignore_errors=True)
        longest = max((e - b for _, b, e in splits[train]), default=0)
        raise ValueError(f"{out}: no segment of the '{train}' split holds a {settings.window}-frame window "
                         f"(the longest has {longest} frames); use a shorter config.data.window")
    return moments, train_windows


def _final_shards(shard_files, partial: Path) -> list:
    """The written shards renamed to their final names, each with its size and CRC32."""
    final = [f"clips-{i:05d}-of-{len(shard_files):05d}.array_record" for i in range(len(shard_files))]
    shards = []
    for a, b in zip(shard_files, final, strict=True):
        os.replace(partial / a, partial / b)
        shards.append({"file": b, "bytes": (partial / b).stat().st_size, "crc32": _crc32(partial / b)})
    return shards


def _finish_dataset(kept, partial: Path, out: Path, shard_files, settings: Settings, rules, skipped,
                    sources: dict, strict: bool, spill: dict) -> DatasetInfo:
    """One skeleton, duplicates, splits, the training statistics and the index of the written clips
    (``spill``: the clips' scratch :class:`~motionjax.data.records.ArrayFile` s, removed here);
    ``partial`` then replaces ``out``."""
    skeleton, status, trees = _one_skeleton(kept, partial, out, strict)
    cleaning = _cleaning_reports(kept, status)
    d = _dedup_and_assign(kept, status, skeleton, settings, rules, spill.get("descriptor"))
    for i, s in enumerate(status):
        if s != "kept":
            skipped.append({"path": kept[i].get("path", kept[i]["name"]), "reason": s})
    all_segments = corpus.segments(rules, d["clip_splits"], [c["frames"] for c in kept])
    splits = {k: [seg for seg in _in_spans(v, kept, settings.window) if status[seg[0]] == "kept"]
              for k, v in all_segments.items()}
    train = corpus.rest_split(rules)
    moments, train_windows = _train_statistics(kept, spill["moments"], skeleton, splits, train,
                                               corpus.tail_fraction(rules), settings, partial, out)
    for f in spill.values():
        os.remove(f.path)  # scratch: not part of the dataset
    units = collections.Counter(c["units"] for c in kept)
    up_votes = collections.Counter(c["up_axis"] for c in kept)
    doc = {"version": FORMAT_VERSION, "settings": settings.to_json(), "sources": sources.get("sources", ""),
           "sources_content": sources.get("sources_content", ""),
           "fps": settings.fps, "skeleton": skeleton_to_dict(skeleton), "train_split": train,
           "clips": [{"name": c["name"], "frames": c["frames"], "source_fps": c["source_fps"],
                      "labels": c["labels"], "units": c["units"], "status": status[i],
                      "notes": c["notes"]} for i, c in enumerate(kept)],
           "shards": _final_shards(shard_files, partial),
           "splits": {k: [list(s) for s in v] for k, v in splits.items()},
           "train_windows": train_windows, "duplicate_groups": d["near_groups"],
           "duplicate_pairs": d["pairs"], "leakage": d["leakage"],
           "dedup": _dedup_summary(settings, status, d["near_groups"], d["leakage"], d["stats"],
                                   d["index_of"], d["clip_splits"]),
           "detected": {"units": dict(units), "up_axis_votes": {"xyz"[k]: v for k, v in up_votes.items()},
                        "skeleton_trees": trees},
           "stats": {"window": settings.window, "frames": moments.count, "mean": moments.mean.tolist(),
                     "std": moments.std().tolist()},
           "skipped": skipped}
    if settings.clean != "off":
        doc["cleaning"] = _cleaning_summary(cleaning, settings, status, kept)
        (partial / CLEANING).write_text(json.dumps({"summary": doc["cleaning"], "clips": cleaning}, indent=1))
    if up_votes and up_votes.most_common(1)[0][0] != skeleton.up_axis and settings.up_axis == "auto":
        logging.warning("%s: the bodies look tallest along %s, but the files' skeleton says %s is up; set "
                        "config.data.up_axis if that is wrong", out, "xyz"[up_votes.most_common(1)[0][0]],
                        "xyz"[skeleton.up_axis])
    doc["digest"] = index_digest(json.loads(json.dumps(doc)))  # as a reader will see it
    (partial / INDEX).write_text(json.dumps(doc, indent=1))
    _replace_dir(partial, out)
    return load_info(out)


def _in_spans(segments, kept, window: int) -> list:
    """``segments [(clip, begin, end)]`` cut to their clip's kept spans (cleaning), pieces of at
    least ``window`` frames."""
    out = []
    for clip_id, begin, end in segments:
        for b, e in kept[clip_id]["spans"]:
            lo, hi = max(begin, b), min(end, e)
            if hi - lo >= window or (hi > lo and (lo, hi) == (begin, end)):
                out.append((clip_id, lo, hi))
    return out


def _dedup_summary(settings, status, groups, leakage, stats, index_of, clip_splits) -> dict | None:
    """Counts for the index and :func:`summary_table` (the pairs and groups are in the index)."""
    if not settings.dedup:
        return None
    kinds = ("exact duplicate", "copy", "mirrored copy", "similar take")
    reasons = collections.Counter(s.split(" of ")[0].split(" to ")[0] for s in status if s.startswith(kinds))
    live = [[n for n in g if status[index_of[n]] == "kept"] for g in groups]
    return {"policy": settings.dedup_policy, "copy_m": settings.copy_threshold,
            "dropped": dict(reasons), "groups": len(groups), "grouped_clips": sum(len(g) for g in groups),
            "groups_kept_whole": sum(1 for g in live if len({clip_splits[index_of[n]] for n in g}) <= 1),
            "moved": sum(len(x["moved"]) for x in leakage), "pairs": dict(stats.get("kinds", {})),
            "idle_windows": stats.get("idle_index_windows", 0),
            "index_windows": stats.get("index_windows", 0)}


def _cleaning_summary(reports: list, settings: Settings, status: list, kept: list) -> dict:
    """Counts for the index (and :func:`summary_table`): per kind ranges and frames; frames
    repaired and cut; clips dropped by cleaning."""
    dropped = [r["clip"] for r in reports if r["dropped"]]
    return {"mode": settings.clean, "limits": dict(settings.clean_limits),
            "clips_flagged": sum(1 for r in reports if r["defects"]),
            "frames": int(sum(c["frames"] for c, s in zip(kept, status, strict=True)
                              if s == "kept" or s.startswith("cleaning"))),
            "kinds": clean_mod.summarize(reports), "sign_flips": int(sum(r["sign_flips"] for r in reports)),
            "repaired": int(sum(r["repaired"] for r in reports)), "cut": int(sum(r["cut"] for r in reports)),
            "clips_dropped": dropped, "report": CLEANING}


def _replace_dir(new: Path, out: Path) -> None:
    """Put the complete ``new`` at ``out``; an old ``out`` is removed only after the swap."""
    if out.exists():
        old = out.with_name(out.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
        os.replace(new, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, out)


# --------------------------------------------------------------------------------------------
# The entry point


class PreparedElsewhere(ValueError):
    """A complete prepared directory made with other settings (never overwritten implicitly)."""


class NoSourcesError(FileNotFoundError):
    """No motion file at the source, and no intact prepared directory to use instead."""


@contextlib.contextmanager
def _build_lock(out: Path):
    """Hold ``<out>.lock`` (an ``flock``: released when its process ends, kill -9 included) while
    checking and building ``out``: a second preparation of the same directory waits, then finds it
    complete and uses it, instead of racing on ``<out>.partial``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out.with_name(out.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            if holder == str(os.getppid()):  # waiting would never end: the holder waits for this worker
                raise RuntimeError(f"{out}: a worker process of the preparation started it again (its "
                                   "__main__ module prepares data at import time)") from None
            logging.warning("%s: another process (pid %s) is preparing it; waiting for it to finish", out,
                            holder or "?")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)  # who holds it, for the message above
        yield
    finally:
        os.close(fd)  # releases the lock


def _intact(out_dir, settings: Settings, digest: str | None) -> tuple[dict | None, list[str]]:
    """``(index, problems)`` of a complete directory: raises :class:`PreparedElsewhere` for other
    settings; ``problems`` lists why it must be rebuilt (other sources, unless ``digest`` is None; a
    damaged index or shard); ``(None, [...])`` when there is none."""
    index = Path(out_dir) / INDEX
    if not index.exists():
        return None, [f"{index}: missing"]
    try:
        doc = read_index(out_dir)
    except (DamagedIndexError, ValueError) as e:  # edited, or torn JSON
        return None, [str(e).split("; rebuild it")[0]]
    if doc.get("version") != FORMAT_VERSION:
        return None, [f"{index}: format version {doc.get('version')}, expected {FORMAT_VERSION}"]
    if doc.get("settings") != settings.to_json():
        diff = {k: (doc["settings"].get(k), v) for k, v in settings.to_json().items()
                if doc["settings"].get(k) != v}
        raise PreparedElsewhere(
            f"{out_dir} was prepared with other settings ("
            + ", ".join(f"{k}: {a!r} there, {b!r} asked" for k, (a, b) in diff.items())
            + "); it is left untouched. Point config.data.dir (--out) at a new directory, or rebuild "
            "it with motionjax prepare --force")
    if digest is not None and doc.get("sources") != digest:
        return doc, ["sources changed"]
    return doc, verify_shards(out_dir)


def prepare(source=None, out_dir="data_cache/deepmimic_clean", *, settings: Settings | None = None,
            strict: bool = False, records_per_shard: int = 4096, workers: int | None = None,
            progress: bool = True, force: bool = False, **fields) -> DatasetInfo:
    """Convert motion files (see :func:`resolve_sources`) into a prepared directory.

    Idempotent: a complete directory with the same settings and unchanged sources (paths, sizes and
    mtimes, label sidecars included; where those changed, as when a corpus is copied or re-mounted,
    the same names and bytes), an intact index (its digest) and intact shards is returned as is.
    Changed sources or damage rebuild it (the old one stays until the new one is complete); other
    settings raise :class:`PreparedElsewhere` unless ``force``. Sources that are gone (moved,
    unmounted) are needed only to rebuild: an intact directory is used as is, with a warning; else
    :class:`NoSourcesError`. Concurrent preparations of one directory take turns (:func:`_build_lock`).
    Unreadable files are skipped and listed (``strict`` raises on the first one). ``workers``:
    processes (default: the CPU count); ``fields`` override :class:`Settings` fields (``window=64``).
    """
    settings = dataclasses.replace(settings or Settings(), **fields)
    corpus.parse_rules(dict(settings.splits))  # a bad rule fails before any work
    paths = resolve_sources(source)
    out = Path(out_dir)
    with _build_lock(out):
        if not paths:
            doc, problems = _intact(out, settings, None) if not force else (None, ["--force"])
            if doc is not None and not problems:
                logging.warning("no motion files found for source %r; using the prepared data in %s as is "
                                "(the sources are needed only to rebuild it)", source, out_dir)
                return load_info(out_dir)
            raise NoSourcesError(f"no motion files found for source {source!r}, and {out_dir} cannot be used "
                                 f"instead ({'; '.join(problems)})")
        digest, content = _sources_digest(paths), None
        if not force:
            doc, problems = _intact(out, settings, digest)
            moved = False
            if problems == ["sources changed"] and doc.get("sources_content"):
                # Copied, re-mounted or moved (new times or paths): rebuild only if the bytes differ.
                content = _content_digest(paths)
                if content == doc["sources_content"]:
                    moved = True
                    doc, problems = _intact(out, settings, None)
            if doc is not None and not problems:
                if moved or not doc.get("sources_content"):  # or prepared before the content digest
                    _restamp(out, doc, digest, content or _content_digest(paths))
                logging.info("%s is up to date%s", out_dir,
                             " (its sources' times or paths changed, not their contents)" if moved else "")
                return load_info(out_dir)
            if (out / INDEX).exists():
                logging.warning("%s: rebuilding: %s", out_dir, "; ".join(problems))
        workers = (os.cpu_count() or 1) if workers is None else workers
        sources = {"sources": digest, "sources_content": content or _content_digest(paths)}
        return write_converted(_converted(paths, settings, workers), out_dir, settings=settings,
                               strict=strict, records_per_shard=records_per_shard, skipped=[],
                               sources=sources, progress=progress, total=len(paths))


def _restamp(out: Path, doc: dict, digest: str, content: str) -> None:
    """Record the sources' quick and content digests in the index (atomically; its own digest redone)."""
    doc = dict(doc, sources=digest, sources_content=content)
    doc["digest"] = index_digest(doc)
    tmp = out / (INDEX + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, out / INDEX)


def kept_clips(info: DatasetInfo) -> list[int]:
    """The clips in some split (the others were dropped: duplicates, another skeleton tree)."""
    return sorted({c for segs in info.splits.values() for c, _, _ in segs})


def summary_line(info: DatasetInfo) -> str:
    """One line: the clips and hours kept, the clips per split, how many files or clips were not kept
    (``index.json`` names them and why)."""
    kept = kept_clips(info)
    hours = sum(info.frames[c] for c in kept) / info.fps / 3600
    splits = ", ".join(f"{k} {len({c for c, _, _ in v})}" for k, v in info.splits.items())
    return (f"{info.data_dir}: {len(kept)} clips, {hours:.2f} h ({splits}); {len(info.skipped)} not kept"
            + (f" (listed in {Path(info.data_dir) / INDEX})" if info.skipped else ""))


def summary_table(info: DatasetInfo) -> str:
    """The prepare report: clips, frames and hours per split and per label; what was not kept."""
    def row(name, clips, frames):
        return f"  {name:<28} {clips:>7} {frames:>10} {frames / info.fps / 3600:>8.2f}"

    lines = [f"  {'':<28} {'clips':>7} {'frames':>10} {'hours':>8}"]
    kept = kept_clips(info)
    lines.append(row("kept", len(kept), sum(info.frames[c] for c in kept)))
    for split, segs in info.splits.items():
        lines.append(row(f"split {split}", len({c for c, _, _ in segs}), info.split_frames(split)))
    keys = sorted({k for lab in info.labels for k in lab})
    for key in keys:
        values = collections.Counter()
        frames = collections.Counter()
        for c in kept:
            v = info.labels[c].get(key, "?")
            values[v] += 1
            frames[v] += info.frames[c]
        for v in sorted(values):
            lines.append(row(f"{key} {v}", values[v], frames[v]))
    if info.cleaning:
        lines.append(cleaning_line(info.cleaning))
    if info.dedup:
        d = info.dedup
        dropped = ", ".join(f"{n} {k}" for k, n in d["dropped"].items()) or "none"
        lines.append(f"  dedup ({d['policy']}, copies within {100 * d['copy_m']:.1f} cm RMS of moving "
                     f"windows): dropped {dropped}; {d['groups']} groups of near-identical clips "
                     f"({d['grouped_clips']} clips) each in one split; {d['moved']} clips moved after "
                     "assignment; "
                     f"{d['idle_windows']} idle windows of {d['idle_windows'] + d['index_windows']} ignored")
    reasons = collections.Counter(s["reason"].split(" of ")[0].split(":")[0][:40] for s in info.skipped)
    lines.append(f"  not kept: {len(info.skipped)}" + "".join(f"; {n} × {r}" for r, n in reasons.items()))
    return "\n".join(lines)


def cleaning_line(summary: dict) -> str:
    """One line: what cleaning found per kind, and what it repaired, cut and dropped."""
    kinds = ", ".join(f"{k} {v['ranges']} ({v['frames']} fr)" for k, v in summary["kinds"].items())
    share = 100 * (summary["repaired"] + summary["cut"]) / max(summary["frames"], 1)
    return (f"  cleaning ({summary['mode']}): {summary['clips_flagged']} clips flagged: "
            f"{kinds or 'nothing'}; "
            f"{summary['repaired']} frames repaired, {summary['cut']} cut ({share:.2f}% of "
            f"{summary['frames']}), {len(summary['clips_dropped'])} clips dropped; "
            f"{summary['sign_flips']} quaternion sign flips made continuous; details: {summary['report']}")
