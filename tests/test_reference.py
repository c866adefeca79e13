"""Tests of replayssm_jax.reference against an independent float64 numpy oracle.

The oracle below is written from DESIGN section 1 only (its own l2 norm, gates
with ``np.logaddexp`` for softplus, a per-token loop over value heads with GQA
as ``h // r``); it shares no code with the module under test.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replayssm_jax import reference as ref

B, HV, K, V = 2, 4, 16, 8  # K != V so a transposed state cannot pass.
T_MAX = 70  # longest sequence below
EPS32 = float(np.finfo(np.float32).eps)
# fp32 errors, as max|x - x_ref| / max|x_ref| (rounding is relative to the scale
# of the operands, not of each element: tiny elements of S have large relative
# errors). The update is a contraction, so errors do not grow with T; measured
# over 150 seeded cases (T up to 128): <= 3.9 eps vs the fp64 oracle and <= 3.2
# eps chunked vs recurrent. 16 eps (1.9e-6) leaves a 4x margin.
TOL_F32 = 16 * EPS32

rec_jit = jax.jit(ref.recurrent_gated_delta_rule, static_argnames=("scale", "use_qk_l2norm"))
chunk_jit = jax.jit(
    ref.chunk_gated_delta_rule, static_argnames=("scale", "use_qk_l2norm", "chunk_size")
)
verify_jit = jax.jit(ref.verify_window, static_argnames=("scale",))
gating_jit = jax.jit(ref.gdn_gating)
replay_state_jit = jax.jit(ref.replay_state)
replay_apply_jit = jax.jit(ref.replay_apply)


@pytest.fixture
def x64():
  """float64 enabled for the duration of one test (restored afterwards)."""
  previous = jax.config.jax_enable_x64
  jax.config.update("jax_enable_x64", True)
  try:
    yield
  finally:
    jax.config.update("jax_enable_x64", previous)


# ---------------------------------------------------------------------------
# The oracle: float64 numpy, token by token, value head by value head.
# ---------------------------------------------------------------------------


def np_l2(x):
  return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def np_gates(a, b, A_log, dt_bias):
  g = -np.exp(A_log) * np.logaddexp(0.0, a + dt_bias)
  beta = 1.0 / (1.0 + np.exp(-b))
  return g, beta


def np_oracle(q, k, v, g, beta, S0, scale=None, l2norm=True):
  """q, k [B,T,H,K]; v [B,T,HV,V]; g, beta [B,T,HV]; S0 [B,HV,V,K] or None."""
  q, k, v, g, beta = (np.asarray(x, np.float64) for x in (q, k, v, g, beta))
  b_, T, H, Kd = q.shape
  hv, Vd = v.shape[2:]
  r = hv // H
  if l2norm:
    q, k = np_l2(q), np_l2(k)
  q = q * (Kd**-0.5 if scale is None else scale)
  S = np.zeros((b_, hv, Vd, Kd)) if S0 is None else np.array(S0, np.float64)
  o = np.zeros((b_, T, hv, Vd))
  for t in range(T):
    for h in range(hv):
      kt, qt = k[:, t, h // r], q[:, t, h // r]  # [B, K]
      Sh = S[:, h] * np.exp(g[:, t, h])[:, None, None]
      d = beta[:, t, h, None] * (v[:, t, h] - np.einsum("bvk,bk->bv", Sh, kt))
      S[:, h] = Sh + d[:, :, None] * kt[:, None, :]
      o[:, t, h] = np.einsum("bvk,bk->bv", S[:, h], qt)
  return o, S


def make_inputs(seed, T, r, with_state=True):
  """Raw inputs (float64 numpy): q, k, v, a, b, A_log, dt_bias, S0.

  Value heads 0..HV/2-1 have strong decays (A = U(0.01, 16)), the rest weak
  ones (A = U(0.01, 0.1)), so every case covers both regimes.
  """
  rng = np.random.default_rng(seed)
  H = HV // r
  A = np.concatenate([rng.uniform(0.01, 16, HV // 2), rng.uniform(0.01, 0.1, HV - HV // 2)])
  return dict(
      q=rng.standard_normal((B, T, H, K)),
      k=rng.standard_normal((B, T, H, K)),
      v=rng.standard_normal((B, T, HV, V)),
      a=rng.standard_normal((B, T, HV)),
      b=rng.standard_normal((B, T, HV)),
      A_log=np.log(A),
      dt_bias=0.3 * rng.standard_normal(HV),
      S0=0.3 * rng.standard_normal((B, HV, V, K)) if with_state else None,
  )


def gates(a, b, A_log, dt_bias):
  """ref.gdn_gating on a, b padded to [B, T_MAX, HV], so it compiles once per dtype."""
  T = a.shape[1]
  pad = lambda y: jnp.pad(y, ((0, 0), (0, T_MAX - T), (0, 0)))
  g, beta = gating_jit(pad(a), pad(b), A_log, dt_bias)
  return g[:, :T], beta[:, :T]


def jax_args(x, dtype):
  """(q, k, v, g, beta, S0) as jax arrays of dtype, gates from ref.gdn_gating."""
  cast = lambda y: None if y is None else jnp.asarray(y, dtype)
  g, beta = gates(cast(x["a"]), cast(x["b"]), cast(x["A_log"]), cast(x["dt_bias"]))
  return cast(x["q"]), cast(x["k"]), cast(x["v"]), g, beta, cast(x["S0"])


def oracle_of(x, **kw):
  g, beta = np_gates(x["a"], x["b"], x["A_log"], x["dt_bias"])
  return np_oracle(x["q"], x["k"], x["v"], g, beta, x["S0"], **kw)


# ---------------------------------------------------------------------------
# float64: recurrent and chunked rules against the oracle.
# ---------------------------------------------------------------------------

# (GQA ratio, T, initial state, chunk size). A covering design instead of the
# full product (each XLA compile costs ~0.5 s on CPU): every T meets both chunk
# sizes and both initial states, every ratio meets both of each.
F64_CASES = [
    (1, 1, True, 16), (2, 1, False, 64), (4, 1, True, 16),
    (1, 5, False, 16), (2, 5, True, 64), (4, 5, False, 16),
    (1, 37, True, 16), (2, 37, False, 64), (4, 37, True, 16),
    (1, 70, False, 16), (2, 70, True, 64), (4, 70, False, 16),
]


@pytest.mark.parametrize("r,T,with_state,chunk", F64_CASES)
def test_rules_match_oracle_f64(x64, r, T, with_state, chunk):
  x = make_inputs(1000 + 10 * T + r, T, r, with_state)
  o_ref, S_ref = oracle_of(x)
  args = jax_args(x, jnp.float64)
  results = {"recurrent": rec_jit(*args), "chunk": chunk_jit(*args, chunk_size=chunk)}
  for name, (o, S) in results.items():
    assert o.dtype == S.dtype == jnp.float64, name
    np.testing.assert_allclose(np.asarray(S), S_ref, rtol=1e-10, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(np.asarray(o), o_ref, rtol=1e-10, atol=1e-12, err_msg=name)


def test_rules_no_l2norm_custom_scale_f64(x64):
  """use_qk_l2norm=False with an explicit scale (keys pre-shrunk so |k| < 1)."""
  x = make_inputs(7, 21, 2)
  x["k"] = x["k"] / np.sqrt(2 * K)
  o_ref, S_ref = oracle_of(x, scale=0.37, l2norm=False)
  args = jax_args(x, jnp.float64)
  for o, S in (rec_jit(*args, scale=0.37, use_qk_l2norm=False),
               chunk_jit(*args, scale=0.37, use_qk_l2norm=False, chunk_size=16)):
    np.testing.assert_allclose(np.asarray(S), S_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(o), o_ref, rtol=1e-10, atol=1e-12)


def test_chunk_padding_tokens_are_neutral():
  """Appending tokens with g=0, beta=0, k=0 changes neither S nor the first T outputs.

  T=37 and T=37+5 both pad to 48 with chunk 16, so the programs see the same
  chunks and the results must be bitwise equal.
  """
  x = make_inputs(11, 37, 2)
  q, k, v, g, beta, S0 = jax_args(x, jnp.float32)
  o, S = chunk_jit(q, k, v, g, beta, S0, chunk_size=16)
  rng = np.random.default_rng(12)
  ext = lambda y, z: jnp.concatenate([y, jnp.asarray(z, y.dtype)], axis=1)
  q2 = ext(q, rng.standard_normal((B, 5) + q.shape[2:]))
  k2 = ext(k, np.zeros((B, 5) + k.shape[2:]))
  v2 = ext(v, rng.standard_normal((B, 5) + v.shape[2:]))
  g2, beta2 = ext(g, np.zeros((B, 5, HV))), ext(beta, np.zeros((B, 5, HV)))
  o2, S2 = chunk_jit(q2, k2, v2, g2, beta2, S0, chunk_size=16)
  np.testing.assert_array_equal(np.asarray(S2), np.asarray(S))
  np.testing.assert_array_equal(np.asarray(o2[:, :37]), np.asarray(o))


# ---------------------------------------------------------------------------
# float32: against the float64 oracle, and chunked against recurrent.
# ---------------------------------------------------------------------------

F32_CASES = [(1, 5, False, 16), (2, 37, True, 16), (4, 70, True, 64)]


def rel_max_err(x, y):
  """max |x - y| / max |y|: fp32 rounding is relative to the operands' scale."""
  return float(np.max(np.abs(np.asarray(x, np.float64) - y)) / np.max(np.abs(y)))


@pytest.mark.parametrize("r,T,with_state,chunk", F32_CASES)
def test_rules_f32(r, T, with_state, chunk):
  x = make_inputs(2000 + T + r, T, r, with_state)
  args = jax_args(x, jnp.float32)
  # The oracle sees exactly the fp32 values the reference sees (incl. gates).
  o_ref, S_ref = np_oracle(*(None if a is None else np.asarray(a, np.float64) for a in args))
  o_rec, S_rec = rec_jit(*args)
  o_chk, S_chk = chunk_jit(*args, chunk_size=chunk)
  for o, S in ((o_rec, S_rec), (o_chk, S_chk)):
    assert o.dtype == S.dtype == jnp.float32
    assert rel_max_err(S, S_ref) < TOL_F32
    assert rel_max_err(o, o_ref) < TOL_F32
  assert rel_max_err(S_chk, np.asarray(S_rec, np.float64)) < TOL_F32
  assert rel_max_err(o_chk, np.asarray(o_rec, np.float64)) < TOL_F32


# ---------------------------------------------------------------------------
# verify_window: bitwise the recurrent rule, prefix by prefix.
# ---------------------------------------------------------------------------


def test_verify_window_bitwise_recurrent():
  T = 4
  x = make_inputs(31, T, 2)
  q, k, v, g, beta, S0 = jax_args(x, jnp.float32)
  o, states = verify_jit(q, k, v, g, beta, S0)
  assert o.shape == (B, T, HV, V) and states.shape == (B, T, HV, V, K)
  assert states.dtype == jnp.float32
  o_rec, _ = rec_jit(q, k, v, g, beta, S0)
  np.testing.assert_array_equal(np.asarray(o), np.asarray(o_rec))
  for t in range(T):
    n = t + 1
    _, S_t = rec_jit(q[:, :n], k[:, :n], v[:, :n], g[:, :n], beta[:, :n], S0)
    np.testing.assert_array_equal(np.asarray(states[:, t]), np.asarray(S_t), err_msg=f"t={t}")
  # And it is the right state, not merely a consistent one.
  g64, beta64 = np.asarray(g, np.float64), np.asarray(beta, np.float64)
  _, S_ref = np_oracle(*(np.asarray(a, np.float64) for a in (q, k, v)), g64, beta64,
                       np.asarray(S0, np.float64))
  assert rel_max_err(states[:, -1], S_ref) < TOL_F32


# ---------------------------------------------------------------------------
# Replay identity.
# ---------------------------------------------------------------------------


def step_records(rng, S0, m):
  """Steps ref.delta_rule_step m times; returns (S_m, d, k_hat, g) [B, m, HV, ...]."""
  k_hat = np_l2(rng.standard_normal((B, m, HV, K)))
  v = rng.standard_normal((B, m, HV, V))
  A = np.concatenate([rng.uniform(0.01, 16, HV // 2), rng.uniform(0.01, 0.1, HV - HV // 2)])
  g, beta = np_gates(rng.standard_normal((B, m, HV)), rng.standard_normal((B, m, HV)),
                     np.log(A), 0.3 * rng.standard_normal(HV))
  S, ds = jnp.asarray(S0), []
  for j in range(m):
    S, d = ref.delta_rule_step(S, *(jnp.asarray(y[:, j]) for y in (k_hat, v, g, beta)))
    ds.append(np.asarray(d))
  return np.asarray(S), np.stack(ds, axis=1), k_hat, g


def test_replay_matches_stepping_f64(x64):
  rng = np.random.default_rng(41)
  S0 = 0.3 * rng.standard_normal((B, HV, V, K))
  S_m, d, k_hat, g = step_records(rng, S0, 9)
  xq = rng.standard_normal((B, HV, K))
  np.testing.assert_allclose(np.asarray(replay_state_jit(S0, d, k_hat, g)), S_m,
                             rtol=1e-10, atol=1e-12)
  np.testing.assert_allclose(np.asarray(replay_apply_jit(S0, d, k_hat, g, xq)),
                             np.einsum("bhvk,bhk->bhv", S_m, xq), rtol=1e-10, atol=1e-12)


def test_replay_valid_mask_f64(x64):
  """Invalid records (garbage d, k, large positive g, NaNs) contribute nothing."""
  rng = np.random.default_rng(43)
  m_valid, m = 7, 12
  S0 = 0.3 * rng.standard_normal((B, HV, V, K))
  S_m, d_v, k_v, g_v = step_records(rng, S0, m_valid)
  d = 5 * rng.standard_normal((B, m, HV, V))
  k_hat = rng.standard_normal((B, m, HV, K))
  g = rng.uniform(1, 30, (B, m, HV))
  d[:, 0, 0, 0] = np.nan
  valid = np.zeros((B, m), bool)
  for b_ in range(B):  # a different scattering of the same records per row
    pos = np.sort(rng.choice(m, m_valid, replace=False))
    valid[b_, pos] = True
    d[b_, pos], k_hat[b_, pos], g[b_, pos] = d_v[b_], k_v[b_], g_v[b_]
  assert not valid[:, 0].all()  # so the NaN above sits in an invalid record
  xq = rng.standard_normal((B, HV, K))
  np.testing.assert_allclose(np.asarray(replay_state_jit(S0, d, k_hat, g, valid)), S_m,
                             rtol=1e-10, atol=1e-12)
  np.testing.assert_allclose(np.asarray(replay_apply_jit(S0, d, k_hat, g, xq, valid)),
                             np.einsum("bhvk,bhk->bhv", S_m, xq), rtol=1e-10, atol=1e-12)
  # No valid record at all, and no record at all: the checkpoint itself.
  none = np.zeros((B, m), bool)
  np.testing.assert_array_equal(np.asarray(replay_state_jit(S0, d, k_hat, g, none)), S0)
  empty = ref.replay_state(S0, d[:, :0], k_hat[:, :0], g[:, :0])
  np.testing.assert_array_equal(np.asarray(empty), S0)


# ---------------------------------------------------------------------------
# Gates and dtypes.
# ---------------------------------------------------------------------------


def test_gdn_gating_f64(x64):
  rng = np.random.default_rng(51)
  A_log, dt_bias = np.log(rng.uniform(0.01, 16, HV)), 0.3 * rng.standard_normal(HV)
  a = np.concatenate([rng.standard_normal((64, HV)), rng.uniform(-40, 40, (64, HV))])
  b = np.concatenate([rng.standard_normal((64, HV)), rng.uniform(-40, 40, (64, HV))])
  g, beta = gating_jit(a, b, A_log, dt_bias)
  assert g.dtype == beta.dtype == jnp.float64
  x = a + dt_bias
  over = x > 20
  assert over.sum() > 10 and (x < -20).sum() > 10
  thresholded = np.where(over, x, np.logaddexp(0.0, x))
  np.testing.assert_allclose(np.asarray(g), -np.exp(A_log) * thresholded, rtol=1e-14)
  np.testing.assert_allclose(np.asarray(beta), 1.0 / (1.0 + np.exp(-b)), rtol=1e-14)
  # Above 20 softplus is the identity, which differs from the true softplus by
  # log1p(exp(-x)) < 2.1e-9 (relative < 1e-10); visible in fp64 up to x ~ 33.
  sp = np.asarray(ref.softplus(jnp.asarray(x)))
  np.testing.assert_array_equal(sp[over], x[over])
  np.testing.assert_allclose(sp, np.logaddexp(0.0, x), rtol=1e-10)
  x_thr = np.linspace(20.01, 30.0, 16)
  np.testing.assert_array_equal(np.asarray(ref.softplus(jnp.asarray(x_thr))), x_thr)
  assert np.all(np.logaddexp(0.0, x_thr) > x_thr)


def test_gdn_gating_bf16_gives_f32():
  rng = np.random.default_rng(52)
  a = jnp.asarray(rng.uniform(-30, 30, (16, HV)), jnp.bfloat16)
  b = jnp.asarray(rng.standard_normal((16, HV)), jnp.bfloat16)
  A_log = np.log(rng.uniform(0.01, 16, HV)).astype(np.float32)
  dt_bias = (0.3 * rng.standard_normal(HV)).astype(np.float32)
  bf = lambda y: jnp.asarray(y, jnp.bfloat16)
  for A, dtb in ((A_log, dt_bias), (bf(A_log), bf(dt_bias))):
    g, beta = gating_jit(a, b, jnp.asarray(A), jnp.asarray(dtb))
    assert g.dtype == beta.dtype == jnp.float32
    a64, b64, A64, d64 = (np.asarray(y, np.float64) for y in (a, b, A, dtb))
    np.testing.assert_allclose(np.asarray(g), -np.exp(A64) * np.logaddexp(0.0, a64 + d64),
                               rtol=8 * EPS32)
    np.testing.assert_allclose(np.asarray(beta), 1.0 / (1.0 + np.exp(-b64)), rtol=8 * EPS32)


def test_bf16_inputs_give_bf16_output_f32_state():
  """bf16 inputs are cast to fp32 first: same result as the fp32 run on their values."""
  x = make_inputs(61, 37, 2)  # shapes of a test_rules_f32 case: fp32 programs are reused
  q, k, v, g, beta, _ = jax_args(x, jnp.bfloat16)
  S0 = jnp.asarray(x["S0"], jnp.float32)  # an fp32 checkpoint, bf16 activations
  assert q.dtype == v.dtype == jnp.bfloat16 and g.dtype == jnp.float32
  up = lambda *ys: [y.astype(jnp.float32) for y in ys]
  for fn in (rec_jit, lambda *a: chunk_jit(*a, chunk_size=16)):
    o, S = fn(q, k, v, g, beta, S0)
    assert o.dtype == jnp.bfloat16 and S.dtype == jnp.float32
    o32, S32 = fn(*up(q, k, v), g, beta, S0)
    np.testing.assert_array_equal(np.asarray(S), np.asarray(S32))
    np.testing.assert_array_equal(np.asarray(o), np.asarray(o32.astype(jnp.bfloat16)))
  o, states = verify_jit(q, k, v, g, beta, S0)
  assert o.dtype == jnp.bfloat16 and states.dtype == jnp.float32
