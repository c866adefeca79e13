"""ReplaySSM against the recurrent baseline, step by step, through random schedules.

The committed state must not drift: whenever a fold has just run, the ReplaySSM
checkpoint equals the recurrent path's committed state bitwise (same backend,
same inputs; DESIGN section 4). Outputs agree within fp32 rounding on the CPU.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from conftest import TOLERANCE, rel_err
from replayssm_jax import GDNConfig, SpecConfig, ssm
from replayssm_jax.kernels.backend import SPLIT_MIN_BATCH, interpret_mode, replay_form

GDN = GDNConfig(num_k_heads=1, num_v_heads=2, head_k_dim=16, head_v_dim=16, hidden_size=32,
                num_layers=1, num_gdn_layers=1)
SLOTS = 6
# Value heads as wide as the state kernels' tiles x the stream's warps: the split form folds
# inside its stream kernel (`ssm._fuses_fold`).
GDN_WIDE = dataclasses.replace(GDN, head_v_dim=64)


@dataclasses.dataclass
class Pair:
  """The same requests driven through the recurrent and the ReplaySSM cache."""

  rec_spec: SpecConfig
  rep_spec: SpecConfig
  rec: object
  rep: object
  A_log: jax.Array
  dt_bias: jax.Array
  folds_checked: int = 0
  folded_along: int = 0  # of those, rows that folded along with a flush row (`fold_together`)

  @classmethod
  def create(cls, T, L, backend, rng, gdn=GDN, dtype=jnp.float32, fold_together=None,
             checkpoint_copy=None):
    rec_spec = SpecConfig(draft_tokens=T, ring_len=L, verify_mode="recurrent", backend=backend)
    rep_spec = SpecConfig(draft_tokens=T, ring_len=L, verify_mode="replayssm", backend=backend,
                          fold_together=fold_together, checkpoint_copy=checkpoint_copy)
    HV = gdn.num_v_heads
    return cls(rec_spec, rep_spec, ssm.init(gdn, rec_spec, SLOTS, dtype=dtype),
               ssm.init(gdn, rep_spec, SLOTS, dtype=dtype),
               jnp.log(jnp.asarray(rng.uniform(0.01, 0.2, HV), jnp.float32)),
               jnp.asarray(0.3 * rng.standard_normal(HV), jnp.float32))

  def reset(self, slot_ids, rng):
    S0 = jnp.asarray(0.3 * rng.standard_normal((len(slot_ids), *self.rec.ssm.shape[1:])), jnp.float32)
    ids = jnp.asarray(slot_ids, jnp.int32)
    self.rec = ssm.reset(self.rec, ids, S0, self.rec_spec)
    self.rep = ssm.reset(self.rep, ids, S0, self.rep_spec)

  def window(self, rng, B, T):
    H, (_, HV, V, K) = self.rep.ring_k.shape[1], self.rec.ssm.shape
    dtype = self.rep.ring_rawk.dtype
    f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32).astype(dtype)
    return f(B, T, H, K), f(B, T, H, K), f(B, T, HV, V), f(B, T, HV), f(B, T, HV)

  def step(self, slot_ids, accepted, x, *, decode=False):
    """One verify + commit (or decode) in both modes, with the invariants checked."""
    ids = jnp.asarray(slot_ids, jnp.int32)
    valid = np.asarray(slot_ids) >= 0
    rows = np.asarray(slot_ids)[valid]
    wp = np.asarray(self.rep.write_pos)[rows]
    flush = np.asarray(self.rep.is_flush)[rows]
    T = x[0].shape[1]
    L = self.rep_spec.ring_len
    # No window ever writes past the ring.
    assert np.all(np.where(flush, 0, wp) + T <= L), (wp, flush, T, L)
    rec_committed = np.array(self.rec.ssm)
    checkpoints = np.array(self.rep.ssm)  # copies: the steps donate the caches
    # The rows that fold: the flush rows, and with `fold_together` the rows with that many
    # records, when any row of the step folds.
    along = self.rep_spec.fold_together
    folding = flush | (flush.any() & (wp >= (along or L + 1)))
    if decode:
      o_rec, self.rec = ssm.decode(self.rec, *x, self.A_log, self.dt_bias, ids, self.rec_spec)
      o_rep, self.rep = ssm.decode(self.rep, *x, self.A_log, self.dt_bias, ids, self.rep_spec)
    else:
      o_rec, self.rec = ssm.verify(self.rec, *x, self.A_log, self.dt_bias, ids, self.rec_spec)
      o_rep, self.rep = ssm.verify(self.rep, *x, self.A_log, self.dt_bias, ids, self.rep_spec)
    # A fold has just run for the folding rows: its checkpoint is the recurrent committed state
    # from before this step, bitwise. Every other checkpoint is as it was, bitwise.
    folded = rows[folding & (wp > 0)]
    np.testing.assert_array_equal(np.asarray(self.rep.ssm)[folded], rec_committed[folded])
    kept = np.setdiff1d(np.arange(SLOTS), folded)
    np.testing.assert_array_equal(np.asarray(self.rep.ssm)[kept], checkpoints[kept])
    self.folds_checked += len(folded)
    self.folded_along += int(np.sum(folding & ~flush & (wp > 0)))
    copy = self.rep.ssm_copy
    if copy is not None:  # every checkpoint's copy is that checkpoint rounded, bitwise
      np.testing.assert_array_equal(np.asarray(copy), np.asarray(self.rep.ssm.astype(copy.dtype)))
    precision = "bf16" if copy is not None else self.rep_spec.dot_precision
    tol = TOLERANCE[(jnp.dtype(x[0].dtype).name, precision)]
    assert rel_err(o_rep[valid], o_rec[valid]) < tol
    np.testing.assert_array_equal(np.asarray(o_rep)[~valid], 0)
    if not decode:
      acc = jnp.asarray(accepted, jnp.int32)
      self.rec = ssm.commit(self.rec, ids, acc, self.rec_spec)
      self.rep = ssm.commit(self.rep, ids, acc, self.rep_spec)
    # The committed state (checkpoint + replayed history) tracks the recurrent one.
    all_slots = jnp.arange(SLOTS, dtype=jnp.int32)
    want = np.asarray(self.rec.ssm)
    got = np.asarray(ssm.materialize(self.rep, all_slots, self.rep_spec))
    assert rel_err(got, want) < 1e-6


def _schedules(T, steps=200):
  step = st.tuples(
      st.lists(st.integers(-1, SLOTS - 1), min_size=4, max_size=4),  # rows' slots (-1: padding)
      st.lists(st.integers(0, T), min_size=4, max_size=4),  # T - accepted per row
      st.integers(0, 15),  # 15: reset the step's slots first (a new request)
      st.booleans(),  # True: a plain decode step instead of a verify (when interleaving)
  )
  return st.tuples(st.integers(0, 2**31 - 1), st.lists(step, min_size=steps, max_size=steps))


def _distinct(slots):
  seen, out = set(), []
  for s in slots:
    out.append(-1 if s in seen or s < 0 else s)
    seen.add(s)
  return out


def _run_schedule(T, L, backend, schedule, *, interleave, fold_together=None,
                  checkpoint_copy=None, gdn=GDN):
  seed, steps = schedule
  rng = np.random.default_rng(seed)
  pair = Pair.create(T, L, backend, rng, gdn=gdn, fold_together=fold_together,
                     checkpoint_copy=checkpoint_copy)
  pair.reset(list(range(SLOTS)), rng)
  for slots, rejected, reset, decode in steps:
    slots = _distinct(slots)
    if reset == 15 and any(s >= 0 for s in slots):
      pair.reset([s for s in slots if s >= 0], rng)
    decode = decode and interleave
    pair.step(slots, [T - r for r in rejected], pair.window(rng, len(slots), 1 if decode else T),
              decode=decode)
  assert pair.folds_checked > 0
  return pair


RINGS = [(1, 2), (2, 4), (2, 8), (4, 8), (4, 16), (8, 16), (4, 32), (8, 32)]
# Minimal examples accept everything, so even the simplest schedule folds; no shrinking
# (a failure prints its seed and schedule, which is enough to replay it).
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)


@pytest.mark.parametrize("T,L", RINGS, ids=[f"T{T}-L{L}" for T, L in RINGS])
def test_schedule_bitwise_after_folds(T, L, backend):
  """Verify/commit schedules: rows 1-4 of 4 with padding, accepted 0..T, resets; 200 steps."""
  @settings(max_examples=2 if backend == "pallas" else 4, phases=NO_SHRINK)
  @given(_schedules(T))
  def run(schedule):
    _run_schedule(T, L, backend, schedule, interleave=False)

  run()


INTERLEAVED = [(1, 2), (2, 4), (4, 16), (8, 16)]


@pytest.mark.parametrize("T,L", INTERLEAVED, ids=[f"T{T}-L{L}" for T, L in INTERLEAVED])
def test_decode_verify_interleaved(T, L, backend):
  """Plain decode and speculative verify steps in any order, on one ring and cursor protocol."""
  @settings(max_examples=2, phases=NO_SHRINK)
  @given(_schedules(T, steps=300))
  def run(schedule):
    _run_schedule(T, L, backend, schedule, interleave=True)

  run()


# Rings with room for rows that are not flush rows yet (L > 2T: flush rows have more than L - 2T).
FOLD_TOGETHER = [(1, 8), (2, 8), (4, 16), (4, 32)]


@pytest.mark.parametrize("T,L", FOLD_TOGETHER, ids=[f"T{T}-L{L}" for T, L in FOLD_TOGETHER])
def test_fold_together_schedules(T, L, backend):
  """`SpecConfig.fold_together`: rows with at least L/4 records fold along with a step's flush
  rows. Decode and verify schedules as above: every fold, along or not, leaves the recurrent
  committed state, bitwise, and no other checkpoint moves."""
  along = []

  @settings(max_examples=3, phases=NO_SHRINK)
  @given(_schedules(T, steps=300))
  def run(schedule):
    pair = _run_schedule(T, L, backend, schedule, interleave=True, fold_together=L // 4)
    along.append(pair.folded_along)

  run()
  assert sum(along) > 0, along  # the simplest schedule has one row, with no row to fold along


def test_fold_together_plan():
  """Which rows a step folds: with a flush row in the step, the rows with at least
  ``fold_together`` records too (never a padding row); without one, none."""
  spec = SpecConfig(draft_tokens=2, ring_len=8, fold_together=3)
  cache = ssm.init(GDN, spec, SLOTS, dtype=jnp.float32)
  cache = dataclasses.replace(
      cache, write_pos=jnp.asarray([7, 3, 2, 5, 4, 6], jnp.int32),
      cache_base=jnp.asarray([1, 2, 3, 4, 5, 6], jnp.int32),
      is_flush=jnp.asarray([True, False, False, False, False, True]))
  ids = jnp.asarray([0, 1, 2, 3, -1], jnp.int32)  # slot 0 flushes; -1 reads slot 0's cursors
  count, base, (wp, cb, flush) = ssm._fold_plan(cache, ids, spec)
  np.testing.assert_array_equal(count, [7, 3, 0, 5, 0])
  np.testing.assert_array_equal(base, [1, 2, 3, 4, 1])
  np.testing.assert_array_equal(wp, [0, 0, 2, 0, 7])
  np.testing.assert_array_equal(cb, [0, 5, 3, 1, 1])  # (base + count) & 7
  np.testing.assert_array_equal(flush, [False, False, False, False, True])
  count, *_ = ssm._fold_plan(cache, jnp.asarray([1, 2, 3, 4], jnp.int32), spec)  # no flush row
  np.testing.assert_array_equal(count, 0)
  count, *_ = ssm._fold_plan(cache, ids, dataclasses.replace(spec, fold_together=None))
  np.testing.assert_array_equal(count, [7, 0, 0, 0, 0])


@pytest.mark.parametrize("stream_fold", [True, False], ids=["stream_fold", "fold_kernel"])
@pytest.mark.parametrize("T,L,decode_share", [(4, 16, 0.3), (2, 4, 0.3), (1, 2, 1.0)])
def test_wide_batches_split_form(T, L, decode_share, stream_fold, backend, monkeypatch,
                                 request):
  """Wide batches run the Pallas replay verify's split form (`replay_form`: windows from 16
  rows, decode from 64): the same invariants through mixed decode/verify steps, most rows
  padding (fewer slots than rows), with the flush rows folded inside the split form's stream
  kernel or by the fold kernel before it (`ssm.FUSE_FOLD_BELOW`)."""
  if backend != "pallas" and stream_fold:
    pytest.skip("only the Pallas split form folds in its stream")
  monkeypatch.setattr(ssm, "FUSE_FOLD_BELOW",
                      dict.fromkeys(ssm.FUSE_FOLD_BELOW, None if stream_fold else 0))
  jax.clear_caches()  # the knob is read at trace time: no step traced under the other value
  request.addfinalizer(jax.clear_caches)
  B = SPLIT_MIN_BATCH["decode" if decode_share == 1.0 else "window"]
  assert replay_form(T, B) == "split"
  rng = np.random.default_rng(T)
  pair = Pair.create(T, L, backend, rng, gdn=GDN_WIDE)
  if backend == "pallas":
    spec, V = pair.rep_spec, GDN_WIDE.head_v_dim
    assert ssm._fuses_fold(spec, jnp.zeros((B, T)), ssm.default_state_tuning(spec, V),
                           ssm.default_replay_tuning(spec, V, T, B)) is stream_fold
  _drive_wide(pair, B, T, decode_share, rng)


def _drive_wide(pair, B, T, decode_share, rng):
  """Steps of B rows, most of them padding, a random share of them decode, some resets."""
  pair.reset(list(range(SLOTS)), rng)
  for _ in range(40 if decode_share < 1 else 12):
    chosen = rng.permutation(SLOTS)[:rng.integers(1, SLOTS + 1)]
    slots = np.full(B, -1)
    slots[rng.permutation(B)[:len(chosen)]] = chosen
    if rng.random() < 0.1:
      pair.reset([int(s) for s in chosen], rng)
    decode = rng.random() < decode_share
    pair.step(slots.tolist(), rng.integers(0, T + 1, B).tolist(),
              pair.window(rng, B, 1 if decode else T), decode=decode)
  assert pair.folds_checked > 0


# ----------------------------------------------------------------------------- checkpoint copy

COPY_RINGS = [(1, 2), (2, 8), (4, 16)]


@pytest.mark.parametrize("T,L", COPY_RINGS, ids=[f"T{T}-L{L}" for T, L in COPY_RINGS])
def test_checkpoint_copy_schedules(T, L, backend):
  """`SpecConfig.checkpoint_copy`: decode and verify schedules keep every checkpoint bitwise
  the recurrent committed state after each fold, its copy bitwise that checkpoint rounded to
  bf16 at every step (resets and folds write both), outputs within the bf16 floor."""
  @settings(max_examples=2, phases=NO_SHRINK)
  @given(_schedules(T, steps=150))
  def run(schedule):
    _run_schedule(T, L, backend, schedule, interleave=True, checkpoint_copy=jnp.bfloat16)

  run()


@pytest.mark.parametrize("stream_fold", [True, False], ids=["stream_fold", "fold_kernel"])
@pytest.mark.parametrize("T,L,decode_share", [(4, 16, 0.3), (1, 2, 1.0)])
def test_checkpoint_copy_wide_batches(T, L, decode_share, stream_fold, backend, monkeypatch,
                                      request):
  """The split form (windows from 16 rows, decode from 64) reading the copy: its stream's
  checkpoint dot in bf16 (`replay_split`), the flush rows folded in its stream, which rewrites
  their copy rows, or by the fold kernel before it (`ssm.FUSE_FOLD_WITH_COPY`)."""
  if backend != "pallas" and stream_fold:
    pytest.skip("only the Pallas split form folds in its stream")
  monkeypatch.setattr(ssm, "FUSE_FOLD_WITH_COPY", dict.fromkeys(ssm.FUSE_FOLD_WITH_COPY,
                                                                stream_fold))
  jax.clear_caches()  # the knob is read at trace time: no step traced under the other value
  request.addfinalizer(jax.clear_caches)
  B = SPLIT_MIN_BATCH["decode" if decode_share == 1.0 else "window"]
  rng = np.random.default_rng(T + 7)
  pair = Pair.create(T, L, backend, rng, gdn=GDN_WIDE, checkpoint_copy=jnp.bfloat16)
  spec, V = pair.rep_spec, GDN_WIDE.head_v_dim
  if backend == "pallas":
    assert ssm._fuses_fold(spec, jnp.zeros((B, T)), ssm.default_state_tuning(spec, V),
                           ssm.default_replay_tuning(spec, V, T, B)) is stream_fold
  _drive_wide(pair, B, T, decode_share, rng)


@pytest.mark.parametrize("B", [2, 16])
def test_verify_reads_the_checkpoint_copy(B, backend):
  """Outputs with the copy are those of a cache without one whose checkpoints are already
  bf16 values, to fp32 rounding (not the bf16 floor): verify and decode read the copy."""
  T, L = 2, 8
  rng = np.random.default_rng(B)
  copy_spec = SpecConfig(draft_tokens=T, ring_len=L, backend=backend,
                         checkpoint_copy=jnp.bfloat16)
  plain_spec = dataclasses.replace(copy_spec, checkpoint_copy=None)
  with_copy = ssm.init(GDN_WIDE, copy_spec, SLOTS, dtype=jnp.float32)
  plain = ssm.init(GDN_WIDE, plain_spec, SLOTS, dtype=jnp.float32)
  rows = min(B - 1, SLOTS)  # the rest padding
  ids = jnp.asarray(np.r_[rng.permutation(SLOTS)[:rows], np.full(B - rows, -1)], jnp.int32)
  S0 = jnp.asarray(rng.standard_normal((B, *plain.ssm.shape[1:])), jnp.float32)
  with_copy = ssm.reset(with_copy, ids, S0, copy_spec)
  plain = ssm.reset(plain, ids, S0.astype(jnp.bfloat16).astype(jnp.float32), plain_spec)
  pair = Pair.create(T, L, backend, rng, gdn=GDN_WIDE)
  params = (pair.A_log, pair.dt_bias)
  for step, n in enumerate((T, 1, T)):  # verify, decode, verify: 2 + 1 + 2 records, no fold
    x = pair.window(rng, B, n)
    call = ssm.verify if n == T else ssm.decode
    o_copy, with_copy = call(with_copy, *x, *params, ids, copy_spec)
    o_plain, plain = call(plain, *x, *params, ids, plain_spec)
    assert rel_err(o_copy, o_plain) < 1e-5, step
    if n == T:
      acc = jnp.full((B,), T, jnp.int32)
      with_copy = ssm.commit(with_copy, ids, acc, copy_spec)
      plain = ssm.commit(plain, ids, acc, plain_spec)
  # Every record since the reset is still in the ring: no fold has run.
  live = np.asarray(ids)[np.asarray(ids) >= 0]
  np.testing.assert_array_equal(np.asarray(with_copy.write_pos)[live], 2 * T + 1)


def test_decode_only_4000_tokens_no_drift():
  rng = np.random.default_rng(5)
  T, L = 4, 16
  pair = Pair.create(T, L, "xla", rng)
  pair.reset([1, 4], rng)
  for _ in range(4000):
    pair.step([1, 4], None, pair.window(rng, 2, 1), decode=True)
  assert pair.folds_checked >= 2 * (4000 // (L - 2 * T + 1))


@pytest.mark.parametrize("T,L", [(4, 16), (2, 4)])
def test_long_run_no_drift(T, L):
  """4,000 verify steps of one request with random acceptance: bitwise after every fold."""
  rng = np.random.default_rng(0)
  pair = Pair.create(T, L, "xla", rng)
  pair.reset([3], rng)
  for _ in range(4000):
    pair.step([3], [int(rng.integers(1, T + 1))], pair.window(rng, 1, T))
  assert pair.folds_checked > 4000 // (L // T + 1)


@pytest.mark.parametrize("one_kernel_fold", [True, False])
def test_ring_exactly_full_then_flush(one_kernel_fold, monkeypatch, request):
  """wp reaches L - T (window fills the ring to the last record), then the next verify folds:
  inside the UT form's kernel (`ssm.FUSE_FOLD_ONE_KERNEL`) or in the fold kernel before it."""
  monkeypatch.setattr(ssm, "FUSE_FOLD_ONE_KERNEL", one_kernel_fold)
  jax.clear_caches()  # the knob is read at trace time: no step traced under the other value
  request.addfinalizer(jax.clear_caches)
  rng = np.random.default_rng(1)
  T, L = 4, 16
  pair = Pair.create(T, L, "pallas", rng)
  spec, V = pair.rep_spec, pair.rep.ssm.shape[2]
  assert replay_form(T, 2) == "ut"
  assert ssm._fuses_fold(spec, jnp.zeros((2, T)), ssm.default_state_tuning(spec, V),
                         ssm.default_replay_tuning(spec, V, T, 2)) is one_kernel_fold
  pair.reset([0, 1], rng)
  for _ in range(3):  # accept all: wp 0 -> 4 -> 8 -> 12 = L - T, is_flush set
    pair.step([0, 1], [T, T], pair.window(rng, 2, T))
  assert list(np.asarray(pair.rep.write_pos)[:2]) == [12, 12]
  assert np.asarray(pair.rep.is_flush)[:2].all()
  pair.step([0, 1], [0, T], pair.window(rng, 2, T))  # the fold; row 0 then accepts nothing
  assert pair.folds_checked == 2
  assert list(np.asarray(pair.rep.write_pos)[:2]) == [0, T]


def test_verify_twice_is_idempotent_across_a_fold():
  rng = np.random.default_rng(2)
  T, L = 2, 4
  pair = Pair.create(T, L, "pallas", rng)
  pair.reset([0], rng)
  pair.step([0], [T], pair.window(rng, 1, T))  # wp = 2: is_flush (2 + 4 > 4)
  x = pair.window(rng, 1, T)
  ids = jnp.zeros(1, jnp.int32)
  o1, pair.rep = ssm.verify(pair.rep, *x, pair.A_log, pair.dt_bias, ids, pair.rep_spec)
  ssm1 = np.asarray(pair.rep.ssm)
  o2, pair.rep = ssm.verify(pair.rep, *x, pair.A_log, pair.dt_bias, ids, pair.rep_spec)
  np.testing.assert_array_equal(np.asarray(o1), np.asarray(o2))
  np.testing.assert_array_equal(ssm1, np.asarray(pair.rep.ssm))


def test_fuse_fold_below_picks_by_size(monkeypatch):
  """The split form folds in its stream below `ssm.FUSE_FOLD_BELOW`'s size for the kind of
  step (None: at every size); the one-kernel forms by `ssm.FUSE_FOLD_ONE_KERNEL`."""
  monkeypatch.setattr(ssm, "FUSE_FOLD_BELOW",
                      {"window": 256, "decode": None, "decode-together": 128})
  spec = SpecConfig(draft_tokens=4, ring_len=16, verify_mode="replayssm", backend="pallas")
  V = GDN_WIDE.head_v_dim

  def fuses(B, T):
    return ssm._fuses_fold(spec, jnp.zeros((B, T)), ssm.default_state_tuning(spec, V),
                           ssm.default_replay_tuning(spec, V, T, B))

  assert [fuses(B, 4) for B in (16, 255, 256, 512)] == [True, True, False, False]
  assert [fuses(B, 1) for B in (64, 256, 4096)] == [True, True, True]
  spec = dataclasses.replace(spec, fold_together=8)  # decode's own entry; windows as before
  assert [fuses(B, 1) for B in (64, 127, 128, 256)] == [True, True, False, False]
  assert [fuses(B, 4) for B in (255, 256)] == [True, False]
  spec = dataclasses.replace(spec, fold_together=None)
  monkeypatch.setattr(ssm, "FUSE_FOLD_ONE_KERNEL", False)
  assert not fuses(3, 4) and fuses(16, 4)
  assert not ssm._fuses_fold(dataclasses.replace(spec, backend="xla"), jnp.zeros((16, 4)),
                             ssm.default_state_tuning(spec, V),
                             ssm.default_replay_tuning(spec, V, 4, 16))


def test_idle_fold_goes_behind_a_conditional(monkeypatch, request):
  """A Pallas window of 128 rows folds in a kernel of its own (`ssm.FUSE_FOLD_BELOW`), behind
  `lax.cond` when `ssm.SKIP_IDLE_FOLD` says so (on no backend by default: the conditional
  costs more than the idle launch): one conditional more in the step's trace than with the
  knob off (the kernel bodies, traced for the interpreter, hold their own)."""
  assert ssm.SKIP_IDLE_FOLD == {"xla": False, "pallas": False, "triton": False}
  request.addfinalizer(jax.clear_caches)
  rng = np.random.default_rng(0)
  pair = Pair.create(4, 16, "pallas", rng)
  B = ssm.FUSE_FOLD_BELOW["window"]
  x = pair.window(rng, B, 4)
  ids = jnp.full(B, -1, jnp.int32).at[0].set(0)

  def conditionals(skip: bool) -> int:
    monkeypatch.setitem(ssm.SKIP_IDLE_FOLD, "pallas", skip)
    jax.clear_caches()  # the knob is read at trace time
    jaxpr = jax.make_jaxpr(functools.partial(ssm.verify, spec=pair.rep_spec))(
        pair.rep, *x, pair.A_log, pair.dt_bias, ids)
    return len(re.findall(r"\bcond\[", str(jaxpr)))

  assert conditionals(True) == conditionals(False) + 1


# (mode, B) of the alias check, shared with the triton backend's (test_kernels_triton.py).
ALIAS_CASES = [("recurrent", 3), ("replayssm", 3), ("replayssm", 64), ("replayssm", 256)]


@pytest.mark.parametrize("mode,B", ALIAS_CASES)
def test_jitted_steps_alias_the_cache(mode, B, backend):
  """No full-buffer copy: the donated cache is aliased and temporaries stay per-row sized.
  At B=64 the Pallas verify and decode run the split form, flush rows folding in its stream;
  at B=256 the verify folds them in the fold kernel before it (`ssm.FUSE_FOLD_BELOW`)."""
  if mode == "replayssm" and backend == "pallas" and interpret_mode():
    pytest.skip("the Pallas interpreter carries every kernel operand through an XLA while loop "
                "and copies the read-only ones; the compiled kernels are checked on the GPU")
  if B == 256 and backend != "pallas":
    pytest.skip("only the Pallas verify changes its fold at this size; the XLA reference's "
                "per-row temporaries are checked at 64 rows")
  _assert_steps_alias(SpecConfig(draft_tokens=4, ring_len=16, verify_mode=mode, backend=backend),
                      B)


@pytest.mark.parametrize("B", [3, 64, 256])
def test_checkpoint_copy_steps_alias_the_cache(B, backend):
  """With `SpecConfig.checkpoint_copy` the fold writes the copy in place too, and the verify
  reads it: no copy of either."""
  if backend == "pallas" and interpret_mode():
    pytest.skip("the Pallas interpreter copies the operands it reads (see above)")
  if B == 256 and backend != "pallas":
    pytest.skip("the XLA reference's per-row temporaries are checked at 64 rows")
  _assert_steps_alias(SpecConfig(draft_tokens=4, ring_len=16, backend=backend,
                                 checkpoint_copy=jnp.bfloat16), B)


@pytest.mark.gpu
@pytest.mark.parametrize("B", [64, 256])
def test_decode_folding_together_aliases_the_cache(B):
  """With `SpecConfig.fold_together` the Pallas decode of 64 rows and more folds in the fold
  kernel before its stream (`ssm.FUSE_FOLD_BELOW`): no copy there either."""
  spec = SpecConfig(draft_tokens=4, ring_len=16, backend="pallas", fold_together=8)
  V = GDN_WIDE.head_v_dim
  assert not ssm._fuses_fold(spec, jnp.zeros((B, 1)), ssm.default_state_tuning(spec, V),
                             ssm.default_replay_tuning(spec, V, 1, B))
  _assert_steps_alias(spec, B)


def _assert_steps_alias(spec: SpecConfig, B: int):
  """The jitted verify, commit (and, compiled, decode) of B rows alias the donated cache,
  copy no full buffer and keep their temporaries per-row sized."""
  backend = spec.backend
  gdn = GDN if B < 64 else GDN_WIDE
  slots = 16 * B + 256  # full buffers dwarf the per-row temporaries of a step
  cache = ssm.init(gdn, spec, slots, dtype=jnp.float32)
  z = lambda *s: jnp.zeros(s, jnp.float32)
  H, HV, K, V = gdn.num_k_heads, gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim
  window = (z(B, 4, H, K), z(B, 4, H, K), z(B, 4, HV, V), z(B, 4, HV), z(B, 4, HV), z(HV), z(HV))
  ids = jnp.zeros(B, jnp.int32)
  token = (z(B, 1, H, K), z(B, 1, H, K), z(B, 1, HV, V), z(B, 1, HV), z(B, 1, HV), z(HV), z(HV))
  steps = [ssm.verify.lower(cache, *window, ids, spec), ssm.commit.lower(cache, ids, ids, spec)]
  if not (backend == "pallas" and interpret_mode()):  # the interpreter copies the state it reads
    steps.append(ssm.decode.lower(cache, *token, ids, spec))
  for compiled in (step.compile() for step in steps):
    stats = compiled.memory_analysis()
    assert stats.alias_size_in_bytes == cache.nbytes
    assert stats.temp_size_in_bytes < cache.ssm.nbytes // 4, stats.temp_size_in_bytes
    copies = [line for line in compiled.as_text().splitlines()
              if re.search(rf"= \w+\[{slots},", line) and " copy(" in line]
    assert not copies, copies


def test_retrace_free_steps():
  """Steps with new values reuse one compiled verify and commit (shape-stable cache pytrees)."""
  rng = np.random.default_rng(4)
  pair = Pair.create(2, 8, "xla", rng)
  pair.reset(list(range(SLOTS)), rng)
  pair.step([0, 1], [2, 1], pair.window(rng, 2, 2))
  sizes = ssm.verify._cache_size(), ssm.commit._cache_size()
  for _ in range(5):
    pair.step([int(s) for s in rng.permutation(SLOTS)[:2]], list(rng.integers(0, 3, 2)),
              pair.window(rng, 2, 2))
  assert (ssm.verify._cache_size(), ssm.commit._cache_size()) == sizes
