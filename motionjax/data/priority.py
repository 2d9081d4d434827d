"""Loss-aware window sampling: training segments drawn more often while the model still gets them
wrong, with a floor so every one is still seen, and a stream that restores exactly (#32).

The priority table belongs to the training loop, not to Grain's workers (a table the workers read
while they prefetch would make the stream depend on timing). The stream is cut into blocks of
``data.loss_block`` steps. At a block's start the table gives every training segment ``s``

    q(s) = (1 - λ) · p(s) + λ · e(s) / Σ e

with ``p`` today's share (:func:`pipeline.segment_shares`: uniform/dynamics mixture), ``e(s)`` the
segment's latest window error (root-relative, m: what the validation MPJPE measures) and
``λ = data.loss_sampling < 1``, so ``q(s) ≥ (1 - λ) · p(s) > 0``. A segment not seen for more than
``data.loss_staleness`` steps (or never) gets the mean error of the fresh ones. The block is then a
plain Grain pipeline (:func:`pipeline.make_train_iterator`) over ``R · B`` segments drawn from
``q`` with the block's own seed: workers, prefetch and the iterator state stay Grain's. The cost
is a cold prefetch at each block's start (and, with ``data.worker_count > 0``, the workers started
anew, each with an empty host cache; in the main process the blocks share one): about 1% host wait
at ``R = 250`` on the headline autoencoder.

The loop reads a step's metrics one step late, so the errors of steps ``1 … n - 1`` are known when
the batch of step ``n + 1`` is asked for; block ``b`` (steps ``bR + 1 …``) is drawn from exactly
those, whatever else the loop read by then (errors that arrive early wait in ``pending``). The
checkpointed state holds the table, the pending errors, the block's ``q`` and the inner iterator's
state: a restored run draws what the uninterrupted one drew.
"""
from __future__ import annotations

import grain
import numpy as np

from motionjax.data import pipeline
from motionjax.data.info import DatasetInfo


def mixture(shares, error, fresh, weight: float) -> np.ndarray:
    """``[S]`` sampling probabilities ``(1 - weight)·shares + weight·e/Σe``.

    ``shares [S]``: today's probabilities (0 for a segment with no window, which stays 0); ``error
    [S]`` the latest window error of each segment; ``fresh [S]`` bool: whether that error is recent
    (the others take the mean of the fresh ones; with none fresh, ``shares``)."""
    shares = np.asarray(shares, np.float64)
    live = shares > 0
    fresh = np.asarray(fresh, bool) & live
    if not fresh.any() or weight == 0:
        return shares / shares.sum()
    e = np.where(fresh, np.asarray(error, np.float64), np.mean(np.asarray(error, np.float64)[fresh]))
    e = np.where(live, np.maximum(e, 0.0), 0.0)
    if e.sum() <= 0:
        return shares / shares.sum()
    q = (1 - weight) * shares / shares.sum() + weight * e / e.sum()
    return q / q.sum()


class ErrorTable:
    """Each training segment's latest window error and the step it was measured at, and the mixture
    (:func:`mixture`) they give: the state loss-aware sampling keeps, whether the windows are drawn by
    Grain (:class:`LossAwareIterator`) or on the device (:mod:`motionjax.data.feed`)."""

    def __init__(self, cfg, shares):
        if not 0 < cfg.loss_sampling < 1:
            raise ValueError(f"config.data.loss_sampling={cfg.loss_sampling}: expected a number in (0, 1)")
        self.weight, self.staleness = cfg.loss_sampling, cfg.loss_staleness
        self.shares = np.asarray(shares, np.float64)
        self.error = np.zeros(self.shares.size)          # latest window error of each segment (m)
        self.seen = np.full(self.shares.size, -1, np.int64)  # the step it was measured at (-1: never)
        self.pending: list = []                          # [step, segments, errors] not in the table yet

    def record(self, step: int, segments, errors) -> None:
        """Step ``step``'s (1-based) windows: their segments ``[B]`` and errors ``[B]`` (global)."""
        self.pending.append([int(step), np.asarray(segments, np.int64).tolist(),
                             np.asarray(errors, np.float64).tolist()])

    def probabilities(self, step: int) -> np.ndarray:
        """``[S]`` the mixture the table gives at ``step`` (:func:`mixture`)."""
        fresh = (self.seen >= 0) & ((step - self.seen <= self.staleness) if self.staleness else True)
        return mixture(self.shares, self.error, fresh, self.weight)

    def apply(self, upto: int) -> None:
        """Move the pending errors of steps ``<= upto`` into the table."""
        keep = []
        for step, segments, errors in self.pending:
            if step > upto:
                keep.append([step, segments, errors])
                continue
            segments, errors = np.asarray(segments, np.int64), np.asarray(errors, np.float64)
            total, count = np.zeros_like(self.error), np.zeros_like(self.error)
            np.add.at(total, segments, errors)  # a segment drawn twice in a step: its mean error
            np.add.at(count, segments, 1.0)
            hit = count > 0
            self.error[hit], self.seen[hit] = total[hit] / count[hit], step
        self.pending = keep

    def get_state(self) -> dict:
        return {"error": self.error.tolist(), "seen": self.seen.tolist(), "pending": self.pending}

    def set_state(self, state: dict) -> None:
        if len(state["error"]) != self.shares.size:
            raise ValueError(f"the saved loss-aware sampler has {len(state['error'])} training segments, "
                             f"this dataset {self.shares.size}: not the same data")
        self.error = np.asarray(state["error"], np.float64)
        self.seen = np.asarray(state["seen"], np.int64)
        self.pending = [list(p) for p in state["pending"]]


class LossAwareIterator(grain.DatasetIterator):
    """The training iterator with loss-aware sampling (``data.loss_sampling > 0``).

    A Grain ``DatasetIterator`` (so ``grain.checkpoint.CheckpointSave/Restore`` save and restore it
    like the plain one) whose batches also hold ``"segment" [B]``. The loop reports each step's
    window errors with :meth:`record`. Arguments as :func:`pipeline.make_train_iterator`.
    """

    def __init__(self, cfg, info: DatasetInfo, *, shardings=None, seed: int = 0, process_index=None,
                 process_count=None):
        super().__init__()
        self._cfg, self._info, self._shardings, self._seed = cfg, info, shardings, seed
        self._where = dict(process_index=process_index, process_count=process_count)
        self.table = ErrorTable(cfg, pipeline.segment_shares(info, cfg.window, cfg.dynamics_sampling))
        self.served = 0                                  # batches handed out (= steps dispatched)
        self.block, self.q, self._inner = -1, None, None
        # One host cache for every block's pipeline (in this process: workers start their own).
        self.cache = pipeline.SegmentCache(int(cfg.host_cache_mb * 2**20))

    # -- what the loop calls ----------------------------------------------------------------------
    def record(self, step: int, segments, errors) -> None:
        """Step ``step``'s (1-based) windows: their segments ``[B]`` and errors ``[B]`` (global)."""
        self.table.record(step, segments, errors)

    def __next__(self):
        block = self.served // self._cfg.loss_block
        if block != self.block:
            self.table.apply(upto=self.served - 1)  # steps the loop has surely read: see the module doc
            self._open(block, self.table.probabilities(self.served))
        batch = next(self._inner)
        self.served += 1
        return batch

    # -- the blocks -------------------------------------------------------------------------------
    def _block_seed(self, block: int) -> int:
        return int(np.random.SeedSequence([self._seed, block]).generate_state(1)[0])

    def _open(self, block: int, q: np.ndarray) -> None:
        if self._inner is not None:
            self._inner.close()
        seed = self._block_seed(block)
        draws = self._cfg.loss_block * self._cfg.batch_size
        segments = np.random.default_rng(seed).choice(q.size, size=draws, p=q)
        rows = pipeline.segment_rows(self._info, segments)
        self._inner = pipeline.make_train_iterator(self._cfg, self._info, shardings=self._shardings,
                                                   seed=seed, rows=rows, cache=self.cache, **self._where)
        self.block, self.q = block, np.asarray(q, np.float64)

    # -- Grain's iterator protocol ----------------------------------------------------------------
    def get_state(self) -> dict:
        return {"served": self.served, "block": self.block,
                "q": None if self.q is None else self.q.tolist(),
                "inner": None if self._inner is None else self._inner.get_state(), **self.table.get_state()}

    def set_state(self, state: dict) -> None:
        self.table.set_state(state)
        self.served = int(state["served"])
        if state["inner"] is None:
            if self._inner is not None:
                self._inner.close()
            self.block, self.q, self._inner = -1, None, None
            return
        self._open(int(state["block"]), np.asarray(state["q"], np.float64))
        self._inner.set_state(state["inner"])

    def start_prefetch(self) -> None:
        if self._inner is not None:
            self._inner.start_prefetch()

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()
