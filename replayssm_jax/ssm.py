"""The functional SSM API of one GDN layer: init, reset, verify, commit, decode, materialize.

Every function takes the cache pytree and returns a new one; the jitted ones
donate it, and the kernels update it in place (`input_output_aliases`), so a
step copies neither the checkpoint nor the rings nor ``intermediate``.

``spec.verify_mode`` picks the algorithm (DESIGN section 3):

- ``"recurrent"`` (`RecurrentCache`): verify writes the state after each draft into
  ``intermediate``; commit copies ``intermediate[slot, accepted - 1]`` into ``ssm``.
- ``"replayssm"`` (`ReplayCache`): verify first folds the rows marked ``is_flush``
  (exact replay of their committed raw records into the checkpoint), then computes
  the window outputs from checkpoint + ring history and appends the window's
  records; commit only moves cursors. With the Pallas backend the fold runs inside the replay
  verify: in its checkpoint stream in the split form (windows of 16 to 127 rows, decode from
  64, `FUSE_FOLD_BELOW`), in the one kernel of the UT and vector forms below those sizes
  (`FUSE_FOLD_ONE_KERNEL`); otherwise (windows from 128 rows, decode with `fold_together`) it
  is a kernel of its own, launched in every step (`SKIP_IDLE_FOLD`). The triton backend folds
  decode's flush rows in its split form's stream (from 32 rows, `TRITON_FUSE_FOLD_BELOW`; over
  the copy with `fold_together` only), and in the fold kernel otherwise.
  With `SpecConfig.fold_together`, the rows of a step that folds also fold along when they
  hold that many records, which keeps rows in phase (exact all the same). With
  `SpecConfig.checkpoint_copy`, reset and the fold also write each checkpoint rounded to bf16
  (``ReplayCache.ssm_copy``), and verify and decode read that copy instead (half the bytes);
  the fold then always runs in its own kernel.

The fold retires what it folded at once (``cache_base += write_pos``, ``write_pos = 0``,
``is_flush = False``: SGLang's "finish fold"), after which DESIGN's commit formula
gives the same cursors as folding at commit time. This makes a verify idempotent
(verifying twice before a commit gives the same outputs and state) and keeps
`materialize` exact between verify and commit.

Bitwise scope: the Pallas kernels (compiled on a GPU, interpreted on a CPU) give a folded
checkpoint bitwise equal to the recurrent committed state, also inside a whole-model step. The
``xla`` backend does so when these functions are jitted on their own (tested); inlined into a
larger jit, XLA may compile the reference loops differently and the folded state can differ in
the last bit (measured: 3e-8..6e-8 after decode steps, in `tests/test_models.py`).

Inputs are post-conv and pre-norm: q, k ``[B, T, H, K]``, v ``[B, T, HV, V]``,
a, b ``[B, T, HV]`` in the activation dtype, A_log and dt_bias ``f32[HV]``;
``slot_ids`` ``int32[B]`` with -1 for padding rows (zero output, no write).
Slot ids of one batch must be distinct.

Example: two requests, a verify of 4 draft tokens, accept 3 and 1 of them.

>>> import jax, jax.numpy as jnp
>>> from replayssm_jax import GDNConfig, SpecConfig, ssm
>>> gdn = GDNConfig(num_k_heads=1, num_v_heads=2, head_k_dim=16, head_v_dim=16,
...                 hidden_size=32, num_layers=1, num_gdn_layers=1)
>>> spec = SpecConfig(draft_tokens=4, ring_len=8, verify_mode="replayssm")
>>> cache = ssm.init(gdn, spec, num_slots=4, dtype=jnp.float32)
>>> slot_ids = jnp.array([2, 0], jnp.int32)
>>> cache = ssm.reset(cache, slot_ids, jnp.zeros((2, 2, 16, 16)), spec)
>>> keys = jax.random.split(jax.random.key(0), 5)
>>> q, k = (jax.random.normal(keys[i], (2, 4, 1, 16)) for i in (0, 1))
>>> v = jax.random.normal(keys[2], (2, 4, 2, 16))
>>> a, b = (jax.random.normal(keys[i], (2, 4, 2)) for i in (3, 4))
>>> A_log, dt_bias = jnp.zeros(2), jnp.zeros(2)
>>> o, cache = ssm.verify(cache, q, k, v, a, b, A_log, dt_bias, slot_ids, spec)
>>> o.shape
(2, 4, 2, 16)
>>> cache = ssm.commit(cache, slot_ids, jnp.array([3, 1], jnp.int32), spec)
>>> cache.write_pos[slot_ids].tolist()
[3, 1]
>>> ssm.materialize(cache, slot_ids, spec).shape
(2, 2, 16, 16)
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from replayssm_jax.config import GDNConfig, SpecConfig
from replayssm_jax.kernels import fold as fold_kernels
from replayssm_jax.kernels import recurrent as recurrent_kernels
from replayssm_jax.kernels import replay_split
from replayssm_jax.kernels import replay_verify as replay_kernels
from replayssm_jax.kernels.backend import KernelTuning, interpret_mode, replay_form
from replayssm_jax.state import RecurrentCache, ReplayCache, SSMCache, cache_type_for

_jit = functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("cache",))

# By backend, whether a step whose rows all have nothing to fold skips the fold kernel
# (`lax.cond` on "some row folds"); on none since session 44, so the fold is launched in every
# step and its idle programs read their cursors and exit. The conditional costs more than it
# saves: on the triton backend it runs on the host (jax-triton 0.3.1's legacy custom calls stay
# out of XLA's command buffers), each step copying the predicate back while the GPU idles (a
# decode step's span with L2 flushed, launched against skipped: H200 B=8 24.1 against 47.9 us,
# B=64 83.5 against 96.2; NOTES.md runs 42-43); on the Pallas backend it is decided on the
# device (`set_case_condition`) and still idles the GPU ~10 us a step: the 30-layer step at
# B=256 spans 11.52 ms launched against 12.09 skipped (H100, NOTES.md run 44), and a window
# step of 128 or 256 rows spans 4-30 us less, though without a fold its kernels take 9-19 us
# more (its idle programs; fewer programs folding several rows each lost more in the fold,
# NOTES.md run 45). The case it may suit: decode with `fold_together`, every row in phase,
# where 15 steps of 16 fold nothing (H100 triton B=256: 297.4 against 283.3 us in run 42, even
# in run 44; Pallas: plan item t_together). jax-triton 0.4 (triton >= 3.7) lowers its calls
# through the typed FFI: not measured there. The reference loops max(count) times.
SKIP_IDLE_FOLD = {"xla": False, "pallas": False, "triton": False}
# Below which batch size the Pallas split replay verify folds the flush rows in its checkpoint
# stream, which reads the checkpoints anyway, instead of in the fold kernel before it; by kind
# of step ("window": T > 1, "decode": T = 1, "decode-together": T = 1 with
# `SpecConfig.fold_together`; None: at every size). The fused fold costs the stream occupancy
# in every step (a `lax.cond` around it made XLA copy the rings), and a fold kernel of its own
# needs enough folding rows to fill the GPU. H200 (benchmarks/NOTES.md runs 19, 24, 25): windows
# fold apart from 128 rows; decode keeps the fold in its stream (B=256 in phase 204.8 against
# 193.7 us apart, out of phase 204.0 against 222.7) unless its rows fold together, whose steps
# fold many rows at once (apart: 197.3 / 205.3 against 208.5 / 214.3).
FUSE_FOLD_BELOW = {"window": 128, "decode": None, "decode-together": 0}
# The same for the triton backend's split form (`kernels.triton.fold_and_replay_verify`; its
# one-kernel forms, windows below 16 rows and decode below 32, never fold: the fold kernel runs
# before them). Its stream that folds holds 168 registers a thread (6 programs an SM, the plain
# stream 8), so it pays in every step, and gains the fold kernel's idle launch (35 us at B=256).
# H100 (benchmarks/NOTES.md run 51, fused against apart, kernels us): decode cycles in phase
# B=256 261.6 against 287.1 a step, B=64 81.5 against 89.0; out of phase 271.4 against 279.1
# and 95.6 against 92.5; windows lose where rows fold (mixed step B=64 131.0 against 127.1,
# B=256 418.5 against 410.3; every row folding +5% / +11%), so they fold apart. With
# `fold_together` decode gains both ways (B=256 263.2 against 288.9, 267.8 against 297.3).
TRITON_FUSE_FOLD_BELOW = {"window": 0, "decode": None, "decode-together": None}
# Whether the one-kernel replay verify forms (UT, vector: B < 16 windows, B < 64 decode) fold
# the flush rows in their programs, in place of the fold kernel in a `lax.cond` before them.
# H200 (benchmarks/NOTES.md run 16): the B=1 flush step 23.5 -> 20.2 us (16.4 with the UT form's
# 32-row programs), a B=1 step without a fold 12.8 -> 10.5, B=16 decode out of phase 31.4 -> 23.8.
FUSE_FOLD_ONE_KERNEL = True
# By kind of step, whether the split form's stream folds for a cache that keeps the
# checkpoint's bf16 copy (`SpecConfig.checkpoint_copy`), where `FUSE_FOLD_BELOW` picks: a
# folding program replays into the fp32 checkpoint, rewrites its copy rows from it and streams
# the copy; else (and in the one-kernel forms) the fold kernel folds. H100 (run 48, fused
# against apart): decode cycles 3-5% faster fused (B=256 in phase 183.1 against 189.8 us a
# step, out of phase 189.5 against 195.9; B=64 out of phase 64.4 against 67.4); windows slower
# (B=64, every row folding 239.3 against 204.0 us, mixed 114.6 against 108.0), so off there.
# Its GPU tests pass (run 49, H100: the folded state bitwise the recurrent one at K=16, V=64,
# where run 48's build, before `replay_split._stream` kept the copy's K-chunks unlike the
# fold's, was 1 ulp off; NOTES.md session 47).
FUSE_FOLD_WITH_COPY = {"window": False, "decode": True, "decode-together": True}
# The same for the triton stream, which on the copy loses with rows out of phase (H100, NOTES.md
# run 51, fused against apart: B=256 222.0 against 206.6 us a step, B=64 80.8 against 72.7) and
# wins in phase (202.5 against 216.8, 64.3 against 69.6), so it folds with `fold_together` only
# (B=256 cycle 204.2 against 218.3, rows out of phase 213.5 against 231.0).
TRITON_FUSE_FOLD_WITH_COPY = {"window": False, "decode": False, "decode-together": True}


def init(gdn: GDNConfig, spec: SpecConfig, num_slots: int, *, dtype=jnp.bfloat16) -> SSMCache:
  """A zero-filled SSM cache of one layer for ``num_slots`` slots.

  Args:
    gdn: the layer geometry.
    spec: `verify_mode` picks `RecurrentCache` or `ReplayCache`.
    num_slots: request slots.
    dtype: activation dtype (raw rings and, by default, the d and k rings).

  >>> cache = init(GDNConfig.preset("qwen3.5-35b-a3b", tp=8), SpecConfig(), 2)
  >>> type(cache).__name__, cache.ring_d.shape
  ('ReplayCache', (2, 4, 16, 128))
  """
  if spec.verify_mode == "replayssm":
    return ReplayCache.create(gdn, spec, num_slots, dtype)
  return RecurrentCache.create(gdn, spec, num_slots)


# ----------------------------------------------------------------------------- checks


def _check_cache(cache, spec: SpecConfig, what: str) -> None:
  want = cache_type_for(spec)
  if isinstance(cache, want):
    if isinstance(cache, ReplayCache):
      _check_copy(cache, spec, what)
    return
  if isinstance(cache, ReplayCache):
    raise ValueError(f"{what}: spec.verify_mode='recurrent' needs `intermediate`, which a "
                     "ReplayCache does not allocate; build the cache with "
                     "ssm.init(gdn, SpecConfig(verify_mode='recurrent', ...), ...).")
  if isinstance(cache, RecurrentCache):
    raise ValueError(f"{what}: spec.verify_mode='replayssm' needs a ReplayCache (checkpoint, "
                     "rings and cursors); this cache is a RecurrentCache. Build it with "
                     "ssm.init(gdn, SpecConfig(verify_mode='replayssm', ...), ...).")
  raise TypeError(f"{what}: expected a RecurrentCache or ReplayCache, got {type(cache).__name__}.")


def _check_copy(cache: ReplayCache, spec: SpecConfig, what: str) -> None:
  """The cache keeps the checkpoint copy that ``spec.checkpoint_copy`` asks for, or none."""
  copy = None if cache.ssm_copy is None else cache.ssm_copy.dtype
  if copy != spec.checkpoint_copy or (copy is not None
                                      and cache.ssm_copy.shape != cache.ssm.shape):
    kept = "none" if copy is None else f"{copy.name}{list(cache.ssm_copy.shape)}"
    raise ValueError(f"{what}: spec.checkpoint_copy={spec.checkpoint_copy} but the cache keeps "
                     f"{kept} (ssm is {list(cache.ssm.shape)}); build the cache with the same "
                     "spec (ssm.init).")


def _check_step(cache, q, k, v, a, b, A_log, dt_bias, slot_ids, T: int, what: str) -> None:
  """Shapes and dtypes of a verify/decode window against the cache (trace time)."""
  slots, HV, V, K = cache.ssm.shape
  # The key heads: the rings' in replayssm mode; in recurrent mode only q and k have them.
  B, H = q.shape[0], (cache.ring_rawk.shape[1] if isinstance(cache, ReplayCache) else q.shape[2])
  expected = {"q": (B, T, H, K), "k": (B, T, H, K), "v": (B, T, HV, V), "a": (B, T, HV),
              "b": (B, T, HV), "A_log": (HV,), "dt_bias": (HV,), "slot_ids": (B,)}
  given = dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, slot_ids=slot_ids)
  for name, shape in expected.items():
    if given[name].shape != shape:
      raise ValueError(f"{what}: {name} has shape {given[name].shape}; expected {shape} "
                       f"(T={T}, {H} key heads, cache state {cache.ssm.shape}).")
  if slot_ids.dtype != jnp.int32:
    raise TypeError(f"{what}: slot_ids must be int32; got {slot_ids.dtype}.")
  if isinstance(cache, ReplayCache):
    act = cache.ring_rawk.dtype
    for name in ("q", "k", "v"):
      if given[name].dtype != act:
        raise TypeError(f"{what}: {name} is {given[name].dtype} but the cache was built for "
                        f"{act} activations (ssm.init(..., dtype={act.name})).")


def _checked_values(spec: SpecConfig, what: str, num_slots: int, slot_ids, accepted=None):
  """``(slot_ids, accepted)``, passed through a host check when ``spec.check_values``: slot
  ids in ``-1..num_slots - 1`` and distinct but for -1, ``accepted`` (if given) in
  ``0..spec.draft_tokens``. The kernels read the callback's outputs, so none runs before it
  passes; a failed check raises ``ValueError`` (wrapped by the runtime that ran it)."""
  if not spec.check_values:
    return slot_ids, accepted
  T = spec.draft_tokens

  def check(ids, acc):
    ids = np.asarray(ids)
    outside = sorted(set(ids[(ids < -1) | (ids >= num_slots)].tolist()))
    if outside:
      raise ValueError(f"{what}: slot ids {outside} are outside -1..{num_slots - 1} "
                       f"(the cache has {num_slots} slots; -1 marks a padding row).")
    live, counts = np.unique(ids[ids >= 0], return_counts=True)
    if (counts > 1).any():
      raise ValueError(f"{what}: slot ids {live[counts > 1].tolist()} repeat in one batch; "
                       "a batch's slot ids must be distinct (-1 rows aside).")
    if acc is not None:
      acc = np.asarray(acc)
      bad = sorted(set(acc[(ids >= 0) & ((acc < 0) | (acc > T))].tolist()))
      if bad:
        raise ValueError(f"{what}: accepted counts {bad} are outside 0..{T} "
                         f"(draft_tokens={T}, the bonus token included).")
    return (ids, acc) if acc is not None else ids

  like = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)
  if accepted is None:
    return jax.pure_callback(lambda ids: check(ids, None), like(slot_ids), slot_ids), None
  return jax.pure_callback(check, (like(slot_ids), like(accepted)), slot_ids, accepted)


def default_state_tuning(spec: SpecConfig, V: int) -> KernelTuning:
  """The measured launch of ``spec.backend``'s recurrent kernels and exact fold (one instance:
  the bitwise tie); V is the value head dim."""
  if spec.backend == "triton":  # its tiles are held differently (kernels/triton/tile.py)
    return _triton_kernels().state_tuning(V)
  return KernelTuning.state_default(V)


def default_replay_tuning(spec: SpecConfig, V: int, T: int, B: int) -> KernelTuning:
  """The measured launch of ``spec.backend``'s replay verify for B rows of T tokens (on the
  checkpoint copy when ``spec.checkpoint_copy`` keeps one)."""
  copy = spec.checkpoint_copy is not None
  if spec.backend == "triton":
    return _triton_kernels().replay_tuning(V, T, B, copy=copy)
  return KernelTuning.replay_default(V, T, B, copy=copy)


def _tuning(cache, tuning: KernelTuning | None, spec: SpecConfig) -> KernelTuning:
  return tuning or default_state_tuning(spec, cache.ssm.shape[2])


def _replay_tuning(cache, q, tuning: KernelTuning | None, spec: SpecConfig) -> KernelTuning:
  return tuning or default_replay_tuning(spec, cache.ssm.shape[2], q.shape[1], q.shape[0])


def _kernel(spec: SpecConfig, pallas_fn, reference_fn):
  """The implementation ``spec.backend`` selects (DESIGN section 5)."""
  if spec.backend == "xla":
    return reference_fn
  if spec.backend == "pallas":
    return functools.partial(pallas_fn, interpret=interpret_mode())
  return getattr(_triton_kernels(), pallas_fn.__name__)  # the jax-triton kernel of that name


def _triton_kernels():
  """`replayssm_jax.kernels.triton`, imported on first use: triton is an optional dependency
  (`SpecConfig` checked that jax-triton and a GPU are there)."""
  from replayssm_jax.kernels import triton as triton_kernels

  return triton_kernels


def _row_cursors(cache: ReplayCache, slot_ids):
  s = jnp.maximum(slot_ids, 0)
  return cache.write_pos[s], cache.cache_base[s], cache.is_flush[s]


def _set_cursors(cache: ReplayCache, slot_ids, write_pos, cache_base, is_flush) -> ReplayCache:
  """Per-row cursors into their slots; padding rows and slots of no row keep theirs.

  One scatter of the rows' indices, then each slot gathers its row's cursors, all three fields
  in one elementwise pass (one kernel), in place of a scatter per field: on a GPU each scatter
  is a kernel of its own (H200, B=256 decode: 3.1 of the 4.4 us of cursor kernels per step,
  benchmarks/NOTES.md run 12). A jitted loop over steps scatters the rows' indices once.
  """
  row = _slot_rows(slot_ids, cache.num_slots)
  taken = row >= 0
  row = jnp.maximum(row, 0)
  pick = lambda old, new: jnp.where(taken, new.astype(old.dtype)[row], old)
  return dataclasses.replace(cache, write_pos=pick(cache.write_pos, write_pos),
                             cache_base=pick(cache.cache_base, cache_base),
                             is_flush=pick(cache.is_flush, is_flush))


def _slot_rows(slot_ids: jax.Array, num_slots: int) -> jax.Array:
  """``int32[num_slots]``: the row of ``slot_ids`` that holds each slot, -1 for none (slot ids
  of one batch are distinct; padding rows, -1, hold none)."""
  rows = jnp.arange(slot_ids.shape[0], dtype=jnp.int32)
  return recurrent_kernels.scatter_rows(jnp.full((num_slots,), -1, jnp.int32), slot_ids, rows)


# ----------------------------------------------------------------------------- API


@_jit
def reset(cache: SSMCache, slot_ids: jax.Array, initial_state: jax.Array, spec: SpecConfig) -> SSMCache:
  """Start new requests: ``ssm[slot] = initial_state`` and empty rings (DESIGN section 3).

  Args:
    cache: the layer's SSM cache (donated).
    slot_ids: ``int32[B]``; -1 rows are skipped.
    initial_state: ``f32[B, HV, V, K]``, the post-prefill states.
    spec: the configuration the cache was built with.
  """
  _check_cache(cache, spec, "ssm.reset")
  slot_ids, _ = _checked_values(spec, "ssm.reset", cache.num_slots, slot_ids)
  if initial_state.shape != (slot_ids.shape[0], *cache.ssm.shape[1:]):
    raise ValueError(f"ssm.reset: initial_state has shape {initial_state.shape}; expected "
                     f"{(slot_ids.shape[0], *cache.ssm.shape[1:])}.")
  rows = initial_state.astype(cache.ssm.dtype)
  cache = dataclasses.replace(cache, ssm=recurrent_kernels.scatter_rows(cache.ssm, slot_ids, rows))
  if isinstance(cache, RecurrentCache):
    return cache
  if cache.ssm_copy is not None:  # the copy is the stored checkpoint, rounded
    cache = dataclasses.replace(
        cache, ssm_copy=recurrent_kernels.scatter_rows(cache.ssm_copy, slot_ids, rows))
  B = slot_ids.shape[0]
  zeros = jnp.zeros((B,), jnp.int32)
  return _set_cursors(cache, slot_ids, zeros, zeros, jnp.full((B,), spec.flush_on_reset))


def _fold_plan(cache: ReplayCache, slot_ids, spec: SpecConfig):
  """What the step folds: ``(count, cache_base, cursors)``, per row the records to fold (the
  ``write_pos`` of a flush row, or of a row folding along with one, `SpecConfig.fold_together`;
  else 0), the ring index of its first, and its cursors ``(write_pos, cache_base, is_flush)``
  once the fold has retired them. The cursors are scattered to the slots by the caller, once
  per step with whatever else the step moves."""
  write_pos, cache_base, is_flush = _row_cursors(cache, slot_ids)
  valid = slot_ids >= 0
  folds = is_flush & valid
  if spec.fold_together is not None:  # the rows with that many records fold along
    folds = folds | (jnp.any(folds) & valid & (write_pos >= spec.fold_together))
  L = cache.ring_len
  cursors = (jnp.where(folds, 0, write_pos),
             jnp.where(folds, (cache_base + write_pos) & (L - 1), cache_base),
             jnp.where(folds, False, is_flush))
  return jnp.where(folds, write_pos, 0), cache_base, cursors


def _fold(cache: ReplayCache, slot_ids, count, cache_base, spec: SpecConfig,
          tuning: KernelTuning) -> ReplayCache:
  """The exact fold kernel on the rows with ``count > 0`` (and on their checkpoint copy)."""
  fold = _kernel(spec, fold_kernels.fold, fold_kernels.fold_reference)
  rings = {n: getattr(cache, n) for n in fold_kernels.RING_NAMES}

  def run_fold(states):
    ssm, ssm_copy = states
    if ssm_copy is None:
      return fold(ssm, *rings.values(), slot_ids, count, cache_base, tuning=tuning), None
    return fold(ssm, *rings.values(), slot_ids, count, cache_base, tuning=tuning,
                ssm_copy=ssm_copy)

  states = (cache.ssm, cache.ssm_copy)
  if not SKIP_IDLE_FOLD[spec.backend]:
    states = run_fold(states)
  else:  # most steps fold no row: skip the launch, whose programs would all just exit
    states = jax.lax.cond(jnp.any(count > 0), run_fold, lambda states: states, states)
  # The replay verify writes the rings the fold reads (raw k, g, beta) in place, and its
  # coefficients kernel does not read the checkpoint: without an order between the two, XLA
  # copied those rings for the fold's reads (H200, the split form at B=64). Passing the rings
  # through a barrier with the folded checkpoint makes the verify's writes wait for the fold.
  (ssm, ssm_copy), rings = jax.lax.optimization_barrier((states, rings))
  return dataclasses.replace(cache, ssm=ssm, ssm_copy=ssm_copy, **rings)


def _fuses_fold(spec: SpecConfig, q, tuning: KernelTuning, replay_tuning: KernelTuning) -> bool:
  """Whether the replay verify folds the flush rows itself: the split form's stream
  (`FUSE_FOLD_BELOW`, `TRITON_FUSE_FOLD_BELOW`; with the copy `FUSE_FOLD_WITH_COPY`,
  `TRITON_FUSE_FOLD_WITH_COPY`) or the Pallas one-kernel forms (`FUSE_FOLD_ONE_KERNEL`), when
  their programs hold whole fold tiles."""
  B, T = q.shape[:2]
  kind = "window" if T > 1 else "decode-together" if spec.fold_together else "decode"
  if spec.backend == "xla":
    return False
  triton = spec.backend == "triton"
  with_copy = TRITON_FUSE_FOLD_WITH_COPY if triton else FUSE_FOLD_WITH_COPY
  if spec.checkpoint_copy is not None and not with_copy[kind]:
    return False
  form = _triton_kernels().replay_form(T, B) if triton else replay_form(T, B)
  if form.startswith("split"):
    below = (TRITON_FUSE_FOLD_BELOW if triton else FUSE_FOLD_BELOW)[kind]
    fuse = below is None or B < below
  else:  # not with the copy (`replay_verify.fold_and_replay_verify`); the triton ones never
    fuse = FUSE_FOLD_ONE_KERNEL and spec.checkpoint_copy is None and not triton
  whole_tiles = (_triton_kernels() if triton else replay_split).stream_fold_block_v
  return fuse and whole_tiles(replay_tuning, tuning) > 0


def _replay_window(cache: ReplayCache, q, k, v, a, b, A_log, dt_bias, slot_ids, spec, tuning,
                   replay_tuning):
  """Fold flush rows, then the replay verify of the window; the window's records go into the
  ring. Returns ``(o, cache, cursors)`` with the rows' cursors after the fold (not scattered)."""
  count, fold_base, cursors = _fold_plan(cache, slot_ids, spec)
  write_pos, cache_base, _ = cursors
  replay_tuning = _replay_tuning(cache, q, replay_tuning, spec)
  window = (q, k, v, a, b, A_log, dt_bias, slot_ids, write_pos, cache_base)
  verify_args = dict(tuning=replay_tuning, dot_precision=spec.dot_precision)
  rings_of = lambda c: tuple(getattr(c, n) for n in replay_kernels.RING_NAMES)
  if _fuses_fold(spec, q, tuning, replay_tuning):
    fold_and_verify = _kernel(spec, replay_kernels.fold_and_replay_verify, None)
    o, ssm, *rings = fold_and_verify(cache.ssm, *rings_of(cache), *window, count, fold_base,
                                     fold_tuning=tuning, ssm_copy=cache.ssm_copy, **verify_args)
    ssm, ssm_copy = (ssm, None) if cache.ssm_copy is None else ssm
    cache = dataclasses.replace(cache, ssm=ssm, ssm_copy=ssm_copy)
  else:  # the rings as `_fold` returns them, which orders the verify's writes after the fold
    cache = _fold(cache, slot_ids, count, fold_base, spec, tuning)
    verify = _kernel(spec, replay_kernels.replay_verify, replay_kernels.replay_verify_reference)
    o, *rings = verify(cache.verify_ssm, *rings_of(cache), *window, **verify_args)
  return o, dataclasses.replace(cache, **dict(zip(replay_kernels.RING_NAMES, rings))), cursors


_step_jit = functools.partial(jax.jit, static_argnames=("spec", "tuning", "replay_tuning"),
                              donate_argnames=("cache",))


@_step_jit
def verify(cache: SSMCache, q, k, v, a, b, A_log, dt_bias, slot_ids, spec: SpecConfig, *,
           tuning: KernelTuning | None = None, replay_tuning: KernelTuning | None = None):
  """Outputs of a T-token draft window; the committed state is not changed.

  Args:
    cache: the layer's SSM cache (donated).
    q, k, v, a, b, A_log, dt_bias, slot_ids: see the module docstring; ``T = spec.draft_tokens``.
    spec: the configuration the cache was built with.
    tuning: launch parameters of the recurrent kernels and the exact fold, which share
      them for bitwise equality (default: ``block_v = min(32, V)``, 4 warps).
    replay_tuning: launch parameters of the replay verify (default:
      `KernelTuning.replay_default`).

  Returns:
    ``(o, cache)`` with ``o [B, T, HV, V]`` in the activation dtype.
  """
  _check_cache(cache, spec, "ssm.verify")
  _check_step(cache, q, k, v, a, b, A_log, dt_bias, slot_ids, spec.draft_tokens, "ssm.verify")
  slot_ids, _ = _checked_values(spec, "ssm.verify", cache.num_slots, slot_ids)
  tuning = _tuning(cache, tuning, spec)
  if isinstance(cache, ReplayCache):
    o, cache, cursors = _replay_window(cache, q, k, v, a, b, A_log, dt_bias, slot_ids, spec,
                                       tuning, replay_tuning)
    return o, _set_cursors(cache, slot_ids, *cursors)
  run = _kernel(spec, recurrent_kernels.recurrent_verify, recurrent_kernels.recurrent_verify_reference)
  o, intermediate = run(cache.ssm, cache.intermediate, q, k, v, a, b, A_log, dt_bias, slot_ids,
                        tuning=tuning)
  return o, dataclasses.replace(cache, intermediate=intermediate)


def _advanced(write_pos, cache_base, is_flush, accepted, L: int, T: int):
  """DESIGN section 3's commit formula on per-row cursors."""
  flush_now = (accepted > 0) & is_flush
  cache_base = jnp.where(flush_now, (cache_base + write_pos) & (L - 1), cache_base)
  write_pos = jnp.where(is_flush, accepted, write_pos + accepted)
  return write_pos, cache_base, write_pos + 2 * T > L


@_jit
def commit(cache: SSMCache, slot_ids: jax.Array, accepted: jax.Array, spec: SpecConfig) -> SSMCache:
  """Commit the first ``accepted[b]`` tokens (bonus included) of each row's last verify.

  Args:
    cache: the layer's SSM cache (donated).
    slot_ids: ``int32[B]``; -1 rows are skipped.
    accepted: ``int32[B]`` in ``0..T``; 0 leaves the committed state as it was.
    spec: the configuration the cache was built with.
  """
  _check_cache(cache, spec, "ssm.commit")
  if accepted.shape != slot_ids.shape:
    raise ValueError(f"ssm.commit: accepted has shape {accepted.shape}; expected {slot_ids.shape}.")
  accepted = accepted.astype(jnp.int32)
  slot_ids, accepted = _checked_values(spec, "ssm.commit", cache.num_slots, slot_ids, accepted)
  if isinstance(cache, ReplayCache):
    cursors = _advanced(*_row_cursors(cache, slot_ids), accepted, cache.ring_len, spec.draft_tokens)
    return _set_cursors(cache, slot_ids, *cursors)
  s = jnp.maximum(slot_ids, 0)
  committed = cache.intermediate[s, jnp.maximum(accepted - 1, 0)]
  targets = jnp.where(accepted > 0, slot_ids, -1)
  return dataclasses.replace(cache, ssm=recurrent_kernels.scatter_rows(cache.ssm, targets, committed))


@_step_jit
def decode(cache: SSMCache, q, k, v, a, b, A_log, dt_bias, slot_ids, spec: SpecConfig, *,
           tuning: KernelTuning | None = None, replay_tuning: KernelTuning | None = None):
  """One plain decode token per row (``T = 1``), committed by the call itself.

  In ``replayssm`` mode this is the verify protocol with a one-token window on the
  same ring (same fold, same flush rule with ``T = spec.draft_tokens``), so decode
  and verify steps can alternate freely for any row. A call is all-decode (as a
  `verify` call is all-verify): rows that decode while others verify go in two calls,
  each with its own ``slot_ids``.

  Returns:
    ``(o, cache)`` with ``o [B, 1, HV, V]``.
  """
  _check_cache(cache, spec, "ssm.decode")
  _check_step(cache, q, k, v, a, b, A_log, dt_bias, slot_ids, 1, "ssm.decode")
  slot_ids, _ = _checked_values(spec, "ssm.decode", cache.num_slots, slot_ids)
  tuning = _tuning(cache, tuning, spec)
  if isinstance(cache, ReplayCache):
    o, cache, cursors = _replay_window(cache, q, k, v, a, b, A_log, dt_bias, slot_ids, spec,
                                       tuning, replay_tuning)
    # The fold's cursors and the commit of the token, scattered to the slots once.
    cursors = _advanced(*cursors, jnp.ones_like(slot_ids), cache.ring_len, spec.draft_tokens)
    return o, _set_cursors(cache, slot_ids, *cursors)
  run = _kernel(spec, recurrent_kernels.recurrent_decode, recurrent_kernels.recurrent_decode_reference)
  o, ssm = run(cache.ssm, q, k, v, a, b, A_log, dt_bias, slot_ids, tuning=tuning)
  return o, dataclasses.replace(cache, ssm=ssm)


@functools.partial(jax.jit, static_argnames=("spec",))
def materialize(cache: SSMCache, slot_ids: jax.Array, spec: SpecConfig) -> jax.Array:
  """The committed states ``f32[B, HV, V, K]`` of the rows (zeros for padding rows).

  ``replayssm``: the checkpoint with the committed history replayed exactly from
  the raw records (pure jnp; the cache is not changed).
  """
  _check_cache(cache, spec, "ssm.materialize")
  slot_ids, _ = _checked_values(spec, "ssm.materialize", cache.num_slots, slot_ids)
  s = jnp.maximum(slot_ids, 0)
  S = cache.ssm[s]
  if isinstance(cache, ReplayCache):
    write_pos, cache_base, _ = _row_cursors(cache, slot_ids)
    S = fold_kernels.replay_rows(S, cache.ring_rawk[s], cache.ring_rawv[s], cache.ring_g[s],
                                 cache.ring_beta[s], write_pos, cache_base)
  return jnp.where((slot_ids >= 0)[:, None, None, None], S, 0)
