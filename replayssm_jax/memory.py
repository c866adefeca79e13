"""Cache memory of all GDN layers of a model, per verify mode (DESIGN section 2).

Both modes keep the fp32 checkpoint ``ssm`` and the conv inputs. Their
speculative scratch differs:

- recurrent verify: ``intermediate``, the state after every draft token,
  ``N * slots * T * HV * V * K * 4`` bytes for fp32 states;
- ReplaySSM: six rings of per-token records,
  ``N * slots * L * ((HV V + H K) * (ring + activation bytes) + 2 HV * 4)``
  bytes, plus the cursors (``write_pos``, ``cache_base``, ``is_flush``), which
  one step shares across all GDN layers, so they are counted once.

`memory_report` computes the numbers from these closed forms;
`container_memory_report` derives the same report from the cache containers'
own byte accounting on `jax.eval_shape` results (nothing is allocated), so each
can check the other. Units are binary: 1 GiB = 2**30 bytes.

Qwen3.5-35B-A3B at TP1, 49 slots, T=4, fp32 states: ``intermediate`` is
30 * 49 * 4 * 32 * 128 * 128 * 4 B = 11.48 GiB, SGLang's "11.5 GB" of spec
scratch (`research/replayssm-algorithm.md` section 5.1).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from replayssm_jax.config import PRESETS, GDNConfig, SpecConfig
from replayssm_jax.state import ConvCache, RecurrentCache, ReplayCache

_KIB, _MIB, _GIB = 1 << 10, 1 << 20, 1 << 30
_CURSOR_FIELDS = ("write_pos", "cache_base", "is_flush")
_RING_FIELDS = ("ring_d", "ring_k", "ring_g", "ring_beta", "ring_rawk", "ring_rawv")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryReport:
  """Bytes of the GDN caches of a whole model (all GDN layers, all slots).

  Attributes:
    gdn: the layer geometry (of one TP rank).
    preset: name of the `config.PRESETS` entry ``gdn`` equals at ``tp``, or None.
    tp: tensor-parallel degree of that preset, or None when ``gdn`` is no preset.
    num_slots: cache slots (spec slots + the padding slot).
    draft_tokens: T, the verify window.
    ring_len: L, ring records per slot (ReplaySSM).
    ssm_dtype: dtype name of the checkpoint and of ``intermediate``.
    activation_dtype: dtype name of the conv inputs and of the raw rings.
    ring_dtype: dtype name of the d and normalised-k rings.
    checkpoint_bytes: ``ssm``, both modes.
    conv_bytes: ``conv`` + ``conv_window``, both modes.
    intermediate_bytes: per-draft states, recurrent mode only.
    ring_bytes: the six rings, ReplaySSM only.
    cursor_bytes: ``write_pos``, ``cache_base``, ``is_flush``, ReplaySSM only,
      once for all layers.
  """

  gdn: GDNConfig
  preset: str | None
  tp: int | None
  num_slots: int
  draft_tokens: int
  ring_len: int
  ssm_dtype: str
  activation_dtype: str
  ring_dtype: str
  checkpoint_bytes: int
  conv_bytes: int
  intermediate_bytes: int
  ring_bytes: int
  cursor_bytes: int

  @property
  def recurrent_total_bytes(self) -> int:
    """Checkpoint + conv + intermediate."""
    return self.checkpoint_bytes + self.conv_bytes + self.intermediate_bytes

  @property
  def replayssm_total_bytes(self) -> int:
    """Checkpoint + conv + rings + cursors."""
    return self.checkpoint_bytes + self.conv_bytes + self.ring_bytes + self.cursor_bytes

  @property
  def saved_bytes(self) -> int:
    """What ReplaySSM frees against the recurrent verify (negative if it costs more)."""
    return self.recurrent_total_bytes - self.replayssm_total_bytes

  @property
  def scratch_saving(self) -> float:
    """intermediate / rings: how many times smaller the spec scratch gets."""
    return self.intermediate_bytes / self.ring_bytes

  @property
  def total_saving(self) -> float:
    """recurrent total / replayssm total."""
    return self.recurrent_total_bytes / self.replayssm_total_bytes


def _float_dtype(name: str, value: Any) -> jnp.dtype:
  """``value`` as a floating dtype, or a ValueError naming the argument."""
  try:
    dtype = jnp.dtype(value)
  except TypeError:
    dtype = None
  if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
    raise ValueError(f"{name}={value!r} is not a floating dtype; use bfloat16, float16 or float32.")
  return dtype


def _specs(num_slots: int, draft_tokens: int, ring_len: int,
           ring_dtype: Any) -> tuple[SpecConfig, SpecConfig]:
  """Validated ``(recurrent, replayssm)`` specs; SpecConfig raises on bad T or L."""
  if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
    raise ValueError(f"memory_report: num_slots={num_slots!r} must be a positive integer "
                     "(spec slots plus the padding slot).")
  replay = SpecConfig(draft_tokens=draft_tokens, ring_len=ring_len, ring_dtype=ring_dtype,
                      verify_mode="replayssm")
  recurrent = SpecConfig(draft_tokens=draft_tokens, ring_len=ring_len, verify_mode="recurrent")
  return recurrent, replay


def identify_preset(gdn: GDNConfig) -> tuple[str | None, int | None]:
  """The ``(name, tp)`` with ``GDNConfig.preset(name, tp) == gdn``, else ``(None, None)``."""
  for name, base in PRESETS.items():
    if base.num_k_heads % gdn.num_k_heads:
      continue
    tp = base.num_k_heads // gdn.num_k_heads
    if base.num_v_heads % tp == 0 and GDNConfig.preset(name, tp) == gdn:
      return name, tp
  return None, None


def memory_report(gdn: GDNConfig, *, num_slots: int, draft_tokens: int, ring_len: int,
                  activation_dtype: Any = jnp.bfloat16, ring_dtype: Any = None) -> MemoryReport:
  """Bytes of all GDN caches of a model, from closed-form formulas.

  The checkpoint and ``intermediate`` are fp32 (`SpecConfig.ssm_dtype`, which
  ReplaySSM requires). With N GDN layers, S slots and ``a``, ``r`` the
  activation and ring itemsizes:

  - checkpoint   = N S HV V K 4
  - conv         = N S conv_dim (conv_kernel - 1 + T) a
  - intermediate = N S T HV V K 4
  - rings        = N S L ((HV V + H K) (r + a) + 2 HV 4)   (d, k, rawv, rawk; g, beta fp32)
  - cursors      = S (4 + 4 + 1)                            (shared by all layers)

  Args:
    gdn: layer geometry of one TP rank (e.g. ``GDNConfig.preset(name, tp)``).
    num_slots: cache slots, spec slots plus the padding slot.
    draft_tokens: T, the verify window (incl. the root/bonus token).
    ring_len: L, a power of two >= 2 T.
    activation_dtype: dtype of the conv inputs and of the raw rings.
    ring_dtype: dtype of the d and normalised-k rings; None means ``activation_dtype``.

  Returns:
    The report; its totals and saving factors are properties.

  Raises:
    ValueError: a bad slot count, T, L or dtype (the message names the fix).

  >>> from replayssm_jax.config import GDNConfig
  >>> r = memory_report(GDNConfig.preset("qwen3.5-35b-a3b"), num_slots=49, draft_tokens=4,
  ...                   ring_len=16)
  >>> r.intermediate_bytes == 30 * 49 * 4 * 32 * 128 * 128 * 4
  True
  """
  act = _float_dtype("activation_dtype", activation_dtype)
  if ring_dtype is not None:
    ring_dtype = _float_dtype("ring_dtype", ring_dtype)
  _, replay = _specs(num_slots, draft_tokens, ring_len, ring_dtype)
  ring = replay.ring_dtype_for(act)
  N, S, T, L = gdn.num_gdn_layers, num_slots, draft_tokens, ring_len
  H, HV, K, V = gdn.num_k_heads, gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim
  a, r, s, f32 = act.itemsize, ring.itemsize, replay.ssm_dtype.itemsize, 4
  int32, flag = 4, 1
  preset, tp = identify_preset(gdn)
  return MemoryReport(
      gdn=gdn, preset=preset, tp=tp, num_slots=S, draft_tokens=T, ring_len=L,
      ssm_dtype=replay.ssm_dtype.name, activation_dtype=act.name, ring_dtype=ring.name,
      checkpoint_bytes=N * S * HV * V * K * s,
      conv_bytes=N * S * gdn.conv_dim * (gdn.conv_kernel - 1 + T) * a,
      intermediate_bytes=N * S * T * HV * V * K * s,
      ring_bytes=N * S * L * ((HV * V + H * K) * (r + a) + 2 * HV * f32),
      cursor_bytes=S * (2 * int32 + flag),
  )


def container_memory_report(gdn: GDNConfig, *, num_slots: int, draft_tokens: int,
                            ring_len: int, activation_dtype: Any = jnp.bfloat16,
                            ring_dtype: Any = None) -> MemoryReport:
  """The `memory_report` numbers, from the cache containers' byte accounting.

  Builds `RecurrentCache`, `ReplayCache` and `ConvCache` under `jax.eval_shape`
  (shapes and dtypes only, nothing allocated) and sums their per-field bytes
  over the GDN layers; the cursors count once. Same arguments and errors as
  `memory_report`, whose result this should equal field for field.

  Raises:
    ValueError: as `memory_report`.
    RuntimeError: the two caches disagree on the checkpoint bytes (a bug in `state`).
  """
  act = _float_dtype("activation_dtype", activation_dtype)
  if ring_dtype is not None:
    ring_dtype = _float_dtype("ring_dtype", ring_dtype)
  recurrent, replay = _specs(num_slots, draft_tokens, ring_len, ring_dtype)
  rec = jax.eval_shape(lambda: RecurrentCache.create(gdn, recurrent, num_slots)).field_nbytes()
  rep_cache = jax.eval_shape(lambda: ReplayCache.create(gdn, replay, num_slots, dtype=act))
  rep = rep_cache.field_nbytes()
  conv = jax.eval_shape(lambda: ConvCache.create(gdn, replay, num_slots, dtype=act))
  if rec["ssm"] != rep["ssm"]:
    raise RuntimeError(f"checkpoint bytes differ: RecurrentCache {rec['ssm']}, "
                       f"ReplayCache {rep['ssm']}.")
  N = gdn.num_gdn_layers
  preset, tp = identify_preset(gdn)
  return MemoryReport(
      gdn=gdn, preset=preset, tp=tp, num_slots=num_slots, draft_tokens=draft_tokens,
      ring_len=ring_len, ssm_dtype=rep_cache.ssm.dtype.name,
      activation_dtype=rep_cache.ring_rawv.dtype.name, ring_dtype=rep_cache.ring_d.dtype.name,
      checkpoint_bytes=N * rep["ssm"],
      conv_bytes=N * conv.nbytes,
      intermediate_bytes=N * rec["intermediate"],
      ring_bytes=N * sum(rep[name] for name in _RING_FIELDS),
      cursor_bytes=sum(rep[name] for name in _CURSOR_FIELDS),
  )


def format_bytes(n: int) -> str:
  """``n`` bytes in binary units with two decimals: ``'11.48 GiB'``, ``'441 B'``."""
  for unit, size in (("GiB", _GIB), ("MiB", _MIB), ("KiB", _KIB)):
    if abs(n) >= size:
      return f"{n / size:.2f} {unit}"
  return f"{n} B"


def _title(report: MemoryReport) -> str:
  gdn = report.gdn
  name = f"{report.preset}, tp={report.tp}" if report.preset else "custom geometry"
  return (f"GDN cache memory: {name} ({gdn.num_gdn_layers} GDN layers; H={gdn.num_k_heads}, "
          f"HV={gdn.num_v_heads}, K={gdn.head_k_dim}, V={gdn.head_v_dim}, "
          f"conv_dim={gdn.conv_dim})")


def format_table(report: MemoryReport) -> str:
  """A readable, aligned table of `report` in binary units (GiB / MiB / KiB)."""

  def cell(n: int | None) -> str:
    return "-" if n is None else format_bytes(n)

  r = report
  rows = [
      ("checkpoint (ssm)", r.checkpoint_bytes, r.checkpoint_bytes),
      ("conv + conv_window", r.conv_bytes, r.conv_bytes),
      ("intermediate (spec scratch)", r.intermediate_bytes, None),
      ("rings x6 (spec scratch)", None, r.ring_bytes),
      ("cursors (all layers)", None, r.cursor_bytes),
      ("total", r.recurrent_total_bytes, r.replayssm_total_bytes),
  ]
  label_w = max(len(label) for label, _, _ in rows)
  col_w = max(len("recurrent"), len("replayssm"),
              *(len(cell(n)) for _, a, b in rows for n in (a, b)))
  lines = [
      _title(r),
      f"slots={r.num_slots}, T={r.draft_tokens}, L={r.ring_len}; checkpoint {r.ssm_dtype}, "
      f"activations {r.activation_dtype}, d/k rings {r.ring_dtype}",
      "",
      f"{'':<{label_w}}  {'recurrent':>{col_w}}  {'replayssm':>{col_w}}",
  ]
  for i, (label, a, b) in enumerate(rows):
    if i == len(rows) - 1:
      lines.append("-" * (label_w + 2 * col_w + 4))
    lines.append(f"{label:<{label_w}}  {cell(a):>{col_w}}  {cell(b):>{col_w}}")
  freed = (f"{format_bytes(r.saved_bytes)} freed" if r.saved_bytes >= 0
           else f"{format_bytes(-r.saved_bytes)} more")
  lines += [
      "",
      f"spec scratch: {format_bytes(r.intermediate_bytes)} -> {format_bytes(r.ring_bytes)} "
      f"({r.scratch_saving:.2f}x smaller)",
      f"total:        {format_bytes(r.recurrent_total_bytes)} -> "
      f"{format_bytes(r.replayssm_total_bytes)} ({r.total_saving:.2f}x smaller, {freed})",
  ]
  return "\n".join(lines)


def to_json(report: MemoryReport) -> dict[str, Any]:
  """`report` as a flat JSON-ready dict: inputs, geometry, bytes (ints), totals, savings."""
  r, gdn = report, report.gdn
  return {
      "preset": r.preset,
      "tp": r.tp,
      "num_slots": r.num_slots,
      "draft_tokens": r.draft_tokens,
      "ring_len": r.ring_len,
      "ssm_dtype": r.ssm_dtype,
      "activation_dtype": r.activation_dtype,
      "ring_dtype": r.ring_dtype,
      "num_gdn_layers": gdn.num_gdn_layers,
      "num_k_heads": gdn.num_k_heads,
      "num_v_heads": gdn.num_v_heads,
      "head_k_dim": gdn.head_k_dim,
      "head_v_dim": gdn.head_v_dim,
      "conv_dim": gdn.conv_dim,
      "checkpoint_bytes": r.checkpoint_bytes,
      "conv_bytes": r.conv_bytes,
      "intermediate_bytes": r.intermediate_bytes,
      "ring_bytes": r.ring_bytes,
      "cursor_bytes": r.cursor_bytes,
      "recurrent_total_bytes": r.recurrent_total_bytes,
      "replayssm_total_bytes": r.replayssm_total_bytes,
      "saved_bytes": r.saved_bytes,
      "scratch_saving": r.scratch_saving,
      "total_saving": r.total_saving,
  }
