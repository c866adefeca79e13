"""A short run of each ReplaySSM kernel at the anchor geometry, for a profiler (GPU).

Each kernel runs ``--calls`` times, after one warm-up, with nothing else on the device in
between but the inputs' set-up, so a profiler filtered by kernel name sees only its launches:

    ncu --clock-control none -k regex:'replay_coefficients|replay_stream_T4|exact_fold' \\
        --launch-skip 2 --launch-count 8 --set full -o prof \\
        python -m replayssm_jax.bench.profile --batch 256

(run 8 in benchmarks/NOTES.md; ``--launch-skip 2`` passes over the warm-up call of the T=4
coefficients and stream). The stream that folds, alone: ``-k regex:'stream.*_fold'
--launch-skip 1 --launch-count 2``. Where a kernel's instructions and stalls go: export the
report's SASS page (``ncu --import prof.ncu-rep --page source --csv --print-source sass >
sass.csv``) and summarise it with ``python tools/ncu_sass.py sass.csv``.

Launches, in order: the replay verify at write_pos 8 (T=4: coefficients + stream), the
replay decode at write_pos 8 (T=1), the exact fold of 12 records, and (Pallas) a whole
`ssm.verify` step with rows in mixed phases, a third of them folding: inside the stream kernel
(``replay_stream_T4_..._fold``) below `ssm.FUSE_FOLD_BELOW`'s 128 rows, in the fold kernel
before a plain stream from there.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from replayssm_jax import SpecConfig, ssm
from replayssm_jax.bench.kernels import (GEOMETRY, TINY, _cursors, _inputs, _replay_cache,
                                         _restoring, _window, kernels_for)
from replayssm_jax.kernels import replay_verify as replay_kernels


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--batch", type=int, default=256)
  p.add_argument("--calls", type=int, default=2, help="calls of each kernel after its warm-up")
  p.add_argument("--backend", choices=("pallas", "triton"), default="pallas")
  p.add_argument("--tiny", action="store_true", help="tiny geometry: a smoke run on the CPU")
  args = p.parse_args(argv)
  B, L, gdn = args.batch, 16, TINY if args.tiny else GEOMETRY
  rng = np.random.default_rng(0)
  kern = kernels_for(args.backend)
  slot_ids = jnp.arange(B, dtype=jnp.int32)
  rings = replay_kernels.RING_NAMES

  for T in (4, 1):
    spec = SpecConfig(draft_tokens=T, ring_len=L, verify_mode="replayssm", backend=args.backend)
    cache = _replay_cache(rng, gdn, spec, B, np.full(B, 8), np.zeros(B, bool))
    x = _inputs(rng, B, T, gdn)

    @functools.partial(jax.jit, donate_argnums=0)
    def replay(c, x=x, T=T, spec=spec):
      _, *out = kern.replay_verify(
          c.ssm, *(getattr(c, n) for n in rings), *_window(x), slot_ids, c.write_pos,
          c.cache_base, tuning=kern.replay_tuning(gdn.head_v_dim, T, B),
          dot_precision=spec.dot_precision)
      return dataclasses.replace(c, **dict(zip(rings, out)))

    for _ in range(1 + args.calls):
      cache = jax.block_until_ready(replay(cache))
    print(f"replay verify T={T}: {1 + args.calls} calls", flush=True)

  tuning = kern.state_tuning(gdn.head_v_dim)
  wp = jnp.full((B,), L - 4, jnp.int32)

  @functools.partial(jax.jit, donate_argnums=0)
  def fold(c):
    return dataclasses.replace(c, ssm=kern.fold(c.ssm, c.ring_rawk, c.ring_rawv, c.ring_g,
                                                c.ring_beta, slot_ids, wp, c.cache_base,
                                                tuning=tuning))

  for _ in range(1 + args.calls):
    cache = jax.block_until_ready(fold(cache))
  print(f"fold: {1 + args.calls} calls", flush=True)

  if args.backend == "pallas":  # the mixed-phase step of `bench.kernels`: a third folding
    spec = SpecConfig(draft_tokens=4, ring_len=L, verify_mode="replayssm", backend="pallas")
    rows = np.arange(B) % 3
    cache = _replay_cache(rng, gdn, spec, B, np.array([L - 4, 4, 8])[rows], rows == 0)
    x = _inputs(rng, B, 4, gdn)
    step = _restoring(lambda c: ssm.verify(c, *_window(x), slot_ids, spec)[1], _cursors)
    for _ in range(1 + args.calls):
      cache = jax.block_until_ready(step(cache))
    print(f"mixed-phase verify step: {1 + args.calls} calls", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
