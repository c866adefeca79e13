"""Recurrent decode and verify: the baseline ReplaySSM replaces (DESIGN sections 3 and 5).

Per (row b, value head h, V-block j) one program owns the fp32 tile
``S = ssm[slot_ids[b], h, j*BV:(j+1)*BV, :]`` (``[BV, K]``, held as K-chunks: `tile`) and
runs the T exact updates of `tile.delta_rule_step` in a `lax.fori_loop`:

    verify: o_t = S_t q_hat_t,  intermediate[slot, t] = S_t       (ssm untouched)
    decode: o   = S_1 q_hat,    ssm[slot] = S_1                    (T = 1, in place)

The exact fold (`fold.py`) replays records through the same loop body, which is
what keeps the two bitwise equal. A row with ``slot_ids[b] < 0`` is padding: its
output is zero and it writes nothing else.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from replayssm_jax import reference
from replayssm_jax.kernels import tile
from replayssm_jax.kernels.backend import KernelTuning, row_grid, row_ids


def token_inputs(q, k, v, a, b, A_log, dt_bias, scale):
  """Normalised q, k and the gates of one token, in fp32 (shared by every kernel).

  Shapes broadcast: ``q, k [..., K]``, ``v [..., V]``, ``a, b, A_log, dt_bias [...]``.
  """
  g, beta = reference.gdn_gating(a, b, A_log, dt_bias)
  q_hat = reference.l2_normalize(q.astype(jnp.float32)) * scale
  k_hat = reference.l2_normalize(k.astype(jnp.float32))
  return q_hat, k_hat, v.astype(jnp.float32), g, beta


def _recurrent_kernel(
    # inputs
    slot_ids_ref,  # [B] int32
    q_ref,  # [B, T, H, K]
    k_ref,  # [B, T, H, K]
    v_ref,  # [B, T, HV, V]
    a_ref,  # [B, T, HV]
    b_ref,  # [B, T, HV]
    A_log_ref,  # [HV] f32
    dt_bias_ref,  # [HV] f32
    ssm_ref,  # [slots, HV, V, K] f32 (decode: aliased with the ssm output)
    *refs,  # verify: intermediate (in), o, intermediate (out); decode: o, ssm (out)
    T: int,
    gqa_ratio: int,
    block_v: int,
    k_chunk: int,
    scale: float,
    store_each_step: bool,
    compiled: bool,
):
  if store_each_step:
    _, o_ref, states_ref = refs  # states_ref: [slots, T, HV, V, K] f32 (aliased)
  else:
    o_ref, states_ref = refs  # states_ref: [slots, HV, V, K] f32, the ssm itself
  row, h, j = row_ids()
  slot = slot_ids_ref[row]
  kh = h // gqa_ratio
  vs = pl.ds(j * block_v, block_v)

  @pl.when(slot < 0)
  def _padding():
    def zero(t, carry):
      o_ref[row, t, h, vs] = jnp.zeros((block_v,), o_ref.dtype)
      return carry
    jax.lax.fori_loop(0, T, zero, 0)

  @pl.when(slot >= 0)
  def _update():
    A_log, dt_bias = A_log_ref[h], dt_bias_ref[h]
    K = q_ref.shape[-1]

    def step(t, S):
      q_hat = tile.normalized(q_ref, (row, t, kh), K, k_chunk, scale, compiled=compiled)
      k_hat = tile.normalized(k_ref, (row, t, kh), K, k_chunk, compiled=compiled)
      g, beta = reference.gdn_gating(a_ref[row, t, h], b_ref[row, t, h], A_log, dt_bias)
      S, _ = tile.delta_rule_step(S, k_hat, v_ref[row, t, h, vs].astype(jnp.float32), g, beta,
                                  compiled=compiled)
      o_ref[row, t, h, vs] = tile.matvec(S, q_hat, compiled=compiled).astype(o_ref.dtype)
      if store_each_step:
        tile.store(states_ref, (slot, t, h, vs), S)
      return S

    S = jax.lax.fori_loop(0, T, step, tile.load(ssm_ref, (slot, h, vs), K, k_chunk))
    if not store_each_step:
      tile.store(states_ref, (slot, h, vs), S)


def _check_inputs(ssm, q, k, v, a, b, slot_ids):
  B, T, H, K = q.shape
  slots, HV, V, K_s = ssm.shape
  expected = {"k": ((B, T, H, K), k.shape), "v": ((B, T, HV, V), v.shape),
              "a": ((B, T, HV), a.shape), "b": ((B, T, HV), b.shape),
              "slot_ids": ((B,), slot_ids.shape), "ssm (K)": ((K,), (K_s,))}
  for name, (want, got) in expected.items():
    if tuple(want) != tuple(got):
      raise ValueError(f"{name} has shape {tuple(got)}; expected {tuple(want)} "
                       f"(q is {q.shape}, ssm is {ssm.shape}).")
  if HV % H:
    raise ValueError(f"value heads HV={HV} must be a multiple of key heads H={H}.")


@functools.partial(jax.jit, static_argnames=("tuning", "interpret"))
def _recurrent_call(slot_ids, q, k, v, a, b, A_log, dt_bias, ssm, intermediate, *,
                    tuning: KernelTuning, interpret: bool):
  """Verify when ``intermediate`` is given, else decode (``ssm`` updated in place)."""
  B, T, H, K = q.shape
  HV, V = v.shape[2], v.shape[3]
  tuning.check(V, K)
  store_each_step = intermediate is not None
  kernel = functools.partial(
      _recurrent_kernel, T=T, gqa_ratio=HV // H, block_v=tuning.block_v, k_chunk=tuning.k_chunk,
      scale=K ** -0.5, store_each_step=store_each_step, compiled=not interpret)
  inputs = dict(slot_ids=slot_ids, q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, ssm=ssm)
  if store_each_step:
    inputs["intermediate"] = intermediate
  states_name = "intermediate" if store_each_step else "ssm"
  states = inputs[states_name]
  o, states = pl.pallas_call(
      kernel,
      out_shape=(jax.ShapeDtypeStruct(v.shape, v.dtype), jax.ShapeDtypeStruct(states.shape, states.dtype)),
      grid=row_grid(B, HV, V // tuning.block_v),
      input_output_aliases={list(inputs).index(states_name): 1},
      interpret=interpret,
      compiler_params=tuning.compiler_params(),
      name=f"recurrent_{'verify' if store_each_step else 'decode'}_T{T}_bv{tuning.block_v}_w{tuning.num_warps}",
  )(*inputs.values())
  return o, states


def recurrent_verify(ssm, intermediate, q, k, v, a, b, A_log, dt_bias, slot_ids, *,
                     tuning: KernelTuning, interpret: bool):
  """T recurrent updates per row from ``ssm[slot]``; per-draft states into ``intermediate``.

  Args:
    ssm: ``f32[slots, HV, V, K]`` committed states (read only).
    intermediate: ``f32[slots, T, HV, V, K]``, updated in place (aliased).
    q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; a, b: ``[B, T, HV]`` (activation dtype).
    A_log, dt_bias: ``f32[HV]``.
    slot_ids: ``int32[B]``; -1 marks a padding row.

  Returns:
    ``(o, intermediate)`` with ``o [B, T, HV, V]`` in the dtype of ``v``.
  """
  _check_inputs(ssm, q, k, v, a, b, slot_ids)
  return _recurrent_call(slot_ids, q, k, v, a, b, A_log, dt_bias, ssm, intermediate,
                         tuning=tuning, interpret=interpret)


def recurrent_decode(ssm, q, k, v, a, b, A_log, dt_bias, slot_ids, *,
                     tuning: KernelTuning, interpret: bool):
  """One recurrent update per row, ``ssm[slot]`` updated in place (T = 1).

  Returns:
    ``(o, ssm)``; see `recurrent_verify` for the shapes.
  """
  _check_inputs(ssm, q, k, v, a, b, slot_ids)
  return _recurrent_call(slot_ids, q, k, v, a, b, A_log, dt_bias, ssm, None,
                         tuning=tuning, interpret=interpret)


# ----------------------------------------------------------------------------- references


def _gather_rows(x, slot_ids):
  """``x[slot_ids]`` with padding rows (slot -1) reading slot 0 (their results are dropped)."""
  return x[jnp.maximum(slot_ids, 0)]


def scatter_rows(x, slot_ids, rows):
  """``x[slot_ids] = rows``, dropping padding rows (slot -1) instead of wrapping them."""
  idx = jnp.where(slot_ids < 0, x.shape[0], slot_ids)
  return x.at[idx].set(rows.astype(x.dtype), mode="drop")


def _recurrent_loop(S, q, k, v, a, b, A_log, dt_bias, on_step, carry):
  """Batched twin of the kernel loop: T `delta_rule_step`s on ``S [B, HV, V, K]``."""
  HV, K = S.shape[1], S.shape[3]
  r = HV // q.shape[2]

  def step(t, state):
    S, carry = state
    q_hat, k_hat, v_t, g, beta = token_inputs(
        jnp.repeat(q[:, t], r, axis=1), jnp.repeat(k[:, t], r, axis=1), v[:, t],
        a[:, t], b[:, t], A_log, dt_bias, K ** -0.5)
    S, _ = reference.delta_rule_step(S, k_hat, v_t, g, beta)
    return S, on_step(t, S, reference.state_apply(S, q_hat), carry)

  return jax.lax.fori_loop(0, q.shape[1], step, (S, carry))


def recurrent_verify_reference(ssm, intermediate, q, k, v, a, b, A_log, dt_bias, slot_ids, **_):
  """Pure-jnp `recurrent_verify` (the ``xla`` backend)."""
  _check_inputs(ssm, q, k, v, a, b, slot_ids)
  B, T = q.shape[:2]
  valid = (slot_ids >= 0)[:, None, None]
  states0 = jnp.zeros((B, T, *ssm.shape[1:]), ssm.dtype)
  o0 = jnp.zeros(v.shape, v.dtype)

  def on_step(t, S, o_t, carry):
    o, states = carry
    o = o.at[:, t].set(jnp.where(valid, o_t, 0).astype(o.dtype))
    return o, states.at[:, t].set(S)

  _, (o, states) = _recurrent_loop(_gather_rows(ssm, slot_ids), q, k, v, a, b, A_log, dt_bias,
                                   on_step, (o0, states0))
  return o, scatter_rows(intermediate, slot_ids, states)


def recurrent_decode_reference(ssm, q, k, v, a, b, A_log, dt_bias, slot_ids, **_):
  """Pure-jnp `recurrent_decode` (the ``xla`` backend)."""
  _check_inputs(ssm, q, k, v, a, b, slot_ids)
  valid = (slot_ids >= 0)[:, None, None]

  def on_step(t, S, o_t, o):
    return o.at[:, t].set(jnp.where(valid, o_t, 0).astype(o.dtype))

  S, o = _recurrent_loop(_gather_rows(ssm, slot_ids), q, k, v, a, b, A_log, dt_bias,
                         on_step, jnp.zeros(v.shape, v.dtype))
  return o, scatter_rows(ssm, slot_ids, S)
