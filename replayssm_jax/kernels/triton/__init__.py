"""The ``triton`` backend: native ``@triton.jit`` kernels called through jax-triton (issue #9).

The same entry points, argument conventions and padding-row semantics (slot -1: zero output,
nothing written) as the Pallas kernels, so `replayssm_jax.ssm` dispatches to them by name:

- `recurrent_verify`, `recurrent_decode` (`recurrent`): the backend's baseline;
- `fold` (`fold`): the exact fold, bitwise equal to the recurrent verify by construction (one
  shared step function in `tile`, one `KernelTuning`);
- `replay_verify` (`replay_verify`): the split form (`replay_split`: coefficients, then a
  pipelined checkpoint stream) for a window from 16 rows and for decode (T = 1) from 32;
  below, a window in the UT form (any T <= 16), decode in the dot-free vector form;
- `fold_and_replay_verify`: the split form whose stream folds the flush rows first.

`launch` runs a kernel through `jax_triton.triton_call` on a GPU, through Triton's interpreter
under ``TRITON_INTERPRET=1`` (CPU tests), or compiles it for sm_90 without a GPU
(`compile_check` reports registers and spills at the anchor geometry). Needs the ``triton``
extra (``jax-triton``, ``triton``).

Status: passes the GPU tests of the Pallas kernels on an H200 (2026-11-30, again 2026-12-04
with the split form: jax 0.11.2, triton 3.6, jax-triton 0.3.1), with the fold bitwise equal to
the recurrent verify at every launch swept; timings in benchmarks/NOTES.md (runs 5, 29-34).
"""

from __future__ import annotations

from replayssm_jax.kernels.backend import KernelTuning

__all__ = ["fold", "fold_and_replay_verify", "recurrent_decode", "recurrent_verify",
           "replay_form", "replay_verify", "replay_tuning", "state_tuning",
           "stream_fold_block_v"]

try:
  from replayssm_jax.kernels.triton.fold import fold
  from replayssm_jax.kernels.triton.recurrent import recurrent_decode, recurrent_verify
  from replayssm_jax.kernels.triton.replay_split import stream_fold_block_v
  from replayssm_jax.kernels.triton.replay_verify import (fold_and_replay_verify, replay_form,
                                                          replay_verify)
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

  ``[16, 128]`` tiles in K-chunks of 16, one warp a program. H200, B=256, HV=32, K=V=128, with
  the fma chains and raw keys of `tile` (benchmarks/NOTES.md run 34; recurrent verify / decode /
  12-record fold, us, each fold bitwise equal to its recurrent verify): (16, 1, 16) 714.3 /
  271.4 / **405.0**; (32, 2, 16), the tiles of runs 5-33, 733.9 / 271.6 / 450.2; (64, 4, 16)
  780.6 / 277.5 / 483.9; (32, 4, 16) 863.6 / 286.3 / 612.5; K-chunks of 8 at (16, 1) and (32, 4)
  768.9-1221.5 / 289.1-363.9 / 532.7-1283.4. A one-warp program sums the compact load of a key's
  norm within its warp: no shared memory and no barrier in the fold's record loop (two before).
  """
  return KernelTuning(block_v=min(16, V), num_warps=1, k_chunk=16)


# The vector form's tile, ``[VEC_BLOCK_V, VEC_K_CHUNK]`` over 4 warps (decode below
# `replay_verify.SPLIT_MIN_BATCH`): [64, 32], as the Pallas vector form's. Measured with L2
# flushed before each step, as the other layers of a model leave it (H100, benchmarks/NOTES.md
# runs 40 and 41): a step alone at B=8 / 16 in 15.4 / 27.1 us against [128, 16]'s 17.3 / 28.1,
# over a ring cycle 19.4 / 32.9 against 21.5 / 33.6 a step. [128, 16] (run 36 to run 40) had
# won on the H200 with the cycles' checkpoints in L2 after their first step (B=16 15.4 against
# [128, 32]'s 20.3 us); whole rows ([32, 128], no K-loop) were the slowest flushed tiles (B=16
# 31.7 us): four times the programs, each paying the window's prologue. Triton 3.6 for sm_90
# (`tools/pallas_sass.py --backend triton replay_verify_vec_T1`): 118 registers, 4 programs an
# SM, 1200 instructions against [128, 16]'s 110, 4 and 1392.
VEC_K_CHUNK = 32
VEC_BLOCK_V = 64

# Pipeline stages of the split form's stream over the checkpoint's bf16 copy (the fp32
# checkpoint's stream keeps two): a bf16 K-step is half the fp32 one's shared memory, so three
# take 23 KB and keep 8 programs an SM, where the fp32 stream's three take 39 KB and 5. H100
# (benchmarks/NOTES.md run 50, `sweep_h100_run50_copy_triton.json`): T=4 B=256 / 64 160.5 / 53.2
# -> 159.0 / 50.8 us, T=1 143.4 / 49.3 -> 140.7 / 46.9, the fastest of eight launches. On the
# fp32 checkpoint three were slower on the H100 (B=256 verify 235.6 -> 245.5 us, B=128 125.6 ->
# 129.2; `ab_h100_run50_stages_triton_*`); on the H200 a tie at B=256, 2 us ahead at 64 (run 30).
COPY_STREAM_STAGES = 3


def replay_tuning(V: int, T: int, B: int | None = None, *,
                  copy: bool = False) -> KernelTuning:
  """Launch parameters of the triton replay verify in its form for (T, B) (`replay_form`);
  ``copy``: reading the checkpoint's bf16 copy (`SpecConfig.checkpoint_copy`).

  The split form's stream: ``[64, K]`` tiles over 2 warps in K-chunks of 64 through 2
  pipeline stages (`COPY_STREAM_STAGES` on the copy), the fastest of seven launches at B=256
  and 64 (H200, benchmarks/NOTES.md run 29: 203.5 and 60.1 us; the Pallas stream's (128, 4,
  64, 2) 207.2 and 60.8, (128, 8, 64, 2) 263.7 and 72.4). Again with its epilogue on the
  tensor cores (run 30): 185.9-186.7 and 54.3-54.9 us; (64, 2, 64, 3) 186.3 and 52.6, (128, 4,
  64, 2) 187.7 and 55.4, (32, 2, 64, 2) 208.8 and 58.9, (64, 4, 64, 2) 218.0 and 60.8. The
  one-kernel forms, H200, 2026-11-30, B=256, write_pos 8 (benchmarks/NOTES.md run 5): ``[128,
  K]`` tiles over 4 warps in K-chunks of 32 were the fastest of the launches tried for both: UT
  at T=4 502 us (721 us at (64, 2)), the vector form at T=1 222 us (278 us at (64, 4)). The
  vector form runs below 32 rows only since session 41, in `VEC_BLOCK_V` x `VEC_K_CHUNK` tiles
  measured there.
  """
  from replayssm_jax.kernels.triton.replay_verify import replay_form  # needs triton

  form = replay_form(T, B)
  if form == "split":
    return KernelTuning(block_v=min(64, V), num_warps=2, k_chunk=64,
                        num_stages=COPY_STREAM_STAGES if copy else 2)
  if form == "vec":
    return KernelTuning(block_v=min(VEC_BLOCK_V, V), num_warps=4, k_chunk=VEC_K_CHUNK)
  return KernelTuning(block_v=min(128, V), num_warps=4, k_chunk=32)
