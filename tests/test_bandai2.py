"""Bandai-2 as a source (issue #60): the archive checked and unpacked once, labels from its sidecars
named by its cfg/, and the protocol's splits (by take inside each (content, style) pair, whole
unseen pairs) on a few dozen of its clips; the full protocol's rules on its real pair counts."""
import collections
import hashlib
import os
import shutil
import tarfile
from pathlib import Path

import ml_collections
import pytest

from motionjax.configs import base
from motionjax.data import archive, corpus, prepare

BANDAI2 = Path(__file__).resolve().parents[2] / "shared" / "data" / "bandai-namco-2"
STYLES = ("active", "elderly", "exhausted", "feminine")  # the first pairs in the archive's order
TAKES = 8  # of each pair: 32 clips


@pytest.fixture(scope="module")
def subset(tmp_path_factory):
    """A small archive laid out as the real one: ``data.tar.xz`` with the first 8 takes of 4
    raise-up-both-hands pairs (read from the front of the real archive: streaming stops there), the real
    ``cfg/`` and a ``SHA256SUMS``."""
    if not (BANDAI2 / "data.tar.xz").is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{BANDAI2} is missing: CI must have the shared Bandai-2 archive")
        pytest.skip(f"{BANDAI2} not present (a user's clone has no ../shared)")
    root = tmp_path_factory.mktemp("bandai2")
    src, folder = root / "src", root / "published"
    taken = collections.Counter()
    with tarfile.open(BANDAI2 / "data.tar.xz", "r|xz") as tar:  # a stream: read only up to what we need
        for member in tar:
            stem = Path(member.name).stem
            content, style, _ = stem.removeprefix("dataset-2_").rsplit("_", 2)
            if content != "raise-up-both-hands" or style not in STYLES:
                if taken and style not in STYLES:
                    break
                continue
            if member.name.endswith(".bvh"):
                if taken[style] == TAKES:
                    continue
                taken[style] += 1
            elif not (src / Path(member.name).with_suffix(".bvh")).exists():
                continue  # the sidecar of a take left out
            tar.extract(member, src, filter="data")
    assert sum(taken.values()) == len(STYLES) * TAKES
    folder.mkdir()
    with tarfile.open(folder / "data.tar.xz", "w:xz") as tar:
        tar.add(src / "data", arcname="data")
    shutil.copytree(BANDAI2 / "cfg", folder / "cfg")
    digest = hashlib.sha256((folder / "data.tar.xz").read_bytes()).hexdigest()
    (folder / "SHA256SUMS").write_text(f"{digest}  data.tar.xz\n")
    return folder / "data.tar.xz", root / "unpacked"


def test_the_archive_is_checked_unpacked_once_and_lists_its_clips(subset, tmp_path):
    path, root = subset
    files = archive.motion_files(path, root)
    assert len(files) == len(STYLES) * TAKES and all(f.suffix == ".bvh" and f.is_file() for f in files)
    out = archive.unpack_dir(path, root)
    assert (out / "cfg" / "content_label.txt").is_file()  # the label names came along
    stamp = (out / archive.MARKER).stat().st_mtime_ns
    assert archive.motion_files(path, root) == files  # unpacked once: the second call finds it complete
    assert (out / archive.MARKER).stat().st_mtime_ns == stamp
    # A damaged copy is refused, naming the archive and the checksum file.
    bad = tmp_path / "bad"
    shutil.copytree(path.parent, bad)
    with open(bad / "data.tar.xz", "r+b") as f:
        f.seek(100)
        f.write(b"\0\0\0\0")
    with pytest.raises(archive.ArchiveError, match=r"bad/data.tar.xz: SHA-256 .*bad/SHA256SUMS"):
        archive.unpack(bad / "data.tar.xz", tmp_path / "unpacked")


def test_splits_are_by_take_inside_pairs_and_unseen_pairs_are_whole(subset, tmp_path, monkeypatch):
    path, root = subset
    monkeypatch.setattr(archive, "ROOT", root)  # resolve_sources unpacks into the default root
    splits = {"train": "rest", "unseen_test": "label:content+style=raise-up-both-hands+feminine",
              "validation": "stratified:content+style:0.25", "test": "stratified:content+style:0.25"}
    info = prepare.prepare(str(path), tmp_path / "prepared", settings=prepare.Settings(
        window=32, splits=tuple(splits.items()), copy_threshold=0.004), workers=0, progress=False)
    # Labels: the sidecars' ids named by cfg/*.txt, without the "dataset-2_" prefix.
    for name, labels in zip(info.names, info.labels, strict=True):
        content, style, _ = name.removeprefix("dataset-2_").rsplit("_", 2)
        assert labels == {"content": content, "style": style} and content == "raise-up-both-hands"
    split_of = {c: s for s, segs in info.splits.items() for c, _, _ in segs}
    assert len(split_of) == len(info.names) == len(STYLES) * TAKES  # every clip in one split, whole
    assert all(b == 0 and e == info.frames[c] for segs in info.splits.values() for c, b, e in segs)
    per_pair = collections.Counter((info.labels[c]["style"], s) for c, s in split_of.items())
    assert per_pair[("feminine", "unseen_test")] == TAKES  # the unseen pair whole, nowhere else
    assert sum(n for (style, _), n in per_pair.items() if style == "feminine") == TAKES
    for style in STYLES[:3]:  # seen pairs: 25% of the takes each in validation and test, the rest train
        assert [per_pair[(style, s)] for s in ("train", "validation", "test")] == [4, 2, 2], style


def test_the_protocol_holds_out_its_pairs_whole_and_splits_every_other_pair_by_take():
    """The real protocol's rules (motionjax/configs/base.py) on Bandai-2's pair sizes (~37 takes), labels
    only: its split names sort the unseen pairs after "test", which must not let the stratified draw
    reach them."""
    c = base.get_config()
    base.use_bandai2(c, window=64)
    rules = corpus.parse_rules(dict(c.data.splits))
    assert isinstance(c.data.splits, ml_collections.ConfigDict)
    contents = ["walk", "walk-turn-left", "walk-turn-right", "run", "wave-both-hands", "wave-left-hand",
                "wave-right-hand", "raise-up-both-hands", "raise-up-left-hand", "raise-up-right-hand"]
    styles = ["active", "elderly", "exhausted", "feminine", "masculine", "normal", "youthful"]
    labels = [{"content": k, "style": s} for k in contents for s in styles for _ in range(37)]
    names = [f"dataset-2_{lab['content']}_{lab['style']}_{i:03d}" for i, lab in enumerate(labels)]
    out = corpus.assign_clips(rules, names, labels)
    by_pair = collections.defaultdict(collections.Counter)
    for lab, split in zip(labels, out, strict=True):
        by_pair[(lab["content"], lab["style"])][split] += 1
    unseen = {"unseen_validation": {("walk-turn-right", "normal"), ("raise-up-right-hand", "elderly"),
                                    ("wave-left-hand", "feminine")},
              "unseen_test": {("walk", "elderly"), ("walk-turn-left", "feminine"), ("run", "exhausted"),
                              ("wave-both-hands", "youthful"), ("raise-up-left-hand", "masculine"),
                              ("wave-right-hand", "active")}}
    held = set().union(*unseen.values())
    for split, pairs in unseen.items():
        for pair in pairs:
            assert by_pair[pair] == {split: 37}, pair
    for pair, counts in by_pair.items():
        if pair not in held:
            assert counts == {"train": 29, "validation": 4, "test": 4}, pair
    # Every content and every style still trains (in its other pairs).
    trained = {lab[k] for lab, split in zip(labels, out, strict=True) if split == "train"
               for k in ("content", "style")}
    assert set(contents) | set(styles) <= trained


def test_composite_label_keys_and_a_misspelt_held_out_pair():
    labels = [{"content": "walk", "style": "elderly"}, {"content": "walk"}]
    assert corpus.label_value(labels[0], "content+style") == "walk+elderly"
    assert corpus.label_value(labels[1], "content+style") is None
    assert corpus.label_value(labels[0], "style") == "elderly"
    rules = corpus.parse_rules({"train": "rest", "held": "label:content+style=walk+eldrly"})
    assert corpus.assign_clips(rules, ["a", "b"], labels) == ["train", "train"]
