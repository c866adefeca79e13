"""The fp32 state tile of the Pallas kernels, held as K-chunks: the canonical update arithmetic.

A program owns ``S = ssm[slot, h, j*BV:(j+1)*BV, :]`` (``[BV, K]``). Triton lays a ``[BV, K]``
fp32 tile out with one 16-byte vector per thread and row and as many lanes along K as fit (all
32 for K = 128), so every product ``S x`` ends in 5 shuffle rounds per row a thread holds. The
exact update is bound by those shuffles, not by bytes (benchmarks/NOTES.md, run 3).

Held as ``K // KC`` tiles ``[BV, KC]`` (``KC = KernelTuning.k_chunk``; 32 puts 8 lanes along
K), ``S x`` first adds the chunks' products in-thread and then shuffles 3 rounds, over a
quarter of the rows per thread: about 7x fewer shuffles for the same flops.

The order of every sum here is part of the exact arithmetic: the recurrent kernels and the fold
both go through these functions with the same tuning, which is what keeps the folded
checkpoint bitwise equal to the recurrent state (DESIGN section 4). Vectors over K are chunked
the same way (`Chunks`); vectors over V stay whole.

Two things follow the compile (``compiled``: Triton on a GPU, else the Pallas interpreter).
Multiply-adds: the Triton that compiles Pallas kernels contracts no ``x * y + z`` into an fma
(the H200 profile of the fold: 1% of its fp32 instructions fused, benchmarks/NOTES.md run 8),
so `fma` writes the PTX instruction out; the interpreter has no inline assembly and rounds the
product and the sum apart (where XLA:CPU targets FMA units it may contract some of them, and not
alike in two kernels: the tests and the sweeps start it with ``--xla_cpu_max_isa=AVX``,
`backend.round_cpu_products_apart`).
Norms: the GPU multiplies by one reciprocal square root, where a division per element costs
three instructions; the interpreter divides, since a reciprocal there broke the tie (XLA on the
CPU compiled the two kernels' norms to different bits). Either way both sides of the bitwise tie
compile alike (GPU tests, benchmarks/gpu_tests_h200.md run 8).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from replayssm_jax import reference

Chunks = tuple[jax.Array, ...]  # K-chunks of a vector [KC] or a tile [BV, KC]


def num_chunks(K: int, k_chunk: int) -> int:
  return K // min(k_chunk, K)


def load(ref, index: tuple, K: int, k_chunk: int, dtype=jnp.float32) -> Chunks:
  """``ref[*index, :K]`` as K-chunks in ``dtype`` (the last axis of ``ref`` is K)."""
  kc = min(k_chunk, K)
  return tuple(ref[(*index, pl.ds(c * kc, kc))].astype(dtype) for c in range(K // kc))


def store(ref, index: tuple, x: Chunks) -> None:
  """``ref[*index, :K] = x`` from K-chunks, cast to the dtype of ``ref``."""
  kc = x[0].shape[-1]
  for c, x_c in enumerate(x):
    ref[(*index, pl.ds(c * kc, kc))] = x_c.astype(ref.dtype)


def fma(x, y, z, *, compiled: bool) -> jax.Array:
  """``x * y + z`` in fp32 (shapes broadcast): rounded once (PTX ``fma.rn``) when ``compiled``,
  else the product and then the sum (each rounded)."""
  if not compiled:
    return x * y + z
  shape = jnp.broadcast_shapes(jnp.shape(x), jnp.shape(y), jnp.shape(z))
  [out] = pltriton.elementwise_inline_asm(
      "fma.rn.f32 $0, $1, $2, $3;",
      args=[jnp.broadcast_to(a, shape).astype(jnp.float32) for a in (x, y, z)],
      constraints="=f,f,f,f", pack=1,
      result_shape_dtypes=[jax.ShapeDtypeStruct(shape, jnp.float32)])
  return out


def dot(x: Chunks, y: Chunks, *, compiled: bool) -> jax.Array:
  """``x . y`` over K for chunked vectors or tiles (``[..., KC]`` each): in-thread first."""
  acc = x[0] * y[0]
  for x_c, y_c in zip(x[1:], y[1:]):
    acc = fma(x_c, y_c, acc, compiled=compiled)
  return jnp.sum(acc, axis=-1)


def matvec(S: Chunks, x: Chunks, *, compiled: bool) -> jax.Array:
  """``S x`` for a chunked ``[BV, K]`` tile and a chunked ``[K]`` vector: ``[BV]``."""
  return dot(S, tuple(x_c[None, :] for x_c in x), compiled=compiled)


def l2_normalize(x: Chunks, *, compiled: bool) -> Chunks:
  """`reference.l2_normalize` of a chunked vector: a chunked sum, then, compiled, one
  reciprocal square root and a multiply per element, else a division per element."""
  sum_sq = dot(x, x, compiled=compiled) + reference.L2_EPS
  if compiled:
    inv_norm = jax.lax.rsqrt(sum_sq)
    return tuple(x_c * inv_norm for x_c in x)
  norm = jnp.sqrt(sum_sq)
  return tuple(x_c / norm for x_c in x)


def normalized(ref, index: tuple, K: int, k_chunk: int, scale: float = 1.0, *,
               compiled: bool) -> Chunks:
  """``l2_normalize(ref[*index, :K]) * scale`` in fp32, chunked (q_hat, k_hat of a token)."""
  x = l2_normalize(load(ref, index, K, k_chunk), compiled=compiled)
  return x if scale == 1.0 else tuple(x_c * scale for x_c in x)


def delta_rule_step(S: Chunks, k_hat: Chunks, v: jax.Array, g, beta, *,
                    compiled: bool) -> tuple[Chunks, jax.Array]:
  """`reference.delta_rule_step` on a chunked tile: ``(S_new, d)``.

  ``S <- exp(g) S``, ``d = beta (v - S k_hat)``, ``S <- S + d k_hat^T``, in that order; the
  products of ``S k_hat`` and the update are multiply-adds (`fma`).
  """
  decay = jnp.exp(g)
  S = tuple(S_c * decay for S_c in S)
  d = beta * (v - matvec(S, k_hat, compiled=compiled))
  S = tuple(fma(d[:, None], k_c[None, :], S_c, compiled=compiled) for S_c, k_c in zip(S, k_hat))
  return S, d
