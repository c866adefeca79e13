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
can check the other. `measure_step_bytes` adds what XLA says the compiled,
donated per-layer steps (`ssm.verify`, `ssm.commit`) of each mode need: it
lowers and compiles them ahead of time on shape structs, again allocating
nothing, and reads `Compiled.memory_analysis()`. Units are binary:
1 GiB = 2**30 bytes.

Qwen3.5-35B-A3B at TP1, 49 slots, T=4, fp32 states: ``intermediate`` is
30 * 49 * 4 * 32 * 128 * 128 * 4 B = 11.48 GiB, SGLang's "11.5 GB" of spec
scratch (`research/replayssm-algorithm.md` section 5.1).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any

import jax
import jax.numpy as jnp

from replayssm_jax.config import PRESETS, GDNConfig, SpecConfig, gpu_available
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
    copy_bytes: the checkpoint's bf16 copy (`SpecConfig.checkpoint_copy`), ReplaySSM only;
      0 without it.
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
  copy_bytes: int = 0

  @property
  def recurrent_total_bytes(self) -> int:
    """Checkpoint + conv + intermediate."""
    return self.checkpoint_bytes + self.conv_bytes + self.intermediate_bytes

  @property
  def replayssm_total_bytes(self) -> int:
    """Checkpoint + conv + rings + cursors (+ the checkpoint copy)."""
    return (self.checkpoint_bytes + self.conv_bytes + self.ring_bytes + self.cursor_bytes
            + self.copy_bytes)

  @property
  def replayssm_scratch_bytes(self) -> int:
    """ReplaySSM's spec scratch: the rings (+ the checkpoint copy)."""
    return self.ring_bytes + self.copy_bytes

  @property
  def saved_bytes(self) -> int:
    """What ReplaySSM frees against the recurrent verify (negative if it costs more)."""
    return self.recurrent_total_bytes - self.replayssm_total_bytes

  @property
  def scratch_saving(self) -> float:
    """intermediate / (rings + copy): how many times smaller the spec scratch gets."""
    return self.intermediate_bytes / self.replayssm_scratch_bytes

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


def _specs(num_slots: int, draft_tokens: int, ring_len: int, ring_dtype: Any,
           checkpoint_copy: Any = None) -> tuple[SpecConfig, SpecConfig]:
  """Validated ``(recurrent, replayssm)`` specs; SpecConfig raises on bad T or L."""
  if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
    raise ValueError(f"memory_report: num_slots={num_slots!r} must be a positive integer "
                     "(spec slots plus the padding slot).")
  replay = SpecConfig(draft_tokens=draft_tokens, ring_len=ring_len, ring_dtype=ring_dtype,
                      verify_mode="replayssm", checkpoint_copy=checkpoint_copy)
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
                  activation_dtype: Any = jnp.bfloat16, ring_dtype: Any = None,
                  checkpoint_copy: Any = None) -> MemoryReport:
  """Bytes of all GDN caches of a model, from closed-form formulas.

  The checkpoint and ``intermediate`` are fp32 (`SpecConfig.ssm_dtype`, which
  ReplaySSM requires). With N GDN layers, S slots and ``a``, ``r`` the
  activation and ring itemsizes:

  - checkpoint   = N S HV V K 4
  - conv         = N S conv_dim (conv_kernel - 1 + T) a
  - intermediate = N S T HV V K 4
  - rings        = N S L ((HV V + H K) (r + a) + 2 HV 4)   (d, k, rawv, rawk; g, beta fp32)
  - cursors      = S (4 + 4 + 1)                            (shared by all layers)
  - copy         = N S HV V K 2, with ``checkpoint_copy=jnp.bfloat16``, else 0

  Args:
    gdn: layer geometry of one TP rank (e.g. ``GDNConfig.preset(name, tp)``).
    num_slots: cache slots, spec slots plus the padding slot.
    draft_tokens: T, the verify window (incl. the root/bonus token).
    ring_len: L, a power of two >= 2 T.
    activation_dtype: dtype of the conv inputs and of the raw rings.
    ring_dtype: dtype of the d and normalised-k rings; None means ``activation_dtype``.
    checkpoint_copy: `SpecConfig.checkpoint_copy` (None or ``jnp.bfloat16``).

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
  _, replay = _specs(num_slots, draft_tokens, ring_len, ring_dtype, checkpoint_copy)
  ring = replay.ring_dtype_for(act)
  copy = 0 if replay.checkpoint_copy is None else replay.checkpoint_copy.itemsize
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
      copy_bytes=N * S * HV * V * K * copy,
  )


def container_memory_report(gdn: GDNConfig, *, num_slots: int, draft_tokens: int,
                            ring_len: int, activation_dtype: Any = jnp.bfloat16,
                            ring_dtype: Any = None, checkpoint_copy: Any = None) -> MemoryReport:
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
  recurrent, replay = _specs(num_slots, draft_tokens, ring_len, ring_dtype, checkpoint_copy)
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
      copy_bytes=N * rep["ssm_copy"],
  )


# ----------------------------------------------------------------------------- measured


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepBytes:
  """XLA's memory analysis of one compiled, donated per-layer step, in bytes.

  Attributes:
    argument_bytes: all arguments: the donated SSM cache plus ``input_bytes``.
    input_bytes: the arguments other than the cache (``q, k, v, a, b, A_log,
      dt_bias, slot_ids`` of a verify; ``slot_ids, accepted`` of a commit),
      computed exactly from their shapes.
    output_bytes: all outputs: the new cache, the verify's ``o``, and on CPU
      XLA's output tuple (8 B per output leaf).
    temp_bytes: scratch the step needs beyond its arguments and outputs.
    alias_bytes: outputs that reuse the buffers of donated arguments.
  """

  argument_bytes: int
  input_bytes: int
  output_bytes: int
  temp_bytes: int
  alias_bytes: int

  @property
  def device_bytes(self) -> int:
    """The step's footprint on the device: arguments + outputs + temp - aliased."""
    return self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes


@dataclasses.dataclass(frozen=True, kw_only=True)
class AllocatedBytes:
  """Device memory counters (`jax.Device.memory_stats`) around one real run of a mode's steps.

  Attributes:
    bytes_in_use_before: before the cache and inputs were allocated.
    bytes_in_use_with_cache: after allocating one layer's cache and the step inputs.
    bytes_in_use_after: after one verify and one commit (their results still held).
    peak_bytes_in_use: the process's peak so far; JAX cannot reset it, so it
      is this mode's own peak only where it exceeds every earlier one.
  """

  bytes_in_use_before: int
  bytes_in_use_with_cache: int
  bytes_in_use_after: int
  peak_bytes_in_use: int

  @property
  def cache_and_inputs_bytes(self) -> int:
    """What allocating the cache and the inputs added."""
    return self.bytes_in_use_with_cache - self.bytes_in_use_before

  @property
  def peak_above_before(self) -> int:
    """The peak over what was in use before this mode's run (an upper bound of its peak)."""
    return self.peak_bytes_in_use - self.bytes_in_use_before


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModeBytes:
  """Measured bytes of one verify mode, all per GDN layer.

  Attributes:
    mode: ``"recurrent"`` or ``"replayssm"``.
    cache_bytes: one layer's SSM cache (`RecurrentCache` / `ReplayCache`, the
      donated argument of both steps), from its shapes; no conv cache.
    verify: the compiled `ssm.verify`.
    commit: the compiled `ssm.commit`.
    allocated: device counters of a real run, or None (not asked, or a device
      without memory stats, such as the CPU).
  """

  mode: str
  cache_bytes: int
  verify: StepBytes
  commit: StepBytes
  allocated: AllocatedBytes | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeasuredBytes:
  """`measure_step_bytes`'s result: both modes' per-layer steps as XLA compiled them.

  Attributes:
    gdn: the layer geometry (of one TP rank).
    num_slots: cache slots.
    draft_tokens: T.
    ring_len: L.
    batch: rows of the measured verify and commit.
    activation_dtype: dtype name of the inputs, conv and raw rings.
    ring_dtype: dtype name of the d and normalised-k rings.
    backend: kernel backend the steps were compiled with (`SpecConfig.backend`).
    platform: JAX platform that compiled them (``"cpu"``, ``"gpu"``).
    device_kind: the device's kind (``"cpu"``, ``"NVIDIA H200"``).
    compile_seconds: wall time of lowering and compiling the four steps.
    recurrent: the recurrent verify mode.
    replayssm: ReplaySSM.
    allocation_note: why no real allocation was measured although it was asked
      for, else None.
  """

  gdn: GDNConfig
  num_slots: int
  draft_tokens: int
  ring_len: int
  batch: int
  activation_dtype: str
  ring_dtype: str
  backend: str
  platform: str
  device_kind: str
  compile_seconds: float
  recurrent: ModeBytes
  replayssm: ModeBytes
  allocation_note: str | None = None

  @property
  def num_gdn_layers(self) -> int:
    return self.gdn.num_gdn_layers

  @property
  def modes(self) -> tuple[ModeBytes, ModeBytes]:
    """``(recurrent, replayssm)``."""
    return self.recurrent, self.replayssm

  def model_step_bytes(self, mode: ModeBytes) -> int:
    """All GDN layers' SSM caches plus what one layer's verify needs beyond its own cache.

    The layers verify one after another, so one step's inputs, outputs and
    scratch are live at a time next to every layer's cache: an estimate of the
    GDN part of a model's verify step (without conv caches and the rest of the model).
    """
    return self.num_gdn_layers * mode.cache_bytes + mode.verify.device_bytes - mode.cache_bytes


def default_measure_backend() -> str:
  """The backend a machine runs by default: ``"pallas"`` on a GPU, ``"xla"`` on a CPU.

  On a CPU the Pallas kernels run in interpret mode, which compiles to something
  quite unlike the GPU kernels, so the XLA reference path is the one worth measuring.
  """
  return "pallas" if gpu_available() else "xla"


def _struct(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


def _nbytes(structs) -> int:
  """Bytes of the arrays (or shape structs) in ``structs``."""
  return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(structs))


def _step_bytes(compiled: Any, input_bytes: int, what: str) -> StepBytes:
  """`StepBytes` of ``compiled``; RuntimeError where the platform has no memory analysis."""
  stats = compiled.memory_analysis()
  if stats is None:
    raise RuntimeError(f"measure_step_bytes: XLA gives no memory analysis of {what} on "
                       f"{jax.default_backend()}.")
  return StepBytes(argument_bytes=int(stats.argument_size_in_bytes), input_bytes=input_bytes,
                   output_bytes=int(stats.output_size_in_bytes),
                   temp_bytes=int(stats.temp_size_in_bytes),
                   alias_bytes=int(stats.alias_size_in_bytes))


def _run_allocated(stats_fn, init_fn, verify_fn, commit_fn, verify_inputs, commit_inputs
                   ) -> AllocatedBytes | None:
  """Allocate a cache for real, run ``verify_fn`` and ``commit_fn`` once, read ``stats_fn()``.

  ``stats_fn`` is a device's ``memory_stats``; where it returns None (the CPU)
  nothing is allocated and the result is None. ``verify_inputs`` and
  ``commit_inputs`` are shape structs; the slot ids become ``0 .. B-1`` (distinct,
  as the steps require) and the other inputs zeros.
  """
  before = stats_fn()
  if before is None:
    return None

  def value(s: jax.ShapeDtypeStruct, slot_ids: bool) -> jax.Array:
    return jnp.arange(s.shape[0], dtype=s.dtype) if slot_ids else jnp.zeros(s.shape, s.dtype)

  cache = init_fn()
  *acts, slot_struct = verify_inputs
  inputs = [value(s, False) for s in acts] + [value(slot_struct, True)]
  slot_ids = inputs[-1]
  accepted = jnp.ones(commit_inputs[1].shape, commit_inputs[1].dtype)
  jax.block_until_ready((cache, inputs, accepted))
  with_cache = stats_fn()
  o, cache = verify_fn(cache, *inputs)
  cache = commit_fn(cache, slot_ids, accepted)
  jax.block_until_ready((o, cache))
  after = stats_fn()
  del o, cache, inputs, slot_ids, accepted
  return AllocatedBytes(
      bytes_in_use_before=int(before.get("bytes_in_use", 0)),
      bytes_in_use_with_cache=int(with_cache.get("bytes_in_use", 0)),
      bytes_in_use_after=int(after.get("bytes_in_use", 0)),
      peak_bytes_in_use=int(after.get("peak_bytes_in_use", 0)))


def measure_step_bytes(gdn: GDNConfig, num_slots: int, draft_tokens: int, ring_len: int, *,
                       batch: int | None = None, activation_dtype: Any = jnp.bfloat16,
                       ring_dtype: Any = None, backend: str | None = None,
                       allocate: bool = False, checkpoint_copy: Any = None) -> MeasuredBytes:
  """Bytes of the compiled per-layer verify and commit of both modes, from XLA's memory analysis.

  For each mode, one layer's SSM cache is built with `jax.eval_shape` of
  `ssm.init` (shapes only) and the jitted, cache-donating `ssm.verify` and
  `ssm.commit` are lowered and compiled ahead of time on shape structs; nothing
  is allocated, so even a serving-size cache compiles in seconds on a CPU.
  `StepBytes.device_bytes` = arguments + outputs + temp - aliased is a step's
  footprint on the device. Everything is per layer; a model runs its GDN layers
  one after another on their own caches (`MeasuredBytes.model_step_bytes`).

  Args:
    gdn: layer geometry of one TP rank.
    num_slots: cache slots, spec slots plus the padding slot.
    draft_tokens: T, the verify window.
    ring_len: L, ring records per slot.
    batch: rows per step; None means ``num_slots - 1`` (every spec slot at once,
      the padding slot idle), at least 1.
    activation_dtype: dtype of q, k, v, a, b, the conv inputs and the raw rings.
    ring_dtype: dtype of the d and normalised-k rings; None means ``activation_dtype``.
    backend: ``"xla"`` or ``"pallas"``; None means `default_measure_backend`
      (Pallas on a GPU, XLA on a CPU, where Pallas would compile its interpreter).
    allocate: also allocate one layer's cache of each mode for real, run each
      step once and read the device's ``memory_stats()`` (ReplaySSM first). Only
      where the device has memory stats (GPUs); elsewhere nothing is allocated
      and `MeasuredBytes.allocation_note` says why.
    checkpoint_copy: the ReplaySSM cache's `SpecConfig.checkpoint_copy`.

  Returns:
    The measurement; `ModeBytes.cache_bytes` equals `memory_report`'s per-layer
    checkpoint + intermediate (recurrent) or checkpoint + rings + cursors (+ the copy;
    ReplaySSM).

  Raises:
    ValueError: a bad slot count, batch, T, L, dtype or backend.
    RuntimeError: XLA gives no memory analysis on this platform.
  """
  from replayssm_jax import ssm  # the kernels: imported only when measuring

  act = _float_dtype("activation_dtype", activation_dtype)
  if ring_dtype is not None:
    ring_dtype = _float_dtype("ring_dtype", ring_dtype)
  _specs(num_slots, draft_tokens, ring_len, ring_dtype, checkpoint_copy)  # slots, T, L, copy
  if batch is None:
    batch = max(1, num_slots - 1)
  if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= num_slots:
    raise ValueError(f"measure_step_bytes: batch={batch!r} must be an integer in "
                     f"1..num_slots={num_slots} (slot ids of one step are distinct).")
  backend = default_measure_backend() if backend is None else backend
  if backend not in ("xla", "pallas"):
    raise ValueError(f"measure_step_bytes: backend={backend!r} is unknown; use 'xla' or 'pallas'.")

  B, T = batch, draft_tokens
  H, HV, K, V = gdn.num_k_heads, gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim
  verify_inputs = (_struct((B, T, H, K), act), _struct((B, T, H, K), act),
                   _struct((B, T, HV, V), act), _struct((B, T, HV), act),
                   _struct((B, T, HV), act), _struct((HV,), jnp.float32),
                   _struct((HV,), jnp.float32), _struct((B,), jnp.int32))
  commit_inputs = (_struct((B,), jnp.int32), _struct((B,), jnp.int32))
  device = jax.devices()[0]
  allocation_note = None
  if allocate and device.memory_stats() is None:
    allocation_note = f"{device.platform} gives no memory_stats(); nothing was allocated"

  start = time.perf_counter()
  compiled, modes = {}, {}
  for mode in ("recurrent", "replayssm"):
    spec = SpecConfig(draft_tokens=T, ring_len=ring_len, verify_mode=mode, backend=backend,
                      ring_dtype=ring_dtype,
                      checkpoint_copy=checkpoint_copy if mode == "replayssm" else None)
    cache = jax.eval_shape(functools.partial(ssm.init, gdn, spec, num_slots, dtype=act))
    verify = ssm.verify.lower(cache, *verify_inputs, spec=spec).compile()
    commit = ssm.commit.lower(cache, *commit_inputs, spec=spec).compile()
    compiled[mode] = (spec, verify, commit)
    modes[mode] = ModeBytes(
        mode=mode, cache_bytes=cache.nbytes,
        verify=_step_bytes(verify, _nbytes(verify_inputs), f"the {mode} verify"),
        commit=_step_bytes(commit, _nbytes(commit_inputs), f"the {mode} commit"))
  compile_seconds = time.perf_counter() - start

  if allocate and allocation_note is None:
    for mode in ("replayssm", "recurrent"):  # the smaller first: the peak only grows
      spec, verify, commit = compiled[mode]
      allocated = _run_allocated(device.memory_stats,
                                 functools.partial(ssm.init, gdn, spec, num_slots, dtype=act),
                                 verify, commit, verify_inputs, commit_inputs)
      modes[mode] = dataclasses.replace(modes[mode], allocated=allocated)

  replay_spec = compiled["replayssm"][0]
  return MeasuredBytes(
      gdn=gdn, num_slots=num_slots, draft_tokens=T, ring_len=ring_len, batch=B,
      activation_dtype=act.name, ring_dtype=replay_spec.ring_dtype_for(act).name,
      backend=backend, platform=device.platform, device_kind=device.device_kind,
      compile_seconds=compile_seconds, recurrent=modes["recurrent"],
      replayssm=modes["replayssm"], allocation_note=allocation_note)


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


def format_table(report: MemoryReport, measured: MeasuredBytes | None = None) -> str:
  """A readable, aligned table of `report` in binary units (GiB / MiB / KiB).

  With ``measured``, the `format_measured` section follows it.
  """

  def cell(n: int | None) -> str:
    return "-" if n is None else format_bytes(n)

  r = report
  rows = [
      ("checkpoint (ssm)", r.checkpoint_bytes, r.checkpoint_bytes),
      ("conv + conv_window", r.conv_bytes, r.conv_bytes),
      ("intermediate (spec scratch)", r.intermediate_bytes, None),
      ("rings x6 (spec scratch)", None, r.ring_bytes),
      *([("checkpoint copy (spec scratch)", None, r.copy_bytes)] if r.copy_bytes else []),
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
      f"spec scratch: {format_bytes(r.intermediate_bytes)} -> "
      f"{format_bytes(r.replayssm_scratch_bytes)} "
      f"({r.scratch_saving:.2f}x smaller)",
      f"total:        {format_bytes(r.recurrent_total_bytes)} -> "
      f"{format_bytes(r.replayssm_total_bytes)} ({r.total_saving:.2f}x smaller, {freed})",
  ]
  if measured is not None:
    lines += ["", format_measured(measured)]
  return "\n".join(lines)


def format_measured(measured: MeasuredBytes) -> str:
  """The section "measured (XLA memory analysis, <platform>, per layer)" of the table.

  One row per `StepBytes` field of each step, the per-layer cache, and the
  all-layer rows (caches times the GDN layers; `MeasuredBytes.model_step_bytes`).
  """
  m, N = measured, measured.num_gdn_layers
  rec, rep = m.recurrent, m.replayssm
  rows: list[tuple[str, int | None, int | None]] = [("SSM cache (donated)", rec.cache_bytes,
                                                     rep.cache_bytes)]
  for step in ("verify", "commit"):
    a, b = getattr(rec, step), getattr(rep, step)
    rows += [
        (f"{step}: arguments", a.argument_bytes, b.argument_bytes),
        (f"{step}: outputs", a.output_bytes, b.output_bytes),
        (f"{step}: temp", a.temp_bytes, b.temp_bytes),
        (f"{step}: aliased", a.alias_bytes, b.alias_bytes),
        (f"{step}: device bytes", a.device_bytes, b.device_bytes),
    ]
  if rec.allocated is not None or rep.allocated is not None:
    def alloc(mode: ModeBytes, field: str) -> int | None:
      return None if mode.allocated is None else getattr(mode.allocated, field)

    rows += [
        ("allocated: cache + inputs", alloc(rec, "cache_and_inputs_bytes"),
         alloc(rep, "cache_and_inputs_bytes")),
        ("allocated: peak - before", alloc(rec, "peak_above_before"),
         alloc(rep, "peak_above_before")),
    ]
  totals = [
      (f"SSM caches x {N} layers", N * rec.cache_bytes, N * rep.cache_bytes),
      (f"{N} caches + one verify", m.model_step_bytes(rec), m.model_step_bytes(rep)),
  ]

  def cell(n: int | None) -> str:
    return "-" if n is None else format_bytes(n)

  label_w = max(len(label) for label, _, _ in rows + totals)
  col_w = max(len("recurrent"), len("replayssm"),
              *(len(cell(n)) for _, a, b in rows + totals for n in (a, b)))

  def line(label: str, a: int | None, b: int | None) -> str:
    return f"{label:<{label_w}}  {cell(a):>{col_w}}  {cell(b):>{col_w}}"

  device = m.platform if m.device_kind.lower() == m.platform else f"{m.platform}, {m.device_kind}"
  allocated = ("nothing allocated" if rec.allocated is None and rep.allocated is None
               else "then allocated and run once (memory_stats)")
  lines = [
      f"measured (XLA memory analysis, {m.platform}, per layer)",
      f"backend {m.backend} ({device}); one GDN layer's SSM cache (no conv), donated; "
      f"{m.batch} rows per step",
      f"compiled ahead of time on shapes in {m.compile_seconds:.1f} s, {allocated}",
      "",
      f"{'':<{label_w}}  {'recurrent':>{col_w}}  {'replayssm':>{col_w}}",
      *(line(*row) for row in rows),
      "-" * (label_w + 2 * col_w + 4),
      *(line(*row) for row in totals),
      "",
      "device bytes = arguments + outputs + temp - aliased; arguments = cache + inputs "
      f"({format_bytes(rec.verify.input_bytes)} verify, {format_bytes(rec.commit.input_bytes)} "
      "commit)",
      f"{N} caches + one verify: every layer's cache plus one layer's verify beyond its cache",
  ]
  if m.allocation_note:
    lines.append(f"allocate: {m.allocation_note}")
  return "\n".join(lines)


def measured_to_json(measured: MeasuredBytes) -> dict[str, Any]:
  """``measured`` as a JSON-ready dict: setup, then per mode the per-layer bytes (ints)."""
  m = measured

  def step(b: StepBytes) -> dict[str, int]:
    return {"argument_bytes": b.argument_bytes, "input_bytes": b.input_bytes,
            "output_bytes": b.output_bytes, "temp_bytes": b.temp_bytes,
            "alias_bytes": b.alias_bytes, "device_bytes": b.device_bytes}

  def mode(x: ModeBytes) -> dict[str, Any]:
    allocated = None
    if x.allocated is not None:
      allocated = dataclasses.asdict(x.allocated) | {
          "cache_and_inputs_bytes": x.allocated.cache_and_inputs_bytes,
          "peak_above_before": x.allocated.peak_above_before}
    return {"cache_bytes": x.cache_bytes, "verify": step(x.verify), "commit": step(x.commit),
            "all_layers_cache_bytes": m.num_gdn_layers * x.cache_bytes,
            "model_step_bytes": m.model_step_bytes(x), "allocated": allocated}

  return {
      "per_layer": True,
      "source": "XLA memory analysis",
      "platform": m.platform,
      "device_kind": m.device_kind,
      "backend": m.backend,
      "batch": m.batch,
      "num_gdn_layers": m.num_gdn_layers,
      "compile_seconds": m.compile_seconds,
      "recurrent": mode(m.recurrent),
      "replayssm": mode(m.replayssm),
      "allocation_note": m.allocation_note,
  }


def to_json(report: MemoryReport, measured: MeasuredBytes | None = None) -> dict[str, Any]:
  """`report` as a flat JSON-ready dict: inputs, geometry, bytes (ints), totals, savings.

  With ``measured``, a ``"measured"`` key holds `measured_to_json`.
  """
  r, gdn = report, report.gdn
  data = {
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
      "copy_bytes": r.copy_bytes,
      "recurrent_total_bytes": r.recurrent_total_bytes,
      "replayssm_total_bytes": r.replayssm_total_bytes,
      "saved_bytes": r.saved_bytes,
      "scratch_saving": r.scratch_saving,
      "total_saving": r.total_saving,
  }
  if measured is not None:
    data["measured"] = measured_to_json(measured)
  return data
