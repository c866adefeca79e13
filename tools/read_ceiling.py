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
* ``multiN``: the same loop over N consecutive tiles a program, one flat loop, so the pipeline
  does not restart a tile (equal to ``loop``, checked);
* ``sum``: each tile's rows summed by plain loads, no dot (Pallas' own loads, not copies into
  shared memory); its bytes are the checkpoint's;
* ``xla-ckpt``: XLA's sum over the checkpoint's K axis: XLA's read rate at the same size.

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

from replayssm_jax.bench import timing
from replayssm_jax.bench.kernels import GEOMETRY, copy_bandwidth
from replayssm_jax.bench.timing import time_calls
from replayssm_jax.kernels.backend import KernelTuning, interpret_mode, mma_algorithm

# (block_v, num_warps, k_chunk, num_stages): the shipped stream launch first.
LAUNCHES = ((128, 4, 64, 2), (128, 4, 32, 3), (128, 8, 64, 2), (64, 4, 64, 2), (64, 2, 64, 2))
# (launch, tiles a program) of `loop_only`'s flat loops, and the launches of `row_sum`.
MULTI = (((128, 4, 64, 2), 2), ((128, 4, 64, 3), 2), ((128, 4, 64, 3), 4), ((128, 4, 64, 3), 8),
         ((128, 4, 32, 4), 2), ((64, 4, 64, 3), 2), ((64, 4, 128, 2), 4))
SUMS = ((128, 4, 64, 1), (128, 4, 64, 2), (128, 8, 32, 1), (64, 4, 128, 1))


def _tile_index(g, heads: int, blocks: int, block_v: int):
  """Tile ``g`` of the checkpoint in memory order: ``(row, h, vs)``."""
  div, rem = jax.lax.div, jax.lax.rem  # (jnp's // and % lower badly inside a loop)
  row, h, j = div(g, heads * blocks), rem(div(g, blocks), heads), rem(g, blocks)
  return row, h, pl.ds(pl.multiple_of(j * block_v, block_v), block_v)


def _launch(kernel, operands, out_shape, *, grid: int, launch, name: str, **kw) -> jax.Array:
  """One Pallas call of a ``kernel(*refs, block_v=, k_chunk=, **kw)`` at ``launch``."""
  block_v, warps, k_chunk, stages = launch
  return pl.pallas_call(
      functools.partial(kernel, block_v=block_v, k_chunk=k_chunk, **kw),
      out_shape=jax.ShapeDtypeStruct(out_shape, jnp.float32),
      grid=(grid,),
      interpret=interpret_mode(),
      compiler_params=KernelTuning(block_v=block_v, num_warps=warps, k_chunk=k_chunk,
                                   num_stages=stages).compiler_params(),
      name=f"read_{name}_bv{block_v}_w{warps}_kc{k_chunk}_s{stages}",
  )(*operands)


def _loop_kernel(x_ref, s_ref, y_ref, *, heads: int, ratio: int, block_v: int, k_chunk: int,
                 precision):
  """One program per ``[block_v, K]`` tile, in memory order: ``Y = X S0^T`` over K-chunks."""
  row, h, vs = _tile_index(pl.program_id(0), heads, s_ref.shape[2] // block_v, block_v)

  def chunk(c, Y):
    ks = pl.ds(pl.multiple_of(c * k_chunk, k_chunk), k_chunk)
    return Y + jax.lax.dot_general(x_ref[row, h // ratio, :, ks], s_ref[row, h, vs, ks],
                                   (((1,), (1,)), ((), ())), precision=precision,
                                   preferred_element_type=jnp.float32)

  y_ref[row, h, :, vs] = jax.lax.fori_loop(0, s_ref.shape[3] // k_chunk, chunk,
                                           jnp.zeros((x_ref.shape[2], block_v), jnp.float32))


def _multi_kernel(x_ref, s_ref, y_ref, *, heads: int, ratio: int, block_v: int, k_chunk: int,
                  tiles: int, precision):
  """One program per ``tiles`` consecutive ``[block_v, K]`` tiles in one flat K-chunk loop, so
  Triton's pipeline runs on from one tile into the next (no cold start a tile)."""
  K = s_ref.shape[3]
  blocks, chunks = s_ref.shape[2] // block_v, K // k_chunk
  first = pl.program_id(0) * tiles

  def step(it, Y):
    t, c = jax.lax.div(it, chunks), jax.lax.rem(it, chunks)
    row, h, vs = _tile_index(first + t, heads, blocks, block_v)
    ks = pl.ds(pl.multiple_of(c * k_chunk, k_chunk), k_chunk)
    Y = jnp.where(c == 0, 0.0, Y) + jax.lax.dot_general(
        x_ref[row, h // ratio, :, ks], s_ref[row, h, vs, ks], (((1,), (1,)), ((), ())),
        precision=precision, preferred_element_type=jnp.float32)

    @pl.when(c == chunks - 1)
    def _store():
      y_ref[row, h, :, vs] = Y

    return Y

  jax.lax.fori_loop(0, tiles * chunks, step,
                    jnp.zeros((x_ref.shape[2], block_v), jnp.float32))


def loop_only(x, s, launch, tiles: int = 1) -> jax.Array:
  """The stream's K-loop over checkpoint ``s [B, HV, V, K]`` with ``x [B, H, 2 T_pad, K]``;
  with ``tiles > 1`` over that many tiles a program, in one flat loop (`_multi_kernel`)."""
  B, HV, V, K = s.shape
  H, rows = x.shape[1], x.shape[2]
  block_v, k_chunk = launch[0], launch[2]
  common = dict(heads=HV, ratio=HV // H,
                precision=mma_algorithm("default", k_chunk, interpret=interpret_mode()))
  tiles_total = B * HV * (V // block_v)
  if tiles == 1:
    return _launch(_loop_kernel, (x, s), (B, HV, rows, V), grid=tiles_total, launch=launch,
                   name="loop", **common)
  return _launch(_multi_kernel, (x, s), (B, HV, rows, V), grid=tiles_total // tiles,
                 launch=launch, name=f"multi{tiles}", tiles=tiles, **common)


def _sum_kernel(s_ref, y_ref, *, heads: int, block_v: int, k_chunk: int):
  """One program per tile: its rows summed over K-chunks by plain loads (no dot, no copy into
  shared memory): the read rate of Pallas' own loads."""
  row, h, vs = _tile_index(pl.program_id(0), heads, s_ref.shape[2] // block_v, block_v)

  def chunk(c, acc):
    ks = pl.ds(pl.multiple_of(c * k_chunk, k_chunk), k_chunk)
    return acc + jnp.sum(s_ref[row, h, vs, ks], axis=1)

  y_ref[row, h, vs] = jax.lax.fori_loop(0, s_ref.shape[3] // k_chunk, chunk,
                                        jnp.zeros((block_v,), jnp.float32))


def row_sum(s, launch) -> jax.Array:
  """`_sum_kernel` over checkpoint ``s [B, HV, V, K]``."""
  B, HV, V, K = s.shape
  return _launch(_sum_kernel, (s,), (B, HV, V), grid=B * HV * (V // launch[0]), launch=launch,
                 name="sum", heads=HV)


def _time_variant(kind, launch, fn, s, x, copy, reps) -> dict:
  """One variant's row: checked against the loop where it computes the same, then timed."""
  B, HV, V, _ = s.shape
  y0 = jnp.zeros((B, HV, x.shape[2], V), jnp.float32)
  equal = True
  if kind.startswith("multi"):  # the same products, tile for tile
    equal = bool(jnp.array_equal(fn(s, x), loop_only(x, s, launch)))
  sums = kind in ("sum", "xla-ckpt")
  out0 = jnp.zeros((B, HV, V), jnp.float32) if sums else y0
  step = jax.jit(lambda y, s, x, fn=fn: fn(s, x))
  t, _ = time_calls(step, out0, args=(s, x), reps=reps)
  nbytes = s.size * 4 if sums else s.size * 4 + x.size * 4 * HV // x.shape[1]
  tb = nbytes / (t.median_us * 1e-6) / 1e12
  row = dict(kind=kind, B=B, launch=launch, median_us=round(t.median_us, 2), read_bytes=nbytes,
             tbps=round(tb, 3), pct_copy=round(100 * tb * 1e12 / copy, 1))
  if kind.startswith("multi"):
    row["equal_to_loop"] = equal
  print(f"B={B} {kind} {launch}: {t.median_us:.1f} us {t.kernels}, {tb:.3f} TB/s "
        f"({100 * tb * 1e12 / copy:.1f}% of copy){'' if equal else ' NOT EQUAL to the loop'}",
        flush=True)
  return row


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--batch", type=int, nargs="+", default=[256, 64])
  p.add_argument("--reps", type=int, default=20)
  p.add_argument("--out", default="read_ceiling.json")
  timing.add_l2_flush_option(p)
  args = p.parse_args(argv)
  timing.L2_FLUSH = args.l2_flush
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
    variants = [("loop", launch, lambda s, x, launch=launch: loop_only(x, s, launch))
                for launch in LAUNCHES]
    variants += [(f"multi{m}", launch,
                  lambda s, x, launch=launch, m=m: loop_only(x, s, launch, m))
                 for launch, m in MULTI]
    variants += [("sum", launch, lambda s, x, launch=launch: row_sum(s, launch))
                 for launch in SUMS]
    variants.append(("xla-ckpt", None, lambda s, x: s.sum(axis=-1)))  # XLA, the same bytes
    for kind, launch, fn in variants:
      try:
        rows.append(_time_variant(kind, launch, fn, s, x, copy, args.reps))
      except Exception as e:  # a launch that fails to compile is a result too
        print(f"B={B} {kind} {launch}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        rows.append(dict(kind=kind, B=B, launch=launch, error=str(e)[:300]))
  with open(args.out, "w") as f:
    json.dump(dict(device=jax.devices()[0].device_kind, jax=jax.__version__,
                   l2_flush=args.l2_flush, rows=rows), f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
