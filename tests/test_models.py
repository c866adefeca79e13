"""`HybridLM` (replayssm_jax.models): verify modes, rollback, padding rows, one compile per step.

One tiny random model (4 layers: 3 GDN + 1 attention) and a fixed set of shapes
(B = 3 rows over 4 slots, prompts padded to 12, windows of T = 4, ring L = 8 so
ReplaySSM folds before almost every verify), so every test reuses the same compiled
steps (and those of tests/test_hf.py, which loads a model of the same config).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import TOLERANCE, rel_err
from replayssm_jax import SpecConfig, ssm
from replayssm_jax.config import GDNConfig
from replayssm_jax.models import HybridCache, HybridConfig, HybridLM
from replayssm_jax.models.hybrid import compiled_step_count

T = 4  # verify window
SLOTS, MAX_LEN, PROMPT = 4, 32, 12
SPECS = {mode: SpecConfig(draft_tokens=T, ring_len=8, verify_mode=mode)
         for mode in ("recurrent", "replayssm")}
# The bitwise fold check runs the Pallas kernels (interpret mode on a CPU): with the "xla"
# backend, XLA compiles the reference recurrent decode and the fold loop differently once
# they are inlined in one model step, and a folded decode record then differs from the
# recurrent state by an ulp (6e-8, measured); the separately jitted ssm functions and the
# Pallas kernels agree bitwise (tests/test_ssm_replay.py).
PALLAS_SPECS = {mode: dataclasses.replace(spec, backend="pallas") for mode, spec in SPECS.items()}
TOL = TOLERANCE[("float32", "default")]
ROWS = jnp.array([2, -1, 0], jnp.int32)  # slot ids of the 3 batch rows; row 1 is padding
PROMPT_LENGTHS = jnp.array([7, 0, 12], jnp.int32)


def tiny_model(seed: int = 0, **overrides) -> HybridLM:
  """`HybridConfig.tiny` with its trivially initialised parameters randomised.

  Block norms get ``w ~ U(-0.5, 0.5)`` (``1 + w`` != 1), the GDN decays ``A ~ U(0.05, 2)``
  (history survives a few tokens) and ``dt_bias ~ N(0, 0.5^2)``, so that a wrong state or
  a wrong position shows in the logits.
  """
  model = HybridLM(HybridConfig.tiny(**overrides), rngs=nnx.Rngs(seed))
  rng = np.random.default_rng(seed)
  for path, param in nnx.iter_graph(model):
    if not isinstance(param, nnx.Param):
      continue
    name = path[-1]
    shape = param.get_value().shape
    if name == "weight":  # the (1 + w) RMSNorms
      param.set_value(jnp.asarray(rng.uniform(-0.5, 0.5, shape), jnp.float32))
    elif name == "A_log":
      param.set_value(jnp.asarray(np.log(rng.uniform(0.05, 2.0, shape)), jnp.float32))
    elif name == "dt_bias":
      param.set_value(jnp.asarray(0.5 * rng.standard_normal(shape), jnp.float32))
    elif name == "embed_tokens":
      param.set_value(jnp.asarray(rng.standard_normal(shape), jnp.float32))
  return model


@pytest.fixture(scope="module")
def model() -> HybridLM:
  return tiny_model()


def tokens(rng: np.random.Generator, *shape: int) -> jax.Array:
  return jnp.asarray(rng.integers(3, 128, shape), jnp.int32)


def prefilled(model: HybridLM, spec: SpecConfig,
              prompts: jax.Array) -> tuple[jax.Array, HybridCache]:
  """A fresh cache with the ROWS' prompts prefilled."""
  cache = model.init_cache(spec, SLOTS, MAX_LEN)
  return model.prefill(cache, prompts, PROMPT_LENGTHS, ROWS, spec)


def layer(tree, g: int):
  """Layer ``g`` of a stacked GDN cache."""
  return jax.tree.map(lambda x: x[g], tree)


def states(cache: HybridCache, spec: SpecConfig, slot_ids: jax.Array) -> list[np.ndarray]:
  """The committed SSM states f32[B, HV, V, K] of every GDN layer (exact replay of the ring)."""
  n = cache.gdn.conv.conv.shape[0]
  return [np.asarray(ssm.materialize(layer(cache.gdn.ssm, g), slot_ids, spec)) for g in range(n)]


def valid(x) -> np.ndarray:
  """The rows of ROWS that are not padding."""
  return np.asarray(x)[np.asarray(ROWS) >= 0]


def copy(cache: HybridCache) -> HybridCache:
  return jax.tree.map(jnp.copy, cache)


# ----------------------------------------------------------------------------- config


def test_config_layout():
  c = HybridConfig.tiny(num_layers=7, full_attention_interval=3)
  assert c.layer_types == ("linear_attention", "linear_attention", "full_attention") * 2 + (
      "linear_attention",)
  assert [c.gdn_layer_index(g) for g in range(c.num_gdn_layers)] == [0, 1, 3, 4, 6]
  assert [c.attention_layer_index(a) for a in range(c.num_attention_layers)] == [2, 5]
  assert (c.num_tail_gdn_layers, c.rotary_dim) == (1, 8)


@pytest.mark.parametrize("field, value, match", [
    ("gdn", GDNConfig(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16,
                      hidden_size=64, num_layers=4, num_gdn_layers=4), "gdn.num_gdn_layers=4"),
    ("full_attention_interval", 1, "full_attention_interval=1"),
    ("num_key_value_heads", 3, "num_key_value_heads=3"),
    ("partial_rotary_factor", 0.03, "partial_rotary_factor=0.03"),
])
def test_config_errors_name_the_field(field, value, match):
  with pytest.raises(ValueError, match=match):
    dataclasses.replace(HybridConfig.tiny(), **{field: value})


def test_step_argument_errors(model):
  spec = SPECS["replayssm"]
  cache = model.init_cache(spec, SLOTS, MAX_LEN)
  with pytest.raises(ValueError, match="draft_tokens"):
    model.verify(cache, jnp.zeros((3, T + 1), jnp.int32), ROWS, spec)
  with pytest.raises(ValueError, match="RecurrentCache"):
    model.verify(cache, jnp.zeros((3, T), jnp.int32), ROWS, SPECS["recurrent"])
  with pytest.raises(ValueError, match="slot_ids must be int32"):
    model.decode(cache, jnp.zeros((3, 1), jnp.int32), ROWS.astype(jnp.int16), spec)
  with pytest.raises(ValueError, match="activation dtype"):
    model.init_cache(spec, SLOTS, MAX_LEN, dtype=jnp.bfloat16)


# ----------------------------------------------------------------------------- verify modes


def test_recurrent_and_replayssm_agree(model):
  """The same schedule through both verify modes: logits and committed states within fp32
  rounding. Whenever a verify has just folded a row, the ReplaySSM checkpoint of the first
  GDN layer (identical inputs in both modes) equals the recurrent committed state bitwise
  (DESIGN section 4); deeper layers see the modes' rounding differences in their inputs."""
  rng = np.random.default_rng(1)
  prompts = tokens(rng, 3, PROMPT)
  run = {}
  for mode, spec in PALLAS_SPECS.items():
    logits, cache = prefilled(model, spec, prompts)
    run[mode] = [logits, cache]
  rec, rep = run["recurrent"], run["replayssm"]
  np.testing.assert_array_equal(rec[0], rep[0])  # prefill does not depend on the mode
  for a, b in zip(states(rec[1], PALLAS_SPECS["recurrent"], ROWS),
                  states(rep[1], PALLAS_SPECS["replayssm"], ROWS)):
    np.testing.assert_array_equal(a, b)

  schedule = [("verify", [4, 0, 1]), ("verify", [2, 0, 4]), ("decode", None), ("verify", [0, 0, 3]),
              ("verify", [1, 0, 1]), ("decode", None), ("verify", [3, 0, 2])]
  slots = jnp.maximum(ROWS, 0)
  folds = 0
  for step, accepted in schedule:
    window = tokens(rng, 3, T if step == "verify" else 1)
    flush = valid(rep[1].gdn.ssm.is_flush[0][slots])  # rows the next verify folds
    for mode, spec in PALLAS_SPECS.items():
      r = run[mode]
      r[0], r[1] = getattr(model, step)(r[1], window, ROWS, spec)
    assert rel_err(valid(rep[0]), valid(rec[0])) <= TOL, step
    if step == "verify":  # the fold just ran: checkpoint == committed state, bitwise
      folded = valid(ROWS)[flush]
      np.testing.assert_array_equal(rep[1].gdn.ssm.ssm[0, folded], rec[1].gdn.ssm.ssm[0, folded])
      folds += len(folded)
    for mode, spec in PALLAS_SPECS.items():
      if accepted is not None:
        run[mode][1] = model.commit(run[mode][1], ROWS, jnp.asarray(accepted, jnp.int32), spec)
    np.testing.assert_array_equal(rec[1].lengths, rep[1].lengths)
    np.testing.assert_array_equal(rec[1].gdn.conv.conv[0], rep[1].gdn.conv.conv[0])
    s_rec = states(rec[1], PALLAS_SPECS["recurrent"], ROWS)
    s_rep = states(rep[1], PALLAS_SPECS["replayssm"], ROWS)
    for g in range(len(s_rec)):
      assert rel_err(s_rep[g], s_rec[g]) <= TOL, (step, g)
  assert folds >= 5  # L = 2 T: ReplaySSM folds before almost every verify


# ----------------------------------------------------------------------------- rollback


@pytest.mark.parametrize("mode", SPECS)
def test_rejected_drafts_leave_no_trace(model, mode):
  """Drafts rejected by commit (accepted=1) change nothing later on: runs that differ only
  in their rejected drafts agree bitwise; a run that never saw them (decode of the root
  token instead of the verify) agrees within fp32 rounding."""
  spec = SPECS[mode]
  rng = np.random.default_rng(2)
  prompts, root, follow = tokens(rng, 3, PROMPT), tokens(rng, 3, 1), tokens(rng, 3, T)
  one = jnp.ones((3,), jnp.int32)
  out = []
  for junk_seed in (10, 11, None):
    _, cache = prefilled(model, spec, prompts)
    if junk_seed is None:  # never saw any draft
      _, cache = model.decode(cache, root, ROWS, spec)
    else:
      drafts = tokens(np.random.default_rng(junk_seed), 3, T - 1)
      _, cache = model.verify(cache, jnp.concatenate([root, drafts], axis=1), ROWS, spec)
      cache = model.commit(cache, ROWS, one, spec)
    logits, cache = model.verify(cache, follow, ROWS, spec)
    cache = model.commit(cache, ROWS, jnp.full((3,), T, jnp.int32), spec)
    last, cache = model.decode(cache, follow[:, :1], ROWS, spec)
    out.append((logits, last, cache))

  (l_a, d_a, c_a), (l_b, d_b, c_b), (l_c, d_c, c_c) = out
  np.testing.assert_array_equal(l_a, l_b)
  np.testing.assert_array_equal(d_a, d_b)
  np.testing.assert_array_equal(c_a.lengths, c_b.lengths)
  for s_a, s_b in zip(states(c_a, spec, ROWS), states(c_b, spec, ROWS)):
    np.testing.assert_array_equal(s_a, s_b)
  lengths = np.asarray(c_a.lengths)
  for slot in valid(ROWS):
    n = lengths[slot]  # KV entries behind the committed length (the drafts sit beyond it)
    np.testing.assert_array_equal(c_a.kv.k[:, slot, :n], c_b.kv.k[:, slot, :n])
    np.testing.assert_array_equal(c_a.kv.v[:, slot, :n], c_b.kv.v[:, slot, :n])
  assert rel_err(valid(l_c), valid(l_a)) <= TOL
  assert rel_err(valid(d_c), valid(d_a)) <= TOL
  np.testing.assert_array_equal(c_a.lengths, c_c.lengths)
  for s_a, s_c in zip(states(c_a, spec, ROWS), states(c_c, spec, ROWS)):
    assert rel_err(s_c, s_a) <= TOL


@pytest.mark.parametrize("mode", SPECS)
def test_full_window_equals_decode_steps(model, mode):
  """verify(T tokens) + commit(T) gives the logits and states of T decode steps."""
  spec = SPECS[mode]
  rng = np.random.default_rng(3)
  prompts, window, nxt = tokens(rng, 3, PROMPT), tokens(rng, 3, T), tokens(rng, 3, 1)
  _, cache_v = prefilled(model, spec, prompts)
  logits_v, cache_v = model.verify(cache_v, window, ROWS, spec)
  cache_v = model.commit(cache_v, ROWS, jnp.full((3,), T, jnp.int32), spec)
  _, cache_d = prefilled(model, spec, prompts)
  steps = []
  for s in range(T):
    logits, cache_d = model.decode(cache_d, window[:, s:s + 1], ROWS, spec)
    steps.append(logits)
  assert rel_err(valid(logits_v), valid(jnp.concatenate(steps, axis=1))) <= TOL
  np.testing.assert_array_equal(cache_v.lengths, cache_d.lengths)
  for s_v, s_d in zip(states(cache_v, spec, ROWS), states(cache_d, spec, ROWS)):
    assert rel_err(s_v, s_d) <= TOL
  after_v, _ = model.decode(cache_v, nxt, ROWS, spec)
  after_d, _ = model.decode(cache_d, nxt, ROWS, spec)
  assert rel_err(valid(after_v), valid(after_d)) <= TOL


# ----------------------------------------------------------------------------- padding, compiles


def slot_view(cache: HybridCache, slots) -> list[np.ndarray]:
  """Every cache array restricted to ``slots`` (GDN and KV leaves carry slots on axis 1)."""
  idx = np.asarray(slots)
  leaves = jax.tree.leaves(dataclasses.replace(cache, lengths=cache.lengths[None]))
  return [np.asarray(x)[:, idx] for x in leaves]


@pytest.mark.parametrize("mode", SPECS)
def test_padding_rows_and_other_slots_untouched(model, mode):
  """Slots 1 and 3 hold requests but are not in the later batches (whose row 1 is padding):
  every cache array of those slots stays bitwise as it was; padding rows get zero logits."""
  spec = SPECS[mode]
  rng = np.random.default_rng(4)
  cache = model.init_cache(spec, SLOTS, MAX_LEN)
  _, cache = model.prefill(cache, tokens(rng, 3, PROMPT), jnp.array([5, 9, 12], jnp.int32),
                           jnp.array([1, 3, -1], jnp.int32), spec)  # slots 1 and 3 hold requests
  before = slot_view(cache, [1, 3])
  logits, cache = model.prefill(cache, tokens(rng, 3, PROMPT), PROMPT_LENGTHS, ROWS, spec)
  np.testing.assert_array_equal(logits[1], 0)
  for step, accepted in (("verify", [2, 4, 1]), ("decode", None), ("verify", [0, 3, 4])):
    logits, cache = getattr(model, step)(cache, tokens(rng, 3, T if step == "verify" else 1),
                                         ROWS, spec)
    np.testing.assert_array_equal(logits[1], 0)
    if accepted is not None:
      cache = model.commit(cache, ROWS, jnp.asarray(accepted, jnp.int32), spec)
  for a, b in zip(before, slot_view(cache, [1, 3])):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mode", SPECS)
def test_each_step_compiles_once(model, mode):
  spec = SPECS[mode]
  rng = np.random.default_rng(5)
  _, cache = prefilled(model, spec, tokens(rng, 3, PROMPT))

  def round_(cache, accepted):
    _, cache = model.verify(cache, tokens(rng, 3, T), ROWS, spec)
    cache = model.commit(cache, ROWS, jnp.asarray(accepted, jnp.int32), spec)
    _, cache = model.decode(cache, tokens(rng, 3, 1), ROWS, spec)
    return cache

  cache = round_(cache, [1, 0, 2])
  compiled = compiled_step_count()
  for accepted in ([4, 0, 0], [2, 0, 3], [0, 0, 1]):
    cache = round_(cache, accepted)
  _, cache = prefilled(model, spec, tokens(rng, 3, PROMPT))
  # Another model of the same config has an equal graphdef: still no new compile.
  _, cache = tiny_model(seed=9).decode(cache, tokens(rng, 3, 1), ROWS, spec)
  assert compiled_step_count() == compiled
  assert all(n >= 1 for n in compiled.values())


def test_tail_gdn_layers_prefill_matches_decode():
  """5 layers with interval 4: one (3 GDN + attention) block plus a tail GDN layer.
  Prefilling n tokens gives the logits of prefilling n - 1 and decoding the last."""
  model = tiny_model(seed=6, num_layers=5)
  assert model.config.num_tail_gdn_layers == 1
  spec = SPECS["replayssm"]
  rng = np.random.default_rng(6)
  prompts = tokens(rng, 3, PROMPT)
  full, _ = prefilled(model, spec, prompts)
  cache = model.init_cache(spec, SLOTS, MAX_LEN)
  _, cache = model.prefill(cache, prompts, PROMPT_LENGTHS - 1, ROWS, spec)
  last = jnp.take_along_axis(prompts, (PROMPT_LENGTHS - 1).clip(0)[:, None], axis=1)
  step, _ = model.decode(cache, last, ROWS, spec)
  want = np.asarray(full)[np.arange(3), np.asarray(PROMPT_LENGTHS - 1).clip(0)]
  assert rel_err(valid(step[:, 0]), valid(want)) <= TOL
