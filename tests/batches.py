"""Helpers of the tests that read batch iterators: take batches to numpy, compare two lists of them."""
import jax
import numpy as np


def take(it, n: int) -> list[dict]:
    """The next ``n`` batches of ``it``, every leaf a numpy array."""
    return [jax.tree.map(np.asarray, next(it)) for _ in range(n)]


def equal(a: list[dict], b: list[dict]) -> bool:
    """Whether two lists of batches hold the same keys with bitwise equal arrays."""
    return all(np.array_equal(x[k], y[k]) for x, y in zip(a, b, strict=True) for k in x)


def assert_resumes_exactly(make, directory) -> None:
    """An iterator from ``make()`` that took 3 batches continues, from its state set on a fresh one and
    from an orbax checkpoint restored into another, with the batches it would have given."""
    import grain
    import orbax.checkpoint as ocp

    it = make()
    take(it, 3)  # prefetch buffers may now hold batches that were not consumed
    state = it.get_state()
    with ocp.CheckpointManager(directory) as mngr:
        mngr.save(3, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
        mngr.wait_until_finished()
        expected = take(it, 2)
        it.close()
        fresh = make()
        fresh.set_state(state)
        assert equal(take(fresh, 2), expected)
        fresh.close()
        restored = make()
        mngr.restore(3, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(restored)))
        assert equal(take(restored, 2), expected)
        restored.close()
