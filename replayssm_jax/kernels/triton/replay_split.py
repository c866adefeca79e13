"""The split replay verify as native Triton kernels: the window's coefficients, then a stream.

The Pallas split form's math (`replayssm_jax.kernels.replay_split`, whose docstring has it in
full) in two launches:

1. `_coefficients_kernel`, grid (H, B), one warp: per (row, key head) the normalised window,
   its products with the key history (``X K_hist^T``) and with itself (``q_hat k_hat^T``,
   ``k_hat k_hat^T``), then for each of the key head's value heads the gates, the UT inverse and
   the small matrices ``[Dh; Oh]`` (``[2, T, LP]``), ``(P, Dy, M)`` (``[3, T, T]``) and ``eq``
   (``[T]``) into fp32 scratch, ``Dy`` and ``eq`` already scaled by the inverse norms of the
   raw window (``Y`` below is of the raw q and k); it writes the window's k_hat, raw k, g and
   beta records. The window is held in ``TQ = next_power_of_two(T)`` rows and its own products
   are written out in exact fp32 (a 16-row tensor-core tile costs more than it saves there);
   the key history products are one tensor-core dot of the raw window (`KEY_MMA_MIN_ROWS`).
2. `_stream_kernel`, grid (V // BV, HV, B): ``Y = X S0^T`` for ``X = [q; k]`` raw, stacked in
   one tile, over a loop of K-chunks that Triton software-pipelines (``num_stages``), then

       D = P v + Dy Y_k + Dh D_hist,    O = eq * Y_q + Oh D_hist + M D,

   with the epilogue's loads (d history, v, the scratch) issued before the loop and its
   products on the tensor cores (`EPILOGUE_PRECISION`); it writes o and the d and raw v
   records.

`fold_replay_verify_split` launches the stream that folds first (`_fold_stream_kernel`): a
program of a row with records to fold replays them into its checkpoint rows, in place, in the
fold kernel's tiles and loop (`fold.fold_tile`: as many rows a warp as its one-warp programs, so
the same layout and the same bits), then streams them; no fold kernel is launched, at the cost
of the fold's registers in every program (168 against 128, 6 programs an SM against 8). Decode
takes it (`ssm.TRITON_FUSE_FOLD_BELOW`; H100, benchmarks/NOTES.md run 51: the B=256 cycle 287.1
-> 261.6 us a step in phase, 279.1 -> 271.4 out of phase); windows, whose steps fold more rows
at once, fold apart.

Same contract as `replay_verify.replay_verify`: ``ssm`` only read, the window's records at
``phys(write_pos + s)``, every other ring entry untouched, a padding row (slot -1) gets zero
outputs and writes nothing (its scratch is never written nor read). Every operand of the
stream's ``tl.dot`` has at least 16 rows and columns (``TP = max(16, next_power_of_two(T))``
window rows, ``LP = max(16, L)`` history rows); window rows past T are masked out of the
stream's loads (zero) and, in the coefficients kernel, loaded from token T - 1 and zeroed with
``tl.where``, history rows by their logical index, as in `replay_verify`'s UT kernel, so no
stale or NaN entry reaches a product.

H200 (benchmarks/NOTES.md runs 29-33): B=256 190.1 us (coefficients 32, stream 158) against
the UT form's 501.2; the Pallas split form takes 177.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import triton
import triton.language as tl

from replayssm_jax.config import next_power_of_two
from replayssm_jax.kernels import replay_split as pallas_split
from replayssm_jax.kernels import replay_verify as pallas_replay
from replayssm_jax.kernels.backend import KernelTuning
from replayssm_jax.kernels.triton import tile
from replayssm_jax.kernels.triton.fold import fold_tile, round_into_copy
from replayssm_jax.kernels.triton.launch import Launch, run
from replayssm_jax.kernels.triton.replay_parts import (INPUT_PRECISION, MIN_DOT,
                                                       history_weights,
                                                       history_weights_scan, mma,
                                                       unit_lower_inverse, window_chunk,
                                                       window_decay, window_norms, window_rows)

# The coefficients kernel's warps: one (its tiles are the window's few rows: more warps would
# replicate them, as the Pallas kernel's measured, benchmarks/NOTES.md run 6).
COEFFICIENT_WARPS = 1
# Elements of its largest written-out product, [TQ, LP, KC], which set its K-chunk: by TQ, the
# window's rows (`INLINE_PRODUCT_WIDE` past the last). Each K-chunk is a round trip of loads in
# series (a one-warp program has nothing to hide them under), so fewer, larger chunks win while
# they fit in registers. H200, T=4 (benchmarks/NOTES.md runs 29-30): 2048 (KC=32, 105
# registers) 95.2 us at B=256, 26.2 at B=16; 4096 (KC=64, 128 registers) 52.9-58.2, 17.7 at
# B=64, 13.0-13.8 at B=16; 8192 (KC=128, one chunk, 168 registers) 47.2, 13.9 and 10.7 us.
# Pipeline stages changed nothing. Wider windows hold larger accumulators ([TQ, LP] and
# [TQ, TQ]): at T=16, L=32 8192 spills (sm_90 compile: 1148 spill stores), 4096 does not.
INLINE_PRODUCT = {1: 8192, 2: 8192, 4: 8192}
INLINE_PRODUCT_WIDE = 4096
# The key history products ``X K_hist^T`` on the tensor cores from windows of this many rows
# (``dot_precision`` other than "ieee"): one [XP, KC] x [KC, LP] dot of the raw window, exact
# products for bf16 activations and rings, in place of two written-out ``[TQ, LP, KC]`` products
# whose sums over K are warp shuffles (944 SHFL, 4840 instructions a program at T=4, sm_90
# compile; 3136 and 323 with the dot). Single rows (decode) stay written out, as in the Pallas
# kernel (`replay_split.COEFFICIENT_KEY_MMA`). H200, T=4 (benchmarks/NOTES.md run 31): the
# kernel at B=256 47.0 -> 32.0 us, B=64 13.8 -> 12.8.
KEY_MMA_MIN_ROWS = 2
# Two knobs of the coefficients kernel for windows of KEY_MMA_MIN_ROWS to SMALL_WINDOW_ROWS
# rows, both on since run 36 (wider windows and fp32 activations take the other side):
# - WINDOW_MMA (bf16 activations): the window's own products ``q_hat k_hat^T`` and
#   ``k_hat k_hat^T`` from one more tensor-core dot of the raw stacked window, ``X X^T``
#   (``[XP, XP]``), whose bf16 products are exact and summed in fp32 (not tf32: the UT solve
#   amplifies their error), its ``[q; k]`` blocks picked and scaled by the norms afterwards,
#   in place of two written-out ``[TQ, TQ, KC]`` products (their sums over K are warp shuffles);
# - HEADS_LOOP: the key head's value heads as a loop, not unrolled, so their chains no longer
#   hold registers side by side.
# Triton 3.6 at T=4: 149 registers (13 one-warp programs an SM: B=256's 4096 programs in 2.4
# waves), 128 with the loop, 91 with both (21 an SM); executed SASS 2760 -> 2650 -> 2423.
# H200, T=4, the whole verify (benchmarks/NOTES.md run 36, two rounds in both orders): B=256
# 191.2 -> 184.9 (loop) -> 183.0 us (both), B=64 60.0 -> 59.5 -> 58.6, B=16 26.2 -> 25.4 -> 25.0.
# Wider windows spill with the dot (the ``[TQ, XP, XP]`` pick: ~900 bytes at T=16; 4 bytes at
# T=8 under triton 3.9).
SMALL_WINDOW_ROWS = 4
WINDOW_MMA = True
HEADS_LOOP = True
# The stream epilogue's products with its [T, T] coefficients and eq (P v, Dy Y, Eq Y, M D),
# padded to 16-row tiles: "ieee" lowers them to CUDA-core FMA loops, 1024 a thread, about 44% of
# the stream's instructions; "tf32x3" runs each as three tf32 MMAs (fp32-level error, after the
# window's solve, which stays exact fp32 in the coefficients kernel; "ieee" still with
# ``dot_precision="ieee"``, the ablation setting). H200, T=4
# (benchmarks/NOTES.md run 30): the stream at B=256 205.4 -> 186.4 us, B=64 60.2 -> 55.3, B=16
# 22.7 -> 20.6; registers 166 -> 130 (sm_90 compile).
EPILOGUE_PRECISION = "tf32x3"
# Whether the coefficients kernel holds the history in logical order and takes its weights from
# a running sum (`replay_parts.history_weights_scan`) in place of the ``[LP, LP]`` mask, as
# `kernels.replay_split.COEFFICIENT_HISTORY_SCAN` does in the Pallas kernel; the zh columns go
# back to the physical rows the stream reads. Windows of up to SMALL_WINDOW_ROWS rows (at T=16,
# L=32 it spills: 20 spill stores at 255 registers, sm_90 compile). H100 (benchmarks/NOTES.md
# run 38): B=256 verify 240.3 -> 239.0 us, decode 255.1 -> 253.6, B=64 even; on since
# session 39 (the tables' H200 runs had it off).
HISTORY_SCAN = True
# Columns of the folded checkpoint rows a stream program reads back and rounds into the bf16
# copy at once (`fold.round_into_copy`): [64, 32] fp32 over the stream's 2 warps, 32 registers a
# thread, where whole rows would take 128.
COPY_ROUND_CHUNK = tl.constexpr(32)


@triton.jit
def _history_rows(write_pos, cache_base, L: tl.constexpr, LP: tl.constexpr):
  """``(p, ring_rows, valid)``: the LP history rows, the ring row each reads (rows past L read
  row L - 1), and which hold history (logically before ``write_pos``)."""
  p = tl.arange(0, LP)
  logical = (p - cache_base) & (L - 1)
  return p, tl.minimum(p, L - 1), (p < L) & (logical < write_pos)


@triton.jit
def _logical_history(write_pos, cache_base, L: tl.constexpr, LP: tl.constexpr):
  """`_history_rows` in logical order: ``(cols, valid, next_rows, next_valid)``, row j holding
  logical record j, whose ring row (and zh column) is ``cols[j]``: a permutation of
  ``0..LP-1``, the rows past L (never history) keeping their own; and the ring row of the
  record after it, and whether that record is history."""
  j = tl.arange(0, LP)
  cols = tl.where(j < L, (cache_base + j) & (L - 1), j)
  next_rows = (cache_base + j + 1) & (L - 1)
  return cols, (j < L) & (j < write_pos), next_rows, (j + 1 < L) & (j + 1 < write_pos)


@triton.jit
def _stacked_window(q_row, k_row, T: tl.constexpr, XP: tl.constexpr, H: tl.constexpr,
                    K: tl.constexpr, k_cols):
  """``(x_ptrs, x_in, x_rows)`` of the raw window stacked in XP rows, ``X = [q; k]``: q's tokens
  from row 0, k's from row XP / 2; ``x_ptrs`` the ``[XP, KC]`` pointers of K-chunk 0 (rows past
  T read token T - 1), ``x_in`` the rows that hold a token."""
  x_rows = tl.arange(0, XP)
  x_tok = tl.where(x_rows < XP // 2, x_rows, x_rows - XP // 2)
  x_ptrs = (tl.where(x_rows < XP // 2, q_row, k_row)[:, None]
            + tl.minimum(x_tok, T - 1)[:, None] * (H * K) + k_cols[None, :])
  return x_ptrs, x_tok < T, x_rows


@triton.jit
def _stacked_rows(Y, first, s, x_rows):
  """Rows ``first + s`` of ``Y`` (``[XP, N]``, rows ``x_rows``) as a ``[len(s), N]`` tile,
  picked exactly (Triton cannot slice a tile's rows)."""
  pick = x_rows[None, :, None] == (first + s)[:, None, None]
  return tl.sum(tl.where(pick, Y[None, :, :], 0.0), axis=1)


@triton.jit
def _stacked_block(Y, first_row, first_col, s, x_rows):
  """``Y[first_row + s, first_col + s']`` (``Y``: ``[XP, XP]``, rows and columns ``x_rows``) as
  a ``[len(s), len(s)]`` tile, picked exactly."""
  rows = _stacked_rows(Y, first_row, s, x_rows)  # [len(s), XP]
  pick = x_rows[None, None, :] == (first_col + s)[None, :, None]
  return tl.sum(tl.where(pick, rows[:, None, :], 0.0), axis=2)


@triton.jit
def _inline_nt(x, y):
  """``x @ y^T`` over the last axes, written out as a multiply and a sum (exact fp32): the
  window's products are too small for a tensor-core tile (16 rows) to pay."""
  return tl.sum(x[:, None, :] * y[None, :, :], axis=2)


@triton.jit
def _coefficients_kernel(
    # inputs
    slot_ids_ptr, write_pos_ptr, cache_base_ptr,  # [B] int32
    q_ptr, k_ptr,  # [B, T, H, K] activation
    a_ptr, b_ptr,  # [B, T, HV] activation
    A_log_ptr, dt_bias_ptr,  # [HV] f32
    ring_k_in_ptr,  # [slots, H, L, K] ring dtype (the buffer of ring_k_ptr)
    ring_g_in_ptr,  # [slots, HV, L] f32 (the buffer of ring_g_ptr)
    ring_beta_in_ptr, ring_rawk_in_ptr,  # buffers of the outputs; not read
    # outputs
    zh_ptr,  # [B, HV, 2, T, LP] f32: Dh, Oh
    zt_ptr,  # [B, HV, 3, T, T] f32: P, Dy (scaled by s_k), M
    eq_ptr,  # [B, HV, T] f32: eq (scaled by s_q)
    ring_k_ptr, ring_g_ptr, ring_beta_ptr, ring_rawk_ptr,
    T: tl.constexpr, TQ: tl.constexpr, XP: tl.constexpr, L: tl.constexpr, LP: tl.constexpr,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, KC: tl.constexpr, KEY_MMA: tl.constexpr,
    WINDOW_MMA: tl.constexpr, HEADS_UNROLL: tl.constexpr, PRECISION: tl.constexpr,
    HISTORY_SCAN: tl.constexpr,
):
  """The window in ``TQ = next_power_of_two(T)`` rows, its own products written out in exact
  fp32 (`_inline_nt`), K-chunks small enough that a ``[TQ, LP, KC]`` product stays in
  registers. With ``KEY_MMA`` the key history products are one tensor-core dot of the raw
  window stacked in XP rows, ``[q; k] K_hist^T``, whose rows are then scaled by the norms;
  with ``WINDOW_MMA`` (bf16 raw window) its own products too, from ``[q; k] [q; k]^T``."""
  kh, row = tl.program_id(0), tl.program_id(1)
  slot = tl.load(slot_ids_ptr + row).to(tl.int64)
  if slot >= 0:  # padding rows: the stream reads none of this
    write_pos, cache_base = tl.load(write_pos_ptr + row), tl.load(cache_base_ptr + row)
    first = row.to(tl.int64) * T  # the row's first token in the batch
    q_row, k_row = q_ptr + (first * H + kh) * K, k_ptr + (first * H + kh) * K
    s, in_window, src = window_rows(T, TQ)
    k_cols = tl.arange(0, KC)
    window_keys = src[:, None] * (H * K) + k_cols[None, :]  # [TQ, KC]: chunk 0
    q_scale, k_inv = window_norms(q_row, k_row, window_keys, K, KC, TQ)  # pass 1: the norms

    key_head = (slot * H + kh) * L  # ring row 0 of the key head (ring_k, ring_rawk)
    if HISTORY_SCAN:  # the history's rows in logical order, its zh columns permuted
      zh_cols, valid, next_rows, next_valid = _logical_history(write_pos, cache_base, L, LP)
      ring_rows = tl.minimum(zh_cols, L - 1)
    else:
      p, ring_rows, valid = _history_rows(write_pos, cache_base, L, LP)
      zh_cols = p
    history_keys = ring_rows[:, None] * K + k_cols[None, :]  # [LP, KC]
    phys = (cache_base + write_pos + s) & (L - 1)  # the window's ring rows
    record_keys = phys[:, None] * K + k_cols[None, :]  # [TQ, KC]
    # Pass 2: the products over K, chunk by chunk, and the window's key records.
    XK_q, XK_k = tl.zeros((TQ, LP), tl.float32), tl.zeros((TQ, LP), tl.float32)
    qk, kk = tl.zeros((TQ, TQ), tl.float32), tl.zeros((TQ, TQ), tl.float32)
    x_ptrs, x_in, x_rows = _stacked_window(q_row, k_row, T, XP, H, K, k_cols)
    XK = tl.zeros((XP, LP), tl.float32)  # KEY_MMA: [q; k] K_hist^T, raw
    XX = tl.zeros((XP, XP), tl.float32)  # WINDOW_MMA: [q; k] [q; k]^T, raw
    for c in range(0, K, KC):
      k_raw, q_hat, k_hat = window_chunk(q_row, k_row, window_keys + c, in_window, q_scale, k_inv)
      k_hist = tl.load(ring_k_in_ptr + key_head * K + history_keys + c)  # whole, then selected
      if KEY_MMA:  # bf16 operands as loaded, else fp32
        k_hist = tl.where(valid[:, None], k_hist, 0.0)  # [LP, KC]
        x = tl.where(x_in[:, None], tl.load(x_ptrs + c), 0.0)
        if PRECISION == "bf16":
          XK += mma(x, tl.trans(k_hist), PRECISION)
        else:
          XK += mma(x.to(tl.float32), tl.trans(k_hist.to(tl.float32)), PRECISION)
        if WINDOW_MMA:  # bf16 x: exact products, fp32 sums
          XX += tl.dot(x, tl.trans(x), out_dtype=tl.float32)
      else:
        k_hist = tl.where(valid[:, None], k_hist.to(tl.float32), 0.0)
        XK_q += _inline_nt(q_hat, k_hist)
        XK_k += _inline_nt(k_hat, k_hist)
      if not WINDOW_MMA:
        qk += _inline_nt(q_hat, k_hat)
        kk += _inline_nt(k_hat, k_hat)
      tl.store(ring_k_ptr + key_head * K + record_keys + c,
               k_hat.to(ring_k_ptr.dtype.element_ty), mask=in_window[:, None])
      tl.store(ring_rawk_ptr + key_head * K + record_keys + c, k_raw, mask=in_window[:, None])
    # The raw window's rows to its normalised ones: Y = x S0^T is of the raw q and k.
    s_q = tl.where(in_window, q_scale, 0.0)
    s_k = tl.where(in_window, k_inv, 0.0)
    if KEY_MMA:
      XK_q = s_q[:, None] * _stacked_rows(XK, 0, s, x_rows)
      XK_k = s_k[:, None] * _stacked_rows(XK, XP // 2, s, x_rows)
    if WINDOW_MMA:
      qk = s_q[:, None] * _stacked_block(XX, 0, XP // 2, s, x_rows) * s_k[None, :]
      kk = s_k[:, None] * _stacked_block(XX, XP // 2, XP // 2, s, x_rows) * s_k[None, :]

    window_t = in_window[:, None] & in_window[None, :]
    for i in tl.range(0, HV // H, loop_unroll_factor=HEADS_UNROLL):  # the key head's value heads
      h = kh * (HV // H) + i
      value_head = (slot * HV + h) * L  # ring row 0 of the value head (ring_g, ring_beta)
      if HISTORY_SCAN:
        decay_all, w = history_weights_scan(
            tl.load(ring_g_in_ptr + value_head + ring_rows), valid,
            tl.load(ring_g_in_ptr + value_head + next_rows), next_valid)
      else:
        decay_all, w, _ = history_weights(tl.load(ring_g_in_ptr + value_head + ring_rows), p,
                                          write_pos, cache_base, L)
      gates = first * HV + h + src * HV
      g, beta = tile.gating(tl.load(a_ptr + gates), tl.load(b_ptr + gates),
                            tl.load(A_log_ptr + h), tl.load(dt_bias_ptr + h))
      g_win, beta_win = tl.where(in_window, g, 0.0), tl.where(in_window, beta, 0.0)
      Gamma, decay, A = window_decay(g_win, beta_win, kk, s)
      Tinv = unit_lower_inverse(A, s, T)
      exp_gamma = tile.exp(Gamma)
      E = Tinv * (beta_win * exp_gamma)[None, :]
      Dh = -tl.sum(E[:, :, None] * (XK_k * w[None, :])[None, :, :], axis=1)  # [TQ, LP]
      Oh = exp_gamma[:, None] * (XK_q * w[None, :])

      out = (row.to(tl.int64) * HV + h)  # the (row, value head)'s scratch
      rows_h = s[:, None] * LP + zh_cols[None, :]  # [TQ, LP] of a [T, LP] matrix
      tl.store(zh_ptr + out * 2 * T * LP + rows_h, Dh, mask=in_window[:, None])
      tl.store(zh_ptr + (out * 2 + 1) * T * LP + rows_h, Oh, mask=in_window[:, None])
      rows_t = s[:, None] * T + s[None, :]  # [TQ, TQ] of a [T, T] matrix
      tl.store(zt_ptr + out * 3 * T * T + rows_t, Tinv * beta_win[None, :], mask=window_t)
      tl.store(zt_ptr + (out * 3 + 1) * T * T + rows_t, -decay_all * E * s_k[None, :],
               mask=window_t)
      tl.store(zt_ptr + (out * 3 + 2) * T * T + rows_t, decay * qk, mask=window_t)
      tl.store(eq_ptr + out * T + s, decay_all * exp_gamma * s_q, mask=in_window)
      tl.store(ring_g_ptr + value_head + phys, g, mask=in_window)
      tl.store(ring_beta_ptr + value_head + phys, beta, mask=in_window)


@triton.jit
def _load_window_matrix(ptr, src, in_window, COLS: tl.constexpr, cols):
  """``[TP, len(cols)]`` of a ``[T, COLS]`` fp32 matrix at ``ptr``: rows past T zero (read
  from row T - 1, never out of bounds)."""
  return tl.where(in_window[:, None], tl.load(ptr + src[:, None] * COLS + cols[None, :]), 0.0)


@triton.jit
def _load_window_square(ptr, src, in_window, T: tl.constexpr):
  """``[TP, TP]`` of a ``[T, T]`` fp32 matrix at ``ptr``, zero past T in both axes."""
  square = in_window[:, None] & in_window[None, :]
  return tl.where(square, tl.load(ptr + src[:, None] * T + src[None, :]), 0.0)


@triton.jit
def _window_coefficients(zh_ptr, zt_ptr, eq_ptr, out, s, in_window, src, x_rows, x_in,
                         T: tl.constexpr, LP: tl.constexpr, XP: tl.constexpr):
  """The (row, value head) ``out``'s coefficients from the scratch, as the stream's epilogue
  multiplies them: ``Dh, Oh`` ``[TP, LP]``, ``P, M`` ``[TP, TP]``, and ``Eq, Dy`` ``[TP, XP]``,
  which read Y's q rows (``eq`` as a diagonal) and its k rows (Dy)."""
  Dh = _load_window_matrix(zh_ptr + out * 2 * T * LP, src, in_window, LP, tl.arange(0, LP))
  Oh = _load_window_matrix(zh_ptr + (out * 2 + 1) * T * LP, src, in_window, LP,
                           tl.arange(0, LP))
  P = _load_window_square(zt_ptr + out * 3 * T * T, src, in_window, T)
  M = _load_window_square(zt_ptr + (out * 3 + 2) * T * T, src, in_window, T)
  x_src = tl.minimum(tl.where(x_rows < XP // 2, x_rows, x_rows - XP // 2), T - 1)
  k_rows = (x_rows >= XP // 2) & x_in  # [XP]: Y's rows of k
  eq = tl.load(eq_ptr + out * T + src)
  Eq = tl.where(in_window[:, None] & (x_rows[None, :] == s[:, None]), eq[:, None], 0.0)
  Dy = tl.where(in_window[:, None] & k_rows[None, :],
                tl.load(zt_ptr + (out * 3 + 1) * T * T + src[:, None] * T + x_src[None, :]), 0.0)
  return Dh, Oh, P, M, Eq, Dy


@triton.jit
def _window_values(ring_d_in_ptr, v_row, value_head, write_pos, cache_base, window_values,
                   in_window, v_cols, L: tl.constexpr, LP: tl.constexpr, V: tl.constexpr):
  """``(d_hist, v_raw)``: the value head's d history ``[LP, BV]`` in fp32 (zero where no
  history) and the window's raw v ``[TP, BV]`` (zero past T: rows that are not loaded)."""
  _, ring_rows, valid = _history_rows(write_pos, cache_base, L, LP)
  d_hist = tl.load(ring_d_in_ptr + value_head * V + ring_rows[:, None] * V + v_cols[None, :],
                   mask=valid[:, None], other=0.0).to(tl.float32)
  return d_hist, tl.load(v_row + window_values, mask=in_window[:, None], other=0.0)


@triton.jit
def _stream_program(
    slot_ids_ptr, write_pos_ptr, cache_base_ptr, q_ptr, k_ptr, v_ptr,
    ssm_ptr,  # what the stream reads: the fp32 checkpoint or its bf16 copy
    zh_ptr, zt_ptr, eq_ptr, ring_d_in_ptr, o_ptr, ring_d_ptr, ring_rawv_ptr,
    fold_count_ptr, fold_base_ptr, ring_rawk_ptr, ring_g_ptr, ring_beta_ptr,  # with FOLD
    checkpoint_ptr,  # with FOLD: the fp32 checkpoint the fold replays into (ssm_ptr's, or the
    # one behind the copy with COPY)
    T: tl.constexpr, TP: tl.constexpr, XP: tl.constexpr, L: tl.constexpr, LP: tl.constexpr,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    KC: tl.constexpr, PRECISION: tl.constexpr, EPILOGUE_PRECISION: tl.constexpr,
    CHECKPOINT_PRECISION: tl.constexpr, FOLD: tl.constexpr, COPY: tl.constexpr,
    FOLD_BV: tl.constexpr, FOLD_KC: tl.constexpr, WARPS: tl.constexpr,
):
  """``X = [q; k]`` stacked in ``XP`` rows (q's tokens from row 0, k's from row XP / 2) makes
  one dot a K-chunk, ``Y = X S0^T``; the epilogue reads ``Y_q`` and ``Y_k`` through the
  columns of its coefficients (``eq`` as a diagonal over the q rows, ``Dy`` over the k rows)
  rather than by slicing rows out of Y, which Triton cannot. With ``FOLD``, a row with
  ``fold_count > 0`` first replays its records into the program's checkpoint rows, in tiles of
  ``FOLD_BV`` rows (`fold.fold_tile`), and with ``COPY`` rounds them into the copy it streams."""
  j, h, row = tl.program_id(0), tl.program_id(1), tl.program_id(2)
  slot = tl.load(slot_ids_ptr + row).to(tl.int64)
  kh = h // (HV // H)
  if FOLD:  # before the stream's own values, which would stay live through the fold's loop
    fold_count = tl.load(fold_count_ptr + row)
    if (slot >= 0) & (fold_count > 0):  # the records into the rows the program streams next
      fold_base = tl.load(fold_base_ptr + row)
      for t in tl.static_range(BV // FOLD_BV):
        fold_tile(ring_rawk_ptr, ring_rawv_ptr, ring_g_ptr, ring_beta_ptr, checkpoint_ptr, slot,
                  h, kh, j * BV + t * FOLD_BV, fold_count, fold_base, L, H, HV, K, V, FOLD_BV,
                  FOLD_KC, WARPS)
      if COPY:
        round_into_copy(checkpoint_ptr, ssm_ptr, slot, h, j * BV, HV, K, V, BV,
                        min(COPY_ROUND_CHUNK, K))
      tl.debug_barrier()  # the stream's loads read what the program's other threads stored
  first = row.to(tl.int64) * T
  o_row, v_row = o_ptr + (first * HV + h) * V, v_ptr + (first * HV + h) * V
  s, in_window, src = window_rows(T, TP)
  v_cols = j * BV + tl.arange(0, BV)
  window_values = src[:, None] * (HV * V) + v_cols[None, :]  # [TP, BV]
  if slot < 0:
    tl.store(o_row + window_values, tl.zeros((TP, BV), o_ptr.dtype.element_ty),
             mask=in_window[:, None])
  else:
    write_pos, cache_base = tl.load(write_pos_ptr + row), tl.load(cache_base_ptr + row)
    value_head = (slot * HV + h) * L
    out = row.to(tl.int64) * HV + h
    k_cols = tl.arange(0, KC)
    q_row, k_row = q_ptr + (first * H + kh) * K, k_ptr + (first * H + kh) * K
    x_ptrs, x_in, x_rows = _stacked_window(q_row, k_row, T, XP, H, K, k_cols)
    # The epilogue's loads ahead of the loop's: their latency hides under the K-loop, though
    # the d history and v are staged into shared memory before the loop's first loads issue.
    # H200, B=256 / 64 (benchmarks/NOTES.md run 31): 215.5 / 67.1 us; the d history and v after
    # the loop 230.6 / 74.4, every load after it 238.5 / 74.5.
    Dh, Oh, P, M, Eq, Dy = _window_coefficients(zh_ptr, zt_ptr, eq_ptr, out, s, in_window, src,
                                                x_rows, x_in, T, LP, XP)
    d_hist, v_raw = _window_values(ring_d_in_ptr, v_row, value_head, write_pos, cache_base,
                                   window_values, in_window, v_cols, L, LP, V)

    checkpoint = ssm_ptr + (slot * HV + h) * V * K + v_cols[:, None] * K + k_cols[None, :]
    Y = tl.zeros((XP, BV), tl.float32)
    # X's padding rows masked out of its load, not zeroed after it: a select on a loaded dot
    # operand holds it in registers, where a masked load pipelines as a zero-filling async copy
    # (triton 3.6: 152 -> 128 registers a thread, 6 -> 8 programs an SM; H200, NOTES run 33:
    # the stream at B=256 184 -> 158 us).
    for c in range(0, K, KC):  # Y = X S0^T, chunk by chunk of K
      x = tl.load(x_ptrs + c, mask=x_in[:, None], other=0.0).to(tl.float32)
      Y += mma(x, tl.trans(tl.load(checkpoint + c)), CHECKPOINT_PRECISION)

    v = v_raw.to(tl.float32)
    D = (mma(P, v, EPILOGUE_PRECISION) + mma(Dy, Y, EPILOGUE_PRECISION)
         + mma(Dh, d_hist, PRECISION))
    O = (mma(Eq, Y, EPILOGUE_PRECISION) + mma(Oh, d_hist, PRECISION)
         + mma(M, D, EPILOGUE_PRECISION))
    tl.store(o_row + window_values, O.to(o_ptr.dtype.element_ty), mask=in_window[:, None])
    phys = (cache_base + write_pos + s) & (L - 1)
    records = value_head * V + phys[:, None] * V + v_cols[None, :]
    tl.store(ring_d_ptr + records, D.to(ring_d_ptr.dtype.element_ty), mask=in_window[:, None])
    tl.store(ring_rawv_ptr + records, v_raw, mask=in_window[:, None])


@triton.jit
def _stream_kernel(
    # inputs
    slot_ids_ptr, write_pos_ptr, cache_base_ptr,  # [B] int32
    q_ptr, k_ptr,  # [B, T, H, K] activation: the raw window, X
    v_ptr,  # [B, T, HV, V] activation
    ssm_ptr,  # [slots, HV, V, K] f32, or its bf16 copy (`SpecConfig.checkpoint_copy`); read only
    zh_ptr, zt_ptr, eq_ptr,  # the coefficients kernel's scratch
    ring_d_in_ptr,  # [slots, HV, L, V] ring dtype (the buffer of ring_d_ptr)
    ring_rawv_in_ptr,  # the buffer of ring_rawv_ptr; not read
    # outputs
    o_ptr,  # [B, T, HV, V] activation
    ring_d_ptr,  # [slots, HV, L, V] ring dtype
    ring_rawv_ptr,  # [slots, HV, L, V] activation
    T: tl.constexpr, TP: tl.constexpr, XP: tl.constexpr, L: tl.constexpr, LP: tl.constexpr,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    KC: tl.constexpr, PRECISION: tl.constexpr, EPILOGUE_PRECISION: tl.constexpr,
    CHECKPOINT_PRECISION: tl.constexpr,  # ``Y = X S0^T``'s: PRECISION, "bf16" on the copy
):
  _stream_program(slot_ids_ptr, write_pos_ptr, cache_base_ptr, q_ptr, k_ptr, v_ptr, ssm_ptr,
                  zh_ptr, zt_ptr, eq_ptr, ring_d_in_ptr, o_ptr, ring_d_ptr, ring_rawv_ptr,
                  None, None, None, None, None, None, T, TP, XP, L, LP, H, HV, K, V, BV, KC,
                  PRECISION, EPILOGUE_PRECISION, CHECKPOINT_PRECISION, False, False, BV, KC, 1)


@triton.jit
def _fold_stream_kernel(
    # inputs: as _stream_kernel's (ssm_ptr's buffer, aliased, is ssm_out_ptr), then
    slot_ids_ptr, write_pos_ptr, cache_base_ptr, q_ptr, k_ptr, v_ptr, ssm_ptr, zh_ptr, zt_ptr,
    eq_ptr, ring_d_in_ptr, ring_rawv_in_ptr,
    fold_count_ptr, fold_base_ptr,  # [B] int32: records to fold, from ring index fold_base
    ring_rawk_ptr,  # [slots, H, L, K] activation
    ring_g_ptr, ring_beta_ptr,  # [slots, HV, L] f32
    # outputs: as _stream_kernel's, then
    o_ptr, ring_d_ptr, ring_rawv_ptr,
    ssm_out_ptr,  # [slots, HV, V, K] f32: the folding rows' checkpoints, in place
    T: tl.constexpr, TP: tl.constexpr, XP: tl.constexpr, L: tl.constexpr, LP: tl.constexpr,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    KC: tl.constexpr, PRECISION: tl.constexpr, EPILOGUE_PRECISION: tl.constexpr,
    CHECKPOINT_PRECISION: tl.constexpr, FOLD_BV: tl.constexpr, FOLD_KC: tl.constexpr,
    WARPS: tl.constexpr,  # the launch's warps (`tile.inverse_norm`)
):
  _stream_program(slot_ids_ptr, write_pos_ptr, cache_base_ptr, q_ptr, k_ptr, v_ptr, ssm_out_ptr,
                  zh_ptr, zt_ptr, eq_ptr, ring_d_in_ptr, o_ptr, ring_d_ptr, ring_rawv_ptr,
                  fold_count_ptr, fold_base_ptr, ring_rawk_ptr, ring_g_ptr, ring_beta_ptr,
                  ssm_out_ptr, T, TP, XP, L, LP, H, HV, K, V, BV, KC, PRECISION,
                  EPILOGUE_PRECISION, CHECKPOINT_PRECISION, True, False, FOLD_BV, FOLD_KC, WARPS)


@triton.jit
def _fold_stream_copy_kernel(
    # inputs: as _fold_stream_kernel's (ssm_ptr the bf16 copy), then
    slot_ids_ptr, write_pos_ptr, cache_base_ptr, q_ptr, k_ptr, v_ptr, ssm_ptr, zh_ptr, zt_ptr,
    eq_ptr, ring_d_in_ptr, ring_rawv_in_ptr, fold_count_ptr, fold_base_ptr, ring_rawk_ptr,
    ring_g_ptr, ring_beta_ptr,
    checkpoint_ptr,  # [slots, HV, V, K] f32, the buffer of checkpoint_out_ptr
    # outputs: as _fold_stream_kernel's (ssm_out_ptr the copy), then
    o_ptr, ring_d_ptr, ring_rawv_ptr, ssm_out_ptr,
    checkpoint_out_ptr,  # [slots, HV, V, K] f32: the folding rows' checkpoints, in place
    T: tl.constexpr, TP: tl.constexpr, XP: tl.constexpr, L: tl.constexpr, LP: tl.constexpr,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    KC: tl.constexpr, PRECISION: tl.constexpr, EPILOGUE_PRECISION: tl.constexpr,
    CHECKPOINT_PRECISION: tl.constexpr, FOLD_BV: tl.constexpr, FOLD_KC: tl.constexpr,
    WARPS: tl.constexpr,  # the launch's warps (`tile.inverse_norm`)
):
  _stream_program(slot_ids_ptr, write_pos_ptr, cache_base_ptr, q_ptr, k_ptr, v_ptr, ssm_out_ptr,
                  zh_ptr, zt_ptr, eq_ptr, ring_d_in_ptr, o_ptr, ring_d_ptr, ring_rawv_ptr,
                  fold_count_ptr, fold_base_ptr, ring_rawk_ptr, ring_g_ptr, ring_beta_ptr,
                  checkpoint_out_ptr, T, TP, XP, L, LP, H, HV, K, V, BV, KC, PRECISION,
                  EPILOGUE_PRECISION, CHECKPOINT_PRECISION, True, True, FOLD_BV, FOLD_KC, WARPS)


def _scratch(B: int, T: int, HV: int, LP: int) -> dict[str, jax.ShapeDtypeStruct]:
  f32 = jnp.float32
  return dict(zh=jax.ShapeDtypeStruct((B, HV, 2, T, LP), f32),
              zt=jax.ShapeDtypeStruct((B, HV, 3, T, T), f32),
              eq=jax.ShapeDtypeStruct((B, HV, T), f32))


def _dims(q, v, L: int) -> dict:
  """The shape constexprs both kernels take."""
  T, H, K = q.shape[1:]
  return dict(T=T, L=L, LP=max(MIN_DOT, L), H=H, HV=v.shape[2], K=K)


def _key_precision(q, ring_k, dot_precision: str) -> str:
  """The key history dot's input precision: bf16 where the window and the key ring are bf16
  (exact products, half the shared memory of tf32 operands), else ``dot_precision``'s."""
  bf16 = jnp.dtype(q.dtype) == jnp.bfloat16 and jnp.dtype(ring_k.dtype) == jnp.bfloat16
  return "bf16" if bf16 and dot_precision != "ieee" else INPUT_PRECISION[dot_precision]


def coefficients_launch(ring_k, ring_g, ring_beta, ring_rawk, q, k, v, a, b, A_log, dt_bias,
                        slot_ids, write_pos, cache_base, *, dot_precision: str) -> Launch:
  """The coefficients kernel's launch: outputs ``(zh, zt, eq, ring_k, ring_g, ring_beta,
  ring_rawk)``, the rings in place. The window's own products are exact fp32 at any
  ``dot_precision``; the key history products take it (`KEY_MMA`)."""
  dims = _dims(q, v, ring_g.shape[-1])
  B, T = q.shape[:2]
  TQ = next_power_of_two(T)
  key_mma = TQ >= KEY_MMA_MIN_ROWS and dot_precision != "ieee"
  small = key_mma and TQ <= SMALL_WINDOW_ROWS
  window_mma = WINDOW_MMA and small and jnp.dtype(q.dtype) == jnp.bfloat16
  heads_loop = HEADS_LOOP and small
  # K-chunks of at most INLINE_PRODUCT elements of the largest written-out product: [TQ, LP, KC]
  # of the key history, or with KEY_MMA [TQ, TQ, KC] of the window and a tl.dot's 16.
  product = INLINE_PRODUCT.get(TQ, INLINE_PRODUCT_WIDE)
  kc = (max(MIN_DOT, product // (TQ * TQ)) if key_mma
        else max(1, product // (TQ * dims["LP"])))
  kc = min(dims["K"], kc)
  return Launch(
      kernel=_coefficients_kernel,
      name=(f"triton_replay_coefficients_T{T}_kc{kc}{'_mma' if key_mma else ''}"
            f"{'_wmma' if window_mma else ''}{'_hloop' if heads_loop else ''}"),
      grid=(dims["H"], B),
      inputs=dict(slot_ids=slot_ids, write_pos=write_pos, cache_base=cache_base, q=q, k=k, a=a,
                  b=b, A_log=A_log, dt_bias=dt_bias, ring_k=ring_k, ring_g=ring_g,
                  ring_beta=ring_beta, ring_rawk=ring_rawk),
      outputs=dict(**_scratch(B, T, dims["HV"], dims["LP"]), ring_k="ring_k", ring_g="ring_g",
                   ring_beta="ring_beta", ring_rawk="ring_rawk"),
      constexprs=dict(dims, TQ=TQ, XP=max(MIN_DOT, 2 * TQ), KC=kc, KEY_MMA=key_mma,
                      WINDOW_MMA=window_mma,
                      HEADS_UNROLL=1 if heads_loop else dims["HV"] // dims["H"],
                      PRECISION=_key_precision(q, ring_k, dot_precision),
                      HISTORY_SCAN=HISTORY_SCAN and TQ <= SMALL_WINDOW_ROWS),
      num_warps=COEFFICIENT_WARPS, num_stages=1)


@dataclasses.dataclass(frozen=True)
class StreamFold:
  """What a stream launch folds first (`fold_replay_verify_split`): ``count`` records of each
  row from ring index ``base`` (int32[B]), read from the raw rings, in tiles laid out as the
  recurrent kernels' (``tuning``, the bitwise tie); ``checkpoint``, the fp32 checkpoints, when
  the stream reads their bf16 copy."""

  count: jax.Array
  base: jax.Array
  ring_rawk: jax.Array
  ring_g: jax.Array
  ring_beta: jax.Array
  tuning: KernelTuning
  checkpoint: jax.Array | None = None


def stream_fold_block_v(tuning: KernelTuning, fold_tuning: KernelTuning) -> int:
  """Rows of the tiles a stream program of ``tuning`` folds in, 0 if it cannot: as many a warp
  as the recurrent kernels' (``fold_tuning``; `pallas_split.stream_fold_block_v`), so that a
  tile is laid out and rounds as theirs, and at least as many as a warp's lanes cover (``128 /
  k_chunk``: a K-chunk's 4-element vectors take the other lanes), so that neither layout holds
  copies of rows, which two warps may lay out otherwise than one (H100, run 51: tiles of 4 rows
  a warp folded 1-2 ulp off)."""
  rows = pallas_split.stream_fold_block_v(tuning, fold_tuning)
  return rows if fold_tuning.block_v // fold_tuning.num_warps >= _lanes_of_rows(fold_tuning) else 0


def _lanes_of_rows(fold_tuning: KernelTuning) -> int:
  """A warp's lanes along the rows of a state tile: those its K-chunk's vectors leave."""
  return 32 // max(1, fold_tuning.k_chunk // tile.VECTOR_WIDTH.value)


def checked_fold_block_v(tuning: KernelTuning, fold_tuning: KernelTuning) -> int:
  """`stream_fold_block_v`, which must not be 0.

  Raises:
    ValueError: the stream's programs cannot fold in the recurrent kernels' layout.
  """
  rows = stream_fold_block_v(tuning, fold_tuning)
  if not rows:
    raise ValueError(
        f"a stream program ({tuning.block_v} rows, {tuning.num_warps} warps) cannot fold in "
        f"tiles of {fold_tuning.block_v // fold_tuning.num_warps} rows a warp, as the recurrent "
        f"kernels' ({fold_tuning.block_v} rows, {fold_tuning.num_warps} warps, K-chunks of "
        f"{fold_tuning.k_chunk}): it needs whole tiles a program and at least "
        f"{_lanes_of_rows(fold_tuning)} rows a warp.")
  return rows


def stream_launch(ssm, ring_d, ring_rawv, q, k, v, zh, zt, eq, slot_ids, write_pos, cache_base,
                  *, L: int, tuning: KernelTuning, dot_precision: str,
                  fold: StreamFold | None = None) -> Launch:
  """The stream kernel's launch: outputs ``(o, ring_d, ring_rawv)``, the rings in place; with
  ``fold``, then ``ssm`` (and the fp32 checkpoint behind a copy), folded in place."""
  dims = _dims(q, v, L)
  B, T = q.shape[:2]
  V = v.shape[3]
  kc = min(tuning.k_chunk, dims["K"])
  copy = ssm.dtype == jnp.bfloat16
  inputs = dict(slot_ids=slot_ids, write_pos=write_pos, cache_base=cache_base, q=q, k=k, v=v,
                ssm=ssm, zh=zh, zt=zt, eq=eq, ring_d=ring_d, ring_rawv=ring_rawv)
  outputs = dict(o=jax.ShapeDtypeStruct(v.shape, v.dtype), ring_d="ring_d", ring_rawv="ring_rawv")
  constexprs = dict(dims, TP=max(MIN_DOT, next_power_of_two(T)),
                    XP=max(MIN_DOT, 2 * next_power_of_two(T)), V=V, BV=tuning.block_v, KC=kc,
                    PRECISION=INPUT_PRECISION[dot_precision],
                    EPILOGUE_PRECISION=("ieee" if dot_precision == "ieee"
                                        else EPILOGUE_PRECISION),
                    # The checkpoint's bf16 copy: a bf16 dot (the raw window is bf16 too).
                    CHECKPOINT_PRECISION="bf16" if copy else INPUT_PRECISION[dot_precision])
  kernel, suffix = _stream_kernel, ""
  if fold is not None:
    fold_bv = checked_fold_block_v(tuning, fold.tuning)
    if copy != (fold.checkpoint is not None):
      raise ValueError("a stream over the bf16 copy folds into the fp32 checkpoint behind it "
                       "(StreamFold.checkpoint), and only then.")
    inputs.update(fold_count=fold.count, fold_base=fold.base, ring_rawk=fold.ring_rawk,
                  ring_g=fold.ring_g, ring_beta=fold.ring_beta)
    outputs["ssm"] = "ssm"
    if copy:
      inputs["checkpoint"] = fold.checkpoint
      outputs["checkpoint"] = "checkpoint"
    constexprs.update(FOLD_BV=fold_bv, FOLD_KC=min(fold.tuning.k_chunk, dims["K"]),
                      WARPS=tuning.num_warps)
    kernel = _fold_stream_copy_kernel if copy else _fold_stream_kernel
    suffix = f"_fold{fold_bv}_kc{constexprs['FOLD_KC']}"
  return Launch(
      kernel=kernel,
      name=(f"triton_replay_stream_T{T}_bv{tuning.block_v}_w{tuning.num_warps}_kc{kc}"
            f"_s{tuning.num_stages}_{dot_precision}{'_copy' if copy else ''}{suffix}"),
      grid=(V // tuning.block_v, dims["HV"], B),
      inputs=inputs, outputs=outputs, constexprs=constexprs,
      num_warps=tuning.num_warps, num_stages=tuning.num_stages,
      # The fold's rounding is the recurrent kernels' only with fp fusion off (`tile`).
      fp_fusion=True if fold is None else tile.FP_FUSION)


def split_launches(ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv, q, k, v, a, b,
                   A_log, dt_bias, slot_ids, write_pos, cache_base, *, tuning: KernelTuning,
                   dot_precision: str, fold_tuning: KernelTuning | None = None,
                   checkpoint=None) -> tuple[Launch, Launch]:
  """Both launches from shapes (`compile_check`): the coefficients', then the stream's on
  scratch of the shapes the first writes; with ``fold_tuning``, the stream that folds first
  (into ``checkpoint`` when ``ssm`` is its copy), ``cache_base``'s shape for its rows."""
  coefficients = coefficients_launch(ring_k, ring_g, ring_beta, ring_rawk, q, k, v, a, b, A_log,
                                     dt_bias, slot_ids, write_pos, cache_base,
                                     dot_precision=dot_precision)
  zh, zt, eq = coefficients.out_shapes()[:3]
  fold = None if fold_tuning is None else StreamFold(
      cache_base, cache_base, ring_rawk, ring_g, ring_beta, fold_tuning, checkpoint)
  return coefficients, stream_launch(ssm, ring_d, ring_rawv, q, k, v, zh, zt, eq, slot_ids,
                                     write_pos, cache_base, L=ring_g.shape[-1], tuning=tuning,
                                     dot_precision=dot_precision, fold=fold)


def _split(ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv, q, k, v, a, b, A_log,
           dt_bias, slot_ids, write_pos, cache_base, *, tuning: KernelTuning, dot_precision: str,
           fold_rows=None, fold_tuning: KernelTuning | None = None, checkpoint=None):
  """The coefficients, then the stream over ``ssm``, which first folds ``fold_rows = (count,
  base)`` (into ``checkpoint`` where ``ssm`` is its copy). Returns ``(o, rings, states)``:
  ``rings`` by name, ``states`` the stream's folded outputs (ssm, then checkpoint)."""
  zh, zt, eq, ring_k, ring_g, ring_beta, ring_rawk = run(coefficients_launch(
      ring_k, ring_g, ring_beta, ring_rawk, q, k, v, a, b, A_log, dt_bias, slot_ids, write_pos,
      cache_base, dot_precision=dot_precision))
  fold = None if fold_rows is None else StreamFold(*fold_rows, ring_rawk, ring_g, ring_beta,
                                                   fold_tuning, checkpoint)
  o, ring_d, ring_rawv, *states = run(stream_launch(
      ssm, ring_d, ring_rawv, q, k, v, zh, zt, eq, slot_ids, write_pos, cache_base,
      L=ring_g.shape[-1], tuning=tuning, dot_precision=dot_precision, fold=fold))
  rings = dict(ring_d=ring_d, ring_k=ring_k, ring_g=ring_g, ring_beta=ring_beta,
               ring_rawk=ring_rawk, ring_rawv=ring_rawv)
  return o, [rings[name] for name in pallas_replay.RING_NAMES], states


@functools.partial(jax.jit, static_argnames=("tuning", "dot_precision"))
def replay_verify_split(ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv,
                        q, k, v, a, b, A_log, dt_bias, slot_ids, write_pos, cache_base, *,
                        tuning: KernelTuning, dot_precision: str):
  """The coefficients, then the stream: ``(o, ring_d, ring_k, ring_g, ring_beta, ring_rawk,
  ring_rawv)``. ``tuning`` is the stream's. Inputs are checked by the caller."""
  o, rings, _ = _split(ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv, q, k, v, a,
                       b, A_log, dt_bias, slot_ids, write_pos, cache_base, tuning=tuning,
                       dot_precision=dot_precision)
  return o, *rings


@functools.partial(jax.jit, static_argnames=("tuning", "fold_tuning", "dot_precision"))
def fold_replay_verify_split(ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv,
                             q, k, v, a, b, A_log, dt_bias, slot_ids, write_pos, cache_base,
                             fold_count, fold_base, ssm_copy=None, *, tuning: KernelTuning,
                             fold_tuning: KernelTuning, dot_precision: str):
  """`fold.fold` of ``fold_count[b]`` records from ring index ``fold_base[b]``, then
  `replay_verify_split`, with the fold in the stream: a folding row's programs replay its
  records into the checkpoint rows they stream, in place, and with ``ssm_copy`` round them into
  the copy, which they stream. Returns ``(o, ssm, ring_d, ..., ring_rawv)``, with ``ssm_copy``
  the pair ``(ssm, ssm_copy)`` in ``ssm``'s place. Inputs are checked by the caller."""
  streamed, checkpoint = (ssm, None) if ssm_copy is None else (ssm_copy, ssm)
  o, rings, states = _split(streamed, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv,
                            q, k, v, a, b, A_log, dt_bias, slot_ids, write_pos, cache_base,
                            tuning=tuning, dot_precision=dot_precision,
                            fold_rows=(fold_count, fold_base), fold_tuning=fold_tuning,
                            checkpoint=checkpoint)
  return o, (states[0] if ssm_copy is None else (states[1], states[0])), *rings
