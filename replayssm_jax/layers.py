"""The Gated DeltaNet layer (Flax NNX) of Qwen3-Next / Qwen3.5, with explicit caches.

`GatedDeltaNet` holds only parameters; its cache (`GDNLayerCache`: conv inputs plus
the `ssm` cache of DESIGN section 2) goes in and comes back from every call:

- `prefill`: a new request per row (ragged prompts, right-padded), chunked rule from a
  zero state, then `ssm.reset` of the row's slot;
- `decode`: one committed token per row (`ssm.decode`);
- `verify`: a window of ``spec.draft_tokens`` drafts, nothing committed (`ssm.verify`);
- `commit`: keep the first ``accepted`` tokens of the last verify (`ssm.commit`).

The math follows HF transformers' `Qwen3NextGatedDeltaNet` / `Qwen3_5GatedDeltaNet`
(`research/oracles.md` sections 1 and 6); the projection layout comes from
`GDNConfig.layout`. `load_hf_gdn_weights` copies an HF layer's weights in.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from replayssm_jax import reference, ssm
from replayssm_jax.config import GDNConfig, SpecConfig
from replayssm_jax.kernels.recurrent import scatter_rows
from replayssm_jax.state import ConvCache, RecurrentCache, ReplayCache, cache_type_for


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GDNLayerCache:
  """Everything one GDN layer keeps between calls (an explicit pytree).

  A model stacks these on a leading layer axis itself.
  """

  conv: ConvCache  # conv [slots, conv_dim, k - 1], conv_window [slots, conv_dim, T], activation dtype
  ssm: RecurrentCache | ReplayCache  # the SSM cache `spec.verify_mode` picks (replayssm_jax.ssm)

  @classmethod
  def create(cls, gdn: GDNConfig, spec: SpecConfig, num_slots: int, dtype) -> GDNLayerCache:
    """A zero-filled cache for ``num_slots`` slots of activations in ``dtype``.

    >>> gdn = GDNConfig(num_k_heads=1, num_v_heads=2, head_k_dim=8, head_v_dim=8,
    ...                 hidden_size=16, num_layers=1, num_gdn_layers=1)
    >>> cache = GDNLayerCache.create(gdn, SpecConfig(draft_tokens=2, ring_len=4), 3, jnp.float32)
    >>> cache.conv.conv.shape, type(cache.ssm).__name__
    ((3, 32, 3), 'ReplayCache')
    """
    return cls(conv=ConvCache.create(gdn, spec, num_slots, dtype),
               ssm=ssm.init(gdn, spec, num_slots, dtype=dtype))

  @property
  def num_slots(self) -> int:
    return self.conv.conv.shape[0]

  @property
  def nbytes(self) -> int:
    """Total bytes of the arrays this cache holds."""
    return self.conv.nbytes + self.ssm.nbytes


# ----------------------------------------------------------------------------- pure helpers


def causal_conv(window: jax.Array, weight: jax.Array, out_dtype) -> jax.Array:
  """Depthwise causal conv (no bias) followed by silu, accumulated in fp32.

  Args:
    window: ``[B, T + k - 1, C]`` pre-conv inputs: the k - 1 preceding columns, then the T new ones.
    weight: ``[C, k]`` (HF ``conv1d.weight[:, 0, :]``; tap ``k - 1`` multiplies the newest input).
    out_dtype: dtype of the result.

  Returns:
    ``[B, T, C]``: ``silu(sum_j weight[:, j] * window[:, t + j])``.
  """
  k = weight.shape[1]
  T = window.shape[1] - (k - 1)
  window, weight = window.astype(jnp.float32), weight.astype(jnp.float32)
  out = sum(window[:, j:j + T] * weight[:, j] for j in range(k))
  return jax.nn.silu(out).astype(out_dtype)


def gated_rms_norm(o: jax.Array, z: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  """HF's ``RMSNormGated``: ``w * rmsnorm(o) * silu(z)``, per value head over V.

  The norm runs in fp32 and is cast back before the (plain, ones-initialised)
  weight; the gate multiplies in fp32 (HF's order of casts).

  Args:
    o: ``[..., V]`` core outputs (activation dtype).
    z: ``[..., V]`` gate.
    weight: ``[V]``.
    eps: ``GDNConfig.rms_norm_eps``.

  Returns:
    ``[..., V]`` in the dtype of ``o``.
  """
  dtype = o.dtype
  x = o.astype(jnp.float32)
  x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
  x = weight.astype(dtype) * x.astype(dtype)
  return (x.astype(jnp.float32) * jax.nn.silu(z.astype(jnp.float32))).astype(dtype)


def _valid_rows(slot_ids: jax.Array) -> jax.Array:
  return slot_ids >= 0


# ----------------------------------------------------------------------------- the layer


class GatedDeltaNet(nnx.Module):
  """One Gated DeltaNet (linear attention) layer; parameters only, the cache is explicit.

  Per token, with x in R^D, H key heads, HV value heads (r = HV / H), k = conv_kernel:

  Step A (projections). ``u = [q | k | v] = x W_qkv`` (conv channels ordered all q,
  all k, all v: ``2 H K + HV V``), ``z = x W_z`` (``HV V``), ``b = x W_b``, ``a = x W_a``
  (``HV``). Qwen3.5 stores these as ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``,
  ``in_proj_a``; Qwen3-Next fuses them into ``in_proj_qkvz`` (grouped per key head:
  ``[q(K) | k(K) | v(r V) | z(r V)]`` for each of the H heads) and ``in_proj_ba``
  (``[b(r) | a(r)]`` per key head).

  Step B (causal conv). ``c_t = silu(sum_{j<k} w_j * u_{t-k+1+j})``, depthwise, no bias,
  over ``[conv state | u]``: zeros for a new prompt, else the k - 1 previous inputs.
  ``c_t`` splits back into q, k (``[H, K]``) and v (``[HV, V]``).

  Step C (gated delta rule, DESIGN section 1; `replayssm_jax.ssm` / `reference`).
  ``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)`` in fp32, l2-normalised
  q and k (q scaled by ``K^-1/2``), value head h reads key head ``h // r``:
  ``S_t = e^{g_t} S_{t-1} + beta_t (v_t - e^{g_t} S_{t-1} k_t) k_t^T``, ``o_t = S_t q_t``.

  Step D (output). ``y = (norm * rmsnorm(o) * silu(z)) W_out`` with the RMS norm per value
  head over V (fp32, ``eps = rms_norm_eps``) and a plain weight ``norm`` (ones at init).

  Parameters (``nnx.Param``, named as HF's ``linear_attn.<name>``; linear kernels stored
  ``[in, out]``, i.e. the HF weight transposed): ``in_proj_qkvz [D, 2HK + 2HV V]`` and
  ``in_proj_ba [D, 2HV]`` (qwen3_next) or ``in_proj_qkv [D, 2HK + HV V]``,
  ``in_proj_z [D, HV V]``, ``in_proj_b [D, HV]``, ``in_proj_a [D, HV]`` (qwen3_5);
  ``conv1d [conv_dim, k]``, ``dt_bias [HV]``, ``A_log [HV]``, ``norm [V]``,
  ``out_proj [HV V, D]``.

  Batches: ``x [B, T, D]`` in the layer's ``dtype``, ``slot_ids int32[B]`` (-1: a padding
  row: zero output, nothing written). Every method returns ``(y, cache)`` (commit: the
  cache). The `ssm` functions donate their cache: treat a cache passed in as consumed.

  >>> gdn = GDNConfig(num_k_heads=1, num_v_heads=2, head_k_dim=8, head_v_dim=8,
  ...                 hidden_size=16, num_layers=1, num_gdn_layers=1)
  >>> spec = SpecConfig(draft_tokens=2, ring_len=4, verify_mode="recurrent")
  >>> layer = GatedDeltaNet(gdn, rngs=nnx.Rngs(0))
  >>> cache = layer.init_cache(spec, num_slots=2)
  >>> prefill = nnx.jit(GatedDeltaNet.prefill, static_argnames="spec")
  >>> x, slot_ids = jnp.ones((1, 5, 16)), jnp.array([1])
  >>> y, cache = prefill(layer, cache, x, jnp.array([5]), slot_ids, spec)
  >>> y, cache = layer.verify(cache, x[:, :2], slot_ids, spec)
  >>> cache = layer.commit(cache, slot_ids, jnp.array([1]), spec)
  >>> y.shape
  (1, 2, 16)
  """

  def __init__(self, gdn: GDNConfig, *, rngs: nnx.Rngs, dtype=jnp.float32,
               param_dtype=jnp.float32):
    """Random parameters: lecun-normal projections (as `nnx.Linear`); HF's init otherwise
    (conv ``U(+-k^-1/2)``, ``dt_bias = 1``, ``A_log = log U(0.01, 16)``, ``norm = 1``).

    Args:
      gdn: the layer geometry; ``gdn.layout`` picks the projection parameters.
      rngs: parameter RNG streams.
      dtype: activation dtype (inputs, outputs, caches).
      param_dtype: dtype the parameters are stored in.
    """
    self.gdn = gdn
    self.dtype = jnp.dtype(dtype)
    self.param_dtype = jnp.dtype(param_dtype)
    D, H, HV, K, V = (gdn.hidden_size, gdn.num_k_heads, gdn.num_v_heads, gdn.head_k_dim,
                      gdn.head_v_dim)
    dense = nnx.initializers.lecun_normal()

    def linear(n_in, n_out):
      return nnx.Param(dense(rngs.params(), (n_in, n_out), self.param_dtype))

    if gdn.layout == "qwen3_next":
      self.in_proj_qkvz = linear(D, 2 * H * K + 2 * HV * V)
      self.in_proj_ba = linear(D, 2 * HV)
    else:
      self.in_proj_qkv = linear(D, gdn.conv_dim)
      self.in_proj_z = linear(D, HV * V)
      self.in_proj_b = linear(D, HV)
      self.in_proj_a = linear(D, HV)
    # torch's Conv1d default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = k (depthwise).
    bound = gdn.conv_kernel ** -0.5
    self.conv1d = nnx.Param(jax.random.uniform(
        rngs.params(), (gdn.conv_dim, gdn.conv_kernel), self.param_dtype, -bound, bound))
    self.dt_bias = nnx.Param(jnp.ones((HV,), self.param_dtype))
    A = jax.random.uniform(rngs.params(), (HV,), jnp.float32, 1e-2, 16.0)
    self.A_log = nnx.Param(jnp.log(A).astype(self.param_dtype))
    self.norm = nnx.Param(jnp.ones((V,), self.param_dtype))
    self.out_proj = linear(HV * V, D)

  def init_cache(self, spec: SpecConfig, num_slots: int) -> GDNLayerCache:
    """A zero-filled cache for this layer's geometry and activation dtype."""
    return GDNLayerCache.create(self.gdn, spec, num_slots, self.dtype)

  # --------------------------------------------------------------------------- pieces

  def _dense(self, x: jax.Array, param: nnx.Param) -> jax.Array:
    return jnp.dot(x, param[...].astype(self.dtype))

  def _project(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Step A: ``x [B, T, D]`` -> (u ``[B, T, conv_dim]``, z ``[B, T, HV, V]``, b, a ``[B, T, HV]``)."""
    gdn = self.gdn
    B, T, _ = x.shape
    H, HV, K, V, r = gdn.num_k_heads, gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim, gdn.gqa_ratio
    if gdn.layout == "qwen3_next":
      qkvz = self._dense(x, self.in_proj_qkvz).reshape(B, T, H, 2 * K + 2 * r * V)
      q, k = qkvz[..., :K], qkvz[..., K:2 * K]  # [B, T, H, K]
      v = qkvz[..., 2 * K:2 * K + r * V]  # [B, T, H, r V]: value heads h r .. h r + r - 1
      z = qkvz[..., 2 * K + r * V:].reshape(B, T, HV, V)
      ba = self._dense(x, self.in_proj_ba).reshape(B, T, H, 2 * r)
      b, a = ba[..., :r].reshape(B, T, HV), ba[..., r:].reshape(B, T, HV)
      u = jnp.concatenate([q.reshape(B, T, H * K), k.reshape(B, T, H * K),
                           v.reshape(B, T, HV * V)], axis=-1)
      return u, z, b, a
    u = self._dense(x, self.in_proj_qkv)  # already [all q | all k | all v]
    z = self._dense(x, self.in_proj_z).reshape(B, T, HV, V)
    return u, z, self._dense(x, self.in_proj_b), self._dense(x, self.in_proj_a)

  def _split_heads(self, c: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Post-conv ``c [B, T, conv_dim]`` -> q, k ``[B, T, H, K]``, v ``[B, T, HV, V]``."""
    gdn = self.gdn
    B, T, _ = c.shape
    HK = gdn.num_k_heads * gdn.head_k_dim
    q = c[..., :HK].reshape(B, T, gdn.num_k_heads, gdn.head_k_dim)
    k = c[..., HK:2 * HK].reshape(B, T, gdn.num_k_heads, gdn.head_k_dim)
    v = c[..., 2 * HK:].reshape(B, T, gdn.num_v_heads, gdn.head_v_dim)
    return q, k, v

  def _conv(self, window: jax.Array) -> jax.Array:
    """Step B on ``window [B, T + k - 1, conv_dim]`` -> ``[B, T, conv_dim]``."""
    return causal_conv(window, self.conv1d[...], self.dtype)

  def _gates_params(self) -> tuple[jax.Array, jax.Array]:
    """``(A_log, dt_bias)`` in fp32 (HF computes the gates from ``A_log.float()``)."""
    return self.A_log[...].astype(jnp.float32), self.dt_bias[...].astype(jnp.float32)

  def _output(self, o: jax.Array, z: jax.Array, keep: jax.Array) -> jax.Array:
    """Step D: ``o, z [B, T, HV, V]`` -> ``y [B, T, D]``, zero where ``keep [B, T]`` is False."""
    B, T = o.shape[:2]
    y = gated_rms_norm(o.astype(self.dtype), z, self.norm[...], self.gdn.rms_norm_eps)
    y = self._dense(y.reshape(B, T, -1), self.out_proj)
    return jnp.where(keep[..., None], y, 0).astype(self.dtype)

  def _conv_rows(self, cache: GDNLayerCache, slot_ids: jax.Array) -> jax.Array:
    """The committed conv inputs of the rows, ``[B, k - 1, conv_dim]`` (channels last)."""
    return jnp.swapaxes(cache.conv.conv[jnp.maximum(slot_ids, 0)], 1, 2)

  def _with_conv(self, cache: GDNLayerCache, slot_ids: jax.Array, rows: jax.Array,
                 field: str = "conv") -> GDNLayerCache:
    """Scatter ``rows [B, n, conv_dim]`` into ``cache.conv.<field>[slot]``; -1 rows dropped."""
    target = getattr(cache.conv, field)
    conv = dataclasses.replace(cache.conv, **{field: scatter_rows(target, slot_ids,
                                                                  jnp.swapaxes(rows, 1, 2))})
    return dataclasses.replace(cache, conv=conv)

  # --------------------------------------------------------------------------- checks

  def _check(self, what: str, cache, x: jax.Array | None, slot_ids: jax.Array,
             spec: SpecConfig, T: int | None = None) -> None:
    """Shapes and dtypes of one call against the layer and the cache (trace time)."""
    gdn = self.gdn
    if not isinstance(cache, GDNLayerCache):
      raise ValueError(f"{what}: expected a GDNLayerCache, given {type(cache).__name__}; "
                       "build one with layer.init_cache(spec, num_slots).")
    if not isinstance(spec, SpecConfig):
      raise ValueError(f"{what}: expected spec to be a SpecConfig, given {type(spec).__name__}.")
    if slot_ids.ndim != 1 or slot_ids.dtype != jnp.int32:
      raise ValueError(f"{what}: slot_ids must be int32[B]; given "
                       f"{slot_ids.dtype}{list(slot_ids.shape)}.")
    B = slot_ids.shape[0]
    if x is not None:
      T_want = T if T is not None else (x.shape[1] if x.ndim == 3 else "T")
      want = (B, T_want, gdn.hidden_size)
      if x.shape != want:
        raise ValueError(f"{what}: x has shape {x.shape}; expected ({B}, {T_want}, "
                         f"{gdn.hidden_size}) = [B, T, hidden_size] with B = len(slot_ids)"
                         f"{'' if T is None else ' and T = spec.draft_tokens' if T > 1 else ''}.")
      if x.dtype != self.dtype:
        raise ValueError(f"{what}: x is {x.dtype}; expected the layer's activation dtype "
                         f"{self.dtype} (cast x, or build the layer with dtype={x.dtype}).")
    want_type = cache_type_for(spec)
    if not isinstance(cache.ssm, want_type):
      raise ValueError(f"{what}: spec.verify_mode={spec.verify_mode!r} needs a {want_type.__name__}; "
                       f"given a {type(cache.ssm).__name__}. Build the cache with the same spec.")
    S = cache.conv.conv.shape[0]
    expected = {
        "conv.conv": ((S, gdn.conv_dim, gdn.conv_kernel - 1), cache.conv.conv),
        "conv.conv_window": ((S, gdn.conv_dim, spec.draft_tokens), cache.conv.conv_window),
        "ssm.ssm": ((S, *gdn.state_shape), cache.ssm.ssm),
    }
    for name, (shape, arr) in expected.items():
      if arr.shape != shape:
        raise ValueError(f"{what}: cache.{name} has shape {arr.shape}; expected {shape} "
                         f"(gdn geometry, draft_tokens={spec.draft_tokens}).")
    for name, arr in (("conv.conv", cache.conv.conv), ("conv.conv_window", cache.conv.conv_window)):
      if arr.dtype != self.dtype:
        raise ValueError(f"{what}: cache.{name} is {arr.dtype}; expected the layer's dtype "
                         f"{self.dtype} (layer.init_cache(spec, num_slots)).")
    if isinstance(cache.ssm, ReplayCache) and cache.ssm.ring_rawk.dtype != self.dtype:
      raise ValueError(f"{what}: cache.ssm rings are {cache.ssm.ring_rawk.dtype}; expected the "
                       f"layer's dtype {self.dtype} (layer.init_cache(spec, num_slots)).")

  @staticmethod
  def _check_counts(what: str, name: str, counts: jax.Array, B: int) -> None:
    if counts.shape != (B,) or not jnp.issubdtype(counts.dtype, jnp.integer):
      raise ValueError(f"{what}: {name} must be an integer array of shape {(B,)}; given "
                       f"{counts.dtype}{list(counts.shape)}.")

  # --------------------------------------------------------------------------- API

  def prefill(self, cache: GDNLayerCache, x: jax.Array, lengths: jax.Array, slot_ids: jax.Array,
              spec: SpecConfig) -> tuple[jax.Array, GDNLayerCache]:
    """Start a new request per row from its prompt; writes the rows' slots.

    Prompts are right-padded to T: positions ``t >= lengths[b]`` change neither the state
    nor the conv inputs (beta = 0, g = 0 there) and give zero outputs.

    Args:
      cache: the layer cache.
      x: ``[B, T, D]`` prompts in the layer dtype.
      lengths: ``int[B]`` valid tokens per row (0..T).
      slot_ids: ``int32[B]``; -1 rows are padding.
      spec: the configuration the cache was built with.

    Returns:
      ``(y [B, T, D], cache)``; ``ssm[slot]`` holds the state after ``lengths`` tokens and
      ``conv[slot]`` their last k - 1 pre-conv inputs (zeros in front of short prompts).
    """
    self._check("GatedDeltaNet.prefill", cache, x, slot_ids, spec)
    B, T, _ = x.shape
    self._check_counts("GatedDeltaNet.prefill", "lengths", lengths, B)
    lengths = jnp.clip(lengths.astype(jnp.int32), 0, T)
    km1 = self.gdn.conv_kernel - 1
    valid = jnp.arange(T)[None, :] < lengths[:, None]  # [B, T]
    x = jnp.where(valid[..., None], x, 0)  # whatever pads the prompt cannot leak (NaN * 0)
    u, z, b, a = self._project(x)
    window = jnp.concatenate([jnp.zeros((B, km1, u.shape[-1]), u.dtype), u], axis=1)
    q, k, v = self._split_heads(self._conv(window))
    g, beta = reference.gdn_gating(a, b, *self._gates_params())
    g, beta = jnp.where(valid[..., None], g, 0), jnp.where(valid[..., None], beta, 0)
    o, state = reference.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
    y = self._output(o, z, valid & _valid_rows(slot_ids)[:, None])
    # The last k - 1 valid inputs sit at window[lengths + j], j < k - 1.
    idx = lengths[:, None] + jnp.arange(km1)[None, :]  # [B, k - 1]
    conv_rows = jnp.take_along_axis(window, idx[..., None], axis=1)
    cache = dataclasses.replace(cache, ssm=ssm.reset(cache.ssm, slot_ids, state, spec))
    return y, self._with_conv(cache, slot_ids, conv_rows)

  def decode(self, cache: GDNLayerCache, x: jax.Array, slot_ids: jax.Array,
             spec: SpecConfig) -> tuple[jax.Array, GDNLayerCache]:
    """One token per row, committed by the call (``ssm.decode``).

    Args:
      cache: the layer cache.
      x: ``[B, 1, D]``.
      slot_ids: ``int32[B]``; -1 rows are padding.
      spec: the configuration the cache was built with.

    Returns:
      ``(y [B, 1, D], cache)``; the conv inputs shift by one column.
    """
    self._check("GatedDeltaNet.decode", cache, x, slot_ids, spec, T=1)
    u, z, b, a = self._project(x)
    window = jnp.concatenate([self._conv_rows(cache, slot_ids), u], axis=1)  # [B, k, C]
    q, k, v = self._split_heads(self._conv(window))
    o, ssm_cache = ssm.decode(cache.ssm, q, k, v, a, b, *self._gates_params(), slot_ids, spec)
    y = self._output(o, z, _valid_rows(slot_ids)[:, None])
    cache = dataclasses.replace(cache, ssm=ssm_cache)
    return y, self._with_conv(cache, slot_ids, window[:, 1:])

  def verify(self, cache: GDNLayerCache, x: jax.Array, slot_ids: jax.Array,
             spec: SpecConfig) -> tuple[jax.Array, GDNLayerCache]:
    """Outputs of a draft window of ``T = spec.draft_tokens`` tokens; nothing is committed.

    The window's pre-conv inputs go into ``conv_window[slot]`` for `commit`; ``conv`` and
    the committed SSM state stay as they were (``ssm.verify``).

    Args:
      cache: the layer cache.
      x: ``[B, T, D]``.
      slot_ids: ``int32[B]``; -1 rows are padding.
      spec: the configuration the cache was built with.

    Returns:
      ``(y [B, T, D], cache)``.
    """
    T = spec.draft_tokens
    self._check("GatedDeltaNet.verify", cache, x, slot_ids, spec, T=T)
    u, z, b, a = self._project(x)
    window = jnp.concatenate([self._conv_rows(cache, slot_ids), u], axis=1)  # [B, k - 1 + T, C]
    q, k, v = self._split_heads(self._conv(window))
    o, ssm_cache = ssm.verify(cache.ssm, q, k, v, a, b, *self._gates_params(), slot_ids, spec)
    y = self._output(o, z, jnp.broadcast_to(_valid_rows(slot_ids)[:, None], x.shape[:2]))
    cache = dataclasses.replace(cache, ssm=ssm_cache)
    return y, self._with_conv(cache, slot_ids, u, field="conv_window")

  def commit(self, cache: GDNLayerCache, slot_ids: jax.Array, accepted: jax.Array,
             spec: SpecConfig) -> GDNLayerCache:
    """Keep the first ``accepted[b]`` tokens (bonus included) of each row's last verify.

    Args:
      cache: the layer cache.
      slot_ids: ``int32[B]``; -1 rows are padding.
      accepted: ``int[B]`` in ``0..T``; 0 leaves the row's state and conv inputs unchanged.
      spec: the configuration the cache was built with.

    Returns:
      The cache; ``conv[slot]`` becomes the last k - 1 columns of
      ``[conv | conv_window[:, :, :accepted]]``.
    """
    self._check("GatedDeltaNet.commit", cache, None, slot_ids, spec)
    self._check_counts("GatedDeltaNet.commit", "accepted", accepted, slot_ids.shape[0])
    accepted = jnp.clip(accepted.astype(jnp.int32), 0, spec.draft_tokens)
    s = jnp.maximum(slot_ids, 0)
    history = jnp.concatenate([cache.conv.conv[s], cache.conv.conv_window[s]], axis=-1)
    idx = accepted[:, None] + jnp.arange(self.gdn.conv_kernel - 1)[None, :]  # [B, k - 1]
    rows = jnp.take_along_axis(history, idx[:, None, :], axis=-1)  # [B, C, k - 1]
    cache = dataclasses.replace(cache, ssm=ssm.commit(cache.ssm, slot_ids, accepted, spec))
    targets = jnp.where(accepted > 0, slot_ids, -1)
    return self._with_conv(cache, targets, jnp.swapaxes(rows, 1, 2))


# ----------------------------------------------------------------------------- HF weights


def _hf_shapes(gdn: GDNConfig) -> dict[str, tuple[int, ...]]:
  """HF ``linear_attn`` parameter names and their torch shapes."""
  D, H, HV, K, V = (gdn.hidden_size, gdn.num_k_heads, gdn.num_v_heads, gdn.head_k_dim,
                    gdn.head_v_dim)
  if gdn.layout == "qwen3_next":
    shapes = {"in_proj_qkvz.weight": (2 * H * K + 2 * HV * V, D), "in_proj_ba.weight": (2 * HV, D)}
  else:
    shapes = {"in_proj_qkv.weight": (gdn.conv_dim, D), "in_proj_z.weight": (HV * V, D),
              "in_proj_b.weight": (HV, D), "in_proj_a.weight": (HV, D)}
  shapes.update({"conv1d.weight": (gdn.conv_dim, 1, gdn.conv_kernel), "dt_bias": (HV,),
                 "A_log": (HV,), "norm.weight": (V,), "out_proj.weight": (D, HV * V)})
  return shapes


def convert_hf_gdn_weights(gdn: GDNConfig, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """HF ``linear_attn`` weights -> arrays named and laid out as `GatedDeltaNet` params.

  Linear weights ``[out, in]`` are transposed to ``[in, out]``; ``conv1d.weight
  [C, 1, k]`` is squeezed to ``[C, k]``; the rest keep their shapes. The result maps
  the parameter name (``in_proj_qkvz``, ``conv1d``, ``A_log``, ...) to a numpy array,
  which suits stacked (``nnx.vmap``) layers as well as `load_hf_gdn_weights`.

  Args:
    gdn: the layer geometry (``layout`` picks the projection names).
    weights: HF names relative to the layer (``"in_proj_qkvz.weight"``, ``"A_log"``, ...)
      to arrays (numpy, or anything ``np.asarray`` takes).

  Raises:
    ValueError: on a missing or unexpected name, or a shape that does not fit ``gdn``.
  """
  shapes = _hf_shapes(gdn)
  missing = sorted(set(shapes) - set(weights))
  unexpected = sorted(set(weights) - set(shapes))
  if missing or unexpected:
    raise ValueError(f"load_hf_gdn_weights: layout {gdn.layout!r} expects {sorted(shapes)}; "
                     f"missing {missing}, unexpected {unexpected}.")
  out = {}
  for hf_name, shape in shapes.items():
    w = np.asarray(weights[hf_name])
    if w.shape != shape:
      raise ValueError(f"load_hf_gdn_weights: {hf_name} has shape {w.shape}; expected {shape} "
                       f"for {gdn}.")
    name = hf_name.removesuffix(".weight")
    if name == "conv1d":
      w = w[:, 0, :]
    elif w.ndim == 2:  # torch Linear [out, in] -> kernel [in, out]
      w = w.T
    out[name] = np.ascontiguousarray(w)
  return out


def load_hf_gdn_weights(layer: GatedDeltaNet, weights: Mapping[str, np.ndarray]) -> None:
  """Copy one HF ``linear_attn`` module's weights into ``layer`` (in place).

  Args:
    layer: the target layer; its parameters keep their dtype (``param_dtype``).
    weights: HF names relative to the layer, e.g. ``"in_proj_qkvz.weight"``,
      ``"conv1d.weight"``, ``"dt_bias"``, ``"A_log"``, ``"norm.weight"``,
      ``"out_proj.weight"``, in torch layout (strip ``model.layers.{i}.linear_attn.``).

  Raises:
    ValueError: as `convert_hf_gdn_weights`.
  """
  for name, w in convert_hf_gdn_weights(layer.gdn, weights).items():
    param = getattr(layer, name)
    param[...] = jnp.asarray(w, param[...].dtype)


# ----------------------------------------------------------------------------- notebooks


@functools.partial(nnx.jit, static_argnames=("method", "spec"))
def _apply(layer: GatedDeltaNet, cache: GDNLayerCache, args: tuple, *, method: str,
           spec: SpecConfig):
  """``layer.<method>(cache, *args, spec)`` compiled once per method, spec and shapes."""
  return getattr(layer, method)(cache, *args, spec)


class StatefulGatedDeltaNet(nnx.Module):
  """A `GatedDeltaNet` that keeps its own cache, for notebooks and quick experiments.

  The cache lives in an ``nnx.Cache`` variable and is replaced after every (jitted)
  call; engines should use `GatedDeltaNet` with the explicit cache instead.

  >>> gdn = GDNConfig(num_k_heads=1, num_v_heads=2, head_k_dim=8, head_v_dim=8,
  ...                 hidden_size=16, num_layers=1, num_gdn_layers=1)
  >>> model = StatefulGatedDeltaNet(GatedDeltaNet(gdn, rngs=nnx.Rngs(0)),
  ...                               SpecConfig(draft_tokens=2, ring_len=4), num_slots=1)
  >>> slot = jnp.array([0])
  >>> model.prefill(jnp.ones((1, 3, 16)), jnp.array([3]), slot).shape
  (1, 3, 16)
  >>> model.decode(jnp.ones((1, 1, 16)), slot).shape
  (1, 1, 16)
  """

  def __init__(self, layer: GatedDeltaNet, spec: SpecConfig, num_slots: int):
    self.layer = layer
    self.spec = spec
    self.cache = nnx.Cache(layer.init_cache(spec, num_slots))

  def _call(self, method: str, *args):
    out = _apply(self.layer, self.cache.get_value(), args, method=method, spec=self.spec)
    if method == "commit":
      self.cache.set_value(out)
      return None
    y, cache = out
    self.cache.set_value(cache)
    return y

  def prefill(self, x: jax.Array, lengths: jax.Array, slot_ids: jax.Array) -> jax.Array:
    """`GatedDeltaNet.prefill` on the held cache; returns ``y [B, T, D]``."""
    return self._call("prefill", x, lengths, slot_ids)

  def decode(self, x: jax.Array, slot_ids: jax.Array) -> jax.Array:
    """`GatedDeltaNet.decode` on the held cache; returns ``y [B, 1, D]``."""
    return self._call("decode", x, slot_ids)

  def verify(self, x: jax.Array, slot_ids: jax.Array) -> jax.Array:
    """`GatedDeltaNet.verify` on the held cache; returns ``y [B, T, D]``."""
    return self._call("verify", x, slot_ids)

  def commit(self, slot_ids: jax.Array, accepted: jax.Array) -> None:
    """`GatedDeltaNet.commit` on the held cache."""
    self._call("commit", slot_ids, accepted)

  def state(self, slot_ids: jax.Array) -> jax.Array:
    """The committed SSM states ``f32[B, HV, V, K]`` of the rows (`ssm.materialize`)."""
    return ssm.materialize(self.cache.get_value().ssm, slot_ids, self.spec)
