"""End-to-end verify step of all GDN layers: recurrent vs ReplaySSM, time and peak memory (GPU).

One step is, for the GDN layers of Qwen3.5-35B-A3B (30 layers, HV=32, H=16, K=V=128; T=4,
L=16; no attention or MLP), `ssm.verify` of a T-token window in every layer, then `ssm.commit`
of random accepted counts in 1..T in every layer, all inside ONE jitted call whose caches are
donated (`make_step`):

- ``recurrent``: verify writes every draft state into ``intermediate``, commit copies one;
- ``replayssm``: verify folds the flush rows (a third of the rows, at write_pos 12) and runs
  the replay verify of the rest (write_pos 4 and 8), commit moves cursors. The cursors of
  every layer are restored at the end of the call, so every timed call sees the same phases
  (as `kernels._restoring`).

Measured per (mode, B): the median device time of the step (`timing.time_calls`: its kernels'
summed time, and its span, first kernel start to last kernel end, which counts the GPU's idle
gaps inside the step too), the device's
peak memory (``memory_stats()["peak_bytes_in_use"]``, which cannot be reset: each mode runs in
a fresh subprocess), the compiled step's `memory_analysis()` (argument, output, alias and temp
bytes; also on a CPU), and the spec scratch of the mode (``intermediate`` against the six
rings, from the caches' own byte accounting). Every compiled step is checked for aliasing:
the donated caches must alias the outputs and the optimised HLO must hold no copy of a cache
array (`cache_copies`).

Layout: the layers' caches are a tuple of per-layer caches, and the step a Python loop over
them. ``--layout scan`` stacks them on a leading layer axis and runs `jax.lax.scan`; XLA then
copies the stacked checkpoint and ``intermediate`` (the scan's outputs are fresh buffers), which
the aliasing check reports, so it is a diagnostic, not the measurement.

    python -m replayssm_jax.bench.step --out step.json            # GPU: pallas backend
    python -m replayssm_jax.bench.step --tiny --out /tmp/s.json   # CPU smoke run (xla backend)
    python -m replayssm_jax.bench.step --checkpoint-copy bfloat16  # ReplaySSM reads a bf16 copy
    python -m replayssm_jax.bench.step --batch 256 --set "ssm.SKIP_IDLE_FOLD={'xla': False, \
        'pallas': True, 'triton': False}"   # a knob of the package set in every mode's process

``--tiny`` runs a tiny geometry on the CPU; its numbers mean nothing. The issue #9 target is
"peak memory of the ReplaySSM step at B = 256 at least 5x below the recurrent step's spec
scratch"; the summary gives that ratio against the whole ReplaySSM peak (checkpoint and inputs
included) and against the ReplaySSM step's own spec memory (rings, and the checkpoint copy if
kept, + transient).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import functools
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from replayssm_jax import GDNConfig, SpecConfig, ssm
from replayssm_jax.bench.kernels import ACT, TINY, _cursors, _window, knobs_set, parse_knob
from replayssm_jax.bench.timing import time_calls
from replayssm_jax.memory import format_bytes
from replayssm_jax.state import ReplayCache

PRESET = "qwen3.5-35b-a3b"
T, L = 4, 16
MODES = ("recurrent", "replayssm")
# B=256 first: the memory target is set there, and a run cut short by --budget-s keeps it.
BATCHES = (256, 16, 64, 512)
TINY_BATCHES = (2, 4)
TINY_LAYERS = 2
# ReplaySSM row phases, by row index mod 3 (as `kernels.rssm_step_mixed`): (write_pos, is_flush).
PHASES = ((L - T, True), (4, False), (8, False))
_GPU = ("gpu", "cuda", "rocm")
_CURSOR_FIELDS = ("write_pos", "cache_base", "is_flush")


# ----------------------------------------------------------------------------- caches and inputs


def geometry(tiny: bool) -> GDNConfig:
  """The per-layer geometry: the Qwen3.5-35B-A3B preset at TP1, or the tiny CPU one."""
  return TINY if tiny else GDNConfig.preset(PRESET)


def spec_for(mode: str, backend: str, checkpoint_copy: str | None = None) -> SpecConfig:
  """The SpecConfig of ``mode`` (T=4, L=16); ``checkpoint_copy`` applies to replayssm."""
  return SpecConfig(draft_tokens=T, ring_len=L, verify_mode=mode, backend=backend,
                    checkpoint_copy=checkpoint_copy if mode == "replayssm" else None)


def _uniform(seed: jax.Array, index: int, shape: tuple[int, ...]) -> jax.Array:
  """f32 in [0, 1) from a 32-bit integer hash (lowbias32) of the element index, the seed and
  the array's ``index``: cheap to compile, fused into one write, no transient buffer."""
  n = math.prod(shape)
  x = jax.lax.iota(jnp.uint32, n).reshape(shape) * jnp.uint32(0x9E3779B9)
  x = x ^ (seed.astype(jnp.uint32) * jnp.uint32(0x85EBCA6B) + jnp.uint32(index * 0xC2B2AE35 & 0xFFFFFFFF))
  for shift, mul in ((16, 0x7FEB352D), (15, 0x846CA68B)):
    x = (x ^ (x >> shift)) * jnp.uint32(mul)
  x = x ^ (x >> 16)
  return (x >> 8).astype(jnp.float32) * (1.0 / (1 << 24))


# Benchmark data by kind; "normal" has the variance of 0.3 * N(0, 1), "unit" of N(0, 1).
_KINDS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "zeros": lambda u: jnp.zeros_like(u),
    "normal": lambda u: (2 * u - 1) * (0.3 * 3 ** 0.5),
    "unit": lambda u: (2 * u - 1) * 3 ** 0.5,
    "log_decay": lambda u: -(0.003 + 0.147 * u),  # ring_g: log-decays as the gates make them
    "uniform": lambda u: u,  # ring_beta: write strengths
    "A_log": lambda u: jnp.log(0.01 + 0.09 * u),
}


@functools.partial(jax.jit, static_argnames=("layout",))
def _fill(seed: jax.Array, layout: tuple[tuple[str, tuple[int, ...], str, str], ...]) -> dict:
  """Arrays ``{name: kind(shape, dtype)}`` for ``layout = ((name, shape, dtype, kind), ...)``,
  made on the device (one compile per layout; ``seed`` is traced)."""
  out = {}
  for i, (name, shape, dtype, kind) in enumerate(layout):
    out[name] = _KINDS[kind](_uniform(seed, i, shape)).astype(dtype)
  return out


_LEAF_KIND = {"ssm": "normal", "intermediate": "zeros", "ring_d": "normal", "ring_k": "normal",
              "ring_rawk": "normal", "ring_rawv": "normal", "ring_g": "log_decay",
              "ring_beta": "uniform", "ssm_copy": "normal"}


def _cursor_values(B: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
  """Mixed phases: row b at ``PHASES[b % 3]``; ring bases at random."""
  wp, flush = zip(*(PHASES[b % 3] for b in range(B)))
  return dict(write_pos=np.asarray(wp, np.int32), cache_base=rng.integers(0, L, B).astype(np.int32),
              is_flush=np.asarray(flush, bool))


def layer_cache_shape(gdn: GDNConfig, spec: SpecConfig, B: int):
  """The cache of one layer, as `jax.ShapeDtypeStruct`s (nothing allocated)."""
  return jax.eval_shape(lambda: ssm.init(gdn, spec, B, dtype=ACT))


def make_caches(gdn: GDNConfig, spec: SpecConfig, B: int, layers: int, *, seed: int = 0,
                layout: str = "loop"):
  """The caches of ``layers`` GDN layers for ``B`` slots, filled on the device.

  Random checkpoints (and, for ReplaySSM, full rings and mixed-phase cursors, `PHASES`);
  ``intermediate`` is zero (verify writes it before commit reads it).

  Returns:
    ``layout="loop"``: a tuple of per-layer caches; ``"scan"``: one cache whose leaves
    carry a leading layer axis.
  """
  shape = layer_cache_shape(gdn, spec, B)
  rng = np.random.default_rng(seed)
  lead = (layers,) if layout == "scan" else ()
  names = [f.name for f in dataclasses.fields(shape)]
  arrays = tuple((n, (*lead, *getattr(shape, n).shape), jnp.dtype(getattr(shape, n).dtype).name,
                  _LEAF_KIND[n]) for n in names
                 if n not in _CURSOR_FIELDS and getattr(shape, n) is not None)

  def one(layer: int):
    fields = _fill(jnp.uint32(seed * 1000 + layer), arrays)
    for n in names:
      if n in _CURSOR_FIELDS:
        values = np.stack([_cursor_values(B, rng)[n] for _ in range(math.prod(lead))])
        fields[n] = jnp.asarray(values.reshape(*lead, B))
    return type(shape)(**fields)

  if layout == "scan":
    return one(0)
  return tuple(one(i) for i in range(layers))


def make_inputs(gdn: GDNConfig, B: int, layers: int, *, seed: int = 1, layout: str = "loop"):
  """The inputs of every layer: q, k, v, a, b (activation dtype) and A_log, dt_bias (f32).

  Returns a tuple of per-layer dicts (``"loop"``) or one dict of stacked arrays (``"scan"``).
  """
  H, HV, K, V = gdn.num_k_heads, gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim
  lead = (layers,) if layout == "scan" else ()
  act = jnp.dtype(ACT).name
  arrays = (("q", (*lead, B, T, H, K), act, "unit"), ("k", (*lead, B, T, H, K), act, "unit"),
            ("v", (*lead, B, T, HV, V), act, "unit"), ("a", (*lead, B, T, HV), act, "unit"),
            ("b", (*lead, B, T, HV), act, "unit"), ("A_log", (*lead, HV), "float32", "A_log"),
            ("dt_bias", (*lead, HV), "float32", "normal"))
  one = lambda layer: _fill(jnp.uint32(seed * 1000 + layer), arrays)
  return one(0) if layout == "scan" else tuple(one(i) for i in range(layers))


def accepted_counts(B: int, seed: int = 2) -> jax.Array:
  """Accepted tokens per row (bonus included), random in 1..T; the same for every layer."""
  return jnp.asarray(np.random.default_rng(seed).integers(1, T + 1, B), jnp.int32)


# ----------------------------------------------------------------------------- the step


def _layer(cache, x: dict, slot_ids: jax.Array, accepted: jax.Array, spec: SpecConfig):
  """Verify then commit one layer (the ``scan`` layout's body); ReplaySSM cursors come back as
  they were. Returns ``(probe, cache)``, ``probe`` as in `make_step`."""
  o, new = ssm.verify(cache, *_window(x), slot_ids, spec)
  new = ssm.commit(new, slot_ids, accepted, spec)
  if isinstance(new, ReplayCache):
    new = dataclasses.replace(new, **_cursors(cache))
  return o[:, :, 0, 0].astype(jnp.float32), new


def make_step(spec: SpecConfig, layout: str = "loop", *, donate: bool = True,
              chain: bool = True) -> Callable:
  """The whole step ``(caches, inputs, slot_ids, accepted) -> (probe, caches)``, jitted with the
  caches donated (``donate=False`` only to show what the aliasing check catches).

  ``loop`` runs as a model step would: the verifies layer after layer, then the commits layer
  after layer. The layers share no data here, so `jax.lax.optimization_barrier` ties each
  layer's inputs to the previous layer's output and cache (as a model's hidden state would) and
  each commit to the previous one; otherwise XLA may schedule the layers side by side and hold
  their temporaries at once. ``chain=False`` drops these barriers (a fallback, should they cost
  copies on a GPU). ReplaySSM cursors are restored at the end, so every call sees the same
  phases.
  ``probe`` ``f32[B, T]`` sums one output element per token over the layers: it keeps every
  output live (the kernels write all of it) without adding traffic.
  """

  def loop(caches, inputs, slot_ids, accepted):
    caches = list(caches)
    saved = [_cursors(c) if isinstance(c, ReplayCache) else {} for c in caches]
    total = jnp.zeros((slot_ids.shape[0], T), jnp.float32)
    for i, x in enumerate(inputs):
      if i and chain:  # layer i starts when layer i - 1 is done, output and cache
        total, caches[i - 1], x = jax.lax.optimization_barrier((total, caches[i - 1], x))
      o, caches[i] = ssm.verify(caches[i], *_window(x), slot_ids, spec)
      total = total + o[:, :, 0, 0].astype(jnp.float32)
    # The accepted counts come from the last layer's logits: commits start after every verify.
    if chain:
      total, caches[-1], accepted = jax.lax.optimization_barrier((total, caches[-1], accepted))
    for i in range(len(caches)):
      caches[i] = ssm.commit(caches[i], slot_ids, accepted, spec)
      if chain:
        caches[i], accepted = jax.lax.optimization_barrier((caches[i], accepted))
    return total, tuple(dataclasses.replace(c, **s) for c, s in zip(caches, saved))

  def scan(caches, inputs, slot_ids, accepted):
    def body(total, layer_in):
      probe, cache = _layer(*layer_in, slot_ids, accepted, spec)
      return total + probe, cache

    return jax.lax.scan(body, jnp.zeros((slot_ids.shape[0], T), jnp.float32), (caches, inputs))

  if layout not in ("loop", "scan"):
    raise ValueError(f"make_step: layout={layout!r}; use 'loop' or 'scan'.")
  return jax.jit(loop if layout == "loop" else scan, donate_argnums=0 if donate else ())


# ----------------------------------------------------------------------------- aliasing check

_SHAPE = re.compile(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]")
_COPY = re.compile(r"\bcopy(?:-start)?\([^%)]*%([\w.\-]+)")  # the copied operand's name
_BUFFER = re.compile(r"(param|parameter|arg|p[0-9.]|get-tuple-element|gte|bitcast)", re.I)


def _hlo_shape(x) -> tuple[str, tuple[int, ...]]:
  return jnp.dtype(x.dtype).name, tuple(int(d) for d in x.shape)


_HLO_DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int32": "s32", "bool": "pred"}


def cache_copies(compiled, caches) -> list[str]:
  """Instructions of the optimised HLO that copy a whole cache array (state or ring).

  A ``copy`` / ``copy-start`` of an existing buffer (a parameter, a tuple element or a bitcast
  of one, not a freshly computed value) whose shape is that of a donated cache leaf of rank >= 2
  (the cursors are exempt: restoring them copies a few bytes by design) is a copy of that
  array: traffic and memory that a donated, in-place step must not have.
  """
  wanted = set()
  for leaf in jax.tree.leaves(caches):
    if len(leaf.shape) >= 2:
      dtype, dims = _hlo_shape(leaf)
      wanted.add((_HLO_DTYPES.get(dtype, dtype), dims))
  found = []
  for line in compiled.as_text().splitlines():
    m = _COPY.search(line)
    if not m or not _BUFFER.match(m.group(1)):
      continue
    shapes = {(d, tuple(int(x) for x in dims.split(",") if x)) for d, dims in _SHAPE.findall(line)}
    if shapes & wanted:
      found.append(line.strip()[:300])
  return found


def tree_nbytes(tree) -> int:
  """Bytes of all array leaves of ``tree`` (arrays or shape structs)."""
  return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def analysis(compiled) -> dict[str, int | None]:
  """`compiled.memory_analysis()` as a dict, plus its peak estimate (arguments + outputs - aliased
  + temp)."""
  ma = compiled.memory_analysis()
  if ma is None:
    return dict(argument_bytes=None, output_bytes=None, alias_bytes=None, temp_bytes=None,
                analysis_peak_bytes=None)
  out = dict(argument_bytes=int(ma.argument_size_in_bytes), output_bytes=int(ma.output_size_in_bytes),
             alias_bytes=int(ma.alias_size_in_bytes), temp_bytes=int(ma.temp_size_in_bytes))
  out["analysis_peak_bytes"] = (out["argument_bytes"] + out["output_bytes"] - out["alias_bytes"]
                                + out["temp_bytes"])
  return out


def assert_no_cache_copy(compiled, caches) -> None:
  """Raise `AssertionError` unless the donated caches alias the outputs without any copy.

  Checks (on the compiled, optimised step): `memory_analysis` aliases at least the caches'
  bytes, and `cache_copies` finds no copy of a cache array.
  """
  nbytes = tree_nbytes(caches)
  alias = analysis(compiled)["alias_bytes"]
  if alias is not None and alias < nbytes:
    raise AssertionError(f"only {alias} of the {nbytes} donated cache bytes alias an output")
  copies = cache_copies(compiled, caches)
  if copies:
    raise AssertionError(f"{len(copies)} copies of cache arrays in the compiled step:\n"
                         + "\n".join(copies[:8]))


# ----------------------------------------------------------------------------- one mode (child)


def resolve_backend(backend: str) -> str:
  """``auto``: ``pallas`` on a GPU, ``xla`` elsewhere."""
  if backend != "auto":
    return backend
  return "pallas" if jax.default_backend() in _GPU else "xla"


def static_bytes(gdn: GDNConfig, spec: SpecConfig, B: int, layers: int) -> dict[str, int]:
  """Bytes of the caches (all layers) and inputs of one step, without allocating them."""
  fields = layer_cache_shape(gdn, spec, B).field_nbytes()
  inputs = jax.eval_shape(lambda: make_inputs(gdn, B, 1))
  scratch = (fields["intermediate"] if spec.verify_mode == "recurrent"
             else sum(n for name, n in fields.items() if name.startswith("ring_"))
             + fields["ssm_copy"])
  return dict(cache_bytes=layers * sum(fields.values()), checkpoint_bytes=layers * fields["ssm"],
              scratch_bytes=layers * scratch, input_bytes=layers * tree_nbytes(inputs))


def _memory_stats() -> dict[str, int] | None:
  try:
    stats = jax.devices()[0].memory_stats()
  except Exception:  # noqa: BLE001 - platforms without allocator statistics
    return None
  return stats or None


def run_mode(mode: str, B: int, *, layers: int, tiny: bool = False, backend: str = "auto",
             layout: str = "loop", chain: bool = True, reps: int = 20,
             warmup: int = 2, checkpoint_copy: str | None = None) -> dict[str, Any]:
  """Build, compile, check, measure and time one mode at batch ``B``; returns its row.

  Memory: the device's ``bytes_in_use`` after the caches and inputs are built
  (``resident_bytes``) and ``peak_bytes_in_use`` after ``warmup`` steps (``peak_bytes``);
  ``step_transient_bytes`` is their difference, what the step needs beyond its arguments.
  Run it in a fresh process for a clean peak. A mode whose caches and inputs exceed the
  device's ``bytes_limit`` is skipped; a failure (e.g. out of memory) is recorded, not raised.
  """
  gdn = geometry(tiny)
  backend = resolve_backend(backend)
  spec = spec_for(mode, backend, checkpoint_copy)
  device = jax.devices()[0]
  row: dict[str, Any] = dict(mode=mode, B=B, layers=layers, layout=layout, chain=chain, backend=backend,
                             device=device.device_kind, platform=device.platform, jax=jax.__version__,
                             status="ok", checkpoint_copy=checkpoint_copy,
                             **static_bytes(gdn, spec, B, layers))
  stats = _memory_stats()
  row["bytes_limit"] = stats.get("bytes_limit") if stats else None
  need = row["cache_bytes"] + row["input_bytes"]
  if row["bytes_limit"] and need > row["bytes_limit"]:
    row.update(status="skipped", error=f"caches + inputs need {format_bytes(need)}; the device "
               f"allows {format_bytes(row['bytes_limit'])}")
    return row
  try:
    caches = jax.block_until_ready(make_caches(gdn, spec, B, layers, seed=B, layout=layout))
    inputs = jax.block_until_ready(make_inputs(gdn, B, layers, seed=B + 1, layout=layout))
    slot_ids, accepted = jnp.arange(B, dtype=jnp.int32), accepted_counts(B, seed=B + 2)
    stats = _memory_stats()
    row["resident_bytes"] = stats.get("bytes_in_use") if stats else None
    row["build_peak_bytes"] = stats.get("peak_bytes_in_use") if stats else None
    t0 = time.perf_counter()
    compiled = make_step(spec, layout, chain=chain).lower(caches, inputs, slot_ids, accepted).compile()
    row["compile_s"] = round(time.perf_counter() - t0, 2)
    row.update(analysis(compiled))
    row["cache_copies"] = cache_copies(compiled, caches)
    row["no_cache_copy"] = (not row["cache_copies"]
                            and (row["alias_bytes"] is None or row["alias_bytes"] >= row["cache_bytes"]))
    if not row["no_cache_copy"]:
      print(f"WARNING {mode} B={B}: the compiled step copies cache arrays (alias "
            f"{row['alias_bytes']} of {row['cache_bytes']} bytes):\n" + "\n".join(row["cache_copies"][:4]),
            flush=True)
    for _ in range(warmup):
      _, caches = compiled(caches, inputs, slot_ids, accepted)
    jax.block_until_ready(caches)
    stats = _memory_stats()
    row["peak_bytes"] = stats.get("peak_bytes_in_use") if stats else None
    if stats and row["resident_bytes"] is not None:
      row["step_transient_bytes"] = row["peak_bytes"] - row["resident_bytes"]
      # The peak is the step's only if building the caches peaked lower.
      row["peak_from_step"] = row["peak_bytes"] > row["build_peak_bytes"]
    t, caches = time_calls(lambda c: compiled(c, inputs, slot_ids, accepted)[1], caches, reps=reps)
    del caches
    row.update(median_us=round(t.median_us, 2), p20_us=round(t.p20_us, 2), p80_us=round(t.p80_us, 2),
               per_layer_us=round(t.median_us / layers, 2), wall_us=round(t.wall_us, 1),
               # first kernel start to last kernel end: the GPU's idle gaps inside the step
               # (a conditional's wait, say) count here and not in the kernels' sum
               span_us=None if math.isnan(t.span_us) else round(t.span_us, 1),
               reps=t.reps, method=t.method,
               kernels=dict(collections.Counter(t.kernels)),
               # Device kernels named like copies (GPU; restoring the cursors may copy a few bytes).
               copy_kernels=sorted({k for k in t.kernels if "copy" in k.lower()}))
  except Exception as e:  # noqa: BLE001 - an OOM or compile failure is a result, not a crash
    row.update(status="error", error=f"{type(e).__name__}: {str(e)[:1500]}")
    traceback.print_exc()
  return row


# ----------------------------------------------------------------------------- driver


def _run_child(mode: str, B: int, args: argparse.Namespace) -> dict[str, Any]:
  """`run_mode` in a fresh interpreter (a clean ``peak_bytes_in_use``)."""
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "row.json")
    cmd = [sys.executable, "-m", "replayssm_jax.bench.step", "--child", mode, "--batch", str(B),
           "--layers", str(args.layers), "--backend", args.backend, "--layout", args.layout,
           "--reps", str(args.reps), "--out", out] + (["--tiny"] if args.tiny else []) + (
               [] if args.chain else ["--no-chain"]) + [a for k in args.set for a in ("--set", k)]
    if args.checkpoint_copy:
      cmd += ["--checkpoint-copy", args.checkpoint_copy]
    env = dict(os.environ)
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    try:
      rc = subprocess.run(cmd, env=env, timeout=args.child_timeout_s).returncode
    except subprocess.TimeoutExpired:
      return dict(mode=mode, B=B, layers=args.layers, status="error",
                  error=f"timeout after {args.child_timeout_s} s")
    if os.path.exists(out):
      with open(out) as f:
        return json.load(f)
    return dict(mode=mode, B=B, layers=args.layers, status="error", error=f"child exited {rc}")


def _peak(row: dict[str, Any]) -> int | None:
  """The device peak of a row, else `memory_analysis`'s estimate."""
  return row["peak_bytes"] if row.get("peak_bytes") is not None else row.get("analysis_peak_bytes")


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """Per batch size with both modes: the issue #9 memory ratios and the step speed-up.

  - ``scratch_vs_peak``: recurrent spec scratch / the ReplaySSM step's peak memory (the device
    peak; `memory_analysis`'s estimate where the device has no allocator statistics);
  - ``scratch_vs_spec``: recurrent spec scratch / (ReplaySSM rings [+ checkpoint copy] + the
    step's transient bytes);
  - ``peak_ratio``: recurrent peak / ReplaySSM peak; ``speedup``: recurrent / ReplaySSM time.
  """
  by = {(r["B"], r["mode"]): r for r in rows}
  out = []
  for B in sorted({r["B"] for r in rows}):
    rec, rep = by.get((B, "recurrent")), by.get((B, "replayssm"))
    if not rec or not rep or "scratch_bytes" not in rec or rep.get("status") != "ok":
      continue
    transient = rep.get("step_transient_bytes")
    if transient is None:
      transient = rep.get("temp_bytes") or 0
    s = dict(B=B, recurrent_scratch_bytes=rec["scratch_bytes"], replayssm_scratch_bytes=rep["scratch_bytes"],
             replayssm_peak_bytes=_peak(rep),
             peak_source="device" if rep.get("peak_bytes") is not None else "memory_analysis",
             replayssm_spec_bytes=rep["scratch_bytes"] + max(0, transient),
             copy=rep.get("checkpoint_copy") is not None)
    s["scratch_vs_peak"] = round(s["recurrent_scratch_bytes"] / s["replayssm_peak_bytes"], 2)
    s["scratch_vs_spec"] = round(s["recurrent_scratch_bytes"] / s["replayssm_spec_bytes"], 2)
    if rec.get("status") == "ok":
      s["peak_ratio"] = round(_peak(rec) / _peak(rep), 2)
      s["speedup"] = round(rec["median_us"] / rep["median_us"], 3)
    out.append(s)
  return out


def _b(n) -> str:
  return "-" if n is None else format_bytes(int(n))


def format_table(result: dict[str, Any]) -> str:
  """The rows and the summary as a readable table."""
  head = (f"{'B':>4} {'mode':<9} {'status':<7} {'median ms':>10} {'p20-p80 ms':>15} {'us/layer':>9} "
          f"{'peak':>11} {'transient':>11} {'temp':>11} {'spec scratch':>13} {'no copy':>7}")
  lines = [f"step benchmark: {result.get('device')} ({result.get('platform')}), {result['layers']} GDN "
           f"layers, T={T}, L={L}, layout {result['layout']}", head]
  for r in sorted(result["rows"], key=lambda r: (r["B"], MODES.index(r["mode"]))):
    ok = r.get("status") == "ok"
    ms = lambda k: f"{r[k] / 1e3:.3f}" if ok else "-"
    lines.append(
        f"{r['B']:>4} {r['mode']:<9} {r.get('status', '?'):<7} {ms('median_us'):>10} "
        f"{(ms('p20_us') + '-' + ms('p80_us')) if ok else '-':>15} "
        f"{r['per_layer_us'] if ok else '-':>9} "
        f"{_b(_peak(r)):>11} "
        f"{_b(r.get('step_transient_bytes')):>11} {_b(r.get('temp_bytes')):>11} "
        f"{_b(r.get('scratch_bytes')):>13} {str(r.get('no_cache_copy', '-')):>7}")
  for s in result.get("summary", []):
    line = (f"B={s['B']}: recurrent spec scratch {_b(s['recurrent_scratch_bytes'])} / ReplaySSM step "
            f"peak {_b(s['replayssm_peak_bytes'])} ({s['peak_source']}) = {s['scratch_vs_peak']}x; "
            f"/ ReplaySSM {'rings + copy' if s.get('copy') else 'rings'} + transient "
            f"{_b(s['replayssm_spec_bytes'])} = {s['scratch_vs_spec']}x")
    if "speedup" in s:
      line += f"; peak ratio {s['peak_ratio']}x, step speed-up {s['speedup']}x"
    lines.append(line)
  lines.append("(peak: device peak_bytes_in_use, else memory_analysis's estimate; transient: peak - "
               "bytes in use before the step; temp: memory_analysis temp; target (#9): "
               "scratch / peak >= 5 at B=256)")
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default="step.json")
  p.add_argument("--tiny", action="store_true", help="tiny geometry on the CPU (a smoke run)")
  p.add_argument("--batch", type=int, nargs="+", default=None,
                 help=f"batch sizes (default {BATCHES}; --tiny {TINY_BATCHES})")
  p.add_argument("--layers", type=int, default=None,
                 help=f"GDN layers (default: the preset's, 30; --tiny {TINY_LAYERS})")
  p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
  p.add_argument("--backend", default="auto", choices=("auto", "xla", "pallas", "triton"),
                 help="auto: pallas on a GPU, xla elsewhere")
  p.add_argument("--layout", default="loop", choices=("loop", "scan"))
  p.add_argument("--no-chain", dest="chain", action="store_false",
                 help="no optimization barriers between the layers (see make_step)")
  p.add_argument("--reps", type=int, default=20)
  p.add_argument("--budget-s", type=float, default=float("inf"),
                 help="start no new batch size after this many seconds (rows so far are kept)")
  p.add_argument("--in-process", action="store_true",
                 help="run the modes in this process (no subprocess; the device peak is then shared)")
  p.add_argument("--child-timeout-s", type=float, default=300.0,
                 help="a mode that runs longer is recorded as an error")
  p.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=VALUE",
                 help="set a knob of replayssm_jax.MODULE for the run (repeatable), as "
                      "bench.kernels --set, e.g. \"ssm.SKIP_IDLE_FOLD={'xla': False, "
                      "'pallas': True, 'triton': False}\"")
  p.add_argument("--checkpoint-copy", choices=("bfloat16",), default=None,
                 help="the ReplaySSM caches keep a bf16 copy of each checkpoint, which the "
                      "verify reads (SpecConfig.checkpoint_copy; default: none)")
  p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)  # one mode, one B -> --out
  args = p.parse_args(argv)
  try:
    knobs = {(module, name): value for module, name, value in map(parse_knob, args.set)}
  except argparse.ArgumentTypeError as e:
    p.error(str(e))
  args.layers = args.layers or (TINY_LAYERS if args.tiny else geometry(False).num_gdn_layers)
  batches = args.batch or (TINY_BATCHES if args.tiny else BATCHES)

  knobs_named = {f"{module.__name__}.{name}": repr(value)
                 for (module, name), value in knobs.items()}

  def run_here(mode: str, B: int) -> dict[str, Any]:
    """`run_mode` in this process under the knobs, which its row names."""
    with knobs_set(knobs):
      row = run_mode(mode, B, layers=args.layers, tiny=args.tiny, backend=args.backend,
                     layout=args.layout, chain=args.chain, reps=args.reps,
                     checkpoint_copy=args.checkpoint_copy)
    return dict(row, set=knobs_named)

  if args.child:
    row = run_here(args.child, batches[0])
    with open(args.out, "w") as f:
      json.dump(row, f, indent=1)
    return 0

  start = time.monotonic()
  rows: list[dict[str, Any]] = []
  result: dict[str, Any] = dict(
      date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
      python=platform.python_version(), preset=None if args.tiny else PRESET, tiny=args.tiny,
      geometry=dataclasses.asdict(geometry(args.tiny)), layers=args.layers, T=T, L=L,
      layout=args.layout, chain=args.chain, phases=[list(p) for p in PHASES],
      checkpoint_copy=args.checkpoint_copy,
      set=knobs_named, rows=rows, summary=[])

  def write():
    first = next((r for r in rows if "device" in r), {})
    result.update(device=first.get("device"), platform=first.get("platform"), jax=first.get("jax"),
                  summary=summarize(rows))
    with open(args.out, "w") as f:  # after every row: a cut-short run keeps what it has
      json.dump(result, f, indent=1)

  for B in batches:
    if time.monotonic() - start > args.budget_s:
      print(f"stopping before B={B}: the {args.budget_s} s budget is spent", flush=True)
      result["stopped_before_B"] = B
      break
    for mode in args.modes:
      print(f"B={B} {mode} ...", flush=True)
      row = run_here(mode, B) if args.in_process else _run_child(mode, B, args)
      rows.append(row)
      write()
      msg = (f"{row['median_us'] / 1e3:.3f} ms (compile {row['compile_s']} s)" if row.get("status") == "ok"
             else row.get("error", ""))
      print(f"B={B} {mode}: {row.get('status')} {msg}", flush=True)
  write()
  print(format_table(result))
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
