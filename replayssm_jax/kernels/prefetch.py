"""Cache prefetches in the Pallas kernels: ``prefetch.global.{L1,L2}`` of a ref view.

The fold's record loop waits on its loads: each record is loaded one update ahead into
registers, and the H200 profiles put the loop's hottest stall on those loads (benchmarks/
NOTES.md runs 18 and 22). Loading further ahead cost registers every time it was tried (two
records ahead, a touch of record i + 2: runs 15, 18). A prefetch has no destination register:
it asks the cache for the lines and the program goes on, so a program can ask for all of its
records when it starts, and its loads later find them in L1.

Pallas has no prefetch, so `prefetch` is a primitive of this package with a lowering rule in
JAX's Pallas Triton lowering: the pointers of the view, computed as Pallas computes a load's,
go into one inline PTX prefetch each (``pure=False``, so nothing removes it). A view of shape
``[..., n]`` issues a prefetch per element, so index it with one element per 128-byte line.
It only hints the caches: no value, no bit and no ordering of the kernel depends on it, so
the interpreter (CPU) issues nothing (`prefetch` is called only when compiled).

The rule reads three private helpers of ``jax._src.pallas.triton.lowering``
(``_compute_offsets_from_indices``, ``_bcast_to``, ``_add``); ``tests/test_lowering.py``
lowers it with the installed JAX, so a change there shows at once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import tree_util
from jax._src import core as jax_core
from jax._src.lib.mlir import ir
from jax._src.lib.triton import dialect as tt_dialect
from jax._src.pallas.triton import lowering as triton_lowering
from jax._src.state import indexing
from jax._src.state import primitives as state_primitives
from jax._src.state import types as state_types

LEVELS = ("L1", "L2")
LINE_BYTES = 128  # an L1 / L2 cache line


def line_stride(dtype) -> int:
  """Elements of ``dtype`` in a cache line: the index stride of one prefetch per line."""
  return LINE_BYTES // jnp.dtype(dtype).itemsize


prefetch_p = jax_core.Primitive("replayssm_prefetch")
prefetch_p.multiple_results = True


def prefetch(ref, idx, *, level: str = "L1") -> None:
  """Ask the ``level`` cache for the line of every element of ``ref[idx]`` (GPU, compiled).

  ``idx`` indexes as a load's does (ints, `pl.ds` slices, int arrays). Nothing is read into
  registers and nothing waits; call it only in a compiled Triton kernel.
  """
  if level not in LEVELS:
    raise ValueError(f"prefetch: level={level!r}; expected one of {LEVELS}.")
  x_ref, transforms = state_primitives.get_ref_and_transforms(ref, idx, "prefetch")
  args_flat, args_tree = tree_util.tree_flatten((x_ref, transforms))
  prefetch_p.bind(*args_flat, args_tree=args_tree, level=level)


def prefetch_lines(ref, lead: tuple, rows: jax.Array, start, size: int, *, level: str) -> None:
  """`prefetch` of ``ref[*lead, rows[i], start:start + size]`` for every i, a line at a time.

  ``rows`` (int32, 1-D) index the second-to-last axis; the last axis' ``size`` elements from
  ``start`` (a multiple of a line's elements, or within one line) take one prefetch per line.
  """
  step = line_stride(ref.dtype)
  lines = jnp.arange(0, max(size, step), step, dtype=jnp.int32)
  prefetch(ref, (*lead, rows[:, None], start + lines[None, :]), level=level)


@prefetch_p.def_effectful_abstract_eval
def _prefetch_abstract_eval(*avals_flat, args_tree, level):
  del avals_flat, args_tree, level
  # A write, though nothing is written: JAX removes an equation with no outputs whose only
  # effect is a read.
  return [], {state_types.WriteEffect(0)}


@triton_lowering.register_lowering(prefetch_p)
def _prefetch_lowering(ctx: triton_lowering.LoweringRuleContext, *args_flat, args_tree, level):
  ptr, transforms = args_tree.unflatten(args_flat)
  block_info = ctx.block_infos[0]
  if len(transforms) > 1:
    raise NotImplementedError("prefetch: one indexer at most")
  if transforms:
    [idx] = transforms
  else:
    ref_aval = state_types.transform_type(transforms, ctx.avals_in[0])
    idx = indexing.NDIndexer.make_trivial_indexer(ref_aval.shape)
  offsets = triton_lowering._compute_offsets_from_indices(block_info, idx)
  if isinstance(offsets, tuple):  # JAX >= 0.12 also returns a bounds mask (no masks here)
    offsets = offsets[0]
  shape = idx.get_indexer_shape_static()
  ptrs = triton_lowering._add(triton_lowering._bcast_to(ptr, shape), offsets)
  i32 = ir.IntegerType.get_signless(32)
  result = ir.RankedTensorType.get(shape, i32) if shape else i32
  # One prefetch per element; the dummy result is what the op must return.
  tt_dialect.elementwise_inline_asm(
      [result], f"prefetch.global.{level} [$1];\n\tmov.u32 $0, 0;", constraints="=r,l",
      pure=False, packed_element=1, args=[ptrs])
  return []
