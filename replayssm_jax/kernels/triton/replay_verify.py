"""ReplaySSM verify as native Triton kernels: window outputs from checkpoint + ring history.

The contract and the math of `replayssm_jax.kernels.replay_verify` (its docstring has the UT
transform in full): per row (slot ``slot_ids[b]``), value head h and V-block j, with
``phys(i) = (cache_base + i) & (L - 1)``,

    S_hist x = exp(G_m) (S0 x) + sum_{i < write_pos} w_i (k_hat_i . x) d_i
    D = (I + A)^-1 R,   o_s = exp(Gamma_s) W_q[s] + sum_{j <= s} exp(Gamma_s - Gamma_j) (q_hat_s . k_hat_j) d_j

and the window's records (d, k_hat, g, beta, raw k, raw v) go to ``phys(write_pos + s)``;
``ssm`` is only read, every other ring entry is left untouched, a row with slot -1 gets zero
outputs and writes nothing. Grid (V // BV, HV, B).

From `SPLIT_MIN_BATCH` rows the split form runs instead (`replay_split`: the window's
coefficients once per (row, key head), then a pipelined checkpoint stream). Below, the two
one-kernel forms here:

- `_replay_verify_ut_kernel` (any T <= 16): the window as ``[TP, KC]`` chunks of ``[TP, K]``, ``TP =
  max(16, next_power_of_two(T))`` because ``tl.dot`` needs M, N, K >= 16 on the GPU. Rows past T are
  loaded from token T - 1 (clamped, never out of bounds) and zeroed with ``tl.where``: every MMA
  operand is defined (SGLang saw masked token rows of a dot load leak garbage from uninitialised
  staging). The ring history is ``LP = max(16, L)`` rows, clamped the same way, and masked by the
  logical index ``(p - cache_base) & (L - 1) < write_pos``: the d rows by a masked load
  (``other=0``: defined zeros, and a short history moves only its own rows), the key rows of the
  K-loop read whole and selected (masked there, the kernel spilled: 168 registers, sm_90), so stale
  or NaN records and the concurrent window writes of other programs cannot leak. A first pass over
  the K-chunks takes the norms of q and k; the second forms, chunk by chunk, the history-applied
  checkpoint ``S_hist^T = exp(G_m) S0^T + K_hist^T (w * D_hist)`` (``[KC, BV]``, the identity above
  for every x at once) and applies it to q_hat and k_hat by ``tl.dot`` (``dot_precision``, tf32 by
  default, for these K and L contractions). Holding only ``[*, KC]`` slices keeps the kernel at 168
  registers (anchor, sm_90); the whole ``[BV, K]`` tile spilled, and applying the history to ``x
  K_hist^T`` first chained two dots whose M = 16 rows Triton split over both warps, replicating the
  other operand. The ``[TP, TP]`` window products and ``(I + A)^-1`` apply in exact fp32 ("ieee");
  ``(I + A)^-1`` is a forward substitution unrolled over T.
- `_replay_verify_vec_kernel` (T = 1, decode): no dots; the products over K by
  multiply-reduce, chunk by chunk, reduced once after the loop, as the Pallas vector form.

int64 offsets only in the scalar bases (row, slot); the tile offsets from them are int32
(int64 offset tensors cost two registers per element).

H200 (2026-11-30, B=256, benchmarks/NOTES.md run 5): UT at T=4 502 us, vector form at T=1
222 us, both at [128, K] tiles over 4 warps (the Pallas kernels: 395 and 194 us). Applying the
history after the K loop so that the checkpoint chunks feed the dots directly was slower at
every launch (791 us and up).
"""

from __future__ import annotations

import functools

import jax
import triton
import triton.language as tl

from replayssm_jax.config import DOT_PRECISIONS, next_power_of_two
from replayssm_jax.kernels import fold as pallas_fold
from replayssm_jax.kernels import replay_verify as pallas_replay
from replayssm_jax.kernels.backend import KernelTuning
from replayssm_jax.kernels.triton import replay_split, tile
from replayssm_jax.kernels.triton.launch import Launch, run
from replayssm_jax.kernels.triton.recurrent import check_tuning
from replayssm_jax.kernels.triton.replay_parts import (INPUT_PRECISION, MIN_DOT, WINDOW_PRECISION,
                                                       history_weights, mma, unit_lower_inverse,
                                                       window_chunk, window_decay, window_norms,
                                                       window_rows)

RING_NAMES = pallas_replay.RING_NAMES
MAX_DRAFT_TOKENS = 16
FORMS = ("ut", "vec", "split")
# Rows from which the split form (`replay_split`: the coefficients once per (row, key head), then
# a pipelined checkpoint stream) runs: a window (T >= 2), and decode (T = 1; None: never); below,
# the one-kernel forms here. H200, 10 reps (benchmarks/NOTES.md run 29): a window at B=256 / 16
# in 257.7 / 37.0 us against the UT form's 501.2 / 46.0 (B=64 split 89.1 and B=32 63.8, with a
# coefficients kernel twice as slow as today's, against 139.0 and 75.3); decode at B=256 / 32 /
# 16 in 216.9 / 43.2 / 29.8 against the vector form's 220.6 / 39.6 / 25.1: even at best. With
# the split stream's epilogue on the tensor cores (run 30), the decode cycle (L=16, in phase) at
# B=256 / 64 / 32 / 16 in 242.9 / 72.8 / 45.0 / 27.0 us against 269.1 / 78.5 / 43.9 / 23.2
# (run 31), so decode took the split form from 64 rows. With L2 flushed before each step, as
# the other layers of a model leave it (H100, runs 40 and 41), the split form ties at B=16 and
# wins from B=32: a cycle's step 52.4 us against the vector form's 56.7 (kernel alone 43.3-44.3
# against 45.5 at its best tile), so decode takes it from 32 rows (the Pallas vector form, with
# the fold inside, stays ahead there: NOTES run 41).
SPLIT_MIN_BATCH = {"window": 16, "decode": 32}


def replay_form(T: int, B: int | None = None) -> str:
  """The split form from `SPLIT_MIN_BATCH` rows (B None: below it); under it the vector form
  for decode (T = 1) and the UT form for a window (H200, run 5)."""
  least = SPLIT_MIN_BATCH["decode" if T == 1 else "window"]
  if B is not None and least is not None and B >= least:
    return "split"
  return "vec" if T == 1 else "ut"


@triton.jit
def _replay_verify_ut_kernel(
    # inputs
    slot_ids_ptr,  # [B] int32
    write_pos_ptr,  # [B] int32
    cache_base_ptr,  # [B] int32
    q_ptr,  # [B, T, H, K] activation
    k_ptr,  # [B, T, H, K] activation
    v_ptr,  # [B, T, HV, V] activation
    a_ptr,  # [B, T, HV] activation
    b_ptr,  # [B, T, HV] activation
    A_log_ptr,  # [HV] f32
    dt_bias_ptr,  # [HV] f32
    ssm_ptr,  # [slots, HV, V, K] f32, or its bf16 copy; read only
    ring_d_in_ptr,  # [slots, HV, L, V] ring dtype (the buffer of ring_d_ptr)
    ring_k_in_ptr,  # [slots, H, L, K] ring dtype (the buffer of ring_k_ptr)
    ring_g_in_ptr,  # [slots, HV, L] f32 (the buffer of ring_g_ptr)
    ring_beta_in_ptr, ring_rawk_in_ptr, ring_rawv_in_ptr,  # buffers of the outputs; not read
    # outputs
    o_ptr,  # [B, T, HV, V] activation
    ring_d_ptr,  # [slots, HV, L, V] ring dtype
    ring_k_ptr,  # [slots, H, L, K] ring dtype
    ring_g_ptr,  # [slots, HV, L] f32
    ring_beta_ptr,  # [slots, HV, L] f32
    ring_rawk_ptr,  # [slots, H, L, K] activation
    ring_rawv_ptr,  # [slots, HV, L, V] activation
    T: tl.constexpr, TP: tl.constexpr, L: tl.constexpr, LP: tl.constexpr, H: tl.constexpr,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    KC: tl.constexpr,  # K-chunk of the contractions over K (the checkpoint tile is [BV, KC])
    PRECISION: tl.constexpr,  # the K and L contractions: "tf32", "ieee" or "bf16"
    WINDOW_PRECISION: tl.constexpr,  # the window's [TP, *] products: "ieee"
):
  j, h, row = tl.program_id(0), tl.program_id(1), tl.program_id(2)
  slot = tl.load(slot_ids_ptr + row).to(tl.int64)
  kh = h // (HV // H)
  # int64 only in the scalar bases (row, slot); the tile offsets below are int32.
  first = row.to(tl.int64) * T  # the row's first token in the batch
  o_row, v_row = o_ptr + (first * HV + h) * V, v_ptr + (first * HV + h) * V
  s, in_window, src = window_rows(T, TP)
  v_cols = j * BV + tl.arange(0, BV)
  k_cols = tl.arange(0, KC)
  window_values = src[:, None] * (HV * V) + v_cols[None, :]  # [TP, BV]
  if slot < 0:
    tl.store(o_row + window_values, tl.zeros((TP, BV), o_ptr.dtype.element_ty),
             mask=in_window[:, None])
  else:
    write_pos, cache_base = tl.load(write_pos_ptr + row), tl.load(cache_base_ptr + row)
    q_row, k_row = q_ptr + (first * H + kh) * K, k_ptr + (first * H + kh) * K
    window_keys = src[:, None] * (H * K) + k_cols[None, :]  # [TP, KC]: chunk 0
    # Pass 1 over the K-chunks: the norms of q and k.
    q_scale, k_inv = window_norms(q_row, k_row, window_keys, K, KC, TP)

    # The history: LP ring rows (rows past L read row L - 1), selected by logical index.
    value_head = (slot * HV + h) * L  # ring row 0 of this value head (ring_d, ring_g, ...)
    key_head = (slot * H + kh) * L  # ring row 0 of its key head (ring_k, ring_rawk)
    p = tl.arange(0, LP)
    ring_rows = tl.minimum(p, L - 1)
    decay_all, w, valid = history_weights(
        tl.load(ring_g_in_ptr + value_head + ring_rows), p, write_pos, cache_base, L)
    d_hist = tl.load(ring_d_in_ptr + value_head * V + ring_rows[:, None] * V + v_cols[None, :],
                     mask=valid[:, None], other=0.0).to(tl.float32)  # [LP, BV]
    history_keys = ring_rows[:, None] * K + k_cols[None, :]  # [LP, KC]
    checkpoint = v_cols[:, None] * K + k_cols[None, :]  # [BV, KC]
    phys = (cache_base + write_pos + s) & (L - 1)  # the window's ring rows
    record_keys = phys[:, None] * K + k_cols[None, :]  # [TP, KC]
    key_writer = (j == 0) & (h % (HV // H) == 0)  # one writer per key head for k_hat, raw k

    # Pass 2, chunk by chunk of K: the history-applied checkpoint (transposed)
    #   S_hist^T = exp(G_m) S0^T + K_hist^T (w * D_hist)                              [KC, BV]
    # and W_x = x S_hist^T for x = q_hat, k_hat ([TP, BV]), plus the window's q_hat k_hat^T and
    # k_hat k_hat^T ([TP, TP]).
    weighted_d = w[:, None] * d_hist  # [LP, BV]
    W_q, W_k = tl.zeros((TP, BV), tl.float32), tl.zeros((TP, BV), tl.float32)
    qk, kk = tl.zeros((TP, TP), tl.float32), tl.zeros((TP, TP), tl.float32)
    for c in range(0, K, KC):
      k_raw, q_hat, k_hat = window_chunk(q_row, k_row, window_keys + c, in_window, q_scale, k_inv)
      k_hist = tl.load(ring_k_in_ptr + key_head * K + history_keys + c)
      k_hist_t = tl.trans(tl.where(valid[:, None], k_hist.to(tl.float32), 0.0))  # [KC, LP]
      S0_t = tl.trans(tl.load(ssm_ptr + (slot * HV + h) * V * K + checkpoint + c).to(
          tl.float32))  # [KC, BV]: from the fp32 checkpoint or its bf16 copy
      S_t = decay_all * S0_t + mma(k_hist_t, weighted_d, PRECISION)
      W_q += mma(q_hat, S_t, PRECISION)
      W_k += mma(k_hat, S_t, PRECISION)
      k_hat_t = tl.trans(k_hat)
      qk += mma(q_hat, k_hat_t, WINDOW_PRECISION)  # q_hat_s . k_hat_j
      kk += mma(k_hat, k_hat_t, WINDOW_PRECISION)
      if key_writer:
        tl.store(ring_k_ptr + key_head * K + record_keys + c,
                 k_hat.to(ring_k_ptr.dtype.element_ty), mask=in_window[:, None])
        tl.store(ring_rawk_ptr + key_head * K + record_keys + c, k_raw, mask=in_window[:, None])

    # The UT transform of the window.
    v_raw = tl.load(v_row + window_values)
    v = tl.where(in_window[:, None], v_raw.to(tl.float32), 0.0)
    gates = first * HV + h + src * HV
    g, beta = tile.gating(tl.load(a_ptr + gates), tl.load(b_ptr + gates),
                          tl.load(A_log_ptr + h), tl.load(dt_bias_ptr + h))
    g_win, beta_win = tl.where(in_window, g, 0.0), tl.where(in_window, beta, 0.0)
    Gamma, decay, A = window_decay(g_win, beta_win, kk, s)
    R = beta_win[:, None] * (v - tile.exp(Gamma)[:, None] * W_k)
    Tinv = unit_lower_inverse(A, s, T)
    D = mma(Tinv, R, WINDOW_PRECISION)
    O = tile.exp(Gamma)[:, None] * W_q + mma(decay * qk, D, WINDOW_PRECISION)
    tl.store(o_row + window_values, O.to(o_ptr.dtype.element_ty), mask=in_window[:, None])

    # The value records at the window's ring rows: d and raw v by every program, g and beta
    # by V-block 0 (k_hat and raw k went in pass 2).
    records = phys[:, None] * V + v_cols[None, :]
    tl.store(ring_d_ptr + value_head * V + records, D.to(ring_d_ptr.dtype.element_ty),
             mask=in_window[:, None])
    tl.store(ring_rawv_ptr + value_head * V + records, v_raw, mask=in_window[:, None])
    if j == 0:
      tl.store(ring_g_ptr + value_head + phys, g, mask=in_window)
      tl.store(ring_beta_ptr + value_head + phys, beta, mask=in_window)


@triton.jit
def _replay_verify_vec_kernel(
    # inputs and outputs as `_replay_verify_ut_kernel`, with T = 1
    slot_ids_ptr, write_pos_ptr, cache_base_ptr, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr,
    A_log_ptr, dt_bias_ptr, ssm_ptr, ring_d_in_ptr, ring_k_in_ptr, ring_g_in_ptr,
    ring_beta_in_ptr, ring_rawk_in_ptr, ring_rawv_in_ptr,
    o_ptr, ring_d_ptr, ring_k_ptr, ring_g_ptr, ring_beta_ptr, ring_rawk_ptr, ring_rawv_ptr,
    L: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, KC: tl.constexpr,
):
  """The one-token window without dots: products over K by multiply-reduce, K-chunk by chunk,

      d = beta (v - exp(g) W_k),   o = exp(g) W_q + (q_hat . k_hat) d,
      W_x = S_hist x = exp(G_m) S0 x + sum_i w_i (k_hat_i . x) d_i.

  The chunks' products add elementwise into ``[BV, KC]`` / ``[L, KC]`` accumulators and are
  reduced over KC once, after the loop.
  """
  j, h, row = tl.program_id(0), tl.program_id(1), tl.program_id(2)
  slot = tl.load(slot_ids_ptr + row).to(tl.int64)
  kh = h // (HV // H)
  token = row.to(tl.int64)  # T = 1: token b of the batch
  v_cols = j * BV + tl.arange(0, BV)
  o_row = o_ptr + (token * HV + h) * V
  if slot < 0:
    tl.store(o_row + v_cols, tl.zeros((BV,), o_ptr.dtype.element_ty))
  else:
    write_pos, cache_base = tl.load(write_pos_ptr + row), tl.load(cache_base_ptr + row)
    q_row, k_row = q_ptr + (token * H + kh) * K, k_ptr + (token * H + kh) * K
    q_inv, k_inv = tile.inverse_norm(q_row, K), tile.inverse_norm(k_row, K)

    value_head = (slot * HV + h) * L  # ring row 0 of this value head
    key_head = (slot * H + kh) * L  # ring row 0 of its key head
    p = tl.arange(0, L)
    decay_all, w, valid = history_weights(
        tl.load(ring_g_in_ptr + value_head + p), p, write_pos, cache_base, L)
    d_hist = tl.load(ring_d_in_ptr + value_head * V + p[:, None] * V + v_cols[None, :],
                     mask=valid[:, None], other=0.0).to(tl.float32)  # [L, BV]
    phys = (cache_base + write_pos) & (L - 1)  # the window's ring row
    key_writer = (j == 0) & (h % (HV // H) == 0)  # one writer per key head for k_hat, raw k

    k_cols = tl.arange(0, KC)
    checkpoint = ssm_ptr + (slot * HV + h) * V * K + v_cols[:, None] * K + k_cols[None, :]
    history_keys = ring_k_in_ptr + key_head * K + p[:, None] * K + k_cols[None, :]
    S0_q, S0_k = tl.zeros((BV, KC), tl.float32), tl.zeros((BV, KC), tl.float32)
    hist_q, hist_k = tl.zeros((L, KC), tl.float32), tl.zeros((L, KC), tl.float32)
    qk = tl.zeros((KC,), tl.float32)
    for c in range(0, K, KC):
      k_raw = tl.load(k_row + c + k_cols)
      q_hat = tl.load(q_row + c + k_cols).to(tl.float32) * q_inv * (K ** -0.5)
      k_hat = k_raw.to(tl.float32) * k_inv
      S0 = tl.load(checkpoint + c).to(tl.float32)  # [BV, KC], from the checkpoint or its copy
      S0_q += S0 * q_hat[None, :]
      S0_k += S0 * k_hat[None, :]
      k_hist = tl.load(history_keys + c, mask=valid[:, None], other=0.0).to(tl.float32)
      hist_q += k_hist * q_hat[None, :]
      hist_k += k_hist * k_hat[None, :]
      qk += q_hat * k_hat
      if key_writer:
        record = key_head * K + phys * K + c + k_cols
        tl.store(ring_k_ptr + record, k_hat.to(ring_k_ptr.dtype.element_ty))
        tl.store(ring_rawk_ptr + record, k_raw)
    W_q = decay_all * tl.sum(S0_q, axis=1) + tl.sum(
        (tl.sum(hist_q, axis=1) * w)[:, None] * d_hist, axis=0)
    W_k = decay_all * tl.sum(S0_k, axis=1) + tl.sum(
        (tl.sum(hist_k, axis=1) * w)[:, None] * d_hist, axis=0)

    g, beta = tile.gating(tl.load(a_ptr + token * HV + h), tl.load(b_ptr + token * HV + h),
                          tl.load(A_log_ptr + h), tl.load(dt_bias_ptr + h))
    v_raw = tl.load(v_ptr + (token * HV + h) * V + v_cols)
    d = beta * (v_raw.to(tl.float32) - tile.exp(g) * W_k)
    o = tile.exp(g) * W_q + tl.sum(qk, axis=0) * d
    tl.store(o_row + v_cols, o.to(o_ptr.dtype.element_ty))
    record = (value_head + phys) * V + v_cols
    tl.store(ring_d_ptr + record, d.to(ring_d_ptr.dtype.element_ty))
    tl.store(ring_rawv_ptr + record, v_raw)
    if j == 0:
      tl.store(ring_g_ptr + value_head + phys, g)
      tl.store(ring_beta_ptr + value_head + phys, beta)


def replay_verify_launch(ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv,
                         q, k, v, a, b, A_log, dt_bias, slot_ids, write_pos, cache_base, *,
                         tuning: KernelTuning, dot_precision: str, form: str) -> Launch:
  """The replay verify's launch in ``form`` ("ut" or "vec"), from arrays or shapes."""
  B, T, H, K = q.shape
  HV, V, L = v.shape[2], v.shape[3], ring_g.shape[-1]
  inputs = dict(slot_ids=slot_ids, write_pos=write_pos, cache_base=cache_base, q=q, k=k, v=v,
                a=a, b=b, A_log=A_log, dt_bias=dt_bias, ssm=ssm, ring_d=ring_d, ring_k=ring_k,
                ring_g=ring_g, ring_beta=ring_beta, ring_rawk=ring_rawk, ring_rawv=ring_rawv)
  kc = min(tuning.k_chunk, K)
  if form == "ut":
    constexprs = dict(T=T, TP=max(MIN_DOT, next_power_of_two(T)), L=L, LP=max(MIN_DOT, L), H=H,
                      HV=HV, K=K, V=V, BV=tuning.block_v, KC=kc,
                      PRECISION=INPUT_PRECISION[dot_precision],
                      WINDOW_PRECISION=WINDOW_PRECISION)
  else:
    constexprs = dict(L=L, H=H, HV=HV, K=K, V=V, BV=tuning.block_v, KC=kc)
  name = (f"triton_replay_verify_{form}_T{T}_bv{tuning.block_v}_w{tuning.num_warps}_kc{kc}"
          + (f"_{dot_precision}" if form == "ut" else ""))
  return Launch(
      kernel=_replay_verify_ut_kernel if form == "ut" else _replay_verify_vec_kernel,
      name=name,
      grid=(V // tuning.block_v, HV, B),
      inputs=inputs,
      outputs=dict(o=jax.ShapeDtypeStruct(v.shape, v.dtype), **{n: n for n in RING_NAMES}),
      constexprs=constexprs,
      num_warps=tuning.num_warps, num_stages=tuning.num_stages)


@functools.partial(jax.jit, static_argnames=("tuning", "dot_precision", "form"))
def _replay_verify_call(*args, tuning: KernelTuning, dot_precision: str, form: str):
  return run(replay_verify_launch(*args, tuning=tuning, dot_precision=dot_precision, form=form))


def _check_knobs(T: int, K: int, tuning: KernelTuning, dot_precision: str, form: str) -> None:
  if dot_precision not in DOT_PRECISIONS:
    raise ValueError(f"dot_precision={dot_precision!r} is unknown; use one of {DOT_PRECISIONS}.")
  if form not in FORMS:
    raise ValueError(f"form={form!r} is unknown; use one of {FORMS}.")
  if T > MAX_DRAFT_TOKENS:
    raise ValueError(f"T={T} draft tokens exceed the triton replay verify's {MAX_DRAFT_TOKENS}; "
                     "use the xla backend.")
  if form == "vec" and T != 1:
    raise ValueError(f"form='vec' is the one-token (decode) form of the triton backend; T={T} "
                     "needs form='ut'.")
  if form in ("ut", "split") and min(tuning.block_v, tuning.k_chunk, K) < MIN_DOT:
    raise ValueError(f"the {form} form's tl.dot needs block_v, k_chunk and K of at least {MIN_DOT}; "
                     f"got block_v={tuning.block_v}, k_chunk={tuning.k_chunk}, K={K}: try "
                     f"block_v={max(MIN_DOT, tuning.block_v)}, k_chunk={max(MIN_DOT, tuning.k_chunk)}.")


def replay_verify(ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv,
                  q, k, v, a, b, A_log, dt_bias, slot_ids, write_pos, cache_base, *,
                  tuning: KernelTuning, dot_precision: str, form: str | None = None):
  """Verify outputs of a T-token window from checkpoint + ring; window records into the rings.

  Args and returns as `replayssm_jax.kernels.replay_verify.replay_verify` (no ``interpret``).
  ``dot_precision`` ``"default"`` means tf32; ``form`` None picks `replay_form` of (T, B):
  ``"split"`` (`replay_split`: the coefficients kernel, then the checkpoint stream, whose launch
  ``tuning`` is), ``"ut"``, or ``"vec"``, T = 1 only.

  Raises:
    ValueError: a shape, dtype, ring length or knob is off.
  """
  args = (ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv,
          q, k, v, a, b, A_log, dt_bias, slot_ids, write_pos, cache_base)
  pallas_replay._check_inputs(*args)
  T, K = q.shape[1], q.shape[-1]
  check_tuning(tuning, v.shape[-1], K)
  form = form or replay_form(T, q.shape[0])
  _check_knobs(T, K, tuning, dot_precision, form)
  if form == "split":
    return replay_split.replay_verify_split(*args, tuning=tuning, dot_precision=dot_precision)
  return _replay_verify_call(*args, tuning=tuning, dot_precision=dot_precision, form=form)


def fold_and_replay_verify(ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv,
                           q, k, v, a, b, A_log, dt_bias, slot_ids, write_pos, cache_base,
                           fold_count, fold_base, *, tuning: KernelTuning,
                           fold_tuning: KernelTuning, dot_precision: str,
                           form: str | None = None, ssm_copy: jax.Array | None = None):
  """`fold.fold` of ``fold_count[b]`` records (ring index ``fold_base[b]`` on), then
  `replay_verify`, with the fold inside the split form's stream
  (`replay_split.fold_replay_verify_split`): a folding row's programs replay its records into
  the checkpoint rows they stream, in place, so a flush row's checkpoint is read and written
  once, and no fold kernel is launched.

  Args and returns as `replayssm_jax.kernels.replay_verify.fold_and_replay_verify` (no
  ``interpret``, no ``fold_first``); ``fold_tuning`` is `state_tuning`'s (the bitwise tie);
  the split form only.

  Raises:
    ValueError: a shape, dtype or knob is off, or the form is not the split form.
  """
  args = (ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv,
          q, k, v, a, b, A_log, dt_bias, slot_ids, write_pos, cache_base)
  if ssm_copy is not None:
    pallas_fold.check_copy(ssm, ssm_copy)
  pallas_replay._check_inputs(ssm if ssm_copy is None else ssm_copy, *args[1:])
  pallas_replay.check_fold_rows(fold_count, fold_base, slot_ids)
  T, K = q.shape[1], q.shape[-1]
  check_tuning(tuning, v.shape[-1], K)
  check_tuning(fold_tuning, v.shape[-1], K)
  form = form or replay_form(T, q.shape[0])
  _check_knobs(T, K, tuning, dot_precision, form)
  if form != "split":
    raise ValueError(f"the triton {form} form does not fold; fold first (`fold.fold`), or use "
                     "the split form.")
  return replay_split.fold_replay_verify_split(*args, fold_count, fold_base, ssm_copy,
                                               tuning=tuning, fold_tuning=fold_tuning,
                                               dot_precision=dot_precision)
