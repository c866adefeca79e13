"""Full attention of the hybrid model (Qwen3-Next / Qwen3.5 style) with a slot KV cache.

Per window of T tokens of one row, whose first token sits at position ``p0`` (the
slot's committed length; 0 for a prefill):

    [q | gate] = x W_q  (per head: q = first head_dim, gate = second; no gate if disabled)
    q, k = rmsnorm_1+w(q), rmsnorm_1+w(k)                 per head over head_dim
    q, k = rope(q, p0 + s), rope(k, p0 + s)               first rotary_dim dims only
    K[slot, p0 + s], V[slot, p0 + s] = k_s, v_s            (the window is written first)
    o_s = softmax_j(q_s . K_j / sqrt(head_dim)) V_j        over j <= p0 + s
    y = (o * sigmoid(gate)) W_o

The KV cache needs no rollback: rejected drafts of a verify sit at positions
``>= committed length``, which the mask hides and the next window overwrites.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from replayssm_jax.models.config import HybridConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  """Keys and values of one attention layer (a model stacks them on a leading layer axis)."""

  k: jax.Array  # [slots, max_len, KVH, head_dim] activation dtype: keys after norm + RoPE
  v: jax.Array  # [slots, max_len, KVH, head_dim] activation dtype: values

  @classmethod
  def create(cls, config: HybridConfig, num_slots: int, max_len: int, dtype) -> KVCache:
    """Zero-filled keys and values for ``num_slots`` slots of ``max_len`` positions."""
    shape = (num_slots, max_len, config.num_key_value_heads, config.head_dim)
    return cls(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))


class RMSNorm(nnx.Module):
  """``x / sqrt(mean(x^2) + eps) * (1 + w)`` in fp32, ``w`` zeros at init (HF Qwen3NextRMSNorm).

  Not the GDN layer's gated norm, whose weight is used plainly (ones at init).
  """

  def __init__(self, dim: int, *, eps: float, param_dtype=jnp.float32):
    self.eps = eps
    self.weight = nnx.Param(jnp.zeros((dim,), param_dtype))

  def __call__(self, x: jax.Array) -> jax.Array:
    """``x [..., dim]`` -> same shape and dtype."""
    h = x.astype(jnp.float32)
    h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + self.eps)
    return (h * (1.0 + self.weight[...].astype(jnp.float32))).astype(x.dtype)


def rope_inv_freq(rotary_dim: int, theta: float) -> np.ndarray:
  """``f32[rotary_dim / 2]``: ``1 / theta^(2i / rotary_dim)``, computed in fp32 as HF does."""
  exponent = np.arange(0, rotary_dim, 2, dtype=np.float32) / np.float32(rotary_dim)
  return (np.float32(1.0) / np.power(np.float32(theta), exponent)).astype(np.float32)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
  """Rotate the first ``2 * len(inv_freq)`` dims of each head (HF ``rotate_half`` convention).

  Args:
    x: ``[B, T, heads, head_dim]``.
    positions: ``int32[B, T]``.
    inv_freq: ``f32[rotary_dim / 2]``.

  Returns:
    ``[B, T, heads, head_dim]`` in the dtype of ``x``; dims ``>= rotary_dim`` pass through.
  """
  rotary_dim = 2 * inv_freq.shape[0]
  freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, rd/2]
  emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]  # [B, T, 1, rd]
  cos, sin = jnp.cos(emb).astype(x.dtype), jnp.sin(emb).astype(x.dtype)
  x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
  half = rotary_dim // 2
  rotated = jnp.concatenate([-x_rot[..., half:], x_rot[..., :half]], axis=-1)
  return jnp.concatenate([x_rot * cos + rotated * sin, x_pass], axis=-1)


def write_window(cache: jax.Array, new: jax.Array, start: jax.Array,
                 slot_ids: jax.Array) -> jax.Array:
  """``cache[slot_ids[b], start[b] + s] = new[b, s]``; padding rows and overflow are dropped.

  Args:
    cache: ``[slots, max_len, KVH, head_dim]``.
    new: ``[B, T, KVH, head_dim]``.
    start: ``int32[B]``, the window's first position per row.
    slot_ids: ``int32[B]``; -1 rows write nothing.
  """
  num_slots = cache.shape[0]
  rows = jnp.where(slot_ids >= 0, slot_ids, num_slots)[:, None]  # out of range -> dropped
  cols = start[:, None] + jnp.arange(new.shape[1], dtype=jnp.int32)[None, :]
  return cache.at[rows, cols].set(new.astype(cache.dtype), mode="drop")


class Attention(nnx.Module):
  """Gated full attention with per-head q/k norms and partial RoPE (module docstring's equations).

  Parameters (kernels ``[in, out]``): ``q_proj [D, H * head_dim * (2 if gated else 1)]``,
  ``k_proj, v_proj [D, KVH * head_dim]``, ``o_proj [H * head_dim, D]``, ``q_norm, k_norm
  [head_dim]``. No biases (HF ``attention_bias=False``).
  """

  def __init__(self, config: HybridConfig, *, rngs: nnx.Rngs, dtype=jnp.float32,
               param_dtype=jnp.float32):
    c = config
    self.num_heads, self.num_kv_heads, self.head_dim = (c.num_attention_heads,
                                                         c.num_key_value_heads, c.head_dim)
    self.output_gate = c.attn_output_gate
    # Plain Python numbers, static in the graphdef (no array attributes on the module).
    self.rotary_dim, self.rope_theta = c.rotary_dim, c.rope_theta
    linear = lambda n_in, n_out: nnx.Linear(n_in, n_out, use_bias=False, dtype=dtype,
                                            param_dtype=param_dtype, rngs=rngs)
    q_width = c.num_attention_heads * c.head_dim
    self.q_proj = linear(c.hidden_size, q_width * (2 if c.attn_output_gate else 1))
    self.k_proj = linear(c.hidden_size, c.num_key_value_heads * c.head_dim)
    self.v_proj = linear(c.hidden_size, c.num_key_value_heads * c.head_dim)
    self.o_proj = linear(q_width, c.hidden_size)
    norm = lambda: RMSNorm(c.head_dim, eps=c.rms_norm_eps, param_dtype=param_dtype)
    self.q_norm = norm() if c.qk_norm else None
    self.k_norm = norm() if c.qk_norm else None

  def __call__(self, cache: KVCache, x: jax.Array, start: jax.Array,
               slot_ids: jax.Array) -> tuple[jax.Array, KVCache]:
    """Attend a window of T tokens per row to its slot's cache; the window is written first.

    Args:
      cache: this layer's `KVCache`.
      x: ``[B, T, D]`` (normed hidden states).
      start: ``int32[B]``: position of the window's first token (the slot's committed length).
      slot_ids: ``int32[B]``; -1 rows are padding (nothing written; output is don't-care).

    Returns:
      ``(y [B, T, D], cache)``. Keys at positions ``> start + s`` are masked for query ``s``,
      so stale entries (rejected drafts, padded prompt tails) are never read. A window
      that runs past ``max_len`` loses its overflowing keys: keep ``start + T <= max_len``.
    """
    B, T, _ = x.shape
    H, KVH, Dh = self.num_heads, self.num_kv_heads, self.head_dim
    G = H // KVH
    q = self.q_proj(x)
    if self.output_gate:  # per head: [q (Dh) | gate (Dh)]
      q = q.reshape(B, T, H, 2 * Dh)
      q, gate = q[..., :Dh], q[..., Dh:].reshape(B, T, H * Dh)
    else:
      q, gate = q.reshape(B, T, H, Dh), None
    k = self.k_proj(x).reshape(B, T, KVH, Dh)
    v = self.v_proj(x).reshape(B, T, KVH, Dh)
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    positions = start[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]  # [B, T]
    inv_freq = rope_inv_freq(self.rotary_dim, self.rope_theta)
    q, k = apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq)
    cache = KVCache(k=write_window(cache.k, k, start, slot_ids),
                    v=write_window(cache.v, v, start, slot_ids))
    s = jnp.maximum(slot_ids, 0)
    keys, values = cache.k[s], cache.v[s]  # [B, N, KVH, Dh]
    # Query head h reads KV head h // G (HF repeat_kv).
    q = q.reshape(B, T, KVH, G, Dh)
    scores = jnp.einsum("btkgd,bnkd->bkgtn", q, keys) * (Dh ** -0.5)
    allowed = jnp.arange(keys.shape[1])[None, None, :] <= positions[:, :, None]  # [B, T, N]
    scores = jnp.where(allowed[:, None, None], scores.astype(jnp.float32), -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
    o = jnp.einsum("bkgtn,bnkd->btkgd", probs, values).reshape(B, T, H * Dh)
    if gate is not None:
      o = o * jax.nn.sigmoid(gate)
    return self.o_proj(o), cache
