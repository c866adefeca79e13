"""The GatedDeltaNet layer against HF transformers, and its cache protocol.

HF fixtures: ``tests/data/hf_gdn_layers.npz`` (``tools/make_hf_fixtures.py``) holds three
tiny HF layers (``qwen3_next``: grouped qkvz/ba; ``qwen3_5``: plain qkv, z, b, a;
``qwen3_5_gqa4``: GQA ratio 4) with their weights, plain forwards at T in {1, 5, 37}
and a cached sequence (prefill 8 tokens, two decodes, a 3-token continuation).
HF keeps ``kernel`` conv columns, we keep ``kernel - 1`` (= HF's ``[..., 1:]``).

Tolerance against HF: rtol 1e-5 plus atol 2e-6 (outputs of order 0.5-1.2, states of
order 1). The HF fixtures are fp32: our layer run entirely in fp64 differs from them
by up to 1.0e-6 at T=37 (7e-7 beyond rtol; measured 2026 for all three variants),
so that much is HF's own rounding; our fp32 layer lands within 3.2e-7 beyond rtol.
atol 2e-6 is that floor with a 3x margin, and far below what a layout bug costs
(`test_hf_fixture_has_teeth`: swapping a and b moves outputs by > 100x atol).

Every batch carries one padding row (slot -1, NaN inputs) beside the real rows, so
all shapes are B = 3 and the compiled steps are shared between tests.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dataclasses
import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import TOLERANCE, rel_err
from replayssm_jax import GDNConfig, SpecConfig, ssm
from replayssm_jax.layers import (GatedDeltaNet, GDNLayerCache, StatefulGatedDeltaNet,
                                  convert_hf_gdn_weights, load_hf_gdn_weights)

DATA = pathlib.Path(__file__).parent / "data"
LAYERS = np.load(DATA / "hf_gdn_layers.npz")
VARIANTS = ("qwen3_next", "qwen3_5", "qwen3_5_gqa4")
RTOL, ATOL = 1e-5, 2e-6  # module docstring
SLOTS = 4
T_DRAFT = 3  # the fixture's continuation is 3 tokens: one verify window
PAD = -1


def spec_for(mode: str = "recurrent", backend: str = "xla") -> SpecConfig:
  # "ieee": exact fp32 dots in the replay verify (the CPU computes them so anyway).
  return SpecConfig(draft_tokens=T_DRAFT, ring_len=8, verify_mode=mode, backend=backend,
                    dot_precision="ieee")


@pytest.fixture(autouse=True)
def _exact_fp32_dots():
  """fp32 projections at full precision (a GPU would use tf32 by default; the CPU never does)."""
  with jax.default_matmul_precision("highest"):
    yield


def gdn_for(variant: str) -> GDNConfig:
  p = variant + "/"
  D, H, HV, K, V, kernel = (int(x) for x in LAYERS[p + "config"])
  return GDNConfig(num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, conv_kernel=kernel,
                   hidden_size=D, num_layers=1, num_gdn_layers=1,
                   rms_norm_eps=float(LAYERS[p + "rms_norm_eps"]),
                   layout="qwen3_next" if variant == "qwen3_next" else "qwen3_5")


def hf_weights(variant: str) -> dict[str, np.ndarray]:
  """The HF layer's state_dict (names relative to ``linear_attn``)."""
  p = variant + "/"
  names = ("in_proj_qkvz.weight", "in_proj_ba.weight", "in_proj_qkv.weight", "in_proj_z.weight",
           "in_proj_b.weight", "in_proj_a.weight", "conv1d.weight", "dt_bias", "A_log",
           "norm.weight", "out_proj.weight")
  return {n: LAYERS[p + n] for n in names if p + n in LAYERS.files}


@functools.cache
def hf_layer(variant: str) -> GatedDeltaNet:
  layer = GatedDeltaNet(gdn_for(variant), rngs=nnx.Rngs(0))
  load_hf_gdn_weights(layer, hf_weights(variant))
  return layer


# Jitted steps (no donation here, so a test can keep the cache it passed in).
@functools.partial(nnx.jit, static_argnames=("spec",))
def prefill(layer, cache, x, lengths, slot_ids, spec):
  return layer.prefill(cache, x, lengths, slot_ids, spec)


@functools.partial(nnx.jit, static_argnames=("spec",))
def decode(layer, cache, x, slot_ids, spec):
  return layer.decode(cache, x, slot_ids, spec)


@functools.partial(nnx.jit, static_argnames=("spec",))
def verify(layer, cache, x, slot_ids, spec):
  return layer.verify(cache, x, slot_ids, spec)


@functools.partial(nnx.jit, static_argnames=("spec",))
def commit(layer, cache, slot_ids, accepted, spec):
  return layer.commit(cache, slot_ids, accepted, spec)


def ids(*slots: int) -> jax.Array:
  return jnp.asarray(slots, jnp.int32)


def with_pad_row(x: np.ndarray) -> jax.Array:
  """Append a padding row of NaNs to ``x [2, T, D]``: it must not leak anywhere."""
  return jnp.asarray(np.concatenate([x, np.full_like(x[:1], np.nan)], axis=0))


def committed(cache: GDNLayerCache, slot_ids: jax.Array, spec: SpecConfig):
  """(state f32[B, HV, V, K], conv [B, conv_dim, k - 1]) of the rows, as numpy."""
  return (np.asarray(ssm.materialize(cache.ssm, slot_ids, spec)),
          np.asarray(cache.conv.conv[slot_ids]))


def assert_hf(actual, variant: str, key: str, what: str):
  desired = LAYERS[f"{variant}/{key}"]
  if key.startswith(("conv_", "seq_conv_")):
    desired = desired[..., 1:]  # HF keeps `kernel` columns, the oldest is never read
  actual = np.asarray(actual)
  assert actual.shape == desired.shape, f"{what}: {actual.shape} != {desired.shape}"
  np.testing.assert_allclose(actual, desired, rtol=RTOL, atol=ATOL, err_msg=what)


def random_x(rng, B: int, T: int, D: int) -> jax.Array:
  return jnp.asarray(rng.standard_normal((B, T, D)), jnp.float32)


# ----------------------------------------------------------------------------- HF weights


@pytest.mark.parametrize("variant", VARIANTS)
def test_load_hf_weights_layout(variant):
  """Kernels are the HF weights transposed; conv squeezed; names map 1:1."""
  layer, W = hf_layer(variant), hf_weights(variant)
  for hf_name, w in W.items():
    name = hf_name.removesuffix(".weight")
    got = np.asarray(getattr(layer, name)[...])
    want = w[:, 0, :] if name == "conv1d" else (w.T if w.ndim == 2 else w)
    np.testing.assert_array_equal(got, want, err_msg=name)
  assert sorted(convert_hf_gdn_weights(layer.gdn, W)) == sorted(
      n.removesuffix(".weight") for n in W)


def test_load_hf_weights_errors():
  layer = GatedDeltaNet(gdn_for("qwen3_next"), rngs=nnx.Rngs(0))
  W = hf_weights("qwen3_next")
  with pytest.raises(ValueError, match=r"missing \['A_log'\]"):
    load_hf_gdn_weights(layer, {k: v for k, v in W.items() if k != "A_log"})
  with pytest.raises(ValueError, match=r"unexpected \['in_proj_qkv.weight'\]"):
    load_hf_gdn_weights(layer, {**W, "in_proj_qkv.weight": W["in_proj_qkvz.weight"]})
  with pytest.raises(ValueError, match=r"in_proj_ba.weight has shape \(64, 8\); expected \(8, 64\)"):
    load_hf_gdn_weights(layer, {**W, "in_proj_ba.weight": W["in_proj_ba.weight"].T})
  with pytest.raises(ValueError, match="layout 'qwen3_5' expects"):  # a Qwen3-Next checkpoint
    load_hf_gdn_weights(GatedDeltaNet(gdn_for("qwen3_5"), rngs=nnx.Rngs(0)), W)


# ----------------------------------------------------------------------------- prefill vs HF


@pytest.mark.parametrize("T", [1, 5, 37])
@pytest.mark.parametrize("variant", VARIANTS)
def test_prefill_matches_hf(variant, T):
  """Outputs, final state and conv state of a prompt equal HF's plain forward."""
  layer, spec = hf_layer(variant), spec_for()
  cache = layer.init_cache(spec, SLOTS)
  slot_ids = ids(2, 0, PAD)
  y, cache = prefill(layer, cache, with_pad_row(LAYERS[f"{variant}/x_T{T}"]),
                     ids(T, T, T), slot_ids, spec)
  assert y.dtype == jnp.float32
  assert_hf(y[:2], variant, f"y_T{T}", "y")
  np.testing.assert_array_equal(y[2], 0)
  state, conv = committed(cache, slot_ids[:2], spec)
  assert_hf(state, variant, f"state_T{T}", "state")
  assert_hf(conv, variant, f"conv_T{T}", "conv")
  # Slots 1 and 3 were not in the batch (the padding row wrote nothing).
  for s in (1, 3):
    np.testing.assert_array_equal(cache.ssm.ssm[s], 0)
    np.testing.assert_array_equal(cache.conv.conv[s], 0)


def test_hf_fixture_has_teeth():
  """A wrong split of Qwen3-Next's grouped ba (a and b swapped) is caught > 100x atol."""
  W = hf_weights("qwen3_next")
  ba = W["in_proj_ba.weight"].reshape(2, 2, 2, -1)  # [H, (b|a), r, D]
  W["in_proj_ba.weight"] = ba[:, ::-1].reshape(8, -1)
  layer = GatedDeltaNet(gdn_for("qwen3_next"), rngs=nnx.Rngs(0))
  load_hf_gdn_weights(layer, W)
  spec = spec_for()
  y, _ = prefill(layer, layer.init_cache(spec, SLOTS), with_pad_row(LAYERS["qwen3_next/x_T5"]),
                 ids(5, 5, 5), ids(2, 0, PAD), spec)
  assert np.abs(np.asarray(y[:2]) - LAYERS["qwen3_next/y_T5"]).max() > 100 * ATOL


# ----------------------------------------------------------------------------- cached sequence vs HF


# Every variant runs both modes and sees both backends; the grouped Qwen3-Next layout runs all
# four pairs. (All twelve cost about 35 s more of compiles on two CPU cores and found nothing more.)
SEQUENCE_CASES = [("qwen3_next", m, b) for m in ("recurrent", "replayssm") for b in ("xla", "pallas")]
SEQUENCE_CASES += [("qwen3_5", "recurrent", "pallas"), ("qwen3_5", "replayssm", "xla"),
                   ("qwen3_5_gqa4", "recurrent", "xla"), ("qwen3_5_gqa4", "replayssm", "pallas")]


@pytest.mark.parametrize("variant,mode,backend", SEQUENCE_CASES,
                         ids=["-".join(c) for c in SEQUENCE_CASES])
def test_cached_sequence_matches_hf(variant, mode, backend):
  """Prefill 8, decode 2, then HF's 3-token continuation as a verify window + commit(3)."""
  layer, spec = hf_layer(variant), spec_for(mode, backend)
  seq_x = LAYERS[f"{variant}/seq_x"]
  slot_ids = ids(3, 1, PAD)
  rows = slot_ids[:2]
  cache = layer.init_cache(spec, SLOTS)

  def check(y, cache, stage):
    assert_hf(y[:2], variant, f"seq_y_{stage}", f"{stage}: y")
    np.testing.assert_array_equal(y[2], 0)
    state, conv = committed(cache, rows, spec)
    assert_hf(state, variant, f"seq_state_{stage}", f"{stage}: state")
    assert_hf(conv, variant, f"seq_conv_{stage}", f"{stage}: conv")

  y, cache = prefill(layer, cache, with_pad_row(seq_x[:, :8]), ids(8, 8, 8), slot_ids, spec)
  check(y, cache, "prefill")
  for i in range(2):
    y, cache = decode(layer, cache, with_pad_row(seq_x[:, 8 + i:9 + i]), slot_ids, spec)
    check(y, cache, f"decode{i}")
  before = committed(cache, rows, spec)
  y, cache = verify(layer, cache, with_pad_row(seq_x[:, 10:13]), slot_ids, spec)
  # Verify commits nothing: the committed state and conv inputs are those of decode1.
  for a, b in zip(committed(cache, rows, spec), before):
    np.testing.assert_array_equal(a, b)
  cache = commit(layer, cache, slot_ids, ids(3, 3, 0), spec)
  check(y, cache, "cont")
  if mode == "replayssm":  # 2 decodes + 3 accepted records since the prefill's reset
    np.testing.assert_array_equal(cache.ssm.write_pos[rows], 5)


# ----------------------------------------------------------------------------- ragged prefill


def test_ragged_prefill_equals_separate_prefills():
  """Rows of lengths 5, 8 and 2 (< k - 1) padded to 8 equal their unpadded prefills."""
  layer, spec = hf_layer("qwen3_next"), spec_for()
  rng = np.random.default_rng(0)
  lengths = (5, 8, 2)
  x = np.array(random_x(rng, 3, 8, 64))
  for b, n in enumerate(lengths):
    x[b, n:] = np.nan  # what pads a prompt must not leak into the state, conv or outputs
  slot_ids = ids(0, 2, 3)
  y, cache = prefill(layer, layer.init_cache(spec, SLOTS), jnp.asarray(x), ids(*lengths),
                     slot_ids, spec)
  state, conv = committed(cache, slot_ids, spec)
  for b, n in enumerate(lengths):
    one = jnp.asarray(np.concatenate([x[b:b + 1, :n], np.zeros((2, n, 64), np.float32)]))
    y1, c1 = prefill(layer, layer.init_cache(spec, SLOTS), one, ids(n, n, n), ids(1, PAD, PAD), spec)
    s1, v1 = committed(c1, ids(1), spec)
    np.testing.assert_allclose(y[b, :n], y1[0], rtol=1e-6, atol=1e-7, err_msg=f"row {b}: y")
    np.testing.assert_array_equal(y[b, n:], 0)
    np.testing.assert_allclose(state[b], s1[0], rtol=1e-6, atol=1e-7, err_msg=f"row {b}: state")
    np.testing.assert_array_equal(conv[b], v1[0], err_msg=f"row {b}: conv")
  # A prompt shorter than k - 1 leaves zeros before its inputs.
  np.testing.assert_array_equal(conv[2][:, 0], 0)
  assert np.all(conv[2][:, 1:] != 0)


# ----------------------------------------------------------------------------- recurrent vs replayssm


def _prompt(rng, lengths):
  x = np.asarray(random_x(rng, len(lengths), 8, 64))
  return jnp.asarray(x), ids(*lengths)


@pytest.mark.parametrize("backend", ["xla", "pallas"])
def test_recurrent_and_replayssm_agree(backend):
  """Same prompts and windows through both modes: committed states agree step by step;
  right after a fold the ReplaySSM checkpoint IS the recurrent state (bitwise)."""
  layer = hf_layer("qwen3_next")
  specs = {m: spec_for(m, backend) for m in ("recurrent", "replayssm")}
  rng = np.random.default_rng(1)
  x, lengths = _prompt(rng, (8, 5, 1))
  slot_ids = ids(1, 3, 0)
  caches, outs = {}, {}
  for m, spec in specs.items():
    outs[m], caches[m] = prefill(layer, layer.init_cache(spec, SLOTS), x, lengths, slot_ids, spec)
  np.testing.assert_array_equal(outs["replayssm"], outs["recurrent"])
  all_slots = ids(*range(SLOTS))
  folds = 0
  for step in range(10):
    slot_ids = ids(1, PAD if step % 3 == 2 else 3, 0)
    accepted = jnp.asarray(rng.integers(0, T_DRAFT + 1, 3), jnp.int32)
    window = random_x(rng, 3, T_DRAFT, 64)
    rep, rows = caches["replayssm"].ssm, np.asarray(slot_ids)
    # Rows whose verify folds first: marked is_flush with a committed history to fold.
    flush = np.asarray(rep.is_flush)[rows] & (np.asarray(rep.write_pos)[rows] > 0)
    folded = rows[flush & (rows >= 0)]
    rec_state = np.asarray(caches["recurrent"].ssm.ssm)
    for m, spec in specs.items():
      outs[m], caches[m] = verify(layer, caches[m], window, slot_ids, spec)
    np.testing.assert_array_equal(np.asarray(caches["replayssm"].ssm.ssm)[folded], rec_state[folded])
    folds += len(folded)
    assert rel_err(outs["replayssm"], outs["recurrent"]) < TOLERANCE[("float32", "default")]
    for m, spec in specs.items():
      caches[m] = commit(layer, caches[m], slot_ids, accepted, spec)
    got = np.asarray(ssm.materialize(caches["replayssm"].ssm, all_slots, specs["replayssm"]))
    np.testing.assert_allclose(got, caches["recurrent"].ssm.ssm, rtol=1e-6, atol=1e-7,
                               err_msg=f"step {step}")
    np.testing.assert_array_equal(caches["replayssm"].conv.conv, caches["recurrent"].conv.conv)
  assert folds >= 3, folds  # the schedule did exercise the fold


# ----------------------------------------------------------------------------- rollback


@pytest.mark.parametrize("mode", ["recurrent", "replayssm"])
def test_rollback_to_first_token_equals_decoding_it(mode):
  """verify(T tokens) + commit(1) leaves the conv and committed state of decode(token 0)."""
  layer, spec = hf_layer("qwen3_next"), spec_for(mode)
  rng = np.random.default_rng(2)
  x, lengths = _prompt(rng, (8, 6, 3))
  slot_ids = ids(2, 0, 1)
  _, cache = prefill(layer, layer.init_cache(spec, SLOTS), x, lengths, slot_ids, spec)
  window = random_x(rng, 3, T_DRAFT, 64)
  y_dec, by_decode = decode(layer, cache, window[:, :1], slot_ids, spec)
  y_ver, by_verify = verify(layer, cache, window, slot_ids, spec)
  by_verify = commit(layer, by_verify, slot_ids, ids(1, 1, 1), spec)
  np.testing.assert_allclose(y_ver[:, :1], y_dec, rtol=1e-6, atol=1e-7)
  for a, b, what in zip(committed(by_verify, slot_ids, spec), committed(by_decode, slot_ids, spec),
                        ("state", "conv")):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=what)
  # Both continue alike: the rejected drafts left nothing behind.
  nxt = random_x(rng, 3, 1, 64)
  y1, _ = decode(layer, by_decode, nxt, slot_ids, spec)
  y2, _ = decode(layer, by_verify, nxt, slot_ids, spec)
  np.testing.assert_allclose(y2, y1, rtol=1e-6, atol=1e-7)


def test_commit_zero_accepted_keeps_everything():
  layer, spec = hf_layer("qwen3_next"), spec_for("replayssm")
  rng = np.random.default_rng(3)
  x, lengths = _prompt(rng, (8, 4, 7))
  slot_ids = ids(0, 1, 2)
  _, cache = prefill(layer, layer.init_cache(spec, SLOTS), x, lengths, slot_ids, spec)
  before = committed(cache, slot_ids, spec)
  _, cache = verify(layer, cache, random_x(rng, 3, T_DRAFT, 64), slot_ids, spec)
  cache = commit(layer, cache, slot_ids, ids(0, 0, 0), spec)
  for a, b in zip(committed(cache, slot_ids, spec), before):
    np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- padding rows


@pytest.mark.parametrize("mode", ["recurrent", "replayssm"])
def test_padding_rows_write_nothing(mode):
  """A -1 row (NaN inputs) gives zeros and leaves every slot but the real row's untouched."""
  layer, spec = hf_layer("qwen3_next"), spec_for(mode)
  rng = np.random.default_rng(4)
  x, lengths = _prompt(rng, (8, 7, 6))
  full = ids(0, 1, 2)
  _, cache = prefill(layer, layer.init_cache(spec, SLOTS), x, lengths, full, spec)
  _, cache = verify(layer, cache, random_x(rng, 3, T_DRAFT, 64), full, spec)
  cache = commit(layer, cache, full, ids(1, 2, 3), spec)  # every slot holds something now
  slot_ids = ids(PAD, 1, PAD)  # only slot 1 may change

  def nan_rows(x):
    return x.at[jnp.asarray([0, 2])].set(jnp.nan)

  def check(y, new, old):
    np.testing.assert_array_equal(np.asarray(y)[[0, 2]], 0)
    assert np.all(np.isfinite(y[1]))
    for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(old)):
      keep = np.arange(SLOTS) != 1
      np.testing.assert_array_equal(np.asarray(a)[keep], np.asarray(b)[keep])

  y, new = prefill(layer, cache, nan_rows(x), lengths, slot_ids, spec)
  check(y, new, cache)
  y, new = decode(layer, cache, nan_rows(random_x(rng, 3, 1, 64)), slot_ids, spec)
  check(y, new, cache)
  y, new = verify(layer, cache, nan_rows(random_x(rng, 3, T_DRAFT, 64)), slot_ids, spec)
  check(y, new, cache)
  check(jnp.zeros((3,)), commit(layer, new, slot_ids, ids(3, 2, 3), spec), new)


# ----------------------------------------------------------------------------- errors


def test_clear_errors():
  layer = hf_layer("qwen3_next")
  spec = spec_for("replayssm")
  cache = layer.init_cache(spec, SLOTS)
  s = ids(0, 1)
  x = jnp.zeros((2, T_DRAFT, 64), jnp.float32)
  with pytest.raises(ValueError, match=r"x has shape \(2, 3, 32\); expected \(2, 3, 64\)"):
    layer.verify(cache, x[..., :32], s, spec)
  with pytest.raises(ValueError, match=r"x has shape \(2, 2, 64\); expected \(2, 3, 64\)"):
    layer.verify(cache, x[:, :2], s, spec)
  with pytest.raises(ValueError, match=r"expected \(2, 1, 64\)"):
    layer.decode(cache, x, s, spec)
  with pytest.raises(ValueError, match=r"x has shape \(2, 3, 64\); expected \(3, 3, 64\)"):
    layer.verify(cache, x, ids(0, 1, 2), spec)
  with pytest.raises(ValueError, match="x is bfloat16; expected the layer's activation dtype float32"):
    layer.verify(cache, x.astype(jnp.bfloat16), s, spec)
  with pytest.raises(ValueError, match="slot_ids must be int32"):
    layer.verify(cache, x, s.astype(jnp.float32), spec)
  with pytest.raises(ValueError, match="needs a RecurrentCache; given a ReplayCache"):
    layer.verify(cache, x, s, spec_for("recurrent"))
  with pytest.raises(ValueError, match=r"conv_window has shape \(4, 96, 3\); expected \(4, 96, 4\)"):
    layer.verify(cache, jnp.zeros((2, 4, 64)), s, dataclasses.replace(spec, draft_tokens=4))
  bf16 = GDNLayerCache.create(layer.gdn, spec, SLOTS, jnp.bfloat16)
  with pytest.raises(ValueError, match="cache.conv.conv is bfloat16; expected the layer's dtype float32"):
    layer.verify(bf16, x, s, spec)
  with pytest.raises(ValueError, match=r"lengths must be an integer array of shape \(2,\)"):
    layer.prefill(cache, x, ids(3), s, spec)
  with pytest.raises(ValueError, match=r"accepted must be an integer array of shape \(2,\)"):
    layer.commit(cache, s, jnp.ones((2,), jnp.float32), spec)
  with pytest.raises(ValueError, match=r"x has shape \(2, 64\); expected \(2, T, 64\)"):
    layer.prefill(cache, x[:, 0], ids(1, 1), s, spec)
  with pytest.raises(ValueError, match="expected a GDNLayerCache"):
    layer.decode(cache.ssm, x[:, :1], s, spec)
  other = GDNLayerCache.create(gdn_for("qwen3_5_gqa4"), spec, SLOTS, jnp.float32)
  with pytest.raises(ValueError, match=r"cache.conv.conv has shape \(4, 128, 3\); expected \(4, 96, 3\)"):
    layer.decode(other, x[:, :1], s, spec)


# ----------------------------------------------------------------------------- stateful wrapper


def test_stateful_wrapper_matches_explicit_cache():
  layer, spec = hf_layer("qwen3_5"), spec_for("replayssm")
  rng = np.random.default_rng(5)
  x, lengths = _prompt(rng, (8, 3, 5))
  slot_ids = ids(3, PAD, 0)
  window, token = random_x(rng, 3, T_DRAFT, 64), random_x(rng, 3, 1, 64)
  wrapped = StatefulGatedDeltaNet(layer, spec, SLOTS)
  got = [wrapped.prefill(x, lengths, slot_ids), wrapped.verify(window, slot_ids)]
  wrapped.commit(slot_ids, ids(2, 0, 1))
  got.append(wrapped.decode(token, slot_ids))
  cache = layer.init_cache(spec, SLOTS)
  want = []
  for fn, args in ((prefill, (x, lengths, slot_ids)), (verify, (window, slot_ids))):
    y, cache = fn(layer, cache, *args, spec)
    want.append(y)
  cache = commit(layer, cache, slot_ids, ids(2, 0, 1), spec)
  y, cache = decode(layer, cache, token, slot_ids, spec)
  want.append(y)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(wrapped.state(slot_ids), ssm.materialize(cache.ssm, slot_ids, spec),
                             rtol=1e-6, atol=1e-7)
