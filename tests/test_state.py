"""Cache containers: shapes, dtypes, byte accounting, pytree behaviour under jit."""

import dataclasses
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replayssm_jax.config import GDNConfig, SpecConfig
from replayssm_jax.state import ConvCache, RecurrentCache, ReplayCache, cache_type_for

# A small GQA geometry: H=2, HV=4 (ratio 2), K=8, V=16, conv_dim = 2*2*8 + 4*16 = 96.
GDN = GDNConfig(num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16, conv_kernel=4,
                hidden_size=32, num_layers=4, num_gdn_layers=3)
S, T, L = 3, 2, 8
H, HV, K, V = 2, 4, 8, 16
REPLAY = SpecConfig(draft_tokens=T, ring_len=L)
RECURRENT = SpecConfig(draft_tokens=T, ring_len=L, verify_mode="recurrent")
RING_FIELDS = {"ring_d", "ring_k", "ring_g", "ring_beta", "ring_rawk", "ring_rawv"}
CURSOR_FIELDS = {"write_pos", "cache_base", "is_flush"}


def _shapes(cache) -> dict[str, tuple[tuple[int, ...], jnp.dtype]]:
  """Shape and dtype of each array field (None fields, a copy not kept, left out)."""
  return {f.name: (getattr(cache, f.name).shape, getattr(cache, f.name).dtype)
          for f in dataclasses.fields(cache) if getattr(cache, f.name) is not None}


def _random_like(cache, seed: int):
  """Same shapes and dtypes as ``cache``, fresh random values (numpy RNG: no compiles)."""
  rng = np.random.default_rng(seed)

  def fresh(x):
    if jnp.issubdtype(x.dtype, jnp.floating):
      return jnp.asarray(rng.standard_normal(x.shape), x.dtype)
    if x.dtype == jnp.bool_:
      return jnp.asarray(rng.random(x.shape) < 0.5)
    return jnp.asarray(rng.integers(0, L, x.shape), x.dtype)

  return jax.tree.map(fresh, cache)


# --- shapes and dtypes -------------------------------------------------------------------------


def test_recurrent_cache_shapes():
  cache = RecurrentCache.create(GDN, RECURRENT, S)
  assert _shapes(cache) == {
      "ssm": ((S, HV, V, K), jnp.float32),
      "intermediate": ((S, T, HV, V, K), jnp.float32),
  }
  assert not RING_FIELDS & set(_shapes(cache)) and not CURSOR_FIELDS & set(_shapes(cache))
  assert cache.num_slots == S
  assert not np.any(cache.ssm) and not np.any(cache.intermediate)


def test_recurrent_cache_follows_ssm_dtype():
  spec = SpecConfig(draft_tokens=T, ring_len=L, verify_mode="recurrent", ssm_dtype=jnp.bfloat16)
  cache = RecurrentCache.create(GDN, spec, S)
  assert cache.ssm.dtype == cache.intermediate.dtype == jnp.bfloat16


@pytest.mark.parametrize("act, ring_dtype", [(jnp.bfloat16, None), (jnp.float16, None),
                                             (jnp.bfloat16, jnp.float32), (jnp.float32, None)])
def test_replay_cache_shapes(act, ring_dtype):
  spec = SpecConfig(draft_tokens=T, ring_len=L, ring_dtype=ring_dtype)
  ring = jnp.dtype(act if ring_dtype is None else ring_dtype)
  cache = ReplayCache.create(GDN, spec, S, dtype=act)
  assert _shapes(cache) == {
      "ssm": ((S, HV, V, K), jnp.float32),
      "ring_d": ((S, HV, L, V), ring),
      "ring_k": ((S, H, L, K), ring),
      "ring_g": ((S, HV, L), jnp.float32),
      "ring_beta": ((S, HV, L), jnp.float32),
      "ring_rawk": ((S, H, L, K), jnp.dtype(act)),
      "ring_rawv": ((S, HV, L, V), jnp.dtype(act)),
      "write_pos": ((S,), jnp.int32),
      "cache_base": ((S,), jnp.int32),
      "is_flush": ((S,), jnp.bool_),
  }
  assert "intermediate" not in _shapes(cache)
  assert cache.ssm_copy is None and cache.verify_ssm is cache.ssm
  assert (cache.num_slots, cache.ring_len) == (S, L)
  # Reset cursors: write_pos = cache_base = 0, is_flush = (2T > L) = False.
  assert not np.any(cache.write_pos) and not np.any(cache.cache_base)
  assert not np.any(cache.is_flush)


def test_conv_cache_shapes():
  cache = ConvCache.create(GDN, REPLAY, S, dtype=jnp.float16)
  assert _shapes(cache) == {
      "conv": ((S, 96, 3), jnp.float16),
      "conv_window": ((S, 96, T), jnp.float16),
  }


def test_cache_type_for():
  assert cache_type_for(REPLAY) is ReplayCache
  assert cache_type_for(RECURRENT) is RecurrentCache


# --- byte accounting ---------------------------------------------------------------------------


def test_recurrent_nbytes():
  cache = RecurrentCache.create(GDN, RECURRENT, S)
  fields = cache.field_nbytes()
  assert list(fields) == ["ssm", "intermediate"]
  assert fields == {"ssm": S * HV * V * K * 4, "intermediate": S * T * HV * V * K * 4}
  assert cache.nbytes == sum(fields.values()) == S * (1 + T) * HV * V * K * 4


@pytest.mark.parametrize("copy", [None, jnp.bfloat16], ids=["plain", "copy"])
def test_replay_nbytes(copy):
  spec = dataclasses.replace(REPLAY, checkpoint_copy=copy)
  cache = ReplayCache.create(GDN, spec, S, dtype=jnp.bfloat16)
  fields = cache.field_nbytes()
  assert list(fields) == [f.name for f in dataclasses.fields(ReplayCache)]
  assert all(fields[name] == (0 if getattr(cache, name) is None else getattr(cache, name).nbytes)
             for name in fields)
  rings = S * L * ((HV * V + H * K) * (2 + 2) + 2 * HV * 4)
  copy_bytes = 0 if copy is None else S * HV * V * K * 2
  assert fields["ssm_copy"] == copy_bytes
  assert cache.ring_nbytes == sum(fields[name] for name in RING_FIELDS) == rings
  assert cache.nbytes == sum(fields.values()) == (S * HV * V * K * 4 + rings + S * (4 + 4 + 1)
                                                  + copy_bytes)


def test_replay_cache_keeps_the_checkpoint_copy():
  """`SpecConfig.checkpoint_copy`: a zero bf16 copy beside the checkpoint, which verify reads;
  a cache with and without one are different pytrees (one jitted step each)."""
  spec = dataclasses.replace(REPLAY, checkpoint_copy=jnp.bfloat16)
  cache = ReplayCache.create(GDN, spec, S, dtype=jnp.bfloat16)
  assert _shapes(cache)["ssm_copy"] == ((S, HV, V, K), jnp.bfloat16)
  assert cache.verify_ssm is cache.ssm_copy and not np.any(cache.ssm_copy)
  plain = ReplayCache.create(GDN, REPLAY, S, dtype=jnp.bfloat16)
  assert len(jax.tree.leaves(cache)) == len(jax.tree.leaves(plain)) + 1


def test_conv_nbytes():
  cache = ConvCache.create(GDN, REPLAY, S, dtype=jnp.bfloat16)
  assert cache.nbytes == sum(cache.field_nbytes().values()) == S * 96 * (3 + T) * 2


@pytest.mark.parametrize("make", [
    lambda: RecurrentCache.create(GDN, RECURRENT, S),
    lambda: ReplayCache.create(GDN, REPLAY, S),
    lambda: ConvCache.create(GDN, REPLAY, S),
], ids=["recurrent", "replay", "conv"])
def test_nbytes_on_eval_shape(make):
  """`jax.eval_shape` gives the container with ShapeDtypeStruct leaves; the accounting works."""
  abstract, concrete = jax.eval_shape(make), make()
  assert type(abstract) is type(concrete)
  assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(abstract))
  assert abstract.nbytes == concrete.nbytes
  assert abstract.field_nbytes() == concrete.field_nbytes()


def test_ring_nbytes_on_eval_shape_full_size():
  """397,312 B of rings per layer and slot for Qwen3.5-35B-A3B at L=16 bf16 (research 5.1)."""
  gdn = GDNConfig.preset("qwen3.5-35b-a3b")
  cache = jax.eval_shape(lambda: ReplayCache.create(gdn, SpecConfig(ring_len=16), 1))
  assert cache.ring_nbytes == 397_312


# --- pytree behaviour --------------------------------------------------------------------------


@pytest.mark.parametrize("make, count", [
    (lambda: RecurrentCache.create(GDN, RECURRENT, S), 2),
    (lambda: ReplayCache.create(GDN, REPLAY, S), 10),
    (lambda: ConvCache.create(GDN, REPLAY, S), 2),
], ids=["recurrent", "replay", "conv"])
def test_containers_are_pytrees(make, count):
  cache = make()
  leaves, treedef = jax.tree_util.tree_flatten(cache)
  assert len(leaves) == count
  rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
  assert type(rebuilt) is type(cache)
  chex.assert_trees_all_equal(rebuilt, cache)


def test_replace_under_jit():
  cache = ReplayCache.create(GDN, REPLAY, S)

  @jax.jit
  def commit_all(cache, accepted):
    return dataclasses.replace(cache, write_pos=cache.write_pos + accepted,
                               ssm=cache.ssm + 1.0)

  out = commit_all(cache, jnp.array([1, 2, 3], jnp.int32))
  assert isinstance(out, ReplayCache)
  np.testing.assert_array_equal(out.write_pos, [1, 2, 3])
  np.testing.assert_array_equal(out.ssm, np.ones((S, HV, V, K), np.float32))
  np.testing.assert_array_equal(out.ring_d, cache.ring_d)
  with pytest.raises(dataclasses.FrozenInstanceError):
    out.write_pos = cache.write_pos  # frozen: updates go through dataclasses.replace


def test_jit_does_not_retrace_for_new_values():
  @jax.jit
  @chex.assert_max_traces(n=1)
  def step(cache):
    return dataclasses.replace(cache, ssm=cache.ssm * 2.0, write_pos=cache.write_pos + 1)

  template = ReplayCache.create(GDN, REPLAY, S)
  for seed in range(3):
    cache = _random_like(template, seed)
    out = step(cache)
    np.testing.assert_array_equal(out.ssm, cache.ssm * 2.0)
    np.testing.assert_array_equal(out.write_pos, cache.write_pos + 1)


def test_jit_retraces_for_a_new_shape():
  @jax.jit
  @chex.assert_max_traces(n=1)
  def step(cache):
    return dataclasses.replace(cache, ssm=cache.ssm * 2.0)

  step(ReplayCache.create(GDN, REPLAY, S))
  step(_random_like(ReplayCache.create(GDN, REPLAY, S), 0))
  with pytest.raises(AssertionError, match=r"traced > 1 times"):
    step(ReplayCache.create(GDN, REPLAY, S + 1))


def test_donation():
  def step(cache):
    return dataclasses.replace(cache, ring_d=cache.ring_d + 1, write_pos=cache.write_pos + 1)

  cache = ReplayCache.create(GDN, REPLAY, S)
  expected = jax.jit(step)(cache)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = jax.jit(step, donate_argnums=0)(cache)
  # Either the buffers were donated (the inputs are gone) or the backend ignored donation
  # and said so (allowed on CPU); any other warning is a failure.
  ignored = [w for w in caught if "Some donated buffers were not usable" in str(w.message)]
  assert len(ignored) == len(caught), [str(w.message) for w in caught]
  assert cache.ring_d.is_deleted() or ignored
  assert isinstance(out, ReplayCache)
  chex.assert_trees_all_equal(out, expected)
  chex.assert_trees_all_equal_shapes_and_dtypes(out, expected)


# --- history: the ring in logical order ----------------------------------------------------------


def test_history_reads_the_ring_in_logical_order():
  cb, wp = np.array([0, 5, 7]), np.array([0, 3, 8])
  s_, h_, p_ = np.meshgrid(np.arange(S), np.arange(HV), np.arange(L), indexing="ij")
  g = 100.0 * s_ + 10.0 * h_ + p_  # ring_g at slot s, head h, ring index p
  cache = dataclasses.replace(
      ReplayCache.create(GDN, REPLAY, S), ring_g=jnp.asarray(g, jnp.float32),
      cache_base=jnp.asarray(cb, jnp.int32), write_pos=jnp.asarray(wp, jnp.int32))
  records, committed = cache.history("ring_g")
  assert records.shape == (S, L, HV)
  for s in range(S):
    np.testing.assert_array_equal(np.asarray(records[s]), g[s][:, (cb[s] + np.arange(L)) % L].T)
  np.testing.assert_array_equal(np.asarray(committed), np.arange(L)[None, :] < wp[:, None])
  assert cache.history("ring_rawk")[0].shape == (S, L, H, K)
  with pytest.raises(ValueError, match="'ssm' is not a ring of ReplayCache; use one of"):
    cache.history("ssm")


def test_history_holds_the_committed_raw_inputs():
  """After a verify of T tokens and a commit of ``accepted``, the committed raw keys are the
  inputs, in order, whatever the cursors were (xla backend)."""
  from replayssm_jax import ssm

  spec = dataclasses.replace(REPLAY, backend="xla")
  rng = np.random.default_rng(0)
  cache = dataclasses.replace(ReplayCache.create(GDN, spec, S, dtype=jnp.float32),
                              cache_base=jnp.asarray([0, 3, 6], jnp.int32),
                              write_pos=jnp.asarray([0, 2, 4], jnp.int32),
                              is_flush=jnp.zeros((S,), bool))  # no fold: the history stays
  f = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
  q, k, v, a, b = f(S, T, H, K), f(S, T, H, K), f(S, T, HV, V), f(S, T, HV), f(S, T, HV)
  slot_ids = jnp.arange(S, dtype=jnp.int32)
  _, cache = ssm.verify(cache, q, k, v, a, b, f(HV), f(HV), slot_ids, spec)
  accepted = jnp.asarray([2, 1, 0], jnp.int32)
  cache = ssm.commit(cache, slot_ids, accepted, spec)
  rawk, committed = cache.history("ring_rawk")
  for s, (start, n) in enumerate([(0, 2), (2, 1), (4, 0)]):
    assert int(np.sum(committed[s])) == start + n
    np.testing.assert_array_equal(np.asarray(rawk[s, start:start + n]), np.asarray(k[s, :n]))
