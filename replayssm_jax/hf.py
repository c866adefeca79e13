"""Load and save dense Hugging Face Qwen3.5 / Qwen3-Next checkpoints as `HybridLM`.

A checkpoint is a local folder with ``config.json`` and ``*.safetensors`` (one file or
shards; nothing is fetched from the hub). Supported ``model_type``:

- ``qwen3_5_text`` (``Qwen3_5ForCausalLM``): tensors under ``model.``;
- ``qwen3_5`` (``Qwen3_5ForConditionalGeneration``): the ``text_config`` and the tensors
  under ``model.language_model.``; the vision tower (``model.visual.*``) is ignored;
- ``qwen3_next`` (``Qwen3NextForCausalLM``) with dense MLPs only (``num_experts = 0``).

Not supported, with an error naming the field: mixture-of-experts models (``qwen3_5_moe``,
Qwen3-Next with ``num_experts > 0``), RoPE scaling other than ``"default"``, a
``layer_types`` list that is not "every n-th layer is full attention", attention biases,
activations other than silu. Multi-token-prediction heads (``mtp.*``) are skipped.
Qwen3.5's multimodal RoPE (``mrope_section``) equals plain RoPE for text positions.

Name map (HF torch layout ``[out, in]`` <-> our kernels ``[in, out]``), layer ``i``:

    model.embed_tokens.weight                  embed_tokens [vocab, D]
    model.layers.{i}.input_layernorm.weight    {gdn,attn}_layers.input_layernorm.weight[l]
    model.layers.{i}.post_attention_layernorm.weight
    model.layers.{i}.mlp.{gate,up,down}_proj.weight     ...mlp.{gate,up,down}_proj.kernel[l] (T)
    model.layers.{i}.linear_attn.*             gdn_layers.linear_attn.*[g]
                                               (via layers.convert_hf_gdn_weights)
    model.layers.{i}.self_attn.{q,k,v,o}_proj.weight    attn_layers.self_attn.*_proj.kernel[a] (T)
    model.layers.{i}.self_attn.{q,k}_norm.weight        attn_layers.self_attn.{q,k}_norm.weight[a]
    model.norm.weight                          norm.weight
    lm_head.weight                             lm_head [D, vocab] (T; absent when tied)
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from replayssm_jax.config import GDNConfig
from replayssm_jax.layers import convert_hf_gdn_weights
from replayssm_jax.models.config import FULL_ATTENTION, LINEAR_ATTENTION, HybridConfig
from replayssm_jax.models.hybrid import HybridLM

_DENSE_TYPES = ("qwen3_5_text", "qwen3_next")
_MOE_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")
_IGNORED_PREFIXES = ("model.visual.", "mtp.", "model.mtp.")


# ----------------------------------------------------------------------------- config


def _text_config(config: Mapping[str, Any]) -> dict[str, Any]:
  """The text-model part of an HF config dict (``text_config`` of a ``qwen3_5`` wrapper)."""
  model_type = config.get("model_type")
  if model_type in ("qwen3_5", "qwen3_5_moe"):
    text = config.get("text_config")
    if not isinstance(text, Mapping):
      raise ValueError(f"HF config: model_type={model_type!r} needs a `text_config` dict.")
    text = dict(text)
    text.setdefault("model_type", model_type + "_text")
    if "tie_word_embeddings" in config:  # the wrapper decides whether lm_head is tied
      text["tie_word_embeddings"] = config["tie_word_embeddings"]
    return text
  return dict(config)


def _field(text: Mapping[str, Any], name: str, default: Any = None):
  if name in text and text[name] is not None:
    return text[name]
  if default is None:
    raise ValueError(f"HF config: missing field `{name}` (model_type={text.get('model_type')!r}).")
  return default


def _layer_types(text: Mapping[str, Any]) -> list[str]:
  n = _field(text, "num_hidden_layers")
  types = text.get("layer_types")
  if types is None:
    interval = _field(text, "full_attention_interval", 4)
    return [FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(n)]
  types = list(types)
  unknown = sorted(set(types) - {FULL_ATTENTION, LINEAR_ATTENTION})
  if len(types) != n or unknown:
    raise ValueError(f"HF config: layer_types has {len(types)} entries (num_hidden_layers={n}) "
                     f"and unknown kinds {unknown}; expected {n} of {LINEAR_ATTENTION!r} / "
                     f"{FULL_ATTENTION!r}.")
  return types


def gdn_config_from_hf(config: Mapping[str, Any]) -> GDNConfig:
  """The GDN geometry of an HF Qwen3.5 / Qwen3-Next config dict (``config.json``).

  Works for any model of the family, mixture-of-experts ones included (only the
  ``linear_*`` fields, ``layer_types`` and the hidden size are read), so single GDN
  layers of any checkpoint can be loaded with `layers.load_hf_gdn_weights`.

  >>> gdn_config_from_hf({"model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 4,
  ...     "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
  ...     "linear_value_head_dim": 16}).num_gdn_layers
  3

  Raises:
    ValueError: an unknown ``model_type`` or a missing field (named).
  """
  text = _text_config(config)
  model_type = text.get("model_type")
  if model_type not in _DENSE_TYPES + _MOE_TYPES:
    raise ValueError(f"HF config: model_type={model_type!r} is not a Qwen3.5 / Qwen3-Next model; "
                     f"supported: {_DENSE_TYPES + ('qwen3_5',)}.")
  types = _layer_types(text)
  return GDNConfig(
      num_k_heads=_field(text, "linear_num_key_heads"),
      num_v_heads=_field(text, "linear_num_value_heads"),
      head_k_dim=_field(text, "linear_key_head_dim"),
      head_v_dim=_field(text, "linear_value_head_dim"),
      conv_kernel=_field(text, "linear_conv_kernel_dim", 4),
      hidden_size=_field(text, "hidden_size"),
      num_layers=len(types),
      num_gdn_layers=types.count(LINEAR_ATTENTION),
      rms_norm_eps=float(_field(text, "rms_norm_eps", 1e-6)),
      layout="qwen3_next" if model_type == "qwen3_next" else "qwen3_5")


def _check_dense(text: Mapping[str, Any]) -> None:
  """Raise on mixture-of-experts configs, naming the field that makes them MoE."""
  model_type = text.get("model_type")
  if model_type in _MOE_TYPES:
    raise ValueError(f"HF config: model_type={model_type!r} is a mixture-of-experts model; "
                     "HybridLM has dense MLPs only (MoE checkpoints are not supported).")
  experts = text.get("num_experts") or 0
  if experts > 0:
    n = _field(text, "num_hidden_layers")
    dense_only = set(text.get("mlp_only_layers") or [])
    step = text.get("decoder_sparse_step") or 1
    moe = [i for i in range(n) if i not in dense_only and (i + 1) % step == 0]
    if moe:
      raise ValueError(f"HF config: num_experts={experts} makes layers {moe[:8]}"
                       f"{'...' if len(moe) > 8 else ''} mixture-of-experts (see also "
                       "mlp_only_layers, decoder_sparse_step); HybridLM has dense MLPs only "
                       "(MoE checkpoints are not supported).")


def hybrid_config_from_hf(config: Mapping[str, Any]) -> HybridConfig:
  """`HybridConfig` of a dense HF Qwen3.5 / Qwen3-Next config dict.

  Raises:
    ValueError: naming the field, for MoE configs, unsupported RoPE scaling, a
      non-periodic ``layer_types``, attention biases, a non-silu activation, a
      missing field or an unknown ``model_type``.
  """
  text = _text_config(config)
  model_type = text.get("model_type")
  if model_type not in _DENSE_TYPES + _MOE_TYPES:
    raise ValueError(f"HF config: model_type={model_type!r} is not supported; use one of "
                     f"{_DENSE_TYPES + ('qwen3_5',)} (dense Qwen3.5 / Qwen3-Next).")
  _check_dense(text)
  if _field(text, "hidden_act", "silu") != "silu":
    raise ValueError(f"HF config: hidden_act={text['hidden_act']!r} is not supported (silu only).")
  if text.get("attention_bias"):
    raise ValueError("HF config: attention_bias=True is not supported (no attention biases).")
  rope = dict(text.get("rope_parameters") or {})
  scaling = dict(text.get("rope_scaling") or {})
  rope_type = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
  if rope_type != "default":
    raise ValueError(f"HF config: rope_parameters.rope_type={rope_type!r} is not supported "
                     "(plain RoPE only).")
  types = _layer_types(text)
  n = len(types)
  interval = types.index(FULL_ATTENTION) + 1 if FULL_ATTENTION in types else n + 1
  periodic = [FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(n)]
  if types != periodic or interval < 2:
    raise ValueError(f"HF config: layer_types={types} is not 'every n-th layer is full "
                     "attention' (n >= 2); HybridLM needs that pattern.")
  heads = _field(text, "num_attention_heads")
  hidden = _field(text, "hidden_size")
  return HybridConfig(
      vocab_size=_field(text, "vocab_size"),
      hidden_size=hidden,
      intermediate_size=_field(text, "intermediate_size"),
      num_layers=n,
      full_attention_interval=interval,
      num_attention_heads=heads,
      num_key_value_heads=_field(text, "num_key_value_heads"),
      head_dim=text.get("head_dim") or hidden // heads,
      rope_theta=float(rope.get("rope_theta", _field(text, "rope_theta", 10000.0))),
      partial_rotary_factor=float(rope.get("partial_rotary_factor",
                                           _field(text, "partial_rotary_factor", 0.25))),
      max_position_embeddings=_field(text, "max_position_embeddings", 32768),
      rms_norm_eps=float(_field(text, "rms_norm_eps", 1e-6)),
      tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
      gdn=gdn_config_from_hf(text))


def hf_config_from_hybrid(config: HybridConfig, *, dtype=jnp.float32) -> dict[str, Any]:
  """The HF ``config.json`` dict of ``config`` (``qwen3_5_text`` or dense ``qwen3_next``)."""
  for field in ("attn_output_gate", "qk_norm"):
    if not getattr(config, field):
      raise ValueError(f"save_hf_model: HybridConfig.{field}=False has no HF Qwen3.5 / "
                       "Qwen3-Next equivalent.")
  gdn = config.gdn
  out = {
      "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
      "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
      "num_attention_heads": config.num_attention_heads,
      "num_key_value_heads": config.num_key_value_heads, "head_dim": config.head_dim,
      "hidden_act": "silu", "max_position_embeddings": config.max_position_embeddings,
      "rms_norm_eps": config.rms_norm_eps, "tie_word_embeddings": config.tie_word_embeddings,
      "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02,
      "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta,
                          "partial_rotary_factor": config.partial_rotary_factor},
      "layer_types": list(config.layer_types),
      "linear_conv_kernel_dim": gdn.conv_kernel, "linear_key_head_dim": gdn.head_k_dim,
      "linear_value_head_dim": gdn.head_v_dim, "linear_num_key_heads": gdn.num_k_heads,
      "linear_num_value_heads": gdn.num_v_heads, "use_cache": True,
      "dtype": jnp.dtype(dtype).name,
  }
  if gdn.layout == "qwen3_next":
    out.update(model_type="qwen3_next", architectures=["Qwen3NextForCausalLM"], num_experts=0,
               mlp_only_layers=[], decoder_sparse_step=1)
  else:
    out.update(model_type="qwen3_5_text", architectures=["Qwen3_5ForCausalLM"])
  return out


# ----------------------------------------------------------------------------- name map


@dataclasses.dataclass(frozen=True)
class _Entry:
  """One HF tensor and where it lives in `HybridLM`."""

  hf_name: str  # full HF name
  hf_shape: tuple[int, ...]  # torch layout
  path: tuple[str, ...]  # attribute path of the nnx.Param from the model
  index: int | None  # position on the stacked layer axis, None for unstacked params
  kind: str  # "linear" ([out, in] <-> [in, out]), "conv" ([C, 1, k] <-> [C, k]), "plain"


def _gdn_entries(gdn: GDNConfig) -> list[tuple[str, tuple[int, ...], str, str]]:
  """(HF name under linear_attn., torch shape, our param name, kind) of one GDN layer."""
  D, H, HV, K, V = gdn.hidden_size, gdn.num_k_heads, gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim
  if gdn.layout == "qwen3_next":
    proj = [("in_proj_qkvz", 2 * H * K + 2 * HV * V), ("in_proj_ba", 2 * HV)]
  else:
    proj = [("in_proj_qkv", gdn.conv_dim), ("in_proj_z", HV * V), ("in_proj_b", HV),
            ("in_proj_a", HV)]
  rows = [(f"{name}.weight", (width, D), name, "linear") for name, width in proj]
  return rows + [("conv1d.weight", (gdn.conv_dim, 1, gdn.conv_kernel), "conv1d", "conv"),
                 ("dt_bias", (HV,), "dt_bias", "plain"), ("A_log", (HV,), "A_log", "plain"),
                 ("norm.weight", (V,), "norm", "plain"),
                 ("out_proj.weight", (D, HV * V), "out_proj", "linear")]


def _entries(config: HybridConfig, prefix: str) -> list[_Entry]:
  """Tensors of a dense ``config`` checkpoint under ``prefix`` (``model.[language_model.]``)."""
  c = config
  D, I, Dh = c.hidden_size, c.intermediate_size, c.head_dim
  H, KVH = c.num_attention_heads, c.num_key_value_heads
  out = [_Entry(prefix + "embed_tokens.weight", (c.vocab_size, D), ("embed_tokens",), None,
                "plain"),
         _Entry(prefix + "norm.weight", (D,), ("norm", "weight"), None, "plain")]
  if not c.tie_word_embeddings:
    out.append(_Entry("lm_head.weight", (c.vocab_size, D), ("lm_head",), None, "linear"))

  def common(stack: str, layer: int, index: int) -> list[_Entry]:
    p = f"{prefix}layers.{layer}."
    norms = [_Entry(p + f"{name}.weight", (D,), (stack, name, "weight"), index, "plain")
             for name in ("input_layernorm", "post_attention_layernorm")]
    mlp = [_Entry(p + f"mlp.{name}.weight", shape, (stack, "mlp", name, "kernel"), index, "linear")
           for name, shape in (("gate_proj", (I, D)), ("up_proj", (I, D)), ("down_proj", (D, I)))]
    return norms + mlp

  for g in range(c.num_gdn_layers):
    i = c.gdn_layer_index(g)
    out += common("gdn_layers", i, g)
    for name, shape, param, kind in _gdn_entries(c.gdn):
      out.append(_Entry(f"{prefix}layers.{i}.linear_attn.{name}", shape,
                        ("gdn_layers", "linear_attn", param), g, kind))
  q_width = H * Dh * (2 if c.attn_output_gate else 1)
  for a in range(c.num_attention_layers):
    i = c.attention_layer_index(a)
    out += common("attn_layers", i, a)
    p = f"{prefix}layers.{i}.self_attn."
    for name, shape in (("q_proj", (q_width, D)), ("k_proj", (KVH * Dh, D)),
                        ("v_proj", (KVH * Dh, D)), ("o_proj", (D, H * Dh))):
      out.append(_Entry(p + name + ".weight", shape, ("attn_layers", "self_attn", name, "kernel"),
                        a, "linear"))
    for name in ("q_norm", "k_norm"):
      out.append(_Entry(p + name + ".weight", (Dh,), ("attn_layers", "self_attn", name, "weight"),
                        a, "plain"))
  return out


def _to_ours(w: np.ndarray, kind: str) -> np.ndarray:
  if kind == "linear":
    return w.T
  if kind == "conv":
    return w[:, 0, :]
  return w


def _to_hf(w: np.ndarray, kind: str) -> np.ndarray:
  if kind == "linear":
    return np.ascontiguousarray(w.T)
  if kind == "conv":
    return np.ascontiguousarray(w[:, None, :])
  return np.ascontiguousarray(w)


def _param(model: HybridLM, path: tuple[str, ...]) -> nnx.Param:
  node = model
  for name in path:
    node = getattr(node, name)
  return node


# ----------------------------------------------------------------------------- load / save


def _read_config(path: str) -> dict[str, Any]:
  cfg_path = os.path.join(path, "config.json")
  if not os.path.isfile(cfg_path):
    raise FileNotFoundError(f"load_hf_model: no config.json in {path!r}.")
  with open(cfg_path) as f:
    return json.load(f)


def _prefix(names) -> str:
  wrapped = any(n.startswith("model.language_model.") for n in names)
  return "model.language_model." if wrapped else "model."


def load_hf_model(path: str, *, dtype=jnp.float32,
                  param_dtype=jnp.float32) -> tuple[HybridLM, HybridConfig]:
  """A `HybridLM` with the weights of a local dense HF Qwen3.5 / Qwen3-Next checkpoint.

  Args:
    path: a folder with ``config.json`` and one or more ``*.safetensors`` files.
    dtype: activation dtype of the model.
    param_dtype: dtype the parameters are stored in (tensors are cast).

  Returns:
    ``(model, config)``.

  Raises:
    ValueError: an unsupported config (MoE, RoPE scaling, ... : the field is named), a
      missing tensor (named), a tensor of the wrong shape (name, expected and given
      shapes), or tensors the model has no place for (named).
    FileNotFoundError: no config.json or no safetensors file in ``path``.
  """
  from safetensors import safe_open  # optional dependency (the `hf` extra)

  config = hybrid_config_from_hf(_read_config(path))
  files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
  if not files:
    raise FileNotFoundError(f"load_hf_model: no *.safetensors file in {path!r}.")
  with contextlib.ExitStack() as stack:
    handles = [stack.enter_context(safe_open(f, framework="numpy")) for f in files]
    where = {name: h for h in handles for name in h.keys()}
    prefix = _prefix(where)
    entries = _entries(config, prefix)
    known = {e.hf_name for e in entries}
    if config.tie_word_embeddings:
      known.add("lm_head.weight")  # a tied checkpoint may still carry a copy
    unexpected = sorted(n for n in where if n not in known and not n.startswith(_IGNORED_PREFIXES))
    if unexpected:
      raise ValueError(f"load_hf_model: {len(unexpected)} tensors have no place in a dense "
                       f"HybridLM of this config, e.g. {unexpected[:5]} (MoE experts? another "
                       "architecture?).")
    tensors = {}
    for e in entries:
      if e.hf_name not in where:
        raise ValueError(f"load_hf_model: missing tensor {e.hf_name!r} (expected shape "
                         f"{e.hf_shape}) in {path!r}.")
      w = where[e.hf_name].get_tensor(e.hf_name)
      if tuple(w.shape) != e.hf_shape:
        raise ValueError(f"load_hf_model: tensor {e.hf_name!r} has shape {tuple(w.shape)}; "
                         f"expected {e.hf_shape}.")
      tensors[e.hf_name] = w
  return _build(config, entries, tensors, prefix, dtype, param_dtype), config


def _build(config: HybridConfig, entries: list[_Entry], tensors: dict[str, np.ndarray],
           prefix: str, dtype, param_dtype) -> HybridLM:
  """Fill an abstract `HybridLM` (no random init) with the converted tensors."""
  model = nnx.eval_shape(lambda: HybridLM(config, rngs=nnx.Rngs(0), dtype=dtype,
                                          param_dtype=param_dtype))
  values: dict[tuple[str, ...], Any] = {}
  for e in entries:
    if e.path[:2] == ("gdn_layers", "linear_attn"):
      continue  # converted per layer below, by the layer's own converter
    w = _to_ours(tensors[e.hf_name], e.kind)
    if e.index is None:
      values[e.path] = w
    else:
      values.setdefault(e.path, {})[e.index] = w
  for g in range(config.num_gdn_layers):
    p = f"{prefix}layers.{config.gdn_layer_index(g)}.linear_attn."
    layer = {e.hf_name[len(p):]: tensors[e.hf_name] for e in entries
             if e.index == g and e.path[:2] == ("gdn_layers", "linear_attn")}
    for name, w in convert_hf_gdn_weights(config.gdn, layer).items():
      values.setdefault(("gdn_layers", "linear_attn", name), {})[g] = w
  for path, w in values.items():
    if isinstance(w, dict):
      w = np.stack([w[i] for i in range(len(w))])
    param = _param(model, path)
    want = param.get_value()
    if tuple(w.shape) != tuple(want.shape):  # a converter and the model disagree: a bug here
      raise AssertionError(f"load_hf_model: {'.'.join(path)} converted to {w.shape}, the model "
                           f"has {want.shape}.")
    param.set_value(jnp.asarray(w, want.dtype))
  leaves = jax.tree_util.tree_leaves_with_path(nnx.state(model))
  abstract = [jax.tree_util.keystr(k) for k, v in leaves if isinstance(v, jax.ShapeDtypeStruct)]
  if abstract:
    raise AssertionError(f"load_hf_model: parameters left without a tensor: {abstract}.")
  return model


def hf_state_dict(model: HybridLM, config: HybridConfig) -> dict[str, np.ndarray]:
  """The model's parameters under HF names, in torch layout (numpy, the param dtype)."""
  out = {}
  for e in _entries(config, "model."):
    w = np.asarray(_param(model, e.path).get_value())
    if e.index is not None:
      w = w[e.index]
    out[e.hf_name] = _to_hf(w, e.kind)
    if out[e.hf_name].shape != e.hf_shape:
      raise AssertionError(f"hf_state_dict: {e.hf_name} came out {out[e.hf_name].shape}, "
                           f"expected {e.hf_shape}.")
  return out


def save_hf_model(model: HybridLM, config: HybridConfig, path: str) -> None:
  """Write ``config.json`` and ``model.safetensors`` that `load_hf_model` and HF transformers read.

  Args:
    model: the model.
    config: its config (``model.config``); ``gdn.layout`` picks ``qwen3_5_text`` or
      ``qwen3_next`` (dense).
    path: the folder (created if needed; existing files of the same names are replaced).
  """
  from safetensors.numpy import save_file  # optional dependency (the `hf` extra)

  if config != model.config:
    raise ValueError("save_hf_model: config differs from model.config.")
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf_config_from_hybrid(config, dtype=model.param_dtype), f, indent=2, sort_keys=True)
  save_file(hf_state_dict(model, config), os.path.join(path, "model.safetensors"),
            metadata={"format": "pt"})
