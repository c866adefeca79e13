"""Exact fold as a native Triton kernel: replay committed raw records into the fp32 checkpoint.

The contract of `replayssm_jax.kernels.fold` (DESIGN sections 3-4): for each row with
``count[b] > 0`` the program owning ``S = ssm[slot, h, j*BV:(j+1)*BV, :]`` replays records
``i = 0 .. count-1`` at ring index ``(cache_base + i) & (L - 1)`` through
`tile.delta_rule_step`, in place. It is the loop of the triton `recurrent` kernels with the
inputs read from the ring: the same tile, the same step, the same ``range`` loop, launched
with the same `KernelTuning`, so the folded checkpoint is bitwise the state the triton
recurrent verify commits (g and beta are the bits `tile.gating` produced when the replay
verify wrote the records). The GPU tests check the bits (H200, 2026-11-30: equal at every
launch swept once fp fusion was off, `tile`; again 2026-12-04 with the loads below and with
run 34's tiles); 404 us for 12 records at B=256, 64% of the copy bandwidth (615 before the
loads below, 472 before `tile`'s fma chains and raw keys and the one-warp tiles of
`state_tuning`; the Pallas fold 397).
"""

from __future__ import annotations

import functools

import jax
import triton
import triton.language as tl

from replayssm_jax.kernels import fold as pallas_fold
from replayssm_jax.kernels.backend import KernelTuning
from replayssm_jax.kernels.triton import tile
from replayssm_jax.kernels.triton.launch import Launch, run
from replayssm_jax.kernels.triton.recurrent import check_tuning

# The record loop's loads, after the Pallas fold's (`replayssm_jax.kernels.fold`, NOTES runs
# 18 and 24); neither changes a bit. A program asks L1 for all its records when it starts, so
# the loop's loads find them there, and record i + 1's norm, v, g and beta are loaded right
# after record i's update (loaded before it, the kernel takes 168 registers with triton 3.6,
# 127 after). H200, 12 records (NOTES run 32): B=256 613 -> 512 us with the records in L1, 472
# with them loaded ahead too (B=64 167 -> 140 -> 130). The checkpoint tile of the program 132
# launches later asked of L2, worth 11 us to the Pallas fold, gained nothing here (515 against
# 512, 472 against 471). Session 34 removed the three switches (the code is in d5fe77a).


@triton.jit
def _lines(ptr, n: tl.constexpr):
  """Pointers to the cache lines of ``ptr[0:n]``: one per 128 bytes (at least one)."""
  per_line: tl.constexpr = 1024 // ptr.dtype.element_ty.primitive_bitwidth
  return ptr + tl.arange(0, max(n // per_line, 1)) * per_line


@triton.jit
def _prefetch_records(ring_rawk_ptr, ring_rawv_ptr, ring_g_ptr, ring_beta_ptr, slot, h, kh,
                      first_row, count, base, L: tl.constexpr, H: tl.constexpr, HV: tl.constexpr,
                      K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
  """All ``count`` records of the program into L1: raw k (a row of K), its BV columns of raw v,
  and the rows of g and beta of head h. Ring entries past ``count`` repeat the last."""
  p = (base + tl.minimum(tl.arange(0, L), count - 1)) & (L - 1)
  tile.prefetch(((slot * H + kh) * L + p)[:, None] * K + _lines(ring_rawk_ptr, K)[None, :], "L1")
  tile.prefetch(((slot * HV + h) * L + p)[:, None] * V + first_row
                + _lines(ring_rawv_ptr, BV)[None, :], "L1")
  tile.prefetch(_lines(ring_g_ptr + (slot * HV + h) * L, L), "L1")
  tile.prefetch(_lines(ring_beta_ptr + (slot * HV + h) * L, L), "L1")


@triton.jit
def _record(rawk_ptr, ring_rawv_ptr, ring_g_ptr, ring_beta_ptr, record, first_row, p,
            K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, WARPS: tl.constexpr):
  """Record p's ``(1 / |raw k|, v, g, beta)``; ``rawk_ptr`` and ``record`` point at the
  program's rows of the rings."""
  v = tl.load(ring_rawv_ptr + (record + p) * V + first_row + tl.arange(0, BV)).to(tl.float32)
  return (tile.inverse_norm(rawk_ptr + p * K, K, WARPS), v, tl.load(ring_g_ptr + record + p),
          tl.load(ring_beta_ptr + record + p))


@triton.jit
def fold_tile(ring_rawk_ptr, ring_rawv_ptr, ring_g_ptr, ring_beta_ptr, ssm_ptr, slot, h, kh,
              first_row, count, base, L: tl.constexpr, H: tl.constexpr, HV: tl.constexpr,
              K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, KC: tl.constexpr,
              WARPS: tl.constexpr):
  """Replay ``count`` records from ring index ``base`` into the ``[BV, K]`` tile of rows
  ``first_row ..`` of (slot, h), in place: the fold kernel's loop, which a replay stream of more
  warps runs too (`replay_split`), in tiles of as many rows a warp (one layout, one rounding)."""
  rows, cols = tile.state_offsets(BV, K, KC)
  state = ssm_ptr + ((slot * HV + h) * V + first_row) * K
  S = tile.load_tile(state, rows, cols)
  _prefetch_records(ring_rawk_ptr, ring_rawv_ptr, ring_g_ptr, ring_beta_ptr, slot, h, kh,
                    first_row, count, base, L, H, HV, K, V, BV)
  rawk = ring_rawk_ptr + (slot * H + kh) * L * K
  record = (slot * HV + h) * L
  # Record i + 1's norm, v, g and beta are loaded right after record i's update; its k, as
  # large as the tile, where used.
  inv_norm, v, g, beta = _record(rawk, ring_rawv_ptr, ring_g_ptr, ring_beta_ptr, record,
                                 first_row, base & (L - 1), K, V, BV, WARPS)
  for i in range(count):
    p = (base + i) & (L - 1)
    k = tile.load_vector(rawk + p * K, rows, cols)
    S, d = tile.delta_rule_step(S, k, inv_norm, v, g, beta)
    inv_norm, v, g, beta = _record(rawk, ring_rawv_ptr, ring_g_ptr, ring_beta_ptr, record,
                                   first_row, (base + i + 1) & (L - 1), K, V, BV, WARPS)
  tile.store_tile(state, rows, cols, S)


@triton.jit
def round_into_copy(ssm_ptr, copy_ptr, slot, h, first_row, HV: tl.constexpr, K: tl.constexpr,
                    V: tl.constexpr, BV: tl.constexpr, KC: tl.constexpr):
  """Rows ``first_row .. + BV`` of (slot, h)'s folded checkpoint, read back (from L2), rounded
  into its bf16 copy, in ``[BV, KC]`` blocks of offsets of their own, not from the loop's tile:
  the Pallas fold's bf16 store of the loop's tile had Triton lay the loop out anew, which the
  bitwise tie cannot take."""
  tl.debug_barrier()  # the program's threads read what its other threads stored
  offset = ((slot * HV + h) * V + first_row) * K
  block = tl.arange(0, BV)[:, None] * K + tl.arange(0, KC)[None, :]
  for c in tl.static_range(0, K, KC):
    rounded = tl.load(ssm_ptr + offset + block + c).to(copy_ptr.dtype.element_ty)
    tl.store(copy_ptr + offset + block + c, rounded)


@triton.jit
def _fold_program(slot_ids_ptr, count_ptr, cache_base_ptr, ring_rawk_ptr, ring_rawv_ptr,
                  ring_g_ptr, ring_beta_ptr, ssm_ptr, copy_ptr, COPY: tl.constexpr,
                  L: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                  V: tl.constexpr, BV: tl.constexpr, KC: tl.constexpr, WARPS: tl.constexpr):
  """One program's fold of its ``[BV, K]`` tile; with ``COPY``, the folded tile rounded into
  ``copy_ptr`` too (`SpecConfig.checkpoint_copy`)."""
  j, h, row = tl.program_id(0), tl.program_id(1), tl.program_id(2)
  slot = tl.load(slot_ids_ptr + row).to(tl.int64)
  count, base = tl.load(count_ptr + row), tl.load(cache_base_ptr + row)
  kh = h // (HV // H)
  if (slot >= 0) & (count > 0):
    fold_tile(ring_rawk_ptr, ring_rawv_ptr, ring_g_ptr, ring_beta_ptr, ssm_ptr, slot, h, kh,
              j * BV, count, base, L, H, HV, K, V, BV, KC, WARPS)
    if COPY:
      round_into_copy(ssm_ptr, copy_ptr, slot, h, j * BV, HV, K, V, BV, K)


@triton.jit
def _fold_kernel(
    # inputs
    slot_ids_ptr,  # [B] int32
    count_ptr,  # [B] int32: records to fold (0: leave the row alone)
    cache_base_ptr,  # [B] int32
    ring_rawk_ptr,  # [slots, H, L, K] activation
    ring_rawv_ptr,  # [slots, HV, L, V] activation
    ring_g_ptr,  # [slots, HV, L] f32
    ring_beta_ptr,  # [slots, HV, L] f32
    ssm_in_ptr,  # [slots, HV, V, K] f32, the buffer of ssm_ptr
    # outputs
    ssm_ptr,  # [slots, HV, V, K] f32, updated in place
    L: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, KC: tl.constexpr, WARPS: tl.constexpr,  # the launch's warps
):
  _fold_program(slot_ids_ptr, count_ptr, cache_base_ptr, ring_rawk_ptr, ring_rawv_ptr,
                ring_g_ptr, ring_beta_ptr, ssm_ptr, ssm_ptr, False, L, H, HV, K, V, BV, KC, WARPS)


@triton.jit
def _fold_copy_kernel(
    # inputs: as _fold_kernel's, then
    slot_ids_ptr, count_ptr, cache_base_ptr, ring_rawk_ptr, ring_rawv_ptr, ring_g_ptr,
    ring_beta_ptr, ssm_in_ptr,
    ssm_copy_in_ptr,  # [slots, HV, V, K] bf16, the buffer of ssm_copy_ptr
    # outputs
    ssm_ptr,  # [slots, HV, V, K] f32, updated in place
    ssm_copy_ptr,  # [slots, HV, V, K] bf16, updated in place
    L: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, KC: tl.constexpr, WARPS: tl.constexpr,
):
  _fold_program(slot_ids_ptr, count_ptr, cache_base_ptr, ring_rawk_ptr, ring_rawv_ptr,
                ring_g_ptr, ring_beta_ptr, ssm_ptr, ssm_copy_ptr, True, L, H, HV, K, V, BV, KC,
                WARPS)


def fold_launch(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count, cache_base, *,
                tuning: KernelTuning, ssm_copy=None) -> Launch:
  """The fold's launch, from arrays or shapes; with ``ssm_copy``, the kernel that writes it."""
  (_, HV, V, K), (_, H, L, _) = ssm.shape, ring_rawk.shape
  kc = min(tuning.k_chunk, K)
  inputs = dict(slot_ids=slot_ids, count=count, cache_base=cache_base, ring_rawk=ring_rawk,
                ring_rawv=ring_rawv, ring_g=ring_g, ring_beta=ring_beta, ssm=ssm)
  outputs = dict(ssm="ssm")
  if ssm_copy is not None:
    inputs["ssm_copy"] = ssm_copy
    outputs["ssm_copy"] = "ssm_copy"
  return Launch(
      kernel=_fold_kernel if ssm_copy is None else _fold_copy_kernel,
      name=(f"triton_exact_fold_L{L}_bv{tuning.block_v}_w{tuning.num_warps}_kc{kc}"
            f"{'' if ssm_copy is None else '_copy'}"),
      grid=(V // tuning.block_v, HV, slot_ids.shape[0]),
      inputs=inputs,
      outputs=outputs,
      constexprs=dict(L=L, H=H, HV=HV, K=K, V=V, BV=tuning.block_v, KC=kc,
                      WARPS=tuning.num_warps),
      num_warps=tuning.num_warps, num_stages=tuning.num_stages, fp_fusion=tile.FP_FUSION)


@functools.partial(jax.jit, static_argnames=("tuning",))
def _fold_call(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count, cache_base,
               ssm_copy=None, *, tuning: KernelTuning):
  out = run(fold_launch(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count,
                        cache_base, tuning=tuning, ssm_copy=ssm_copy))
  return out[0] if ssm_copy is None else tuple(out)


def fold(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count, cache_base, *,
         tuning: KernelTuning, ssm_copy=None):
  """Fold ``count[b]`` raw records of each row into ``ssm[slot_ids[b]]`` in place.

  Args and returns as `replayssm_jax.kernels.fold.fold` (``ssm_copy`` too); ``tuning`` must be
  the triton recurrent kernels' for the bitwise tie.
  """
  pallas_fold._check_inputs(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count,
                            cache_base, ssm_copy)
  check_tuning(tuning, ssm.shape[2], ssm.shape[3])
  return _fold_call(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count, cache_base,
                    ssm_copy, tuning=tuning)
