"""Kernel and step benchmarks against the copy-bandwidth roofline (GPU).

One process measures the device-to-device copy bandwidth, then the median device
time of every path at the anchor geometry (HV=32, H=16, K=V=128, T=4, L=16, fp32
checkpoint, bf16 activations and rings; `shared/research/anchor-bench.md`), the
minimal bytes each path must move, the effective TB/s and the percentage of the
copy bandwidth. Results go to a JSON file (date, GPU, jax version) and a table.

    python -m replayssm_jax.bench.kernels --out benchmarks/results.json

Paths (per layer; ``wp`` = write_pos of the rows; ``--paths`` times some groups only):
  rec_decode, rec_verify, rec_commit          the recurrent baseline (kernels / XLA commit)
  rssm_verify(wp=8), exact_fold(wp=12)        the ReplaySSM kernels alone
  rssm_step_nf(wp=8), rssm_step_f(wp=12)      whole `ssm.verify` steps, all rows in one phase
  rssm_step_mixed                             a third folding at wp 12, the rest verifying at 4 and 8
  rssm_traffic                                verify + commit steps, rows out of phase, random acceptance
  rssm_decode_cycle(L), rec_decode            ReplaySSM decode amortised over a whole ring cycle
  rssm_decode_spread(L)                       the same cycle with the rows out of phase

Every call starts with L2 evicted (``--l2-flush``); a call of several steps (traffic, decode)
evicts it between its steps too (``--l2-flush-steps``), so a small batch's state is not read
from L2 in the steps after the first (until run 36 it was: B=16's 32 MiB of checkpoints).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import datetime
import functools
import importlib
import json
import math
import platform
import sys
import time
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from replayssm_jax import GDNConfig, SpecConfig, ssm
from replayssm_jax.bench import timing as bench_timing
from replayssm_jax.bench.timing import Timing, time_calls
from replayssm_jax.kernels import backend as kernel_backend
from replayssm_jax.kernels import fold as fold_kernels
from replayssm_jax.kernels import recurrent as recurrent_kernels
from replayssm_jax.kernels import replay_split
from replayssm_jax.kernels import replay_verify as replay_kernels
from replayssm_jax.kernels.backend import KernelTuning
from replayssm_jax.state import ReplayCache

GEOMETRY = GDNConfig(num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128,
                     hidden_size=2048, num_layers=1, num_gdn_layers=1)
# For a CPU smoke run of every code path (`--tiny`); its numbers mean nothing.
TINY = GDNConfig(num_k_heads=1, num_v_heads=2, head_k_dim=16, head_v_dim=16, hidden_size=32,
                 num_layers=1, num_gdn_layers=1)
ACT = jnp.bfloat16
BACKENDS = ("pallas", "triton")


@dataclasses.dataclass(frozen=True)
class Kernels:
  """One backend's kernels and default launches, as `ssm` picks them (`ssm._kernel`), called
  alike: the Pallas signatures without ``interpret``."""

  backend: str
  recurrent_verify: Callable
  recurrent_decode: Callable
  fold: Callable
  replay_verify: Callable
  state_tuning: Callable[[int], KernelTuning]  # V -> the recurrent kernels' and fold's tuning
  replay_tuning: Callable[[int, int, int], KernelTuning]  # V, T, B -> the replay verify's


def kernels_for(backend: str) -> Kernels:
  """The kernels of ``backend`` ("pallas" or "triton"; triton needs jax-triton and a GPU)."""
  if backend not in BACKENDS:
    raise ValueError(f"backend={backend!r} is not benchmarked; use one of {BACKENDS}.")
  spec = SpecConfig(backend=backend)
  pick = functools.partial(ssm._kernel, spec)
  return Kernels(
      backend, pick(recurrent_kernels.recurrent_verify, recurrent_kernels.recurrent_verify_reference),
      pick(recurrent_kernels.recurrent_decode, recurrent_kernels.recurrent_decode_reference),
      pick(fold_kernels.fold, fold_kernels.fold_reference),
      pick(replay_kernels.replay_verify, replay_kernels.replay_verify_reference),
      functools.partial(ssm.default_state_tuning, spec),
      functools.partial(ssm.default_replay_tuning, spec))


@dataclasses.dataclass(frozen=True)
class Bytes:
  """Minimal HBM bytes per request (anchor-bench.md "Byte models"), for bf16 activations/rings.
  With ``copy`` (`SpecConfig.checkpoint_copy`) the verify reads the checkpoint's bf16 copy
  and the fold writes it too."""

  gdn: GDNConfig
  T: int
  copy: bool = False

  @property
  def S(self):  # one fp32 state
    g = self.gdn
    return g.num_v_heads * g.head_v_dim * g.head_k_dim * 4

  @property
  def S_read(self):  # the checkpoint as the replay verify reads it
    return self.S // 2 if self.copy else self.S

  def tok_in(self):  # q, k, v, a, b
    g = self.gdn
    return (2 * g.num_k_heads * g.head_k_dim + g.num_v_heads * g.head_v_dim + 2 * g.num_v_heads) * 2

  def tok_out(self):
    return self.gdn.num_v_heads * self.gdn.head_v_dim * 2

  def io(self, T=None):
    return (T or self.T) * (self.tok_in() + self.tok_out())

  def hist_rec(self):  # d + k_hat (bf16) + g (f32), read per history record
    g = self.gdn
    return g.num_v_heads * g.head_v_dim * 2 + g.num_k_heads * g.head_k_dim * 2 + g.num_v_heads * 4

  def win_rec(self):  # d, raw v, k_hat, raw k, g, beta written per window token
    g = self.gdn
    return 2 * g.num_v_heads * g.head_v_dim * 2 + 2 * g.num_k_heads * g.head_k_dim * 2 + 2 * g.num_v_heads * 4

  def raw_rec(self):  # raw k, raw v, g, beta read per folded record
    g = self.gdn
    return g.num_k_heads * g.head_k_dim * 2 + g.num_v_heads * g.head_v_dim * 2 + 2 * g.num_v_heads * 4

  def rec_verify(self):
    return self.S + self.T * self.S + self.io()

  def rec_decode(self):
    return 2 * self.S + self.io(1)

  def rssm_verify(self, wp, T=None):
    T = T or self.T
    return self.S_read + self.io(T) + wp * self.hist_rec() + T * self.win_rec()

  def fold(self, wp):
    return 2 * self.S + (self.S // 2 if self.copy else 0) + wp * self.raw_rec()

  def rssm_step(self, wp, flush, T=None):
    # The fused minimum: a flush row reads its checkpoint once and writes it (and its copy)
    # once.
    if not flush:
      return self.rssm_verify(wp, T)
    return self.fold(wp) + self.rssm_verify(0, T) - self.S_read


def copy_pass(nbytes: int, reps: int = 20) -> Timing:
  """The timing of one elementwise pass in place over a donated fp32 array of ``nbytes``
  bytes: ``nbytes`` read and ``nbytes`` written in one launch."""
  step = jax.jit(lambda x: x + 1.0, donate_argnums=0)
  timing, _ = time_calls(step, jnp.arange(nbytes // 4, dtype=jnp.float32), reps=reps)
  return timing


def copy_bandwidth(gib: float = 4.0) -> tuple[float, Timing]:
  """Bytes read + written per second of an elementwise pass over a ``gib`` GiB fp32 array."""
  nbytes = int(gib * 2**30) // 4 * 4
  timing = copy_pass(nbytes)
  return 2 * nbytes / (timing.median_us * 1e-6), timing


def _inputs(rng, B, T, gdn=GEOMETRY):
  f = lambda *s: jnp.asarray(rng.standard_normal(s, np.float32)).astype(ACT)
  H, HV, K, V = gdn.num_k_heads, gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim
  return dict(q=f(B, T, H, K), k=f(B, T, H, K), v=f(B, T, HV, V), a=f(B, T, HV), b=f(B, T, HV),
              A_log=jnp.log(jnp.asarray(rng.uniform(0.01, 0.1, HV), jnp.float32)),
              dt_bias=jnp.asarray(0.3 * rng.standard_normal(HV), jnp.float32))


def _window(x):
  return x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"]


def _replay_cache(rng, gdn, spec, B, write_pos, is_flush):
  """A ReplayCache of B slots with filled rings and the given cursors."""
  cache = ssm.init(gdn, spec, B, dtype=ACT)
  r = lambda a: jnp.asarray(rng.standard_normal(a.shape, np.float32) * 0.3).astype(a.dtype)
  g = -jnp.asarray(rng.uniform(0.003, 0.15, cache.ring_g.shape), jnp.float32)
  S = r(cache.ssm)
  return dataclasses.replace(
      cache, ssm=S, ring_d=r(cache.ring_d), ring_k=r(cache.ring_k), ring_g=g,
      ring_beta=jnp.asarray(rng.uniform(0, 1, cache.ring_beta.shape), jnp.float32),
      ring_rawk=r(cache.ring_rawk), ring_rawv=r(cache.ring_rawv),
      write_pos=jnp.asarray(write_pos, jnp.int32),
      cache_base=jnp.asarray(rng.integers(0, spec.ring_len, B), jnp.int32),
      is_flush=jnp.asarray(is_flush, bool),
      ssm_copy=None if cache.ssm_copy is None else S.astype(cache.ssm_copy.dtype))


def _restoring(step, cursors_of):
  """``step`` followed by restoring the cursors, so every call sees the same phases."""
  def run(cache):
    saved = cursors_of(cache)
    cache = step(cache)
    return dataclasses.replace(cache, **saved)
  return jax.jit(run, donate_argnums=0)


def _steps_restoring(step, step_args, cursors_of):
  """One jitted call: ``cache = step(cache, *args)`` for each ``args`` of ``step_args``, L2
  flushed between two steps (`timing.flush_between_steps`, a no-op without a flush state),
  then the cursors restored, so every call sees the same phases. Its state is ``(cache,
  flush state)``, both donated, the flush state from `timing.steps_flush_state`."""
  def run(state):
    cache, flush = state
    saved = cursors_of(cache)
    for i, args in enumerate(step_args):
      if i:
        cache, flush = bench_timing.flush_between_steps(cache, flush)
      cache = step(cache, *args)
    return dataclasses.replace(cache, **saved), flush
  return jax.jit(run, donate_argnums=0)


def _cursors(cache: ReplayCache):
  return dict(write_pos=cache.write_pos, cache_base=cache.cache_base, is_flush=cache.is_flush)


def fold_together_records(share: float | None, L: int) -> int | None:
  """`SpecConfig.fold_together` for a ring of L records from a share of the ring (None: off)."""
  return None if share is None else min(L, max(1, round(share * L)))


TRAFFIC_STEPS = 24  # verify + commit steps per call of the traffic path
# The paths `bench_batch` can time, in groups (``--paths``), each independent of the others.
PATH_GROUPS = {
    "recurrent": ("rec_verify", "rec_commit", "rec_decode"),
    "kernels": ("rssm_verify", "copy_verify_bytes", "exact_fold"),
    "steps": ("rssm_step_nf", "rssm_step_f", "rssm_step_mixed"),
    "traffic": ("rssm_traffic",),
    "decode": ("rssm_decode_cycle", "rssm_decode_spread"),
}


def traffic_start(rng, B: int, T: int, L: int):
  """Cursors of rows out of phase: ``write_pos`` anywhere a commit can leave it (0..L-T), and
  ``is_flush`` as the commit would set it."""
  write_pos = rng.integers(0, L - T + 1, B)
  return write_pos, write_pos + 2 * T > L


def traffic_phases(cache: ReplayCache, accepted: np.ndarray, spec: SpecConfig):
  """``(write_pos, folds)`` of every row at every step of verify + commit with ``accepted
  [steps, B]`` from the cache's cursors (slots 0..B-1), for the byte model: `ssm`'s own
  cursor functions (the fold plan, then the commit formula), without the kernels."""
  slot_ids = jnp.arange(len(accepted[0]), dtype=jnp.int32)
  for acc in accepted:
    count, _, cursors = ssm._fold_plan(cache, slot_ids, spec)
    yield from zip(np.asarray(cache.write_pos).tolist(), np.asarray(count > 0).tolist())
    cursors = ssm._advanced(*cursors, jnp.asarray(acc), spec.ring_len, spec.draft_tokens)
    cache = dataclasses.replace(cache, **dict(zip(("write_pos", "cache_base", "is_flush"),
                                                  cursors)))


def bench_batch(B: int, *, gdn: GDNConfig = GEOMETRY, T: int = 4, L: int = 16, reps: int = 30,
                decode_rings=(8, 16, 32), backend: str = "pallas",
                fold_together: float | None = None, paths=tuple(PATH_GROUPS),
                checkpoint_copy=None):
  """The paths of ``paths`` (groups of `PATH_GROUPS`, default all) at batch size ``B`` on
  ``backend``'s kernels; yields (name, wp, L, timing, bytes). ``fold_together``: the ReplaySSM
  rows with this share of a ring fold along with a flush row (`SpecConfig.fold_together`,
  `fold_together_records`); ``checkpoint_copy``: theirs (`SpecConfig.checkpoint_copy`)."""
  unknown = set(paths) - PATH_GROUPS.keys()
  if unknown:
    raise ValueError(f"unknown path groups {sorted(unknown)}; use some of {list(PATH_GROUPS)}.")
  rng = np.random.default_rng(B)
  kern = kernels_for(backend)
  tuning = kern.state_tuning(gdn.head_v_dim)
  nbytes = Bytes(gdn, T, copy=checkpoint_copy is not None)
  slot_ids = jnp.arange(B, dtype=jnp.int32)
  x = _inputs(rng, B, T, gdn)
  x1 = _inputs(rng, B, 1, gdn)
  S0 = jnp.asarray(0.3 * rng.standard_normal((B, *gdn.state_shape), np.float32))

  # Recurrent baseline: the kernels alone, and the XLA commit (gather + scatter of B states).
  if "recurrent" in paths:
    rec = SpecConfig(draft_tokens=T, verify_mode="recurrent", backend=backend)
    verify = jax.jit(lambda inter, ids: kern.recurrent_verify(
        S0, inter, *_window(x), ids, tuning=tuning)[1], donate_argnums=0)
    t, inter = time_calls(verify, jnp.zeros((B, T, *gdn.state_shape), jnp.float32),
                          args=(slot_ids,), reps=reps)
    yield "rec_verify", 0, 0, t, B * nbytes.rec_verify()
    cache = dataclasses.replace(ssm.init(gdn, rec, B), intermediate=inter)
    accepted = jnp.full((B,), T, jnp.int32)
    t, cache = time_calls(lambda c: ssm.commit(c, slot_ids, accepted, rec), cache, reps=reps)
    yield "rec_commit", 0, 0, t, B * 2 * nbytes.S
    del cache, inter
    decode = jax.jit(lambda s, ids: kern.recurrent_decode(
        s, *_window(x1), ids, tuning=tuning)[1], donate_argnums=0)
    t, _ = time_calls(decode, S0 + 0, args=(slot_ids,), reps=reps)
    yield "rec_decode", 0, 0, t, B * nbytes.rec_decode()

  # ReplaySSM kernels alone.
  spec = SpecConfig(draft_tokens=T, ring_len=L, verify_mode="replayssm", backend=backend,
                    fold_together=fold_together_records(fold_together, L),
                    checkpoint_copy=checkpoint_copy)
  cache = _replay_cache(rng, gdn, spec, B, np.full(B, 8), np.zeros(B, bool))
  rings = replay_kernels.RING_NAMES

  def replay_only(c, ids):
    _, *out = kern.replay_verify(
        c.verify_ssm, *(getattr(c, n) for n in rings), *_window(x), ids, c.write_pos, c.cache_base,
        tuning=ssm.default_replay_tuning(spec, gdn.head_v_dim, T, B),
        dot_precision=spec.dot_precision)
    return dataclasses.replace(c, **dict(zip(rings, out)))

  wp_fold = L - T

  def fold_only(c, ids, count):
    args = (c.ssm, c.ring_rawk, c.ring_rawv, c.ring_g, c.ring_beta, ids, count, c.cache_base)
    if c.ssm_copy is None:
      return dataclasses.replace(c, ssm=kern.fold(*args, tuning=tuning))
    S, S_copy = kern.fold(*args, tuning=tuning, ssm_copy=c.ssm_copy)
    return dataclasses.replace(c, ssm=S, ssm_copy=S_copy)

  if "kernels" in paths:  # the slot ids (and fold counts) as inputs, as a server passes them
    t, cache = time_calls(jax.jit(replay_only, donate_argnums=0), cache, args=(slot_ids,),
                          reps=reps)
    yield "rssm_verify", 8, L, t, B * nbytes.rssm_verify(8)
    # The verify's bytes moved by the copy probe's pass, at this size: with the per-call costs
    # (launch, ramp, tail, L2 write-back) that the 4 GiB probe spreads over 8 GiB. H200 reads
    # of the checkpoint (tools/read_ceiling.py, runs 26-27) fit 8.6-9.1 us a call + bytes at
    # 4.29-4.34 TB/s, over B=64 and 256.
    half = B * nbytes.rssm_verify(8) // 8 * 4  # as many bytes read as written
    yield "copy_verify_bytes", 0, 0, copy_pass(half, reps), 2 * half
    t, cache = time_calls(jax.jit(fold_only, donate_argnums=0), cache,
                          args=(slot_ids, jnp.full((B,), wp_fold, jnp.int32)), reps=reps)
    yield "exact_fold", wp_fold, L, t, B * nbytes.fold(wp_fold)

  # Whole verify steps (fold + verify + cursor bookkeeping), one jitted call each.
  step = _restoring(lambda c: ssm.verify(c, *_window(x), slot_ids, spec)[1], _cursors)
  phases = {
      "rssm_step_nf": (np.full(B, 8), np.zeros(B, bool)),
      "rssm_step_f": (np.full(B, wp_fold), np.ones(B, bool)),
      "rssm_step_mixed": (np.array([wp_fold, 4, 8])[np.arange(B) % 3], np.arange(B) % 3 == 0),
  }
  if "steps" in paths:
    for name, (wp, flush) in phases.items():
      cache = dataclasses.replace(cache, write_pos=jnp.asarray(wp, jnp.int32),
                                  is_flush=jnp.asarray(flush))
      t, cache = time_calls(step, cache, reps=reps)
      model = sum(nbytes.rssm_step(int(w), bool(f)) for w, f in zip(wp, flush))
      yield name, int(np.max(wp)) if name != "rssm_step_mixed" else -1, L, t, model
  # Verify traffic: rows out of phase, a random acceptance per row and step, no cursor restore
  # between the steps of a call (only before each call, so every call does the same work).
  if "traffic" in paths:
    c = _replay_cache(rng, gdn, spec, B, *traffic_start(rng, B, T, L))
    accepted = rng.integers(1, T + 1, (TRAFFIC_STEPS, B)).astype(np.int32)

    def traffic_step(c, acc):
      return ssm.commit(ssm.verify(c, *_window(x), slot_ids, spec)[1], slot_ids, acc, spec)

    model = sum(nbytes.rssm_step(w, f) for w, f in traffic_phases(c, accepted, spec))
    traffic = _steps_restoring(traffic_step, [(jnp.asarray(acc),) for acc in accepted], _cursors)
    t, _ = time_calls(traffic, (c, bench_timing.steps_flush_state()), reps=max(5, reps // 3))
    yield "rssm_traffic", -1, L, t.per_call(TRAFFIC_STEPS), model / TRAFFIC_STEPS
  del cache

  # ReplaySSM decode over a whole ring cycle (flush rule with T = 1: L-1 steps per fold).
  if "decode" in paths:
    for L_dec in decode_rings:
      dspec = SpecConfig(draft_tokens=1, ring_len=L_dec, verify_mode="replayssm", backend=backend,
                         fold_together=fold_together_records(fold_together, L_dec),
                         checkpoint_copy=checkpoint_copy)
      steps = L_dec - 1

      cycle = _steps_restoring(
          lambda c, dspec=dspec: ssm.decode(c, *_window(x1), slot_ids, dspec)[1], [()] * steps,
          _cursors)

      # In phase: every row at the start of its cycle, a full history waiting to be folded, so
      # one call = fold + L-1 decodes. Spread: row r starts (r mod L-1) steps into its cycle, so
      # at each step a 1/(L-1) of the rows fold (rows of real traffic are out of phase). Over
      # the L-1 steps of a call each row goes through every phase once: the same bytes.
      phase = np.arange(B) % steps
      starts = {"rssm_decode_cycle": (np.full(B, L_dec - 1), np.ones(B, bool)),
                "rssm_decode_spread": (np.where(phase == 0, L_dec - 1, phase), phase == 0)}
      model = B * (nbytes.fold(L_dec - 1) - nbytes.S
                   + sum(nbytes.rssm_verify(w, 1) for w in range(steps)))
      for name, start in starts.items():
        c = _replay_cache(rng, gdn, dspec, B, *start)
        t, _ = time_calls(cycle, (c, bench_timing.steps_flush_state()), reps=max(5, reps // 3))
        yield name, -1, L_dec, t.per_call(steps), model / steps


def _rows_or_none(text: str) -> int | None:
  """A batch size, or ``none`` (argparse type of ``--triton-split-min-batch``)."""
  if text.lower() == "none":
    return None
  rows = int(text)
  if rows < 1:
    raise argparse.ArgumentTypeError(f"{text!r} is no batch size: give rows >= 1 or 'none'.")
  return rows


def parse_knob(text: str) -> tuple[object, str, object]:
  """``MODULE.NAME=VALUE`` (argparse type of ``--set``): a constant ``NAME`` of the module
  ``replayssm_jax.MODULE``, set to the Python literal ``VALUE`` for the run."""
  target, sep, literal = text.partition("=")
  module_name, _, name = target.rpartition(".")
  if not sep or not module_name or not name:
    raise argparse.ArgumentTypeError(f"{text!r}: expected MODULE.NAME=VALUE, e.g. "
                                     "kernels.triton.replay_split.WINDOW_MMA=False")
  try:
    module = importlib.import_module(f"replayssm_jax.{module_name}")
  except ImportError as e:
    raise argparse.ArgumentTypeError(f"{text!r}: no module replayssm_jax.{module_name} ({e})")
  if not hasattr(module, name):
    raise argparse.ArgumentTypeError(f"{text!r}: replayssm_jax.{module_name} has no {name}")
  try:
    value = ast.literal_eval(literal)
  except (ValueError, SyntaxError):
    raise argparse.ArgumentTypeError(f"{text!r}: {literal!r} is not a Python literal")
  return module, name, value


@contextlib.contextmanager
def knobs_set(knobs: dict[tuple[object, str], object]) -> Iterator[None]:
  """Module constants ``{(module, name): value}`` set for the block, then restored. `ssm` and
  the kernels read them when they trace, so the block starts and ends with no trace cached."""
  defaults = {knob: getattr(*knob) for knob in knobs}
  for (module, name), value in knobs.items():
    setattr(module, name, value)
  jax.clear_caches()
  try:
    yield
  finally:
    for (module, name), value in defaults.items():
      setattr(module, name, value)
    jax.clear_caches()


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64, 256, 512])
  p.add_argument("--reps", type=int, default=30)
  p.add_argument("--out", default="benchmarks/results.json")
  p.add_argument("--copy-gib", type=float, default=4.0, help="size of the copy-bandwidth probe")
  p.add_argument("--tiny", action="store_true", help="tiny geometry: a smoke run of every path")
  p.add_argument("--backend", choices=BACKENDS, default="pallas", help="the kernels to time")
  p.add_argument("--decode-rings", type=int, nargs="*", default=[8, 16, 32],
                 help="ring lengths of the ReplaySSM decode cycle")
  p.add_argument("--paths", nargs="+", choices=PATH_GROUPS, default=list(PATH_GROUPS),
                 help="the groups of paths to time (default: all)")
  p.add_argument("--budget-s", type=float, default=float("inf"),
                 help="start no new batch size after this many seconds (results so far are kept)")
  p.add_argument("--fold-together", type=float, default=None, metavar="SHARE",
                 help="ReplaySSM rows holding this share of the ring fold along with a step's "
                      "flush rows (SpecConfig.fold_together; default: only flush rows fold)")
  p.add_argument("--checkpoint-copy", choices=("bfloat16",), default=None,
                 help="ReplaySSM keeps a bf16 copy of each checkpoint, which verify and decode "
                      "read (SpecConfig.checkpoint_copy; default: none)")
  p.add_argument("--fold-first", action=argparse.BooleanOptionalAction,
                 default=replay_split.STREAM_FOLD_FIRST,
                 help="launch the folding rows' stream programs first "
                      "(replay_split.STREAM_FOLD_FIRST)")
  p.add_argument("--stream-fold", action=argparse.BooleanOptionalAction, default=None,
                 help="the split replay verify folds the flush rows in its checkpoint stream, "
                      "not in a fold kernel before it, at every batch size, in windows and "
                      "decode alike (default: ssm.FUSE_FOLD_BELOW, by kind of step and size)")
  p.add_argument("--tile-grid", choices=kernel_backend.TILE_GRIDS,
                 default=kernel_backend.TILE_GRID,
                 help="the grid order of the per-row kernels (kernels.backend.TILE_GRID)")
  p.add_argument("--one-kernel-fold", action=argparse.BooleanOptionalAction,
                 default=ssm.FUSE_FOLD_ONE_KERNEL,
                 help="the one-kernel replay verify forms (B < 16 windows, B < 64 decode) fold "
                      "the flush rows in their programs (ssm.FUSE_FOLD_ONE_KERNEL)")
  p.add_argument("--fold-prefetch-at", choices=fold_kernels.PREFETCH_ATS,
                 default=fold_kernels.FOLD_PREFETCH_AT,
                 help="where the fold kernel loads the next record: before or after applying "
                      "one (kernels.fold.FOLD_PREFETCH_AT)")
  p.add_argument("--fold-prefetch-records-to", choices=fold_kernels.PREFETCH_RECORDS_TO,
                 default=fold_kernels.FOLD_PREFETCH_RECORDS_TO,
                 help="the cache level the fold kernel's programs prefetch their records to "
                      "(kernels.fold.FOLD_PREFETCH_RECORDS_TO)")
  p.add_argument("--fold-prefetch-tile-ahead", type=int,
                 default=fold_kernels.FOLD_PREFETCH_TILE_AHEAD, metavar="PROGRAMS",
                 help="the fold kernel prefetches the checkpoint tile of the program this many "
                      "launches later into L2, 0 for none (kernels.fold.FOLD_PREFETCH_TILE_AHEAD)")
  p.add_argument("--stream-fold-prefetch-records-to", choices=fold_kernels.PREFETCH_RECORDS_TO,
                 default=replay_split.STREAM_FOLD_PREFETCH_RECORDS_TO,
                 help="the same for the folding programs of the split verify's stream "
                      "(kernels.replay_split.STREAM_FOLD_PREFETCH_RECORDS_TO)")
  p.add_argument("--triton-split-min-batch", nargs=2, type=_rows_or_none, default=None,
                 metavar=("WINDOW", "DECODE"),
                 help="rows from which the triton replay verify runs its split form, for windows "
                      "and for decode, 'none' for never (--backend triton; default: "
                      "kernels.triton.replay_verify.SPLIT_MIN_BATCH)")
  p.add_argument("--stream-early", choices=replay_split.STREAM_EARLIES,
                 default=replay_split.STREAM_EARLY,
                 help="what of the split verify stream's epilogue comes before its K-loop "
                      "(kernels.replay_split.STREAM_EARLY)")
  bench_timing.add_l2_flush_option(p)
  p.add_argument("--l2-flush-steps", action=argparse.BooleanOptionalAction,
                 default=bench_timing.FLUSH_BETWEEN_STEPS,
                 help="the same pass between the steps of a call of several (traffic, decode), "
                      "as the other layers of a model evict L2 between two steps of one "
                      "(bench.timing.FLUSH_BETWEEN_STEPS)")
  p.add_argument("--set", type=parse_knob, action="append", default=[], metavar="MODULE.NAME=VALUE",
                 help="set a knob of replayssm_jax.MODULE for the run (repeatable), e.g. "
                      "kernels.triton.replay_split.HEADS_LOOP=False")
  args = p.parse_args(argv)
  fuse_fold_below = (dict(ssm.FUSE_FOLD_BELOW) if args.stream_fold is None
                     else dict.fromkeys(ssm.FUSE_FOLD_BELOW, None if args.stream_fold else 0))
  if args.triton_split_min_batch is not None and args.backend != "triton":
    p.error("--triton-split-min-batch applies to --backend triton only.")
  if args.fold_together is not None and not 0 < args.fold_together <= 1:
    p.error(f"--fold-together {args.fold_together} must be a share of the ring in (0, 1].")
  start = time.monotonic()
  gdn = TINY if args.tiny else GEOMETRY
  device = jax.devices()[0]
  bw, bw_timing = copy_bandwidth(args.copy_gib)
  print(f"copy bandwidth: {bw / 1e12:.3f} TB/s ({bw_timing.method})", flush=True)
  rows = []
  result = dict(date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                device=device.device_kind, platform=device.platform, jax=jax.__version__,
                python=platform.python_version(), copy_tbps=round(bw / 1e12, 3),
                copy_method=bw_timing.method, geometry=dataclasses.asdict(gdn), T=4, L=16,
                backend=args.backend, fold_together=args.fold_together,
                checkpoint_copy=args.checkpoint_copy, fold_first=args.fold_first,
                one_kernel_fold=args.one_kernel_fold,
                fuse_fold_below=fuse_fold_below, tile_grid=args.tile_grid,
                fold_prefetch_at=args.fold_prefetch_at,
                fold_prefetch_records_to=args.fold_prefetch_records_to,
                fold_prefetch_tile_ahead=args.fold_prefetch_tile_ahead,
                stream_fold_prefetch_records_to=args.stream_fold_prefetch_records_to,
                stream_early=args.stream_early, l2_flush=args.l2_flush,
                l2_flush_steps=args.l2_flush_steps,
                set={f"{module.__name__}.{name}": repr(value) for module, name, value in args.set},
                rows=rows)

  def save():
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)

  # Read when `ssm` traces its steps, so no step may be traced under other values.
  knobs = {(replay_split, "STREAM_FOLD_FIRST"): args.fold_first,
           (ssm, "FUSE_FOLD_ONE_KERNEL"): args.one_kernel_fold,
           (ssm, "FUSE_FOLD_BELOW"): fuse_fold_below,
           (kernel_backend, "TILE_GRID"): args.tile_grid,
           (fold_kernels, "FOLD_PREFETCH_AT"): args.fold_prefetch_at,
           (fold_kernels, "FOLD_PREFETCH_RECORDS_TO"): args.fold_prefetch_records_to,
           (fold_kernels, "FOLD_PREFETCH_TILE_AHEAD"): args.fold_prefetch_tile_ahead,
           (replay_split, "STREAM_FOLD_PREFETCH_RECORDS_TO"):
               args.stream_fold_prefetch_records_to,
           (replay_split, "STREAM_EARLY"): args.stream_early,
           (bench_timing, "L2_FLUSH"): args.l2_flush,
           (bench_timing, "FLUSH_BETWEEN_STEPS"): args.l2_flush_steps,
           **{(module, name): value for module, name, value in args.set}}
  if args.backend == "triton":
    # By sys.modules: the package's attribute of this name is the function, not the module.
    triton_forms = importlib.import_module("replayssm_jax.kernels.triton.replay_verify")
    if args.triton_split_min_batch is not None:
      knobs[(triton_forms, "SPLIT_MIN_BATCH")] = dict(
          zip(("window", "decode"), args.triton_split_min_batch))
    result["triton_split_min_batch"] = knobs.get((triton_forms, "SPLIT_MIN_BATCH"),
                                                 triton_forms.SPLIT_MIN_BATCH)
  with knobs_set(knobs):
    for B in args.batch:
      if time.monotonic() - start > args.budget_s:
        print(f"stopping before B={B}: the {args.budget_s} s budget is spent", flush=True)
        break
      for name, wp, L, t, model in bench_batch(B, gdn=gdn, reps=args.reps, backend=args.backend,
                                                 decode_rings=args.decode_rings,
                                                 fold_together=args.fold_together,
                                                 paths=args.paths,
                                                 checkpoint_copy=args.checkpoint_copy):
        tbps = model / (t.median_us * 1e-6) / 1e12
        rows.append(dict(kernel=name, B=B, wp=wp, L=L, median_us=round(t.median_us, 2),
                         p20_us=round(t.p20_us, 2), p80_us=round(t.p80_us, 2), reps=t.reps,
                         method=t.method, min_bytes=int(model), tbps=round(tbps, 3),
                         pct_copy=round(100 * tbps * 1e12 / bw, 1), kernels=list(t.kernels),
                         kernel_us=t.by_kernel(), wall_us=round(t.wall_us, 1),
                         # first start to last end: a host round trip inside the call (a
                         # conditional's predicate copied to the host) shows here, not in the sum
                         span_us=None if math.isnan(t.span_us) else round(t.span_us, 1)))
        r = rows[-1]
        span = "" if r["span_us"] is None else f"span {r['span_us']:.1f} us, "
        print(f"B={B:4d} {name:18s} wp={wp:3d} L={L:3d} {r['median_us']:10.1f} us "
              f"{r['tbps']:6.2f} TB/s {r['pct_copy']:5.1f}%  ({span}wall {r['wall_us']:.1f} us)",
              flush=True)
        save()  # after every row: a run cut short keeps what it measured
  save()
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
