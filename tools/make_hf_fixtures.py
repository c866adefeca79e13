"""Write the HF transformers oracle fixtures under ``tests/data/``.

The fixtures are the outputs of Hugging Face transformers' own pure-torch
Gated DeltaNet code (``torch_recurrent_gated_delta_rule``,
``torch_chunk_gated_delta_rule``, ``Qwen3NextGatedDeltaNet`` and
``Qwen3_5GatedDeltaNet``) on small seeded random inputs. The test suite reads
the ``.npz`` files and never imports torch, so this script only has to be run
again when the fixtures should change.

How to run it
-------------
It needs only torch, transformers (>= 5.2, for ``models/qwen3_5``) and numpy;
``pip install -e .[hf]`` is NOT needed, and replayssm_jax is not imported.
Use Python 3.11, where ``pip install torch==2.13.0`` takes a local CPU build,
and keep triton and fla out of that environment (with both importable,
transformers sends GDN to fla's Triton kernels, which fail on a CPU)::

    python3.11 -m venv .hfvenv
    .hfvenv/bin/pip install torch==2.13.0
    .hfvenv/bin/pip install "transformers>=5.2" safetensors numpy
    cd <repo root> && .hfvenv/bin/python tools/make_hf_fixtures.py

It takes a few seconds on a CPU. Whatever is installed, the script replaces the
kernel-hub / fla wrappers of the four GDN functions with the torch functions
they wrap (``getattr(f, "__wrapped__", f)``), so the oracle is always HF's
reference torch code.

Layouts
-------
Our recurrent state layout is ``[B, HV, V, K]``; HF's is ``[B, HV, K, V]``.
Every state stored here (``initial_state``, ``state_*``) is already transposed
to ours. Conv states are stored as HF keeps them: ``[B, conv_dim, kernel]``,
the last ``kernel`` (= 4) *pre-conv* inputs (channels ordered [q | k | v]); only
the last ``kernel - 1`` columns are read by the next step. All floats are fp32.
Each file carries ``transformers_version`` and ``torch_version`` (string
arrays) and ``generator`` (this script's name).

Files
-----
``hf_gdn_rules.npz``: the delta-rule functions alone, per case ``r{r}_T{T}_``
(GQA ratio r in {2, 4}, T in {1, 5, 37}; B=2, H=2, HV=2r, K=16, V=8, random
initial state, l2norm in the kernel, chunk_size=16).

``hf_gdn_layers.npz``: whole GDN layers (``qwen3_next``, ``qwen3_5``,
``qwen3_5_gqa4``), their weights, no-cache forwards and a cached
prefill / decode / continuation sequence. See ``make_layers`` for the keys.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
import transformers
import transformers.models.qwen3_5.modeling_qwen3_5 as m35
import transformers.models.qwen3_next.modeling_qwen3_next as mnext
from transformers import DynamicCache, Qwen3_5TextConfig, Qwen3NextConfig

GDN_FUNCS = (
    "torch_chunk_gated_delta_rule",
    "torch_recurrent_gated_delta_rule",
    "causal_conv1d_fn",
    "causal_conv1d_update",
)


def unwrap_fallbacks() -> None:
  """Point the modules' GDN functions at the plain torch functions they wrap."""
  for mod in (mnext, m35):
    for name in GDN_FUNCS:
      f = getattr(mod, name)
      setattr(mod, name, getattr(f, "__wrapped__", f))


def to_np(t: torch.Tensor) -> np.ndarray:
  return t.detach().to(torch.float32).cpu().numpy().astype(np.float32)


def state_to_ours(s: torch.Tensor) -> np.ndarray:
  """HF state [B, HV, K, V] -> ours [B, HV, V, K]."""
  return np.ascontiguousarray(to_np(s).swapaxes(-1, -2))


def version_entries() -> dict[str, np.ndarray]:
  return {
      "transformers_version": np.array(transformers.__version__),
      "torch_version": np.array(torch.__version__),
      "generator": np.array("tools/make_hf_fixtures.py"),
  }


# --------------------------------------------------------------------------
# 1. The delta-rule functions alone.
# --------------------------------------------------------------------------

RULE_RATIOS = (2, 4)
RULE_TS = (1, 5, 37)
RULE_B, RULE_H, RULE_K, RULE_V = 2, 2, 16, 8
RULE_CHUNK = 16


def make_rules(seed: int) -> dict[str, np.ndarray]:
  rec = mnext.torch_recurrent_gated_delta_rule
  chunk = mnext.torch_chunk_gated_delta_rule
  out: dict[str, np.ndarray] = {}
  cases = []
  for ci, r in enumerate(RULE_RATIOS):
    for ti, T in enumerate(RULE_TS):
      gen = torch.Generator().manual_seed(seed * 1000 + 10 * ci + ti)
      B, H, K, V = RULE_B, RULE_H, RULE_K, RULE_V
      HV = H * r
      randn = lambda *s, std=1.0: std * torch.randn(*s, generator=gen, dtype=torch.float32)
      q = randn(B, T, H, K)
      k = randn(B, T, H, K)
      v = randn(B, T, HV, V)
      a = randn(B, T, HV)
      b = randn(B, T, HV)
      A_log = torch.log(torch.empty(HV).uniform_(0.01, 16.0, generator=gen))
      dt_bias = randn(HV, std=0.3)
      # The gating exactly as the HF layers compute it (fp32).
      g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
      beta = b.sigmoid()
      h0 = randn(B, HV, K, V, std=0.3)  # HF layout

      with torch.no_grad():
        o_r, s_r = rec(q, k, v, g=g, beta=beta, initial_state=h0.clone(),
                       output_final_state=True, use_qk_l2norm_in_kernel=True)
        o_c, s_c = chunk(q, k, v, g=g, beta=beta, chunk_size=RULE_CHUNK,
                         initial_state=h0.clone(), output_final_state=True,
                         use_qk_l2norm_in_kernel=True)
      name = f"r{r}_T{T}"
      cases.append(name)
      p = name + "_"
      out.update({
          p + "q": to_np(q), p + "k": to_np(k), p + "v": to_np(v),
          p + "g": to_np(g), p + "beta": to_np(beta),
          p + "initial_state": state_to_ours(h0),
          p + "o_recurrent": to_np(o_r), p + "state_recurrent": state_to_ours(s_r),
          p + "o_chunk": to_np(o_c), p + "state_chunk": state_to_ours(s_c),
          p + "a": to_np(a), p + "b": to_np(b),
          p + "A_log": to_np(A_log), p + "dt_bias": to_np(dt_bias),
      })
      print(f"rules {name}: |o_rec - o_chunk| = {(o_r - o_c).abs().max().item():.2e}, "
            f"|S_rec - S_chunk| = {(s_r - s_c).abs().max().item():.2e}, "
            f"g in [{g.min().item():.3g}, {g.max().item():.3g}]")
  out["cases"] = np.array(cases)
  out["chunk_size"] = np.array(RULE_CHUNK, dtype=np.int32)
  out["use_qk_l2norm"] = np.array(True)
  return out


# --------------------------------------------------------------------------
# 2. Whole GDN layers.
# --------------------------------------------------------------------------

D, HK, KD, VD, KERNEL, EPS = 64, 2, 16, 8, 4, 1e-6
LAYER_TS = (1, 5, 37)
LAYER_B = 2
SEQ_PREFILL, SEQ_DECODE, SEQ_CONT = 8, 2, 3


def layer_config(cls, hv: int):
  common = dict(
      hidden_size=D, linear_num_key_heads=HK, linear_num_value_heads=hv,
      linear_key_head_dim=KD, linear_value_head_dim=VD,
      linear_conv_kernel_dim=KERNEL, rms_norm_eps=EPS, hidden_act="silu",
      num_hidden_layers=1, layer_types=["linear_attention"],
      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
      intermediate_size=128, vocab_size=32,
  )
  if cls is Qwen3NextConfig:  # tiny MoE sizes; unused by the GDN layer
    common.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                  shared_expert_intermediate_size=32)
  return cls(**common)


VARIANTS = (
    # name, config class, layer class, value heads
    ("qwen3_next", Qwen3NextConfig, "Qwen3NextGatedDeltaNet", 4),
    ("qwen3_5", Qwen3_5TextConfig, "Qwen3_5GatedDeltaNet", 4),
    ("qwen3_5_gqa4", Qwen3_5TextConfig, "Qwen3_5GatedDeltaNet", 8),
)


def build_layer(cfg_cls, layer_name: str, hv: int, gen: torch.Generator):
  mod = mnext if cfg_cls is Qwen3NextConfig else m35
  cfg = layer_config(cfg_cls, hv)
  layer = getattr(mod, layer_name)(cfg, layer_idx=0).eval()
  with torch.no_grad():
    # Redraw every parameter from the seeded generator (the module init uses
    # the global RNG), and push the ones with a trivial init well away from it.
    for pname, p in layer.named_parameters():
      if p.ndim >= 2:  # projections and the depthwise conv
        fan_in = p.shape[1] * (p.shape[2] if p.ndim == 3 else 1)
        p.copy_(torch.empty(p.shape).uniform_(-1.0, 1.0, generator=gen) / fan_in ** 0.5)
    layer.norm.weight.copy_(torch.empty(VD).uniform_(0.5, 1.5, generator=gen))
    layer.dt_bias.copy_(0.5 * torch.randn(hv, generator=gen))
    # Decays between exp(-0.05 * 0.3) and exp(-2 * 2) per token: the state carries
    # real history over a few tokens (the default A up to 16 mostly wipes it).
    layer.A_log.copy_(torch.log(torch.empty(hv).uniform_(0.05, 2.0, generator=gen)))
  return cfg, layer


def cache_states(cache) -> tuple[np.ndarray, np.ndarray]:
  conv = cache.layers[0].conv_states[0]
  rec = cache.layers[0].recurrent_states[0]
  return to_np(conv), state_to_ours(rec)


def make_layers(seed: int) -> dict[str, np.ndarray]:
  """Keys, per variant ``{name}/``:

  - ``{name}/<param>``: the layer's state_dict (HF names and shapes), e.g.
    ``qwen3_next/in_proj_qkvz.weight``, ``qwen3_5/in_proj_qkv.weight``.
  - ``{name}/config``: int32 [hidden, Hk, Hv, K, V, conv_kernel] and
    ``{name}/rms_norm_eps``.
  - ``{name}/x_T{T}`` [B, T, D], ``{name}/y_T{T}`` (no-cache forward),
    ``{name}/state_T{T}`` [B, HV, V, K] and ``{name}/conv_T{T}`` [B, conv_dim, 4]
    (the same forward on a fresh DynamicCache; its output equals y_T{T}).
  - the sequence ``{name}/seq_x`` [B, 13, D]; ``seq_y_full`` (no-cache forward
    of all 13 tokens); after each stage s in prefill (tokens 0..7), decode0
    (token 8), decode1 (token 9), cont (tokens 10..12, one multi-token call,
    which HF runs through the chunk rule from the cached state):
    ``seq_y_{s}``, ``seq_state_{s}``, ``seq_conv_{s}``.
  """
  out: dict[str, np.ndarray] = {}
  gen = torch.Generator().manual_seed(seed * 1000 + 500)
  for vi, (name, cfg_cls, layer_name, hv) in enumerate(VARIANTS):
    cfg, layer = build_layer(cfg_cls, layer_name, hv, gen)
    p = name + "/"
    for pname, t in layer.state_dict().items():
      out[p + pname] = to_np(t)
    out[p + "config"] = np.array([D, HK, hv, KD, VD, KERNEL], dtype=np.int32)
    out[p + "rms_norm_eps"] = np.array(EPS, dtype=np.float32)
    out[p + "layer_class"] = np.array(type(layer).__name__)

    with torch.no_grad():
      for T in LAYER_TS:
        x = torch.randn(LAYER_B, T, D, generator=gen)
        y = layer(x)
        cache = DynamicCache(config=cfg)
        y_c = layer(x, cache=cache)
        conv, state = cache_states(cache)
        diff = (y - y_c).abs().max().item()
        assert diff <= 1e-6, (name, T, diff)
        out.update({p + f"x_T{T}": to_np(x), p + f"y_T{T}": to_np(y),
                    p + f"state_T{T}": state, p + f"conv_T{T}": conv})
      print(f"layers {name}: conv state {conv.shape}, recurrent state (ours) {state.shape}")

      n = SEQ_PREFILL + SEQ_DECODE + SEQ_CONT
      xs = torch.randn(LAYER_B, n, D, generator=gen)
      y_full = layer(xs)
      out[p + "seq_x"] = to_np(xs)
      out[p + "seq_y_full"] = to_np(y_full)
      cache = DynamicCache(config=cfg)
      stages = [("prefill", 0, SEQ_PREFILL)]
      stages += [(f"decode{i}", SEQ_PREFILL + i, SEQ_PREFILL + i + 1) for i in range(SEQ_DECODE)]
      stages += [("cont", SEQ_PREFILL + SEQ_DECODE, n)]
      for stage, lo, hi in stages:
        y_s = layer(xs[:, lo:hi], cache=cache)
        conv, state = cache_states(cache)
        out.update({p + f"seq_y_{stage}": to_np(y_s), p + f"seq_state_{stage}": state,
                    p + f"seq_conv_{stage}": conv})
        print(f"  seq {name} {stage:8s} tokens {lo:2d}..{hi - 1:2d}: "
              f"|y - y_full| = {(y_s - y_full[:, lo:hi]).abs().max().item():.2e}")
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out-dir", default=os.path.join("tests", "data"),
                  help="where to write the .npz files (default: tests/data)")
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args(argv)

  unwrap_fallbacks()
  torch.manual_seed(args.seed)
  os.makedirs(args.out_dir, exist_ok=True)
  print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
        f"python {sys.version.split()[0]}")
  for fname, fn in (("hf_gdn_rules.npz", make_rules), ("hf_gdn_layers.npz", make_layers)):
    data = fn(args.seed)
    data.update(version_entries())
    for key, arr in data.items():
      if arr.dtype.kind == "f":
        assert arr.dtype == np.float32, key
    path = os.path.join(args.out_dir, fname)
    np.savez_compressed(path, **data)
    print(f"wrote {path}: {len(data)} arrays, {os.path.getsize(path) / 1024:.1f} KiB")
  return 0


if __name__ == "__main__":
  sys.exit(main())
