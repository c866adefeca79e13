"""Recurrent verify and decode as native Triton kernels: the triton backend's baseline.

The same contract as `replayssm_jax.kernels.recurrent` (DESIGN sections 3 and 5): per
(V-block j, value head h, row b) one program owns the fp32 tile
``S = ssm[slot_ids[b], h, j*BV:(j+1)*BV, :]`` (chunked, `tile.state_offsets`) and runs the T
exact updates of `tile.delta_rule_step` in a ``range`` loop (an ``scf.for``, like the fold's):

    verify: o_t = S_t q_hat_t,  intermediate[slot, t] = S_t       (ssm untouched)
    decode: o   = S_1 q_hat,    ssm[slot] = S_1                    (T = 1, in place)

A row with ``slot_ids[b] < 0`` is padding: zero output, nothing else written. Offsets into
the state arrays are int64 (``slots * HV * V * K`` passes 2^31 at serving sizes).
H200, B=256 (benchmarks/NOTES.md run 34): verify 714 us (89% of copy), decode 267 us (95%).
"""

from __future__ import annotations

import functools

import jax
import triton
import triton.language as tl

from replayssm_jax.kernels import recurrent as pallas_recurrent
from replayssm_jax.kernels.backend import KernelTuning
from replayssm_jax.kernels.triton import tile
from replayssm_jax.kernels.triton.launch import Launch, run


@triton.jit
def _recurrent(slot_ids_ptr, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr,
               ssm_ptr, o_ptr, states_ptr, T: tl.constexpr, H: tl.constexpr, HV: tl.constexpr,
               K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, KC: tl.constexpr,
               WARPS: tl.constexpr, STORE_EACH_STEP: tl.constexpr):
  """The body of both kernels; ``states_ptr`` is intermediate (verify) or ssm (decode)."""
  j, h, row = tl.program_id(0), tl.program_id(1), tl.program_id(2)
  slot = tl.load(slot_ids_ptr + row).to(tl.int64)
  kh = h // (HV // H)
  v_cols = j * BV + tl.arange(0, BV)
  tokens = row.to(tl.int64) * T  # window token t of the row is token `tokens + t` of the batch
  if slot < 0:
    for t in range(T):
      tl.store(o_ptr + ((tokens + t) * HV + h) * V + v_cols, tl.zeros((BV,), o_ptr.dtype.element_ty))
  else:
    rows, cols = tile.state_offsets(BV, K, KC)
    S = tile.load_tile(ssm_ptr + ((slot * HV + h) * V + j * BV) * K, rows, cols)
    A_log, dt_bias = tl.load(A_log_ptr + h), tl.load(dt_bias_ptr + h)
    for t in range(T):
      token = tokens + t
      k, k_norm = tile.load_key(k_ptr + (token * H + kh) * K, rows, cols, K, WARPS)
      g, beta = tile.gating(tl.load(a_ptr + token * HV + h), tl.load(b_ptr + token * HV + h),
                            A_log, dt_bias)
      v = tl.load(v_ptr + (token * HV + h) * V + v_cols).to(tl.float32)
      S, d = tile.delta_rule_step(S, k, k_norm, v, g, beta)
      q, q_norm = tile.load_key(q_ptr + (token * H + kh) * K, rows, cols, K, WARPS)
      tl.store(o_ptr + (token * HV + h) * V + v_cols,
               tile.scaled_matvec(S, q, q_norm, K ** -0.5).to(o_ptr.dtype.element_ty))
      if STORE_EACH_STEP:
        tile.store_tile(states_ptr + (((slot * T + t) * HV + h) * V + j * BV) * K, rows, cols, S)
    if not STORE_EACH_STEP:
      tile.store_tile(states_ptr + ((slot * HV + h) * V + j * BV) * K, rows, cols, S)


@triton.jit
def _recurrent_verify_kernel(
    # inputs
    slot_ids_ptr,  # [B] int32
    q_ptr,  # [B, T, H, K] activation
    k_ptr,  # [B, T, H, K] activation
    v_ptr,  # [B, T, HV, V] activation
    a_ptr,  # [B, T, HV] activation
    b_ptr,  # [B, T, HV] activation
    A_log_ptr,  # [HV] f32
    dt_bias_ptr,  # [HV] f32
    ssm_ptr,  # [slots, HV, V, K] f32, read only
    intermediate_in_ptr,  # [slots, T, HV, V, K] f32, the buffer of intermediate_ptr
    # outputs
    o_ptr,  # [B, T, HV, V] activation
    intermediate_ptr,  # [slots, T, HV, V, K] f32
    T: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, KC: tl.constexpr, WARPS: tl.constexpr,  # the launch's warps
):
  _recurrent(slot_ids_ptr, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, ssm_ptr,
             o_ptr, intermediate_ptr, T, H, HV, K, V, BV, KC, WARPS, True)


@triton.jit
def _recurrent_decode_kernel(
    # inputs
    slot_ids_ptr, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr,  # as verify, T = 1
    ssm_in_ptr,  # [slots, HV, V, K] f32, the buffer of ssm_ptr
    # outputs
    o_ptr,  # [B, 1, HV, V] activation
    ssm_ptr,  # [slots, HV, V, K] f32, updated in place
    T: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, KC: tl.constexpr, WARPS: tl.constexpr,
):
  _recurrent(slot_ids_ptr, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, ssm_ptr,
             o_ptr, ssm_ptr, T, H, HV, K, V, BV, KC, WARPS, False)


def recurrent_launch(slot_ids, q, k, v, a, b, A_log, dt_bias, ssm, intermediate, *,
                     tuning: KernelTuning) -> Launch:
  """The verify launch when ``intermediate`` is given, else the decode launch (arrays or shapes)."""
  B, T, H, K = q.shape
  HV, V = v.shape[2], v.shape[3]
  verify = intermediate is not None
  inputs = dict(slot_ids=slot_ids, q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, ssm=ssm)
  if verify:
    inputs["intermediate"] = intermediate
  kc = min(tuning.k_chunk, K)
  return Launch(
      kernel=_recurrent_verify_kernel if verify else _recurrent_decode_kernel,
      name=(f"triton_recurrent_{'verify' if verify else 'decode'}_T{T}_bv{tuning.block_v}"
            f"_w{tuning.num_warps}_kc{kc}"),
      grid=(V // tuning.block_v, HV, B),
      inputs=inputs,
      outputs=dict(o=jax.ShapeDtypeStruct(v.shape, v.dtype),
                   states="intermediate" if verify else "ssm"),
      constexprs=dict(T=T, H=H, HV=HV, K=K, V=V, BV=tuning.block_v, KC=kc,
                      WARPS=tuning.num_warps),
      num_warps=tuning.num_warps, num_stages=tuning.num_stages, fp_fusion=tile.FP_FUSION)


def check_tuning(tuning: KernelTuning, V: int, K: int) -> None:
  """`KernelTuning.check`, plus the power-of-two K every Triton tile needs."""
  tuning.check(V, K)
  if K & (K - 1):
    raise ValueError(f"head_k_dim K={K} must be a power of two for the triton kernels; "
                     "use backend='pallas' or 'xla'.")


@functools.partial(jax.jit, static_argnames=("tuning",))
def _recurrent_call(slot_ids, q, k, v, a, b, A_log, dt_bias, ssm, intermediate, *,
                    tuning: KernelTuning):
  return run(recurrent_launch(slot_ids, q, k, v, a, b, A_log, dt_bias, ssm, intermediate,
                              tuning=tuning))


def recurrent_verify(ssm, intermediate, q, k, v, a, b, A_log, dt_bias, slot_ids, *,
                     tuning: KernelTuning):
  """T recurrent updates per row from ``ssm[slot]``; per-draft states into ``intermediate``.

  Args and returns as `replayssm_jax.kernels.recurrent.recurrent_verify` (no ``interpret``:
  Triton's interpreter is its own switch, see `launch`).
  """
  pallas_recurrent._check_inputs(ssm, q, k, v, a, b, slot_ids)
  check_tuning(tuning, v.shape[-1], q.shape[-1])
  return _recurrent_call(slot_ids, q, k, v, a, b, A_log, dt_bias, ssm, intermediate,
                         tuning=tuning)


def recurrent_decode(ssm, q, k, v, a, b, A_log, dt_bias, slot_ids, *, tuning: KernelTuning):
  """One recurrent update per row, ``ssm[slot]`` updated in place (T = 1).

  Returns:
    ``(o, ssm)``; see `recurrent_verify`.
  """
  pallas_recurrent._check_inputs(ssm, q, k, v, a, b, slot_ids)
  check_tuning(tuning, v.shape[-1], q.shape[-1])
  return _recurrent_call(slot_ids, q, k, v, a, b, A_log, dt_bias, ssm, None, tuning=tuning)
