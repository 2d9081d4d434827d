"""What feeds the train step: where the training corpus lives (``data.residency``) and the iterator
that hands the step its batches on the mesh.

Two tiers, one program per batch:

- ``"device"``: the training frames go to every device once (:mod:`motionjax.data.resident`); each
  step draws its windows, gathers and augments them there (:mod:`motionjax.data.augment`). The host
  moves no bytes per step: it dispatches one program.
- ``"stream"``: Grain reads the clip records through a host cache that keeps dynamic segments longest
  (:class:`~motionjax.data.pipeline.SegmentCache`), draws the starts and ships each window's span
  (:mod:`motionjax.data.pipeline`), every leaf of a batch in one array (one transfer,
  :class:`~motionjax.data.pipeline.Packed`); the device augments them with the same program.
- ``"auto"`` (the default): ``"device"`` when the corpus fits ``data.device_share`` of one device's
  memory, else ``"stream"``, saying which and why.

Either way a batch is a function of the seed and the step: example ``i`` of step ``s`` draws from
``fold_in(fold_in(key(seed), s), i)`` (the resident tier draws its window there too; the stream tier's
starts come from Grain's seeded generators), so the devices and processes a run uses change nothing,
and a resumed run continues the stream it saved (:meth:`Feed.get_state`).
"""
from __future__ import annotations

import logging
import os
import time

import grain
import jax
import numpy as np

from motionjax import parallel
from motionjax.data import augment, pipeline, priority, resident, transforms

RESIDENCY = ("auto", "device", "stream")


class ResidencyError(ValueError):
    """The corpus does not fit where ``data.residency`` puts it."""


def device_memory(device) -> tuple[int, str]:
    """``(bytes, what)``: the memory one copy of the corpus may take a share of. An accelerator's own
    (``memory_stats()["bytes_limit"]``); on the CPU, whose devices share the host's memory, the host's
    physical memory divided among its devices (each holds a copy)."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"{device.device_kind} memory"
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    n = max(jax.local_device_count(), 1)
    return host // n, f"host memory / {n} local devices"


def choose_residency(cfg, info) -> tuple[str, str]:
    """``(mode, why)`` for ``config.data`` (``cfg``): ``"device"`` or ``"stream"``, and a line saying where
    the corpus lives and why. Raises :class:`ResidencyError` when ``data.residency = "device"`` and the
    corpus exceeds ``data.device_share`` of a device's memory."""
    if cfg.residency not in RESIDENCY:
        raise ValueError(f"config.data.residency={cfg.residency!r}; expected one of {RESIDENCY}")
    need = resident.corpus_nbytes(info, mirrored=augment.mirrored_rows(cfg, info) is not None)
    have, what = device_memory(jax.local_devices()[0])
    budget = cfg.device_share * have
    size = (f"the training split ({info.split_frames(info.train_split):,} frames, {need / 2**20:,.1f} MB) "
            f"against {cfg.device_share:.0%} of {what} ({budget / 2**30:,.1f} GB)")
    if cfg.residency == "device" and need > budget:
        raise ResidencyError(f"config.data.residency='device': {size} does not fit; set data.residency="
                             "'stream' (or 'auto'), or raise data.device_share")
    if cfg.residency == "stream":
        return "stream", (f"corpus streamed by Grain through a {cfg.host_cache_mb:,.0f} MB host cache "
                          "(data.residency='stream'); windows augmented on the device")
    if need <= budget:
        return "device", f"corpus resident on the devices: {size}; windows drawn and augmented there"
    return "stream", (f"corpus streamed by Grain through a {cfg.host_cache_mb:,.0f} MB host cache: {size} "
                      "does not fit (data.residency='auto'); windows augmented on the device")


AUTO_WORKER_MS = 4.0     # host CPU ms per batch the main process may spend, when the step's time is unknown
AUTO_WORKER_SHARE = 0.5  # ... or this share of the train step's time, when the trainer measured it


def warm_host_cache(draw, stats, block: int = 50, most: int = 2000) -> int:
    """Call ``draw()`` (one span batch) in blocks of ``block`` until a whole block reads every segment
    from the host cache (``stats()``: :meth:`~pipeline.SegmentCache.stats`), or ``most`` calls: the steady
    state of a long run (a fresh Bandai-2 iterator's first ~150 batches read their segments from the
    shards, at ~10x the host CPU of a warm one's, docs/input.md). Returns the calls made."""
    drawn = 0
    while drawn < most:
        misses = stats()["misses"]
        for _ in range(block):
            draw()
        drawn += block
        if stats()["misses"] == misses:
            break
    return drawn


def stream_block(cfg) -> int:
    """Batches a Grain element of the stream tier carries: ``data.stream_block``, or 1 with loss-aware
    sampling (its next windows wait for the last step's errors)."""
    return 1 if cfg.loss_sampling > 0 else int(cfg.get("stream_block", 1))


def auto_workers(cfg, info, batches: int = 16, log=None, step_ms: float | None = None,
                 most: int = 512) -> int:
    """``data.worker_count = -1``: Grain workers for the stream tier, from a measurement: the main
    process warms its host cache (:func:`warm_host_cache`, blocks of ``batches``, at most ``most``
    batches: the run's steady state, not its first cold batches), then makes ``batches`` span batches
    (in blocks of :func:`stream_block`, as the feed draws them),
    and its CPU time per batch (not wall time: other load on the host does not count) decides against
    the budget: a share (:data:`AUTO_WORKER_SHARE`) of the train step's ``step_ms`` when the trainer
    measured it (the prefetch thread must keep ahead of the accelerator's clock, not a fixed one), else
    :data:`AUTO_WORKER_MS`. Within it, the main process keeps the work (its prefetch thread runs beside
    the device program; a worker costs a process start and a copy of every batch); else enough
    workers to bring each one's share under it, leaving one core to the main process."""
    c = cfg.copy_and_resolve_references()
    c.update(worker_count=0, prefetch=0)
    sampler, block = [], stream_block(cfg)
    it = pipeline.make_train_iterator(c, info, seed=0, sampler=sampler, block=block)
    elements = max(2, batches // block)  # Grain elements: blocks of `block` batches
    warm = block * warm_host_cache(lambda: next(it), sampler[0].cache.stats, elements,
                                   max(elements, most // block))
    start = time.process_time()
    for _ in range(elements):
        next(it)
    ms = 1e3 * (time.process_time() - start) / (elements * block)
    it.close()
    cores = len(os.sched_getaffinity(0))
    budget = AUTO_WORKER_SHARE * step_ms if step_ms else AUTO_WORKER_MS
    workers = 0 if ms <= budget else max(1, min(cores - 1, int(np.ceil(ms / budget))))
    if log:
        against = (f"{AUTO_WORKER_SHARE:.0%} of the {step_ms:.1f} ms train step" if step_ms
                   else f"{AUTO_WORKER_MS:g} ms (step time not measured)")
        log(f"data.worker_count=-1: {ms:.1f} ms of host CPU per batch in the main process (after {warm} "
            f"batches warmed its host cache) against {against} -> {workers} Grain worker(s) ({cores} cores)")
    return workers


def batch_keys(cfg) -> tuple[str, ...]:
    """The batch leaves the train step reads, for ``config.data`` (``cfg``): the input window, the
    target, their ``valid`` mask, with ``data.bones = "clip"`` each window's clip ``offsets``, and with
    loss-aware sampling each window's training ``segment`` (the step passes it by; the loop reads it)."""
    return (("noisy", "clean", "valid") + (("offsets",) if cfg.bones == "clip" else ())
            + (("segment",) if cfg.loss_sampling > 0 else ()))


def one_device_mesh():
    """A ``data`` x ``time`` mesh of the first device (notebooks, tests and benchmarks that want the
    batches without a config's mesh)."""
    return jax.make_mesh((1, 1), (parallel.DATA_AXIS, parallel.TIME_AXIS), devices=jax.devices()[:1],
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)


def span_shardings(mesh, keys) -> dict:
    """Span leaves ``[B, ...]`` over the ``data`` axis."""
    return {k: parallel.named_sharding(mesh, "batch") for k in keys}


class Feed(grain.DatasetIterator):
    """The training iterator: ``next()`` is the batch of the next step, global arrays of ``keys``
    (default :func:`batch_keys`) on ``mesh`` (default :func:`one_device_mesh`). A Grain
    ``DatasetIterator``, so
    ``grain.checkpoint.CheckpointSave/Restore`` save and restore it like Grain's own.

    ``step_ms``: the train step's milliseconds (or a function measuring them, called only when the
    stream tier picks its workers, ``data.worker_count = -1``: :func:`auto_workers`).

    ``record(step, segments, errors)`` takes a step's window errors for loss-aware sampling
    (``data.loss_sampling``). ``setup_s``: seconds setting the feed up (the resident corpus loaded);
    ``compile_s``: seconds compiling its own program, at its first use (None before): a ``next()``, or
    the first batch of a pipelined fed step (:meth:`batch_at`; the trainer's fed step,
    :meth:`motionjax.train.step.Step.fed`, traces :attr:`draw` into its own program for the rest);
    :meth:`stats`: the host cache's hits (stream, in-process workers only).
    """

    def __init__(self, cfg, info, mesh=None, keys=None, *, seed: int, mode: str | None = None,
                 process_index=None, process_count=None, step_ms=None):
        super().__init__()
        mesh = one_device_mesh() if mesh is None else mesh
        keys = batch_keys(cfg) if keys is None else tuple(keys)
        self.mode = mode or choose_residency(cfg, info)[0]
        self._cfg, self._seed, self.served = cfg, seed, 0
        self._augment = augment.Augment(cfg, info)
        self._loss_aware = "segment" in keys
        shares = pipeline.segment_shares(info, cfg.window, cfg.dynamics_sampling)
        out = parallel.batch_shardings(mesh, keys)
        self._replicated = parallel.replicated(mesh)
        b = cfg.batch_size
        span_keys = ["root_position", "rotations", "length"] + (["offsets"] if "offsets" in keys else [])
        span_keys += ["segment"] if self._loss_aware else []
        # Each frame's floor (the resident corpus's, or computed by the host once a cached segment):
        # the program reads the window's floor from it, no FK.
        span_keys += ["lowest"] if self._augment.floor_from_span else []
        start = time.perf_counter()
        if self.mode == "device":
            corpus = resident.load_corpus(info, cfg, pipeline.ClipSource(info), shares)
            self._tables = corpus.arrays(self._replicated, info.skeleton, self._augment.mirror_rows)
            self.table = priority.ErrorTable(cfg, shares) if self._loss_aware else None
            self._q = None
            self._set_segments(shares)
            span, steps = self._augment.span, corpus.bisect_steps

            rows_keys = [k for k in span_keys if k not in ("root_position", "rotations", "lowest")]

            def program(step, tables, seg_cdf):
                keys_ = augment.example_keys(seed, step, b)
                starts = augment.purpose(keys_, augment._START)
                # The window's frames are gathered from the corpus's rows, not from a span gathered first.
                drawn = resident.sample_rows(tables, seg_cdf, starts, span, steps)
                spans = {"table": tables["frames"], "rows": drawn["rows"], **{k: drawn[k] for k in rows_keys}}
                batch = self._augment(spans, keys_)
                return {k: parallel.put(batch[k], out[k]) for k in keys}

            args = (np.int32(0), self._tables, self._seg_cdf)
            self._source, self.sampler = None, []
        else:
            self.sampler = []
            if cfg.worker_count < 0:
                cfg = cfg.copy_and_resolve_references()
                ms = step_ms() if callable(step_ms) else step_ms
                cfg.worker_count = auto_workers(cfg, info, log=_log_main, step_ms=ms)
                self._cfg = cfg
            where = dict(process_index=process_index, process_count=process_count)
            j, s = info.skeleton.num_joints, self._augment.span
            width = 3 + 4 * j + ("lowest" in span_keys)  # the frame rows (transforms.frame_rows)
            shapes = {"frames": ((s, width), np.float32), "length": ((), np.int32),
                      "offsets": ((j, 3), np.float32), "segment": ((), np.int32)}
            wire = ["frames"] + [k for k in span_keys if k in shapes]
            # Every span leaf in one array, the batches of a block in one more: one host-to-device
            # transfer (and one Grain call) a block of steps.
            block = self._block = stream_block(cfg)
            packed = pipeline.Packed({k: shapes[k] for k in wire}, parallel.named_sharding(mesh, "batch"),
                                     block)
            if self._loss_aware:
                self._source = priority.LossAwareIterator(cfg, info, shardings=packed, seed=seed, **where)
            else:
                self._source = pipeline.make_train_iterator(cfg, info, shardings=packed, seed=seed,
                                                            sampler=self.sampler, block=block, **where)

            def program(step, spans):
                wire = spans["packed"]
                if block > 1:  # the step's batch of its block [K, B, W]: its place from the device's counter
                    wire = jax.lax.dynamic_index_in_dim(wire, step % block, 0, keepdims=False)
                spans = packed.unpack(wire)
                spans.update(transforms.split_frames(spans.pop("frames"), j))
                batch = self._augment(spans, augment.example_keys(seed, step, b))
                return {k: parallel.put(batch[k], out[k]) for k in keys}

            width = sum(packed.widths.values())
            wire_shape = (block, b, width) if block > 1 else (b, width)
            args = (np.int32(0), {"packed": jax.ShapeDtypeStruct(wire_shape, np.float32,
                                                                 sharding=packed.block_sharding)})
        self.draw = program  # (step, *inputs) -> batch: traced inside the train step (train.step.fed)
        self._jitted, self._args = jax.jit(program, out_shardings={k: out[k] for k in keys}), args
        self._program, self.compile_s = None, None
        # Streamed, no loss-aware sampling: (block index, its spans, Grain's state before it).
        self._held = None
        self.setup_s = time.perf_counter() - start

    # -- what the loop calls ----------------------------------------------------------------------
    def __next__(self) -> dict:
        return self._compiled()(np.int32(self.served), *self.inputs())

    @property
    def lookahead(self) -> bool:
        """Whether a fed step may draw the next step's batch beside its own
        (:class:`motionjax.train.step.FedStep`): without loss-aware sampling, whose next batches wait
        for this step's errors. A resident feed's inputs are the same for every step; a streamed one
        holds a block of steps' spans (``data.stream_block``) and takes the next block from Grain when
        a step first needs it, keeping Grain's position before it (:meth:`get_state`)."""
        return not self._loss_aware

    def batch_at(self, step: int) -> dict:
        """Step ``step``'s batch (:meth:`lookahead` feeds only), ``served`` left where it is: what
        ``next()`` returns when ``served == step``. A streamed feed can only draw its next step's
        (``step == served``), from the block of spans that holds it."""
        assert self.lookahead, "batch_at needs a feed without loss-aware sampling"
        if self.mode == "device":
            return self._compiled()(np.int32(step), self._tables, self._seg_cdf)
        assert step == self.served, f"a streamed feed draws its next step's batch ({self.served}), not {step}"
        return self._compiled()(np.int32(step), self._block_of(step))

    def _block_of(self, step: int) -> dict:
        """The spans of the block that holds step ``step``'s batch (``[K, B, W]`` on the devices): the
        one held, or the next from Grain (steps come in order), with Grain's state before it kept."""
        k = step // self._block
        if self._held is None or self._held[0] != k:
            # Grain's state: a small dict of positions, a new one each call (~0.2 us on Bandai-2).
            before = self._source.get_state()
            self._held = (k, next(self._source), before)
        return self._held[1]

    def _compiled(self):
        if self._program is None:  # compiled at first use: a fed train step traces draw in instead
            start = time.perf_counter()
            self._program = self._jitted.lower(*self._args).compile()
            self.compile_s = time.perf_counter() - start
        return self._program

    def inputs(self, ahead: bool = False) -> tuple:
        """The arguments of :attr:`draw` after the step for the next batch (counted served): the
        resident tables and segment distribution (renewed every ``data.loss_block`` steps with
        loss-aware sampling), or the spans from Grain (the block that holds the batch; with loss-aware
        sampling, the batch's). ``draw(served before, *inputs())`` is :meth:`__next__`'s batch, whether
        one program runs it or the train step traces it in.

        ``ahead`` (:attr:`lookahead` feeds, after :meth:`batch_at`): the inputs of the batch after
        the one counted, ``draw(served after, *inputs(ahead=True))``, as a pipelined fed step draws
        it while it trains on the one counted."""
        if self.mode == "stream" and self._loss_aware:
            out = (next(self._source),)
        elif self.mode == "stream":
            out = (self._block_of(self.served + 1 if ahead else self.served),)
        else:
            if self.table is not None and self.served % self._cfg.loss_block == 0:
                self.table.apply(upto=self.served - 1)  # steps the loop has surely read (priority's doc)
                self._set_segments(self.table.probabilities(self.served))
            out = (self._tables, self._seg_cdf)
        self.served += 1
        return out

    def record(self, step: int, segments, errors) -> None:
        """Step ``step``'s (1-based) windows: their segments ``[B]`` and errors ``[B]`` (global)."""
        (self._source or self.table).record(step, segments, errors)

    def stats(self) -> dict | None:
        """The stream tier's host cache statistics (:meth:`~pipeline.SegmentCache.stats`), when its
        sampler runs in this process (``data.worker_count = 0``); else None."""
        if self.mode != "stream" or self._cfg.worker_count:
            return None
        cache = self.sampler[0].cache if self.sampler else getattr(self._source, "cache", None)
        return None if cache is None else cache.stats()

    def _set_segments(self, q) -> None:
        self._q = np.asarray(q, np.float64)
        self._seg_cdf = parallel.put(resident.segment_cdf(self._q), self._replicated)

    # -- Grain's iterator protocol ----------------------------------------------------------------
    def get_state(self) -> dict:
        state = {"residency": self.mode, "served": self.served}
        if self.mode == "stream" and not self._loss_aware:
            # Grain's position before the block of the next batch: a restore takes that block again.
            held = self._held is not None and self._held[0] == self.served // self._block
            state.update(block=self._block, source=self._held[2] if held else self._source.get_state())
        elif self.mode == "stream":
            state["source"] = self._source.get_state()
        elif self.table is not None:
            state.update(q=self._q.tolist(), **self.table.get_state())
        return state

    def set_state(self, state: dict) -> None:
        if "served" not in state:  # saved by the host pipeline of before (#53): its position only
            self.served = _legacy_position(state, self._cfg.batch_size)
            logging.warning("the saved data position predates the device input path: continuing at batch "
                            "%d with new draws", self.served)
            return
        self.served = int(state["served"])
        if state.get("residency") != self.mode:
            logging.warning("this run saved its data stream with data.residency=%r and resumes with %r: the "
                            "windows it draws from here differ from the uninterrupted run's",
                            state.get("residency"), self.mode)
            return
        if self.mode == "stream" and state.get("block", 1) != self._block:
            logging.warning("this run saved its data stream in blocks of %d batches and resumes with "
                            "data.stream_block=%d: the windows it draws from here differ from the "
                            "uninterrupted run's", state.get("block", 1), self._block)
            self._held = None
            return
        if self.mode == "stream":
            self._source.set_state(state["source"])
            self._held = None
        elif self.table is not None:
            self.table.set_state(state)
            self._set_segments(state["q"])

    def close(self) -> None:
        source, self._source = getattr(self, "_source", None), None
        if source is not None and hasattr(source, "close"):
            source.close()


def _log_main(message: str) -> None:
    if parallel.is_main_process():
        print(message, flush=True)


def _legacy_position(state, batch_size: int) -> int:
    """Batches taken, from a Grain iterator state of the host pipeline of before: its ``served``
    count (loss-aware) or the first ``next_index`` (windows) found."""
    if isinstance(state, dict):
        if "served" in state:
            return int(state["served"])
        if "next_index" in state:
            return int(state["next_index"]) // batch_size
        for v in state.values():
            found = _legacy_position(v, batch_size)
            if found:
                return found
    return 0
