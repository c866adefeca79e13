"""The fold-first launch order of the split verify's stream (`replay_split.STREAM_FOLD_FIRST`).

The rows that fold this step first, each group in row order, so that the stream's folding
programs start before the others and a step does not wait for a fold begun last. Along with the
permutation come the stream's ``[B]`` row arrays (slot ids, cursors, fold counts) put in that
order, so a stream program finds its slot in one load (`replay_parts.tile_program`'s ``pos``).

`fold_first_order` is the reference (XLA ops); `fold_first_order_pallas` computes the same in one
small kernel, which the stream launches use (H200, B=256: 2.0 us against the XLA ops' 5.2,
benchmarks/NOTES.md run 13).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from replayssm_jax.config import next_power_of_two
from replayssm_jax.kernels.backend import KernelTuning


def fold_first_order(fold_count, slot_ids, *row_arrays):
  """The rows in launch order, those that fold this step first (each group in row order): the
  permutation ``int32[B]``, then each of ``row_arrays`` (``[B]`` each) put in that order.

  Counts and masked sums over ``[B, B]`` compares (no sort, cumsum or scatter), so the arrays
  come in order from the same reductions. On the H200 these are four small XLA kernels, 5.2 us
  a step at B=256 (benchmarks/NOTES.md runs 12, 13): `fold_first_order_pallas` does the same in
  2.0 us."""
  folds = (fold_count > 0) & (slot_ids >= 0)
  rows = jnp.arange(folds.shape[0], dtype=jnp.int32)
  key = jnp.where(folds, rows, rows + folds.shape[0])  # distinct; the folding rows' smallest
  rank = jnp.sum(key[None, :] < key[:, None], axis=1, dtype=jnp.int32)  # row r goes rank[r]-th
  launched = rank[None, :] == rows[:, None]  # [i, r]: row r is launched i-th
  return tuple(jnp.sum(jnp.where(launched, x[None, :], 0), axis=1, dtype=x.dtype)
               for x in (rows, *row_arrays))


def _fold_first_order_kernel(fold_count_ref, slot_ids_ref, *refs, B: int):
  """One program per row: its rank in `fold_first_order`, at which it stores its index and its
  entry of each row array. ``refs``: the row arrays, then the order and the arrays in it."""
  row_refs, (order_ref, *out_refs) = refs[:len(refs) // 2], refs[len(refs) // 2:]
  row = pl.program_id(0)
  lanes = jax.lax.broadcasted_iota(jnp.int32, (next_power_of_two(B),), 0)
  at = jnp.minimum(lanes, B - 1)  # lanes past B read row B - 1 and are not counted
  folds = (fold_count_ref[at] > 0) & (slot_ids_ref[at] >= 0)
  key = jnp.where(folds, lanes, lanes + B)  # distinct; the folding rows' smallest
  mine = jnp.where((fold_count_ref[row] > 0) & (slot_ids_ref[row] >= 0), row, row + B)
  rank = jnp.sum(jnp.where((lanes < B) & (key < mine), 1, 0))
  order_ref[rank] = row
  for x_ref, out_ref in zip(row_refs, out_refs):
    out_ref[rank] = x_ref[row]


@functools.partial(jax.jit, static_argnames=("interpret",))
def fold_first_order_pallas(fold_count, slot_ids, *row_arrays, interpret: bool):
  """`fold_first_order` as one small Pallas kernel: the same permutation and arrays
  (``int32[B]`` each), from one launch of B one-warp programs."""
  B = slot_ids.shape[0]
  outs = (jax.ShapeDtypeStruct((B,), jnp.int32),
          *(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in row_arrays))
  return pl.pallas_call(
      functools.partial(_fold_first_order_kernel, B=B),
      out_shape=outs,
      grid=(B,),
      interpret=interpret,
      compiler_params=KernelTuning(num_warps=1, num_stages=1).compiler_params(),
      name="fold_first_order",
  )(fold_count, slot_ids, *row_arrays)
