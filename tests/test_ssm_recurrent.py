"""`replayssm_jax.ssm` in recurrent mode: verify, commit, decode, reset, materialize."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oracle
from conftest import rel_err
from replayssm_jax import GDNConfig, SpecConfig, ssm

GDN = GDNConfig(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16, hidden_size=32,
                num_layers=1, num_gdn_layers=1)
SLOTS = 5


def window(rng, B, T, dtype=jnp.float32, gdn=GDN):
  f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32).astype(dtype)
  H, HV, K, V = gdn.num_k_heads, gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim
  return f(B, T, H, K), f(B, T, H, K), f(B, T, HV, V), f(B, T, HV), f(B, T, HV)


def params(rng, gdn=GDN):
  HV = gdn.num_v_heads
  return (jnp.log(jnp.asarray(rng.uniform(0.01, 0.5, HV), jnp.float32)),
          jnp.asarray(0.3 * rng.standard_normal(HV), jnp.float32))


def fresh_cache(rng, spec, dtype=jnp.float32):
  cache = ssm.init(GDN, spec, SLOTS, dtype=dtype)
  S0 = jnp.asarray(0.3 * rng.standard_normal((SLOTS, *GDN.state_shape)), jnp.float32)
  return ssm.reset(cache, jnp.arange(SLOTS, dtype=jnp.int32), S0, spec), np.asarray(S0)


@pytest.mark.parametrize("T", [1, 2, 4, 8])
def test_verify_then_commit_every_accepted_count(backend, T):
  rng = np.random.default_rng(T)
  spec = SpecConfig(draft_tokens=T, verify_mode="recurrent", backend=backend)
  cache, S0 = fresh_cache(rng, spec)
  A_log, dt_bias = params(rng)
  B = T + 2  # accepted 0..T, plus a padding row
  slot_ids = jnp.asarray(list(range(min(B - 1, SLOTS))) + [-1] * (B - min(B - 1, SLOTS)), jnp.int32)
  q, k, v, a, b = window(rng, B, T)
  o, cache = ssm.verify(cache, q, k, v, a, b, A_log, dt_bias, slot_ids, spec)
  o2, cache = ssm.verify(cache, q, k, v, a, b, A_log, dt_bias, slot_ids, spec)
  np.testing.assert_array_equal(np.asarray(o), np.asarray(o2))  # verify never mutates the state

  accepted = jnp.asarray(np.arange(B) % (T + 1), jnp.int32)
  cache = ssm.commit(cache, slot_ids, accepted, spec)
  got = np.asarray(ssm.materialize(cache, slot_ids, spec))
  ids = np.asarray(slot_ids)
  for row, slot in enumerate(ids):
    if slot < 0:
      np.testing.assert_array_equal(got[row], 0)
      continue
    n = int(accepted[row])
    _, states, _ = oracle.run_tokens(S0[slot][None], *(np.asarray(x[row:row + 1]) for x in (q, k, v, a, b)),
                                     A_log, dt_bias)
    want = S0[slot] if n == 0 else states[0, n - 1]
    assert rel_err(got[row], want) < 1e-5
    if n == 0:
      np.testing.assert_array_equal(got[row], S0[slot])  # accept 0 leaves the state bitwise
  # Slots no row names are bitwise untouched.
  untouched = np.setdiff1d(np.arange(SLOTS), ids[ids >= 0])
  np.testing.assert_array_equal(np.asarray(cache.ssm)[untouched], S0[untouched])


def test_decode_matches_verify_commit_one(backend):
  rng = np.random.default_rng(3)
  spec = SpecConfig(draft_tokens=1, verify_mode="recurrent", backend=backend)
  cache_a, _ = fresh_cache(rng, spec)
  cache_b = jax.tree.map(jnp.copy, cache_a)
  A_log, dt_bias = params(rng)
  slot_ids = jnp.asarray([2, -1, 0], jnp.int32)
  for _ in range(3):
    x = window(rng, 3, 1)
    o_d, cache_a = ssm.decode(cache_a, *x, A_log, dt_bias, slot_ids, spec)
    o_v, cache_b = ssm.verify(cache_b, *x, A_log, dt_bias, slot_ids, spec)
    cache_b = ssm.commit(cache_b, slot_ids, jnp.ones(3, jnp.int32), spec)
    np.testing.assert_array_equal(np.asarray(o_d), np.asarray(o_v))
    np.testing.assert_array_equal(np.asarray(cache_a.ssm), np.asarray(cache_b.ssm))
  np.testing.assert_array_equal(np.asarray(o_d)[1], 0)


def test_bf16_activations(backend):
  rng = np.random.default_rng(5)
  spec = SpecConfig(draft_tokens=4, verify_mode="recurrent", backend=backend)
  cache, S0 = fresh_cache(rng, spec, jnp.bfloat16)
  A_log, dt_bias = params(rng)
  x = window(rng, 2, 4, jnp.bfloat16)
  slot_ids = jnp.asarray([1, 3], jnp.int32)
  o, cache = ssm.verify(cache, *x, A_log, dt_bias, slot_ids, spec)
  assert o.dtype == jnp.bfloat16
  o64, states, _ = oracle.run_tokens(S0[[1, 3]], *(np.asarray(t, np.float32) for t in x), A_log, dt_bias)
  assert rel_err(o, o64) < 4e-3
  assert rel_err(cache.intermediate[jnp.asarray([1, 3])], states) < 1e-5


def test_mode_mismatch_errors():
  rec = SpecConfig(draft_tokens=2, verify_mode="recurrent")
  rep = SpecConfig(draft_tokens=2, ring_len=4, verify_mode="replayssm")
  rng = np.random.default_rng(0)
  A_log, dt_bias = params(rng)
  x = window(rng, 1, 2)
  slot_ids = jnp.zeros(1, jnp.int32)
  with pytest.raises(ValueError, match="needs `intermediate`, which a ReplayCache does not allocate"):
    ssm.verify(ssm.init(GDN, rep, 2, dtype=jnp.float32), *x, A_log, dt_bias, slot_ids, rec)
  with pytest.raises(ValueError, match="needs a ReplayCache"):
    ssm.verify(ssm.init(GDN, rec, 2), *x, A_log, dt_bias, slot_ids, rep)
  copy = dataclasses.replace(rep, checkpoint_copy=jnp.bfloat16)
  with pytest.raises(ValueError, match=r"checkpoint_copy=bfloat16 but the cache keeps none"):
    ssm.verify(ssm.init(GDN, rep, 2, dtype=jnp.float32), *x, A_log, dt_bias, slot_ids, copy)
  with pytest.raises(ValueError, match=r"checkpoint_copy=None but the cache keeps bfloat16\["):
    ssm.commit(ssm.init(GDN, copy, 2), slot_ids, slot_ids, rep)


def test_shape_errors_name_expected_and_given():
  spec = SpecConfig(draft_tokens=2, verify_mode="recurrent")
  rng = np.random.default_rng(0)
  A_log, dt_bias = params(rng)
  q, k, v, a, b = window(rng, 1, 2)
  cache = ssm.init(GDN, spec, 2)
  with pytest.raises(ValueError, match=r"v has shape \(1, 2, 4, 8\); expected \(1, 2, 4, 16\)"):
    ssm.verify(cache, q, k, v[..., :8], a, b, A_log, dt_bias, jnp.zeros(1, jnp.int32), spec)
  with pytest.raises(ValueError, match=r"q has shape \(1, 3, 2, 16\); expected \(1, 2, 2, 16\)"):
    q3 = jnp.zeros((1, 3, 2, 16))
    ssm.verify(cache, q3, q3, v, a, b, A_log, dt_bias, jnp.zeros(1, jnp.int32), spec)
  # replayssm: the rings fix the key heads, so a q of the wrong heads is named, not its k
  rep = SpecConfig(draft_tokens=2, ring_len=4, verify_mode="replayssm")
  with pytest.raises(ValueError, match=r"q has shape \(1, 2, 1, 16\); expected \(1, 2, 2, 16\) "
                                       r"\(T=2, 2 key heads"):
    ssm.verify(ssm.init(GDN, rep, 2, dtype=jnp.float32), q[:, :, :1], k, v, a, b, A_log, dt_bias,
               jnp.zeros(1, jnp.int32), rep)


@pytest.mark.parametrize("mode", ["recurrent", "replayssm"])
def test_check_values_refuses_bad_slots_and_counts(backend, mode):
  """`SpecConfig.check_values`: each function fails on a slot id outside the cache or
  repeated, and commit on an accepted count outside 0..T, naming the values; padding rows and
  their counts pass, and a checked step gives the unchecked step's outputs and state."""
  T = 2
  plain = SpecConfig(draft_tokens=T, ring_len=4, verify_mode=mode, backend=backend)
  spec = dataclasses.replace(plain, check_values=True)
  rng = np.random.default_rng(7)
  A_log, dt_bias = params(rng)
  x = window(rng, 3, T)
  S0 = jnp.asarray(0.3 * rng.standard_normal((3, *GDN.state_shape)), jnp.float32)
  ids = lambda *s: jnp.asarray(s, jnp.int32)
  fresh = lambda: ssm.init(GDN, spec, SLOTS, dtype=jnp.float32)
  calls = {
      r"ssm.reset: slot ids \[-2\] are outside -1..4": lambda: ssm.reset(
          fresh(), ids(0, -2, 1), S0, spec),
      r"ssm.verify: slot ids \[5, 7\] are outside -1..4": lambda: ssm.verify(
          fresh(), *x, A_log, dt_bias, ids(7, 5, 0), spec),
      r"ssm.decode: slot ids \[3\] repeat in one batch": lambda: ssm.decode(
          fresh(), *(y[:, :1] for y in x), A_log, dt_bias, ids(3, -1, 3), spec),
      r"ssm.commit: accepted counts \[3\] are outside 0..2": lambda: ssm.commit(
          fresh(), ids(0, 1, -1), ids(2, 3, 0), spec),
      r"ssm.commit: accepted counts \[-1\] are outside 0..2": lambda: ssm.commit(
          fresh(), ids(0, 1, 2), ids(0, -1, 1), spec),
      r"ssm.materialize: slot ids \[5\] are outside -1..4": lambda: ssm.materialize(
          fresh(), ids(5, 0, 1), spec),
  }
  for message, call in calls.items():
    with pytest.raises(jax.errors.JaxRuntimeError, match=message):
      jax.block_until_ready(call())

  def step(spec):  # padding rows and a padding row's out-of-range count pass the checks
    slot_ids = ids(4, -1, 0)
    cache = ssm.reset(ssm.init(GDN, spec, SLOTS, dtype=jnp.float32), slot_ids, S0, spec)
    o, cache = ssm.verify(cache, *x, A_log, dt_bias, slot_ids, spec)
    cache = ssm.commit(cache, slot_ids, ids(1, 9, T), spec)
    return o, ssm.materialize(cache, slot_ids, spec)

  for got, want in zip(step(spec), step(plain)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
