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
# 18 and 24); none changes a bit. A program asks L1 for all its records when it starts
# (`FOLD_PREFETCH_RECORDS`), so the loop's loads find them there; record i + 1's norm, v, g and
# beta are loaded right after record i's update (`FOLD_RECORD_AHEAD`; loaded before it, the
# kernel takes 168 registers with triton 3.6, 127 after); `FOLD_TILE_AHEAD` asks L2 for the checkpoint
# tile of the program that many launches later. H200, 12 records (NOTES run 32): B=256 613 ->
# 512 us with the records in L1, 472 with them loaded ahead too (B=64 167 -> 140 -> 130); the
# tile 132 ahead, worth 11 us to the Pallas fold, gained nothing (515 against 512, 472 against
# 471).
FOLD_PREFETCH_RECORDS = True
FOLD_RECORD_AHEAD = True
FOLD_TILE_AHEAD = 0


@triton.jit
def _lines(ptr, n: tl.constexpr):
  """Pointers to the cache lines of ``ptr[0:n]``: one per 128 bytes (at least one)."""
  per_line: tl.constexpr = 1024 // ptr.dtype.element_ty.primitive_bitwidth
  return ptr + tl.arange(0, max(n // per_line, 1)) * per_line


@triton.jit
def _prefetch_records(ring_rawk_ptr, ring_rawv_ptr, ring_g_ptr, ring_beta_ptr, slot, h, kh, j,
                      count, base, L: tl.constexpr, H: tl.constexpr, HV: tl.constexpr,
                      K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
  """All ``count`` records of the program into L1: raw k (a row of K), its BV columns of raw v,
  and the rows of g and beta of head h. Ring entries past ``count`` repeat the last."""
  p = (base + tl.minimum(tl.arange(0, L), count - 1)) & (L - 1)
  tile.prefetch(((slot * H + kh) * L + p)[:, None] * K + _lines(ring_rawk_ptr, K)[None, :], "L1")
  tile.prefetch(((slot * HV + h) * L + p)[:, None] * V + j * BV
                + _lines(ring_rawv_ptr, BV)[None, :], "L1")
  tile.prefetch(_lines(ring_g_ptr + (slot * HV + h) * L, L), "L1")
  tile.prefetch(_lines(ring_beta_ptr + (slot * HV + h) * L, L), "L1")


@triton.jit
def _prefetch_tile_ahead(slot_ids_ptr, count_ptr, ssm_ptr, AHEAD: tl.constexpr, HV: tl.constexpr,
                         K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
  """The checkpoint tile of the program launched ``AHEAD`` after this one into L2, if it folds:
  programs start in launch order (axis 0 fastest) as others end, so it starts about when this
  one is done with its tile."""
  NJ: tl.constexpr = V // BV
  linear = (tl.program_id(2) * HV + tl.program_id(1)) * NJ + tl.program_id(0) + AHEAD
  row = linear // (NJ * HV)
  if row < tl.num_programs(2):
    slot = tl.load(slot_ids_ptr + row).to(tl.int64)
    if (slot >= 0) & (tl.load(count_ptr + row) > 0):
      h, j = (linear // NJ) % HV, linear % NJ
      tile.prefetch(_lines(ssm_ptr + ((slot * HV + h) * V + j * BV) * K, BV * K), "L2")


@triton.jit
def _record(rawk_ptr, ring_rawv_ptr, ring_g_ptr, ring_beta_ptr, record, j, p, K: tl.constexpr,
            V: tl.constexpr, BV: tl.constexpr):
  """Record p's ``(1 / |raw k|, v, g, beta)``; ``rawk_ptr`` and ``record`` point at the
  program's rows of the rings."""
  v = tl.load(ring_rawv_ptr + (record + p) * V + j * BV + tl.arange(0, BV)).to(tl.float32)
  return (tile.inverse_norm(rawk_ptr + p * K, K), v, tl.load(ring_g_ptr + record + p),
          tl.load(ring_beta_ptr + record + p))


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
    BV: tl.constexpr, KC: tl.constexpr, PREFETCH_RECORDS: tl.constexpr,
    TILE_AHEAD: tl.constexpr, RECORD_AHEAD: tl.constexpr,
):
  j, h, row = tl.program_id(0), tl.program_id(1), tl.program_id(2)
  slot = tl.load(slot_ids_ptr + row).to(tl.int64)
  count, base = tl.load(count_ptr + row), tl.load(cache_base_ptr + row)
  kh = h // (HV // H)
  if TILE_AHEAD > 0:
    _prefetch_tile_ahead(slot_ids_ptr, count_ptr, ssm_ptr, TILE_AHEAD, HV, K, V, BV)
  if (slot >= 0) & (count > 0):
    rows, cols = tile.state_offsets(BV, K, KC)
    state = ssm_ptr + ((slot * HV + h) * V + j * BV) * K
    S = tile.load_tile(state, rows, cols)
    if PREFETCH_RECORDS:
      _prefetch_records(ring_rawk_ptr, ring_rawv_ptr, ring_g_ptr, ring_beta_ptr, slot, h, kh, j,
                        count, base, L, H, HV, K, V, BV)
    rawk = ring_rawk_ptr + (slot * H + kh) * L * K
    record = (slot * HV + h) * L
    if RECORD_AHEAD:
      # Record i + 1's norm, v, g and beta are loaded right after record i's update; its k,
      # as large as the tile, where used.
      inv_norm, v, g, beta = _record(rawk, ring_rawv_ptr, ring_g_ptr, ring_beta_ptr, record, j,
                                     base & (L - 1), K, V, BV)
      for i in range(count):
        p = (base + i) & (L - 1)
        k = tile.load_vector(rawk + p * K, rows, cols)
        S, d = tile.delta_rule_step(S, k, inv_norm, v, g, beta)
        inv_norm, v, g, beta = _record(rawk, ring_rawv_ptr, ring_g_ptr, ring_beta_ptr, record,
                                       j, (base + i + 1) & (L - 1), K, V, BV)
    else:
      for i in range(count):
        p = (base + i) & (L - 1)
        inv_norm, v, g, beta = _record(rawk, ring_rawv_ptr, ring_g_ptr, ring_beta_ptr, record,
                                       j, p, K, V, BV)
        k = tile.load_vector(rawk + p * K, rows, cols)
        S, d = tile.delta_rule_step(S, k, inv_norm, v, g, beta)
    tile.store_tile(state, rows, cols, S)


def fold_launch(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count, cache_base, *,
                tuning: KernelTuning, prefetch_records: bool | None = None,
                tile_ahead: int | None = None, record_ahead: bool | None = None) -> Launch:
  """The fold's launch, from arrays or shapes; ``prefetch_records``, ``tile_ahead`` and
  ``record_ahead`` as `fold`'s."""
  (_, HV, V, K), (_, H, L, _) = ssm.shape, ring_rawk.shape
  kc = min(tuning.k_chunk, K)
  prefetch_records = FOLD_PREFETCH_RECORDS if prefetch_records is None else prefetch_records
  tile_ahead = FOLD_TILE_AHEAD if tile_ahead is None else tile_ahead
  record_ahead = FOLD_RECORD_AHEAD if record_ahead is None else record_ahead
  if tile_ahead < 0:
    raise ValueError(f"fold: tile_ahead={tile_ahead} must be >= 0.")
  return Launch(
      kernel=_fold_kernel,
      name=(f"triton_exact_fold_L{L}_bv{tuning.block_v}_w{tuning.num_warps}_kc{kc}"
            f"{'_cL1' if prefetch_records else ''}{f'_t{tile_ahead}' if tile_ahead else ''}"
            f"{'_ra' if record_ahead else ''}"),
      grid=(V // tuning.block_v, HV, slot_ids.shape[0]),
      inputs=dict(slot_ids=slot_ids, count=count, cache_base=cache_base, ring_rawk=ring_rawk,
                  ring_rawv=ring_rawv, ring_g=ring_g, ring_beta=ring_beta, ssm=ssm),
      outputs=dict(ssm="ssm"),
      constexprs=dict(L=L, H=H, HV=HV, K=K, V=V, BV=tuning.block_v, KC=kc,
                      PREFETCH_RECORDS=prefetch_records, TILE_AHEAD=tile_ahead,
                      RECORD_AHEAD=record_ahead),
      num_warps=tuning.num_warps, num_stages=tuning.num_stages, fp_fusion=tile.FP_FUSION)


@functools.partial(jax.jit, static_argnames=("tuning", "prefetch_records", "tile_ahead",
                                             "record_ahead"))
def _fold_call(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count, cache_base, *,
               tuning: KernelTuning, **launch):
  return run(fold_launch(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count,
                         cache_base, tuning=tuning, **launch))[0]


def fold(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count, cache_base, *,
         tuning: KernelTuning, prefetch_records: bool | None = None,
         tile_ahead: int | None = None, record_ahead: bool | None = None):
  """Fold ``count[b]`` raw records of each row into ``ssm[slot_ids[b]]`` in place.

  Args and returns as `replayssm_jax.kernels.fold.fold`; ``tuning`` must be the triton
  recurrent kernels' for the bitwise tie. The cache prefetches change no bit:
  ``prefetch_records`` asks L1 for all of a program's records when it starts (default
  `FOLD_PREFETCH_RECORDS`); ``tile_ahead`` asks L2 for the checkpoint tile of the program that
  many launches later, 0 for none (default `FOLD_TILE_AHEAD`); ``record_ahead`` loads record
  i + 1's norm, v, g and beta right after record i's update, not where used (default
  `FOLD_RECORD_AHEAD`).
  """
  pallas_fold._check_inputs(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count,
                            cache_base)
  check_tuning(tuning, ssm.shape[2], ssm.shape[3])
  return _fold_call(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count, cache_base,
                    tuning=tuning, prefetch_records=prefetch_records, tile_ahead=tile_ahead,
                    record_ahead=record_ahead)
