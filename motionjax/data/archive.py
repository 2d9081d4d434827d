"""A corpus shipped as one archive (``data.tar.xz`` beside a ``SHA256SUMS`` and its ``cfg/`` label
names, as ``../shared/data/bandai-namco-2/`` is): checked and unpacked once, outside the repository.

``config.data.source`` may name the archive itself; :func:`motion_files` (called by
:func:`motionjax.data.prepare.resolve_sources`) then

1. checks the archive against the ``SHA256SUMS`` beside it (a mismatch raises, naming the file);
2. unpacks it into ``data_cache/sources/<the archive's folder name>/`` (:data:`ROOT`) unless that holds a
   complete unpack of these bytes (:data:`MARKER` records the archive's digest and its members), through
   a ``.partial`` sibling renamed when complete, under a lock (two trainers starting at once unpack once);
3. copies the folders and files beside the archive (``cfg/`` with the label names, ``LICENSE``) in, so
   :func:`motionjax.data.corpus.read_labels` finds ``cfg/<key>_label.txt`` beside the clips' folder;
4. returns the motion files among the archive's members (``.bvh``, ``.txt``), sorted.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tarfile
from pathlib import Path

ROOT = Path("data_cache/sources")  # relative to the working directory, as every data_cache path is
MARKER = ".unpacked.json"  # {"archive", "sha256", "members"}: written last, its presence means complete
SUFFIXES = (".tar.xz", ".tar.gz", ".tgz", ".tar.bz2", ".tar")
MOTION_SUFFIXES = (".bvh", ".txt")


class ArchiveError(ValueError):
    """An archive that does not match its checksum, or does not unpack."""


def is_archive(source) -> bool:
    return str(source).endswith(SUFFIXES) and Path(source).is_file()


def sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def expected_sha256(archive: Path) -> str | None:
    """The archive's line in ``SHA256SUMS`` beside it (``None`` when there is no such file or line)."""
    sums = archive.parent / "SHA256SUMS"
    if not sums.exists():
        return None
    for line in sums.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("*") == archive.name:
            return parts[0].lower()
    return None


def unpack_dir(archive, root=ROOT) -> Path:
    """Where ``archive`` unpacks: ``root/<the name of the archive's folder>``."""
    return Path(root) / Path(archive).resolve().parent.name


def unpack(archive, root=ROOT) -> Path:
    """Check ``archive`` and unpack it (once) with the files beside it; returns the unpack folder.

    Raises :class:`ArchiveError` naming the archive when its SHA-256 is not the one ``SHA256SUMS``
    lists, or when it does not read; ``FileNotFoundError`` when it is not there."""
    archive = Path(archive)
    if not archive.is_file():
        raise FileNotFoundError(f"{archive}: no such archive")
    digest, want = sha256(archive), expected_sha256(archive)
    if want is not None and digest != want:
        raise ArchiveError(f"{archive}: SHA-256 {digest[:16]}… is not the {want[:16]}… of "
                           f"{archive.parent / 'SHA256SUMS'} (a damaged or partial copy)")
    out = unpack_dir(archive, root)
    with _lock(out):
        if _complete(out, digest):
            return out
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            with tarfile.open(archive) as tar:
                members = [m.name for m in tar.getmembers() if m.isfile()]
                tar.extractall(partial, filter="data")  # no absolute paths, links out or devices
        except (tarfile.TarError, EOFError, OSError) as e:
            shutil.rmtree(partial, ignore_errors=True)
            raise ArchiveError(f"{archive}: does not unpack: {e}") from e
        for sibling in archive.parent.iterdir():  # cfg/ (label names), LICENSE, README.md
            if sibling.name.endswith(SUFFIXES) or (partial / sibling.name).exists():
                continue
            (shutil.copytree if sibling.is_dir() else shutil.copy2)(sibling, partial / sibling.name)
        (partial / MARKER).write_text(json.dumps({"archive": str(archive), "sha256": digest,
                                                  "members": sorted(members)}, indent=0))
        if out.exists():
            shutil.rmtree(out)
        os.replace(partial, out)
    return out


def motion_files(archive, root=ROOT) -> list[Path]:
    """The archive's motion files (``.bvh``, ``.txt`` members), unpacked (:func:`unpack`), sorted."""
    out = unpack(archive, root)
    members = json.loads((out / MARKER).read_text())["members"]
    return sorted(out / m for m in members if m.lower().endswith(MOTION_SUFFIXES))


def _complete(out: Path, digest: str) -> bool:
    """Whether ``out`` holds a whole unpack of the archive with ``digest`` (the marker, and every
    member there)."""
    try:
        doc = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return doc.get("sha256") == digest and all((out / m).is_file() for m in doc.get("members", ()))


@contextlib.contextmanager
def _lock(out: Path):
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out.with_name(out.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
