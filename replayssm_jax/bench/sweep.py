"""Launch-parameter sweep of the GPU kernels at the anchor geometry (one process, one device call).

- Replay verify (T = 4 at write_pos 8, and T = 1 for decode): form x block_v x num_warps;
  ``--only vec-tiles``: the decode's vector form over `VEC_TILES`.
- Recurrent verify, recurrent decode and the exact fold, which must share their tuning: each
  candidate is timed and checked for the bitwise equality the design rests on (a fold of 12
  records written by the replay verify equals the recurrent verify's state after 12 tokens).
- The Pallas fold's own launch (V-blocks per program, one after the other or in one record
  loop, record prefetch; ``--only fold-tunings``: its tiles; ``--only fold-orders``: the order
  of a record's loads), with 12 records and with none, under the same bitwise check.
- The fold inside the split verify's stream kernel per stream launch, fold tile height and
  record loop, under the same bitwise check, against the fold kernel followed by the split
  verify.

Each backend has its own candidates (`CANDIDATES`): the triton kernels hold their tiles
differently (`kernels/triton/tile.py`). Every timed call starts with L2 evicted by a write pass,
as in `bench.kernels` (``--l2-flush read``: a read pass, which leaves clean lines).

    python -m replayssm_jax.bench.sweep --out sweep.json [--backend triton]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from replayssm_jax import ssm
from replayssm_jax.bench import kernels as bench
from replayssm_jax.bench import timing as bench_timing
from replayssm_jax.bench.kernels import Bytes, _inputs, _replay_cache, _window
from replayssm_jax.bench.timing import time_calls
from replayssm_jax.config import SpecConfig
from replayssm_jax.kernels import backend as kernel_backend
from replayssm_jax.kernels import fold as fold_kernels
from replayssm_jax.kernels import replay_split
from replayssm_jax.kernels import replay_verify as replay_kernels
from replayssm_jax.kernels.backend import KernelTuning, interpret_mode

RINGS = replay_kernels.RING_NAMES
# (form, tuning) pairs of the replay verify; `k_chunk` matters to the vector form (its chunks)
# and the split forms (the K-step of the pipelined stream, with `num_stages`). The one-kernel
# forms keep their best launches of runs 2-5 (benchmarks/NOTES.md), the split forms those
# within 5% of the best in run 6.
REPLAY = [("ut", KernelTuning(block_v=64, num_warps=2)),
          ("vec", KernelTuning(block_v=64, num_warps=4, k_chunk=32))] + [
    (form, KernelTuning(block_v=bv, num_warps=w, k_chunk=kc, num_stages=st))
    for form, bv, w, kc, st in [("split", 128, 4, 64, 2), ("split", 64, 2, 32, 3),
                                ("split-xla", 128, 4, 64, 2)]]
STATE = [KernelTuning(block_v=bv, num_warps=w, k_chunk=kc)
         for bv, w, kc in [(32, 2, 16), (16, 1, 16), (32, 2, 32), (32, 1, 32), (16, 1, 32),
                           (64, 2, 32)]]
# The triton kernels: the UT form's dots need block_v and k_chunk >= 16; a state tile of more
# than 64 elements per thread spills (kernels/triton/__init__.py, `state_tuning`).
TRITON_REPLAY = [("ut", KernelTuning(block_v=bv, num_warps=w, k_chunk=kc))
                 for bv, w, kc in [(64, 2, 32), (64, 4, 32), (32, 2, 32), (128, 4, 32)]] + [
    ("vec", KernelTuning(block_v=bv, num_warps=w, k_chunk=kc))
    for bv, w, kc in [(64, 4, 32), (32, 2, 32), (128, 4, 32), (64, 2, 32), (128, 4, 16),
                      (64, 2, 16),
                      # whole rows, no K-loop: every load of a program in flight at once
                      # (triton 3.6, sm_90: 119 / 93 registers, 4 / 5 programs an SM)
                      (32, 4, 128), (16, 4, 128), (32, 4, 64)]] + [
    ("split", KernelTuning(block_v=bv, num_warps=w, k_chunk=kc, num_stages=st))
    for bv, w, kc, st in [(128, 4, 64, 2), (64, 4, 64, 2), (64, 4, 64, 3), (64, 4, 32, 3),
                          (128, 8, 64, 2), (32, 2, 64, 3),
                          # the shipped stream, and through three stages as on the copy
                          # since run 50 (`COPY_STREAM_STAGES`; 1-5% ahead there, H100)
                          (64, 2, 64, 2), (64, 2, 64, 3)]]
TRITON_STATE = [KernelTuning(block_v=bv, num_warps=w, k_chunk=kc)
                for bv, w, kc in [(32, 2, 16), (16, 1, 16), (32, 4, 16), (64, 4, 16), (16, 1, 8),
                                  (32, 4, 8)]]
CANDIDATES = {"pallas": (REPLAY, STATE), "triton": (TRITON_REPLAY, TRITON_STATE)}
# The vector form's tiles at T=1 (decode below the split threshold; ``--only vec-tiles``, either
# backend): the shipped [64, 32] over 4 warps (the triton one since session 41) and its neighbours.
# Run 41 (H100, L2 flushed between a cycle's steps) had the Pallas decode at B=8 and 16 slower
# than the recurrent decode (18.4 against 15.2 us, 29.5 against 26.6), the cycle at 34-43% of
# copy, its vector kernel latency-bound: the tiles beside it, on HBM.
VEC_TILES = [KernelTuning(block_v=bv, num_warps=w, k_chunk=kc)
             for bv, w, kc in [(64, 4, 32), (64, 2, 32), (32, 2, 32), (32, 4, 32), (128, 4, 32),
                               (64, 4, 16), (64, 4, 64), (32, 4, 128)]]
COEFFICIENT_WARPS = (1, 2, 4)  # warps of the split form's coefficients kernel
# The split form's other launches of its coefficients kernel, beside the default.
SPLIT_VARIANTS = (
    [dict(coefficient_warps=w) for w in COEFFICIENT_WARPS]
    + [dict(coefficient_inline=None), dict(coefficient_inline=0),  # products written out
       dict(coefficient_key_mma=False), dict(coefficient_key_mma=True),  # key products' cores
       dict(coefficient_loads_first=False), dict(coefficient_loads_first=True),  # load order
       dict(coefficient_history_scan=False), dict(coefficient_history_scan=True),  # weights
       dict(coefficient_reciprocal_norms=False), dict(coefficient_reciprocal_norms=True),
       dict(coefficient_window_mma=False), dict(coefficient_window_mma=True)])


# Launches of the split form's checkpoint stream beside the default (`KernelTuning.
# replay_default`): tile height, warps, K-step and pipeline stages. Shared memory holds
# ``num_stages`` K-steps of the tile, which caps the programs an SM (64 KB at the default: 3;
# three stages of the default's K-step, 96 KB: 2, more of each program's loads in flight).
STREAM_TUNINGS = [KernelTuning(block_v=bv, num_warps=w, k_chunk=kc, num_stages=st)
                  for bv, w, kc, st in [(128, 4, 32, 3), (128, 4, 32, 2), (128, 8, 64, 2),
                                        (128, 4, 64, 3), (128, 4, 128, 1), (64, 4, 64, 2),
                                        (64, 2, 64, 2), (64, 4, 32, 3), (64, 2, 32, 2)]]
# The stream over the checkpoint's bf16 copy (``--checkpoint-copy``): a K-step of 128 bf16
# elements holds the bytes of the fp32 default's 64 (the same 64 KB of shared memory at two
# stages), so the loop issues half the steps for them; three stages of 64 (its default at
# T > 1 since run 47, `backend.COPY_STREAM_STAGES`) and the fp32 stream's two.
COPY_STREAM_TUNINGS = [KernelTuning(block_v=bv, num_warps=w, k_chunk=kc, num_stages=st)
                       for bv, w, kc, st in [(128, 4, 128, 2), (128, 8, 128, 2),
                                             (64, 4, 128, 2), (128, 4, 64, 3),
                                             (128, 4, 64, 2)]]


def split_variants(knobs=None) -> list[dict]:
  """The `SPLIT_VARIANTS` (that set one of ``knobs``, if given)."""
  return [x for x in SPLIT_VARIANTS if knobs is None or set(x) & set(knobs)]


def sweep_replay(gdn, B, T, wp, reps, backend="pallas", forms=True, knobs=None,
                 streams=False, vec_tiles=False, copy=False):
  """The replay verify per (form, tuning) (unless not ``forms``); on Pallas also the split
  form in each of `SPLIT_VARIANTS` (its kernels' other launches; those that set one of
  ``knobs``, if given) under the default tuning, or, with ``streams``, at each of the stream
  launches `STREAM_TUNINGS` instead (and `COPY_STREAM_TUNINGS` with ``copy``). With
  ``vec_tiles``, the vector form at each of `VEC_TILES` alone (rows of V capped at the
  geometry's). With ``copy``, every verify reads the checkpoint's bf16 copy
  (`SpecConfig.checkpoint_copy`), and the byte model counts it."""
  rng = np.random.default_rng(0)
  spec = SpecConfig(draft_tokens=T, ring_len=16, verify_mode="replayssm",
                    checkpoint_copy=jnp.bfloat16 if copy else None)
  x = _inputs(rng, B, T, gdn)
  slot_ids = jnp.arange(B, dtype=jnp.int32)
  model = B * Bytes(gdn, T, copy=copy).rssm_verify(wp, T)
  kern = bench.kernels_for(backend)
  if vec_tiles:
    capped = [dataclasses.replace(t, block_v=min(t.block_v, gdn.head_v_dim)) for t in VEC_TILES]
    variants = [("vec", t, {}) for t in dict.fromkeys(capped)]
  else:
    variants = [(form, tuning, {}) for form, tuning in CANDIDATES[backend][0] if forms]
  if backend == "pallas" and not vec_tiles:
    stream = ssm.default_replay_tuning(spec, gdn.head_v_dim, T, B)
    variants += [] if forms else [("split", stream, {})]  # the defaults, to compare with
    if streams:
      tunings = dict.fromkeys(STREAM_TUNINGS + (COPY_STREAM_TUNINGS if copy else []))
      variants += [("split", t, {}) for t in tunings if t != stream]
    else:
      variants += [("split", stream, extra) for extra in split_variants(knobs)]
  for form, tuning, extra in variants:
    one_kernel_form = {"vec": T == 1, "ut": T > 1}  # the triton one-kernel form of each T
    if tuning.block_v > gdn.head_v_dim or (backend == "triton"
                                           and not one_kernel_form.get(form, True)):
      continue
    cache = _replay_cache(rng, gdn, spec, B, np.full(B, wp), np.zeros(B, bool))
    if extra:
      verify = functools.partial(replay_split.replay_verify_split, interpret=interpret_mode(),
                                 **extra)
    else:
      verify = functools.partial(kern.replay_verify, form=form)

    def run(c, tuning=tuning, verify=verify):
      _, *out = verify(c.verify_ssm, *(getattr(c, n) for n in RINGS), *_window(x), slot_ids,
                       c.write_pos, c.cache_base, tuning=tuning, dot_precision="default")
      return dataclasses.replace(c, **dict(zip(RINGS, out)))

    row = dict(kernel=f"replay_verify_{form}_T{T}", backend=backend, B=B, wp=wp,
               **dataclasses.asdict(tuning), **extra, **({"checkpoint_copy": True} if copy else {}))
    try:
      t, _ = time_calls(jax.jit(run, donate_argnums=0), cache, reps=reps)
    except Exception as e:  # a launch shape Triton rejects (registers, shared memory)
      yield dict(row, error=f"{type(e).__name__}: {str(e)[:200]}")
      continue
    yield dict(row, median_us=round(t.median_us, 1), bytes=model,
               tbps=round(model / t.median_us / 1e6, 3), kernel_us=t.by_kernel())


def _fold_case(gdn, B, rng, kern, tuning, n_fold):
  """(S0, rings, count, cache_base, expected): records of an ``n_fold``-token window written
  by the replay verify (the real writer of g and beta), and the recurrent verify's state after
  the same tokens, which their fold must equal bitwise. ``rings``: the fold's four."""
  S0, rings, count, base, expected = _fold_case_rings(gdn, B, rng, kern, tuning, n_fold)
  return S0, tuple(rings[n] for n in fold_kernels.RING_NAMES), count, base, expected


def _fold_case_rings(gdn, B, rng, kern, tuning, n_fold):
  """`_fold_case` with every ring, by name."""
  slot_ids = jnp.arange(B, dtype=jnp.int32)
  x = _inputs(rng, B, n_fold, gdn)
  S0 = jnp.asarray(0.3 * rng.standard_normal((B, *gdn.state_shape), np.float32))
  spec = SpecConfig(draft_tokens=4, ring_len=16, verify_mode="replayssm")  # the ring shape only
  cache = _replay_cache(rng, gdn, spec, B, np.zeros(B), np.zeros(B, bool))
  _, *rings = kern.replay_verify(
      S0, *(getattr(cache, n) for n in RINGS), *_window(x), slot_ids, cache.write_pos,
      cache.cache_base, tuning=kern.replay_tuning(gdn.head_v_dim, n_fold, B),
      dot_precision="default")
  _, inter = kern.recurrent_verify(
      S0, jnp.zeros((B, n_fold, *gdn.state_shape), jnp.float32), *_window(x), slot_ids,
      tuning=tuning)
  return (S0, dict(zip(RINGS, rings)), jnp.full((B,), n_fold, jnp.int32), cache.cache_base,
          inter[:, -1])


def sweep_state(gdn, B, reps, n_fold=12, backend="pallas"):  # 12 records: the anchor's fold
  """Recurrent verify/decode and the fold per tuning, with the fold's bitwise check."""
  rng = np.random.default_rng(1)
  T = 4
  nbytes = Bytes(gdn, T)
  slot_ids = jnp.arange(B, dtype=jnp.int32)
  x, x1 = _inputs(rng, B, T, gdn), _inputs(rng, B, 1, gdn)
  S0 = jnp.asarray(0.3 * rng.standard_normal((B, *gdn.state_shape), np.float32))
  kern = bench.kernels_for(backend)
  for tuning in (t for t in CANDIDATES[backend][1] if t.block_v <= gdn.head_v_dim):
    row = dict(backend=backend, B=B, **dataclasses.asdict(tuning))
    verify = jax.jit(lambda inter, tuning=tuning: kern.recurrent_verify(
        S0, inter, *_window(x), slot_ids, tuning=tuning)[1], donate_argnums=0)
    t, _ = time_calls(verify, jnp.zeros((B, T, *gdn.state_shape), jnp.float32), reps=reps)
    row["rec_verify_us"] = round(t.median_us, 1)
    decode = jax.jit(lambda s, tuning=tuning: kern.recurrent_decode(
        s, *_window(x1), slot_ids, tuning=tuning)[1], donate_argnums=0)
    t, _ = time_calls(decode, S0 + 0, reps=reps)
    row["rec_decode_us"] = round(t.median_us, 1)

    S_fold, rings, count, base, expected = _fold_case(gdn, B, rng, kern, tuning, n_fold)
    fold = jax.jit(lambda s, tuning=tuning: kern.fold(
        s, *rings, slot_ids, count, base, tuning=tuning), donate_argnums=0)
    folded = fold(S_fold + 0)
    row["fold_bitwise"] = bool(jnp.array_equal(folded, expected))
    t, _ = time_calls(fold, folded, reps=reps)
    row["fold_us"] = round(t.median_us, 1)
    row["fold_tbps"] = round(B * nbytes.fold(n_fold) / t.median_us / 1e6, 3)
    row["rec_verify_tbps"] = round(B * nbytes.rec_verify() / row["rec_verify_us"] / 1e6, 3)
    yield row


# (v_blocks, prefetch, interleave, normalize_ahead, prefetch_at): tiles per program, one after
# the other or in one record loop, loading record i + 1 (and normalising its k) while applying
# record i, the loads issued before or after its update
FOLD_LAUNCHES = [(vb, pf, il, na, at) for vb in (1, 2, 4)
                 for il in ((False, True) if vb > 1 else (False,))
                 for pf, na in ((False, False), (True, False), (True, True))
                 for at in (fold_kernels.PREFETCH_ATS if pf else ("start",))]


# Fold launches at other tile heights, warps and pipeline stages than the recurrent kernels'
# (the state tuning), with its K-chunks: the rows are independent and each warp lays K out as
# the recurrent kernels' warps do, so each may fold to the same bits; `sweep_fold` checks it.
# (block_v, num_warps, num_stages)
FOLD_TUNINGS = [(32, 2, 1), (32, 2, 3), (16, 2, 2), (16, 1, 2), (32, 1, 2), (64, 2, 2), (64, 4, 2)]

# The orders of a record's loads in the shipped launch (`fold.RECORD_LOADS`): the shipped
# order, run 22's slower one, g first (the decay needs it first), the norm last.
FOLD_RECORD_ORDERS = [fold_kernels.RECORD_LOADS, ("k", "v", "beta", "norm", "g"),
                      ("g", "k", "norm", "v", "beta"), ("k", "g", "norm", "v", "beta"),
                      ("k", "norm", "g", "v", "beta"), ("k", "v", "g", "beta", "norm"),
                      ("k", "g", "v", "beta", "norm")]
# Cache prefetches in the shipped launch (`fold.fold`'s ``prefetch_records_to`` and
# ``prefetch_tile_ahead``), none first: the records to L1 or L2 when a program starts, and the
# checkpoint tile of the program 132 (one an SM) to 792 launches later into L2 (a wave of the
# fold is 1056 programs, 8 an SM), with the records and alone.
FOLD_PREFETCHES = [("off", 0), ("L1", 0), ("L2", 0), ("L1", 132), ("L1", 264), ("L1", 396),
                   ("L1", 528), ("L1", 792), ("L2", 528), ("off", 528)]
FOLD_FAMILIES = ("fold", "fold-tunings", "fold-orders", "fold-prefetch")


def sweep_fold(gdn, B, reps, n_fold=12, family="fold"):
  """The Pallas fold's launches of one of `FOLD_FAMILIES`: "fold", each of `FOLD_LAUNCHES`
  at the default tuning and then each of `FOLD_TUNINGS` in the default launch;
  "fold-tunings", the default launch and `FOLD_TUNINGS`; "fold-orders", the default launch
  with each of `FOLD_RECORD_ORDERS`; "fold-prefetch", with each of `FOLD_PREFETCHES`.
  ``n_fold`` records, and no record (every row's count 0:
  the launch alone), each checked bitwise against the recurrent verify at the default tuning."""
  rng = np.random.default_rng(2)
  kern = bench.kernels_for("pallas")
  tuning = kern.state_tuning(gdn.head_v_dim)
  slot_ids = jnp.arange(B, dtype=jnp.int32)
  S0, rings, count, base, expected = _fold_case(gdn, B, rng, kern, tuning, n_fold)
  nbytes = Bytes(gdn, 4)
  shipped = dict(v_blocks=None, prefetch=None, interleave=None, normalize_ahead=None,
                 prefetch_at=None, record_order=None, prefetch_records_to=None,
                 prefetch_tile_ahead=None)
  tiles = [(dataclasses.replace(tuning, block_v=bv, num_warps=w, num_stages=st), shipped)
           for bv, w, st in FOLD_TUNINGS if bv <= gdn.head_v_dim]
  if family == "fold-orders":
    cases = [(tuning, dict(shipped, record_order=order)) for order in FOLD_RECORD_ORDERS]
  elif family == "fold-prefetch":
    cases = [(tuning, dict(shipped, prefetch_records_to=level, prefetch_tile_ahead=ahead))
             for level, ahead in FOLD_PREFETCHES]
  elif family == "fold-tunings":
    cases = [(tuning, shipped), *tiles]  # the shipped launch first, to compare with
  else:  # "fold": every record loop (the shipped one among them), then the tiles
    cases = [(tuning, dict(shipped, v_blocks=vb, prefetch=pf, interleave=il, normalize_ahead=na,
                           prefetch_at=at))
             for vb, pf, il, na, at in FOLD_LAUNCHES
             if vb <= gdn.head_v_dim // tuning.block_v] + tiles
  for launch_tuning, launch in cases:
    fold = jax.jit(lambda s, n, t=launch_tuning, kw=launch: fold_kernels.fold(
        s, *rings, slot_ids, n, base, tuning=t, interpret=interpret_mode(), **kw),
                   donate_argnums=0)
    try:
      folded = fold(S0 + 0, count)
    except Exception as e:  # a launch shape Triton rejects (registers, shared memory)
      yield dict(kernel="exact_fold", B=B, **dataclasses.asdict(launch_tuning), **launch,
                 error=f"{type(e).__name__}: {str(e)[:200]}")
      continue
    row = dict(kernel="exact_fold", B=B, n_fold=n_fold, **dataclasses.asdict(launch_tuning),
               **launch, fold_bitwise=bool(jnp.array_equal(folded, expected)))
    t, folded = time_calls(lambda s: fold(s, count), folded, reps=reps)
    t0, _ = time_calls(lambda s: fold(s, jnp.zeros_like(count)), folded, reps=reps)
    yield dict(row, fold_us=round(t.median_us, 1),
               fold_tbps=round(B * nbytes.fold(n_fold) / t.median_us / 1e6, 3),
               empty_us=round(t0.median_us, 1))


STREAM_FOLD_SPLITS = (2, 4)  # fold tiles per stream tile, beside the default's
# Its record loop: whether it loads record i + 1 before applying record i, and whether it folds
# a program's tiles in one loop (if it has several) or one after the other: (prefetch, interleave)
STREAM_FOLD_LOOPS = ((True, False), (False, False), (True, True), (False, True))
# Stream launches beside the default (None): eight warps hold a [128, K] tile as the
# recurrent kernels' warps hold theirs, so it folds as one tile.
STREAM_FOLD_TUNINGS = (None, KernelTuning(block_v=128, num_warps=8, k_chunk=64, num_stages=2))


def sweep_stream_fold(gdn, B, reps, n_fold=12, T=4, prefetch_levels=None):
  """The fold inside the split verify's stream kernel (`replay_split.fold_replay_verify_split`)
  per stream launch (`STREAM_FOLD_TUNINGS`), fold tile height (`STREAM_FOLD_SPLITS` and the
  default) and record loop (`STREAM_FOLD_LOOPS`): every row folding ``n_fold`` records and
  then verifying a T-token window, checked bitwise against the recurrent state and timed
  against the fold kernel followed by the split verify (`apart_us`); and no row folding
  (`idle_us`), against the split verify alone (`plain_us`): what the fold's code costs the
  stream. With ``prefetch_levels``, the default stream and record loop at each of these
  cache levels of the record prefetch (`fold.PREFETCH_RECORDS_TO`) instead."""
  for stream in STREAM_FOLD_TUNINGS[:1] if prefetch_levels else STREAM_FOLD_TUNINGS:
    yield from _sweep_stream_fold(gdn, B, reps, n_fold, T, stream, prefetch_levels)


def _sweep_stream_fold(gdn, B, reps, n_fold, T, stream, prefetch_levels=None):
  rng = np.random.default_rng(3)
  kern = bench.kernels_for("pallas")
  tuning = kern.state_tuning(gdn.head_v_dim)
  stream = stream or kern.replay_tuning(gdn.head_v_dim, T, B)
  if stream.block_v > gdn.head_v_dim:
    return
  slot_ids = jnp.arange(B, dtype=jnp.int32)
  S0, rings, count, base, expected = _fold_case_rings(gdn, B, rng, kern, tuning, n_fold)
  x = _inputs(rng, B, T, gdn)
  L = rings["ring_g"].shape[-1]
  after = (jnp.zeros_like(count), (base + count) & (L - 1))  # write_pos, cache_base after it
  interpret = interpret_mode()
  fresh = lambda: (S0 + 0, {n: jnp.copy(r) for n, r in rings.items()})  # the calls donate

  def verify(ssm, rs):
    _, *out = replay_split.replay_verify_split(
        ssm, *(rs[n] for n in RINGS), *_window(x), slot_ids, *after, tuning=stream,
        dot_precision="default", interpret=interpret)
    return ssm, dict(zip(RINGS, out))

  def apart(c):
    ssm, rs = c
    folded = kern.fold(ssm, *(rs[n] for n in fold_kernels.RING_NAMES), slot_ids, count, base,
                       tuning=tuning)
    return verify(folded, rs)

  apart_t, _ = time_calls(jax.jit(apart, donate_argnums=0), fresh(), reps=reps)
  plain_t, _ = time_calls(jax.jit(lambda c: verify(*c), donate_argnums=0), fresh(), reps=reps)
  candidates = {replay_split.stream_fold_block_v(stream, tuning),
                *(stream.block_v // n for n in STREAM_FOLD_SPLITS)}
  tiles = sorted(n for n in candidates if 0 < n <= stream.block_v)
  loops = [(n, pf, il, None) for n in tiles for pf, il in STREAM_FOLD_LOOPS
           if n < stream.block_v or not il]
  if prefetch_levels:
    loops = [(replay_split.stream_fold_block_v(stream, tuning), replay_split.STREAM_FOLD_PREFETCH,
              replay_split.STREAM_FOLD_INTERLEAVE, level) for level in prefetch_levels]
  for fold_block_v, prefetch, interleave, level in loops:

    def fused(c, counts, fbv=fold_block_v, pf=prefetch, il=interleave, lvl=level):
      ssm, rs = c
      _, ssm, *out = replay_split.fold_replay_verify_split(
          ssm, *(rs[n] for n in RINGS), *_window(x), slot_ids, *after, counts, base,
          tuning=stream, fold_tuning=tuning, fold_block_v=fbv, prefetch=pf,
          fold_interleave=il, fold_prefetch_records_to=lvl, dot_precision="default",
          interpret=interpret)
      return ssm, dict(zip(RINGS, out))

    fused = jax.jit(fused, donate_argnums=0)
    state = fused(fresh(), count)
    default = (stream == kern.replay_tuning(gdn.head_v_dim, T, B)
               and fold_block_v == replay_split.stream_fold_block_v(stream, tuning)
               and prefetch == replay_split.STREAM_FOLD_PREFETCH
               and interleave == replay_split.STREAM_FOLD_INTERLEAVE
               and level in (None, replay_split.STREAM_FOLD_PREFETCH_RECORDS_TO))
    row = dict(kernel=f"stream_fold_T{T}", B=B, n_fold=n_fold,
               stream=dataclasses.asdict(stream), fold_block_v=fold_block_v, prefetch=prefetch,
               interleave=interleave, prefetch_records_to=level, default=default,
               fold_bitwise=bool(jnp.array_equal(state[0], expected)))
    t, state = time_calls(lambda c: fused(c, count), state, reps=reps)
    idle, _ = time_calls(lambda c: fused(c, jnp.zeros_like(count)), state, reps=reps)
    yield dict(row, fused_us=round(t.median_us, 1), apart_us=round(apart_t.median_us, 1),
               idle_us=round(idle.median_us, 1), plain_us=round(plain_t.median_us, 1),
               kernel_us=t.by_kernel(), apart_kernel_us=apart_t.by_kernel())


FAMILIES = ("state", *FOLD_FAMILIES, "stream-fold", "stream-fold-prefetch", "replay",
            "coefficients", "streams", "vec-tiles")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument("--batch", type=int, nargs="+", default=[256], help="batch sizes, in turn")
  p.add_argument("--reps", type=int, default=15)
  p.add_argument("--out", default="sweep.json")
  p.add_argument("--only", nargs="+", choices=FAMILIES,
                 help="sweep these families only (coefficients: the split form's "
                      "coefficients kernel variants, without the other forms; streams: its "
                      "stream's launches; fold-tunings: the fold's tile launches alone; "
                      "fold-orders: the orders of a fold record's loads; fold-prefetch and "
                      "stream-fold-prefetch: the cache prefetches of the fold kernel and of "
                      "the stream's fold; vec-tiles: the decode's vector form per tile)")
  p.add_argument("--knobs", nargs="+", metavar="NAME",
                 help="coefficients: only the variants that set these keyword arguments of "
                      "replay_split.replay_verify_split (e.g. coefficient_key_mma)")
  p.add_argument("--T", type=int, nargs="+", default=[4, 1], dest="tokens",
                 help="window tokens of the replay, coefficients and streams families "
                      "(1: decode)")
  p.add_argument("--backend", choices=bench.BACKENDS, default="pallas")
  p.add_argument("--budget-s", type=float, default=float("inf"),
                 help="stop after the row that crosses this many seconds")
  p.add_argument("--tiny", action="store_true", help="tiny geometry: a smoke run on CPU")
  p.add_argument("--checkpoint-copy", action="store_true",
                 help="replay, coefficients, streams and vec-tiles: verify from the "
                      "checkpoint's bf16 copy (SpecConfig.checkpoint_copy)")
  bench_timing.add_l2_flush_option(p)
  args = p.parse_args(argv)
  # The flush before each timed call: #4's B=64 reading is judged under the read flush (NOTES
  # run 36), whose clean lines leave a launch no write-back to pay.
  with bench.knobs_set({(bench_timing, "L2_FLUSH"): args.l2_flush}):
    return _sweep(args)


def _sweep(args) -> int:
  kernel_backend.round_cpu_products_apart()  # the bitwise checks on a CPU (before any array)
  gdn = bench.TINY if args.tiny else bench.GEOMETRY
  rows = []
  start = time.monotonic()
  gens = []
  only = set(args.only or FAMILIES) - (
      {"coefficients", "streams", "fold-orders", "fold-prefetch", "stream-fold-prefetch",
       "vec-tiles"}
      if not args.only else set())
  for B in args.batch:
    if "state" in only:
      gens.append(sweep_state(gdn, B, args.reps, backend=args.backend))
    if args.backend == "pallas":
      # "fold" includes the tunings; "fold-orders" is apart
      gens += [sweep_fold(gdn, B, args.reps, family=f) for f in FOLD_FAMILIES
               if f in only and not (f == "fold-tunings" and "fold" in only)]
    if "stream-fold" in only and args.backend == "pallas":
      gens.append(sweep_stream_fold(gdn, B, args.reps))
    if "stream-fold-prefetch" in only and args.backend == "pallas":
      gens.append(sweep_stream_fold(gdn, B, args.reps,
                                    prefetch_levels=fold_kernels.PREFETCH_RECORDS_TO))
    if "replay" in only or "coefficients" in only:
      forms = "replay" in only
      gens += [sweep_replay(gdn, B, T, 8, args.reps, backend=args.backend, forms=forms,
                            knobs=args.knobs, copy=args.checkpoint_copy) for T in args.tokens]
    if "vec-tiles" in only:
      gens.append(sweep_replay(gdn, B, 1, 8, args.reps, backend=args.backend, vec_tiles=True,
                               copy=args.checkpoint_copy))
    if "streams" in only and args.backend == "pallas":
      gens += [sweep_replay(gdn, B, T, 8, args.reps, forms=False, streams=True,
                            copy=args.checkpoint_copy) for T in args.tokens]
  for gen in gens:
    for row in gen:
      rows.append(row)
      print(json.dumps(row), flush=True)
      with open(args.out, "w") as f:  # after every row: a run cut short keeps what it measured
        json.dump(dict(device=jax.devices()[0].device_kind, jax=jax.__version__,
                       tile_grid=kernel_backend.TILE_GRID, l2_flush=args.l2_flush,
                       rows=rows), f, indent=1)
      if time.monotonic() - start > args.budget_s:
        print(f"stopping: the {args.budget_s} s budget is spent", flush=True)
        return 0
  return 0


if __name__ == "__main__":
  sys.exit(main())
