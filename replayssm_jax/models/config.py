"""`HybridConfig`: the geometry of a dense Qwen3-Next / Qwen3.5 style hybrid model.

Layers follow HF's ``layer_types`` order: layer ``i`` is full attention when
``(i + 1) % full_attention_interval == 0`` and a Gated DeltaNet layer otherwise
(``Qwen3_5TextConfig.__post_init__``). Only dense (SwiGLU) MLPs: mixture-of-experts
checkpoints (Qwen3-Next-80B-A3B, Qwen3.5-*-A*B) are not supported.
"""

from __future__ import annotations

import dataclasses

from replayssm_jax.config import GDNConfig

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"


@dataclasses.dataclass(frozen=True, kw_only=True)
class HybridConfig:
  """Sizes of a dense GDN + full-attention hybrid (HF ``Qwen3_5TextConfig`` names in brackets).

  Attributes:
    vocab_size: tokens [vocab_size].
    hidden_size: model width D [hidden_size].
    intermediate_size: SwiGLU MLP width [intermediate_size]; every layer is dense.
    num_layers: decoder layers [num_hidden_layers].
    full_attention_interval: every n-th layer (1-based) is full attention, the others
      are GDN layers [full_attention_interval, or the pattern of layer_types]; >= 2.
    num_attention_heads: query heads of the full-attention layers.
    num_key_value_heads: KV heads (GQA: query head h reads KV head h // (heads / kv_heads)).
    head_dim: attention head width.
    rope_theta: RoPE base [rope_parameters.rope_theta].
    partial_rotary_factor: RoPE rotates the first ``int(head_dim * factor)`` dims of
      each head and passes the rest through [rope_parameters.partial_rotary_factor].
    max_position_embeddings: the longest context the checkpoint was trained for
      (informational; the KV cache length is `HybridLM.init_cache`'s ``max_len``).
    rms_norm_eps: epsilon of every RMSNorm.
    tie_word_embeddings: the lm_head reuses the token embedding.
    attn_output_gate: full attention multiplies its output by ``sigmoid(gate)``, the
      gate coming from a q_proj of twice the width (Qwen3-Next / Qwen3.5: True).
    qk_norm: per-head RMSNorm of q and k before RoPE (Qwen3-Next / Qwen3.5: True).
    gdn: the GDN layer geometry; ``gdn.hidden_size``, ``gdn.num_layers`` and
      ``gdn.num_gdn_layers`` must agree with the fields above.
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  full_attention_interval: int = 4
  num_attention_heads: int
  num_key_value_heads: int
  head_dim: int
  rope_theta: float = 10000.0
  partial_rotary_factor: float = 0.25
  max_position_embeddings: int = 32768
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  attn_output_gate: bool = True
  qk_norm: bool = True
  gdn: GDNConfig

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim",
                 "max_position_embeddings"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"HybridConfig.{name}={value!r} must be a positive integer.")
    if not isinstance(self.full_attention_interval, int) or self.full_attention_interval < 2:
      raise ValueError(
          f"HybridConfig.full_attention_interval={self.full_attention_interval!r} must be an "
          "integer >= 2 (interval 1 would leave no GDN layer).")
    if self.num_attention_heads % self.num_key_value_heads:
      raise ValueError(
          f"HybridConfig.num_attention_heads={self.num_attention_heads} must be a multiple of "
          f"num_key_value_heads={self.num_key_value_heads}.")
    rotary = self.rotary_dim
    if not 0 < rotary <= self.head_dim or rotary % 2:
      raise ValueError(
          f"HybridConfig.partial_rotary_factor={self.partial_rotary_factor} gives a rotary "
          f"dim int(head_dim * factor) = {rotary}; it must be even and in "
          f"2..head_dim={self.head_dim}.")
    if not isinstance(self.gdn, GDNConfig):
      raise ValueError(f"HybridConfig.gdn must be a GDNConfig; given {type(self.gdn).__name__}.")
    expected = {"hidden_size": self.hidden_size, "num_layers": self.num_layers,
                "num_gdn_layers": self.num_gdn_layers}
    for name, want in expected.items():
      if getattr(self.gdn, name) != want:
        raise ValueError(
            f"HybridConfig.gdn.{name}={getattr(self.gdn, name)} must equal {want} "
            f"(num_layers={self.num_layers}, full_attention_interval="
            f"{self.full_attention_interval}, hidden_size={self.hidden_size}).")

  # ------------------------------------------------------------------------- derived sizes

  @property
  def layer_types(self) -> tuple[str, ...]:
    """HF ``layer_types``: ``"linear_attention"`` (GDN) or ``"full_attention"`` per layer."""
    n = self.full_attention_interval
    return tuple(FULL_ATTENTION if (i + 1) % n == 0 else LINEAR_ATTENTION
                 for i in range(self.num_layers))

  @property
  def num_attention_layers(self) -> int:
    """Full-attention layers; also the number of (GDN x (interval - 1), attention) blocks."""
    return self.num_layers // self.full_attention_interval

  @property
  def num_gdn_layers(self) -> int:
    """GDN layers: ``interval - 1`` per block plus the tail."""
    return self.num_layers - self.num_attention_layers

  @property
  def gdn_per_block(self) -> int:
    """GDN layers in front of each full-attention layer (``interval - 1``)."""
    return self.full_attention_interval - 1

  @property
  def num_tail_gdn_layers(self) -> int:
    """GDN layers after the last full-attention layer (``num_layers % interval``)."""
    return self.num_layers % self.full_attention_interval

  @property
  def rotary_dim(self) -> int:
    """Dims of each head that RoPE rotates: ``int(head_dim * partial_rotary_factor)`` (HF)."""
    return int(self.head_dim * self.partial_rotary_factor)

  def gdn_layer_index(self, g: int) -> int:
    """HF layer index of the ``g``-th GDN layer (the order of the stacked GDN caches)."""
    per = self.gdn_per_block
    return (g // per) * self.full_attention_interval + g % per

  def attention_layer_index(self, a: int) -> int:
    """HF layer index of the ``a``-th full-attention layer."""
    return a * self.full_attention_interval + self.full_attention_interval - 1

  @classmethod
  def tiny(cls, *, layout: str = "qwen3_5", num_layers: int = 4,
           full_attention_interval: int = 4, **overrides) -> HybridConfig:
    """A tiny model for tests and examples (D 64, 4 heads of 16, GDN H 2, HV 4, K = V = 16).

    >>> HybridConfig.tiny().layer_types
    ('linear_attention', 'linear_attention', 'linear_attention', 'full_attention')
    """
    n_attn = num_layers // full_attention_interval
    gdn = GDNConfig(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16, conv_kernel=4,
                    hidden_size=64, num_layers=num_layers, num_gdn_layers=num_layers - n_attn,
                    layout=layout)
    fields = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_layers=num_layers,
                  full_attention_interval=full_attention_interval, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.5,
                  max_position_embeddings=64, gdn=gdn)
    fields.update(overrides)
    return cls(**fields)
