"""replayssm-jax: ReplaySSM speculative decoding for Gated DeltaNet layers in JAX.

The public API, by layer of the design (imports flow one way, top to bottom):

- `GDNConfig`, `SpecConfig`: geometry and settings (`replayssm_jax.config`).
- `replayssm_jax.reference`: the pure-jnp math, the oracle of every kernel.
- `RecurrentCache`, `ReplayCache`, `ConvCache`: cache pytrees (`replayssm_jax.state`).
- `replayssm_jax.ssm`: `init / reset / verify / commit / decode / materialize`.
- `replayssm_jax.layers`: the Flax NNX `GatedDeltaNet` layer (Qwen3-Next / Qwen3.5 layouts).
- `replayssm_jax.models`: `HybridLM`, a GDN + full-attention causal LM with draft rollback.
- `replayssm_jax.hf`: load and save HF Qwen3.5 / Qwen3-Next dense checkpoints (safetensors).

The root imports only the configs and cache containers, so the command line starts fast;
import the submodules above for the layer, the model and the HF loader.
"""

from replayssm_jax.config import GDNConfig, SpecConfig
from replayssm_jax.state import ConvCache, RecurrentCache, ReplayCache

__version__ = "0.1.0"

__all__ = [
    "ConvCache",
    "GDNConfig",
    "RecurrentCache",
    "ReplayCache",
    "SpecConfig",
    "__version__",
]
