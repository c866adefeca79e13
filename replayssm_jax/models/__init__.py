"""Small hybrid models built from the GDN layer: dense Qwen3-Next / Qwen3.5 text models.

- `HybridConfig`: the geometry (HF ``layer_types`` via ``full_attention_interval``).
- `HybridLM`: the Flax NNX model, with `prefill / decode / verify / commit` steps.
- `HybridCache`: the model cache (stacked GDN layer caches, KV caches, per-slot lengths).

Mixture-of-experts models and vision towers are not supported; `replayssm_jax.hf` loads
and saves dense HF checkpoints.
"""

from replayssm_jax.models.attention import KVCache
from replayssm_jax.models.config import HybridConfig
from replayssm_jax.models.hybrid import HybridCache, HybridLM

__all__ = ["HybridCache", "HybridConfig", "HybridLM", "KVCache"]
