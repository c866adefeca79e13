"""ReplaySSM verify: window outputs from checkpoint + ring history (DESIGN sections 1, 3, 5).

Per row (slot ``slot_ids[b]``) and value head h (key head ``h // (HV // H)``), with
ring length L and ``phys(i) = (cache_base + i) & (L - 1)``:

History (logical records ``i < write_pos``, read at ``phys(i)``): ``d_i, k_hat_i, g_i``,
``G_m = sum_i g_i``, ``w_i = exp(G_m - G_i) = exp(sum_{i < l < m} g_l)``. The state after it is
never formed; the replay identity applies it to a vector x:

    S_hist x = exp(G_m) (S0 x) + sum_i w_i (k_hat_i . x) d_i                    (S0 = ssm[slot, h])

Window (tokens s = 0..T-1 from `token_inputs`; ``Gamma_s = g_0 + ... + g_s``), the UT transform
(research/replayssm-algorithm.md section 1.3):

    W_q[s] = S_hist q_hat_s,   W_k[s] = S_hist k_hat_s
    A[s, j] = beta_s exp(Gamma_s - Gamma_j) (k_hat_s . k_hat_j)    for j < s
    D = (I + A)^-1 R,   R[s] = beta_s (v_s - exp(Gamma_s) W_k[s])     (the window's d records)
    o_s = exp(Gamma_s) W_q[s] + sum_{j <= s} exp(Gamma_s - Gamma_j) (q_hat_s . k_hat_j) d_j

which equals stepping `reference.delta_rule_step` from S_hist through the window. The records
(d, k_hat, g, beta, raw k, raw v) of token s go to logical position ``write_pos + s``; every
other ring entry is left bitwise untouched, and ``ssm`` is only read. A row with
``slot_ids[b] < 0`` is padding: zero output, no write.

Forms of the same math (`backend.replay_form` picks by T and B): from B = 16 the ``"split"``
form (`replay_split`: the window's coefficients once per (row, key head), then a pipelined
stream of the checkpoint; ``"split-xla"`` computes the coefficients in XLA), and below it
the one-kernel forms here, grid (B, HV, V // BV), one program per ``[BV, K]`` checkpoint tile,
whole-array refs indexed by the row's slot (as `recurrent.py`), no loop: ``"ut"``, below,
holds the window as ``[T, K]`` tiles and uses tensor-core dots (T >= 2); ``"vec"``
(`_replay_verify_vec_kernel`) holds T separate vectors and the checkpoint as K-chunks
(`tile`), with no dots (decode, T = 1).

- T need not be a power of two, but every Triton tensor must be (jax-ecosystem.md section
  1.5). The window is held as ``T_pad = next_power_of_2(T)`` rows, gathered with the token
  index clamped to T - 1 and zeroed past T (zero rows add nothing to any product), and
  stored by masked scatters (`pltriton.store` with all-array indices) that skip those rows,
  so the caller sees no padding and no extra copy.
- The window's records scatter to ``phys(write_pos + s)`` in one store per array; g and beta
  come from the program with V-block 0, k_hat and raw k from V-block 0 of the first value
  head of each key head: one writer for each element.
- The ring history (``[L, BV]`` d, ``[L, K]`` k_hat) is loaded only at the rows whose logical
  index ``(p - cache_base) & (L - 1)`` is below ``write_pos`` (`replay_parts.load_history`, a
  masked load: zero elsewhere), so stale or NaN records never reach a register, a short
  history moves only its own rows, and the concurrent window writes of other programs to the
  same rows are never looked at; the ``[L]`` gates are read whole and selected.
- Matrix products are 2-D dots on ``X = [q_hat; k_hat]`` (``[2 T_pad, K]``): ``X S0^T``,
  ``X K_hist^T``, then ``[L]``-contracted with the weighted d history, and the ``[T, T]``
  window products (see `backend.mma_algorithm` for their precisions). ``(I + A)^-1`` is a
  forward substitution unrolled over T.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from replayssm_jax import reference
from replayssm_jax.config import DOT_PRECISIONS, next_power_of_two
from replayssm_jax.kernels import fold as fold_kernels
from replayssm_jax.kernels import replay_split, tile
from replayssm_jax.kernels.backend import (KernelTuning, mma_algorithm, replay_form, row_grid,
                                          row_ids)
from replayssm_jax.kernels.recurrent import token_inputs
from replayssm_jax.kernels.replay_parts import (dot, dot_nt, history_weights, load_gates,
                                                load_history, load_keys, scatter_records,
                                                store_rows, tile_program, window_solve)
from replayssm_jax.state import ReplayCache, logical_order

RING_NAMES = ReplayCache.RINGS
RING_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))
# The checkpoint as the verify may read it: fp32, or its bf16 copy (`SpecConfig.checkpoint_copy`).
CHECKPOINT_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
# The (I + A) inverse is unrolled T - 1 times; the [2 T, K] window tile lives in registers
# (H200: T=8 ran in 546 us at B=256, T=16 in 8.6 ms, spilling).
MAX_DRAFT_TOKENS = 16
FORMS = ("ut", "vec", "split", "split-xla")


def _replay_verify_kernel(
    # inputs
    slot_ids_ref,  # [B] int32
    write_pos_ref,  # [B] int32
    cache_base_ref,  # [B] int32
    q_ref,  # [B, T, H, K] activation
    k_ref,  # [B, T, H, K] activation
    v_ref,  # [B, T, HV, V] activation
    a_ref,  # [B, T, HV] activation
    b_ref,  # [B, T, HV] activation
    A_log_ref,  # [HV] f32
    dt_bias_ref,  # [HV] f32
    ssm_ref,  # [slots, HV, V, K] f32, read only
    ring_d_ref,  # [slots, HV, L, V] ring dtype (aliased with ring_d_out_ref)
    ring_k_ref,  # [slots, H, L, K] ring dtype (aliased)
    ring_g_ref,  # [slots, HV, L] f32 (aliased)
    ring_beta_ref,  # [slots, HV, L] f32 (aliased; not read)
    ring_rawk_ref,  # [slots, H, L, K] activation (aliased; not read)
    ring_rawv_ref,  # [slots, HV, L, V] activation (aliased; not read)
    # outputs
    o_ref,  # [B, T, HV, V] activation
    ring_d_out_ref,  # [slots, HV, L, V] ring dtype
    ring_k_out_ref,  # [slots, H, L, K] ring dtype
    ring_g_out_ref,  # [slots, HV, L] f32
    ring_beta_out_ref,  # [slots, HV, L] f32
    ring_rawk_out_ref,  # [slots, H, L, K] activation
    ring_rawv_out_ref,  # [slots, HV, L, V] activation
    *,
    T: int,
    L: int,
    gqa_ratio: int,
    block_v: int,
    scale: float,
    precision_k,
    precision_l,
    precision_t,
    k_chunk: int,
):
  del ring_beta_ref, ring_rawk_ref, ring_rawv_ref  # written only, through the aliased outputs
  del k_chunk  # the window products are dots over whole [*, K] tiles
  p = tile_program(slot_ids_ref, o_ref, T=T, gqa_ratio=gqa_ratio, block_v=block_v)
  row, h, j, kh, slot, vs, tok = p.row, p.h, p.j, p.kh, p.slot, p.vs, p.tok
  K = q_ref.shape[-1]
  T_pad = tok.shape[0]

  @pl.when(slot >= 0)
  def _verify():
    write_pos, cache_base = write_pos_ref[row], cache_base_ref[row]
    # precision_k / _l / _t: the dots contracting over K, L and the window (`mma_algorithm`).
    win = load_keys(q_ref, k_ref, row, kh, T, scale)
    gates = load_gates(a_ref, b_ref, A_log_ref[h], dt_bias_ref[h], row, h, T)
    v_raw = v_ref[row, jnp.minimum(tok, T - 1), h, vs]  # [T_pad, BV]
    v = jnp.where(win.in_window[:, None], v_raw.astype(jnp.float32), 0.0)
    X = win.X  # [q_hat; k_hat]

    decay_all, w, valid = history_weights(write_pos, cache_base, ring_g_ref[slot, h, :])
    d_hist = load_history(ring_d_ref.at[slot, h, :, vs], valid).astype(jnp.float32)
    k_hist = load_history(ring_k_ref.at[slot, kh, :, :], valid).astype(jnp.float32)

    # [W_q; W_k] = exp(G_m) X S0^T + ((X K_hist^T) * w) D_hist              [2 T_pad, BV]
    # A tensor-core dot beat multiply-reduce here (H200, B=256, T=4: 396 vs 736 us;
    # benchmarks/NOTES.md run 2), even though it reshuffles the checkpoint tile.
    S0 = ssm_ref[slot, h, vs, :].astype(jnp.float32)  # the fp32 checkpoint or its bf16 copy
    W = decay_all * dot_nt(X, S0, precision_k)
    W = W + dot(dot_nt(X, k_hist, precision_k) * w[None, :], d_hist, precision_l)
    W_q, W_k = jnp.split(W, 2, axis=0)
    # [T_pad, T_pad]: q_hat_s . k_hat_j and k_hat_s . k_hat_j
    qk, kk = jnp.split(dot_nt(X, win.k_hat, precision_t), 2, axis=0)

    Gamma, decay, Tinv = window_solve(gates.g_win, gates.beta_win, kk, T)
    R = gates.beta_win[:, None] * (v - jnp.exp(Gamma)[:, None] * W_k)
    D = dot(Tinv, R, precision_t)
    O = jnp.exp(Gamma)[:, None] * W_q + dot(decay * qk, D, precision_t)

    # The records go to logical write_pos + s; only the rows of the window are stored.
    phys = ((cache_base + write_pos + tok) & (L - 1))[:, None]  # [T_pad, 1]
    cols_k = jax.lax.broadcasted_iota(jnp.int32, (1, K), 1)
    mask_k = jnp.broadcast_to(win.in_window[:, None], (T_pad, K))
    store_rows(o_ref, (row, p.rows_v[0], h, p.rows_v[1]), O, p.mask_v)
    store_rows(ring_d_out_ref, (slot, h, phys, p.rows_v[1]), D, p.mask_v)
    store_rows(ring_rawv_out_ref, (slot, h, phys, p.rows_v[1]), v_raw, p.mask_v)

    @pl.when(j == 0)  # one writer per value head for g and beta
    def _():
      store_rows(ring_g_out_ref, (slot, h, phys[:, 0]), gates.g, win.in_window)
      store_rows(ring_beta_out_ref, (slot, h, phys[:, 0]), gates.beta, win.in_window)

    @pl.when((j == 0) & (h % gqa_ratio == 0))  # one writer per key head for k_hat and raw k
    def _():
      store_rows(ring_k_out_ref, (slot, kh, phys, cols_k), win.k_hat, mask_k)
      store_rows(ring_rawk_out_ref, (slot, kh, phys, cols_k), win.k_raw, mask_k)


def _replay_verify_vec_kernel(
    slot_ids_ref, write_pos_ref, cache_base_ref, q_ref, k_ref, v_ref, a_ref, b_ref,
    A_log_ref, dt_bias_ref, ssm_ref, ring_d_ref, ring_k_ref, ring_g_ref,
    ring_beta_ref, ring_rawk_ref, ring_rawv_ref,
    o_ref, ring_d_out_ref, ring_k_out_ref, ring_g_out_ref, ring_beta_out_ref,
    ring_rawk_out_ref, ring_rawv_out_ref,
    *, T: int, L: int, gqa_ratio: int, block_v: int, k_chunk: int, scale: float, **_):
  """The replay verify with the window as T separate vectors (same refs as the UT kernel).

  No tile is formed from the window: each token's q, k and v are loaded as vectors, the
  checkpoint (held as K-chunks, `tile`) is applied to each by multiply-reduce, and the d's come
  from the forward substitution written token by token (unrolled over T):

      d_s = beta_s (v_s - exp(Gamma_s) W_k[s] - sum_{j<s} exp(Gamma_s - Gamma_j) (k_s . k_j) d_j)
      o_s = exp(Gamma_s) W_q[s] + sum_{j<=s} exp(Gamma_s - Gamma_j) (q_s . k_j) d_j

  which is the UT transform's D row by row. Records are stored one token at a time.
  """
  del ring_beta_ref, ring_rawk_ref, ring_rawv_ref  # written only, through the aliased outputs
  row, h, j = row_ids()
  slot = slot_ids_ref[row]
  kh = h // gqa_ratio
  vs = pl.ds(j * block_v, block_v)
  K = q_ref.shape[-1]

  @pl.when(slot < 0)
  def _padding():
    for s in range(T):
      o_ref[row, s, h, vs] = jnp.zeros((block_v,), o_ref.dtype)

  @pl.when(slot >= 0)
  def _verify():
    write_pos, cache_base = write_pos_ref[row], cache_base_ref[row]
    S0 = tile.load(ssm_ref, (slot, h, vs), K, k_chunk)
    decay_all, w, valid = history_weights(write_pos, cache_base, ring_g_ref[slot, h, :])
    d_hist = load_history(ring_d_ref.at[slot, h, :, vs], valid).astype(jnp.float32)  # [L, BV]
    kc = min(k_chunk, K)
    k_hist = tuple(load_history(ring_k_ref.at[slot, kh, :, pl.ds(c * kc, kc)], valid).astype(
        jnp.float32) for c in range(K // kc))  # [L, KC] chunks

    # `tile`'s interpreter arithmetic (``compiled=False``) on every platform: this form's
    # outputs tie to nothing bitwise, and its GPU timings (runs 3-6) are of this arithmetic.
    arith = dict(compiled=False)

    def apply_hist(x):  # S_hist x = exp(G_m) S0 x + sum_i w_i (k_i . x) d_i       [BV]
      return (decay_all * tile.matvec(S0, x, **arith)
              + jnp.sum((tile.matvec(k_hist, x, **arith) * w)[:, None] * d_hist, axis=0))

    A_log, dt_bias = A_log_ref[h], dt_bias_ref[h]
    Gamma, ds, k_hats = [], [], []
    for s in range(T):
      q_hat = tile.normalized(q_ref, (row, s, kh), K, k_chunk, scale, **arith)
      k_hat = tile.normalized(k_ref, (row, s, kh), K, k_chunk, **arith)
      g, beta = reference.gdn_gating(a_ref[row, s, h], b_ref[row, s, h], A_log, dt_bias)
      Gamma.append(g if s == 0 else Gamma[-1] + g)
      u = v_ref[row, s, h, vs].astype(jnp.float32) - jnp.exp(Gamma[s]) * apply_hist(k_hat)
      o = jnp.exp(Gamma[s]) * apply_hist(q_hat)
      for i in range(s):
        decay = jnp.exp(Gamma[s] - Gamma[i])
        u = u - decay * tile.dot(k_hat, k_hats[i], **arith) * ds[i]
        o = o + decay * tile.dot(q_hat, k_hats[i], **arith) * ds[i]
      d = beta * u
      o = o + tile.dot(q_hat, k_hat, **arith) * d
      ds.append(d)
      k_hats.append(k_hat)

      p = (cache_base + write_pos + s) & (L - 1)
      o_ref[row, s, h, vs] = o.astype(o_ref.dtype)
      ring_d_out_ref[slot, h, p, vs] = d.astype(ring_d_out_ref.dtype)
      ring_rawv_out_ref[slot, h, p, vs] = v_ref[row, s, h, vs]

      @pl.when(j == 0)  # one writer per value head for g and beta
      def _():
        ring_g_out_ref[slot, h, p] = g
        ring_beta_out_ref[slot, h, p] = beta

      @pl.when((j == 0) & (h % gqa_ratio == 0))  # one writer per key head for k_hat and raw k
      def _():
        tile.store(ring_k_out_ref, (slot, kh, p), k_hat)
        ring_rawk_out_ref[slot, kh, p, :] = k_ref[row, s, kh, :]


# The one-kernel forms' record loop (`fold.FoldLoop`): a program's fold tiles in one loop, the next
# record loaded before the update, its k normalised where used (the fold kernel's loop of runs
# 15-17). The fold kernel's loop since run 18 (`fold.FOLD_PREFETCH_AT`) is slower here: H200
# (benchmarks/NOTES.md run 18), the flush step at B=1 16.9 -> 19.9 us, at B=8 33.2 -> 36.9.
ONE_KERNEL_FOLD_PREFETCH = True
ONE_KERNEL_FOLD_INTERLEAVE = True
ONE_KERNEL_FOLD_NORMALIZE_AHEAD = False
ONE_KERNEL_FOLD_PREFETCH_AT = "start"


_INPUTS, _SSM = 17, 10  # the verify kernels' inputs (slot_ids to ring_rawv); ssm's place


def _fold_first_kernel(*refs, verify_kernel, fold: fold_kernels.FoldLoop, compiled: bool, **kw):
  """``verify_kernel`` (the UT or the vector form) on checkpoint tiles it first folds in place.

  ``refs``: the verify kernel's inputs, then fold_count and fold_base ``[B]`` int32, its
  outputs, then the checkpoint (aliased with the input ``ssm``). A row with ``fold_count > 0``
  replays that many records from ring index ``fold_base`` into the program's ``[BV, K]`` rows
  (`fold.fold_before_read`) before the verify reads them: one launch and one read of the
  checkpoint, in place of a fold kernel and then the verify.
  """
  ins, (fold_count_ref, fold_base_ref) = refs[:_INPUTS], refs[_INPUTS:_INPUTS + 2]
  outs, ssm_ref = refs[_INPUTS + 2:-1], refs[-1]
  slot_ids_ref, *_, ring_g_ref, ring_beta_ref, ring_rawk_ref, ring_rawv_ref = ins
  row, h, j = row_ids()
  slot, block_v = slot_ids_ref[row], kw["block_v"]
  fold_kernels.fold_before_read(
      ssm_ref, ring_rawk_ref, ring_rawv_ref, ring_g_ref, ring_beta_ref,
      loop=fold, count=jnp.where(slot >= 0, fold_count_ref[row], 0), rows=block_v,
      compiled=compiled, first_row=j * block_v, slot=slot, h=h, kh=h // kw["gqa_ratio"],
      base=fold_base_ref[row], ring_len=kw["L"])
  verify_kernel(*ins[:_SSM], ssm_ref, *ins[_SSM + 1:], *outs, **kw)


def _check_inputs(ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv,
                  q, k, v, a, b, A_log, dt_bias, slot_ids, write_pos, cache_base):
  B, T, H, K = q.shape
  slots, HV, V, _ = ssm.shape
  L = ring_g.shape[-1]
  act, ring = q.dtype, ring_d.dtype
  f32, i32 = jnp.dtype(jnp.float32), jnp.dtype(jnp.int32)
  # The fp32 checkpoint or its bf16 copy (`SpecConfig.checkpoint_copy`); any other dtype is
  # reported against fp32.
  ssm_dtype = jnp.dtype(ssm.dtype) if jnp.dtype(ssm.dtype) in CHECKPOINT_DTYPES else f32
  expected = {  # name: (expected shape, expected dtype, array)
      "ssm": ((slots, HV, V, K), ssm_dtype, ssm), "k": ((B, T, H, K), act, k),
      "v": ((B, T, HV, V), act, v), "a": ((B, T, HV), act, a), "b": ((B, T, HV), act, b),
      "A_log": ((HV,), f32, A_log), "dt_bias": ((HV,), f32, dt_bias),
      "slot_ids": ((B,), i32, slot_ids), "write_pos": ((B,), i32, write_pos),
      "cache_base": ((B,), i32, cache_base),
      "ring_d": ((slots, HV, L, V), ring, ring_d), "ring_k": ((slots, H, L, K), ring, ring_k),
      "ring_g": ((slots, HV, L), f32, ring_g), "ring_beta": ((slots, HV, L), f32, ring_beta),
      "ring_rawk": ((slots, H, L, K), act, ring_rawk),
      "ring_rawv": ((slots, HV, L, V), act, ring_rawv),
  }
  for name, (shape, dtype, x) in expected.items():
    if tuple(x.shape) != shape or jnp.dtype(x.dtype) != dtype:
      raise ValueError(f"{name} is {jnp.dtype(x.dtype).name}{list(x.shape)}; expected "
                       f"{dtype.name}{list(shape)} (q is {act.name}{list(q.shape)}, "
                       f"ssm is {list(ssm.shape)}, ring_d is {ring.name}{list(ring_d.shape)}).")
  if HV % H:
    raise ValueError(f"value heads HV={HV} must be a multiple of key heads H={H}.")
  if ring not in RING_DTYPES:
    raise ValueError(f"ring_d dtype {ring.name} must be bfloat16 or float32.")
  if L < T or L & (L - 1):
    raise ValueError(f"ring length L={L} must be a power of two >= T={T}; "
                     f"try L={next_power_of_two(2 * T)}.")


@functools.partial(jax.jit, static_argnames=("tuning", "dot_precision", "interpret", "form",
                                             "fold"))
def _replay_verify_call(ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv,
                        q, k, v, a, b, A_log, dt_bias, slot_ids, write_pos, cache_base,
                        fold_rows=None, *, tuning: KernelTuning, dot_precision: str,
                        interpret: bool, form: str, fold: fold_kernels.FoldLoop | None = None):
  """The one-kernel forms; with ``fold`` (and ``fold_rows = (fold_count, fold_base)``) their
  programs fold first (`_fold_first_kernel`) and the checkpoint is returned after the
  outputs, updated in place."""
  B, T, H, K = q.shape
  HV, V = v.shape[2], v.shape[3]
  verify_kernel = _replay_verify_vec_kernel if form == "vec" else _replay_verify_kernel
  if fold is not None:
    verify_kernel = functools.partial(_fold_first_kernel, verify_kernel=verify_kernel, fold=fold,
                                      compiled=not interpret)
  kernel = functools.partial(
      verify_kernel, T=T,
      k_chunk=tuning.k_chunk, L=ring_g.shape[-1], gqa_ratio=HV // H, block_v=tuning.block_v,
      scale=K ** -0.5, precision_k=mma_algorithm(dot_precision, K, interpret=interpret),
      precision_l=mma_algorithm(dot_precision, ring_g.shape[-1], interpret=interpret),
      precision_t=mma_algorithm("ieee", T, interpret=interpret))
  inputs = dict(slot_ids=slot_ids, write_pos=write_pos, cache_base=cache_base, q=q, k=k, v=v,
                a=a, b=b, A_log=A_log, dt_bias=dt_bias, ssm=ssm, ring_d=ring_d, ring_k=ring_k,
                ring_g=ring_g, ring_beta=ring_beta, ring_rawk=ring_rawk, ring_rawv=ring_rawv)
  outputs = ("o", *RING_NAMES)
  if fold is not None:
    inputs.update(fold_count=fold_rows[0], fold_base=fold_rows[1])
    outputs += ("ssm",)
  out_shape = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype)
                    for x in (v, *(inputs[n] for n in outputs[1:])))
  return pl.pallas_call(
      kernel,
      out_shape=out_shape,
      grid=row_grid(B, HV, V // tuning.block_v),
      input_output_aliases={list(inputs).index(n): i for i, n in enumerate(outputs) if i},
      interpret=interpret,
      compiler_params=tuning.compiler_params(),
      name=f"{'fold_' * (fold is not None)}replay_verify_{form}_T{T}_bv{tuning.block_v}"
           f"_w{tuning.num_warps}",
  )(*inputs.values())


def replay_verify(ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv,
                  q, k, v, a, b, A_log, dt_bias, slot_ids, write_pos, cache_base, *,
                  tuning: KernelTuning, dot_precision: str, interpret: bool,
                  form: str | None = None):
  """Verify outputs of a T-token window from checkpoint + ring; window records into the rings.

  Args:
    ssm: ``f32[slots, HV, V, K]`` checkpoints (read only).
    ring_d: ``[slots, HV, L, V]`` d records, bf16 or f32 (the ring dtype); updated in place.
    ring_k: ``[slots, H, L, K]`` normalised keys, ring dtype; updated in place.
    ring_g, ring_beta: ``f32[slots, HV, L]`` gates; updated in place.
    ring_rawk: ``[slots, H, L, K]``, ring_rawv: ``[slots, HV, L, V]`` raw inputs in the
      activation dtype; updated in place.
    q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; a, b: ``[B, T, HV]`` (activation dtype).
    A_log, dt_bias: ``f32[HV]``.
    slot_ids: ``int32[B]``, -1 marks a padding row.
    write_pos, cache_base: ``int32[B]``, the row's slot cursors (``write_pos + T <= L``).
    tuning: ``block_v`` and the Triton launch parameters.
    dot_precision: ``"default"``, ``"tf32"``, ``"bf16"`` or ``"ieee"`` for the in-kernel dots.
    interpret: run the Pallas interpreter (CPU).
    form: ``"ut"``, the window as a ``[T, K]`` tile through tensor-core dots and the UT
      transform, ``"vec"``, T separate vectors by multiply-reduce (no dots), or ``"split"``,
      the window's coefficients once per (row, head) and then a pipelined stream of the
      checkpoint (`replay_split`), or ``"split-xla"``, the same with the coefficients as
      batched XLA ops; None picks `backend.replay_form` of (T, B).

  Returns:
    ``(o, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv)``, ``o [B, T, HV, V]`` in
    the dtype of v. Rows sharing a slot are not supported.

  Raises:
    ValueError: a shape, dtype, ring length or knob is off.
  """
  args = (ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv,
          q, k, v, a, b, A_log, dt_bias, slot_ids, write_pos, cache_base)
  form = _checked_form(args, tuning, dot_precision, form)
  if form.startswith("split"):
    return replay_split.replay_verify_split(
        *args, tuning=tuning, dot_precision=dot_precision, interpret=interpret,
        coefficients="xla" if form == "split-xla" else "pallas")
  return _replay_verify_call(*args, tuning=tuning, dot_precision=dot_precision,
                             interpret=interpret, form=form)


def check_fold_rows(fold_count, fold_base, slot_ids) -> None:
  """A fold's ``fold_count`` and ``fold_base``: int32, one a row."""
  for name, x in (("fold_count", fold_count), ("fold_base", fold_base)):
    if x.shape != slot_ids.shape or x.dtype != jnp.int32:
      raise ValueError(f"{name} is {jnp.dtype(x.dtype).name}{list(x.shape)}; expected "
                       f"int32{list(slot_ids.shape)}.")


def fold_and_replay_verify(ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv,
                           q, k, v, a, b, A_log, dt_bias, slot_ids, write_pos, cache_base,
                           fold_count, fold_base, *, tuning: KernelTuning,
                           fold_tuning: KernelTuning, dot_precision: str, interpret: bool,
                           form: str | None = None, fold_first: bool | None = None,
                           ssm_copy: jax.Array | None = None):
  """`fold.fold` of ``fold_count[b]`` records (ring index ``fold_base[b]`` on), then
  `replay_verify`, with the fold inside the verify: each program folds the checkpoint rows it
  reads in place first, in the split form's stream kernel
  (`replay_split.fold_replay_verify_split`) or in the one kernel of the UT and vector forms.
  With ``ssm_copy``, the checkpoints' bf16 copy (`SpecConfig.checkpoint_copy`; updated in
  place; the split forms only), a folding program rewrites its rows of the copy from the
  folded fp32 ones and the verify reads the copy: `fold.fold` with the copy, then
  `replay_verify` of the copy.

  Args: as `replay_verify`, with ``write_pos`` and ``cache_base`` the cursors after the fold,
  and ``fold_tuning`` the recurrent kernels' tuning (the fold's bitwise tie: a program folds
  in tiles of as many rows per warp as theirs, `replay_split.stream_fold_block_v`); ``ssm`` is
  updated in place. ``form`` None picks `backend.replay_form`. For the split forms,
  ``fold_first``: the folding rows' stream programs launched first (None:
  `replay_split.STREAM_FOLD_FIRST`).

  Returns:
    ``(o, ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv)``, with ``ssm_copy``
    the pair ``(ssm, ssm_copy)`` in ``ssm``'s place.
  """
  args = (ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv,
          q, k, v, a, b, A_log, dt_bias, slot_ids, write_pos, cache_base)
  if ssm_copy is not None:
    fold_kernels.check_copy(ssm, ssm_copy)
  form = _checked_form((ssm if ssm_copy is None else ssm_copy, *args[1:]), tuning,
                       dot_precision, form)
  check_fold_rows(fold_count, fold_base, slot_ids)
  fold_tuning.check(v.shape[-1], q.shape[-1])
  if ssm_copy is not None and not form.startswith("split"):
    # Their loads of the copy lend the fold's record loop their layout (sm_90, the vector
    # form at K=V=128: its K-sums 17 -> 9 shuffles): not the recurrent kernels' bits.
    raise ValueError(f"the {form} form does not fold with a checkpoint copy; fold first "
                     f"(`fold.fold` with ssm_copy), or use a split form.")
  if not form.startswith("split"):
    fold_block_v = replay_split.stream_fold_block_v(tuning, fold_tuning)
    if not fold_block_v:
      raise ValueError(
          f"the {form} form's programs ({tuning.block_v} rows, {tuning.num_warps} warps) cannot "
          f"fold in tiles of {fold_tuning.block_v // fold_tuning.num_warps} rows a warp, as the "
          f"recurrent kernels' ({fold_tuning.block_v} rows, {fold_tuning.num_warps} warps).")
    fold = fold_kernels.FoldLoop(block_v=fold_block_v, k_chunk=fold_tuning.k_chunk,
                                 prefetch=ONE_KERNEL_FOLD_PREFETCH,
                                 interleave=ONE_KERNEL_FOLD_INTERLEAVE,
                                 normalize_ahead=ONE_KERNEL_FOLD_NORMALIZE_AHEAD,
                                 prefetch_at=ONE_KERNEL_FOLD_PREFETCH_AT)
    o, *rings, ssm = _replay_verify_call(*args, (fold_count, fold_base), tuning=tuning,
                                         dot_precision=dot_precision, interpret=interpret,
                                         form=form, fold=fold)
    return o, ssm, *rings
  return replay_split.fold_replay_verify_split(
      *args, fold_count, fold_base, tuning=tuning, fold_tuning=fold_tuning,
      dot_precision=dot_precision, interpret=interpret,
      fold_first=replay_split.STREAM_FOLD_FIRST if fold_first is None else fold_first,
      coefficients="xla" if form == "split-xla" else "pallas", ssm_copy=ssm_copy)


def _checked_form(args, tuning: KernelTuning, dot_precision: str, form: str | None) -> str:
  """Check the inputs and knobs of a replay verify; the form to run."""
  q, v = args[7], args[9]
  _check_inputs(*args)
  tuning.check(v.shape[-1], q.shape[-1])
  if dot_precision not in DOT_PRECISIONS:
    raise ValueError(f"dot_precision={dot_precision!r} is unknown; use one of {DOT_PRECISIONS}.")
  if q.shape[1] > MAX_DRAFT_TOKENS:
    raise ValueError(f"T={q.shape[1]} draft tokens exceed the Pallas replay verify's "
                     f"{MAX_DRAFT_TOKENS}; use the xla backend.")
  form = form or replay_form(q.shape[1], q.shape[0])
  if form not in FORMS:
    raise ValueError(f"form={form!r} is unknown; use one of {FORMS}.")
  return form


# ----------------------------------------------------------------------------- reference


def _ring_history(ring, slot, cache_base):
  """``ring[slot]`` ``[B, heads, L, ...]`` in logical order, as records ``[B, L, heads, ...]``."""
  return logical_order(ring[jnp.maximum(slot, 0)], cache_base)


def replay_verify_reference(ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv,
                            q, k, v, a, b, A_log, dt_bias, slot_ids, write_pos, cache_base, **_):
  """Pure-jnp `replay_verify` (the ``xla`` backend), built on `reference.replay_apply`.

  Every dot runs at HIGHEST precision: ``tuning``, ``dot_precision`` and ``interpret`` are
  accepted and ignored. Padding rows read slot 0 and their results are dropped.
  """
  _check_inputs(ssm, ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv,
                q, k, v, a, b, A_log, dt_bias, slot_ids, write_pos, cache_base)
  B, T, H, K = q.shape
  HV, L = v.shape[2], ring_g.shape[-1]
  r = HV // H
  hp = jax.lax.Precision.HIGHEST
  q_hat, k_hat, v_win, g, beta = token_inputs(  # [B, T, HV, ...]
      jnp.repeat(q, r, axis=2), jnp.repeat(k, r, axis=2), v, a, b, A_log, dt_bias, K ** -0.5)

  # W_x = S_hist x by the replay identity over the logical history (reference.replay_apply).
  valid = jnp.arange(L)[None, :] < write_pos[:, None]  # [B, L]
  d_hist = _ring_history(ring_d, slot_ids, cache_base)  # [B, L, HV, V]
  k_hist = jnp.repeat(_ring_history(ring_k, slot_ids, cache_base), r, axis=2)
  g_hist = _ring_history(ring_g, slot_ids, cache_base)
  apply = jax.vmap(reference.replay_apply, in_axes=(None, None, None, None, 1, None), out_axes=1)
  S0 = ssm[jnp.maximum(slot_ids, 0)].astype(jnp.float32)
  W_q = apply(S0, d_hist, k_hist, g_hist, q_hat, valid)  # [B, T, HV, V]
  W_k = apply(S0, d_hist, k_hist, g_hist, k_hat, valid)
  # Order the ring writes after every history read (the fold's too: S0 depends on it), so
  # XLA updates the donated rings in place instead of copying them first.
  (W_q, W_k), (ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv) = jax.lax.optimization_barrier(
      ((W_q, W_k), (ring_d, ring_k, ring_g, ring_beta, ring_rawk, ring_rawv)))

  # The UT transform per (row, head), window axis s second to last.
  q_hat, k_hat, v_win, W_q, W_k = (jnp.moveaxis(x, 1, 2) for x in (q_hat, k_hat, v_win, W_q, W_k))
  g, beta = jnp.moveaxis(g, 1, 2), jnp.moveaxis(beta, 1, 2)  # [B, HV, T]
  tok = jnp.arange(T)
  causal, strict = tok[:, None] >= tok[None, :], tok[:, None] > tok[None, :]
  Gamma = jnp.cumsum(g, axis=-1)
  seg = jnp.where(causal, Gamma[..., :, None] - Gamma[..., None, :], 0)  # Gamma_s - Gamma_j
  decay = jnp.where(causal, jnp.exp(seg), 0)
  kk = jnp.einsum("...sk,...jk->...sj", k_hat, k_hat, precision=hp)
  qk = jnp.einsum("...sk,...jk->...sj", q_hat, k_hat, precision=hp)
  A = jnp.where(strict, beta[..., :, None] * decay * kk, 0)
  R = beta[..., None] * (v_win - jnp.exp(Gamma)[..., None] * W_k)
  D = jax.scipy.linalg.solve_triangular(jnp.eye(T, dtype=A.dtype) + A, R, lower=True,
                                        unit_diagonal=True)  # [B, HV, T, V]
  O = jnp.exp(Gamma)[..., None] * W_q + jnp.einsum("...sj,...jv->...sv", decay * qk, D,
                                                    precision=hp)
  o = jnp.where((slot_ids >= 0)[:, None, None, None], jnp.moveaxis(O, 2, 1), 0).astype(v.dtype)

  phys = (cache_base[:, None] + write_pos[:, None] + tok[None, :]) & (L - 1)  # [B, T]
  key_records = jnp.moveaxis(reference.l2_normalize(k.astype(jnp.float32)), 1, 2)  # [B, H, T, K]
  rings = (
      scatter_records(ring_d, slot_ids, phys, D),
      scatter_records(ring_k, slot_ids, phys, key_records),
      scatter_records(ring_g, slot_ids, phys, g),
      scatter_records(ring_beta, slot_ids, phys, beta),
      scatter_records(ring_rawk, slot_ids, phys, jnp.moveaxis(k, 1, 2)),
      scatter_records(ring_rawv, slot_ids, phys, jnp.moveaxis(v, 1, 2)),
  )
  return (o, *rings)
