"""Pure-jnp reference math of the Gated DeltaNet recurrence (DESIGN section 1).

Layout: the state of one value head is S in R^{V x K} (K contiguous), stored as
``[B, HV, V, K]``. Value head ``h`` reads key head ``h // (HV // H)`` (GQA).

Per token, with the raw projections q, k in R^K, v in R^V and scalars a, b:

    g      = -exp(A_log) * softplus(a + dt_bias)      alpha = exp(g)
    beta   = sigmoid(b)
    q_hat  = q / sqrt(|q|^2 + 1e-6) * K^-1/2,  k_hat = k / sqrt(|k|^2 + 1e-6)
    d      = beta * (v - alpha * S k_hat)
    S'     = alpha * S + d k_hat^T,                   o = S' q_hat

The small functions at the top (``l2_normalize``, ``gdn_gating``,
``delta_rule_step``) are the project's one definition of that arithmetic: the
XLA backend and the Pallas kernels call them too, which is what makes the exact
fold bitwise equal to the recurrent path (DESIGN section 4). This module imports
only jax and numpy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

L2_EPS = 1e-6
SOFTPLUS_THRESHOLD = 20.0


def compute_dtype(*xs: jax.Array) -> jnp.dtype:
  """fp32, or fp64 when any input is fp64 (the reference runs under x64 too)."""
  return jnp.result_type(jnp.float32, *(x.dtype for x in xs))


def l2_normalize(x: jax.Array) -> jax.Array:
  """``x / sqrt(sum(x^2) + 1e-6)`` over the last axis (the division form of fla)."""
  return x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True) + L2_EPS)


def softplus(x: jax.Array) -> jax.Array:
  """softplus with beta 1 and threshold 20, as the SGLang/vLLM kernels compute it."""
  return jnp.where(x > SOFTPLUS_THRESHOLD, x, jnp.log1p(jnp.exp(jnp.minimum(x, SOFTPLUS_THRESHOLD))))


def gdn_gating(
    a: jax.Array, b: jax.Array, A_log: jax.Array, dt_bias: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """Gates of the delta rule from the raw projections.

  Args:
    a, b: ``[..., HV]`` in any float dtype (cast to fp32, or kept in fp64).
    A_log, dt_bias: ``[HV]`` (broadcast against the last axis).

  Returns:
    ``(g, beta)``, each ``[..., HV]`` in fp32 (fp64 for fp64 inputs):
    ``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = 1 / (1 + exp(-b))``.
  """
  dt = compute_dtype(a, b, A_log, dt_bias)
  g = -jnp.exp(A_log.astype(dt)) * softplus(a.astype(dt) + dt_bias.astype(dt))
  beta = 1.0 / (1.0 + jnp.exp(-b.astype(dt)))
  return g, beta


def delta_rule_step(
    S: jax.Array, k_hat: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """One exact recurrent update of a state tile.

  Shapes broadcast over leading axes: the reference calls it on whole batches,
  the kernels on one ``[BV, K]`` tile of one value head.

  Args:
    S: ``[..., V, K]`` state (fp32 or fp64).
    k_hat: ``[..., K]`` normalised key.
    v: ``[..., V]`` value.
    g, beta: ``[...]`` log-decay and write strength.

  Returns:
    ``(S_new, d)`` with ``d = beta * (v - exp(g) S k_hat)`` (``[..., V]``) and
    ``S_new = exp(g) S + d k_hat^T``.
  """
  S = S * jnp.exp(g)[..., None, None]
  d = beta[..., None] * (v - jnp.sum(S * k_hat[..., None, :], axis=-1))
  S = S + d[..., :, None] * k_hat[..., None, :]
  return S, d


def state_apply(S: jax.Array, x: jax.Array) -> jax.Array:
  """``S x`` for ``S [..., V, K]`` and ``x [..., K]`` as a multiply and reduce."""
  return jnp.sum(S * x[..., None, :], axis=-1)


# ---------------------------------------------------------------------------
# Full-sequence rules: recurrent (the definition) and chunked (WY / UT form).
# ---------------------------------------------------------------------------

_HIGHEST = jax.lax.Precision.HIGHEST


def expand_kv_heads(x: jax.Array, num_v_heads: int) -> jax.Array:
  """Repeats key heads to value heads along axis 2 (GQA, repeat not tile).

  Args:
    x: ``[B, T, H, ...]``.
    num_v_heads: HV, a multiple of H.

  Returns:
    ``[B, T, HV, ...]`` where value head ``h`` holds key head ``h // (HV // H)``.
  """
  num_k_heads = x.shape[2]
  if num_v_heads % num_k_heads:
    raise ValueError(f"num_v_heads={num_v_heads} is not a multiple of H={num_k_heads}")
  return jnp.repeat(x, num_v_heads // num_k_heads, axis=2)


def _prepare(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    initial_state: jax.Array | None,
    scale: float | None,
    use_qk_l2norm: bool,
) -> tuple[jax.Array, ...]:
  """Checks shapes, casts to the compute dtype, normalises q and k, expands heads.

  Returns:
    ``(q_hat, k_hat, v, g, beta, S0)`` in the compute dtype: q_hat, k_hat
    ``[B, T, HV, K]``, v ``[B, T, HV, V]``, g, beta ``[B, T, HV]``, S0
    ``[B, HV, V, K]`` (zeros when ``initial_state`` is None).
  """
  B, T, _, K = q.shape
  HV, V = v.shape[2], v.shape[3]
  S_shape = (B, HV, V, K) if initial_state is None else initial_state.shape
  if (k.shape, v.shape[:2], g.shape, beta.shape, S_shape) != (
      q.shape, (B, T), (B, T, HV), (B, T, HV), (B, HV, V, K)):
    raise ValueError(f"bad shapes q{q.shape} k{k.shape} v{v.shape} g{g.shape} "
                     f"beta{beta.shape} initial_state{S_shape}")
  extra = () if initial_state is None else (initial_state,)
  dt = compute_dtype(q, k, v, g, beta, *extra)
  q, k = q.astype(dt), k.astype(dt)
  if use_qk_l2norm:
    q, k = l2_normalize(q), l2_normalize(k)
  q = q * (K**-0.5 if scale is None else scale)
  S0 = jnp.zeros((B, HV, V, K), dt) if initial_state is None else initial_state.astype(dt)
  return (
      expand_kv_heads(q, HV), expand_kv_heads(k, HV), v.astype(dt), g.astype(dt),
      beta.astype(dt), S0,
  )


def _scan_steps(
    q_hat: jax.Array,
    k_hat: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    S0: jax.Array,
    keep_states: bool,
) -> tuple[jax.Array, jax.Array, jax.Array | None]:
  """Steps ``delta_rule_step`` over T in a ``lax.scan`` (shapes as ``_prepare``).

  Returns:
    ``(o [B, T, HV, V], S_T [B, HV, V, K], states [B, T, HV, V, K] or None)``.
  """

  def step(S, xs):
    q_t, k_t, v_t, g_t, b_t = xs
    S, _ = delta_rule_step(S, k_t, v_t, g_t, b_t)
    o_t = state_apply(S, q_t)
    return S, ((o_t, S) if keep_states else (o_t,))

  xs = tuple(jnp.moveaxis(x, 1, 0) for x in (q_hat, k_hat, v, g, beta))
  S, ys = jax.lax.scan(step, S0, xs)
  o = jnp.moveaxis(ys[0], 0, 1)
  states = jnp.moveaxis(ys[1], 0, 1) if keep_states else None
  return o, S, states


def recurrent_gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    initial_state: jax.Array | None = None,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
) -> tuple[jax.Array, jax.Array]:
  """The gated delta rule stepped token by token (the definition of the math).

  Args:
    q, k: ``[B, T, H, K]`` raw queries and keys.
    v: ``[B, T, HV, V]`` values, HV a multiple of H.
    g, beta: ``[B, T, HV]`` log-decay and write strength (see ``gdn_gating``).
    initial_state: ``[B, HV, V, K]`` or None (zeros).
    scale: multiplies the (normalised) query; default ``K ** -0.5``.
    use_qk_l2norm: apply ``l2_normalize`` to q and k first.

  Returns:
    ``(o, final_state)``: o ``[B, T, HV, V]`` in the dtype of v, final_state
    ``[B, HV, V, K]`` in the compute dtype (fp32, or fp64 for fp64 inputs).
  """
  args = _prepare(q, k, v, g, beta, initial_state, scale, use_qk_l2norm)
  o, S, _ = _scan_steps(*args, keep_states=False)
  return o.astype(v.dtype), S


def verify_window(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    initial_state: jax.Array,
    *,
    scale: float | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Recurrent verify of T draft tokens, keeping the state after every token.

  The same ``lax.scan`` of ``delta_rule_step`` as ``recurrent_gated_delta_rule``
  (q/k l2 norm on), so ``states[:, t]`` is bitwise the final state of the
  recurrent rule run on the first ``t + 1`` tokens.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; g, beta: ``[B, T, HV]``.
    initial_state: ``[B, HV, V, K]``.
    scale: query scale; default ``K ** -0.5``.

  Returns:
    ``(o, states)``: o ``[B, T, HV, V]`` in the dtype of v, states
    ``[B, T, HV, V, K]`` in the compute dtype.
  """
  args = _prepare(q, k, v, g, beta, initial_state, scale, True)
  o, _, states = _scan_steps(*args, keep_states=True)
  return o.astype(v.dtype), states


def _to_chunks(x: jax.Array, chunk_size: int) -> jax.Array:
  """``[B, T, HV, ...]`` -> ``[B, HV, N, C, ...]``, zero-padding T to ``N * C``."""
  B, T = x.shape[:2]
  n = -(-T // chunk_size)
  x = jnp.pad(x, [(0, 0), (0, n * chunk_size - T)] + [(0, 0)] * (x.ndim - 2))
  x = x.reshape(B, n, chunk_size, *x.shape[2:])
  return jnp.moveaxis(x, 3, 1)


def chunk_gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    initial_state: jax.Array | None = None,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    chunk_size: int = 64,
) -> tuple[jax.Array, jax.Array]:
  """The gated delta rule in chunked WY / UT form; equal to the recurrent rule.

  Within a chunk of C tokens with gates summed from the chunk start,
  ``G_s = g_1 + ... + g_s``, and chunk start state ``S0``, the d's solve

      (I + A) D = beta * (v - exp(G) S0 k_hat),
      A[s, j] = beta_s exp(G_s - G_j) (k_hat_s . k_hat_j)   for j < s,

  and then ``o_s = exp(G_s) S0 q_s + sum_{j <= s} exp(G_s - G_j) (q_s . k_j) d_j``
  and ``S_C = exp(G_C) S0 + sum_j exp(G_C - G_j) d_j k_j^T``. Everything but the
  last two lines is computed for all chunks at once; a ``lax.scan`` carries S.
  ``G_s - G_j`` is summed directly over ``(j, s]`` (not as a difference of
  cumulative sums) so strong gates do not cost precision. T is padded inside
  to a multiple of C with neutral tokens (g = 0, beta = 0, k = 0).

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; g, beta: ``[B, T, HV]``.
    initial_state: ``[B, HV, V, K]`` or None (zeros).
    scale: query scale; default ``K ** -0.5``.
    use_qk_l2norm: apply ``l2_normalize`` to q and k first.
    chunk_size: C.

  Returns:
    ``(o, final_state)`` as ``recurrent_gated_delta_rule``.
  """
  q_hat, k_hat, vv, gg, bb, S0 = _prepare(q, k, v, g, beta, initial_state, scale, use_qk_l2norm)
  B, T, HV, _ = k_hat.shape
  C = chunk_size
  qc, kc, vc, gc, bc = (_to_chunks(x, C) for x in (q_hat, k_hat, vv, gg, bb))  # [B, HV, N, C, ...]

  idx = jnp.arange(C)
  causal = idx[:, None] >= idx[None, :]  # [s, j]: j <= s
  strict = idx[:, None] > idx[None, :]
  # seg[s, j] = sum_{j < i <= s} g_i  (= G_s - G_j for j <= s), summed over i = axis -2.
  seg = jnp.cumsum(jnp.where(strict, gc[..., :, None], 0), axis=-2)
  decay = jnp.where(causal, jnp.exp(jnp.where(causal, seg, 0)), 0)  # [B, HV, N, C, C]
  G = jnp.cumsum(gc, axis=-1)  # [B, HV, N, C]

  kk = jnp.einsum("...sk,...jk->...sj", kc, kc, precision=_HIGHEST)
  A = jnp.where(strict, bc[..., :, None] * decay * kk, 0)
  eye = jnp.eye(C, dtype=A.dtype)
  rhs = jnp.concatenate([bc[..., None] * jnp.exp(G)[..., None] * kc, bc[..., None] * vc], -1)
  sol = jax.scipy.linalg.solve_triangular(eye + A, rhs, lower=True, unit_diagonal=True)
  K = kc.shape[-1]
  W, U = sol[..., :K], sol[..., K:]  # D = U - W S0^T
  qk = jnp.einsum("...sk,...jk->...sj", qc, kc, precision=_HIGHEST) * decay
  q_decayed = jnp.exp(G)[..., None] * qc  # [B, HV, N, C, K]
  k_tail = decay[..., -1, :, None] * kc  # exp(G_C - G_j) k_j
  chunk_decay = jnp.exp(G[..., -1])  # [B, HV, N]

  def step(S, xs):
    W, U, qk, q_decayed, k_tail, chunk_decay = xs
    D = U - jnp.einsum("...ck,...vk->...cv", W, S, precision=_HIGHEST)
    o = jnp.einsum("...ck,...vk->...cv", q_decayed, S, precision=_HIGHEST)
    o = o + jnp.einsum("...sj,...jv->...sv", qk, D, precision=_HIGHEST)
    S = chunk_decay[..., None, None] * S + jnp.einsum(
        "...cv,...ck->...vk", D, k_tail, precision=_HIGHEST
    )
    return S, o

  xs = tuple(jnp.moveaxis(x, 2, 0) for x in (W, U, qk, q_decayed, k_tail, chunk_decay))
  S, o = jax.lax.scan(step, S0, xs)  # o [N, B, HV, C, V]
  o = jnp.transpose(o, (1, 0, 3, 2, 4)).reshape(B, -1, HV, o.shape[-1])[:, :T]
  return o.astype(v.dtype), S


# ---------------------------------------------------------------------------
# The replay identity: a state from a checkpoint and m records (d, k_hat, g).
# ---------------------------------------------------------------------------


def _replay_weights(
    g: jax.Array, valid: jax.Array | None, dt: jnp.dtype
) -> tuple[jax.Array, jax.Array]:
  """``(exp(G_m) [B, HV], w [B, m, HV])`` with ``w_j = exp(G_m - G_j)``, 0 if invalid.

  ``G_m - G_j = sum_{i > j} g_i`` is a reverse cumulative sum (no cancellation).
  """
  g = g.astype(dt)
  if valid is not None:
    g = jnp.where(valid[..., None], g, 0)
  g_next = jnp.concatenate([g[:, 1:], jnp.zeros_like(g[:, :1])], axis=1)
  tail = jnp.flip(jnp.cumsum(jnp.flip(g_next, 1), axis=1), 1)
  w = jnp.exp(tail)
  if valid is not None:
    w = jnp.where(valid[..., None], w, 0)
  return jnp.exp(jnp.sum(g, axis=1)), w


def _mask_records(x: jax.Array, valid: jax.Array | None, dt: jnp.dtype) -> jax.Array:
  """Casts a record array ``[B, m, HV, ...]`` to dt with invalid records zeroed."""
  x = x.astype(dt)
  if valid is None:
    return x
  return jnp.where(valid.reshape(valid.shape + (1,) * (x.ndim - 2)), x, 0)


def replay_state(
    S0: jax.Array,
    d: jax.Array,
    k_hat: jax.Array,
    g: jax.Array,
    valid: jax.Array | None = None,
) -> jax.Array:
  """The state after m records: ``exp(G_m) S0 + sum_j exp(G_m - G_j) d_j k_hat_j^T``.

  Args:
    S0: ``[B, HV, V, K]`` checkpoint.
    d: ``[B, m, HV, V]`` recorded ``d`` of ``delta_rule_step``.
    k_hat: ``[B, m, HV, K]`` normalised keys, already expanded to value heads.
    g: ``[B, m, HV]`` log-decays; ``G_j = g_1 + ... + g_j``.
    valid: optional ``[B, m]`` bool; a False record contributes nothing and
      its g is ignored (ring buffer slots not in use).

  Returns:
    ``S_m`` ``[B, HV, V, K]`` in the compute dtype.
  """
  dt = compute_dtype(S0, d, k_hat, g)
  decay, w = _replay_weights(g, valid, dt)
  d, k_hat = _mask_records(d, valid, dt), _mask_records(k_hat, valid, dt)
  upd = jnp.einsum("bmh,bmhv,bmhk->bhvk", w, d, k_hat, precision=_HIGHEST)
  return decay[..., None, None] * S0.astype(dt) + upd


def replay_apply(
    S0: jax.Array,
    d: jax.Array,
    k_hat: jax.Array,
    g: jax.Array,
    x: jax.Array,
    valid: jax.Array | None = None,
) -> jax.Array:
  """``S_m x`` without materialising ``S_m`` (arguments as ``replay_state``).

  ``S_m x = exp(G_m) (S0 x) + sum_j exp(G_m - G_j) (k_hat_j . x) d_j``.

  Args:
    S0, d, k_hat, g, valid: as ``replay_state``.
    x: ``[B, HV, K]``.

  Returns:
    ``[B, HV, V]`` in the compute dtype.
  """
  dt = compute_dtype(S0, d, k_hat, g, x)
  decay, w = _replay_weights(g, valid, dt)
  d, k_hat, x = _mask_records(d, valid, dt), _mask_records(k_hat, valid, dt), x.astype(dt)
  kx = jnp.einsum("bmhk,bhk->bmh", k_hat, x, precision=_HIGHEST)
  upd = jnp.einsum("bmh,bmhv->bhv", w * kx, d, precision=_HIGHEST)
  # A dot, not `state_apply`'s multiply-reduce: vmapped over a window, the latter materialises
  # one product the size of the checkpoint per token (XLA temp of T full states).
  S0x = jnp.einsum("bhvk,bhk->bhv", S0.astype(dt), x, precision=_HIGHEST)
  return decay[..., None] * S0x + upd
