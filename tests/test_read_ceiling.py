"""``tools/read_ceiling.py``: its kernels compute what they are timed as (interpret mode)."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import read_ceiling  # noqa: E402


@pytest.fixture(scope="module")
def operands():
  ks, kx = jax.random.split(jax.random.key(np.random.randint(1 << 30)))
  s = jax.random.normal(ks, (2, 4, 128, 128), jnp.float32)  # [B, HV, V, K]
  x = jax.random.normal(kx, (2, 2, 8, 128), jnp.float32)  # [B, H, 2 T_pad, K]
  return s, x


def test_loop_is_the_streams_product(operands):
  """``Y = X S0^T`` per value head (its key head's X), to fp32 rounding of the chunked sum."""
  s, x = operands
  want = jnp.einsum("bhrk,bhvk->bhrv", jnp.repeat(x, 2, axis=1), s,
                    precision=jax.lax.Precision.HIGHEST)
  got = read_ceiling.loop_only(x, s, (64, 4, 64, 2))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("launch, tiles", [((128, 4, 64, 2), 2), ((64, 4, 32, 3), 4)])
def test_multi_tile_loop_equals_the_loop(operands, launch, tiles):
  """Several tiles a program in one flat loop: the same bits as one tile a program."""
  s, x = operands
  np.testing.assert_array_equal(read_ceiling.loop_only(x, s, launch, tiles),
                                read_ceiling.loop_only(x, s, launch))


def test_row_sum(operands):
  s, _ = operands
  np.testing.assert_allclose(read_ceiling.row_sum(s, (64, 4, 64, 1)), s.sum(axis=-1),
                             rtol=1e-5, atol=1e-4)
