"""Device timing for the benchmarks: medians of per-call device time from the JAX profiler.

Each call of the measured jitted function is run under `jax.profiler.trace`; the
device kernels of the trace are grouped per call (every call launches the same
kernels in the same order) and summed, so launch gaps and host work are not
counted. Where the profiler yields no device events (a CPU, or a profiler
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
import numpy as np


@dataclasses.dataclass(frozen=True)
class Timing:
  median_us: float
  p20_us: float
  p80_us: float
  reps: int
  method: str  # "device-events" or "host-clock"
  kernels: tuple[str, ...] = ()  # device kernels launched by one call


def _summary(times_us: list[float], method: str, kernels=()) -> Timing:
  t = np.asarray(times_us)
  return Timing(float(np.median(t)), float(np.quantile(t, 0.2)), float(np.quantile(t, 0.8)),
                len(t), method, tuple(kernels))


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


def time_calls(fn: Callable, state, *, reps: int = 50, warmup: int = 3) -> tuple[Timing, object]:
  """Time ``state = fn(state)`` (``fn`` jitted, usually donating ``state``).

  Returns:
    ``(timing, state)``: the timing and the state after the last call.
  """
  for _ in range(warmup):
    state = fn(state)
  jax.block_until_ready(state)
  host = []
  try:
    with tempfile.TemporaryDirectory() as trace_dir:
      with jax.profiler.trace(trace_dir):
        for _ in range(reps):
          t0 = time.perf_counter()
          state = jax.block_until_ready(fn(state))
          host.append((time.perf_counter() - t0) * 1e6)
      events = _device_events(trace_dir)
  except Exception:  # the profiler is optional: fall back to the host clock
    events = []
    while len(host) < reps:
      t0 = time.perf_counter()
      state = jax.block_until_ready(fn(state))
      host.append((time.perf_counter() - t0) * 1e6)
  if events and len(events) % reps == 0:
    per_call = len(events) // reps
    groups = [events[i * per_call:(i + 1) * per_call] for i in range(reps)]
    names = tuple(name for _, _, name in groups[-1])
    return _summary([sum(d for _, d, _ in g) / 1e3 for g in groups], "device-events", names), state
  return _summary(host, "host-clock"), state
