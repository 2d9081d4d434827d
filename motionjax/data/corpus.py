"""Corpus conventions, decided per clip at prepare time: units, a static root, per-joint channels,
performers' bone lengths, up axis, labels and the split rules of a config.

Every function is numpy and pure; :mod:`motionjax.data.prepare` calls them and records in
``index.json`` what was decided and why (the notes of :func:`conform`).

Conventions inside motionjax: metres; joint 0 carries the world translation; a clip's rest offsets
are its own (several performers share one tree with other bone lengths); the dataset skeleton has
the per-joint median offsets over its clips (the canonical body the model trains on).
"""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import logging
import re
from pathlib import Path

import numpy as np

from motionjax.core import rotations as rot
from motionjax.core.skeleton import Skeleton
from motionjax.formats import Motion

UNITS = {"m": 1.0, "cm": 0.01, "mm": 0.001, "inch": 0.0254}
NOMINAL_SPAN = 1.8  # m: bone-length path between the two farthest joints of an adult (≈ height)
AXES = {"x": 0, "y": 1, "z": 2}


# --------------------------------------------------------------------------------------------
# One clip


def tree_span(skeleton: Skeleton) -> float:
    """Bone-length distance between the two farthest joints of the tree (its weighted diameter),
    in the skeleton's units: the same for a T-pose, an A-pose or bones laid along any axis."""
    length = np.linalg.norm(skeleton.offsets, axis=-1)
    length[0] = 0.0
    depth = np.zeros(skeleton.num_joints)  # distance from the root along the tree
    for j, p in enumerate(skeleton.parents[1:], 1):
        depth[j] = depth[p] + length[j]
    anc = skeleton.ancestor_mask  # [J, J]: k is j or an ancestor of j
    # Lowest common ancestor depth of every pair: the deepest joint that is an ancestor of both.
    common = (anc[:, None, :] & anc[None, :, :]) * depth[None, None, :]  # [J, J, J]
    return float((depth[:, None] + depth[None, :] - 2 * common.max(-1)).max())


def detect_units(skeleton: Skeleton) -> str:
    """``"m" | "cm" | "mm" | "inch"``: the unit that makes :func:`tree_span` closest (in log
    scale) to an adult's ~1.8 m. Neighbouring units are ≥ 2.5× apart, so a body between ~1.1 and
    ~2.9 m (or a child's, in metres) is still read right."""
    span = tree_span(skeleton)
    if span <= 0:
        return "m"
    return min(UNITS, key=lambda u: abs(np.log(span * UNITS[u] / NOMINAL_SPAN)))


def detect_up_axis(positions: np.ndarray) -> int:
    """The world axis along which the body is tallest on average (``positions [T, J, 3]``):
    standing, walking and dancing people are taller than wide; a corpus votes over its clips."""
    extent = positions.max(axis=1) - positions.min(axis=1)  # [T, 3]
    return int(np.argmax(np.median(extent, axis=0)))


def _is_static(motion: Motion, tol: float) -> bool:
    q = rot.quat_canonical(motion.rotations[:, 0])
    return (np.ptp(motion.root_position, axis=0).max() <= tol and np.ptp(q, axis=0).max() <= 1e-6)


def fold_static_root(motion: Motion, tol: float = 1e-6) -> tuple[Motion, str | None]:
    """A root that is only a placeholder becomes its one child: the child's world transform (the
    root's composed with its own, per frame: exact) moves into joint 0, so joint 0 carries the
    body's translation. Placeholder: exactly one child, and either the root never moves (constant
    position and rotation) or the child has moving position channels of its own (it carries the
    translation; some exporters split it between the two). Returns the motion unchanged (and
    ``None``) otherwise."""
    sk = motion.skeleton
    kids = sk.children[0]
    if sk.num_joints < 2 or len(kids) != 1:
        return motion, None
    c = kids[0]
    child_moves = motion.offsets is not None and np.ptp(motion.offsets[:, c], axis=0).max() > tol
    static = _is_static(motion, tol)
    if not (static or child_moves):
        return motion, None
    offsets = motion.offsets if motion.offsets is not None else np.broadcast_to(
        sk.offsets, (motion.num_frames, *sk.offsets.shape))
    q0 = motion.rotations[:, 0]
    root_position = motion.root_position + rot.quat_rotate(q0, offsets[:, c])
    rotations = motion.rotations.copy()
    rotations[:, c] = rot.quat_mul(q0, rotations[:, c])
    keep = np.arange(1, sk.num_joints)
    parents = [-1] + [p - 1 for p in np.asarray(sk.parents)[keep[1:]]]
    rest = sk.offsets[keep].copy()
    rest[0] = 0.0
    skeleton = Skeleton([sk.names[j] for j in keep], parents, rest, [sk.kinds[j] for j in keep],
                        sk.axes[keep], sk.masses[keep], sk.up_axis)
    new_offsets = None
    if motion.offsets is not None:
        new_offsets = motion.offsets[:, keep].copy()
        new_offsets[:, 0] = 0.0
    folded = dataclasses.replace(motion, skeleton=skeleton, root_position=root_position,
                                 rotations=rotations[:, keep], offsets=new_offsets)
    what = "static" if static else "placeholder"
    return folded, f"folded the {what} root {sk.names[0]!r}: {sk.names[c]!r} is the root"


def bake_offsets(motion: Motion, tol: float) -> tuple[Motion, list[str]]:
    """Per-joint position channels (``Motion.offsets [T, J, 3]``) -> rest offsets.

    Constant channels (within ``tol``) become the joint's rest offset (as in BVH exporters that
    write every joint with 6 channels); varying ones (stretching bones) cannot train with a fixed
    skeleton: their per-clip mean becomes the rest offset and a note names the joint and its range.
    """
    if motion.offsets is None:
        return motion, []
    sk, off = motion.skeleton, motion.offsets
    notes = []
    spread = np.ptp(off[:, 1:], axis=0).max(-1)  # [J-1]
    for j in np.flatnonzero(spread > tol) + 1:
        notes.append(f"joint {sk.names[j]!r}: position channels vary by up to {spread[j - 1]:.4g} (m); "
                     "training uses their mean as a fixed bone")
    rest = off.mean(axis=0)
    rest[0] = sk.offsets[0]
    return dataclasses.replace(motion, skeleton=sk.replace(offsets=rest), offsets=None), notes


def conform(motion: Motion, units: str = "auto", up_axis: str = "auto") -> tuple[Motion, dict]:
    """A clip as motionjax wants it: metres, joint 0 carrying the translation, fixed bones.

    ``units``: ``"auto"`` (:func:`detect_units`) or a key of :data:`UNITS`; ``up_axis``:
    ``"auto"`` (keep the skeleton's, which the readers set to y for BVH and DeepMimic) or
    ``"x" | "y" | "z"``. Returns ``(motion, decisions)`` with the detected ``units`` and
    ``notes`` (strings for the prepare report) and ``stretch``: ``[T]`` the largest deviation (m)
    of any joint's position channels from their median that frame (bones that stretch), or
    ``None`` when the file has no per-joint position channels.
    """
    notes = []
    motion, note = fold_static_root(motion)
    if note:
        notes.append(note)
    if units == "auto":
        units = detect_units(motion.skeleton)
    elif units not in UNITS:
        raise ValueError(f"units={units!r}; expected 'auto' or one of {sorted(UNITS)}")
    s = UNITS[units]
    sk = motion.skeleton.replace(offsets=motion.skeleton.offsets * s)
    motion = dataclasses.replace(motion, skeleton=sk, root_position=motion.root_position * s,
                                 offsets=None if motion.offsets is None else motion.offsets * s)
    stretch = None
    if motion.offsets is not None and motion.skeleton.num_joints > 1:
        off = motion.offsets[:, 1:]  # joint 0's channels are the translation
        stretch = np.linalg.norm(off - np.median(off, axis=0), axis=-1).max(-1).astype(np.float32)
    motion, more = bake_offsets(motion, tol=1e-5)
    notes += more
    if up_axis != "auto":
        if up_axis not in AXES:
            raise ValueError(f"up_axis={up_axis!r}; expected 'auto', 'x', 'y' or 'z'")
        motion = dataclasses.replace(motion, skeleton=motion.skeleton.replace(up_axis=AXES[up_axis]))
    return motion, {"units": units, "notes": notes, "stretch": stretch}


def reorder(motion: Motion, names) -> Motion:
    """``motion`` with its joints in the order of ``names`` (a permutation of its joint names whose
    parents come first, e.g. another file's or a run's order of the same tree): BVH files list joints
    depth first, other sources need not. Raises ``ValueError`` naming the joints only one side has."""
    sk, names = motion.skeleton, tuple(names)
    if names == sk.names:
        return motion
    if sorted(names) != sorted(sk.names):
        mine, theirs = sorted(set(sk.names) - set(names)), sorted(set(names) - set(sk.names))
        raise ValueError(f"joints {mine[:4]} only in the clip, {theirs[:4]} only in the other skeleton"
                         if mine or theirs else f"{len(sk.names)} vs {len(names)} joints")
    perm = np.array([sk.index(n) for n in names])
    parents = [-1 if sk.parents[j] < 0 else names.index(sk.names[sk.parents[j]]) for j in perm]
    skeleton = Skeleton(names, parents, sk.offsets[perm], [sk.kinds[j] for j in perm], sk.axes[perm],
                        sk.masses[perm], sk.up_axis)
    return dataclasses.replace(motion, skeleton=skeleton, rotations=motion.rotations[:, perm],
                               offsets=None if motion.offsets is None else motion.offsets[:, perm])


def unconform(motion: Motion, original: Motion, units: str) -> Motion:
    """Inverse of :func:`conform` for a motion on ``conform(original)``'s skeleton (e.g. a model's
    output, metres, at ``original``'s frame rate): the same motion on ``original``'s skeleton, in its
    units, with its per-joint position channels and joint order (:func:`reorder`). A folded
    placeholder root comes back with its own per-frame transform, and its child takes the rest:
    ``T_child = T_root⁻¹ · T_world`` (a child without position channels in the file keeps its rest
    offset: ``original.offsets`` says which)."""
    if motion.num_frames != original.num_frames:
        raise ValueError(f"{motion.num_frames} frames vs the original's {original.num_frames}")
    s = UNITS[units]
    sk = original.skeleton
    offsets = None if original.offsets is None else original.offsets.copy()
    if motion.skeleton.num_joints == sk.num_joints - 1:  # fold_static_root took joint 0 away
        motion = reorder(motion, sk.names[1:])
        root, rotations = motion.root_position / s, np.asarray(motion.rotations, np.float64)
        q0, p0 = original.rotations[:, 0], original.root_position
        child = sk.children[0][0]
        local = rot.quat_rotate(rot.quat_conj(q0), root - p0)
        if offsets is not None:
            offsets[:, child] = local
        rotations = np.concatenate([q0[:, None], rotations], axis=1)
        rotations[:, child] = rot.quat_mul(rot.quat_conj(q0), rotations[:, child])
        root = p0
    else:
        motion = reorder(motion, sk.names)
        root, rotations = motion.root_position / s, np.asarray(motion.rotations, np.float64)
    return dataclasses.replace(original, root_position=root, rotations=rotations, offsets=offsets)


# --------------------------------------------------------------------------------------------
# Several clips: one tree, performers' bone lengths


def topology(skeleton: Skeleton) -> tuple:
    """What must match for two clips to share a skeleton: the tree, joint kinds and hinge axes
    (rest offsets may differ: performers' bone lengths are kept per clip)."""
    return (skeleton.names, skeleton.parents, skeleton.kinds, skeleton.up_axis,
            tuple(np.round(skeleton.axes, 6).ravel()))


def topology_difference(a: Skeleton, b: Skeleton) -> str:
    """A short human-readable reason why ``topology(a) != topology(b)``."""
    if a.num_joints != b.num_joints:
        extra = sorted(set(a.names) ^ set(b.names))[:4]
        return f"{a.num_joints} vs {b.num_joints} joints (e.g. {', '.join(extra)} in one only)"
    for i, (x, y) in enumerate(zip(a.names, b.names, strict=True)):
        if x != y:
            return f"joint {i} is {x!r} vs {y!r}"
    for i, (x, y) in enumerate(zip(a.parents, b.parents, strict=True)):
        if x != y:
            return f"joint {a.names[i]!r} hangs from {a.names[x]!r} vs {b.names[y]!r}"
    for i, (x, y) in enumerate(zip(a.kinds, b.kinds, strict=True)):
        if x != y:
            return f"joint {a.names[i]!r} is a {x} vs a {y} joint"
    if a.up_axis != b.up_axis:
        return f"up axis {'xyz'[a.up_axis]} vs {'xyz'[b.up_axis]}"
    return "hinge axes differ"


def canonical_offsets(offsets: list[np.ndarray]) -> np.ndarray:
    """``[J, 3]`` per-joint, per-component median of the clips' rest offsets (the training body)."""
    return np.median(np.stack(offsets), axis=0)


# --------------------------------------------------------------------------------------------
# Labels


def read_labels(path) -> dict[str, str]:
    """Labels of a motion file from a JSON sidecar with its stem (``clip.json`` next to
    ``clip.bvh``): ``{"content": 6, "style": 11}``. Integer ids become names from
    ``<dataset>/cfg/<key>_label.txt`` (one name per line, 0-based; Bandai Namco's layout) when that
    file exists; a ``dataset-N_`` prefix is dropped. Missing sidecar: ``{}``."""
    path = Path(path)
    sidecar = path.with_suffix(".json")
    if path.suffix.lower() == ".json" or not sidecar.exists():
        return {}
    try:
        doc = json.loads(sidecar.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{sidecar}: labels are not readable JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ValueError(f"{sidecar}: labels must be a JSON object like {{\"content\": 6}}")
    out = {}
    for key, value in doc.items():
        if isinstance(value, int) and not isinstance(value, bool):
            names = _label_names(str(path.parent.parent / "cfg" / f"{key}_label.txt"))
            if names is not None:
                if not 0 <= value < len(names):
                    raise ValueError(f"{sidecar}: {key} id {value} is outside the {len(names)} names of "
                                     f"{path.parent.parent / 'cfg' / f'{key}_label.txt'}")
                value = names[value]
        out[str(key)] = str(value)
    return out


_LABEL_CACHE: dict[str, list[str] | None] = {}


def _label_names(path: str) -> list[str] | None:
    if path not in _LABEL_CACHE:
        p = Path(path)
        _LABEL_CACHE[path] = ([re.sub(r"^dataset-\d+_", "", line.strip())
                               for line in p.read_text().splitlines() if line.strip()]
                              if p.exists() else None)
    return _LABEL_CACHE[path]


# --------------------------------------------------------------------------------------------
# Split rules (declared in the experiment config: config.data.splits)
#
#   "rest"                          every clip no other rule took (exactly one split, the train split)
#   "clips:a,b,c"                   named clips (file stems), whole
#   "pattern:*walk*"                clips whose name matches a glob, whole
#   "label:style=happy"             clips with that label value, whole
#   "label:content=bow,slash"       clips with any of those values, whole (held-out contents)
#   "label:content+style=walk+elderly,run+exhausted"
#                                   a composite key: the values of several labels joined by "+" (whole
#                                   (content, style) pairs held out)
#   "stratified:content:0.1"        per value of a label, round(fraction × group size) clips drawn
#   "stratified:content:0.1:seed=3"   with a seeded shuffle (default seed 0), whole
#   "stratified:content+style:0.1"  per (content, style) pair: ~10% of each pair's takes
#   "tail:0.2"                      the last 20% of the frames of every "rest" clip
# Whole-clip rules apply to the clips still unassigned: first those that name clips (clips, pattern,
# label) in the config's order, then the stratified draws in the config's order, so held-out labels are
# whole whatever the names of the splits (an ml_collections ConfigDict keeps its keys sorted: the order
# of a config's splits is their alphabetical one).


@dataclasses.dataclass(frozen=True)
class Rule:
    kind: str
    args: tuple


def parse_rule(split: str, text: str) -> Rule:
    """``"stratified:content:0.1"`` -> ``Rule("stratified", ("content", 0.1, 0))``; errors name the split."""
    kind, _, rest = str(text).partition(":")
    bad = ValueError(f"config.data.splits.{split}={text!r}: expected 'rest', 'clips:a,b', 'pattern:GLOB', "
                     "'label:KEY=VALUE', 'stratified:KEY:FRACTION[:seed=N]' or 'tail:FRACTION'")
    try:
        if kind == "rest" and not rest:
            return Rule(kind, ())
        if kind == "clips" and rest:
            return Rule(kind, tuple(n.strip() for n in rest.split(",") if n.strip()))
        if kind == "pattern" and rest:
            return Rule(kind, (rest,))
        if kind == "label" and "=" in rest:
            key, values = rest.split("=", 1)
            values = tuple(v.strip() for v in values.split(",") if v.strip())
            if values:
                return Rule(kind, (key, values))
        if kind == "stratified":
            parts = rest.split(":")
            if len(parts) not in (2, 3):
                raise bad
            seed = int(parts[2].removeprefix("seed=")) if len(parts) == 3 else 0
            fraction = float(parts[1])
            if 0 < fraction < 1:
                return Rule(kind, (parts[0], fraction, seed))
        if kind == "tail":
            fraction = float(rest)
            if 0 < fraction < 1:
                return Rule(kind, (fraction,))
    except ValueError:
        pass
    raise bad


def parse_rules(splits: dict) -> dict[str, Rule]:
    """Parse and check a whole ``{split: rule}`` table (exactly one ``rest``, at most one ``tail``)."""
    rules = {name: parse_rule(name, text) for name, text in dict(splits).items()}
    kinds = [r.kind for r in rules.values()]
    if kinds.count("rest") != 1:
        raise ValueError(f"config.data.splits={dict(splits)}: exactly one split must be 'rest' (the "
                         f"training split), found {kinds.count('rest')}")
    if kinds.count("tail") > 1:
        raise ValueError(f"config.data.splits={dict(splits)}: at most one 'tail:' split")
    return rules


def label_value(labels: dict, key: str) -> str | None:
    """A clip's value of ``key`` in its ``labels``: one label (``"content"`` -> ``"walk"``) or several
    joined by ``+`` (``"content+style"`` -> ``"walk+elderly"``); ``None`` when one of them is missing."""
    values = [labels.get(k) for k in key.split("+")]
    return None if any(v is None for v in values) else "+".join(str(v) for v in values)


def rest_split(rules: dict[str, Rule]) -> str:
    return next(name for name, r in rules.items() if r.kind == "rest")


def tail_fraction(rules: dict[str, Rule]) -> float:
    return next((r.args[0] for r in rules.values() if r.kind == "tail"), 0.0)


def assign_clips(rules: dict[str, Rule], names: list[str], labels: list[dict],
                 groups: list[list[int]] | None = None) -> list[str]:
    """The split of every clip (the rules naming clips, then the stratified ones, each kind in the
    order of ``rules``; the rest to the ``rest`` split).

    ``groups``: lists of clip indices that must share a split (near-identical clips,
    :mod:`motionjax.data.dedup`). A rule that takes one member takes its whole group; a stratified
    rule counts every member toward its label's quota and takes a group only when that brings the
    count closer to the quota, so each split stays near its declared fraction.
    A ``tail`` split is not a clip assignment: :func:`segments` cuts it from the rest clips.
    """
    out: list[str | None] = [None] * len(names)
    unit = list(range(len(names)))  # clip -> its group's members (itself when in no group)
    members_of: dict[int, list[int]] = {i: [i] for i in range(len(names))}
    for g in groups or ():
        for i in g:
            unit[i] = g[0]
        members_of[g[0]] = list(g)

    def whole(i):
        return [k for k in members_of[unit[i]] if out[k] is None]

    for split, rule in sorted(rules.items(), key=lambda item: item[1].kind == "stratified"):
        free = [i for i, s in enumerate(out) if s is None]
        if rule.kind == "clips":
            unknown = sorted(set(rule.args) - set(names))
            if unknown:
                logging.warning("config.data.splits.%s names clips that are not in the data (ignored): %s",
                                split, ", ".join(unknown[:5]) + (" …" if len(unknown) > 5 else ""))
            take = [i for i in free if names[i] in rule.args]
        elif rule.kind == "pattern":
            take = [i for i in free if fnmatch.fnmatchcase(names[i], rule.args[0])]
        elif rule.kind == "label":
            key, values = rule.args
            take = [i for i in free if label_value(labels[i], key) in values]
            missing = sorted(set(values) - {label_value(lab, key) for lab in labels})
            if missing:  # a misspelt value would silently leave the split short
                logging.warning("config.data.splits.%s: no clip has %s = %s", split, key, ", ".join(missing))
        elif rule.kind == "stratified":
            _stratified(split, rule.args, labels, out, whole, len(names))
            continue
        else:
            continue
        for i in take:
            for k in whole(i):
                out[k] = split
    rest = rest_split(rules)
    return [s if s is not None else rest for s in out]


def _stratified(split: str, args: tuple, labels: list[dict], out: list, whole, num_clips: int) -> None:
    """A ``stratified:KEY:FRACTION`` rule on the free clips of ``out`` (in place): per value of the
    label, its quota of clips in a seeded order, whole groups at a time (``whole(i)``: the free
    members of clip ``i``'s group), then whole groups given back or taken while the split's total
    gets closer to its quota."""
    key, fraction, seed = args
    by_value: dict[str, list[int]] = {}
    for i, lab in enumerate(labels):
        by_value.setdefault(label_value(lab, key) or "", []).append(i)
    # A value that earlier rules took whole (a held-out content) has no quota here.
    wants = {v: int(round(fraction * len(m))) if any(out[i] is None for i in m) else 0
             for v, m in by_value.items()}
    total_want, total, taken = sum(wants.values()), 0, []
    for value in sorted(by_value):
        members, want = by_value[value], wants[value]
        have = sum(out[i] == split for i in members)  # pulled in with groups of other values
        order = np.random.default_rng([seed, len(value), *value.encode()]).permutation(members)
        for i in order:
            if have >= want:
                break
            if out[i] is not None:
                continue
            block = whole(int(i))
            n = sum((label_value(labels[k], key) or "") == value for k in block)
            # Closer to this value's quota and to the split's.
            closer = have + n <= want or abs(have + n - want) < abs(have - want)
            if closer and abs(total + len(block) - total_want) <= abs(total - total_want):
                for k in block:
                    out[k] = split
                have += n
                total += len(block)
                taken.append(block)
    # Groups make the count lumpy: give back taken groups, or take free ones, while that
    # brings the split closer to its total (largest first; each value's quota was met above).
    for block in sorted(taken, key=len, reverse=True):
        if abs(total - len(block) - total_want) < abs(total - total_want):
            for k in block:
                out[k] = None
            total -= len(block)
    rng = np.random.default_rng([seed, 1])
    for i in rng.permutation(num_clips):
        if total >= total_want:
            break
        block = whole(int(i)) if out[i] is None else []
        if block and abs(total + len(block) - total_want) < abs(total - total_want):
            for k in block:
                out[k] = split
            total += len(block)


def segments(rules: dict[str, Rule], clip_splits: list[str], frames: list[int]) -> dict[str, list[tuple]]:
    """``{split: [(clip, begin, end)]}``: whole clips, and the ``tail`` split's last frames of every
    clip of the rest split (the rest keeps the first ``1 - fraction``)."""
    out = {name: [] for name in rules}
    rest, tail = rest_split(rules), tail_fraction(rules)
    tail_name = next((n for n, r in rules.items() if r.kind == "tail"), None)
    for i, (split, n) in enumerate(zip(clip_splits, frames, strict=True)):
        if split == rest and tail_name:
            cut = train_cut(n, tail)
            out[rest].append((i, 0, cut))
            if cut < n:
                out[tail_name].append((i, cut, n))
        else:
            out[split].append((i, 0, n))
    return out


def train_cut(frames: int, tail: float) -> int:
    """First frame of a rest clip's tail (``frames`` when there is no tail rule)."""
    return int(round(frames * (1 - tail))) if tail else frames
