"""Tests of kernels/launch_order.py: the fold-first launch order, its reference and its kernel.

The reference is checked against numpy's own account of the order (the folding rows' indices,
then the others'); the kernel against the reference, bit for bit.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from replayssm_jax.kernels import launch_order


def test_fold_first_order():
  """A permutation of the rows, those that fold first, each group in row order, and the row
  arrays put in that order; a padding row asking for a fold is not a folding row."""
  count = jnp.array([0, 3, 0, 0, 5, 2, 0, 1], jnp.int32)
  slot_ids = jnp.array([0, 1, 2, -1, -1, 5, 6, 7], jnp.int32)
  order, slots, counts = launch_order.fold_first_order(count, slot_ids, slot_ids, count)
  assert order.tolist() == [1, 5, 7, 0, 2, 3, 4, 6]
  assert slots.tolist() == [1, 5, 7, 0, 2, -1, -1, 6]
  assert counts.tolist() == [3, 2, 1, 0, 0, 0, 5, 0]
  for seed in range(5):
    rng = np.random.default_rng(seed)
    count = jnp.asarray(rng.integers(0, 3, 33), jnp.int32)
    values = jnp.asarray(rng.integers(-9, 9, 33), jnp.int32)
    order, in_order = launch_order.fold_first_order(count, jnp.arange(33, dtype=jnp.int32), values)
    folds = np.asarray(count) > 0
    assert order.tolist() == np.flatnonzero(folds).tolist() + np.flatnonzero(~folds).tolist()
    assert in_order.tolist() == np.asarray(values)[np.asarray(order)].tolist()


@pytest.mark.parametrize("B", [1, 3, 8, 33])
def test_launch_order_kernel(B, interpret):
  """The launch order's kernel gives `fold_first_order`'s permutation and arrays, B a power of
  two or not, padding rows that ask for a fold among them."""
  rng = np.random.default_rng(B)
  count = jnp.asarray(rng.integers(0, 3, B), jnp.int32)
  slot_ids = jnp.asarray(np.where(rng.random(B) < 0.2, -1, rng.permutation(B)), jnp.int32)
  values = [jnp.asarray(rng.integers(-99, 99, B), jnp.int32) for _ in range(3)]
  want = launch_order.fold_first_order(count, slot_ids, *values)
  got = launch_order.fold_first_order_pallas(count, slot_ids, *values, interpret=interpret)
  for x, y in zip(want, got, strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
