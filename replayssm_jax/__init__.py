"""replayssm-jax: ReplaySSM speculative decoding for Gated DeltaNet layers in JAX.

The public API, by layer of the design (imports flow one way, top to bottom):

- `GDNConfig`, `SpecConfig`: geometry and settings (`replayssm_jax.config`).
- `replayssm_jax.reference`: the pure-jnp math, the oracle of every kernel.
- `RecurrentCache`, `ReplayCache`, `ConvCache`: cache pytrees (`replayssm_jax.state`).
- `replayssm_jax.ssm`: `init / reset / verify / commit / decode / materialize`.
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
