"""Device timing for the benchmarks: medians of per-call device time from the JAX profiler.

Each call of the measured jitted function is run under `jax.profiler.trace`; the
device kernels of the trace are grouped per call (every call launches the same
kernels in the same order) and summed, so launch gaps and host work are not
counted. On a GPU a 256 MiB pass runs before every call (untimed), so each call
starts with a cold L2 (`L2_FLUSHES`): by default a write, as in the anchor's
`triton.testing.do_bench`. Where the profiler yields no device events (a CPU, or a profiler
failure) the timing falls back to the host clock around ``block_until_ready``,
and the result says so.
"""

from __future__ import annotations

import dataclasses
import glob
import tempfile
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np


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
  # summed time by the launch gaps; below it where kernels run concurrently.
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
L2_FLUSH = "write"  # the default of `time_calls`; `bench.kernels --l2-flush` sets it


def add_l2_flush_option(parser) -> None:
  """``--l2-flush`` (one of `L2_FLUSHES`, default `L2_FLUSH`) on an argparse parser: the
  option of `bench.kernels` and of the probes in ``tools/``."""
  parser.add_argument("--l2-flush", choices=L2_FLUSHES, default=L2_FLUSH,
                      help="how the 256 MiB pass before each timed call leaves L2: dirty lines "
                           "('write', as do_bench), clean lines ('read') or no pass ('none') "
                           "(bench.timing.L2_FLUSH)")


def _l2_flusher(nbytes: int, mode: str = "write"):
  """A jitted pass over ``nbytes`` that evicts L2 between timed calls (``mode`` as in
  `L2_FLUSHES`; each call returns what its pass wrote) and its number of device events per
  call (0 when no flush is wanted)."""
  if mode not in L2_FLUSHES:
    raise ValueError(f"l2_flush={mode!r}: expected one of {L2_FLUSHES}.")
  if nbytes <= 0 or mode == "none":
    return None, 0
  state = {"buf": jnp.zeros((nbytes // 4,), jnp.float32)}
  if mode == "write":
    write = jax.jit(lambda b: b + 1.0, donate_argnums=0)

    def once():
      state["buf"] = jax.block_until_ready(write(state["buf"]))
      return state["buf"]
  else:
    read = jax.jit(lambda b: b.reshape(-1, 8192).sum(axis=1))

    def once():
      return jax.block_until_ready(read(state["buf"]))

  once()
  try:
    with tempfile.TemporaryDirectory() as trace_dir:
      with jax.profiler.trace(trace_dir):
        for _ in range(3):
          once()
      count = len(_device_events(trace_dir))
  except Exception:
    count = 0
  return once, (count // 3 if count % 3 == 0 else -1)


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
    l2_flush_bytes = 256 << 20 if jax.default_backend() in ("gpu", "cuda", "rocm") else 0
  flush, flush_events = _l2_flusher(l2_flush_bytes, L2_FLUSH if l2_flush is None else l2_flush)
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
  timing = _device_timing(events, reps, flush_events, host)
  return timing or _summary(host, "host-clock", wall_us=host), state


def _device_timing(events, reps: int, flush_events: int, host_us) -> Timing | None:
  """The timing of ``reps`` calls from their trace's kernels ``(start_ns, duration_ns, name)``,
  sorted by start: each call's group is the L2 flush's ``flush_events`` kernels, then the
  call's own. None where the kernels do not split into such groups."""
  if not events or flush_events < 0 or len(events) % reps:
    return None
  per_rep = len(events) // reps
  groups = [events[i * per_rep + flush_events:(i + 1) * per_rep] for i in range(reps)]
  names = tuple(name for _, _, name in groups[-1])
  if not names:
    return None
  per_kernel = np.median([[d / 1e3 for _, d, _ in g] for g in groups], axis=0)
  spans = [(max(t + d for t, d, _ in g) - g[0][0]) / 1e3 for g in groups]
  return _summary([sum(d for _, d, _ in g) / 1e3 for g in groups], "device-events", names,
                  per_kernel, host_us, spans)
