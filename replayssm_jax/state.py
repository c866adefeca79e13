"""Cache pytrees of one GDN layer (DESIGN section 2).

Frozen dataclasses registered with `jax.tree_util.register_dataclass`: every
field is an array leaf (or None: `ReplayCache.ssm_copy` when not kept), so a jitted
step over them traces once per shape and can donate them. No layer axis here; a model
stacks layers itself.

- `RecurrentCache`: the committed state plus per-draft states (`intermediate`).
- `ReplayCache`: the fp32 checkpoint, the ring of per-token records and the
  cursors; no `intermediate` (DESIGN section 3).
- `ConvCache`: the causal-conv inputs of the committed tokens and of the verify
  window (used by the layer, beside either SSM cache).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp

from replayssm_jax.config import GDNConfig, SpecConfig


def _tree_nbytes(tree) -> int:
  """Bytes of all leaves (arrays or `jax.ShapeDtypeStruct`s)."""
  return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


class _Container:
  """Byte accounting shared by the caches."""

  @property
  def nbytes(self) -> int:
    """Total bytes of the arrays this cache holds."""
    return _tree_nbytes(self)

  def field_nbytes(self) -> dict[str, int]:
    """Bytes per field, in declaration order."""
    return {f.name: _tree_nbytes(getattr(self, f.name)) for f in dataclasses.fields(self)}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RecurrentCache(_Container):
  """SSM cache of the recurrent baseline.

  `verify` writes the state after each draft into `intermediate`; `commit`
  copies `intermediate[slot, accepted - 1]` into `ssm`.
  """

  ssm: jax.Array  # [slots, HV, V, K] ssm_dtype: committed state
  intermediate: jax.Array  # [slots, T, HV, V, K] ssm_dtype: state after each draft token

  @classmethod
  def create(cls, gdn: GDNConfig, spec: SpecConfig, num_slots: int) -> RecurrentCache:
    """Zero-filled cache for ``num_slots`` slots."""
    state = (num_slots, *gdn.state_shape)
    return cls(
        ssm=jnp.zeros(state, spec.ssm_dtype),
        intermediate=jnp.zeros((num_slots, spec.draft_tokens, *gdn.state_shape), spec.ssm_dtype),
    )

  @property
  def num_slots(self) -> int:
    return self.ssm.shape[0]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ReplayCache(_Container):
  """SSM cache of ReplaySSM: checkpoint + ring of records + cursors (+ the checkpoint's bf16
  copy, `SpecConfig.checkpoint_copy`).

  Logical record ``i`` of a slot lives at ring index ``(cache_base + i) & (L - 1)``;
  records ``i < write_pos`` are committed, the rest are scratch (rejected drafts).
  """

  ssm: jax.Array  # [slots, HV, V, K] f32: checkpoint (state after the folded history)
  ring_d: jax.Array  # [slots, HV, L, V] ring dtype: d records
  ring_k: jax.Array  # [slots, H, L, K] ring dtype: normalised keys
  ring_g: jax.Array  # [slots, HV, L] f32: log-decays, bitwise those of the recurrent path
  ring_beta: jax.Array  # [slots, HV, L] f32: write strengths, bitwise as above
  ring_rawk: jax.Array  # [slots, H, L, K] activation dtype: pre-norm keys (exact fold)
  ring_rawv: jax.Array  # [slots, HV, L, V] activation dtype: raw values (exact fold)
  write_pos: jax.Array  # [slots] int32: committed records since the checkpoint
  cache_base: jax.Array  # [slots] int32: ring index of logical record 0
  is_flush: jax.Array  # [slots] bool: fold before the next verify
  # [slots, HV, V, K] bf16, or None: the checkpoint rounded once, which verify and decode
  # read in its place (`SpecConfig.checkpoint_copy`); every reset and fold rewrites it.
  ssm_copy: jax.Array | None = None

  RINGS: ClassVar[tuple[str, ...]] = ("ring_d", "ring_k", "ring_g", "ring_beta", "ring_rawk",
                                      "ring_rawv")

  @classmethod
  def create(cls, gdn: GDNConfig, spec: SpecConfig, num_slots: int,
             dtype=jnp.bfloat16) -> ReplayCache:
    """Zero-filled cache; ``dtype`` is the activation dtype (raw rings, default ring dtype)."""
    S, H, HV, K, V, L = num_slots, gdn.num_k_heads, gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim, spec.ring_len
    ring_dtype = spec.ring_dtype_for(dtype)
    return cls(
        ssm=jnp.zeros((S, HV, V, K), spec.ssm_dtype),
        ring_d=jnp.zeros((S, HV, L, V), ring_dtype),
        ring_k=jnp.zeros((S, H, L, K), ring_dtype),
        ring_g=jnp.zeros((S, HV, L), jnp.float32),
        ring_beta=jnp.zeros((S, HV, L), jnp.float32),
        ring_rawk=jnp.zeros((S, H, L, K), dtype),
        ring_rawv=jnp.zeros((S, HV, L, V), dtype),
        write_pos=jnp.zeros((S,), jnp.int32),
        cache_base=jnp.zeros((S,), jnp.int32),
        is_flush=jnp.full((S,), spec.flush_on_reset, jnp.bool_),
        ssm_copy=(None if spec.checkpoint_copy is None
                  else jnp.zeros((S, HV, V, K), spec.checkpoint_copy)),
    )

  @property
  def num_slots(self) -> int:
    return self.ssm.shape[0]

  @property
  def verify_ssm(self) -> jax.Array:
    """The checkpoint as verify and decode read it: the copy if the cache keeps one."""
    return self.ssm if self.ssm_copy is None else self.ssm_copy

  @property
  def ring_len(self) -> int:
    return self.ring_d.shape[2]

  @property
  def ring_nbytes(self) -> int:
    """Bytes of the six rings (the ReplaySSM spec scratch)."""
    return _tree_nbytes([getattr(self, name) for name in self.RINGS])

  def history(self, ring: str) -> tuple[jax.Array, jax.Array]:
    """One ring's records in logical order, and which of them are committed.

    Args:
      ring: a ring field name, e.g. ``"ring_d"`` (`RINGS`).

    Returns:
      ``(records, committed)``: ``records [slots, L, heads, ...]`` with ``records[s, i]`` the
      slot's logical record i (ring index ``(cache_base[s] + i) & (L - 1)``), and ``committed
      bool[slots, L]``, ``i < write_pos[s]``. Records past ``write_pos`` are rejected drafts
      or stale. A gather: use it to inspect a cache, not in a hot loop.
    """
    if ring not in self.RINGS:
      raise ValueError(f"ring={ring!r} is not a ring of ReplayCache; use one of {self.RINGS}.")
    committed = jnp.arange(self.ring_len)[None, :] < self.write_pos[:, None]
    return logical_order(getattr(self, ring), self.cache_base), committed


def logical_order(ring: jax.Array, cache_base: jax.Array) -> jax.Array:
  """Rings ``[N, heads, L, ...]`` of N slots (or rows) as records in logical order.

  Returns ``[N, L, heads, ...]`` with record i of row n taken from ring index
  ``(cache_base[n] + i) & (L - 1)``.
  """
  L = ring.shape[2]
  order = (cache_base[:, None] + jnp.arange(L)) & (L - 1)  # [N, L]: ring index of record i
  order = order.reshape(order.shape[0], 1, L, *(1,) * (ring.ndim - 3))
  return jnp.moveaxis(jnp.take_along_axis(ring, order, axis=2), 2, 1)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ConvCache(_Container):
  """Causal-conv inputs: committed history and the pending verify window."""

  conv: jax.Array  # [slots, conv_dim, conv_kernel - 1] activation dtype
  conv_window: jax.Array  # [slots, conv_dim, T] activation dtype

  @classmethod
  def create(cls, gdn: GDNConfig, spec: SpecConfig, num_slots: int, dtype=jnp.bfloat16) -> ConvCache:
    return cls(
        conv=jnp.zeros((num_slots, gdn.conv_dim, gdn.conv_kernel - 1), dtype),
        conv_window=jnp.zeros((num_slots, gdn.conv_dim, spec.draft_tokens), dtype),
    )


SSMCache = RecurrentCache | ReplayCache


def cache_type_for(spec: SpecConfig) -> type[RecurrentCache] | type[ReplayCache]:
  """The SSM cache class that ``spec.verify_mode`` uses."""
  return ReplayCache if spec.verify_mode == "replayssm" else RecurrentCache
