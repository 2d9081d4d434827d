"""What keeps a run safe when things go wrong outside the math: one trainer per workdir, failed
writes reported as one line, signals that stop a run cleanly, and a watchdog for a run that cannot.

Faults end a run with one-line errors, never a hang: a second trainer on the same workdir
(:func:`workdir_lock`), a failed write (:class:`StorageError`: ``No space left on device: PATH``; the
previous checkpoints stay intact). SIGTERM/SIGINT set a flag the loop checks between steps
(:func:`stop_on_signals`); a watchdog ends the process ``train.stop_timeout_s`` after the signal
whatever blocks it. SIGUSR1 prints every thread's stack and the run goes on (``kill -USR1 PID``: where
a run that seems stuck waits, e.g. a collective of several processes).
"""
from __future__ import annotations

import contextlib
import faulthandler
import fcntl
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path


class WorkdirLockedError(RuntimeError):
    """Another live trainer holds the workdir; the message names it (pid, host, start time)."""


class StorageError(OSError):
    """A failed write of the run (a full disk, a lost mount): ``No space left on device: PATH``."""

    def __str__(self):
        return f"{self.strerror}: {self.filename}"


_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")


_TS_PATH = re.compile(r'(?:Failed writing:|local file) "([^"]+)"')


def storage_error(e: BaseException, where) -> StorageError | None:
    """``e`` (or its cause) as a :class:`StorageError` when it is a file-system failure: an
    ``OSError`` with an errno, or orbax/TensorStore's error text with an ``os_error_code``."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, StorageError):
            return e
        if isinstance(e, OSError) and e.errno:
            return StorageError(e.errno, os.strerror(e.errno), e.filename or str(where))
        code = _OS_ERROR_CODE.search(str(e))
        if code:
            paths = _TS_PATH.findall(str(e))
            number = int(code.group(1))
            return StorageError(number, os.strerror(number), paths[-1] if paths else str(where))
        e = e.__cause__ or e.__context__
    return None


LOCK_FILE = "trainer.lock"


@contextlib.contextmanager
def workdir_lock(workdir: Path):
    """Hold ``workdir/trainer.lock`` for the run, or raise :class:`WorkdirLockedError`.

    An ``flock`` on the file: the kernel drops it when its process ends, kill -9 included, so a lock
    left by a dead trainer is stale by construction (its pid/host, still in the file, is reported
    and taken over). The file holds the holder's pid, host and start time for the message.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _lock_holder(path)
        os.close(fd)
        raise WorkdirLockedError(
            f"workdir {workdir} is in use by another trainer ({holder}; lock file {path}): wait for it to "
            "end or stop it, or train in another --workdir") from None
    previous = _lock_holder(path)
    if previous:
        print(f"taking over the stale lock of a trainer that ended without releasing it ({previous})",
              flush=True)
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # released cleanly: an empty file
        os.close(fd)


def _lock_holder(path: Path) -> str:
    try:
        h = json.loads(path.read_text() or "null")
    except (OSError, ValueError):
        return ""
    return f"pid {h['pid']} on {h['host']}, started {h['started']}" if isinstance(h, dict) else ""


def exit_now(message: str, code: int, stacks: bool = True) -> None:
    """Last resort of a run that cannot stop: every thread's stack (where it blocks; not for a user's
    second Ctrl-C), the reason, ``os._exit``."""
    with contextlib.suppress(Exception):
        if stacks:
            faulthandler.dump_traceback(all_threads=True)
        # From a newline: a progress bar may hold the line.
        print(f"\nerror: {message}; exiting without a final checkpoint (the previous ones are intact)",
              file=sys.stderr, flush=True)
    os._exit(code)


def watchdog(seconds: float, message: str, code: int) -> threading.Timer:
    timer = threading.Timer(seconds, exit_now, (message, code))
    timer.daemon = True
    timer.start()
    return timer


@contextlib.contextmanager
def stop_on_signals(timeout_s: float):
    """Yields a dict whose ``"signal"`` is set by SIGTERM/SIGINT (checked between steps).

    The first signal also arms a watchdog: when the run has not ended ``timeout_s`` later (a write
    blocked on a dead disk, a hung collective) the process exits with ``128 + signal``; a second
    SIGINT (Ctrl-C twice) exits at once. Leaving the context disarms it. Inside it, SIGUSR1 prints
    every thread's stack to stderr and changes nothing else.
    """
    stop = {"signal": None, "watchdog": None}
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, _):
        name = signal.Signals(signum).name
        if stop["signal"] is None:
            stop["signal"] = name
            message = f"{name}: the run did not stop within train.stop_timeout_s={timeout_s:g} s"
            stop["watchdog"] = watchdog(timeout_s, message, 128 + signum)
        elif signum == signal.SIGINT:
            exit_now("a second SIGINT", 128 + signum, stacks=False)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    except (AttributeError, ValueError, OSError):  # a stderr without a file descriptor (captured)
        pass
    try:
        yield stop
    finally:
        faulthandler.unregister(signal.SIGUSR1)
        for s, h in previous.items():
            signal.signal(s, h)
        if stop["watchdog"] is not None:
            stop["watchdog"].cancel()


def quietly(fn, *args) -> None:
    """Cleanup after a failure: the first error is the one to report."""
    if fn is not None:
        with contextlib.suppress(Exception):
            fn(*args)
