"""Speculative generation engine: slots, continuous batching, drafters, verification.

- `Engine` (`engine.engine`): a fixed pool of slots; `add_request`, `step`,
  `run_until_done`, `Metrics`.
- Drafters (`engine.drafters`): `NgramDrafter`, `ModelDrafter`, `ScriptedDrafter`
  behind the `Drafter` interface.
- `engine.sampling`: temperature / top-p, per-request keys, greedy, coupled and
  speculative acceptance.
- `ByteTokenizer`, `load_model`, `tiny_random_model`, `DEFAULT_MODEL` (the embedded
  ``tiny-stdlib``): models and tokenizers for the CLI.
"""

from replayssm_jax.engine.drafters import (Draft, Drafter, ModelDrafter, NgramDrafter,
                                           ScriptedDrafter)
from replayssm_jax.engine.engine import SPEC_MODES, Engine, Metrics, Request
from replayssm_jax.engine.loading import DEFAULT_MODEL, load_model, tiny_random_model
from replayssm_jax.engine.tokenizer import ByteTokenizer

__all__ = [
    "DEFAULT_MODEL",
    "SPEC_MODES",
    "ByteTokenizer",
    "Draft",
    "Drafter",
    "Engine",
    "Metrics",
    "ModelDrafter",
    "NgramDrafter",
    "Request",
    "ScriptedDrafter",
    "load_model",
    "tiny_random_model",
]
