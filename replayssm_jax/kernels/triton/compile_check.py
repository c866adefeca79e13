"""Compile every triton kernel for an H200 (sm_90) on any machine; report registers and spills.

``python -m replayssm_jax.kernels.triton.compile_check [--json]`` compiles the launches of the
anchor geometry (HV=32, H=16, K=V=128, T=4, L=16, bf16 activations and rings, fp32
checkpoint; the decode-shaped kernels at T=1) with the backend's default tunings, exactly as
jax-triton would specialise them, and prints the registers and spill bytes of the cubins
(`launch.resource_usage`) and how many programs of each an H200 SM holds
(`launch.programs_per_sm`). No GPU is needed: Triton compiles to PTX and the ptxas of the
triton wheel assembles it, with Triton's own flags.
"""

from __future__ import annotations

import argparse
import json
import math

import jax
import jax.numpy as jnp

from replayssm_jax.kernels.backend import KernelTuning, layer_shapes
from replayssm_jax.kernels.triton import replay_tuning, state_tuning
from replayssm_jax.kernels.triton.fold import fold_launch
from replayssm_jax.kernels.triton.launch import SMS, Launch, compile_sm90, resource_usage
from replayssm_jax.kernels.triton.recurrent import recurrent_launch
from replayssm_jax.kernels.triton.replay_split import split_launches, stream_fold_block_v
from replayssm_jax.kernels.triton.replay_verify import replay_verify_launch

ANCHOR = dict(H=16, HV=32, K=128, V=128, T=4, L=16, slots=8, B=4)


def launches(*, H: int, HV: int, K: int, V: int, T: int, L: int, slots: int = 8, B: int = 4,
             act=jnp.bfloat16, ring=jnp.bfloat16, state: KernelTuning | None = None,
             dot_precision: str = "default") -> dict[str, Launch]:
  """The launches of every kernel at one geometry: T-token verifies, T=1 decodes, the fold."""
  state = state or state_tuning(V)
  win = layer_shapes(H=H, HV=HV, K=K, V=V, T=T, L=L, slots=slots, B=B, act=act, ring=ring)
  one = layer_shapes(H=H, HV=HV, K=K, V=V, T=1, L=L, slots=slots, B=B, act=act, ring=ring)
  window = lambda x: [x[n] for n in ("slot_ids", "q", "k", "v", "a", "b", "A_log", "dt_bias")]
  replay = lambda x: [x[n] for n in ("ssm", "ring_d", "ring_k", "ring_g", "ring_beta",
                                     "ring_rawk", "ring_rawv", "q", "k", "v", "a", "b", "A_log",
                                     "dt_bias", "slot_ids", "write_pos", "cache_base")]
  fold = [win[n] for n in ("ssm", "ring_rawk", "ring_rawv", "ring_g", "ring_beta", "slot_ids",
                           "count", "cache_base")]
  # The checkpoint's bf16 copy (`SpecConfig.checkpoint_copy`): the fold writes it, the split
  # form's stream reads it.
  ssm_copy = jax.ShapeDtypeStruct(win["ssm"].shape, jnp.bfloat16)
  copy = lambda x: [ssm_copy, *replay(x)[1:]]
  return {
      f"recurrent_verify_T{T}": recurrent_launch(*window(win), win["ssm"], win["intermediate"],
                                                 tuning=state),
      "recurrent_decode": recurrent_launch(*window(one), one["ssm"], None, tuning=state),
      f"exact_fold_L{L}": fold_launch(*fold, tuning=state),
      f"exact_fold_L{L}_copy": fold_launch(*fold, tuning=state, ssm_copy=ssm_copy),
      **{f"replay_split_stream_T{t}_copy": split_launches(
          *copy(x), tuning=replay_tuning(V, T, B=256, copy=True),
          dot_precision=dot_precision)[1]
         for t, x in ((T, win), (1, one)) if dot_precision in ("default", "bf16")},
      f"replay_verify_ut_T{T}": replay_verify_launch(
          *replay(win), tuning=replay_tuning(V, T), dot_precision=dot_precision, form="ut"),
      "replay_verify_ut_T1": replay_verify_launch(
          *replay(one), tuning=replay_tuning(V, 4), dot_precision=dot_precision, form="ut"),
      "replay_verify_vec_T1": replay_verify_launch(
          *replay(one), tuning=replay_tuning(V, 1), dot_precision=dot_precision, form="vec"),
      **{f"replay_split_{part}_T{t}": launch
         for t, x in ((T, win), (1, one))
         for part, launch in zip(("coefficients", "stream"), split_launches(
             *replay(x), tuning=replay_tuning(V, T, B=256), dot_precision=dot_precision))},
      # The stream that folds the flush rows first (`fold_replay_verify_split`), at decode,
      # where its programs hold whole fold tiles.
      **{f"replay_split_fold_stream_T1{suffix}": split_launches(
          *states(one), tuning=replay_tuning(V, 1, B=256, copy=bool(suffix)),
          dot_precision=dot_precision, fold_tuning=state,
          checkpoint=one["ssm"] if suffix else None)[1]
         for suffix, states in (("", replay), ("_copy", copy))
         if stream_fold_block_v(replay_tuning(V, 1, B=256), state)
         and (not suffix or dot_precision in ("default", "bf16"))},
  }


WAVE_BATCHES = (16, 64, 256)  # the batch sizes whose waves `main` prints


def launch_rows(launch: Launch) -> int:
  """The rows (batch size) a launch was built for: its slot ids' length."""
  return launch.inputs["slot_ids"].shape[0]


def report(launch_set: dict[str, Launch]) -> dict[str, dict]:
  """``{name: {n_regs, spill_stores, spill_loads, shared_bytes, launch, num_warps, per_sm,
  programs_per_row}}``: ``per_sm`` the programs an H200 SM holds (`launch.programs_per_sm`),
  ``programs_per_row`` the grid's programs per batch row (so B rows run in ``B *
  programs_per_row / (SMS * per_sm)`` waves)."""
  rows = {}
  for name, launch in launch_set.items():
    usage = resource_usage(compile_sm90(launch))
    rows[name] = dict(usage, launch=launch.name, num_warps=launch.num_warps,
                      programs_per_row=math.prod(launch.grid) // launch_rows(launch))
  return rows


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--json", action="store_true", help="print JSON")
  args = parser.parse_args(argv)
  rows = report(launches(**ANCHOR))
  if args.json:
    print(json.dumps(rows, indent=1))
    return
  print(f"sm_90, {ANCHOR}, bf16 activations and rings; waves: the grid at B rows over {SMS} "
        "SMs")
  print(f"{'kernel':24} {'launch':48} {'regs':>5} {'spill st/ld':>12} {'smem':>6} {'per SM':>6}"
        + "".join(f" {f'B={B}':>6}" for B in WAVE_BATCHES))
  for name, r in rows.items():
    waves = "".join(f" {r['programs_per_row'] * B / (SMS * r['per_sm']):6.2f}"
                    for B in WAVE_BATCHES)
    print(f"{name:24} {r['launch']:48} {r['n_regs']:5d} "
          f"{r['spill_stores']:5d}/{r['spill_loads']:<6d} {r['shared_bytes']:6d} {r['per_sm']:6d}"
          + waves)


if __name__ == "__main__":
  main()
