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
