"""Models and tokenizers by name or path, for the engine and the CLI.

- ``"tiny-stdlib"`` (`TINY_STDLIB`, also `DEFAULT_MODEL`): the embedded trained model, an
  8 M-parameter GDN + attention `HybridLM` over the byte vocabulary trained on the Python
  standard library's source by ``tools/train_tiny.py``; its weights ship in the package
  (``replayssm_jax/assets/tiny_stdlib/``, with ``MODEL_CARD.md``).
- ``"tiny-random"`` or ``"tiny-random:SEED"``: `tiny_random_model`, a small random
  `HybridLM` over the byte vocabulary (`tokenizer.ByteTokenizer`), for smoke tests.
- a folder: a dense HF Qwen3.5 / Qwen3-Next checkpoint (`replayssm_jax.hf.load_hf_model`);
  its tokenizer comes from ``transformers`` when installed and the folder has one, else the
  byte tokenizer (prompts whose bytes fit the vocabulary).
"""

from __future__ import annotations

import importlib.resources
import json
import os
from importlib.resources.abc import Traversable

import jax.numpy as jnp
from flax import nnx

from replayssm_jax import hf
from replayssm_jax.engine.tokenizer import VOCAB_SIZE, ByteTokenizer
from replayssm_jax.models import HybridConfig, HybridLM

TINY_RANDOM = "tiny-random"
# The model trained by tools/train_tiny.py, shipped as package data (HF Qwen3.5 layout).
TINY_STDLIB = "tiny-stdlib"
# What the demo and the docs use when no model is named.
DEFAULT_MODEL = TINY_STDLIB
TINY_STDLIB_FILES = ("config.json", "model.safetensors")

__all__ = ["DEFAULT_MODEL", "TINY_RANDOM", "TINY_STDLIB", "load_model", "load_tiny_stdlib",
           "tiny_random_config", "tiny_random_model", "tiny_stdlib_folder"]


def tiny_random_config() -> HybridConfig:
  """`HybridConfig.tiny` (3 GDN + 1 attention layer, D 64) over the 258-token byte vocabulary.

  ``max_position_embeddings`` is informational in `HybridLM` (the KV length is the engine's
  ``max_len``); it is raised so that long generations do not look out of range.
  """
  return HybridConfig.tiny(vocab_size=VOCAB_SIZE, max_position_embeddings=1 << 16)


def tiny_random_model(seed: int = 0, *, dtype=jnp.float32) -> HybridLM:
  """A `HybridLM` of `tiny_random_config` with random parameters from ``seed``."""
  return HybridLM(tiny_random_config(), rngs=nnx.Rngs(seed), dtype=dtype, param_dtype=dtype)


def tiny_stdlib_folder() -> Traversable:
  """The package folder of the embedded model (``replayssm_jax/assets/tiny_stdlib``)."""
  return importlib.resources.files("replayssm_jax").joinpath("assets", "tiny_stdlib")


def load_tiny_stdlib(*, dtype=jnp.float32):
  """``(model, tokenizer, stop_token_ids)`` of the embedded model `TINY_STDLIB`.

  The tokenizer is `ByteTokenizer` and the stop token its ``EOS`` (the separator the model
  saw after every training file).

  Raises:
    FileNotFoundError: the weights are not in this install (a source checkout before the
      trained files were added, or a build that dropped the package data).
  """
  folder = tiny_stdlib_folder()
  missing = [name for name in TINY_STDLIB_FILES if not folder.joinpath(name).is_file()]
  if missing:
    raise FileNotFoundError(
        f"model {TINY_STDLIB!r}: {', '.join(missing)} missing from {folder}; the package data "
        "of this install lacks the trained weights. Train them with tools/train_tiny.py and "
        "copy config.json and model.safetensors there, or use 'tiny-random'.")
  with importlib.resources.as_file(folder) as path:
    model, config = hf.load_hf_model(str(path), dtype=dtype, param_dtype=dtype)
  tokenizer = ByteTokenizer(config.vocab_size)
  return model, tokenizer, [tokenizer.eos_token_id]


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
  """``(model, tokenizer, stop_token_ids)`` of a model name or an HF checkpoint folder.

  Names: ``tiny-stdlib`` (`DEFAULT_MODEL`, `load_tiny_stdlib`) and ``tiny-random[:SEED]``.

  Raises:
    ValueError: an unknown name, a bad seed, or a folder that is no supported checkpoint.
    FileNotFoundError: ``tiny-stdlib`` without its weights (`load_tiny_stdlib`).
  """
  if name_or_path == TINY_STDLIB:
    return load_tiny_stdlib(dtype=dtype)
  if name_or_path == TINY_RANDOM or name_or_path.startswith(TINY_RANDOM + ":"):
    seed_text = name_or_path[len(TINY_RANDOM) + 1:] or "0"
    if not seed_text.isdigit():
      raise ValueError(f"model {name_or_path!r}: the seed after '{TINY_RANDOM}:' must be a "
                       "non-negative integer, e.g. tiny-random:7.")
    tokenizer = ByteTokenizer()
    return tiny_random_model(int(seed_text), dtype=dtype), tokenizer, [tokenizer.eos_token_id]
  if not os.path.isdir(name_or_path):
    raise ValueError(f"model {name_or_path!r} is neither '{TINY_STDLIB}', "
                     f"'{TINY_RANDOM}[:SEED]' nor a folder "
                     "with an HF checkpoint (config.json + *.safetensors).")
  model, config = hf.load_hf_model(name_or_path, dtype=dtype, param_dtype=dtype)
  tokenizer = _hf_tokenizer(name_or_path) or ByteTokenizer(config.vocab_size)
  with open(os.path.join(name_or_path, "config.json")) as f:
    eos = json.load(f).get("eos_token_id")
  if eos is None:
    eos = getattr(tokenizer, "eos_token_id", None)
  stops = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
  return model, tokenizer, [t for t in stops if 0 <= t < config.vocab_size]
