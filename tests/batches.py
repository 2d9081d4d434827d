"""Helpers of the tests that read batch iterators: take batches to numpy, compare two lists of them."""
import jax
import numpy as np


def take(it, n: int) -> list[dict]:
    """The next ``n`` batches of ``it``, every leaf a numpy array."""
    return [jax.tree.map(np.asarray, next(it)) for _ in range(n)]


def equal(a: list[dict], b: list[dict]) -> bool:
    """Whether two lists of batches hold the same keys with bitwise equal arrays."""
    return all(np.array_equal(x[k], y[k]) for x, y in zip(a, b, strict=True) for k in x)
