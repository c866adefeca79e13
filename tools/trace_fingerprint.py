"""Fingerprints of what every Pallas kernel path traces to, for "no traced change" claims.

A refactor of the kernels' Python (arguments regrouped, helpers moved) should leave the traced
programs alone, and so the GPU's bits and speed. This script traces each path for an H200
(``interpret=False``, on any machine: tracing needs no GPU) and prints a hash of its jaxpr,
which holds the Pallas kernel bodies and their launch parameters but no source lines. Save the
texts before a change, compare after it::

    PYTHONPATH=$PWD python tools/trace_fingerprint.py --save /tmp/before
    # ... the change ...
    PYTHONPATH=$PWD python tools/trace_fingerprint.py --compare /tmp/before

``--compare`` exits 1 and names the paths whose trace changed. About half a minute on a CPU.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import jax
import jax.numpy as jnp

from replayssm_jax.kernels import fold, recurrent, replay_split, replay_verify
from replayssm_jax.kernels.backend import KernelTuning

# A small batch of the anchor geometry (HV=32, H=16, K=V=128, L=16, bf16 activations).
H, HV, K, V, SLOTS, B, L = 16, 32, 128, 128, 8, 4, 16
ACT, F32, I32 = jnp.bfloat16, jnp.float32, jnp.int32
STATE = ((SLOTS, HV, V, K), F32)
RINGS = [((SLOTS, HV, L, V), ACT), ((SLOTS, H, L, K), ACT), ((SLOTS, HV, L), F32),
         ((SLOTS, HV, L), F32), ((SLOTS, H, L, K), ACT), ((SLOTS, HV, L, V), ACT)]
ROW = ((B,), I32)


def _window(T: int) -> list:
  """q, k, v, a, b, A_log, dt_bias, slot_ids."""
  return [((B, T, H, K), ACT), ((B, T, H, K), ACT), ((B, T, HV, V), ACT), ((B, T, HV), ACT),
          ((B, T, HV), ACT), ((HV,), F32), ((HV,), F32), ROW]


def paths() -> dict[str, tuple[Callable, list]]:
  """Name -> (function, argument shapes) of every Pallas path, at the default launches."""
  state = KernelTuning.state_default(V)
  out = {
      "recurrent_verify": (functools.partial(recurrent.recurrent_verify, tuning=state,
                                             interpret=False),
                           [STATE, ((SLOTS, 4, HV, V, K), F32), *_window(4)]),
      "recurrent_decode": (functools.partial(recurrent.recurrent_decode, tuning=state,
                                             interpret=False), [STATE, *_window(1)]),
      "fold": (functools.partial(fold.fold, tuning=state, interpret=False),
               [STATE, RINGS[4], RINGS[5], RINGS[2], RINGS[3], ROW, ROW, ROW]),
  }
  for T in (1, 4):
    for form in replay_verify.FORMS:
      if form == "vec" and T > 1:
        continue
      out[f"replay_verify_{form}_T{T}"] = (
          functools.partial(replay_verify.replay_verify, tuning=KernelTuning.replay_default(V, T),
                            dot_precision="default", interpret=False, form=form),
          [STATE, *RINGS, *_window(T), ROW, ROW])
    out[f"stream_fold_T{T}"] = (
        functools.partial(replay_split.fold_replay_verify_split,
                          tuning=KernelTuning.replay_default(V, T), fold_tuning=state,
                          dot_precision="default", interpret=False),
        [STATE, *RINGS, *_window(T), ROW, ROW, ROW, ROW])
    out[f"one_kernel_fold_T{T}"] = (
        functools.partial(replay_verify.fold_and_replay_verify,
                          tuning=KernelTuning.replay_default(V, T, B), fold_tuning=state,
                          dot_precision="default", interpret=False),
        [STATE, *RINGS, *_window(T), ROW, ROW, ROW, ROW])
  return out


def traces(names: Iterable[str] | None = None) -> dict[str, str]:
  """Name -> jaxpr text of the paths in ``names`` (default: all of `paths`), traced afresh:
  the kernels' module-level launch knobs are read at trace time, and jit caches traces."""
  jax.clear_caches()
  table = paths()
  texts = {}
  for name in names or table:
    fn, shapes = table[name]
    args = [jax.ShapeDtypeStruct(s, d) for s, d in shapes]
    texts[name] = str(jax.make_jaxpr(fn)(*args))
  return texts


def digest(text: str) -> str:
  return hashlib.sha1(text.encode()).hexdigest()[:12]


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--save", type=Path, help="write each path's jaxpr to DIR/<name>.txt")
  p.add_argument("--compare", type=Path, help="compare with the texts saved in DIR")
  p.add_argument("--only", nargs="+", choices=sorted(paths()), help="trace these paths only")
  args = p.parse_args(argv)
  changed = []
  for name, text in traces(args.only).items():
    mark = ""
    if args.compare is not None:
      saved = args.compare / f"{name}.txt"
      same = saved.exists() and saved.read_text() == text
      mark = "  same" if same else "  CHANGED"
      if not same:
        changed.append(name)
    if args.save is not None:
      args.save.mkdir(parents=True, exist_ok=True)
      (args.save / f"{name}.txt").write_text(text)
    print(f"{name:32s} {digest(text)}{mark}", flush=True)
  if changed:
    print(f"changed: {', '.join(changed)}")
  return 1 if changed else 0


if __name__ == "__main__":
  sys.exit(main())
