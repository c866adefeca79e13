"""Device timing for the benchmarks: medians of per-call device time from the JAX profiler.

Each call of the measured jitted function is run under `jax.profiler.trace`; the
device kernels of the trace are grouped per call (every call launches the same
kernels in the same order) and summed, so launch gaps and host work are not
counted. On a GPU a 256 MiB pass runs before every call (untimed), so each call
starts with a cold L2 (`L2_FLUSHES`): by default a write, as in the anchor's
`triton.testing.do_bench`. A call of several steps runs the same pass between them, inside
the jitted call (`flush_between_steps`). The pass is a Pallas kernel of its own name
(`L2_FLUSH_KERNEL`), which the timing drops wherever it runs. Where the profiler yields no
device events (a CPU, or a profiler failure) the timing falls back to the host clock around
``block_until_ready``, and the result says so.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import glob
import tempfile
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from replayssm_jax.kernels.backend import interpret_mode


@dataclasses.dataclass(frozen=True)
class Timing:
  median_us: float
  p20_us: float
  p80_us: float
  reps: int
  method: str  # "device-events" or "host-clock"
  kernels: tuple[str, ...] = ()  # device kernels launched by one call
  kernel_us: tuple[float, ...] = ()  # the median device time of each of them
  wall_us: float = float("nan")  # median host clock of a call to its result (dispatch included)
  # Median device span of a call: its first kernel's start to its last kernel's end. Above the
  # summed time by the launch gaps; below it where kernels run concurrently. A call of several
  # steps with L2 flushed between them spans its stretches between the flushes, summed: each
  # step's own gaps count, the flushes and the gaps beside them do not.
  span_us: float = float("nan")

  def per_call(self, n: int) -> "Timing":
    """The timing of one of the ``n`` equal steps a call makes (every time divided by n)."""
    return dataclasses.replace(
        self, median_us=self.median_us / n, p20_us=self.p20_us / n, p80_us=self.p80_us / n,
        kernel_us=tuple(us / n for us in self.kernel_us), wall_us=self.wall_us / n,
        span_us=self.span_us / n)

  def by_kernel(self) -> dict[str, float]:
    """Median microseconds per kernel name (summed over the launches of one name)."""
    out: dict[str, float] = {}
    for name, us in zip(self.kernels, self.kernel_us):
      out[name] = round(out.get(name, 0.0) + us, 2)
    return out


def _summary(times_us: list[float], method: str, kernels=(), kernel_us=(), wall_us=(),
             span_us=()) -> Timing:
  t = np.asarray(times_us)
  median = lambda xs: float(np.median(xs)) if len(xs) else float("nan")
  return Timing(float(np.median(t)), float(np.quantile(t, 0.2)), float(np.quantile(t, 0.8)),
                len(t), method, tuple(kernels), tuple(float(x) for x in kernel_us),
                median(wall_us), median(span_us))


def _device_events(trace_dir: str) -> list[tuple[float, float, str]]:
  """(start_ns, duration_ns, name) of every kernel on GPU planes of a trace."""
  from jax.profiler import ProfileData

  events = []
  for path in glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True):
    for plane in ProfileData.from_file(path).planes:
      if not plane.name.startswith("/device:GPU"):
        continue
      for line in plane.lines:
        # Stream lines carry the kernels; the "XLA Ops"/"XLA Modules" lines repeat them.
        if not line.name.startswith("Stream"):
          continue
        events.extend((ev.start_ns, ev.duration_ns, ev.name) for ev in line.events)
  return sorted(events)


# How the 256 MiB pass before each timed call leaves L2 (60 MB on an H200):
# * "write": ``b + 1`` in place, as do_bench's ``cache.zero_()``: L2 ends full of dirty lines,
#   which the timed call's first misses write back to HBM beside its own traffic;
# * "read": a row sum of the buffer: L2 ends full of clean lines, as after a kernel that
#   streamed weights, so the timed call pays its own bytes only;
# * "none": no pass (warm L2 where the call's data fits).
L2_FLUSHES = ("write", "read", "none")
L2_FLUSH = "write"  # the default of `time_calls`; `--l2-flush` of bench.kernels and sweep sets it
# Whether a call of several steps flushes between them (`steps_flush_state`; `bench.kernels
# --no-l2-flush-steps` keeps L2 warm from one step to the next, as runs 1-36 measured them).
FLUSH_BETWEEN_STEPS = True


def add_l2_flush_option(parser) -> None:
  """``--l2-flush`` (one of `L2_FLUSHES`, default `L2_FLUSH`) on an argparse parser: the
  option of `bench.kernels` and of the probes in ``tools/``."""
  parser.add_argument("--l2-flush", choices=L2_FLUSHES, default=L2_FLUSH,
                      help="how the 256 MiB pass before each timed call leaves L2: dirty lines "
                           "('write', as do_bench), clean lines ('read') or no pass ('none') "
                           "(bench.timing.L2_FLUSH)")


# The flush's kernels are named L2_FLUSH_KERNEL + "_" + mode; `_device_timing` drops them by name.
L2_FLUSH_KERNEL = "l2_flush"
_FLUSH_TILE = (8, 1024)  # fp32: 32 KB a program


def _flush_pass(mode: str) -> Callable:
  """One pass of the flush over its state, as a Pallas kernel named ``l2_flush_<mode>`` (XLA's
  own kernels for such passes have generic names, "loop_add_fusion", that a timed call may
  share). "write": the state is a ``[rows, 1024]`` fp32 buffer, ``+ 1`` in place (donate it);
  "read": ``(buffer, sums)``, the buffer's row sums added to ``sums`` in place, so every pass
  feeds the next and none is dead code inside a jitted call."""
  tile = pl.BlockSpec(_FLUSH_TILE, lambda i: (i, 0))
  column = pl.BlockSpec(_FLUSH_TILE[:1], lambda i: (i,))
  params = dict(interpret=interpret_mode(), name=f"{L2_FLUSH_KERNEL}_{mode}",
                compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=1))

  def write(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0

  def read(x_ref, s_ref, o_ref):
    o_ref[...] = s_ref[...] + jnp.sum(x_ref[...], axis=1)

  def run(state):
    buf = state if mode == "write" else state[0]
    grid = (buf.shape[0] // _FLUSH_TILE[0],)
    if mode == "write":
      return pl.pallas_call(write, out_shape=jax.ShapeDtypeStruct(buf.shape, buf.dtype),
                            grid=grid, in_specs=[tile], out_specs=tile,
                            input_output_aliases={0: 0}, **params)(buf)
    sums = pl.pallas_call(read, out_shape=jax.ShapeDtypeStruct(state[1].shape, jnp.float32),
                          grid=grid, in_specs=[tile, column], out_specs=column,
                          input_output_aliases={1: 0}, **params)(*state)
    return buf, sums

  return run


def _flush_state(nbytes: int, mode: str):
  """What a pass of ``mode`` runs over: zeros of ``nbytes`` rounded down to 32 KB tiles (at
  least one), as ``[rows, 1024]`` fp32, with their row sums for "read"."""
  rows = max(1, nbytes // (4 * _FLUSH_TILE[0] * _FLUSH_TILE[1])) * _FLUSH_TILE[0]
  buf = jnp.zeros((rows, _FLUSH_TILE[1]), jnp.float32)
  return buf if mode == "write" else (buf, jnp.zeros((rows,), jnp.float32))


def _default_flush_bytes() -> int:
  return 0 if interpret_mode() else 256 << 20


@functools.lru_cache(maxsize=None)
def _l2_flusher(nbytes: int, mode: str = "write") -> Callable | None:
  """A callable that runs one pass over ``nbytes`` to evict L2 (``mode`` as in
  `L2_FLUSHES`) and returns the pass's new state (`_flush_pass`); None when no flush is
  wanted. One state per (nbytes, mode), shared by every timing that asks for it."""
  if mode not in L2_FLUSHES:
    raise ValueError(f"l2_flush={mode!r}: expected one of {L2_FLUSHES}.")
  if nbytes <= 0 or mode == "none":
    return None
  box = [_flush_state(nbytes, mode)]
  run = jax.jit(_flush_pass(mode), donate_argnums=0)

  def once():
    box[0] = jax.block_until_ready(run(box[0]))
    return box[0]

  once()  # compiled outside any timing
  return once


def steps_flush_state(nbytes: int | None = None):
  """The state `flush_between_steps` passes over, for a call of several steps to carry in its
  (donated) state; None where no flush runs between steps (a CPU, ``L2_FLUSH = "none"``,
  ``FLUSH_BETWEEN_STEPS = False``). ``nbytes``: default 256 MiB on a GPU, as `time_calls`."""
  nbytes = _default_flush_bytes() if nbytes is None else nbytes
  if nbytes <= 0 or L2_FLUSH == "none" or not FLUSH_BETWEEN_STEPS:
    return None
  return _flush_state(nbytes, L2_FLUSH)


def flush_between_steps(deps, flush_state):
  """Inside a jitted call of several steps: the `L2_FLUSH` pass over ``flush_state`` (from
  `steps_flush_state`) after every array of ``deps`` (the state one step leaves) and before
  any use of the ``deps`` returned (the next step), as `time_calls` passes before each call.
  In a model the other layers' traffic passes through L2 between two steps of a layer, so a
  state that fits L2 (B=16 at the anchor geometry: 32 MiB of checkpoints) must not stay there
  from one step to the next. The timing drops the pass's kernel by its name. Returns ``(deps,
  flush_state)``; with ``flush_state`` None, no pass."""
  if flush_state is None:
    return deps, flush_state
  deps, flush_state = jax.lax.optimization_barrier((deps, flush_state))  # after the step
  flush_state = _flush_pass(L2_FLUSH)(flush_state)
  return jax.lax.optimization_barrier((deps, flush_state))  # before the next step


def time_calls(fn: Callable, state, *, args: tuple = (), reps: int = 50, warmup: int = 3,
               l2_flush_bytes: int | None = None,
               l2_flush: str | None = None) -> tuple[Timing, object]:
  """Time ``state = fn(state, *args)`` (``fn`` jitted, usually donating ``state``).

  Args:
    fn: the jitted call.
    state: its argument (donated buffers are threaded from call to call).
    args: more arguments, the same at every call: inputs such as slot ids, which a server
      passes in. (Closed over, an ``arange`` becomes an iota kernel in every call: ~0.6 us
      on an H200 at B=256.)
    reps, warmup: timed and untimed calls.
    l2_flush_bytes: bytes passed over before every timed call so that each starts with a
      cold L2 (default: 256 MiB on a GPU, none elsewhere). The flush is not timed.
    l2_flush: how that pass leaves L2, one of `L2_FLUSHES` (default: `L2_FLUSH`).

  Returns:
    ``(timing, state)``: the timing and the state after the last call.
  """
  if l2_flush_bytes is None:
    l2_flush_bytes = _default_flush_bytes()
  flush = _l2_flusher(l2_flush_bytes, L2_FLUSH if l2_flush is None else l2_flush)
  for _ in range(warmup):
    state = fn(state, *args)
  jax.block_until_ready(state)
  host = []

  def timed_call(state):
    if flush is not None:
      flush()
    t0 = time.perf_counter()
    state = jax.block_until_ready(fn(state, *args))
    host.append((time.perf_counter() - t0) * 1e6)
    return state

  try:
    with tempfile.TemporaryDirectory() as trace_dir:
      with jax.profiler.trace(trace_dir):
        for _ in range(reps):
          state = timed_call(state)
      events = _device_events(trace_dir)
  except Exception:  # the profiler is optional: fall back to the host clock
    events = []
    while len(host) < reps:
      state = timed_call(state)
  timing = _device_timing(events, reps, host, flushed=flush is not None)
  return timing or _summary(host, "host-clock", wall_us=host), state


def _span_between(group, flush_starts) -> float:
  """The span of a call's kernels ``group`` (sorted by start) in ns: first start to last end,
  or, where flushes start inside it, the spans of its stretches between them, summed."""
  start, end = group[0][0], max(t + d for t, d, _ in group)
  cuts = [t for t in flush_starts if start < t < end]
  stretches: dict[int, tuple[float, float]] = {}
  for t, d, _ in group:
    i = bisect.bisect(cuts, t)
    lo, hi = stretches.get(i, (t, t + d))
    stretches[i] = (min(lo, t), max(hi, t + d))
  return sum(hi - lo for lo, hi in stretches.values())


def _device_timing(events, reps: int, host_us, *, flushed: bool = False) -> Timing | None:
  """The timing of ``reps`` calls from their trace's kernels ``(start_ns, duration_ns, name)``,
  sorted by start, the L2 flush's kernels (`L2_FLUSH_KERNEL`) dropped wherever they run:
  the rest splits into ``reps`` equal groups, one a call. None where it does not.

  Raises:
    RuntimeError: ``flushed`` (a pass before every call) but fewer than ``reps`` flush kernels
      in the trace, so the flush could not be told from the call's own kernels.
  """
  is_flush = lambda name: name.startswith(L2_FLUSH_KERNEL)
  flush_starts = [t for t, _, name in events if is_flush(name)]
  if events and flushed and len(flush_starts) < reps:
    raise RuntimeError(f"{len(flush_starts)} kernels named {L2_FLUSH_KERNEL}* in the trace of "
                       f"{reps} flushed calls: the flush's kernel name did not reach the trace.")
  own = [e for e in events if not is_flush(e[2])]
  if not own or len(own) % reps:
    return None
  per_rep = len(own) // reps
  groups = [own[i * per_rep:(i + 1) * per_rep] for i in range(reps)]
  per_kernel = np.median([[d / 1e3 for _, d, _ in g] for g in groups], axis=0)
  spans = [_span_between(g, flush_starts) / 1e3 for g in groups]
  return _summary([sum(d for _, d, _ in g) / 1e3 for g in groups], "device-events",
                  tuple(name for _, _, name in groups[-1]), per_kernel, host_us, spans)
