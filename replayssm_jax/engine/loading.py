"""Models and tokenizers by name or path, for the engine and the CLI.

- ``"tiny-random"`` or ``"tiny-random:SEED"``: `tiny_random_model`, a small random
  `HybridLM` over the byte vocabulary (`tokenizer.ByteTokenizer`), for smoke tests.
- a folder: a dense HF Qwen3.5 / Qwen3-Next checkpoint (`replayssm_jax.hf.load_hf_model`);
  its tokenizer comes from ``transformers`` when installed and the folder has one, else the
  byte tokenizer (prompts whose bytes fit the vocabulary).
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
from flax import nnx

from replayssm_jax import hf
from replayssm_jax.engine.tokenizer import VOCAB_SIZE, ByteTokenizer
from replayssm_jax.models import HybridConfig, HybridLM

TINY_RANDOM = "tiny-random"

__all__ = ["TINY_RANDOM", "load_model", "tiny_random_config", "tiny_random_model"]


def tiny_random_config() -> HybridConfig:
  """`HybridConfig.tiny` (3 GDN + 1 attention layer, D 64) over the 258-token byte vocabulary.

  ``max_position_embeddings`` is informational in `HybridLM` (the KV length is the engine's
  ``max_len``); it is raised so that long generations do not look out of range.
  """
  return HybridConfig.tiny(vocab_size=VOCAB_SIZE, max_position_embeddings=1 << 16)


def tiny_random_model(seed: int = 0, *, dtype=jnp.float32) -> HybridLM:
  """A `HybridLM` of `tiny_random_config` with random parameters from ``seed``."""
  return HybridLM(tiny_random_config(), rngs=nnx.Rngs(seed), dtype=dtype, param_dtype=dtype)


def _hf_tokenizer(path: str):
  try:
    from transformers import AutoTokenizer  # optional (the `hf` extra)
  except ImportError:
    return None
  try:
    return AutoTokenizer.from_pretrained(path, local_files_only=True)
  except (OSError, ValueError):
    return None


def load_model(name_or_path: str, *, dtype=jnp.float32):
  """``(model, tokenizer, stop_token_ids)`` of a name (``tiny-random[:SEED]``) or an HF folder.

  Raises:
    ValueError: an unknown name, a bad seed, or a folder that is no supported checkpoint.
  """
  if name_or_path == TINY_RANDOM or name_or_path.startswith(TINY_RANDOM + ":"):
    seed_text = name_or_path[len(TINY_RANDOM) + 1:] or "0"
    if not seed_text.isdigit():
      raise ValueError(f"model {name_or_path!r}: the seed after '{TINY_RANDOM}:' must be a "
                       "non-negative integer, e.g. tiny-random:7.")
    tokenizer = ByteTokenizer()
    return tiny_random_model(int(seed_text), dtype=dtype), tokenizer, [tokenizer.eos_token_id]
  if not os.path.isdir(name_or_path):
    raise ValueError(f"model {name_or_path!r} is neither '{TINY_RANDOM}[:SEED]' nor a folder "
                     "with an HF checkpoint (config.json + *.safetensors).")
  model, config = hf.load_hf_model(name_or_path, dtype=dtype, param_dtype=dtype)
  tokenizer = _hf_tokenizer(name_or_path) or ByteTokenizer(config.vocab_size)
  with open(os.path.join(name_or_path, "config.json")) as f:
    eos = json.load(f).get("eos_token_id")
  if eos is None:
    eos = getattr(tokenizer, "eos_token_id", None)
  stops = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
  return model, tokenizer, [t for t in stops if 0 <= t < config.vocab_size]
