"""A float64 numpy oracle of the GDN recurrence, written from DESIGN section 1.

Independent of `replayssm_jax`: its own l2 norm, softplus and sigmoid, one token and
one value head at a time. Used by the kernel and ssm tests.
"""

from __future__ import annotations

import numpy as np


def gates(a, b, A_log, dt_bias):
  """(g, beta) in float64 for a, b ``[..., HV]``."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  x = a + np.asarray(dt_bias, np.float64)
  softplus = np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))
  return -np.exp(np.asarray(A_log, np.float64)) * softplus, 1 / (1 + np.exp(-b))


def l2(x):
  x = np.asarray(x, np.float64)
  return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


def run_tokens(S, q, k, v, a, b, A_log, dt_bias):
  """Step the recurrence over T tokens of B rows.

  Args:
    S: ``[B, HV, V, K]`` start states; q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; a, b ``[B, T, HV]``.

  Returns:
    (o ``[B, T, HV, V]``, states ``[B, T, HV, V, K]`` after each token, d ``[B, T, HV, V]``), float64.
  """
  S = np.array(S, np.float64)
  B, T, H, K = q.shape
  HV = v.shape[2]
  r = HV // H
  g, beta = gates(a, b, A_log, dt_bias)
  qh, kh = l2(q) * K ** -0.5, l2(k)
  v = np.asarray(v, np.float64)
  o = np.zeros(v.shape)
  d = np.zeros(v.shape)
  states = np.zeros((B, T, *S.shape[1:]))
  for bi in range(B):
    for t in range(T):
      for h in range(HV):
        kv = kh[bi, t, h // r]
        S[bi, h] *= np.exp(g[bi, t, h])
        d[bi, t, h] = beta[bi, t, h] * (v[bi, t, h] - S[bi, h] @ kv)
        S[bi, h] += np.outer(d[bi, t, h], kv)
        o[bi, t, h] = S[bi, h] @ qh[bi, t, h // r]
      states[bi, t] = S[bi]
  return o, states, d
