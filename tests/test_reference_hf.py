"""The pure-jnp reference against HF transformers' own torch GDN code.

The fixtures in ``tests/data/`` come from ``tools/make_hf_fixtures.py`` (run
once with torch + transformers; this file needs neither). ``hf_gdn_rules.npz``
holds, per case ``r{GQA ratio}_T{tokens}``, the inputs of the delta rule, HF's
``torch_recurrent_gated_delta_rule`` and ``torch_chunk_gated_delta_rule``
(chunk_size 16, l2norm in the kernel) outputs and final states, all states
already in our layout ``[B, HV, V, K]``, plus the raw gating inputs.

Tolerances. Everything here is fp32; the rule's outputs are of order 0.01-0.3
and its states of order 1 (up to about 1.4). Relative 1e-5 alone cannot hold
for entries near zero (an entry of 1e-3 summed from terms of order 1 carries
an absolute rounding error of about 1e-7, i.e. 1e-4 relative), so every
comparison is rtol 1e-5 plus an absolute floor, sized per HF path from the
fixtures' own error against an fp64 recurrence
(``test_fixture_matches_fp64_recurrence``):

- HF recurrent: within 1.3e-8 (beyond rtol) of fp64, our fp32 reference within
  1e-8 of it; atol 1e-7 leaves a 10x margin.
- HF chunk: up to 2.4e-7 off fp64 (its cumulative log-decays reach -400 inside
  a chunk of strong gates and are then differenced, losing bits), and ours lands
  within 2.2e-7 of it; atol 1e-6 is that floor with a 4x margin.

Both floors are far below what a real bug costs here: a tiled GQA mapping, a
missing l2norm or a state read in [K, V] order moves outputs by 1e-2 or more
(``test_fixture_has_teeth`` checks that margin, > 100x atol).
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

from replayssm_jax import reference

DATA = pathlib.Path(__file__).parent / "data"
RULES = np.load(DATA / "hf_gdn_rules.npz")
LAYERS = np.load(DATA / "hf_gdn_layers.npz")
CASES = [str(c) for c in RULES["cases"]]
CHUNK = int(RULES["chunk_size"])

RTOL = 1e-5
# Absolute floors per HF path (module docstring): its own fp32 error against an
# fp64 recurrence, plus ours, with a 4-10x margin.
ATOL = {"recurrent": 1e-7, "chunk": 1e-6}


def case(name: str) -> dict[str, np.ndarray]:
  p = name + "_"
  return {k[len(p):]: RULES[k] for k in RULES.files if k.startswith(p)}


def inputs(c: dict[str, np.ndarray]):
  return tuple(jnp.asarray(c[n]) for n in ("q", "k", "v", "g", "beta", "initial_state"))


def assert_close(actual, desired, atol: float, what: str):
  actual = np.asarray(actual)
  assert actual.shape == desired.shape, f"{what}: shape {actual.shape} != {desired.shape}"
  assert actual.dtype == np.float32, f"{what}: dtype {actual.dtype}"
  np.testing.assert_allclose(actual, desired, rtol=RTOL, atol=atol, err_msg=what)


# --------------------------------------------------------------------------
# The fixtures themselves.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["hf_gdn_rules", "hf_gdn_layers"])
def test_fixture_versions_recorded(fixture):
  z = RULES if fixture == "hf_gdn_rules" else LAYERS
  tv, pv = str(z["transformers_version"]), str(z["torch_version"])
  assert tv and pv
  # Qwen3.5's GDN layer first appears in transformers 5.2.
  major, minor = (int(x) for x in tv.split(".")[:2])
  assert (major, minor) >= (5, 2), tv
  assert pv.split(".")[0].isdigit(), pv


def test_fixture_cases():
  assert CASES == [f"r{r}_T{t}" for r in (2, 4) for t in (1, 5, 37)]
  assert CHUNK == 16
  for name in CASES:
    c = case(name)
    B, T, H, K = c["q"].shape
    HV, V = c["v"].shape[2:]
    assert (B, H, K, V) == (2, 2, 16, 8)
    assert HV == int(name[1]) * H and T == int(name.split("_T")[1])
    for key in ("initial_state", "state_recurrent", "state_chunk"):
      assert c[key].shape == (B, HV, V, K), key
    assert np.all(c["g"] < 0) and np.all((c["beta"] > 0) & (c["beta"] < 1))


def fp64_recurrence(q, k, v, g, beta, S, *, tile_gqa=False, l2norm=True):
  """DESIGN section 1 in numpy fp64, state [B, HV, V, K]; independent of reference.py.

  ``tile_gqa`` and ``l2norm=False`` are deliberate bugs for the teeth test."""
  q, k, v, g, beta, S = (np.asarray(x, np.float64) for x in (q, k, v, g, beta, S))
  H, HV = q.shape[2], v.shape[2]
  heads = np.arange(HV) % H if tile_gqa else np.arange(HV) // (HV // H)
  unit = (lambda x: x / np.sqrt(np.sum(x * x, -1, keepdims=True) + 1e-6)) if l2norm else (lambda x: x)
  q = unit(q)[:, :, heads] / np.sqrt(q.shape[-1])
  k = unit(k)[:, :, heads]
  o = np.zeros(v.shape)
  for t in range(q.shape[1]):
    S = S * np.exp(g[:, t])[..., None, None]
    d = beta[:, t, :, None] * (v[:, t] - np.einsum("bhvk,bhk->bhv", S, k[:, t]))
    S = S + d[..., :, None] * k[:, t][..., None, :]
    o[:, t] = np.einsum("bhvk,bhk->bhv", S, q[:, t])
  return o, S


@pytest.mark.parametrize("name", CASES)
def test_fixture_matches_fp64_recurrence(name):
  """The HF outputs obey the math of DESIGN section 1 in our state layout."""
  c = case(name)
  o, S = fp64_recurrence(c["q"], c["k"], c["v"], c["g"], c["beta"], c["initial_state"])
  # Measured: 1.3e-8 (recurrent) and 2.4e-7 (chunk) beyond rtol; half the floors.
  for path, atol in (("recurrent", 5e-8), ("chunk", 5e-7)):
    np.testing.assert_allclose(c["o_" + path], o, rtol=RTOL, atol=atol, err_msg=path)
    np.testing.assert_allclose(c["state_" + path], S, rtol=RTOL, atol=atol, err_msg=path)


@pytest.mark.parametrize("variant", ["qwen3_next", "qwen3_5", "qwen3_5_gqa4"])
def test_layer_fixture_cached_sequence_consistent(variant):
  """Prefill + decode + continuation through HF's cache reproduces the plain forward."""
  p = variant + "/"
  full = LAYERS[p + "seq_y_full"]
  parts = [LAYERS[p + f"seq_y_{s}"] for s in ("prefill", "decode0", "decode1", "cont")]
  # Measured up to 3.6e-7 on outputs of order 0.5 (decode uses the recurrent rule,
  # the rest the chunk rule, so the sums round differently).
  np.testing.assert_allclose(np.concatenate(parts, axis=1), full, rtol=RTOL, atol=1e-6)
  _, _, hv, kd, vd, kernel = (int(x) for x in LAYERS[p + "config"])
  assert LAYERS[p + "seq_state_cont"].shape == (2, hv, vd, kd)
  assert LAYERS[p + "seq_conv_cont"].shape[-1] == kernel


# --------------------------------------------------------------------------
# replayssm_jax.reference against HF.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", CASES)
def test_gdn_gating_matches_hf(name):
  c = case(name)
  g, beta = reference.gdn_gating(
      jnp.asarray(c["a"]), jnp.asarray(c["b"]), jnp.asarray(c["A_log"]), jnp.asarray(c["dt_bias"]))
  # g spans [-45, -0.1] and beta (0.02, 0.98): both computed elementwise from
  # the same fp32 inputs, so only a few ulps apart; no atol needed.
  np.testing.assert_allclose(np.asarray(g), c["g"], rtol=RTOL, atol=0, err_msg="g")
  np.testing.assert_allclose(np.asarray(beta), c["beta"], rtol=RTOL, atol=0, err_msg="beta")
  assert g.dtype == jnp.float32 and beta.dtype == jnp.float32


def run_ours(fn_name: str, c):
  q, k, v, g, beta, h0 = inputs(c)
  if fn_name == "recurrent":
    return reference.recurrent_gated_delta_rule(q, k, v, g, beta, h0)
  return reference.chunk_gated_delta_rule(q, k, v, g, beta, h0, chunk_size=CHUNK)


@pytest.mark.parametrize("hf_path", ["hf_recurrent", "hf_chunk"])
@pytest.mark.parametrize("ours", ["recurrent", "chunk"])
@pytest.mark.parametrize("name", CASES)
def test_delta_rule_matches_hf(name, ours, hf_path):
  c = case(name)
  o, state = run_ours(ours, c)
  tag = hf_path.removeprefix("hf_")
  assert_close(o, c["o_" + tag], ATOL[tag], f"{name}: ours {ours} o vs HF {tag}")
  assert_close(state, c["state_" + tag], ATOL[tag], f"{name}: ours {ours} final state vs HF {tag}")


@pytest.mark.parametrize("name", CASES)
def test_fixture_has_teeth(name):
  """Plausible bugs miss the fixture by far more than the tolerance: GQA by tiling
  (v-head h reads k-head h % H, not h // r), no l2norm of q and k, and an initial
  state read in HF's [K, V] order (reshaped to fit)."""
  c = case(name)
  args = [c[n] for n in ("q", "k", "v", "g", "beta", "initial_state")]
  B, _, HV, V, K = (*args[2].shape[:3], *args[5].shape[2:])
  h0_kv = np.ascontiguousarray(args[5].swapaxes(-1, -2)).reshape(B, HV, V, K)
  bugs = {
      "tiled GQA": fp64_recurrence(*args, tile_gqa=True),
      "no l2norm": fp64_recurrence(*args, l2norm=False),
      "[K, V] state": fp64_recurrence(*args[:5], h0_kv),
  }
  for what, (o_bad, _) in bugs.items():
    assert np.max(np.abs(o_bad - c["o_recurrent"])) > 100 * ATOL["chunk"], what
