"""The shared arithmetic of the native Triton kernels: gates, norms, and the fp32 state tile.

Every ``@triton.jit`` function here computes one function of `replayssm_jax.reference`
(`gating` = ``gdn_gating``, `load_key` and `inverse_norm` = ``l2_normalize``, `delta_rule_step`
= ``delta_rule_step``), in an order of its own where that saves instructions (the key's norm
applied to a row's K-sum, `FMA_MATVEC`), so within fp32 rounding of it. The recurrent kernels
and the exact fold go through the same functions with the same launch parameters (block_v,
k_chunk, num_warps), which is what keeps the folded checkpoint bitwise equal to the recurrent
state (DESIGN section 4).

State tile layout (`state_offsets`). A program owns ``S = ssm[slot, h, j*BV:(j+1)*BV, :]``
(``[BV, K]``, K contiguous in memory), held as a 3-D tensor of ``NC = K // KC`` chunks of
``KC = min(k_chunk, K)``. Triton gives a tensor the layout of its coalesced loads: 4 fp32 (16
bytes) per thread along the contiguous axis, then lanes along that axis (``KC // 4`` of them),
then lanes along the next axis in its order. The rows (stride K) and the chunks (stride KC)
tie there, and Triton breaks the tie toward the lower axis up to 3.6 and toward the higher one
from 3.7, so the tile is ``[BV, NC, KC]`` up to 3.6 and ``[NC, BV, KC]`` from 3.7
(`CHUNKS_FIRST`): either way the lanes go to the rows and the chunk axis stays in registers
(sm_90 compiles, NOTES run 32: the other order puts lanes on the chunks, 230 shuffles a fold
record instead of 10, 168 registers instead of 127). A product ``S x = sum_k S[:, k] x[k]``
(`matvec`) adds the NC chunks in-thread first (an fma chain, `fma_chunks`) and then the KC
axis (4 in-thread, then ``log2(KC // 4)`` shuffle rounds): with KC = 8, one shuffle round per
row instead of the 5 of a ``[BV, 128]`` tile with 32 lanes along K (benchmarks/NOTES.md, run
3: the fold is bound by those shuffles; K-chunks of 32 cut it 24% in run 4). The cost is
registers: a thread holds its rows' 4 * NC state elements and the same number of elements of
each K-vector (k, q). Every timing is of triton 3.6, the H200's.

The K-vectors of a token (q, k, raw k) are loaded straight into the tile's layout: a
broadcast load of the one vector in the tile's shape (every V-row of the tile reads the same
addresses, served by L1) with the contiguity capped at 4 elements (`tl.max_contiguous`). A
bf16 vector then gets the same layout as the fp32 tile (an uncapped bf16 load takes 8
elements per thread, a different layout, and Triton would convert the state tile to it in
every step). Checked on the CPU (tests/test_kernels_triton.py): the loop-carried state of the
recurrent verify, the decode and the fold compile to one layout.

Rounding. The recurrent kernels and the fold compile with Triton's fp fusion off
(`FP_FUSION`): with it on, LLVM contracts multiplies into adds where the surrounding code
allows, which differed between the recurrent verify and the fold at some launch shapes (H200,
2026-11-30: a fold 1 ulp off the recurrent state in 3% of the elements at K-chunks of 8). The
fmas are written out: the update's (`delta_rule_step`) and, compiled, the chain of `matvec`'s
chunks (`fma_chunks`). The interpreter adds the chunks' products with ``tl.sum``: its generic
``tl.reduce`` runs element by element in Python (8x slower tests), and the bitwise tie only
asks that both sides of it round alike.

Math functions. ``exp`` and ``log1p`` are libdevice's (``__nv_expf``, ``__nv_log1pf``), and
divisions and square roots are IEEE (``div_rn``, ``sqrt_rn``): Triton's defaults
(``ex2.approx``, ``div.full``, ``sqrt.approx``) are approximate, and the gates and norms should
round as XLA's do on the GPU. In Triton's interpreter (``TRITON_INTERPRET=1``, CPU) libdevice
does not exist and numpy's functions stand in.

Tested on an H200 (2026-11-30): the GPU tests pass with the fold bitwise equal to the recurrent
verify at every launch swept (benchmarks/NOTES.md run 5).
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm_jax import reference

INTERPRET = bool(triton.knobs.runtime.interpret)  # read by triton.jit at import, as here

L2_EPS = tl.constexpr(reference.L2_EPS)
SOFTPLUS_THRESHOLD = tl.constexpr(reference.SOFTPLUS_THRESHOLD)
VECTOR_WIDTH = tl.constexpr(4)  # elements per thread along K: 16 bytes of fp32
# The state tile's chunk axis: 1 (``[BV, NC, KC]``) up to triton 3.6, 0 (``[NC, BV, KC]``) from
# 3.7, so that it stays in registers (module docstring).
CHUNKS_FIRST = tuple(int(x) for x in triton.__version__.split(".")[:2]) >= (3, 7)
CHUNK_AXIS = tl.constexpr(0 if CHUNKS_FIRST else 1)
# Triton's enable_fp_fusion for the kernels of the bitwise tie (recurrent, fold): off.
FP_FUSION = False
# Instructions of the state kernels' loops (NOTES run 34; triton 3.6, the fold's record loop
# 455 -> 369 a warp, the recurrent verify's token loop 880 -> 666): `matvec` adds a thread's
# chunks as a chain of fmas (`FMA_MATVEC`), not as products and then sums; the key's norm
# scales a row's K-sum and d (`delta_rule_step`, `scaled_matvec`), not each element of k and q.
# H200, B=256, at the (32, 2, 16) tiles of then: the fold 473.9 -> 458.5 (chain) -> 448.8 us
# (both); the recurrent verify 729.5 -> 792.0 (chain alone: 168 registers against 157) -> 725.0
# (both). Session 34 removed the switch of the second (the code is in d5fe77a).
FMA_MATVEC = tl.constexpr(not INTERPRET)
# `inverse_norm`'s copy of the vector a warp (1), compiled; the interpreter holds one (0): numpy
# sums a strided axis in another order than a contiguous one, and it has no warps to tie.
_NORM_COPY_A_WARP = tl.constexpr(int(not INTERPRET))

if INTERPRET:

  @triton.jit
  def exp(x):
    return tl.exp(x)

  @triton.jit
  def log1p(x):  # log(1 + x) with the rounding of 1 + x undone (Goldberg's trick)
    u = 1.0 + x
    return tl.where(u == 1.0, x, tl.log(u) * (x / (u - 1.0)))

  @triton.jit
  def prefetch(ptrs, LEVEL: tl.constexpr):
    pass  # a cache hint only: the interpreter has no caches (nor inline PTX)

else:
  from triton.language.extra import libdevice

  @triton.jit
  def exp(x):
    return libdevice.exp(x)

  @triton.jit
  def log1p(x):
    return libdevice.log1p(x)

  @triton.jit
  def prefetch(ptrs, LEVEL: tl.constexpr):
    """Ask cache ``LEVEL`` ("L1" or "L2") for the line of every pointer of ``ptrs``.

    No register receives a value and nothing waits (``prefetch.global``); not pure, so the
    compiler keeps it though its dummy result is unused.
    """
    if LEVEL == "L1":
      tl.inline_asm_elementwise("prefetch.global.L1 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
                                dtype=tl.int32, is_pure=False, pack=1)
    else:
      tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
                                dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def gating(a, b, A_log, dt_bias):
  """`reference.gdn_gating`: ``(g, beta)`` in fp32, elementwise over any shape.

  ``g = -exp(A_log) * softplus(a + dt_bias)`` (threshold 20), ``beta = 1 / (1 + exp(-b))``.
  """
  x = a.to(tl.float32) + dt_bias
  softplus = tl.where(x > SOFTPLUS_THRESHOLD, x, log1p(exp(tl.minimum(x, SOFTPLUS_THRESHOLD))))
  g = -exp(A_log) * softplus
  beta = tl.math.div_rn(1.0, 1.0 + exp(-b.to(tl.float32)))
  return g, beta


# ----------------------------------------------------------------------------- the state tile


@triton.jit
def state_offsets(BV: tl.constexpr, K: tl.constexpr, KC: tl.constexpr):
  """Offsets of the chunked tile: the rows (times K) along axis ``1 - CHUNK_AXIS``, the columns
  ``c * KC + e`` along axes `CHUNK_AXIS` (c) and 2 (e).

  Element ``(v, c, e)`` (``(c, v, e)``) of a tile is column ``c * KC + e`` of row v;
  ``row * K + col`` addresses a ``[BV, K]`` block of a row-major array.
  """
  NC: tl.constexpr = K // KC
  VW: tl.constexpr = min(VECTOR_WIDTH, KC)
  if CHUNK_AXIS == 0:
    rows = tl.arange(0, BV)[None, :, None]
  else:
    rows = tl.arange(0, BV)[:, None, None]
  e = tl.max_contiguous(tl.arange(0, KC)[None, None, :], [1, 1, VW])
  chunks = tl.expand_dims(tl.expand_dims(tl.arange(0, NC), 1), 1 - CHUNK_AXIS)
  return rows * K, chunks * KC + e


@triton.jit
def load_tile(ptr, rows, cols):
  """The fp32 state tile at ``ptr`` (row stride K), in `state_offsets`' axes."""
  return tl.load(ptr + (rows + cols))


@triton.jit
def store_tile(ptr, rows, cols, S):
  tl.store(ptr + (rows + cols), S)


@triton.jit
def load_vector(ptr, rows, cols):
  """The K-vector at ``ptr`` in fp32, broadcast to every row of the tile (its shape)."""
  return tl.load(ptr + (rows * 0 + cols)).to(tl.float32)


@triton.jit
def _multiply_add(acc, acc_scale, s, x):
  """`matvec`'s combine: the pair ``(a, b)`` stands for ``a * b``, so ``(acc, acc_scale)`` and
  ``(s, x)`` add to ``(fma(s, x, acc * acc_scale), 1)``. Past the first element the scale is
  the constant 1 and the product folds away: one fma an element."""
  return tl.fma(s, x, acc * acc_scale), tl.full(acc.shape, 1.0, acc.dtype)


@triton.jit
def fma_chunks(S, x):
  """``sum_c S[.., c, ..] x[.., c, ..]`` over the tile's chunk axis as a chain of fmas:
  ``[BV, KC]``, the chunks in order."""
  if S.shape[CHUNK_AXIS] == 1:  # no chain: the pair of the one chunk is returned unmultiplied
    return tl.sum(S * x, axis=CHUNK_AXIS)
  return tl.reduce((S, tl.broadcast_to(x, S.shape)), CHUNK_AXIS, _multiply_add)[0]


@triton.jit
def matvec(S, x):
  """``S x`` over K for a chunked tile and a chunked vector: ``[BV]``, chunks added first (in
  `fma_chunks` where `FMA_MATVEC`), then the columns of a chunk."""
  if FMA_MATVEC:
    by_column = fma_chunks(S, x)
  else:
    by_column = tl.sum(S * x, axis=CHUNK_AXIS)
  return tl.sum(by_column, axis=1)


@triton.jit
def load_key(ptr, rows, cols, K: tl.constexpr, WARPS: tl.constexpr = 1):
  """The K-vector at ``ptr`` (a token's q or k) in the tile's layout, raw, and its
  `inverse_norm`: ``l2_normalize`` is ``x * inv_norm``, applied by `delta_rule_step` and
  `scaled_matvec`.

  The broadcast tile holds every element BV times, so no per-element division: an IEEE
  division (``div_rn``) and a norm per copy made the recurrent verify 2.2x slower than the
  Pallas one on the H200 (2026-11-30: 1715 vs 789 us at B=256). Multiplying by ``1 / n`` is
  within an ulp of the reference's ``x / n``; the fold and the recurrent kernels share it, so
  the bitwise tie holds.
  """
  # The norm before the broadcast load: the other way round, the recurrent verify holds both
  # at once (230 registers with triton 3.6, 157 this way) and took 854 us against 735 (H200,
  # NOTES run 32).
  inv_norm = inverse_norm(ptr, K, WARPS)
  return load_vector(ptr, rows, cols), inv_norm


@triton.jit
def inverse_norm(ptr, K: tl.constexpr, WARPS: tl.constexpr = 1):
  """``1 / sqrt(|x|^2 + eps)`` of the K-vector at ``ptr``, from one compact load.

  One order of the sum in a program of any number of ``WARPS``: each warp loads the whole vector
  as ``[32, K // 32]``, a lane's consecutive elements summed in-thread and then the 32 lanes,
  and the warps' equal sums are merged by a max. A flat ``[K]`` load spreads K over the
  program's warps (2 elements a thread over 2 warps, 4 over one), so the fold inside a replay
  stream of 2 warps (`replay_split`) would round its norms unlike the one-warp recurrent
  kernels'.
  """
  LANES: tl.constexpr = min(32, K)
  COPIES: tl.constexpr = 1 + (WARPS - 1) * _NORM_COPY_A_WARP
  # [LANES, COPIES, K // LANES]: the copies' axis after the lanes' (Triton gives lanes to the
  # lower of two strided axes), so the warps take it.
  offsets = (tl.arange(0, LANES)[:, None, None] * (K // LANES)
             + tl.arange(0, COPIES)[None, :, None] * 0 + tl.arange(0, K // LANES)[None, None, :])
  x = tl.load(ptr + offsets).to(tl.float32)
  sum_sq = tl.max(tl.sum(tl.sum(x * x, axis=2), axis=0), axis=0)
  return tl.math.div_rn(1.0, tl.sqrt_rn(sum_sq + L2_EPS))


@triton.jit
def scaled_matvec(S, x, inv_norm, scale):
  """``S (x inv_norm scale)`` for a raw K-vector ``x`` (q_hat times the output scale), with the
  norm and scale on the row sums."""
  return matvec(S, x) * (inv_norm * scale)


@triton.jit
def delta_rule_step(S, k, inv_norm, v, g, beta):
  """`reference.delta_rule_step` on a chunked tile for ``k_hat = k inv_norm``: ``(S_new, d)``.

  ``S <- exp(g) S``, ``d = beta (v - S k_hat)``, ``S <- S + d k_hat^T`` (one fma), in that order.
  The norm scales the K-sum and d (a value a row), not k (a value a column). The kernels that
  share it compile with ``FP_FUSION`` off, so the only fmas are this one and `matvec`'s.
  """
  S = S * exp(g)
  d = beta * (v - matvec(S, k) * inv_norm)
  d_k = d * inv_norm
  d_rows = tl.expand_dims(tl.expand_dims(d_k, 1), CHUNK_AXIS)  # [BV] along the tile's rows
  S = tl.fma(tl.broadcast_to(d_rows, S.shape), k, S)  # explicit: FP_FUSION is off
  return S, d
