"""Pieces the triton replay kernels share (`replay_verify`'s one-kernel forms, `replay_split`):
the dot with its precision, the ring history's weights, the dot's minimum size."""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm_jax.kernels.triton import tile

MIN_DOT = 16  # tl.dot: M, N and K of at least 16 on the GPU
# The window's own products (q_hat k_hat^T, k_hat k_hat^T, (I + A)^-1 R, ...) stay exact fp32: the
# UT solve amplifies their error (research/replayssm-algorithm.md section 1.3).
WINDOW_PRECISION = "ieee"
# dot_precision -> the input_precision of the K and L contractions ("bf16" casts the operands).
INPUT_PRECISION = {"default": "tf32", "tf32": "tf32", "bf16": "bf16", "ieee": "ieee"}


@triton.jit
def mma(x, y, PRECISION: tl.constexpr):
  """``x @ y`` with fp32 accumulation; PRECISION "tf32" / "ieee", or "bf16" operands."""
  if PRECISION == "bf16":
    return tl.dot(x.to(tl.bfloat16), y.to(tl.bfloat16), out_dtype=tl.float32)
  else:
    return tl.dot(x, y, input_precision=PRECISION, out_dtype=tl.float32)


@triton.jit
def history_weights(g_ring, p, write_pos, cache_base, L: tl.constexpr):
  """``(exp(G_m), w, valid)`` of a row's ring history from its gates ``g_ring`` at rows ``p``.

  ``valid``: rows ``p < L`` logically before ``write_pos``; ``w_p = exp(sum of the g logically
  after record p)`` summed through a ``[P, P]`` mask (any wraparound, no cancellation).
  """
  logical = (p - cache_base) & (L - 1)
  valid = (p < L) & (logical < write_pos)
  g_hist = tl.where(valid, g_ring, 0.0)
  later = logical[None, :] > logical[:, None]  # [P, P]: record p' after record p
  w = tl.where(valid, tile.exp(tl.sum(tl.where(later, g_hist[None, :], 0.0), axis=1)), 0.0)
  return tile.exp(tl.sum(g_hist, axis=0)), w, valid


@triton.jit
def history_weights_scan(g_hist, valid, g_next, next_valid):
  """`history_weights` of a history held in logical order: ``(exp(G_m), w)`` from the gates
  ``g_hist`` of its records (``valid``: those in the history) and ``g_next`` of the record
  after each (``next_valid``). ``w_j = exp(sum of the g after record j)``: a running sum from
  the end (no cancellation), in place of the ``[P, P]`` mask."""
  w = tl.where(valid, tile.exp(tl.cumsum(tl.where(next_valid, g_next, 0.0), axis=0,
                                         reverse=True)), 0.0)
  return tile.exp(tl.sum(tl.where(valid, g_hist, 0.0), axis=0)), w


@triton.jit
def window_rows(T: tl.constexpr, TP: tl.constexpr):
  """``(s, in_window, src)``: the TP window rows (rows past T pad the dots), those below T, and
  the token each reads (rows past T read token T - 1)."""
  s = tl.arange(0, TP)
  return s, s < T, tl.minimum(s, T - 1)


@triton.jit
def window_norms(q_row, k_row, window_keys, K: tl.constexpr, KC: tl.constexpr, TP: tl.constexpr):
  """``(K ** -0.5 / q_norm, 1 / k_norm)`` ``[TP]`` of the window's rows (``window_keys``: the
  ``[TP, KC]`` offsets of chunk 0 from ``q_row`` / ``k_row``), summed chunk by chunk over K.
  One IEEE division a row, then multiplies, not a division an element (a reciprocal, its
  refinement and a slow-path check each): the coefficients kernel's SASS 3200 -> 2760
  instructions at T=4 (triton 3.6); H200 (benchmarks/NOTES.md run 35) B=16 / 64 verify
  28.6 -> 26.2 / 61.6 -> 60.1 us, B=256 even."""
  q_sq, k_sq = tl.zeros((TP,), tl.float32), tl.zeros((TP,), tl.float32)
  for c in range(0, K, KC):
    q = tl.load(q_row + window_keys + c).to(tl.float32)
    k = tl.load(k_row + window_keys + c).to(tl.float32)
    q_sq += tl.sum(q * q, axis=1)
    k_sq += tl.sum(k * k, axis=1)
  one = tl.full((TP,), 1.0, tl.float32)
  return (tl.math.div_rn(one, tl.sqrt_rn(q_sq + tile.L2_EPS)) * (K ** -0.5),
          tl.math.div_rn(one, tl.sqrt_rn(k_sq + tile.L2_EPS)))


@triton.jit
def window_chunk(q_row, k_row, offsets, in_window, q_scale, k_inv):
  """``(k_raw, q_hat, k_hat)`` of one K-chunk of the window at ``offsets``: raw k as stored,
  q_hat (scaled by ``K ** -0.5``) and k_hat in fp32, zero past T; ``q_scale``, ``k_inv``: the
  rows' factors from `window_norms`. Rows past T are not loaded (a ``where`` after the loads
  left ptxas 4 bytes of spill in the UT form at T=1, triton 3.6)."""
  k_raw = tl.load(k_row + offsets, mask=in_window[:, None], other=0.0)
  q = tl.load(q_row + offsets, mask=in_window[:, None], other=0.0).to(tl.float32)
  q_hat = q * q_scale[:, None]
  k_hat = k_raw.to(tl.float32) * k_inv[:, None]
  return k_raw, q_hat, k_hat


@triton.jit
def window_decay(g_win, beta_win, kk, s):
  """``(Gamma, decay, A)`` of the window's UT transform from its gates (zero past T), its
  ``kk = k_hat k_hat^T`` and its rows ``s``: ``Gamma_s = g_0 + ... + g_s``, ``decay[s, j] =
  exp(Gamma_s - Gamma_j)`` (j <= s), ``A[s, j] = beta_s decay[s, j] kk[s, j]`` (j < s)."""
  causal = s[:, None] >= s[None, :]
  Gamma = tl.sum(tl.where(causal, g_win[None, :], 0.0), axis=1)
  decay = tl.where(causal, tile.exp(tl.where(causal, Gamma[:, None] - Gamma[None, :], 0.0)), 0.0)
  return Gamma, decay, tl.where(s[:, None] > s[None, :], beta_win[:, None] * decay * kk, 0.0)


@triton.jit
def unit_lower_inverse(A, s, T: tl.constexpr):
  """``(I + A)^-1`` of a strictly lower ``A`` over rows ``s``, by forward substitution: row i =
  e_i - A[i, :] @ Tinv (rows < i final)."""
  Tinv = tl.where(s[:, None] == s[None, :], 1.0, 0.0)
  for i in tl.static_range(1, T):
    a_i = tl.sum(tl.where(s[:, None] == i, A, 0.0), axis=0)
    row_i = Tinv - tl.sum(a_i[:, None] * Tinv, axis=0)[None, :]
    Tinv = tl.where(s[:, None] == i, row_i, Tinv)
  return Tinv
