"""The loop's bookkeeping: where the time goes (:class:`Chrono`), the metric history and its
TensorBoard events (:class:`MetricLog`, :class:`EventWriter`)."""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from motionjax.train.faults import StorageError


class Chrono:
    """Where a run's time goes (big_vision's ``chrono``): the first step's compile, then training time
    with pauses (evaluation, checkpoints) left out, and how much of it was spent waiting for data.
    Throughput counts the steps after the compiling one (``steps``, incremented by the loop)."""

    def __init__(self, frames_per_step: int):
        self.frames_per_step = frames_per_step
        self.compile_s: float | None = None
        self.steps = 0
        self.data_wait_s = self.paused_s = self.eval_s = self.checkpoint_s = 0.0
        self._t0 = time.perf_counter()

    @contextlib.contextmanager
    def data_wait(self):
        t = time.perf_counter()
        yield
        self.data_wait_s += time.perf_counter() - t

    @contextlib.contextmanager
    def compiling(self):
        """The first step (compile + run): training time and data waits count from its end."""
        t = time.perf_counter()
        yield
        self._t0 = time.perf_counter()
        self.compile_s, self.data_wait_s = self._t0 - t, 0.0

    @contextlib.contextmanager
    def paused(self, kind: str):
        """Time outside training: ``kind`` is ``"eval"`` or ``"checkpoint"``."""
        t = time.perf_counter()
        yield
        seconds = time.perf_counter() - t
        self.paused_s += seconds
        setattr(self, f"{kind}_s", getattr(self, f"{kind}_s") + seconds)

    def train_s(self) -> float:
        return max(time.perf_counter() - self._t0 - self.paused_s, 1e-9)

    def frames_per_s(self) -> float:
        return self.steps * self.frames_per_step / self.train_s()

    def data_wait_fraction(self) -> float:
        return self.data_wait_s / self.train_s()

    def so_far(self) -> dict:
        """Seconds so far (``on_eval``'s ``timing``)."""
        return {"compile_s": self.compile_s or 0.0, "train_s": self.train_s(), "eval_s": self.eval_s,
                "checkpoint_s": self.checkpoint_s, "data_wait_s": self.data_wait_s}

    def summary(self) -> dict:
        """The run's timings and rates (``summary.json``)."""
        elapsed = self.train_s()
        return {"compile_s": self.compile_s, "train_s": elapsed, "steps_per_s": self.steps / elapsed,
                "frames_per_s": self.steps * self.frames_per_step / elapsed,
                "data_wait_fraction": self.data_wait_s / elapsed, "eval_s": self.eval_s,
                "checkpoint_s": self.checkpoint_s, "data_wait_s": self.data_wait_s}


class MetricLog:
    """``log(step, values, prefix)``: each value appended to ``history[prefix/key]`` (saved with every
    checkpoint, so a resumed run keeps its whole curve) and, given a ``writer`` (process 0), written
    to TensorBoard and flushed."""

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
    """TensorBoard scalars written and flushed in the calling thread (tensorboardX's record format).

    tensorboardX's ``SummaryWriter`` hands events to a writer thread through a bounded queue: when
    that thread dies on a full disk, the next ``add_scalar`` blocks forever. Here a failed write
    raises ``OSError`` (naming the events file) where it happens.
    """

    def __init__(self, logdir: Path):
        from tensorboardX.event_file_writer import EventsWriter

        logdir.mkdir(parents=True, exist_ok=True)
        self._writer = EventsWriter(str(logdir / "events"))
        self.path = self._writer._file_name
        self._io(self._writer.flush)

    def _io(self, fn, *args):
        try:
            return fn(*args)
        except OSError as e:
            raise StorageError(e.errno, os.strerror(e.errno), e.filename or self.path) from e

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        from tensorboardX.proto import event_pb2
        from tensorboardX.summary import scalar

        self._io(self._writer.write_event,
                 event_pb2.Event(wall_time=time.time(), step=int(step), summary=scalar(tag, value)))

    def flush(self) -> None:
        self._io(self._writer.flush)

    def close(self) -> None:
        self._io(self._writer.close)
