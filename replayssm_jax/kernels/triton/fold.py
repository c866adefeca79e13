"""Exact fold as a native Triton kernel: replay committed raw records into the fp32 checkpoint.

The contract of `replayssm_jax.kernels.fold` (DESIGN sections 3-4): for each row with
``count[b] > 0`` the program owning ``S = ssm[slot, h, j*BV:(j+1)*BV, :]`` replays records
``i = 0 .. count-1`` at ring index ``(cache_base + i) & (L - 1)`` through
`tile.delta_rule_step`, in place. It is the loop of the triton `recurrent` kernels with the
inputs read from the ring: the same tile, the same step, the same ``range`` loop, launched
with the same `KernelTuning`, so the folded checkpoint is bitwise the state the triton
recurrent verify commits (g and beta are the bits `tile.gating` produced when the replay
verify wrote the records). The GPU tests check the bits (H200, 2026-11-30: equal at every
launch swept once fp fusion was off, `tile`); 615 us for 12 records at B=256.
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
    BV: tl.constexpr, KC: tl.constexpr,
):
  j, h, row = tl.program_id(0), tl.program_id(1), tl.program_id(2)
  slot = tl.load(slot_ids_ptr + row).to(tl.int64)
  count, base = tl.load(count_ptr + row), tl.load(cache_base_ptr + row)
  kh = h // (HV // H)
  if (slot >= 0) & (count > 0):
    rows, cols = tile.state_offsets(BV, K, KC)
    state = ssm_ptr + ((slot * HV + h) * V + j * BV) * K
    S = tile.load_tile(state, rows, cols)
    for i in range(count):
      p = (base + i) & (L - 1)
      k_hat = tile.load_normalized(ring_rawk_ptr + ((slot * H + kh) * L + p) * K, rows, cols, K)
      record = (slot * HV + h) * L + p
      v = tl.load(ring_rawv_ptr + record * V + j * BV + tl.arange(0, BV)).to(tl.float32)
      S, d = tile.delta_rule_step(S, k_hat, v, tl.load(ring_g_ptr + record),
                                  tl.load(ring_beta_ptr + record))
    tile.store_tile(state, rows, cols, S)


def fold_launch(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count, cache_base, *,
                tuning: KernelTuning) -> Launch:
  """The fold's launch, from arrays or shapes."""
  (_, HV, V, K), (_, H, L, _) = ssm.shape, ring_rawk.shape
  kc = min(tuning.k_chunk, K)
  return Launch(
      kernel=_fold_kernel,
      name=f"triton_exact_fold_L{L}_bv{tuning.block_v}_w{tuning.num_warps}_kc{kc}",
      grid=(V // tuning.block_v, HV, slot_ids.shape[0]),
      inputs=dict(slot_ids=slot_ids, count=count, cache_base=cache_base, ring_rawk=ring_rawk,
                  ring_rawv=ring_rawv, ring_g=ring_g, ring_beta=ring_beta, ssm=ssm),
      outputs=dict(ssm="ssm"),
      constexprs=dict(L=L, H=H, HV=HV, K=K, V=V, BV=tuning.block_v, KC=kc),
      num_warps=tuning.num_warps, num_stages=tuning.num_stages, fp_fusion=tile.FP_FUSION)


@functools.partial(jax.jit, static_argnames=("tuning",))
def _fold_call(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count, cache_base, *,
               tuning: KernelTuning):
  return run(fold_launch(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count,
                         cache_base, tuning=tuning))[0]


def fold(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count, cache_base, *,
         tuning: KernelTuning):
  """Fold ``count[b]`` raw records of each row into ``ssm[slot_ids[b]]`` in place.

  Args and returns as `replayssm_jax.kernels.fold.fold`; ``tuning`` must be the triton
  recurrent kernels' for the bitwise tie.
  """
  pallas_fold._check_inputs(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count,
                            cache_base)
  check_tuning(tuning, ssm.shape[2], ssm.shape[3])
  return _fold_call(ssm, ring_rawk, ring_rawv, ring_g, ring_beta, slot_ids, count, cache_base,
                    tuning=tuning)
