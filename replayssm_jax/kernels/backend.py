"""The one backend switch of the kernels, and their shared tuning.

`SpecConfig.backend` picks the implementation of every kernel:

- ``"xla"``: the ``*_reference`` function beside each kernel (pure jnp, any platform);
- ``"pallas"``: the Pallas kernel, lowered through Triton on a GPU (with explicit
  `pltriton.CompilerParams`) and run with ``interpret=True`` on the CPU;
- ``"triton"``: native Triton kernels launched through jax-triton (`kernels.triton`; GPU
  only; Triton's interpreter and an sm_90 compile check them on the CPU). Tested on an H200:
  its recurrent verify as fast as the Pallas one (730 against 723 us at B=256 since run 17),
  its decode faster (266 against 287 us), its replay verify slower (BENCHMARKS.md), so
  ``"pallas"`` stays the default.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

GPU_PLATFORMS = ("gpu", "cuda", "rocm")


# The grid order of the kernels with a program per row and (key or value) head, and V-block:
# "rows", (B, H, ...), launches one head (and block) of every row before the next (Triton's
# first grid axis is the fastest in launch order); "tiles", (..., H, B), a row's programs one
# after the other, walking its state in memory order, as the triton backend's kernels do. H200,
# B=256 (benchmarks/NOTES.md run 17): recurrent verify 790 -> 724 us, decode 312 -> 288, the
# exact fold 502 -> 468 (B=512 928 -> 903), the plain replay verify 193 -> 192; same bits.
TILE_GRIDS = ("rows", "tiles")
TILE_GRID = "tiles"


def row_grid(B: int, *axes: int) -> tuple[int, ...]:
  """The launch grid of B rows x ``axes`` (head, V-block) in the `TILE_GRID` order."""
  return (B, *axes) if TILE_GRID == "rows" else (*axes[::-1], B)


def row_ids(ndim: int = 3) -> tuple:
  """``(row, *axes)`` program ids of the running program of a `row_grid` launch."""
  ids = tuple(pl.program_id(i) for i in range(ndim))
  return ids if TILE_GRID == "rows" else ids[::-1]


def row_ids_ahead(distance: int, ndim: int = 3) -> tuple:
  """``(valid, row, *axes)`` of the program launched ``distance`` after the running one.

  Triton launches a grid with its first axis fastest; ``valid`` is false past the grid's end.
  """
  ids = [pl.program_id(i) for i in range(ndim)]
  sizes = [pl.num_programs(i) for i in range(ndim)]
  linear = ids[-1]
  for i in reversed(range(ndim - 1)):
    linear = linear * sizes[i] + ids[i]
  linear = linear + distance
  ahead = []
  for size in sizes[:-1]:
    ahead.append(linear % size)
    linear = linear // size
  ahead.append(linear)
  valid = linear < sizes[-1]
  return (valid, *(ahead if TILE_GRID == "rows" else ahead[::-1]))


def interpret_mode() -> bool:
  """Pallas kernels run interpreted unless JAX's default backend is a GPU."""
  return jax.default_backend() not in GPU_PLATFORMS


def round_cpu_products_apart() -> None:
  """Keep XLA:CPU from contracting products into sums (``--xla_cpu_max_isa=AVX``).

  The interpreted kernels' bitwise ties (fold == recurrent state) need it on a CPU with FMA
  units, where LLVM contracts some products in one kernel's fusion and not in the other's
  (`tile`). It takes effect only before JAX starts its CPU backend; GPUs ignore it.
  """
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_cpu_max_isa" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_max_isa=AVX".strip()


# Pipeline stages of the split form's stream over the checkpoint's bf16 copy at T > 1: a bf16
# K-step is half the fp32 one's shared memory, so three take 48 KB where the fp32 stream's two
# take 64. H100, run 47 (`bench.sweep --only streams --checkpoint-copy`, benchmarks/NOTES.md):
# T=4 B=256 157.1 -> 150.3 us, B=64 48.6 -> 46.5; at T=1 even (B=256 127.0 -> 128.2), so
# decode keeps two. K-steps of 128 (the whole row, no loop) were slower (T=4 B=256 166 us).
COPY_STREAM_STAGES = 3

# Rows from which the split form wins: a window (T >= 2), and decode (T = 1).
SPLIT_MIN_BATCH = {"window": 16, "decode": 64}
# The Pallas vector form's launch (decode below the split form): (rows of V, warps, K-chunk).
# Its programs fold their flush rows first, in chunks laid out 16 rows a warp as the fold
# kernel's, so a tile holds that fold only if its rows are a multiple of 16 x warps
# (`replay_split.stream_fold_block_v`). [32, 32] over 4 warps does not: its kernel was 5% faster
# alone (H100, benchmarks/NOTES.md run 42), but the steps then folded in the fold kernel behind a
# conditional and came out even (H200, run 43).
VEC_TILE = (64, 4, 32)


def replay_form(T: int, B: int) -> str:
  """The faster Pallas replay verify form for B rows of T tokens (H200, NOTES.md run 6).

  The split form once its second launch pays: for a window from B = 16 (T=4: 25.0 against
  the UT form's 33.0 us at B=16, 216 against 395 at B=256), for decode from B = 64 (T=1: 54.6
  against the vector form's 58.9 us at B=64, 175 against 194 at B=256, but 22.4 against 21.2
  at B=16). Below, the one-kernel forms: UT for a window, vector for decode.
  """
  if T == 1:
    return "split" if B >= SPLIT_MIN_BATCH["decode"] else "vec"
  return "split" if B >= SPLIT_MIN_BATCH["window"] else "ut"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class KernelTuning:
  """Launch parameters of the state-tile kernels.

  The recurrent kernels and the exact fold read ``block_v`` and ``num_warps``
  from the same instance on purpose: the fold is bitwise equal to the recurrent
  path only when both reduce over K with the same warp layout (DESIGN section 4).

  Attributes:
    block_v: BV, rows of the ``[BV, K]`` fp32 state tile one program owns.
    num_warps: warps per program (Triton).
    num_stages: software-pipelining stages (Triton).
    k_chunk: KC, width of the K-chunks the state tile is held in (`tile`); part of the
      exact arithmetic, like ``block_v``.
  """

  block_v: int = 32
  num_warps: int = 4
  num_stages: int = 2
  k_chunk: int = 32

  @classmethod
  def state_default(cls, V: int) -> KernelTuning:
    """Launch parameters of the recurrent kernels and the exact fold.

    H200, 2026-11-30, B=256, HV=32, K=V=128 (benchmarks/NOTES.md run 4): (32, 2 warps, K-chunks
    of 32) ran the recurrent verify in 789 us, decode in 301 us and the 12-record fold in 595 us;
    (32, 4) with whole K rows, the old default, 775 / 307 / 828 us. Run 17, with the grid in
    memory order (`TILE_GRID`): 723 / 287 us; the fold, with its own launch (`fold.fold`), 441
    us since run 18, 398 with its cache prefetches since run 24.
    """
    return cls(block_v=min(32, V), num_warps=2, k_chunk=32)

  @classmethod
  def replay_default(cls, V: int, T: int, B: int = 256, *, copy: bool = False) -> KernelTuning:
    """Launch parameters of the Pallas replay verify in its form for (T, B) (`replay_form`);
    ``copy``: reading the checkpoint's bf16 copy (`SpecConfig.checkpoint_copy`).

    H200, HV=32, K=V=128, L=16, bf16, write_pos 8 (benchmarks/NOTES.md runs 4-6): the split
    form's checkpoint stream at [128, K] tiles over 4 warps, K-steps of 64 through 2 pipeline
    stages (B=256: T=4 in 216 us, T=1 in 175 us; every launch swept within 10% but the
    unpipelined one); the UT form at (64, 2); the vector form at (64, 4, K-chunks of 32).
    A single row's UT form, whose programs fold flush rows first (`ssm.FUSE_FOLD_ONE_KERNEL`),
    at (32, 2): twice the programs for the one row, each folding one 32-row tile (benchmarks/
    NOTES.md run 16: the B=1 flush step 20.8 -> 16.9 us, a step without a fold 10.9 -> 9.8; at
    B=8 (64, 2) stays ahead, 33.1 against 44.3 us). On the copy, the stream of a window
    pipelines `COPY_STREAM_STAGES` K-steps.
    """
    form = replay_form(T, B)
    if form == "split":
      stages = COPY_STREAM_STAGES if copy and T > 1 else 2
      return cls(block_v=min(128, V), num_warps=4, k_chunk=64, num_stages=stages)
    if form == "vec":
      block_v, num_warps, k_chunk = VEC_TILE
      return cls(block_v=min(block_v, V), num_warps=num_warps, k_chunk=k_chunk)
    return cls(block_v=min(32 if B == 1 else 64, V), num_warps=2)

  def check(self, V: int, K: int | None = None) -> None:
    """Raise `ValueError` unless ``block_v`` tiles ``V`` (and ``k_chunk`` tiles ``K``) in
    power-of-two blocks; a ``k_chunk`` at or above K means one chunk."""
    if self.block_v < 1 or self.block_v & (self.block_v - 1) or V % self.block_v:
      raise ValueError(f"KernelTuning.block_v={self.block_v} must be a power of two dividing "
                       f"head_v_dim={V}; try block_v={min(32, V)}.")
    if K is not None and (self.k_chunk < 1 or self.k_chunk & (self.k_chunk - 1)
                          or K % min(self.k_chunk, K)):
      raise ValueError(f"KernelTuning.k_chunk={self.k_chunk} must be a power of two dividing "
                       f"head_k_dim={K}; try k_chunk={min(32, K)}.")

  def compiler_params(self) -> pltriton.CompilerParams:
    return pltriton.CompilerParams(num_warps=self.num_warps, num_stages=self.num_stages)


def dot_algorithm(precision: str, *, interpret: bool):
  """`precision=` for the in-kernel dots of the replay paths.

  ``"default"`` leaves the choice to the compiler (tf32 tensor cores for fp32 on
  GPU). Interpreted, the dots are XLA's, which take no algorithm preset on the CPU: ``"ieee"``
  asks for `jax.lax.Precision.HIGHEST` (on a GPU XLA's default would be tf32), the others for
  the default (exact fp32 on the CPU, tf32 on a GPU).
  """
  if precision == "default":
    return None
  if interpret:
    return jax.lax.Precision.HIGHEST if precision == "ieee" else None
  return {
      "tf32": jax.lax.DotAlgorithmPreset.TF32_TF32_F32,
      "bf16": jax.lax.DotAlgorithmPreset.BF16_BF16_F32,
      "ieee": jax.lax.DotAlgorithmPreset.F32_F32_F32,
  }[precision]


def mma_algorithm(precision: str, contraction: int, *, interpret: bool):
  """`precision=` of an in-kernel dot: the knob, or exact fp32 for short contractions.

  Measured on the H200 (2026-11-29, jax 0.11.2, triton 3.6, Pallas Triton lowering): tf32
  dots contracting over fewer than 8 and bf16 dots over fewer than 16 return garbage
  (relative error 1 to 10; M and N as small as 1 are fine), while fp32 ("ieee") dots of
  every size are right and, this small, cost nothing measurable. The window's own [T, T]
  products are always exact; the K and L contractions use the knob from 16 on.
  """
  return dot_algorithm(precision if contraction >= 16 else "ieee", interpret=interpret)


def layer_shapes(*, H: int, HV: int, K: int, V: int, T: int, L: int, slots: int, B: int, act,
                 ring) -> dict[str, jax.ShapeDtypeStruct]:
  """`jax.ShapeDtypeStruct`s of one layer's kernel arguments, by name: B rows of T tokens,
  ``slots`` cache slots, rings of L records (compile-only tools lower the kernels with them)."""
  f32, i32 = jnp.float32, jnp.int32
  shapes = dict(
      q=((B, T, H, K), act), k=((B, T, H, K), act), v=((B, T, HV, V), act),
      a=((B, T, HV), act), b=((B, T, HV), act), A_log=((HV,), f32), dt_bias=((HV,), f32),
      slot_ids=((B,), i32), write_pos=((B,), i32), cache_base=((B,), i32), count=((B,), i32),
      ssm=((slots, HV, V, K), f32), intermediate=((slots, T, HV, V, K), f32),
      ring_d=((slots, HV, L, V), ring), ring_k=((slots, H, L, K), ring),
      ring_g=((slots, HV, L), f32), ring_beta=((slots, HV, L), f32),
      ring_rawk=((slots, H, L, K), act), ring_rawv=((slots, HV, L, V), act))
  return {n: jax.ShapeDtypeStruct(s, d) for n, (s, d) in shapes.items()}
