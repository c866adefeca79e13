"""Shared fixtures: backends, the interpret flag, tolerances, hypothesis profile."""

from __future__ import annotations

import gc

from replayssm_jax.kernels.backend import round_cpu_products_apart

# The bitwise ties of the interpreted kernels (fold == recurrent state, DESIGN section 4) need
# XLA:CPU to round every product apart; on the GPU the kernels write their multiply-adds out
# (`kernels/tile.py`). Set before jax starts its backend.
round_cpu_products_apart()

import jax  # noqa: E402
import numpy as np
import pytest
from hypothesis import HealthCheck, settings

# Schedules are long on purpose (hundreds of steps), hence the suppressed size checks.
settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=10, print_blob=True,
    suppress_health_check=[HealthCheck.large_base_example, HealthCheck.data_too_large,
                           HealthCheck.too_slow])
settings.load_profile("ci")

HAS_GPU = jax.default_backend() in ("gpu", "cuda", "rocm")

# Relative error bounds (||x - ref|| / ||ref||), one table for every test, keyed by
# (activation dtype, dot precision). fp32 with exact dots sits at fp32 rounding; bf16
# activations and rings sit at the bf16 output floor of an fp64 oracle (DESIGN
# section 4: <= 4e-3); tensor-core (tf32) dots on the GPU likewise.
TOLERANCE = {
    ("float32", "ieee"): 1e-5,
    ("float32", "default"): 1e-5 if not HAS_GPU else 4e-3,
    ("bfloat16", "ieee"): 4e-3,
    ("bfloat16", "default"): 4e-3,
    # bf16 dots, or the checkpoint read from its bf16 copy (`SpecConfig.checkpoint_copy`)
    ("float32", "bf16"): 4e-3,
    ("bfloat16", "bf16"): 4e-3,
}


def rel_err(x, ref) -> float:
  """Frobenius relative error in float64."""
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30))


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
  """Drop the compiled programs of each test module once it is done. XLA's CPU backend maps
  each executable's code into memory regions of its own; the whole suite compiles thousands
  (Pallas interpret mode, static configs), and past the kernel's ``vm.max_map_count``
  (65530 here) the next compile dies with a segmentation fault."""
  yield
  jax.clear_caches()
  gc.collect()


def pytest_collection_modifyitems(config, items):
  if HAS_GPU:
    return
  skip = pytest.mark.skip(reason="needs a CUDA GPU (Pallas non-interpreted)")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)


@pytest.fixture(params=[True, pytest.param(False, marks=pytest.mark.gpu, id="compiled")],
                ids=lambda p: "interpret" if p is True else "compiled")
def interpret(request) -> bool:
  """Pallas interpret flag: always interpreted on CPU; also compiled on a GPU."""
  return request.param


@pytest.fixture(params=["xla", "pallas"])
def backend(request) -> str:
  """`SpecConfig.backend` of the ssm-level tests (pallas is compiled on a GPU)."""
  return request.param
