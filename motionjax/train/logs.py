"""The loop's bookkeeping: where the time goes (:class:`Chrono`), the metric history and its
TensorBoard events (:class:`MetricLog`, :class:`EventWriter`), the progress a person watches
(:class:`Progress`)."""
from __future__ import annotations

import collections
import contextlib
import os
import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np

from motionjax import timing
from motionjax.train.faults import StorageError


class Chrono:
    """Where a run's time goes (big_vision's ``chrono``): the first step's compile, then training time
    with pauses (evaluation, checkpoints) left out, the host's wait for its input, and the host's time
    per step. Throughput counts the steps after the compiling one (``steps``, counted by
    :meth:`dispatch`).

    ``host_wait``: the time the host spent getting the next batch (or the feed's inputs) *on the host*.
    It is not the input's cost: under asynchronous dispatch the input program's device time never
    shows there; the trainer's ``input_overhead`` (fed vs fixed batch) does count it."""

    def __init__(self, frames_per_step: int, keep: int = 100_000):
        self.frames_per_step = frames_per_step
        self.compile_s: float | None = None
        self.steps = 0
        self.host_wait_s = self.paused_s = self.eval_s = self.checkpoint_s = 0.0
        self._t0 = time.perf_counter()
        self._host = timing.host_cpu()  # whether the host was quiet meanwhile: summary()'s "host_share"
        self._last: float | None = None  # the previous dispatch's start (None after a pause)
        self.periods: collections.deque = collections.deque(maxlen=keep)   # s, dispatch to dispatch
        self.dispatches: collections.deque = collections.deque(maxlen=keep)  # s, the step's call itself

    @contextlib.contextmanager
    def host_wait(self):
        t = time.perf_counter()
        yield
        self.host_wait_s += time.perf_counter() - t

    @contextlib.contextmanager
    def dispatch(self):
        """One step after the compiling one: from its start to the next step's is the host's period."""
        t = time.perf_counter()
        if self._last is not None:
            self.periods.append(t - self._last)
        self._last = t
        yield
        self.dispatches.append(time.perf_counter() - t)
        self.steps += 1

    @contextlib.contextmanager
    def compiling(self):
        """The first step (compile + run): training time and host waits count from its end."""
        t = time.perf_counter()
        yield
        self._t0 = time.perf_counter()
        self.compile_s, self.host_wait_s = self._t0 - t, 0.0

    @contextlib.contextmanager
    def paused(self, kind: str):
        """Time outside training: ``kind`` is ``"eval"``, ``"checkpoint"`` or ``"input_check"``."""
        t = time.perf_counter()
        yield
        seconds = time.perf_counter() - t
        self.paused_s += seconds
        setattr(self, f"{kind}_s", getattr(self, f"{kind}_s", 0.0) + seconds)
        self._last = None

    def train_s(self) -> float:
        return max(time.perf_counter() - self._t0 - self.paused_s, 1e-9)

    def frames_per_s(self) -> float:
        return self.steps * self.frames_per_step / self.train_s()

    def host_wait_fraction(self) -> float:
        return self.host_wait_s / self.train_s()

    def so_far(self) -> dict:
        """Seconds so far (``on_eval``'s ``timing``)."""
        return {"compile_s": self.compile_s or 0.0, "train_s": self.train_s(), "eval_s": self.eval_s,
                "checkpoint_s": self.checkpoint_s, "host_wait_s": self.host_wait_s}

    def host(self) -> dict | None:
        """The host's milliseconds per step, p50 / p99: ``host_ms`` from one step's dispatch to the
        next's (pauses left out), ``dispatch_ms`` the call of the step itself; None before 2 steps."""
        if len(self.periods) < 1:
            return None
        out = {}
        for name, xs in (("host_ms", self.periods), ("dispatch_ms", self.dispatches)):
            ms = 1e3 * np.asarray(xs)
            out[f"{name}_p50"], out[f"{name}_p99"] = float(np.median(ms)), float(np.percentile(ms, 99))
        return out

    def summary(self) -> dict:
        """The run's timings and rates (``summary.json``); ``host_share``: where the host's CPU went
        from this run's start, other processes and the VM's steal beside this one
        (:func:`motionjax.timing.host_share`): a wall time is this config's only where both are small."""
        elapsed = self.train_s()
        return {"compile_s": self.compile_s, "train_s": elapsed, "steps_per_s": self.steps / elapsed,
                "frames_per_s": self.steps * self.frames_per_step / elapsed,
                "host_wait_fraction": self.host_wait_s / elapsed, "eval_s": self.eval_s,
                "checkpoint_s": self.checkpoint_s, "host_wait_s": self.host_wait_s, "host": self.host(),
                "host_share": timing.host_share(self._host, timing.host_cpu())}


class MetricLog:
    """``log(step, values, prefix)``: each value appended to ``history[prefix/key]`` (saved with every
    checkpoint, so a resumed run keeps its whole curve) and, given a ``writer`` (process 0), queued
    for TensorBoard and a flush (:class:`EventWriter` writes them off the trainer's thread)."""

    def __init__(self, history: dict, writer: EventWriter | None):
        self.history, self.writer = history, writer

    def __call__(self, step: int, values: dict, prefix: str) -> None:
        for k, v in values.items():
            self.history.setdefault(f"{prefix}/{k}", []).append((step, float(v)))
            if self.writer:
                self.writer.add_scalar(f"{prefix}/{k}", float(v), step)
        if self.writer:
            self.writer.flush()


class EventWriter:
    """TensorBoard scalars (tensorboardX's record format) written by a thread of their own: the
    trainer's thread only queues them, so a slow disk never holds a step back.

    tensorboardX's ``SummaryWriter`` also writes from a thread, through a bounded queue: when that
    thread dies on a full disk, the next ``add_scalar`` blocks forever. Here the queue is unbounded
    and a failed write is kept: the next call (``add_scalar``, ``flush``, ``close``) raises it as
    :class:`~motionjax.train.faults.StorageError` naming the events file, and later events are dropped.
    """

    def __init__(self, logdir: Path):
        from tensorboardX.event_file_writer import EventsWriter

        logdir.mkdir(parents=True, exist_ok=True)
        self._writer = EventsWriter(str(logdir / "events"))
        self.path = self._writer._file_name
        self._io(self._writer.flush)  # here, in the caller's thread: a full disk raises at once
        self._error: StorageError | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name="tensorboard events", daemon=True)
        self._thread.start()

    def _io(self, fn, *args):
        try:
            return fn(*args)
        except OSError as e:
            raise StorageError(e.errno, os.strerror(e.errno), e.filename or self.path) from e

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._io(*item)
                except StorageError as e:
                    self._error = e

    def _put(self, *item) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put(item)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        from tensorboardX.proto import event_pb2
        from tensorboardX.summary import scalar

        self._put(self._writer.write_event,
                  event_pb2.Event(wall_time=time.time(), step=int(step), summary=scalar(tag, value)))

    def flush(self) -> None:
        self._put(self._writer.flush)

    def close(self) -> None:
        """Write what is queued, close the file and end the thread (again: only raise a kept error)."""
        if self._thread.is_alive():
            self._queue.put((self._writer.close,))
            self._queue.put(None)
            self._thread.join()
        if self._error is not None:
            raise self._error


def _duration(seconds: float) -> str:
    """``1h02m``, ``4m05s``, ``12s``."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class Progress:
    """A run's progress: on a terminal (``stream.isatty()``) a tqdm bar; elsewhere (a log file, CI) one
    plain line every ``every`` steps and at the last one, e.g.
    ``run: step 200/1000  loss 0.0412  3.1 steps/s  host wait 0%  ETA 4m18s`` (a bar there would be
    hundreds of carriage-return updates). ``update(n)``: ``n`` more steps dispatched; ``show(step,
    loss, skipped)``: a step's metrics, read. Rates are :class:`Chrono`'s (training time only)."""

    def __init__(self, total: int, initial: int, desc: str, every: int, chrono: Chrono, stream=None):
        self.total, self.desc, self.every, self.chrono = total, desc, every, chrono
        self.stream = sys.stderr if stream is None else stream
        self.bar = None
        if self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, smoothing=0.1,
                            file=self.stream)

    def update(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def show(self, step: int, loss: float, skipped: int = 0) -> None:
        chrono = self.chrono
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.4f}", fps=f"{chrono.frames_per_s():.0f}",
                                 host_wait=f"{100 * chrono.host_wait_fraction():.0f}%", skipped=skipped,
                                 refresh=False)
            return
        if step % self.every and step != self.total:
            return
        rate = chrono.steps / chrono.train_s()
        eta = _duration((self.total - step) / rate) if rate > 0 and chrono.steps else "?"
        line = (f"{self.desc}: step {step}/{self.total}  loss {loss:.4f}  {rate:.2f} steps/s  "
                f"host wait {100 * chrono.host_wait_fraction():.0f}%  ETA {eta}")
        line += f"  non-finite steps skipped {skipped}" if skipped else ""
        print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
