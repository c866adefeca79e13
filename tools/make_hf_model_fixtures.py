"""Write the tiny HF Qwen3.5 checkpoint and its logits under ``tests/data/``.

The oracle is Hugging Face transformers' own ``Qwen3_5ForCausalLM`` (pure-torch
fallbacks for the Gated DeltaNet pieces, eager attention) on a tiny random
**dense** text model. The test suite (``tests/test_hf.py``) loads the
checkpoint with ``replayssm_jax.hf.load_hf_model`` and compares logits; it
never imports torch, so this script only has to be run again when the fixture
should change.

How to run it
-------------
Same environment as ``tools/make_hf_fixtures.py`` (Python 3.11, torch 2.13 CPU,
transformers >= 5.2, no triton/fla)::

    cd <repo root> && .hfvenv/bin/python tools/make_hf_model_fixtures.py

It takes a few seconds on a CPU and replaces the kernel-hub / fla wrappers of
the GDN functions with the torch functions they wrap, as the other script does.

Model
-----
``Qwen3_5TextConfig``: vocab 128, hidden 64, intermediate 96, 4 layers with
``layer_types = [linear, linear, linear, full]`` (full_attention_interval 4),
4 attention heads / 2 KV heads of head_dim 16 (partial rotary factor 0.5, so
rotary dim 8), GDN H=2 key heads, HV=4 value heads, K=V=16, conv kernel 4,
untied lm_head. Every parameter is redrawn from a seeded generator; the block
RMSNorms (``1 + w``, zeros at init), q/k norms, the gated norm, ``A_log`` and
``dt_bias`` are pushed away from their trivial init so that a wrong formula
shows in the logits.

Files
-----
``tests/data/tiny_qwen3_5/``: ``config.json`` + ``model.safetensors`` from
``save_pretrained`` (other files removed).

``tests/data/hf_tiny_qwen3_5_logits.npz``, per prompt ``p`` in {0, 1} (each run
alone, batch 1, no padding):

- ``prompt{p}``: int32[T_p], the prompt tokens (T_0 = 7, T_1 = 12).
- ``prefill_logits{p}``: f32[T_p, vocab], the cached prefill forward.
- ``decode_tokens{p}``: int32[5], greedy tokens; token j is fed at decode step j.
- ``decode_logits{p}``: f32[5, vocab], logits of decode step j (one token, cached).
- ``full_logits{p}``: f32[T_p + 5, vocab], a no-cache forward of prompt + the 5
  decode tokens (the cached run must agree with it).
- ``transformers_version``, ``torch_version``, ``generator``.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
import transformers
import transformers.models.qwen3_5.modeling_qwen3_5 as m35
from transformers import DynamicCache, Qwen3_5ForCausalLM, Qwen3_5TextConfig

GDN_FUNCS = (
    "torch_chunk_gated_delta_rule",
    "torch_recurrent_gated_delta_rule",
    "causal_conv1d_fn",
    "causal_conv1d_update",
)
PROMPT_LENGTHS = (7, 12)
DECODE_STEPS = 5


def unwrap_fallbacks() -> None:
  """Point the module's GDN functions at the plain torch functions they wrap."""
  for name in GDN_FUNCS:
    f = getattr(m35, name)
    setattr(m35, name, getattr(f, "__wrapped__", f))


def tiny_config() -> Qwen3_5TextConfig:
  return Qwen3_5TextConfig(
      vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
      layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
      rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                       "partial_rotary_factor": 0.5},
      linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
      linear_num_key_heads=2, linear_num_value_heads=4,
      max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
      hidden_act="silu", pad_token_id=0, bos_token_id=1, eos_token_id=2,
  )


def randomise(model: torch.nn.Module, gen: torch.Generator) -> None:
  """Redraw every parameter from ``gen``, away from trivial inits."""
  uniform = lambda shape, lo, hi: torch.empty(shape).uniform_(lo, hi, generator=gen)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("embed_tokens.weight"):
        p.copy_(torch.randn(p.shape, generator=gen))
      elif p.ndim >= 2:  # projections, lm_head and the depthwise conv: U(-1, 1) / sqrt(fan_in)
        fan_in = p.shape[1] * (p.shape[2] if p.ndim == 3 else 1)
        p.copy_(uniform(p.shape, -1.0, 1.0) / fan_in ** 0.5)
      elif name.endswith("linear_attn.norm.weight"):  # gated norm, plain w (ones at init)
        p.copy_(uniform(p.shape, 0.5, 1.5))
      elif name.endswith("A_log"):
        p.copy_(torch.log(uniform(p.shape, 0.05, 2.0)))
      elif name.endswith("dt_bias"):
        p.copy_(0.5 * torch.randn(p.shape, generator=gen))
      elif name.endswith("norm.weight"):  # block / q / k / final norms, (1 + w), zeros at init
        p.copy_(uniform(p.shape, -0.5, 0.5))
      else:
        raise AssertionError(f"unhandled parameter {name} {tuple(p.shape)}")


def run_prompt(model, prompt: torch.Tensor) -> dict[str, np.ndarray]:
  """Cached prefill + greedy decode of one prompt (batch 1); returns the arrays."""
  cfg = model.config
  with torch.no_grad():
    cache = DynamicCache(config=cfg)
    out = model(prompt[None], cache=cache, use_cache=True)
    prefill = out.logits[0]
    cache = out.cache
    tokens, steps = [], []
    nxt = int(prefill[-1].argmax())
    for _ in range(DECODE_STEPS):
      tokens.append(nxt)
      out = model(torch.tensor([[nxt]]), cache=cache, use_cache=True)
      cache = out.cache
      steps.append(out.logits[0, -1])
      nxt = int(out.logits[0, -1].argmax())
    full = model(torch.cat([prompt, torch.tensor(tokens)])[None]).logits[0]
  decode = torch.stack(steps)
  T = prompt.shape[0]
  cached = torch.cat([prefill, decode])
  print(f"prompt T={T}: |cached - full| = {(cached - full).abs().max().item():.2e}, "
        f"max |logit| = {full.abs().max().item():.2f}, tokens {tokens}")
  return {
      "prompt": prompt.numpy().astype(np.int32),
      "prefill_logits": prefill.numpy().astype(np.float32),
      "decode_tokens": np.array(tokens, np.int32),
      "decode_logits": decode.numpy().astype(np.float32),
      "full_logits": full.numpy().astype(np.float32),
  }


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out-dir", default=os.path.join("tests", "data"))
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args(argv)

  unwrap_fallbacks()
  torch.manual_seed(args.seed)
  gen = torch.Generator().manual_seed(args.seed * 1000 + 35)
  print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
        f"python {sys.version.split()[0]}")
  model = Qwen3_5ForCausalLM(tiny_config()).eval()
  model.config._attn_implementation = "eager"
  randomise(model, gen)

  ckpt = os.path.join(args.out_dir, "tiny_qwen3_5")
  model.save_pretrained(ckpt, safe_serialization=True)
  for fname in os.listdir(ckpt):  # keep config.json + model.safetensors only
    if fname not in ("config.json", "model.safetensors"):
      os.remove(os.path.join(ckpt, fname))
  size = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt))
  print(f"wrote {ckpt}: {sorted(os.listdir(ckpt))}, {size / 1024:.1f} KiB")

  data: dict[str, np.ndarray] = {}
  for p, T in enumerate(PROMPT_LENGTHS):
    prompt = torch.randint(3, tiny_config().vocab_size, (T,), generator=gen)
    for key, arr in run_prompt(model, prompt).items():
      data[f"{key}{p}"] = arr
  data.update({
      "transformers_version": np.array(transformers.__version__),
      "torch_version": np.array(torch.__version__),
      "generator": np.array("tools/make_hf_model_fixtures.py"),
  })
  path = os.path.join(args.out_dir, "hf_tiny_qwen3_5_logits.npz")
  np.savez_compressed(path, **data)
  print(f"wrote {path}: {len(data)} arrays, {os.path.getsize(path) / 1024:.1f} KiB")
  return 0


if __name__ == "__main__":
  sys.exit(main())
