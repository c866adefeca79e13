"""The read ceiling of the replay verify's checkpoint stream, beside the copy bandwidth.

The replay verify reads its fp32 checkpoint once and writes little, so its roofline is a
read rate, not the copy rate the benchmarks divide by. This measures, in one process:

* ``copy``: `bench.kernels.copy_bandwidth` (read + write of a 4 GiB fp32 array);
* ``xla-sum``: XLA's reduction of a 4 GiB fp32 array over its rows (bytes read / time);
* ``loop``: the stream's K-loop alone (`replay_split._stream_kernel`'s ``Y += X S0^T`` over
  K-chunks on the tensor cores, then one ``[2 T_pad, BV]`` store a program) over a checkpoint
  of B rows, for a few launches: what the stream could reach without its epilogue. Its bytes
  are the checkpoint's and X's once per value head, as the stream reads them (the second
  value head's X most likely from L2).

Usage (GPU): ``python tools/read_ceiling.py --batch 256 64 --out read_ceiling.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from replayssm_jax.bench.kernels import GEOMETRY, copy_bandwidth
from replayssm_jax.bench.timing import time_calls
from replayssm_jax.kernels.backend import KernelTuning, interpret_mode, mma_algorithm

# (block_v, num_warps, k_chunk, num_stages): the shipped stream launch first.
LAUNCHES = ((128, 4, 64, 2), (128, 4, 32, 3), (128, 8, 64, 2), (64, 4, 64, 2), (64, 2, 64, 2))


def _loop_kernel(x_ref, s_ref, y_ref, *, heads: int, ratio: int, block_v: int, k_chunk: int,
                 precision):
  """One program per ``[block_v, K]`` tile, in memory order: ``Y = X S0^T`` over K-chunks."""
  i = pl.program_id(0)
  blocks = s_ref.shape[2] // block_v
  row, h, j = i // (heads * blocks), (i // blocks) % heads, i % blocks
  vs = pl.ds(pl.multiple_of(j * block_v, block_v), block_v)

  def chunk(c, Y):
    ks = pl.ds(pl.multiple_of(c * k_chunk, k_chunk), k_chunk)
    return Y + jax.lax.dot_general(x_ref[row, h // ratio, :, ks], s_ref[row, h, vs, ks],
                                   (((1,), (1,)), ((), ())), precision=precision,
                                   preferred_element_type=jnp.float32)

  rows = x_ref.shape[2]
  K = s_ref.shape[3]
  y_ref[row, h, :, vs] = jax.lax.fori_loop(0, K // k_chunk, chunk,
                                           jnp.zeros((rows, block_v), jnp.float32))


def loop_only(x, s, launch) -> jax.Array:
  """The stream's K-loop over checkpoint ``s [B, HV, V, K]`` with ``x [B, H, 2 T_pad, K]``."""
  block_v, warps, k_chunk, stages = launch
  B, HV, V, K = s.shape
  H, rows = x.shape[1], x.shape[2]
  interpret = interpret_mode()
  return pl.pallas_call(
      functools.partial(_loop_kernel, heads=HV, ratio=HV // H, block_v=block_v,
                        k_chunk=k_chunk,
                        precision=mma_algorithm("default", k_chunk, interpret=interpret)),
      out_shape=jax.ShapeDtypeStruct((B, HV, rows, V), jnp.float32),
      grid=(B * HV * (V // block_v),),
      interpret=interpret,
      compiler_params=KernelTuning(block_v=block_v, num_warps=warps, k_chunk=k_chunk,
                                   num_stages=stages).compiler_params(),
      name=f"read_loop_bv{block_v}_w{warps}_kc{k_chunk}_s{stages}",
  )(x, s)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--batch", type=int, nargs="+", default=[256, 64])
  p.add_argument("--reps", type=int, default=20)
  p.add_argument("--out", default="read_ceiling.json")
  args = p.parse_args(argv)
  g = GEOMETRY
  copy, _ = copy_bandwidth()
  rows = [dict(kind="copy", tbps=round(copy / 1e12, 3))]
  print(f"copy {copy / 1e12:.3f} TB/s", flush=True)

  n = (4 << 30) // 4
  big = jnp.ones((n // 4096, 4096), jnp.float32)
  # The state threaded from call to call is the small output; the array read is an input.
  t, _ = time_calls(jax.jit(lambda y, a: a.sum(axis=1)), jnp.zeros(n // 4096), args=(big,),
                    reps=args.reps)
  tb = n * 4 / (t.median_us * 1e-6) / 1e12
  rows.append(dict(kind="xla-sum", tbps=round(tb, 3), median_us=round(t.median_us, 2)))
  print(f"xla-sum {tb:.3f} TB/s ({100 * tb * 1e12 / copy:.1f}% of copy)", flush=True)
  del big

  for B in args.batch:
    key = jax.random.key(B)
    s = jax.random.normal(key, (B, g.num_v_heads, g.head_v_dim, g.head_k_dim), jnp.float32)
    x = jax.random.normal(key, (B, g.num_k_heads, 8, g.head_k_dim), jnp.float32)
    for launch in LAUNCHES:
      step = jax.jit(lambda y, s, x, launch=launch: loop_only(x, s, launch))
      y0 = jnp.zeros((B, g.num_v_heads, x.shape[2], g.head_v_dim), jnp.float32)
      t, _ = time_calls(step, y0, args=(s, x), reps=args.reps)
      read = s.size * 4 + x.size * 4 * g.num_v_heads // g.num_k_heads
      tb = read / (t.median_us * 1e-6) / 1e12
      rows.append(dict(kind="loop", B=B, launch=launch, median_us=round(t.median_us, 2),
                       read_bytes=read, tbps=round(tb, 3),
                       pct_copy=round(100 * tb * 1e12 / copy, 1)))
      print(f"B={B} loop {launch}: {t.median_us:.1f} us {t.kernels}, {tb:.3f} TB/s "
            f"({100 * tb * 1e12 / copy:.1f}% of copy)", flush=True)
  with open(args.out, "w") as f:
    json.dump(dict(device=jax.devices()[0].device_kind, jax=jax.__version__, rows=rows), f,
              indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
