"""The ops' XLA references against numpy: the tests, the benchmark and ``coremesh profile``
measure the kernels against these, so each is held to an independent computation once here."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import coremesh.sparsecore as sc

ROWS, COLS = 10, 4
#: In range, below it and past it: negative indices are out of range, not wrapped.
INDICES = np.array([3, -1, 9, 10, 0, 3], np.int32)
VALID = (INDICES >= 0) & (INDICES < ROWS)


def table() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((ROWS, COLS)).astype(np.float32)


def test_gather_reference_clips_or_fills() -> None:
    t = table()
    clipped = sc.gather_reference(jnp.asarray(t), jnp.asarray(INDICES), mode="clip")
    np.testing.assert_array_equal(np.asarray(clipped), t[np.clip(INDICES, 0, ROWS - 1)])
    filled = np.asarray(sc.gather_reference(jnp.asarray(t), jnp.asarray(INDICES), mode="fill"))
    np.testing.assert_array_equal(filled[VALID], t[INDICES[VALID]])
    assert np.isnan(filled[~VALID]).all()


@pytest.mark.parametrize("mode", ["drop", "clip"])
def test_scatter_add_reference_adds_each_duplicate_and_drops_or_clips(mode: str) -> None:
    t = table()
    updates = np.random.default_rng(1).standard_normal((len(INDICES), COLS)).astype(np.float32)
    want = t.copy()
    if mode == "drop":
        np.add.at(want, INDICES[VALID], updates[VALID])
    else:
        np.add.at(want, np.clip(INDICES, 0, ROWS - 1), updates)
    out = sc.scatter_add_reference(
        jnp.asarray(t), jnp.asarray(INDICES), jnp.asarray(updates), mode=mode
    )
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6, atol=1e-6)


def test_segment_sum_reference_drops_out_of_range_ids() -> None:
    values = np.arange(len(INDICES) * COLS, dtype=np.float32).reshape(-1, COLS)
    want = np.zeros((ROWS, COLS), np.float32)
    np.add.at(want, INDICES[VALID], values[VALID])
    out = sc.segment_sum_reference(jnp.asarray(values), jnp.asarray(INDICES), ROWS)
    np.testing.assert_array_equal(np.asarray(out), want)


@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_embedding_bag_reference_combines_each_bags_valid_rows(combiner: str) -> None:
    t = table()
    offsets = np.array([0, 2, 2, 5], np.int32)  # bags of 2, 0, 3 and 1 indices
    out = sc.embedding_bag_reference(
        jnp.asarray(t), jnp.asarray(INDICES), jnp.asarray(offsets), combiner=combiner, mode="drop"
    )
    bounds = [*offsets.tolist(), len(INDICES)]
    want = np.zeros((len(offsets), COLS), np.float32)
    for b in range(len(offsets)):
        ids = INDICES[bounds[b] : bounds[b + 1]]
        rows = t[ids[(ids >= 0) & (ids < ROWS)]]
        if len(rows):
            want[b] = rows.sum(0) if combiner == "sum" else rows.mean(0)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6, atol=1e-6)
