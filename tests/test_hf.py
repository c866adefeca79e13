"""`replayssm_jax.hf`: a tiny HF Qwen3.5 checkpoint against HF transformers' own logits.

Fixtures: ``tests/data/tiny_qwen3_5/`` (``save_pretrained`` of a random dense
``Qwen3_5ForCausalLM``: 3 GDN + 1 attention layers) and ``hf_tiny_qwen3_5_logits.npz``
(its logits for two prompts, prefill + 5 greedy decode steps), both written by
``tools/make_hf_model_fixtures.py``.

Tolerance: fp32, ``rtol 1e-5`` plus ``atol 2e-6``. The logits reach |2.2|; HF's own cached
run and its no-cache forward of the same tokens differ by up to 5.4e-7 (printed by the
fixture script), so HF itself only pins the logits to a few 1e-7 absolute; 2e-6 is that
spread with a 4x margin (we measure <= 7.2e-7).
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from replayssm_jax import SpecConfig
from replayssm_jax.hf import (gdn_config_from_hf, hybrid_config_from_hf, load_hf_model,
                              save_hf_model)
from replayssm_jax.models import HybridConfig, HybridLM

DATA = Path(__file__).parent / "data"
CKPT = DATA / "tiny_qwen3_5"
RTOL, ATOL = 1e-5, 2e-6
T = 4  # verify window; the shapes below match tests/test_models.py (compiled steps are shared)
SLOTS, MAX_LEN, PROMPT = 4, 32, 12
SPECS = {mode: SpecConfig(draft_tokens=T, ring_len=8, verify_mode=mode)
         for mode in ("recurrent", "replayssm")}
ROWS = jnp.array([2, -1, 0], jnp.int32)  # prompt 0 -> slot 2, a padding row, prompt 1 -> slot 0


@pytest.fixture(scope="module")
def hf():
  return dict(np.load(DATA / "hf_tiny_qwen3_5_logits.npz"))


@pytest.fixture(scope="module")
def loaded():
  return load_hf_model(str(CKPT))


def prefill(model, hf, spec):
  """Both prompts, right-padded to 12, in one batch with a padding row between them."""
  prompts = np.zeros((3, PROMPT), np.int32)
  lengths = np.zeros((3,), np.int32)
  for row, p in ((0, 0), (2, 1)):
    prompt = hf[f"prompt{p}"]
    prompts[row, :len(prompt)], lengths[row] = prompt, len(prompt)
  cache = model.init_cache(spec, SLOTS, MAX_LEN)
  logits, cache = model.prefill(cache, jnp.asarray(prompts), jnp.asarray(lengths), ROWS, spec)
  return np.asarray(logits), lengths, cache


def decode_tokens(hf, j: int, n: int = 1) -> jax.Array:
  """Rows' HF greedy tokens ``j .. j + n - 1`` (the padding row gets zeros)."""
  cols = [hf["decode_tokens0"][j:j + n], np.zeros(n, np.int32), hf["decode_tokens1"][j:j + n]]
  return jnp.asarray(np.stack(cols), jnp.int32)


def test_config_from_checkpoint(loaded):
  _, config = loaded
  assert config == HybridConfig.tiny()  # the fixture's geometry (tests/test_models.py's model)
  assert config.gdn.layout == "qwen3_5" and config.rotary_dim == 8
  assert not config.tie_word_embeddings


@pytest.mark.parametrize("mode", SPECS)
def test_prefill_and_decode_match_hf(loaded, hf, mode):
  model, _ = loaded
  spec = SPECS[mode]
  logits, lengths, cache = prefill(model, hf, spec)
  for row, p in ((0, 0), (2, 1)):
    np.testing.assert_allclose(logits[row, :lengths[row]], hf[f"prefill_logits{p}"], RTOL, ATOL)
  np.testing.assert_array_equal(logits[1], 0)
  for j in range(5):
    step, cache = model.decode(cache, decode_tokens(hf, j), ROWS, spec)
    for row, p in ((0, 0), (2, 1)):
      np.testing.assert_allclose(step[row, 0], hf[f"decode_logits{p}"][j], RTOL, ATOL,
                                 err_msg=f"decode step {j}, prompt {p}")


@pytest.mark.parametrize("mode", SPECS)
def test_verify_window_matches_hf_decode(loaded, hf, mode):
  """The first 4 decode tokens as one verify window (all accepted), then the 5th decoded."""
  model, _ = loaded
  spec = SPECS[mode]
  _, _, cache = prefill(model, hf, spec)
  window, cache = model.verify(cache, decode_tokens(hf, 0, T), ROWS, spec)
  cache = model.commit(cache, ROWS, jnp.array([T, 0, T], jnp.int32), spec)
  last, cache = model.decode(cache, decode_tokens(hf, T), ROWS, spec)
  for row, p in ((0, 0), (2, 1)):
    np.testing.assert_allclose(window[row], hf[f"decode_logits{p}"][:T], RTOL, ATOL)
    np.testing.assert_allclose(last[row, 0], hf[f"decode_logits{p}"][T], RTOL, ATOL)


# ----------------------------------------------------------------------------- errors


def broken_checkpoint(tmp_path: Path, *, drop=(), replace=None, config_update=None) -> str:
  """A copy of the fixture checkpoint with tensors dropped / replaced and config fields changed."""
  tensors = load_file(str(CKPT / "model.safetensors"))
  for name in drop:
    del tensors[name]
  tensors.update(replace or {})
  save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
  config = json.loads((CKPT / "config.json").read_text())
  config.update(config_update or {})
  (tmp_path / "config.json").write_text(json.dumps(config))
  return str(tmp_path)


@pytest.mark.parametrize("name", ["model.layers.1.linear_attn.A_log", "lm_head.weight",
                                  "model.layers.3.self_attn.q_norm.weight"])
def test_missing_tensor_is_named(tmp_path, name):
  with pytest.raises(ValueError, match=f"missing tensor '{name}'"):
    load_hf_model(broken_checkpoint(tmp_path, drop=[name]))


def test_shape_mismatch_names_tensor_and_shapes(tmp_path):
  name = "model.layers.3.self_attn.k_proj.weight"
  path = broken_checkpoint(tmp_path, replace={name: np.zeros((48, 64), np.float32)})
  with pytest.raises(ValueError, match=rf"'{name}' has shape \(48, 64\); expected \(32, 64\)"):
    load_hf_model(path)


def test_unexpected_tensor_is_named(tmp_path):
  name = "model.layers.0.mlp.experts.0.gate_proj.weight"
  path = broken_checkpoint(tmp_path, replace={name: np.zeros((8, 64), np.float32)})
  with pytest.raises(ValueError, match=name):
    load_hf_model(path)


@pytest.mark.parametrize("update, field", [
    ({"model_type": "qwen3_next", "num_experts": 4, "num_experts_per_tok": 2}, "num_experts=4"),
    ({"model_type": "qwen3_5_moe_text"}, "model_type='qwen3_5_moe_text'"),
    ({"model_type": "llama"}, "model_type='llama'"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}},
     "rope_parameters.rope_type='yarn'"),
    ({"layer_types": ["full_attention", "linear_attention"] * 2}, "layer_types="),
    ({"attention_bias": True}, "attention_bias"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
])
def test_unsupported_configs_name_the_field(tmp_path, update, field):
  path = broken_checkpoint(tmp_path, config_update=update)
  with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("(", r"\(")) as err:
    load_hf_model(path)
  if "experts" in str(update) or "moe" in str(update):
    assert "MoE checkpoints are not supported" in str(err.value)


def test_qwen3_next_moe_with_dense_layers_only_loads_config():
  """num_experts > 0 is fine when mlp_only_layers makes every layer dense."""
  config = json.loads((CKPT / "config.json").read_text())
  config.update(model_type="qwen3_next", num_experts=4, mlp_only_layers=[0, 1, 2, 3])
  assert hybrid_config_from_hf(config).gdn.layout == "qwen3_next"


def test_gdn_config_from_hf():
  config = json.loads((CKPT / "config.json").read_text())
  gdn = gdn_config_from_hf(config)
  assert gdn == HybridConfig.tiny().gdn
  text = {**config, "model_type": "qwen3_5_moe_text", "num_experts": 8}
  wrapped = {"model_type": "qwen3_5_moe", "text_config": text}
  assert gdn_config_from_hf(wrapped) == gdn  # single GDN layers of MoE models load fine


# ----------------------------------------------------------------------------- round trips


def test_save_load_round_trip_is_exact(loaded, tmp_path):
  model, config = loaded
  save_hf_model(model, config, str(tmp_path))
  original = load_file(str(CKPT / "model.safetensors"))
  saved = load_file(str(tmp_path / "model.safetensors"))
  assert sorted(saved) == sorted(original)
  for name, w in original.items():
    np.testing.assert_array_equal(saved[name], w, err_msg=name)
  again, config2 = load_hf_model(str(tmp_path))
  assert config2 == config
  for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(again))):
    np.testing.assert_array_equal(a, b)


def test_qwen3_5_wrapper_checkpoint_loads(loaded, tmp_path):
  """``Qwen3_5ForConditionalGeneration`` layout: text_config + ``model.language_model.*``;
  the vision tower and MTP tensors are skipped."""
  model, config = loaded
  tensors = load_file(str(CKPT / "model.safetensors"))
  renamed = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): w
             for k, w in tensors.items()}
  renamed["model.visual.patch_embed.proj.weight"] = np.zeros((4, 3), np.float32)
  renamed["mtp.fc.weight"] = np.zeros((4, 4), np.float32)
  save_file(renamed, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
  text = json.loads((CKPT / "config.json").read_text())
  wrapper = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
             "text_config": text, "vision_config": {"depth": 2}, "tie_word_embeddings": False}
  (tmp_path / "config.json").write_text(json.dumps(wrapper))
  again, config2 = load_hf_model(str(tmp_path))
  assert config2 == config
  for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(again))):
    np.testing.assert_array_equal(a, b)


def test_qwen3_next_tied_round_trip(tmp_path):
  """A dense Qwen3-Next layout (fused in_proj_qkvz / in_proj_ba) with tied embeddings."""
  config = HybridConfig.tiny(layout="qwen3_next", num_layers=5, tie_word_embeddings=True)
  model = HybridLM(config, rngs=nnx.Rngs(7))
  save_hf_model(model, config, str(tmp_path))
  saved = load_file(str(tmp_path / "model.safetensors"))
  assert "lm_head.weight" not in saved
  qkvz = saved["model.layers.4.linear_attn.in_proj_qkvz.weight"]
  assert qkvz.shape == (2 * 2 * 16 + 2 * 4 * 16, 64)  # 2 H K + 2 HV V
  assert json.loads((tmp_path / "config.json").read_text())["num_experts"] == 0
  again, config2 = load_hf_model(str(tmp_path))
  assert config2 == config
  for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(again))):
    np.testing.assert_array_equal(a, b)
