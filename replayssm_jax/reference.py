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
