"""ReplaySSM verify split in two kernels: the window's coefficients, then a checkpoint stream.

The one-kernel forms (`replay_verify`) solve the window in every program of a ``[BV, K]``
checkpoint tile: the norms, the ``[L, L]`` history weights, the ``[T, T]`` products and the
forward substitution run V / BV times per (row, head), in the shadow of nothing. All of that
is independent of the checkpoint S0, and the outputs are linear in what does depend on it. With
``Y = X S0^T`` (``X = [q_hat; k_hat]``, ``[2T, BV]``, split into ``Y_q, Y_k``), the history
``D_hist [L, BV]``, ``a = exp(G_m)`` and ``C = (X K_hist^T) * w = [C_q; C_k]`` (`replay_verify`'s
docstring has the rest of the notation), the UT transform reads

    D = P v + Dy Y_k + Dh D_hist,    P = Tinv diag(beta),  E = Tinv diag(beta exp(Gamma)),
                                     Dy = -a E,            Dh = -E C_k
    O = eq * Y_q + Oh D_hist + M D,  eq = a exp(Gamma),    Oh = diag(exp(Gamma)) C_q,
                                     M = decay * (q_hat k_hat^T)

so the work splits:

1. `_coefficients_kernel`, grid (B, H): per (row, key head) the
   normalised window and its products with the key history (``X K_hist^T``, on the tensor
   cores from T = 2: `COEFFICIENT_KEY_MMA`) and with itself (``q_hat k_hat^T``,
   ``k_hat k_hat^T``, exact fp32), then
   for each of its value heads the gates, the UT inverse and the small matrices ``[Dh; Oh]``,
   ``(P, Dy, M)``, ``eq``, into fp32 scratch with ``X`` (about 55 KB per row at the anchor
   geometry, written once and read once, against 2 MB of checkpoint); it also writes the
   records that need no checkpoint (k_hat, raw k, g, beta). ``X`` goes raw, ``[q; k]`` in the
   activation dtype (half the bytes of fp32, exact in the stream's dot), with its rows'
   inverse norms ``xs = [s_q; s_k]`` (``q_hat = diag(s_q) q``): ``Y`` is linear in X's rows,
   so the stream applies them to ``eq`` and ``Dy``, ``[T]`` and ``[T, T]``, not to ``Y``.
2. `_stream_kernel`, grid (B, HV, V // BV): ``Y = X S0^T`` over a loop of K-chunks, so Triton
   pipelines the checkpoint loads (``num_stages``) into the tensor-core dots, then the three
   small products above, whose other operands it loads before the loop (`STREAM_EARLY`); it
   writes the outputs and the d and raw v records.

`fold_replay_verify_split` first folds a step's flush rows inside the stream: a folding row's
programs replay its committed records into their checkpoint tiles (`fold.fold_rows`, the exact
fold's own loop) and then stream them, so its checkpoint is read and written once. They run in
the same launch as the other rows' programs, launched first (`STREAM_FOLD_FIRST`).

Same contract as `replay_verify.replay_verify` (the ``"split"`` form): ``ssm`` is only read,
the window's records go to ``phys(write_pos + s)``, every other ring entry stays bitwise as it
was, a padding row (slot -1) gets zero outputs and writes nothing. Precision: the K and L
contractions use ``dot_precision`` (`backend.mma_algorithm`), the window's ``[T, T]``
products exact fp32, as in the UT form.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from replayssm_jax import reference
from replayssm_jax.config import next_power_of_two
from replayssm_jax.kernels import fold as fold_kernels
from replayssm_jax.kernels.backend import KernelTuning, mma_algorithm, row_grid, row_ids
from replayssm_jax.kernels.launch_order import fold_first_order_pallas
from replayssm_jax.kernels.replay_parts import (WindowKeys, dot, dot_nt, gate_inputs,
                                                history_mask, history_weights,
                                                history_weights_scan, key_inputs,
                                                load_gates, load_history, load_keys,
                                                normalise_rows, reversed_history,
                                                scatter_records, store_rows,
                                                tile_program, window_gates, window_keys,
                                                window_solve)

# Warps of the coefficients kernel, whose tiles are tiny: 1, 2, 4 warps took 57, 75, 130 us
# at B=256, T=4 (H200, benchmarks/NOTES.md run 6). One key head a program: two or four took
# longer (run 7: 57 -> 67.6 / 75.3 us), and so did the window's products as one dot over a
# stacked ``[q_hat; k_hat]`` (run 8: one dot each, 57 -> 51 us). Both variants, and run 20's
# key products as two bf16 dots, were removed in session 34 (the code is in d5fe77a).
COEFFICIENT_WARPS = 1
# Products of the coefficients kernel written out as a multiply and a sum (`replay_parts.dot`'s
# ``inline``): those of at most this many multiplies, and single rows; None: all dots. H200,
# B=256 (benchmarks/NOTES.md run 10): 51 -> 40 us at T=4, 23 -> 18 us at T=1.
COEFFICIENT_INLINE = 2048
# The key history products ``X K_hist^T`` as one tensor-core dot over ``[q_hat; k_hat]``
# (`_key_products_mma`) or as one dot each of T_pad rows, on the CUDA cores
# (`replay_parts.inlines`). None: the tensor cores from T = 2 on. H200 (benchmarks/NOTES.md
# run 14): T=4, B=256 39.6 -> 33.9 us, B=512 75.2 -> 60.0, B=64 even; T=1 (single rows, written
# out) 17.8 -> 19.5 at B=256.
COEFFICIENT_KEY_MMA = None
# Whether every load of a program (the raw window, the key ring rows, and each value head's
# gates and ring gates) is issued before any arithmetic, so their latencies overlap one
# another and the key-side products instead of one round trip per value head (the same bits:
# only the order of the loads moves). None: for decode (T = 1), and for a window while the
# kernel has at most `LOADS_FIRST_MAX_PROGRAMS` programs. H200, 20 reps (benchmarks/NOTES.md
# run 21): T=1 B=64 / 256 / 512 6.85 -> 6.10, 17.86 -> 16.62, 31.71 -> 28.18 us; T=4 B=64
# (1024 programs, one wave) 10.54 -> 9.31, but B=256 28.94 -> 29.57 and B=512 52.74 -> 53.52
# (two waves and more, where what the early loads hold most likely costs programs an SM; not
# profiled).
COEFFICIENT_LOADS_FIRST = None
LOADS_FIRST_MAX_PROGRAMS = 1024
# Whether the history weights ``w`` come from a running sum over the history in reversed
# logical order (`replay_parts.history_weights_scan`: the key rows and gates loaded in that
# order, ``[Dh; Oh]`` stored back to the physical columns) in place of the ``[L, L]`` mask of
# `replay_parts.history_weights`, per value head. Locally (triton 3.6, sm_90) the mask takes
# 208 of the T=1 kernel's 1536 instructions and 31 of its 127 registers, and 256 of 2304 at
# T=4. H100 (benchmarks/NOTES.md run 38): the kernel at T=4 B=64 8.7 -> 8.1 us, T=1 B=256
# 15.1 -> 13.0, T=4 B=256 26.7 -> 25.2; on since session 39 (the tables' H200 runs had it off).
# Run 40 (H100, read flush): the replay verify at B=64 63.8-64.0 -> 63.1-63.5 us, B=256 234.0-234.3
# -> 232.7-232.8.
COEFFICIENT_HISTORY_SCAN = True
# Whether the window's q and k are normalised by one division a row and a product an element
# (`replay_parts.load_keys`' ``reciprocal``) in place of an IEEE division an element (a
# reciprocal, its refinement and a slow-path check each): locally (triton 3.6, sm_90) the T=4
# kernel at B=64 2304 -> 2216 instructions (2104 -> 2024 with the running sum), T=1 1536 ->
# 1512. The records' k_hat may move by an ulp (the fold replays raw k: no committed state
# sees it; on the CPU cases they are as close to XLA's as the division's). The triton backend's
# kernel took the same change in run 35: B=64 verify 61.6 -> 60.1 us, B=16 28.6 -> 26.2, B=256
# even. Here (H100, benchmarks/NOTES.md run 38) the kernel stayed even at T=4: off.
COEFFICIENT_NORM_RECIPROCAL = False
# Whether the window's own products ``q_hat k_hat^T`` and ``k_hat k_hat^T`` come from one
# tensor-core dot of the raw window, ``[q; k] k^T`` in bf16 (exact products, fp32 sums), their
# rows and columns then scaled by the inverse norms (`_window_products_mma`), in place of two
# written-out ``[T_pad, T_pad, K]`` products whose sums over K are warp shuffles; as the triton
# kernel's `WINDOW_MMA` since run 36. For bf16 activations and windows of 2 rows or more.
# Locally (triton 3.6, sm_90), T=4: B=64 2304 -> 2056 instructions, 145 -> 140 registers;
# B=256 2360 -> 2024; with the two knobs above as well 1816 and 1800 (128 and 123 registers).
# H100 (benchmarks/NOTES.md run 38): B=64 even, B=256 26.7 -> 25.8 us; run 40, the replay
# verify beside the running sum: B=64 even, B=256 232.7 -> 231.3-231.6 us. Elsewhere it does
# not shorten the kernel (sm_90 compile, with the running sum): T=2 B=64 1592 -> 1648
# instructions, T=8 B=256 3232 -> 2872 but 168 -> 215 registers (12 -> 9 programs an SM). So
# its one gain is 0.5% at T=4 from 128 rows; off, not worth a rule by T and B.
COEFFICIENT_WINDOW_MMA = False
_P, _DY, _M = range(3)  # the [T_pad, T_pad] matrices in the coefficients scratch `zt`


def _coefficients_kernel(
    slot_ids_ref, write_pos_ref, cache_base_ref,  # [B] int32
    q_ref, k_ref,  # [B, T, H, K] activation
    a_ref, b_ref,  # [B, T, HV] activation
    A_log_ref, dt_bias_ref,  # [HV] f32
    ring_k_ref,  # [slots, H, L, K] ring dtype (aliased with ring_k_out_ref)
    ring_g_ref,  # [slots, HV, L] f32 (aliased)
    ring_beta_ref, ring_rawk_ref,  # aliased, not read
    x_ref,  # [B, H, 2 T_pad, K] activation: [q; k], raw, zero past T
    xs_ref,  # [B, H, 2 T_pad] f32: [s_q; s_k], X's rows to normalise it
    zh_ref,  # [B, HV, 2 T_pad, L] f32: [Dh; Oh]
    zt_ref,  # [B, HV, 3, T_pad, T_pad] f32: P, Dy, M
    eq_ref,  # [B, HV, T_pad] f32
    ring_k_out_ref, ring_g_out_ref, ring_beta_out_ref, ring_rawk_out_ref,
    *, T: int, L: int, gqa_ratio: int, inline: int | None, key_mma: bool, loads_first: bool,
    history_scan: bool, reciprocal_norms: bool, window_mma: bool, scale: float, precision_k,
    precision_t, precision_w):
  """One program per (row, key head): the key-side products once, then each of its value
  heads. With ``history_scan`` the history axis (of ``k_hist``, the products with it and
  ``[Dh; Oh]`` until they are stored) is in `replay_parts.reversed_history`'s order."""
  del ring_beta_ref, ring_rawk_ref  # written only, through the aliased outputs
  row, kh = row_ids(2)
  slot = slot_ids_ref[row]
  T_pad = next_power_of_two(T)
  K = k_ref.shape[-1]

  @pl.when(slot >= 0)  # padding rows: the stream kernel reads none of this
  def _coefficients():
    write_pos, cache_base = write_pos_ref[row], cache_base_ref[row]
    if history_scan:
      hist = reversed_history(write_pos, cache_base, L)
      load_k_hist = lambda: pltriton.load(
          ring_k_ref.at[slot, kh, hist.cols[:, None],
                        jax.lax.broadcasted_iota(jnp.int32, (1, K), 1)],
          mask=jnp.broadcast_to(hist.valid[:, None], (L, K)), other=0)
      ring_gates = lambda h: pltriton.load(ring_g_ref.at[slot, h, hist.next_cols],
                                           mask=hist.next_valid, other=0.0)
    else:
      valid, _ = history_mask(write_pos, cache_base, L)
      load_k_hist = lambda: load_history(ring_k_ref.at[slot, kh, :, :], valid)
      ring_gates = lambda h: ring_g_ref[slot, h, :]

    def store_zh(h, half, z):  # Dh (half 0) or Oh (1), ``[T_pad, L]``
      if history_scan:  # back to the physical columns of the stream's d history
        rows = half * T_pad + jax.lax.broadcasted_iota(jnp.int32, (T_pad, 1), 0)
        pltriton.store(zh_ref.at[row, h, rows, hist.cols[None, :]], z)
      else:
        zh_ref[row, h, pl.ds(half * T_pad, T_pad), :] = z

    def value_head_inputs(h):  # a value head's window gate inputs and its ring gates
      return (gate_inputs(a_ref, b_ref, A_log_ref[h], dt_bias_ref[h], row, h, T),
              ring_gates(h))

    if loads_first:  # every load of the key head and its value heads, then the arithmetic
      raw = key_inputs(q_ref, k_ref, row, kh, T)
      k_hist = load_k_hist()  # [L, K] ring dtype
      heads = [value_head_inputs(kh * gqa_ratio + i) for i in range(gqa_ratio)]
      win = window_keys(*raw, T, scale, reciprocal=reciprocal_norms)
    else:
      win = load_keys(q_ref, k_ref, row, kh, T, scale, reciprocal=reciprocal_norms)
      k_hist = load_k_hist()
    # The stream's X, raw, and its rows' norms, stored once every load is issued (the norms
    # scaling eq and Dy here, kept through the value heads, took the kernel from 126 to 154
    # registers and 26.3 to 29.7 us at B=256; benchmarks/NOTES.md run 27).
    for half, (x, s) in enumerate(zip(win.raw_rows(), (win.s_q, win.s_k))):
      x_ref[row, kh, pl.ds(half * T_pad, T_pad), :] = x
      xs_ref[row, kh, pl.ds(half * T_pad, T_pad)] = s
    # [T_pad, L] and [T_pad, T_pad] products of q_hat and k_hat, one dot each: no stacking
    # and splitting of tiles through shared memory.
    if key_mma:
      XK_q, XK_k = _key_products_mma(win, k_hist, precision_k)
    else:
      k_hist = k_hist.astype(jnp.float32)
      XK_q, XK_k = (dot_nt(x, k_hist, precision_k, inline) for x in (win.q_hat, win.k_hat))
    if window_mma:
      qk, kk = _window_products_mma(win, precision_w)
    else:
      qk, kk = (dot_nt(x, win.k_hat, precision_t, inline) for x in (win.q_hat, win.k_hat))
    phys = ((cache_base + write_pos + win.tok) & (L - 1))[:, None]  # [T_pad, 1]

    # The window's key records before the value heads, which no longer keep k_hat and raw k
    # alive for stores after them. H200, B=256 (benchmarks/NOTES.md run 20, with the stream's
    # X stored here too): 30.2 -> 28.7 us, the same bits; the registers stayed at 128, so the
    # gain is most likely the schedule (not profiled further).
    cols_k = jax.lax.broadcasted_iota(jnp.int32, (1, K), 1)
    mask_k = jnp.broadcast_to(win.in_window[:, None], (T_pad, K))
    store_rows(ring_k_out_ref, (slot, kh, phys, cols_k), win.k_hat, mask_k)
    store_rows(ring_rawk_out_ref, (slot, kh, phys, cols_k), win.k_raw, mask_k)

    for i in range(gqa_ratio):  # the value heads of this key head
      h = kh * gqa_ratio + i
      if loads_first:
        gate_in, g_ring = heads[i]
        gates = window_gates(*gate_in, T)
      else:
        gates = load_gates(a_ref, b_ref, A_log_ref[h], dt_bias_ref[h], row, h, T)
        g_ring = ring_gates(h)
      if history_scan:
        decay_all, w = history_weights_scan(hist, g_ring)
      else:
        decay_all, w, _ = history_weights(write_pos, cache_base, g_ring)
      C_q, C_k = XK_q * w[None, :], XK_k * w[None, :]
      Gamma, decay, Tinv = window_solve(gates.g_win, gates.beta_win, kk, T)
      exp_gamma = jnp.exp(Gamma)
      E = Tinv * (gates.beta_win * exp_gamma)[None, :]
      store_zh(h, 0, -dot(E, C_k, precision_t, inline))  # Dh
      store_zh(h, 1, exp_gamma[:, None] * C_q)  # Oh
      zt_ref[row, h, _P] = Tinv * gates.beta_win[None, :]
      zt_ref[row, h, _DY] = -decay_all * E
      zt_ref[row, h, _M] = decay * qk
      eq_ref[row, h, :] = decay_all * exp_gamma
      store_rows(ring_g_out_ref, (slot, h, phys[:, 0]), gates.g, win.in_window)
      store_rows(ring_beta_out_ref, (slot, h, phys[:, 0]), gates.beta, win.in_window)


def _key_products_mma(win: WindowKeys, k_hist, precision):
  """``(q_hat K_hist^T, k_hat K_hist^T)``, ``[T_pad, L]`` each, from one tensor-core dot.

  ``k_hist [L, K]``: the key history in the ring's dtype, zero past it (`load_history`). The
  dot's rows are ``[q_hat; k_hat]``, ``2 T_pad`` of them, not padded with zero rows to
  Triton's 16-row tensor-core tile (run 14's form): Triton pads a small dot itself, so the
  zero rows most likely only added operand work (not profiled). H200, T=4, the kernel alone
  (benchmarks/NOTES.md run 19): B=256 33.5 -> 30.4 us, B=512 60.0 -> 54.9, B=64 11.0 -> 10.5.
  Each of q_hat, k_hat is broadcast over the operand and selected by row, so no row moves
  between threads (Triton has no row concatenation); the product is split back by rows.
  (Run 20 split X in two bf16 parts for two bf16 dots against a bf16 ring, finer than tf32
  and 8% fewer instructions, but 160 registers against 128: slower, removed.)
  """
  X = _stacked(win.q_hat, win.k_hat)
  XK_q, XK_k = jnp.split(dot_nt(X, k_hist.astype(jnp.float32), precision), 2, axis=0)
  return XK_q, XK_k


def _window_products_mma(win: WindowKeys, precision):
  """``(q_hat k_hat^T, k_hat k_hat^T)``, ``[T_pad, T_pad]`` each, from one tensor-core dot of
  the raw window: ``[q; k] k^T`` with bf16 operands (``precision``: bf16), whose products are
  exact and whose sums are fp32, then each row and column scaled by its inverse norm (``q_hat =
  diag(s_q) q``). Only for bf16 activations: fp32 operands would round to tf32."""
  q_raw, k_raw = win.raw_rows()
  XX_q, XX_k = jnp.split(dot_nt(_stacked(q_raw, k_raw), k_raw, precision), 2, axis=0)
  s_k = win.s_k[None, :]
  return win.s_q[:, None] * XX_q * s_k, win.s_k[:, None] * XX_k * s_k


def _stacked(x_q, x_k):
  """``[x_q; x_k]``, ``[2 T_pad, K]``: each broadcast over the stack and selected by row, so no
  row moves between threads (Triton has no row concatenation)."""
  T_pad, K = x_q.shape
  spread = lambda x: jnp.broadcast_to(x[None], (2, T_pad, K)).reshape(2 * T_pad, K)
  r = jax.lax.broadcasted_iota(jnp.int32, (2 * T_pad, 1), 0)
  return jnp.where(r < T_pad, spread(x_q), spread(x_k))


def _coefficients_xla(q, k, a, b, A_log, dt_bias, ring_k, ring_g, ring_beta, ring_rawk,
                      slot_ids, write_pos, cache_base):
  """`_coefficients_kernel` as batched XLA ops over all (row, head) at once, dots in fp32.

  Returns ``((x, xs, zh, zt, eq), (ring_k, ring_g, ring_beta, ring_rawk))``, the same scratch
  (history columns in physical ring order, as the stream kernel reads ``ring_d``) and rings.
  """
  B, T, H, K = q.shape
  HV, L = a.shape[2], ring_g.shape[-1]
  r, T_pad = HV // H, next_power_of_two(T)
  hp = jax.lax.Precision.HIGHEST
  pad = lambda x: jnp.pad(x, [(0, 0), (0, T_pad - T)] + [(0, 0)] * (x.ndim - 2))  # zero rows
  per_value_head = lambda x: jnp.repeat(x, r, axis=1)  # [B, H, ...] -> [B, HV, ...]

  g, beta = reference.gdn_gating(a, b, A_log, dt_bias)  # [B, T, HV]
  (q_hat, s_q), (k_hat, s_k) = normalise_rows(q), normalise_rows(k)  # s: [B, T, H]
  q_hat, s_q = q_hat * K ** -0.5, s_q * K ** -0.5
  stack = lambda q, k: jnp.moveaxis(jnp.concatenate([pad(q), pad(k)], axis=1), 1, 2)
  X = stack(q_hat, k_hat)  # [B, H, 2 T_pad, K]
  X_raw = stack(q, k)  # the stream's, with its rows' norms xs [B, H, 2 T_pad]
  xs = stack(s_q, s_k)
  g_win, beta_win = (jnp.moveaxis(pad(x), 1, 2) for x in (g, beta))  # [B, HV, T_pad]

  slot = jnp.maximum(slot_ids, 0)
  per_head = jax.vmap(history_weights, in_axes=(None, None, 0))  # over the value heads
  decay_all, w, valid = jax.vmap(per_head)(write_pos, cache_base, ring_g[slot])  # [B, HV, ...]
  k_hist = jnp.where(valid[:, :1, :, None], ring_k[slot].astype(jnp.float32), 0.0)
  C = per_value_head(jnp.einsum("bhsk,bhlk->bhsl", X, k_hist, precision=hp)) * w[:, :, None, :]
  C_q, C_k = jnp.split(C, 2, axis=2)
  qk, kk = jnp.split(per_value_head(jnp.einsum("bhsk,bhjk->bhsj", X, X[:, :, T_pad:],
                                               precision=hp)), 2, axis=2)
  Gamma, decay, Tinv = window_solve(g_win, beta_win, kk, T)
  exp_gamma = jnp.exp(Gamma)
  E = Tinv * (beta_win * exp_gamma)[..., None, :]
  Dh = -jnp.einsum("bhst,bhtl->bhsl", E, C_k, precision=hp)
  zh = jnp.concatenate([Dh, exp_gamma[..., None] * C_q], axis=2)
  zt = jnp.stack([Tinv * beta_win[..., None, :], -decay_all[..., None, None] * E, decay * qk],
                 axis=2)
  eq = decay_all[..., None] * exp_gamma
  # The rings are written after every history read, so XLA updates the donated rings in
  # place instead of copying them first.
  scratch, (ring_k, ring_g, ring_beta, ring_rawk) = jax.lax.optimization_barrier(
      ((X_raw, xs, zh, zt, eq), (ring_k, ring_g, ring_beta, ring_rawk)))
  phys = (cache_base[:, None] + write_pos[:, None] + jnp.arange(T)[None, :]) & (L - 1)
  rings = (scatter_records(ring_k, slot_ids, phys, jnp.moveaxis(k_hat, 1, 2)),
           scatter_records(ring_g, slot_ids, phys, jnp.moveaxis(g, 1, 2)),
           scatter_records(ring_beta, slot_ids, phys, jnp.moveaxis(beta, 1, 2)),
           scatter_records(ring_rawk, slot_ids, phys, jnp.moveaxis(k, 1, 2)))
  return scratch, rings


class StreamFold(NamedTuple):
  """How the stream kernel folds a flush row's records into its checkpoint tile first: in
  ``loop``'s tiles and record loop (`fold.fold_before_read`), the folding rows' programs
  launched first or not."""

  loop: fold_kernels.FoldLoop
  first: bool  # launch the folding rows' programs first (`STREAM_FOLD_FIRST`)
  compiled: bool
  # The stream reads the checkpoint's copy (`SpecConfig.checkpoint_copy`): the fold replays
  # into the fp32 checkpoint, an input of its own, and rewrites the copy's tile from it.
  copy: bool = False


class CoefficientLaunch(NamedTuple):
  """How `_coefficients` computes the window's coefficients: the ``coefficients`` and
  ``coefficient_*`` arguments of `replay_verify_split`, in one value."""

  form: str  # one of COEFFICIENTS
  warps: int
  inline: int | None
  key_mma: bool | None
  loads_first: bool | None
  history_scan: bool | None = None  # None: `COEFFICIENT_HISTORY_SCAN`
  reciprocal_norms: bool | None = None  # None: `COEFFICIENT_NORM_RECIPROCAL`
  window_mma: bool | None = None  # None: `COEFFICIENT_WINDOW_MMA` where it applies


class _EpilogueInputs(NamedTuple):
  """What a stream program's epilogue reads besides ``Y``, as loaded (`_stream_kernel`)."""

  d_hist: jax.Array  # [L, BV] ring dtype, zero outside the history
  v_raw: jax.Array  # [T_pad, BV] activation
  zh: jax.Array  # [2 T_pad, L]: [Dh; Oh]
  P: jax.Array  # [T_pad, T_pad]
  Dy: jax.Array
  M: jax.Array
  eq: jax.Array  # [T_pad]
  s_q: jax.Array  # [T_pad]: X's rows' inverse norms
  s_k: jax.Array


def _stream_kernel(
    slot_ids_ref, write_pos_ref, cache_base_ref,  # [B] int32
    v_ref,  # [B, T, HV, V] activation
    ssm_in_ref,  # [slots, HV, V, K] f32 or its bf16 copy, as read: read only, or aliased
    # with ssm_out (with `fold`)
    x_ref, xs_ref, zh_ref, zt_ref, eq_ref,  # the coefficients kernel's scratch
    ring_d_ref,  # [slots, HV, L, V] ring dtype (aliased with ring_d_out_ref)
    ring_rawv_ref,  # [slots, HV, L, V] activation (aliased; not read)
    *refs,  # with `fold`: fold_count, fold_base [B] int32, ring_rawk, ring_g, ring_beta
    # (, the fp32 checkpoint with `fold.copy`, aliased with checkpoint_out)
    # (, row_order [B] int32 with `fold.first`: then the [B] row arrays, slot_ids to
    # fold_base, are in launch order, `tile_program`'s pos)
    # outputs: o [B, T, HV, V] activation, ring_d_out, ring_rawv_out (, ssm_out with `fold`)
    # (, checkpoint_out with `fold.copy`)
    T: int, L: int, gqa_ratio: int, block_v: int, k_chunk: int, precision_k, precision_l,
    precision_t, fold: StreamFold | None, early: str):
  """One program per ``[block_v, K]`` checkpoint tile of a (row, value head). ``early``: what
  of the epilogue comes before the K-loop (`STREAM_EARLY`)."""
  del ring_rawv_ref  # read and written through the aliased output
  refs = list(refs)
  if fold is not None:
    fold_count_ref, fold_base_ref, ring_rawk_ref, ring_g_ref, ring_beta_ref = (
        refs.pop(0) for _ in range(5))
    if fold.copy:
      refs.pop(0)  # the fp32 checkpoint's input: the same buffer as its output
  row_order_ref = refs.pop(0) if fold is not None and fold.first else None
  o_ref, ring_d_out_ref, ring_rawv_out_ref, *ssm_out = refs
  ssm_ref = ssm_out[0] if fold is not None else ssm_in_ref
  # What the fold replays into: the checkpoint the stream reads, or the fp32 one behind its copy.
  copied = fold is not None and fold.copy
  fold_ref, copy_ref = (ssm_out[1], ssm_ref) if copied else (ssm_ref, None)
  p = tile_program(slot_ids_ref, o_ref, T=T, gqa_ratio=gqa_ratio, block_v=block_v,
                   row_order_ref=row_order_ref)
  row, pos, h, kh, slot, vs, tok = p.row, p.pos, p.h, p.kh, p.slot, p.vs, p.tok
  K = ssm_ref.shape[-1]
  T_pad = tok.shape[0]

  @pl.when(slot >= 0)
  def _stream():
    write_pos, cache_base = write_pos_ref[pos], cache_base_ref[pos]
    if fold is not None:
      fold_kernels.fold_before_read(
          fold_ref, ring_rawk_ref, ring_rawv_out_ref, ring_g_ref, ring_beta_ref, loop=fold.loop,
          count=fold_count_ref[pos], rows=block_v, compiled=fold.compiled,
          first_row=p.j * block_v, slot=slot, h=h, kh=kh, base=fold_base_ref[pos], ring_len=L,
          copy_ref=copy_ref)

    def epilogue_inputs():  # everything the epilogue reads, as loaded
      valid, _ = history_mask(write_pos, cache_base, L)
      return _EpilogueInputs(
          d_hist=load_history(ring_d_ref.at[slot, h, :, vs], valid),  # [L, BV] ring dtype
          v_raw=v_ref[row, jnp.minimum(tok, T - 1), h, vs],  # [T_pad, BV], rows past T repeat
          zh=zh_ref[row, h], P=zt_ref[row, h, _P], Dy=zt_ref[row, h, _DY],
          M=zt_ref[row, h, _M], eq=eq_ref[row, h, :],
          s_q=xs_ref[row, kh, pl.ds(0, T_pad)], s_k=xs_ref[row, kh, pl.ds(T_pad, T_pad)])

    def y_free_terms(e: _EpilogueInputs):  # the epilogue's products that need no Y
      H_d, H_o = jnp.split(dot(e.zh, e.d_hist.astype(jnp.float32), precision_l), 2, axis=0)
      v = jnp.where((tok < T)[:, None], e.v_raw.astype(jnp.float32), 0.0)
      # The norms on the [T] and [T, T] factors, not the [2T, BV] Y (2.4 us more at B=256).
      return dot(e.P, v, precision_t), H_d, H_o, e.Dy * e.s_k[None, :], e.eq * e.s_q

    inputs = epilogue_inputs() if early != "none" else None  # loads ahead of the loop's
    terms = y_free_terms(inputs) if early == "products" else None

    def chunk(c, Y):  # Y += X[:, chunk] S0[:, chunk]^T: a loop Triton software-pipelines
      ks = pl.ds(pl.multiple_of(c * k_chunk, k_chunk), k_chunk)
      x = x_ref[row, kh, :, ks]
      if x.dtype != ssm_ref.dtype:  # the raw window, exact in a tf32 dot of the fp32 checkpoint
        x = x.astype(jnp.float32)
      # The checkpoint's bf16 copy with a bf16 window: a bf16 dot (`SpecConfig.checkpoint_copy`).
      return Y + dot_nt(x, ssm_ref[slot, h, vs, ks].astype(x.dtype), precision_k)

    Y = jax.lax.fori_loop(0, K // k_chunk, chunk, jnp.zeros((2 * T_pad, block_v), jnp.float32))
    Y_q, Y_k = jnp.split(Y, 2, axis=0)  # of the raw X: its rows' norms scale eq and Dy below
    if inputs is None:
      inputs = epilogue_inputs()
    Pv, H_d, H_o, Dy, eq = y_free_terms(inputs) if terms is None else terms
    D = Pv + dot(Dy, Y_k, precision_t) + H_d
    O = eq[:, None] * Y_q + H_o + dot(inputs.M, D, precision_t)
    v_raw = inputs.v_raw

    phys = ((cache_base + write_pos + tok) & (L - 1))[:, None]  # [T_pad, 1]
    store_rows(o_ref, (row, p.rows_v[0], h, p.rows_v[1]), O, p.mask_v)
    store_rows(ring_d_out_ref, (slot, h, phys, p.rows_v[1]), D, p.mask_v)
    store_rows(ring_rawv_out_ref, (slot, h, phys, p.rows_v[1]), v_raw, p.mask_v)


COEFFICIENTS = ("pallas", "xla")
# What of the stream's epilogue (the products with the d history, v and the coefficients
# kernel's factors, none of which needs Y) comes before its K-loop: "none", all after it;
# "loads", the epilogue's loads, whose latency then hides under the loop's instead of
# following it; "products", those loads and every product that needs no Y. The same bits.
# H200, 20 reps (benchmarks/NOTES.md run 28), replay verify B=64 / 256: none 56.4-56.7 /
# 177.7-178.0 us, loads 54.3-54.5 / 177.6-178.0, products 54.7 / 177.8-178.1.
# Not in the stream that folds: its 168 registers a thread hold it at 3 programs an SM, and
# what the loads first hold through the loop would cost it one (sm_90 compile: 127 -> 160).
STREAM_EARLIES = ("none", "loads", "products")
STREAM_EARLY = "loads"
# `fold_replay_verify_split` streams all rows in one launch, a folding row's programs folding
# their tiles first (run 9); the fold's code costs every program registers (B=256, no row
# folding: 181 against the plain stream's 158 us, benchmarks/NOTES.md run 10), but a launch of
# the folding rows of their own lost (run 11). Whether that launch starts the folding rows'
# programs first, in the order of `launch_order.fold_first_order_pallas` (one 2.0 us kernel),
# so the step does not wait on folding programs started last (`backend.row_grid`'s order):
# H200, B=256 (runs 12 and 13), decode with the rows out of phase 219.1 -> 205.1 us, in phase
# about even.
STREAM_FOLD_FIRST = True
# Whether the stream's fold loads record i + 1 before applying record i (`fold.fold_rows`).
# Without, the stream is faster when no row folds (B=256: 223 -> 208 us) but the fold slower
# (707 -> 733), and the decode cycle lost 1.5-2.3 us (benchmarks/NOTES.md run 10). Issued after
# the update, as the fold kernel's since run 18 (`fold.FOLD_PREFETCH_AT`), they cost the stream:
# B=256 mixed step 372 -> 396 us, decode cycle 206 -> 213; the stream loads them first.
STREAM_FOLD_PREFETCH = True
# Whether the stream folds a program's tiles (``block_v // fold_block_v`` of them) in one record
# loop, or one after the other. In one loop it loses (H200, B=256, run 15): 12 records 687.5 ->
# 734.6 us, a step without a fold 220 -> 258: its registers go from 168 to 244 a thread, and its
# programs per SM from 3 to 2.
STREAM_FOLD_INTERLEAVE = False
# The cache level the stream's folding programs prefetch their records to (`fold.FoldLoop`'s
# ``prefetch_records_to``): "L1", "L2" or "off". Where the fold kernel gains 7%, the stream loses
# (H200, B=256, every row folding 12 records, benchmarks/NOTES.md run 24: 682.2 -> 694.3 us to
# L1, 693.3 to L2; a step without a fold even): off.
STREAM_FOLD_PREFETCH_RECORDS_TO = "off"


_SPLIT_STATIC = ("tuning", "dot_precision", "interpret", "coefficients", "coefficient_warps",
                 "coefficient_inline", "coefficient_key_mma", "coefficient_loads_first",
                 "coefficient_history_scan", "coefficient_reciprocal_norms",
                 "coefficient_window_mma")


@functools.partial(jax.jit, static_argnames=_SPLIT_STATIC)
def replay_verify_split(ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv,
                        q, k, v, a, b, A_log, dt_bias, slot_ids, write_pos, cache_base, *,
                        tuning: KernelTuning, dot_precision: str, interpret: bool,
                        coefficients: str = "pallas", coefficient_warps: int = COEFFICIENT_WARPS,
                        coefficient_inline: int | None = COEFFICIENT_INLINE,
                        coefficient_key_mma: bool | None = COEFFICIENT_KEY_MMA,
                        coefficient_loads_first: bool | None = COEFFICIENT_LOADS_FIRST,
                        coefficient_history_scan: bool | None = None,
                        coefficient_reciprocal_norms: bool | None = None,
                        coefficient_window_mma: bool | None = None):
  """`replay_verify.replay_verify` as coefficients, then the checkpoint stream.

  ``tuning.block_v`` and the launch parameters apply to the stream kernel, whose K-loop
  steps ``tuning.k_chunk`` columns. ``coefficients``: ``"pallas"``, the kernel, one program
  of ``coefficient_warps`` per (row, key head), its small products written out up to
  ``coefficient_inline`` multiplies (`replay_parts.dot`), its key history products on the
  tensor cores when ``coefficient_key_mma`` (`_key_products_mma`; None: from T = 2 on), every
  load issued before the arithmetic when ``coefficient_loads_first`` (None: by T and the
  programs, `COEFFICIENT_LOADS_FIRST`), its history weights by a running sum when
  ``coefficient_history_scan`` (None: `COEFFICIENT_HISTORY_SCAN`), the window normalised by
  one division a row when ``coefficient_reciprocal_norms`` (None:
  `COEFFICIENT_NORM_RECIPROCAL`), its window's own products on the tensor cores when
  ``coefficient_window_mma`` (bf16 activations; None: `COEFFICIENT_WINDOW_MMA` from T = 2), or
  ``"xla"``, batched XLA ops (`_coefficients_xla`).
  Inputs are checked by the caller.
  """
  o, _, rings = _split(ssm, (ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv),
                       (q, k, v, a, b, A_log, dt_bias), (slot_ids, write_pos, cache_base), None,
                       tuning=tuning, fold=None, dot_precision=dot_precision,
                       interpret=interpret, launch=CoefficientLaunch(
                           coefficients, coefficient_warps, coefficient_inline,
                           coefficient_key_mma, coefficient_loads_first,
                           coefficient_history_scan, coefficient_reciprocal_norms,
                           coefficient_window_mma))
  return o, *rings


@functools.partial(jax.jit, static_argnames=(*_SPLIT_STATIC, "fold_tuning", "fold_block_v",
                                             "prefetch", "fold_interleave", "fold_first",
                                             "fold_prefetch_records_to"))
def fold_replay_verify_split(ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv,
                             q, k, v, a, b, A_log, dt_bias, slot_ids, write_pos, cache_base,
                             fold_count, fold_base, *, tuning: KernelTuning,
                             fold_tuning: KernelTuning, dot_precision: str, interpret: bool,
                             fold_block_v: int | None = None, prefetch: bool | None = None,
                             fold_interleave: bool | None = None,
                             fold_first: bool | None = None,
                             fold_prefetch_records_to: str | None = None,
                             coefficients: str = "pallas",
                             coefficient_warps: int = COEFFICIENT_WARPS,
                             coefficient_inline: int | None = COEFFICIENT_INLINE,
                             coefficient_key_mma: bool | None = COEFFICIENT_KEY_MMA,
                             coefficient_loads_first: bool | None = (
                                 COEFFICIENT_LOADS_FIRST),
                             coefficient_history_scan: bool | None = None,
                             coefficient_reciprocal_norms: bool | None = None,
                             coefficient_window_mma: bool | None = None,
                             ssm_copy: jax.Array | None = None):
  """`fold.fold` of ``fold_count[b]`` records from ring index ``fold_base[b]``, then
  `replay_verify_split`, with the fold inside the stream kernel.

  A folding row's stream programs replay its records into their checkpoint rows in place
  (`fold.fold_rows` in ``[fold_block_v, K]`` tiles held as ``fold_tuning.k_chunk`` chunks,
  ``prefetch`` as `fold.fold`, by default `STREAM_FOLD_PREFETCH`; a program's tiles one after
  the other or, with ``fold_interleave`` (default `STREAM_FOLD_INTERLEAVE`), in one record
  loop), then stream them for the window. ``write_pos`` and ``cache_base`` are the cursors
  after the fold (the coefficients see no history for a folded row). ``ssm`` is aliased:
  updated in place. ``fold_first`` (default `STREAM_FOLD_FIRST`): the folding rows' programs
  launched first (`launch_order.fold_first_order_pallas`);
  ``fold_prefetch_records_to`` (default `STREAM_FOLD_PREFETCH_RECORDS_TO`): the cache level
  a folding program prefetches its records to, or "off". The same bits. With ``ssm_copy``
  (the checkpoints' bf16 copy, `SpecConfig.checkpoint_copy`; aliased), a folding program
  also rewrites its copy tile (`fold.fold_rows`) and the stream reads the copy, as
  `replay_verify_split` of the copy after `fold.fold` with it.

  The bitwise tie: rows are independent, but the order of each sum over K follows how Triton
  lays a ``[fold_block_v, k_chunk]`` chunk over the program's threads. The default,
  `stream_fold_block_v`, gives each of the stream's warps as many rows as a warp of the
  recurrent kernels holds, so both get the same layout (H200, K=V=128: bitwise, and so are
  32-row tiles; benchmarks/NOTES.md run 9). Another ``fold_block_v`` may lay K out otherwise:
  `bench.sweep` checks it.

  Returns:
    ``(o, ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv)``, with ``ssm_copy``
    the pair ``(ssm, ssm_copy)`` in ``ssm``'s place.
  """
  fold_block_v = fold_block_v or stream_fold_block_v(tuning, fold_tuning)
  if fold_block_v < 1 or tuning.block_v % fold_block_v:
    raise ValueError(f"the stream's block_v={tuning.block_v} must be a multiple of the fold's "
                     f"block_v={fold_block_v}.")
  loop = fold_kernels.FoldLoop(
      block_v=fold_block_v, k_chunk=fold_tuning.k_chunk,
      prefetch=STREAM_FOLD_PREFETCH if prefetch is None else prefetch,
      interleave=STREAM_FOLD_INTERLEAVE if fold_interleave is None else fold_interleave,
      prefetch_records_to=fold_kernels.records_level(fold_prefetch_records_to,
                                                     STREAM_FOLD_PREFETCH_RECORDS_TO),
      copy_halves_first=False)  # the stream's registers (`fold.FoldLoop`)
  fold = StreamFold(loop=loop, first=STREAM_FOLD_FIRST if fold_first is None else fold_first,
                    compiled=not interpret, copy=ssm_copy is not None)
  checkpoint, ssm = (ssm, ssm_copy) if fold.copy else (None, ssm)
  o, ssm, rings = _split(ssm, (ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv),
                         (q, k, v, a, b, A_log, dt_bias), (slot_ids, write_pos, cache_base),
                         (fold_count, fold_base), tuning=tuning, fold=fold,
                         dot_precision=dot_precision, interpret=interpret,
                         launch=CoefficientLaunch(
                             coefficients, coefficient_warps, coefficient_inline,
                             coefficient_key_mma, coefficient_loads_first,
                             coefficient_history_scan, coefficient_reciprocal_norms,
                             coefficient_window_mma), checkpoint=checkpoint)
  return o, ssm, *rings


def _choice(name: str, value: str, choices: tuple[str, ...]) -> str:
  """``value``, if it is one of ``choices`` (else a ValueError that names them)."""
  if value not in choices:
    raise ValueError(f"{name}={value!r} is unknown; use one of {choices}.")
  return value


def stream_fold_block_v(tuning: KernelTuning, fold_tuning: KernelTuning) -> int:
  """Rows of the tiles a verify program launched with ``tuning`` (the stream's, or the one-kernel
  forms', `replay_verify.fold_and_replay_verify`) folds in: as many per warp as the recurrent
  kernels' (``fold_tuning``) tiles have, so a chunk is laid out alike; 0 if that is no whole
  number of rows, or no whole number of such tiles makes the program's ``tuning.block_v``."""
  rows_per_warp, rest = divmod(fold_tuning.block_v, fold_tuning.num_warps)
  rows = rows_per_warp * tuning.num_warps
  return 0 if rest or not rows or tuning.block_v % rows else rows


def _split(ssm, rings, window, cursors, fold_rows, *, tuning: KernelTuning,
           fold: StreamFold | None, dot_precision: str, interpret: bool,
           launch: CoefficientLaunch, checkpoint=None):
  """The coefficients, then the stream launch(es) reading ``ssm``; ``fold_rows = (fold_count,
  fold_base)`` with ``fold``, else None; with ``fold.copy``, ``ssm`` is the copy and
  ``checkpoint`` the fp32 checkpoint the fold replays into. Returns ``(o, ssm, rings)``, with
  ``fold.copy`` ``(o, (checkpoint, ssm), rings)``."""
  ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv = rings
  q, _, v = window[:3]
  slot_ids = cursors[0]
  _choice("coefficients", launch.form, COEFFICIENTS)
  T, H = q.shape[1:3]
  HV, L = v.shape[2], ring_g.shape[-1]
  mma = functools.partial(mma_algorithm, interpret=interpret)
  common = dict(T=T, L=L, gqa_ratio=HV // H, precision_t=mma("ieee", T))

  scratch, (ring_k, ring_g, ring_beta, ring_rawk) = _coefficients(
      window, (ring_k, ring_g, ring_beta, ring_rawk), cursors, launch=launch,
      dot_precision=dot_precision, interpret=interpret, common=common)

  stream = functools.partial(_stream, v, scratch, tuning=tuning, interpret=interpret,
                             dot_precision=dot_precision, common=common)

  if fold is None:
    o, ring_d, ring_rawv = stream(cursors, ssm, ring_d, ring_rawv)
  else:  # the stream launch that folds
    fold_inputs, row_cursors, row_folds = (ring_rawk, ring_g, ring_beta), cursors, fold_rows
    if fold.copy:
      fold_inputs += (checkpoint,)
    if fold.first:  # the row arrays in launch order (`tile_program`)
      order, *in_order = fold_first_order_pallas(fold_rows[0], slot_ids, *cursors, *fold_rows,
                                                 interpret=interpret)
      row_cursors, row_folds = in_order[:len(cursors)], in_order[len(cursors):]
      fold_inputs += (order,)
    o, ring_d, ring_rawv, ssm, *folded = stream(row_cursors, ssm, ring_d, ring_rawv, fold=fold,
                                                fold_rows=row_folds, fold_inputs=fold_inputs)
    if fold.copy:
      ssm = (folded[0], ssm)
  return o, ssm, (ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv)


def _or(value, knob):
  """``value``, or the module ``knob`` when it is None (read at trace time)."""
  return knob if value is None else value


def _coefficients(window, key_rings, cursors, *, launch: CoefficientLaunch, dot_precision: str,
                  interpret: bool, common: dict):
  """One launch of `_coefficients_kernel` (or `_coefficients_xla`): ``(scratch, key_rings)``,
  the stream's ``(x, xs, zh, zt, eq)`` and ``(ring_k, ring_g, ring_beta, ring_rawk)`` with the
  window's records written in place."""
  q, k, _, a, b, A_log, dt_bias = window
  slot_ids, write_pos, cache_base = cursors
  B, T, H, K = q.shape
  HV, L = a.shape[2], common["L"]
  T_pad, f32 = next_power_of_two(T), jnp.float32
  if launch.form == "xla":
    return _coefficients_xla(q, k, a, b, A_log, dt_bias, *key_rings, slot_ids, write_pos,
                             cache_base)
  mma = functools.partial(mma_algorithm, interpret=interpret)
  key_mma = T > 1 if launch.key_mma is None else launch.key_mma
  window_mma = launch.window_mma
  if window_mma is None:
    window_mma = COEFFICIENT_WINDOW_MMA and T > 1 and q.dtype == jnp.bfloat16
  elif window_mma and q.dtype != jnp.bfloat16:
    raise ValueError(f"coefficient_window_mma needs bfloat16 activations (its products are "
                     f"exact only for bf16 operands); q is {q.dtype}.")
  loads_first = ((T == 1 or B * H <= LOADS_FIRST_MAX_PROGRAMS)
                 if launch.loads_first is None else launch.loads_first)
  scratch = (jax.ShapeDtypeStruct((B, H, 2 * T_pad, K), q.dtype),
             jax.ShapeDtypeStruct((B, H, 2 * T_pad), f32),
             jax.ShapeDtypeStruct((B, HV, 2 * T_pad, L), f32),
             jax.ShapeDtypeStruct((B, HV, 3, T_pad, T_pad), f32),
             jax.ShapeDtypeStruct((B, HV, T_pad), f32))
  inputs = (slot_ids, write_pos, cache_base, q, k, a, b, A_log, dt_bias, *key_rings)
  *scratch, ring_k, ring_g, ring_beta, ring_rawk = pl.pallas_call(
      functools.partial(_coefficients_kernel, scale=K ** -0.5, inline=launch.inline,
                        key_mma=key_mma, loads_first=loads_first,
                        history_scan=_or(launch.history_scan, COEFFICIENT_HISTORY_SCAN),
                        reciprocal_norms=_or(launch.reciprocal_norms, COEFFICIENT_NORM_RECIPROCAL),
                        window_mma=window_mma, precision_k=mma(dot_precision, K),
                        precision_w=mma("bf16", K), **common),
      out_shape=(*scratch, *(jax.ShapeDtypeStruct(r.shape, r.dtype) for r in key_rings)),
      grid=row_grid(B, H),
      input_output_aliases={len(inputs) - 4 + i: len(scratch) + i for i in range(4)},
      interpret=interpret,
      compiler_params=KernelTuning(num_warps=launch.warps, num_stages=1).compiler_params(),
      name=f"replay_coefficients_T{T}",
  )(*inputs)
  return tuple(scratch), (ring_k, ring_g, ring_beta, ring_rawk)


def _stream(v, scratch, cursors, ssm, ring_d, ring_rawv, *, tuning: KernelTuning,
            interpret: bool, dot_precision: str, common: dict, fold: StreamFold | None = None,
            fold_rows=(), fold_inputs=()):
  """One launch of `_stream_kernel`; ``ring_d``, ``ring_rawv`` (and with ``fold`` ``ssm``)
  updated in place. With ``fold``: ``fold_rows = (fold_count, fold_base)`` and ``fold_inputs
  = (ring_rawk, ring_g, ring_beta)``, then with ``fold.copy`` the fp32 checkpoint behind
  ``ssm``, the copy (updated in place), then with ``fold.first`` the rows' launch order, in
  which ``cursors`` and ``fold_rows`` then come (`tile_program`). Returns ``(o, ring_d,
  ring_rawv)``, then ``ssm`` with ``fold``, then the checkpoint with ``fold.copy``."""
  B, _, HV, V = v.shape
  K = ssm.shape[-1]
  kc = min(tuning.k_chunk, K)
  if fold is not None and fold.copy and kc == min(fold.loop.k_chunk, K) and kc >= 16:
    # Chunks of the bf16 copy as wide as the fold's fp32 chunks lend the fold their layout
    # (sm_90, K=16, V=64: the record loop's K-sums 8 -> 5 shuffles, and on an H100 the folded
    # state 1 ulp off the recurrent one, NOTES.md session 47); half as wide, they do not.
    kc //= 2
  mma = functools.partial(mma_algorithm, interpret=interpret)
  inputs = [*cursors, v, ssm, *scratch, ring_d, ring_rawv, *fold_rows, *fold_inputs]
  first_ring = len(cursors) + 2 + len(scratch)
  aliases = {first_ring: 1, first_ring + 1: 2}  # ring_d, ring_rawv
  out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (v, ring_d, ring_rawv)]
  if fold is not None:  # the folded checkpoint (or copy) is a fourth output, in place
    aliases[len(cursors) + 1] = 3
    out_shape.append(jax.ShapeDtypeStruct(ssm.shape, ssm.dtype))
  if fold is not None and fold.copy:  # and the fp32 checkpoint behind the copy a fifth
    at = first_ring + 2 + len(fold_rows) + 3  # after ring_rawk, ring_g and ring_beta
    checkpoint, aliases[at] = inputs[at], 4
    out_shape.append(jax.ShapeDtypeStruct(checkpoint.shape, checkpoint.dtype))
  return pl.pallas_call(
      functools.partial(_stream_kernel, block_v=tuning.block_v, k_chunk=kc,
                        precision_k=mma(dot_precision, kc),
                        precision_l=mma(dot_precision, common["L"]),
                        fold=fold, early="none" if fold else _choice(
                            "STREAM_EARLY", STREAM_EARLY, STREAM_EARLIES), **common),
      out_shape=tuple(out_shape),
      grid=((HV, V // tuning.block_v, B) if fold and fold.first
            else row_grid(B, HV, V // tuning.block_v)),
      input_output_aliases=aliases,
      interpret=interpret,
      compiler_params=tuning.compiler_params(),
      name=f"replay_stream_T{common['T']}_bv{tuning.block_v}_w{tuning.num_warps}_kc{kc}"
           f"{'_fold' if fold else ''}",
  )(*inputs)
