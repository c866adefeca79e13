"""Whether XLA runs two independent Pallas kernels at once: the replay verify's coefficients
kernel beside the stream's K-loop (`tools/read_ceiling.py`'s ``loop``), which needs none of
its outputs.

Run it once per XLA setting (the flags are read when the backend starts), e.g.
``XLA_FLAGS=--xla_gpu_command_buffer_scheduling_mode=CONCURRENT``. It prints, per batch size,
each kernel alone, the pair in one jitted call, and the shipped replay verify: the summed
kernel time and the span (first start to last end). Overlap shows as a span below the sum.

H200, jax 0.11.2 (benchmarks/NOTES.md run 30): the kernels overlap under
``--xla_gpu_command_buffer_scheduling_mode=CONCURRENT --xla_gpu_graph_min_graph_size=1``, but
the pair's span at B=64 stays 49.1 us against the loop's 41.9 alone: the loop's programs fill
every SM, and the coefficients kernel, stretched from 8.4 to 21 us, finishes in their gaps.
That was under the write flush, whose dirty lines' write-back fills the DRAM the coefficients
kernel leaves idle (NOTES run 36); ``--l2-flush read`` times the pair under clean L2.

Usage (GPU): ``python tools/concurrency_probe.py --batch 64 256 --out probe.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from replayssm_jax.bench import kernels as bk
from replayssm_jax.bench import timing
from replayssm_jax.bench.timing import _device_events, time_calls
from replayssm_jax.config import SpecConfig
from replayssm_jax.kernels import replay_split
from replayssm_jax.kernels import replay_verify as replay_kernels
from replayssm_jax.kernels.backend import interpret_mode, mma_algorithm

sys.path.insert(0, os.path.dirname(__file__))
from read_ceiling import loop_only  # noqa: E402


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--batch", type=int, nargs="+", default=[64, 256])
  p.add_argument("--reps", type=int, default=20)
  p.add_argument("--out", default="probe.json")
  timing.add_l2_flush_option(p)
  args = p.parse_args(argv)
  timing.L2_FLUSH = args.l2_flush
  g, T, L = bk.GEOMETRY, 4, 16
  spec = SpecConfig(draft_tokens=T, ring_len=L, verify_mode="replayssm")
  rows = [dict(xla_flags=os.environ.get("XLA_FLAGS", ""), l2_flush=args.l2_flush)]
  for B in args.batch:
    rng = np.random.default_rng(B)
    x = bk._inputs(rng, B, T)
    cache = bk._replay_cache(rng, g, spec, B, np.full(B, 8), np.zeros(B, bool))
    slot_ids = jnp.arange(B, dtype=jnp.int32)
    cursors = (slot_ids, cache.write_pos, cache.cache_base)
    window = bk._window(x)
    common = dict(T=T, L=L, gqa_ratio=g.num_v_heads // g.num_k_heads,
                  precision_t=mma_algorithm("ieee", T, interpret=interpret_mode()))
    launch = replay_split.CoefficientLaunch(
        "pallas", replay_split.COEFFICIENT_WARPS, replay_split.COEFFICIENT_INLINE,
        replay_split.COEFFICIENT_KEY_MMA, replay_split.COEFFICIENT_LOADS_FIRST)
    coefficients = functools.partial(replay_split._coefficients, launch=launch,
                                     dot_precision="default", interpret=interpret_mode(),
                                     common=common)
    X = jnp.concatenate([x["q"], x["k"]], axis=1).transpose(0, 2, 1, 3).astype(jnp.float32)
    rings = tuple(getattr(cache, name) for name in replay_kernels.RING_NAMES)
    tuning = bk.kernels_for("pallas").replay_tuning(g.head_v_dim, T, B)
    # The K-loop at the shipped stream's launch (read_ceiling's (block_v, warps, k_chunk, stages)).
    stream_launch = (tuning.block_v, tuning.num_warps, tuning.k_chunk, tuning.num_stages)

    # Each case maps (rings, last output) to the same: the rings are donated, so the kernels
    # that write them in place copy nothing.
    def coefficients_only(state, ssm, X, window, cursors):
      rings = state[0]
      scratch, key_rings = coefficients(window, rings[1:5], cursors)
      return (rings[0], *key_rings, rings[5]), scratch[2]

    def loop(state, ssm, X, window, cursors):
      return state[0], loop_only(X, ssm, stream_launch)

    def pair(state, ssm, X, window, cursors):  # two launches, neither reading the other
      rings, _ = coefficients_only(state, ssm, X, window, cursors)
      return rings, loop_only(X, ssm, stream_launch)

    def verify(state, ssm, X, window, cursors):  # the shipped replay verify
      o, *rings = replay_split.replay_verify_split(
          ssm, *state[0], *window, *cursors, tuning=tuning, dot_precision="default",
          interpret=interpret_mode())
      return tuple(rings), o

    cases = dict(coefficients=coefficients_only, loop=loop, pair=pair, verify=verify)
    fargs = (cache.ssm, X, window, cursors)
    for name, fn in cases.items():
      step = jax.jit(fn, donate_argnums=0)
      state = fn((jax.tree.map(jnp.copy, rings), None), *fargs)  # the state's structure
      t, state = time_calls(step, state, args=fargs, reps=args.reps)
      # One more call, traced (its L2 warm), for the timeline: each kernel's start and end from
      # the first kernel's start.
      with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
          jax.block_until_ready(step(state, *fargs))
        events = _device_events(trace_dir)
      t0 = events[0][0] if events else 0
      timeline = [(n, round((s - t0) / 1e3, 1), round((s + d - t0) / 1e3, 1))
                  for s, d, n in events]
      row = dict(B=B, case=name, sum_us=round(t.median_us, 2), span_us=round(t.span_us, 2),
                 wall_us=round(t.wall_us, 2), kernels=t.by_kernel(), timeline=timeline)
      rows.append(row)
      print(row, flush=True)
  with open(args.out, "w") as f:
    json.dump(rows, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
