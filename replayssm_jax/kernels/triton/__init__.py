"""The ``triton`` backend: native ``@triton.jit`` kernels called through jax-triton (issue #9).

The same entry points, argument conventions and padding-row semantics (slot -1: zero output,
nothing written) as the Pallas kernels, so `replayssm_jax.ssm` dispatches to them by name:

- `recurrent_verify`, `recurrent_decode` (`recurrent`): the backend's baseline;
- `fold` (`fold`): the exact fold, bitwise equal to the recurrent verify by construction (one
  shared step function in `tile`, one `KernelTuning`);
- `replay_verify` (`replay_verify`): the UT form for any T <= 16 and the dot-free vector form
  for T = 1.

`launch` runs a kernel through `jax_triton.triton_call` on a GPU, through Triton's interpreter
under ``TRITON_INTERPRET=1`` (CPU tests), or compiles it for sm_90 without a GPU
(`compile_check` reports registers and spills at the anchor geometry). Needs the ``triton``
extra (``jax-triton``, ``triton``).

Status: compiled for sm_90 and run in Triton's interpreter on a CPU; not yet run on a GPU.
"""

from __future__ import annotations

from replayssm_jax.kernels.backend import KernelTuning

__all__ = ["fold", "recurrent_decode", "recurrent_verify", "replay_verify", "replay_tuning",
           "state_tuning"]

try:
  from replayssm_jax.kernels.triton.fold import fold
  from replayssm_jax.kernels.triton.recurrent import recurrent_decode, recurrent_verify
  from replayssm_jax.kernels.triton.replay_verify import replay_verify
except ModuleNotFoundError as error:  # triton is optional: the package still imports (tuning)
  if error.name != "triton":
    raise
  _missing_triton = error

  def __getattr__(name: str):
    if name in __all__:
      raise ImportError(f"replayssm_jax.kernels.triton.{name} needs the triton package: "
                        "pip install 'replayssm-jax[triton]'.") from _missing_triton
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def state_tuning(V: int) -> KernelTuning:
  """Launch parameters of the triton recurrent kernels and fold (one instance: the bitwise tie).

  Not measured yet: chosen from the sm_90 compile on a CPU (2026-11-30, HV=32, K=V=128, bf16):
  ``[32, 128]`` tiles in K-chunks of 8 over 2 warps put 2 lanes along K (one shuffle round
  per product) at 219 / 214 / 159 registers for verify / decode / fold and no spills; K-chunks
  of 16 take 188 / 168 / 155 registers and two rounds; a tile of more than 64 state elements
  per thread spills.
  """
  return KernelTuning(block_v=min(32, V), num_warps=2, k_chunk=8)


def replay_tuning(V: int, T: int) -> KernelTuning:
  """Launch parameters of the triton replay verify: the Pallas kernels' measured defaults
  (`KernelTuning.replay_default`), not yet measured for these kernels."""
  return KernelTuning.replay_default(V, T)
