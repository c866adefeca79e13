"""Pieces the Pallas replay kernels share: the ring history, the window, its UT inverse.

Used by the one-kernel replay verify (`replay_verify`) and its split form (`replay_split`);
the math is in `replay_verify`'s docstring. Physical ring position p of a row holds logical
record ``(p - cache_base) & (L - 1)``; the history is the records logically before
``write_pos``. Records outside it are not loaded (`load_history`: a masked load, zero there),
never multiplied by 0, so stale or NaN entries cannot leak into a product, and a short history
costs only its own rows of memory traffic.

The window is held as ``T_pad = next_power_of_two(T)`` rows (every Triton tensor is a power
of two): rows past T read token T - 1 and are zeroed, and stores skip them (`store_rows`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from replayssm_jax import reference
from replayssm_jax.config import next_power_of_two
from replayssm_jax.kernels.backend import row_ids


def history_mask(write_pos, cache_base, L: int):
  """``(valid [L], logical [L])``: which physical positions hold history, and their order."""
  logical = (jax.lax.broadcasted_iota(jnp.int32, (L,), 0) - cache_base) & (L - 1)
  return logical < write_pos, logical


def history_weights(write_pos, cache_base, g_ring):
  """Weights of the row's ring history for the replay identity, from its ``[L]`` gates.

  Returns:
    ``(exp(G_m), w, valid)``: the decay over the whole history; ``w [L]`` with
    ``w_i = exp(sum of the g logically after record i)``, summed through an ``[L, L]`` mask (no
    cancellation, any wraparound); and the mask of the records logically before ``write_pos``.
  """
  valid, logical = history_mask(write_pos, cache_base, g_ring.shape[0])
  g_hist = jnp.where(valid, g_ring, 0.0)
  later = logical[None, :] > logical[:, None]  # [L, L]: record p' after record p
  w = jnp.where(valid, jnp.exp(jnp.sum(jnp.where(later, g_hist[None, :], 0.0), axis=1)), 0.0)
  return jnp.exp(jnp.sum(g_hist)), w, valid


class ReversedHistory(NamedTuple):
  """The ring history of a row in reversed logical order, for `history_weights_scan`.

  Place ``m`` of ``[L]`` stands for logical record ``L - 2 - m``: the last place (``m = L - 1``,
  record -1) is the start of the history, and record ``L - 1`` has no place, as a verify's
  history never holds it (a window of T >= 1 records follows it inside the ring).
  """

  cols: jax.Array  # [L] physical ring position of each place's record (record -1: L - 1's)
  valid: jax.Array  # [L] the places whose record is history (logically before write_pos)
  next_cols: jax.Array  # [L] physical position of the record after each place's
  next_valid: jax.Array  # [L] whether that record is history
  last: jax.Array  # [L] the place of record -1


def reversed_history(write_pos, cache_base, L: int) -> ReversedHistory:
  """`ReversedHistory` of a row with cursors ``write_pos`` (at most L - 1) and ``cache_base``."""
  m = jax.lax.broadcasted_iota(jnp.int32, (L,), 0)
  record = L - 2 - m
  return ReversedHistory(cols=(cache_base + record) & (L - 1),
                         valid=(record >= 0) & (record < write_pos),
                         next_cols=(cache_base + record + 1) & (L - 1),
                         next_valid=record + 1 < write_pos, last=m == L - 1)


def history_weights_scan(hist: ReversedHistory, g_next):
  """`history_weights` in `reversed_history`'s order, by a forward scan in place of the
  ``[L, L]`` mask.

  ``g_next [L]``: the gate of the record after each place's (``ring_g`` at ``hist.next_cols``,
  zero where not ``hist.next_valid``). Its running sum is, at each place, the sum of the gates
  logically after the place's record, with no cancellation; at the last place (record -1) the
  whole history's. Returns ``(exp(G_m), w)``, ``w`` zero outside the history.
  """
  decays = jnp.exp(jax.lax.cumsum(g_next, axis=0))
  return (jnp.sum(jnp.where(hist.last, decays, 0.0)),
          jnp.where(hist.valid, decays, 0.0))


def load_history(ref, valid):
  """``ref [L, ...]`` (a ring's rows of one row and head, e.g. ``ring.at[slot, h, :, vs]``) at
  the valid records, zero elsewhere, in the ring's dtype.

  A masked load: the rows past ``write_pos`` are never read, so a history of ``write_pos``
  records moves ``write_pos`` rows, not L (the verify's byte model), and their contents, stale
  or NaN, never reach a register.
  """
  mask = jnp.broadcast_to(valid.reshape(valid.shape + (1,) * (len(ref.shape) - 1)), ref.shape)
  return pltriton.load(ref, mask=mask, other=0)


def dot(x, y, precision, inline: int | None = None):
  """``x @ y`` with fp32 accumulation (``precision``: `backend.mma_algorithm`).

  ``inline``: write the product out as a broadcast multiply and a sum, exact fp32, when it has
  at most ``inline`` multiplies or no more than its larger operand has elements (see
  `inlines`); None: always a dot.
  """
  if inlines(x.shape[0], x.shape[1], y.shape[1], inline):
    return jnp.sum(x.astype(jnp.float32)[:, :, None] * y.astype(jnp.float32)[None, :, :], axis=1)
  return jnp.dot(x, y, precision=precision, preferred_element_type=jnp.float32)


def dot_nt(x, y, precision, inline: int | None = None):
  """``x @ y^T``, contracting the last axes, with fp32 accumulation (``inline`` as `dot`)."""
  if inlines(x.shape[0], x.shape[1], y.shape[0], inline):
    return jnp.sum(x.astype(jnp.float32)[:, None, :] * y.astype(jnp.float32)[None, :, :], axis=2)
  return jax.lax.dot_general(x, y, (((1,), (1,)), ((), ())), precision=precision,
                             preferred_element_type=jnp.float32)


def inlines(m: int, k: int, n: int, inline: int | None) -> bool:
  """Whether an ``[m, k] @ [k, n]`` product is written out (`dot`'s ``inline``).

  Triton runs a dot of fewer than 16 rows on the CUDA cores anyway, and stages both operands
  through shared memory first; a product no larger than an operand (a single row or column)
  costs no more registers than that operand already holds.
  """
  return inline is not None and m * k * n <= max(inline, m * k, k * n)


def store_rows(ref, idx, value, mask):
  """``ref[idx] = value`` where ``mask``: a masked scatter (all-array indices), cast to the ref."""
  pltriton.store(ref.at[idx], value.astype(ref.dtype), mask=mask)


def scatter_records(ring, slot_ids, phys, records):
  """``ring[slot, :, phys[b, s]] = records[b, :, s]`` in XLA, dropping padding rows (slot -1)."""
  slot = jnp.where(slot_ids < 0, ring.shape[0], slot_ids)[:, None, None]
  heads = jnp.arange(ring.shape[1])[None, :, None]
  return ring.at[slot, heads, phys[:, None, :]].set(records.astype(ring.dtype), mode="drop")


class TileProgram(NamedTuple):
  """A program of the grid (B, HV, V // BV), or (HV, V // BV, B) in a launch order of the rows
  (`tile_program`): its row, heads, V-block and window output rows."""

  row: jax.Array
  pos: jax.Array  # where the row's slot and cursors are: the row, or its place in launch order
  h: jax.Array  # value head
  j: jax.Array  # V-block
  kh: jax.Array  # its key head
  slot: jax.Array  # the row's slot, -1 for a padding row
  vs: pl.Slice  # the V-block
  tok: jax.Array  # [T_pad] token index
  rows_v: tuple  # indices of the [T_pad, BV] window rows (tokens, V columns)
  mask_v: jax.Array  # [T_pad, BV]: the rows inside the window


def tile_program(slot_ids_ref, o_ref, *, T: int, gqa_ratio: int, block_v: int,
                 row_order_ref=None) -> TileProgram:
  """The program's coordinates; a padding row gets its zero outputs here (and nothing else).

  With ``row_order_ref`` (``[B]`` int32, a permutation of the rows) the grid is (HV, V // BV, B)
  and the program at ``(h, j, i)`` works on row ``row_order_ref[i]``, whose slot and cursors
  are at ``pos = i`` of the row arrays, which the caller put in that order too (so a program
  finds its slot in one load, not two in a chain): Triton's first grid axis is the fastest in
  launch order, so a row's programs start together, rows in that order."""
  if row_order_ref is None:
    row, h, j = row_ids()
    pos = row
  else:
    h, j, pos = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    row = row_order_ref[pos]
  slot = slot_ids_ref[pos]
  T_pad = next_power_of_two(T)
  tok = jax.lax.broadcasted_iota(jnp.int32, (T_pad,), 0)
  rows_v = (tok[:, None], j * block_v + jax.lax.broadcasted_iota(jnp.int32, (1, block_v), 1))
  mask_v = jnp.broadcast_to((tok < T)[:, None], (T_pad, block_v))

  @pl.when(slot < 0)
  def _padding():
    store_rows(o_ref, (row, rows_v[0], h, rows_v[1]), jnp.zeros((T_pad, block_v)), mask_v)

  return TileProgram(row, pos, h, j, h // gqa_ratio, slot, pl.ds(j * block_v, block_v), tok,
                     rows_v, mask_v)


class WindowKeys(NamedTuple):
  """A row's T-token window at one key head, fp32, ``T_pad`` rows, zero past T."""

  tok: jax.Array  # [T_pad] int32 token index
  in_window: jax.Array  # [T_pad] bool, tok < T
  k_raw: jax.Array  # [T_pad, K] activation dtype (rows past T repeat token T - 1)
  q_hat: jax.Array  # [T_pad, K] l2-normalised q, scaled
  k_hat: jax.Array  # [T_pad, K] l2-normalised k
  q_raw: jax.Array  # [T_pad, K] activation dtype (rows past T repeat token T - 1)
  # [T_pad] fp32, zero past T: q_hat = s_q * q_raw, k_hat = s_k * k_raw up to rounding (the
  # inverse norms as factors), so a product with the raw window is one with the normalised
  # window once its rows are scaled.
  s_q: jax.Array
  s_k: jax.Array

  def raw_rows(self) -> tuple[jax.Array, jax.Array]:
    """``(q_raw, k_raw)`` zero past T, in the activation dtype."""
    return tuple(jnp.where(self.in_window[:, None], x, jnp.zeros_like(x))
                 for x in (self.q_raw, self.k_raw))

  @property
  def X(self) -> jax.Array:
    """``[2 T_pad, K]``: ``[q_hat; k_hat]``, for one dot over both (Triton has no row
    concatenation: stack on a new last axis, move it; a layout change through shared memory)."""
    X = jnp.stack([self.q_hat, self.k_hat], axis=-1)
    return jnp.transpose(X, (2, 0, 1)).reshape(2 * self.tok.shape[0], -1)


class WindowGates(NamedTuple):
  """A row's T-token window at one value head: gates as recorded, and zero past T."""

  g: jax.Array  # [T_pad] (rows past T repeat token T - 1)
  beta: jax.Array  # [T_pad]
  g_win: jax.Array  # [T_pad] g, zero past T
  beta_win: jax.Array  # [T_pad] beta, zero past T


def _window_tokens(T: int):
  tok = jax.lax.broadcasted_iota(jnp.int32, (next_power_of_two(T),), 0)
  return tok, jnp.minimum(tok, T - 1)  # rows past T read token T - 1


def load_keys(q_ref, k_ref, row, kh, T: int, scale: float, *,
              reciprocal: bool = False) -> WindowKeys:
  """q_hat and k_hat of ``row``'s window at key head kh, from ``[B, T, H, K]`` refs.

  `reference.l2_normalize` over whole K rows, as every kernel normalises (its sum's order
  follows the tile's layout: the records can differ from XLA's in the last bit). With
  ``reciprocal``, one division a row and a product an element (the scale folded into q's
  factor) in place of a division an element: a bit more rounding, far fewer instructions.
  """
  tok, src = _window_tokens(T)
  in_window = tok < T
  k_raw = k_ref[row, src, kh, :]
  return _window_keys(tok, in_window, q_ref[row, src, kh, :], k_raw, scale, reciprocal)


def key_inputs(q_ref, k_ref, row, kh, T: int):
  """``(q_raw, k_raw)``, ``[T_pad, K]`` each: ``row``'s window at key head kh as stored."""
  _, src = _window_tokens(T)
  k_raw = k_ref[row, src, kh, :]
  return q_ref[row, src, kh, :], k_raw


def window_keys(q_raw, k_raw, T: int, scale: float, *, reciprocal: bool = False) -> WindowKeys:
  """`load_keys` from the raw window (`key_inputs`)."""
  tok, _ = _window_tokens(T)
  return _window_keys(tok, tok < T, q_raw, k_raw, scale, reciprocal)


def normalise_rows(x, rows=None) -> tuple[jax.Array, jax.Array]:
  """``(x_hat, 1 / norm)`` over the last axis, in fp32: ``x_hat`` is `reference.l2_normalize`'s,
  bit for bit (the same ops, the norm kept), the inverse norm one axis less; both zero where
  the boolean ``rows`` (``x``'s leading axes) is false."""
  x = x.astype(jnp.float32)
  norm = jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True) + reference.L2_EPS)
  if rows is None:
    return x / norm, 1.0 / norm[..., 0]
  inverse = jnp.where(rows, 1.0 / norm[..., 0], 0.0)
  return jnp.where(rows[..., None], x / norm, 0.0), inverse


def _window_keys(tok, in_window, q_raw, k_raw, scale: float, reciprocal: bool) -> WindowKeys:
  if reciprocal:
    s_q, s_k = (jnp.where(in_window, 1.0 / _norms(x), 0.0) for x in (q_raw, k_raw))
    s_q = s_q * scale
    q_hat, k_hat = (x.astype(jnp.float32) * s[:, None] for x, s in ((q_raw, s_q), (k_raw, s_k)))
    return WindowKeys(tok, in_window, k_raw, q_hat, k_hat, q_raw, s_q, s_k)
  (q_hat, s_q), (k_hat, s_k) = (normalise_rows(x, in_window) for x in (q_raw, k_raw))
  return WindowKeys(tok, in_window, k_raw, q_hat * scale, k_hat, q_raw, s_q * scale, s_k)


def _norms(x):
  """`reference.l2_normalize`'s norms of the rows of ``x`` (fp32, one axis less)."""
  x = x.astype(jnp.float32)
  return jnp.sqrt(jnp.sum(x * x, axis=-1) + reference.L2_EPS)


def load_gates(a_ref, b_ref, A_log, dt_bias, row, h, T: int) -> WindowGates:
  """The gates of ``row``'s window at value head h: elementwise, so bitwise those of the
  recurrent path (`recurrent.token_inputs`)."""
  tok, src = _window_tokens(T)
  return _window_gates(tok, T, a_ref[row, src, h], b_ref[row, src, h], A_log, dt_bias)


def gate_inputs(a_ref, b_ref, A_log, dt_bias, row, h, T: int):
  """``(a, b, A_log, dt_bias)``: the inputs of ``row``'s window gates at value head h."""
  _, src = _window_tokens(T)
  return a_ref[row, src, h], b_ref[row, src, h], A_log, dt_bias


def window_gates(a, b, A_log, dt_bias, T: int) -> WindowGates:
  """`load_gates` from the gate inputs (`gate_inputs`)."""
  return _window_gates(_window_tokens(T)[0], T, a, b, A_log, dt_bias)


def _window_gates(tok, T: int, a, b, A_log, dt_bias) -> WindowGates:
  g, beta = reference.gdn_gating(a, b, A_log, dt_bias)
  return WindowGates(g, beta, jnp.where(tok < T, g, 0.0), jnp.where(tok < T, beta, 0.0))


def window_solve(g_win, beta_win, kk, T: int):
  """``(Gamma, decay, Tinv)`` of the window's UT transform, batched over leading axes.

  From ``g_win, beta_win [..., T_pad]`` (zero past T) and ``kk [..., T_pad, T_pad]``:
  ``Gamma_s = g_0 + ... + g_s``; ``decay[s, j] = exp(Gamma_s - Gamma_j)`` for j <= s, else 0;
  ``Tinv = (I + A)^-1`` with ``A[s, j] = beta_s decay[s, j] kk[s, j]`` (j < s), by forward
  substitution unrolled over T: row i = e_i - A[i, :] @ Tinv (rows < i final). Masks and
  sums only, so the same code runs in a Triton kernel and in XLA.
  """
  tok = jax.lax.broadcasted_iota(jnp.int32, (g_win.shape[-1],), 0)
  causal = tok[:, None] >= tok[None, :]
  Gamma = jnp.sum(jnp.where(causal, g_win[..., None, :], 0.0), axis=-1)
  seg = jnp.where(causal, Gamma[..., :, None] - Gamma[..., None, :], 0.0)
  decay = jnp.where(causal, jnp.exp(seg), 0.0)
  A = jnp.where(tok[:, None] > tok[None, :], beta_win[..., :, None] * decay * kk, 0.0)
  Tinv = jnp.where(tok[:, None] == tok[None, :], 1.0, 0.0) + jnp.zeros_like(A)
  for i in range(1, T):
    a_i = jnp.sum(jnp.where(tok[:, None] == i, A, 0.0), axis=-2)  # A[i, :]
    row_i = Tinv - jnp.sum(a_i[..., :, None] * Tinv, axis=-2)[..., None, :]
    Tinv = jnp.where(tok[:, None] == i, row_i, Tinv)
  return Gamma, decay, Tinv
