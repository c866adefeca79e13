"""Tests of kernels/replay_verify.py: the Pallas kernel, its reference, and a float64 oracle.

The oracle shares no code with the module under test: in numpy float64 it steps the
recorded history ``S <- exp(g_i) S + d_i k_hat_i^T`` from the checkpoint, then the window
through the delta rule of DESIGN section 1 (own l2 norm and gates), token by token and
head by head. The histories are built the way the recurrent path records them:
`token_inputs` + `reference.delta_rule_step` in fp32, cast to the ring dtype.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import HAS_GPU, TOLERANCE, rel_err
from replayssm_jax import reference
from replayssm_jax.kernels import backend, fold, launch_order, recurrent, replay_parts, replay_split
from replayssm_jax.kernels.backend import KernelTuning
from replayssm_jax.kernels.recurrent import token_inputs
from replayssm_jax.kernels.replay_verify import (FORMS, RING_NAMES, fold_and_replay_verify,
                                                 replay_verify, replay_verify_reference)

reference_jit = jax.jit(replay_verify_reference)
gating_jit = jax.jit(reference.gdn_gating)
l2_normalize_jit = jax.jit(reference.l2_normalize)


@dataclasses.dataclass(frozen=True)
class Case:
  B: int
  T: int
  L: int
  H: int
  HV: int
  K: int
  V: int
  block_v: int
  act: str = "float32"
  ring: str = "float32"
  precision: str = "default"  # the in-kernel dots on a GPU (the interpreter's are exact)
  pad_row: int | None = None  # index of the padding row (slot -1), if any
  why: str = ""

  @property
  def id(self):
    return (f"B{self.B}-T{self.T}-L{self.L}-HV{self.HV}-H{self.H}-K{self.K}-V{self.V}"
            f"-{self.act[0]}{self.ring[0]}-{self.precision}")

  @property
  def tol(self) -> float:
    """conftest's bound for the coarser of the activation and ring dtypes."""
    coarse = "bfloat16" if "bfloat16" in (self.act, self.ring) else "float32"
    return TOLERANCE[(coarse, self.precision)]


CASES = [
    Case(4, 4, 16, 2, 4, 32, 32, 16, pad_row=3,
         why="SGLang's default window and ring, two V-blocks, all write_pos kinds, a padding row"),
    Case(2, 1, 2, 2, 2, 16, 16, 16, pad_row=1,
         why="T=1 with the smallest ring, L=2T (GPU: the short L contraction is exact)"),
    Case(3, 3, 16, 1, 4, 16, 32, 16, pad_row=1, why="T not a power of two, GQA 4"),
    Case(2, 8, 16, 1, 2, 16, 16, 8, why="L=2T, T=8: the ring is exactly full after the window"),
    Case(3, 2, 32, 2, 2, 32, 16, 16, precision="ieee", why="long ring, no GQA; exact dots"),
    Case(4, 4, 16, 1, 4, 32, 32, 32, act="bfloat16", ring="bfloat16", pad_row=0,
         why="activation-dtype rings (SGLang), GQA 4"),
    Case(3, 3, 8, 2, 4, 16, 16, 16, act="bfloat16", pad_row=2,
         why="fp32 records with bf16 activations, T=3"),
    Case(4, 8, 32, 2, 4, 32, 16, 16, act="bfloat16", ring="bfloat16", pad_row=1,
         why="T=8 against a long bf16 ring"),
]


# ----------------------------------------------------------------------------- inputs


@jax.jit
def history_records(S, k, v, a, b, A_log, dt_bias):
  """``(d [B, L, HV, V], k_hat [B, L, H, K], g [B, L, HV])`` of L recurrent steps from S."""
  r = v.shape[2] // k.shape[2]

  def step(S, xs):
    k_t, v_t, a_t, b_t = xs
    _, k_hat, v_t, g, beta = token_inputs(k_t, k_t, v_t, a_t, b_t, A_log, dt_bias, 1.0)
    S, d = reference.delta_rule_step(S, jnp.repeat(k_hat, r, axis=1), v_t, g, beta)
    return S, (d, k_hat, g)

  _, records = jax.lax.scan(step, S, tuple(jnp.moveaxis(x, 1, 0) for x in (k, v, a, b)))
  return tuple(jnp.moveaxis(x, 0, 1) for x in records)


def make_inputs(c: Case, seed: int = 0):
  """Window inputs, cursors and rings whose history is real records, the rest random or NaN."""
  rng = np.random.default_rng(seed)
  act, ring_dt = jnp.dtype(c.act), jnp.dtype(c.ring)
  slots, r = c.B + 2, c.HV // c.H
  randn = lambda *shape: rng.standard_normal(shape).astype(np.float32)
  slot_ids = rng.permutation(slots)[:c.B].astype(np.int32)
  valid_rows = [i for i in range(c.B) if i != c.pad_row]
  write_pos = rng.integers(0, c.L, c.B).astype(np.int32)  # garbage on the padding row
  for n, i in enumerate(valid_rows):  # the ring's edges first: full after the window, empty
    write_pos[i] = [c.L - c.T, 0, (c.L - c.T) // 2][n % 3]
  cache_base = rng.integers(0, c.L, c.B).astype(np.int32)
  if c.pad_row is not None:
    slot_ids[c.pad_row] = -1

  ssm = 0.3 * randn(slots, c.HV, c.V, c.K)
  A_log = np.log(rng.uniform(0.5, 2.0, c.HV)).astype(np.float32)
  dt_bias = (randn(c.HV) - 1.5).astype(np.float32)  # moderate decays: a long history still counts
  window = dict(q=randn(c.B, c.T, c.H, c.K), k=randn(c.B, c.T, c.H, c.K),
                v=randn(c.B, c.T, c.HV, c.V), a=randn(c.B, c.T, c.HV), b=randn(c.B, c.T, c.HV))
  window = {n: jnp.asarray(x, act) for n, x in window.items()}

  # Random rings (float32 here, cast at the end), NaN wherever the verify must not look:
  # the records of the rows' slots that are not history.
  rings = dict(ring_d=randn(slots, c.HV, c.L, c.V), ring_k=randn(slots, c.H, c.L, c.K),
               ring_g=-np.abs(randn(slots, c.HV, c.L)), ring_beta=randn(slots, c.HV, c.L),
               ring_rawk=randn(slots, c.H, c.L, c.K), ring_rawv=randn(slots, c.HV, c.L, c.V))
  for name in ("ring_d", "ring_k", "ring_g"):
    rings[name][slot_ids[valid_rows]] = np.nan

  # History records as the recurrent path makes them, from raw history tokens.
  hk = jnp.asarray(randn(c.B, c.L, c.H, c.K), act)
  hv, ha, hb = (jnp.asarray(x, act) for x in (randn(c.B, c.L, c.HV, c.V), randn(c.B, c.L, c.HV),
                                               randn(c.B, c.L, c.HV)))
  d, key_hat, g = history_records(jnp.asarray(ssm[np.maximum(slot_ids, 0)]), hk, hv, ha, hb,
                                  jnp.asarray(A_log), jnp.asarray(dt_bias))
  d, key_hat, g = np.asarray(d), np.asarray(key_hat), np.asarray(g)
  for row in valid_rows:
    phys = (cache_base[row] + np.arange(write_pos[row])) & (c.L - 1)
    for name, records in (("ring_d", d), ("ring_k", key_hat), ("ring_g", g)):
      rings[name][slot_ids[row]][:, phys] = np.swapaxes(records[row, :write_pos[row]], 0, 1)
  dtypes = dict(ring_d=ring_dt, ring_k=ring_dt, ring_g=jnp.float32, ring_beta=jnp.float32,
                ring_rawk=act, ring_rawv=act)
  rings = {n: jnp.asarray(x, dtypes[n]) for n, x in rings.items()}
  return dict(ssm=jnp.asarray(ssm), **rings, **window, A_log=jnp.asarray(A_log),
              dt_bias=jnp.asarray(dt_bias), slot_ids=jnp.asarray(slot_ids),
              write_pos=jnp.asarray(write_pos), cache_base=jnp.asarray(cache_base))


# ----------------------------------------------------------------------------- the oracle


def np_l2(x):
  return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def np_oracle(inp):
  """float64 ``(o [B, T, HV, V], d [B, T, HV, V])``: history replayed, window stepped."""
  f64 = {n: np.asarray(jnp.asarray(x, jnp.float32), np.float64)
         if jnp.issubdtype(x.dtype, jnp.floating) else np.asarray(x) for n, x in inp.items()}
  B, T, H, K = f64["q"].shape
  HV, V, L = f64["v"].shape[2], f64["v"].shape[3], f64["ring_g"].shape[-1]
  g_win = -np.exp(f64["A_log"]) * np.logaddexp(0.0, f64["a"] + f64["dt_bias"])
  beta_win = 1.0 / (1.0 + np.exp(-f64["b"]))
  o, d_win = np.zeros((B, T, HV, V)), np.zeros((B, T, HV, V))
  for row in range(B):
    slot, wp, cb = f64["slot_ids"][row], f64["write_pos"][row], f64["cache_base"][row]
    if slot < 0:
      continue
    for h in range(HV):
      kh = h // (HV // H)
      S = f64["ssm"][slot, h].copy()
      for i in range(wp):
        p = (cb + i) & (L - 1)
        S = np.exp(f64["ring_g"][slot, h, p]) * S + np.outer(f64["ring_d"][slot, h, p],
                                                             f64["ring_k"][slot, kh, p])
      for s in range(T):
        q_hat = np_l2(f64["q"][row, s, kh]) * K ** -0.5
        k_hat = np_l2(f64["k"][row, s, kh])
        S = np.exp(g_win[row, s, h]) * S
        d = beta_win[row, s, h] * (f64["v"][row, s, h] - S @ k_hat)
        S = S + np.outer(d, k_hat)
        o[row, s, h], d_win[row, s, h] = S @ q_hat, d
  return o, d_win


def f32(x):
  return np.asarray(jnp.asarray(x, jnp.float32))


def k_hat_ulp_bound(K: int, ring_dtype) -> int:
  """Ulps a kernel's k_hat record may lie from the exact ``k / sqrt(|k|^2 + eps)``, rounded.

  In fp32 the sum of K squares, in any order, is within K u of exact (u = 2^-24, first order),
  its square root within K/2 u + 2 u (an approximate sqrt or rsqrt included), and the final
  product or division adds 2 u more: K/2 + 4 u relative, under K/2 + 4 ulp, and half an ulp
  between the exact value and its rounding. That error is far below half a bfloat16 ulp, so a
  bfloat16 record rounds to the exact value's rounding or its neighbour.
  """
  return K // 2 + 5 if jnp.dtype(ring_dtype) == jnp.float32 else 1


def window_slots(inp, c: Case) -> np.ndarray:
  """``[B, T]`` physical ring slots of the rows' windows, ``(cache_base + write_pos + s) &
  (L - 1)``."""
  wp, cb = (np.asarray(inp[n]) for n in ("write_pos", "cache_base"))
  return (cb[:, None] + wp[:, None] + np.arange(c.T)) & (c.L - 1)


def window_mask(shape, slot_ids, phys):
  """``[slots, heads, L, ...]`` mask of the ring entries the rows' windows write."""
  mask = np.zeros(shape[:3], bool)
  for row in np.flatnonzero(slot_ids >= 0):
    mask[slot_ids[row], :, phys[row]] = True
  return mask.reshape(shape[:3] + (1,) * (len(shape) - 3))


def bits(x):
  """The raw bits of a float array: bitwise equality, NaN payloads and bfloat16 included."""
  return np.asarray(x).view(f"uint{8 * np.asarray(x).dtype.itemsize}")


def assert_k_hat_records(got, inp, c: Case, name: str = "") -> None:
  """``got``, a written ``ring_k``: the rows' window entries within `k_hat_ulp_bound` of the
  exact ``k / sqrt(|k|^2 + eps)``, every other entry untouched, to the bit.

  A kernel's l2 norm sums over K in an order its compiler picks: the tile's layout on the GPU,
  XLA's on the CPU, which (jax 0.12.1) vectorises that sum in some kernels and not in others,
  so two launches of the same code can differ in the records' last bits. The fold recomputes
  k_hat from raw k, so no committed state sees them.
  """
  slot_ids, phys = np.asarray(inp["slot_ids"]), window_slots(inp, c)
  k_hat64 = np_l2(np.asarray(jnp.asarray(inp["k"], jnp.float32), np.float64))
  got = np.asarray(got)
  mask = np.broadcast_to(window_mask(got.shape, slot_ids, phys), got.shape)
  exact = np.array(inp["ring_k"])
  for row in np.flatnonzero(slot_ids >= 0):
    exact[slot_ids[row]][:, phys[row]] = np.swapaxes(k_hat64[row], 0, 1).astype(got.dtype)
  ulps = np.abs(bits(got).astype(np.int64) - bits(exact).astype(np.int64))[mask]
  assert ulps.max() <= k_hat_ulp_bound(c.K, got.dtype), (name, ulps.max())
  np.testing.assert_array_equal(bits(got)[~mask], bits(exact)[~mask], err_msg=f"{name} ring_k")


# ----------------------------------------------------------------------------- tests


# Opt-in launches of a form, tested as the forms are: (form, keyword arguments of its kernel).
FORM_OPTIONS = {
    "split-history-mask": ("split", dict(coefficient_history_scan=False)),
    "split-reciprocal-norms": ("split", dict(coefficient_reciprocal_norms=True)),
    "split-mask-reciprocal": ("split", dict(coefficient_history_scan=False,
                                            coefficient_reciprocal_norms=True)),
    "split-window-mma": ("split", dict(coefficient_window_mma=True)),
    "split-all": ("split", dict(coefficient_history_scan=True, coefficient_reciprocal_norms=True,
                                coefficient_window_mma=True)),
}
BF16_ONLY = {"split-window-mma", "split-all"}  # options for bf16 activations


@pytest.mark.parametrize("form", [*FORMS, *FORM_OPTIONS])
@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_replay_verify(c: Case, form, interpret):
  """Kernel and reference against the oracle; every ring entry written exactly or untouched."""
  inp = make_inputs(c)
  launch = dict(tuning=KernelTuning(block_v=c.block_v), dot_precision=c.precision,
                interpret=interpret)
  if form in BF16_ONLY and c.act != "bfloat16":
    pytest.skip("an option for bf16 activations")
  if form in FORM_OPTIONS:
    assert FORM_OPTIONS[form][0] == "split"
    kernel_out = replay_split.replay_verify_split(**inp, **launch, **FORM_OPTIONS[form][1])
  else:
    kernel_out = replay_verify(**inp, **launch, form=form)
  ref_out = reference_jit(**inp)
  o_oracle, d_oracle = np_oracle(inp)
  tol = c.tol
  slot_ids, phys = np.asarray(inp["slot_ids"]), window_slots(inp, c)
  valid = slot_ids >= 0

  # Records the window must write, from the raw inputs and the shared arithmetic, compiled
  # (eager `l2_normalize` differs by an ulp: XLA rewrites x / sqrt(y) as x * rsqrt(y)).
  g, beta = gating_jit(inp["a"], inp["b"], inp["A_log"], inp["dt_bias"])
  k_hat = l2_normalize_jit(inp["k"].astype(jnp.float32))
  records = dict(ring_k=k_hat, ring_g=g, ring_beta=beta, ring_rawk=inp["k"], ring_rawv=inp["v"])

  for name, (o, *rings) in (("kernel", kernel_out), ("reference", ref_out)):
    assert o.dtype == inp["v"].dtype
    assert rel_err(f32(o[valid]), o_oracle[valid]) <= tol, name
    np.testing.assert_array_equal(np.asarray(o[~valid], np.float32), 0.0)
    for ring_name, ring in zip(RING_NAMES, rings):
      assert ring.dtype == inp[ring_name].dtype and ring.shape == inp[ring_name].shape
      expected = np.array(inp[ring_name])
      got = np.asarray(ring)
      for row in np.flatnonzero(valid):
        slot = slot_ids[row]
        if ring_name == "ring_d":  # solved: checked against the oracle, then taken as is
          d = got[slot][:, phys[row]]  # [HV, T, V]
          assert rel_err(f32(d), np.swapaxes(d_oracle[row], 0, 1)) <= tol, (name, row)
          expected[slot][:, phys[row]] = d
        else:
          expected[slot][:, phys[row]] = np.asarray(
              jnp.swapaxes(records[ring_name][row], 0, 1).astype(ring.dtype))
      if ring_name == "ring_k" and name == "kernel":
        # The kernels' l2 norm sums over K in their own order, XLA's reference in its own:
        # within the rounding analysis' bound of the exact value. Everything else bitwise.
        assert_k_hat_records(got, inp, c, name)
        got = np.where(window_mask(got.shape, slot_ids, phys), expected, got)
      np.testing.assert_array_equal(bits(got), bits(expected), err_msg=f"{name} {ring_name}")

  o_kernel, o_ref = kernel_out[0], ref_out[0]
  assert rel_err(f32(o_kernel[valid]), f32(o_ref[valid])) <= tol


SPLIT_VARIANTS = dict(all_dots=dict(coefficient_inline=None),
                      single_rows_inline=dict(coefficient_inline=0),
                      cuda_core_keys=dict(coefficient_key_mma=False),
                      tensor_core_keys=dict(coefficient_key_mma=True),
                      history_mask=dict(coefficient_history_scan=False))


DECODE_CASE = dataclasses.replace(CASES[0], T=1, why="a decode window: every product a row")


@pytest.mark.parametrize("variant", SPLIT_VARIANTS)
@pytest.mark.parametrize("c", [CASES[0], DECODE_CASE, CASES[7]],
                         ids=[CASES[0].id, DECODE_CASE.id, CASES[7].id])
def test_split_variants(c: Case, variant, interpret):
  """The split form's other ways to form its products (no product written out; only single
  rows written out; the key products on the CUDA or on the tensor cores) against the default:
  the same records to the bit but the window's d's and k_hat's, the same outputs and d's within
  the products' rounding, each variant's k_hat within the rounding bound of the exact value
  (`assert_k_hat_records`)."""
  inp = make_inputs(c)
  valid = np.asarray(inp["slot_ids"]) >= 0
  default, other = (replay_split.replay_verify_split(
      **inp, tuning=KernelTuning(block_v=c.block_v), dot_precision=c.precision,
      interpret=interpret, **kw) for kw in ({}, SPLIT_VARIANTS[variant]))
  f32 = lambda x: np.asarray(x, np.float32)
  assert rel_err(f32(default[0][valid]), f32(other[0][valid])) <= c.tol
  for name, x, y in zip(RING_NAMES, default[1:], other[1:]):
    if name == "ring_d":  # the window's d's carry the dots' rounding, as the outputs do
      x, y = f32(x), f32(y)
      np.testing.assert_array_equal(np.isnan(x), np.isnan(y))  # the poisoned entries
      assert rel_err(np.nan_to_num(x), np.nan_to_num(y)) <= c.tol, name
    elif name == "ring_k":  # the norm's sum order is the compiler's, kernel by kernel
      for kernel, got in (("default", x), (variant, y)):
        assert_k_hat_records(got, inp, c, kernel)
    else:
      np.testing.assert_array_equal(bits(x), bits(y), err_msg=name)


@pytest.mark.parametrize("c", [CASES[0], CASES[7]], ids=[CASES[0].id, CASES[7].id])
def test_coefficient_loads_first_same_bits(c: Case, interpret):
  """The coefficients kernel with every load issued first (``coefficient_loads_first``) moves
  only its loads: the outputs and every ring bitwise those of the default order, NaN-poisoned
  entries included."""
  inp = make_inputs(c)
  default, first = (replay_split.replay_verify_split(
      **inp, tuning=KernelTuning(block_v=c.block_v), dot_precision=c.precision,
      interpret=interpret, coefficient_loads_first=f) for f in (False, True))
  for name, x, y in zip(("o", *RING_NAMES), default, first):
    np.testing.assert_array_equal(bits(x), bits(y), err_msg=name)


@pytest.mark.parametrize("c", [CASES[0], CASES[1]], ids=[CASES[0].id, CASES[1].id])
def test_stream_early_same_bits(c: Case, interpret):
  """The stream's epilogue loaded (and its Y-free products computed) before the K-loop
  (`replay_split.STREAM_EARLY`) moves only work: the outputs and every ring bitwise those of
  the epilogue after the loop, NaN-poisoned entries included, at T=4 and T=1."""
  inp = make_inputs(c, seed=5)
  run = lambda: replay_split.replay_verify_split(
      **inp, tuning=KernelTuning(block_v=c.block_v), dot_precision=c.precision,
      interpret=interpret)
  outs = {early: _under_knob(replay_split, "STREAM_EARLY", early, run)
          for early in replay_split.STREAM_EARLIES}
  for early, out in outs.items():
    for name, x, y in zip(("o", *RING_NAMES), outs["none"], out):
      np.testing.assert_array_equal(bits(x), bits(y), err_msg=f"{early}: {name}")


def _flush_some_rows(inp, c: Case):
  """Cursors of a step in which the rows with a full ring (write_pos L - T) fold their history
  first: per row the records to fold, their first ring index, and the cursors the window then
  sees (a folded row has no history left; the others keep theirs). The padding row asks for a
  fold it must not do."""
  wp, cb = np.asarray(inp["write_pos"]), np.asarray(inp["cache_base"])
  pad = np.asarray(inp["slot_ids"]) < 0
  flush = (wp == c.L - c.T) | pad
  count = np.where(pad, 3, np.where(flush, wp, 0)).astype(np.int32)
  cursors = dict(write_pos=np.where(flush, 0, wp), cache_base=np.where(flush, (cb + wp) % c.L, cb))
  return (jnp.asarray(count), jnp.asarray(cb)), {n: jnp.asarray(x, jnp.int32)
                                                 for n, x in cursors.items()}


FUSED_CASES = [CASES[0], CASES[1], CASES[5]]


@pytest.mark.parametrize("first", [False, True], ids=["grid-order", "folding-first"])
@pytest.mark.parametrize("c", FUSED_CASES, ids=[c.id for c in FUSED_CASES])
def test_fold_inside_the_stream(c: Case, first, interpret):
  """`fold_and_replay_verify` (the fold in the split form's stream kernel, the folding rows'
  programs first, in the launch order's kernel, or not) against the fold kernel and then the
  split verify (`check_fold_inside`)."""
  check_fold_inside(c, make_inputs(c), tuning=KernelTuning(block_v=c.block_v),
                    fold_tuning=KernelTuning(block_v=max(c.block_v // 2, 1), num_warps=2,
                                             k_chunk=16),
                    form="split", interpret=interpret, fold_first=first)


def check_fold_inside(c: Case, inp, *, tuning, fold_tuning, form, interpret=None, copy=False,
                      kernels=None, **launch):
  """`fold_and_replay_verify` of ``form`` with the rows of `_flush_some_rows` folding, against
  the fold kernel and then `replay_verify` of the same form: the same checkpoint, outputs and
  rings, to the bit; the padding row gets zeros and folds nothing. With ``copy``, both fold
  into a bf16 checkpoint copy and verify from it; the copy starts unlike the rounded
  checkpoint, so a verify that read the fp32 rows, or a copy row rewritten that did not fold,
  would show. ``kernels``: another backend's ``(fold, replay_verify, fold_and_replay_verify)``
  (the triton ones); by default the Pallas kernels, run with ``interpret``."""
  if kernels is None:
    kernels = (functools.partial(k, interpret=interpret)
               for k in (fold.fold, replay_verify, fold_and_replay_verify))
  fold_fn, verify_fn, fold_and_verify_fn = kernels
  (count, fold_base), cursors = _flush_some_rows(inp, c)
  inp = {**inp, **cursors}
  valid = np.asarray(inp["slot_ids"]) >= 0
  ssm_copy = (1.5 * inp["ssm"]).astype(jnp.bfloat16) if copy else None
  folded = fold_fn(inp["ssm"], inp["ring_rawk"], inp["ring_rawv"], inp["ring_g"],
                   inp["ring_beta"], inp["slot_ids"], count, fold_base, tuning=fold_tuning,
                   ssm_copy=ssm_copy)
  folded, folded_copy = folded if copy else (folded, None)
  assert not np.array_equal(bits(folded), bits(inp["ssm"]))  # some rows did fold
  apart = verify_fn(**{**inp, "ssm": folded_copy if copy else folded}, tuning=tuning,
                    dot_precision=c.precision, form=form)
  o, ssm, *rings = fold_and_verify_fn(**inp, fold_count=count, fold_base=fold_base,
                                      tuning=tuning, fold_tuning=fold_tuning,
                                      dot_precision=c.precision, form=form, ssm_copy=ssm_copy,
                                      **launch)
  if copy:
    ssm, ssm_copy = ssm
    np.testing.assert_array_equal(bits(ssm_copy), bits(folded_copy))
  np.testing.assert_array_equal(bits(ssm), bits(folded))
  np.testing.assert_array_equal(bits(o[valid]), bits(apart[0][valid]))
  np.testing.assert_array_equal(np.asarray(o[~valid], np.float32), 0.0)
  for name, x, y in zip(RING_NAMES, rings, apart[1:]):
    np.testing.assert_array_equal(bits(x), bits(y), err_msg=name)


@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("c", [FUSED_CASES[0], FUSED_CASES[2]], ids=lambda c: c.id)
def test_fold_inside_the_stream_in_several_tiles(c: Case, interleave, interpret):
  """A stream program folding its checkpoint rows as four tiles, one after the other or in one
  record loop (`fold.FoldLoop.interleave`): the fold kernel's bits, as with one."""
  inp = make_inputs(c, seed=2)
  (count, fold_base), cursors = _flush_some_rows(inp, c)
  inp = {**inp, **cursors}
  # Both hold a 4-row tile over two warps: one layout, so the bits are the fold kernel's on a GPU.
  fold_tuning = KernelTuning(block_v=c.block_v // 4, num_warps=2, k_chunk=16)
  folded = fold.fold(inp["ssm"], inp["ring_rawk"], inp["ring_rawv"], inp["ring_g"],
                     inp["ring_beta"], inp["slot_ids"], count, fold_base, tuning=fold_tuning,
                     interpret=interpret)
  assert not np.array_equal(bits(folded), bits(inp["ssm"]))  # some rows did fold
  ssm = replay_split.fold_replay_verify_split(
      **inp, fold_count=count, fold_base=fold_base,
      tuning=KernelTuning(block_v=c.block_v, num_warps=2), fold_tuning=fold_tuning,
      fold_block_v=c.block_v // 4, fold_interleave=interleave,
      dot_precision=c.precision, interpret=interpret)[1]
  np.testing.assert_array_equal(bits(ssm), bits(folded))


@pytest.mark.parametrize("tiles", [1, 2])
@pytest.mark.parametrize("form", ["ut", "vec"])
@pytest.mark.parametrize("c", FUSED_CASES, ids=[c.id for c in FUSED_CASES])
def test_fold_inside_one_kernel(c: Case, form, tiles, interpret):
  """`fold_and_replay_verify` in the one-kernel forms (each program folds its checkpoint rows,
  as one tile or two in one record loop, then verifies) against the fold kernel and then the
  same form (`check_fold_inside`)."""
  # As many rows a warp as the fold kernel's programs: one layout, the same bits on a GPU.
  check_fold_inside(c, make_inputs(c, seed=3), tuning=KernelTuning(block_v=c.block_v, num_warps=2),
                    fold_tuning=KernelTuning(block_v=c.block_v // tiles, num_warps=2, k_chunk=16),
                    form=form, interpret=interpret)


@pytest.mark.parametrize("c", FUSED_CASES, ids=[c.id for c in FUSED_CASES])
def test_fold_inside_writes_the_copy(c: Case, interpret):
  """With the checkpoint's bf16 copy (`SpecConfig.checkpoint_copy`), the split form's stream
  that folds (folding rows first) replays into the fp32 checkpoint, rewrites the folded rows'
  copy and reads the copy: the bits of the fold kernel with the copy and then the verify of
  the copy (`check_fold_inside`). The stream's K-chunks are not the fold's width, which
  `replay_split._stream` would halve for the copy (its outputs' sums then unlike the verify
  apart's; `test_pallas_sass.py` checks why it does)."""
  check_fold_inside(c, make_inputs(c, seed=4),
                    tuning=KernelTuning(block_v=c.block_v, num_warps=2, k_chunk=8),
                    fold_tuning=KernelTuning(block_v=c.block_v // 2, num_warps=2, k_chunk=16),
                    form="split", interpret=interpret, copy=True)


def test_fused_cases_permute_the_rows():
  """`test_fold_inside_the_stream`'s fold-first launch meets a launch order that is not the row
  order, so a row's arrays read at the wrong place would show."""
  orders = []
  for c in FUSED_CASES:
    inp = make_inputs(c)
    (count, _), _ = _flush_some_rows(inp, c)
    orders.append(launch_order.fold_first_order(count, inp["slot_ids"])[0].tolist())
  assert any(order != sorted(order) for order in orders), orders


def test_fold_inside_the_stream_without_folding_rows(interpret):
  """With no row to fold, the stream that folds is the plain stream: the split verify's bits,
  the checkpoint untouched (the padding row's fold count must fold nothing)."""
  c = FUSED_CASES[0]
  inp = make_inputs(c)
  count = jnp.where(inp["slot_ids"] < 0, 3, 0).astype(jnp.int32)
  tuning = KernelTuning(block_v=c.block_v)
  plain = replay_verify(**inp, tuning=tuning, dot_precision=c.precision, interpret=interpret,
                        form="split")
  o, ssm, *rings = replay_split.fold_replay_verify_split(
      **inp, fold_count=count, fold_base=inp["cache_base"], tuning=tuning,
      fold_tuning=KernelTuning(block_v=max(c.block_v // 2, 1), num_warps=2, k_chunk=16),
      dot_precision=c.precision, interpret=interpret)
  np.testing.assert_array_equal(bits(ssm), bits(inp["ssm"]))
  for name, x, y in zip(("o", *RING_NAMES), (o, *rings), plain):
    np.testing.assert_array_equal(bits(x), bits(y), err_msg=name)


def test_fold_inside_the_stream_validation():
  c = CASES[0]
  inp = make_inputs(c)
  (count, fold_base), _ = _flush_some_rows(inp, c)
  call = functools.partial(fold_and_replay_verify, **inp, fold_base=fold_base,
                           tuning=KernelTuning(block_v=16), dot_precision="ieee", interpret=True)
  with pytest.raises(ValueError, match=r"the ut form's programs \(16 rows, 4 warps\) cannot fold "
                     r"in tiles of 8 rows a warp"):  # 32-row tiles
    call(fold_count=count, fold_tuning=KernelTuning(block_v=8, num_warps=1), form="ut")
  with pytest.raises(ValueError, match=r"fold_count is float32\[4\]; expected int32\[4\]"):
    call(fold_count=count.astype(jnp.float32), fold_tuning=KernelTuning(block_v=8), form="split")
  with pytest.raises(ValueError, match=r"ssm_copy is float32\[6, 4, 32, 32\]; expected "
                     r"bfloat16\[6, 4, 32, 32\] \(the fp32 checkpoints and their bf16 copy\)"):
    call(fold_count=count, fold_tuning=KernelTuning(block_v=8), form="split",
         ssm_copy=inp["ssm"])
  with pytest.raises(ValueError,
                     match=r"ssm is float32\[6, 4, 32, 32\]; expected float32\[6, 4, 32, 16\]"):
    call(fold_count=count, fold_tuning=KernelTuning(block_v=8), form="split",
         ssm_copy=inp["ssm"][..., :16].astype(jnp.bfloat16))
  with pytest.raises(ValueError, match="the vec form does not fold with a checkpoint copy"):
    call(fold_count=count, fold_tuning=KernelTuning(block_v=8, num_warps=2), form="vec",
         ssm_copy=inp["ssm"].astype(jnp.bfloat16))
  with pytest.raises(ValueError, match="multiple of the fold's block_v=32"):
    replay_split.fold_replay_verify_split(
        **inp, fold_count=count, fold_base=fold_base, tuning=KernelTuning(block_v=16),
        fold_tuning=KernelTuning(block_v=16), fold_block_v=32, dot_precision="ieee",
        interpret=True)


def test_zero_history_matches_recurrent_window():
  """write_pos = 0 everywhere: the outputs are those of `reference.verify_window` from ssm."""
  c = dataclasses.replace(CASES[0], pad_row=None)  # the shapes of CASES[0]: no recompile
  inp = make_inputs(c, seed=1)
  inp["write_pos"] = jnp.zeros_like(inp["write_pos"])
  o = replay_verify(**inp, tuning=KernelTuning(block_v=c.block_v), dot_precision="ieee",
                    interpret=True)[0]
  g, beta = reference.gdn_gating(inp["a"], inp["b"], inp["A_log"], inp["dt_bias"])
  o_rec, _ = reference.verify_window(inp["q"], inp["k"], inp["v"], g, beta,
                                     inp["ssm"][inp["slot_ids"]])
  assert rel_err(o, o_rec) <= TOLERANCE[("float32", "ieee")]


def _bad(inp, **changes):
  return {**inp, **changes}


@pytest.mark.parametrize("change, match", [
    (lambda i: dict(ring_rawk=i["ring_rawk"].astype(jnp.float32)),
     r"ring_rawk is float32.*expected bfloat16"),
    (lambda i: dict(ring_d=i["ring_d"][:, :, :8]), r"ring_d is .*expected"),
    (lambda i: dict(ring_k=i["ring_k"].astype(jnp.float32)),
     r"ring_k is float32.*expected bfloat16"),
    (lambda i: dict(write_pos=i["write_pos"].astype(jnp.float32)), r"write_pos is float32"),
    (lambda i: dict(ssm=i["ssm"].astype(jnp.float16)), r"ssm is float16.*expected float32"),
    (lambda i: {n: i[n][..., :12] for n in ("ring_g", "ring_beta")}
     | {n: i[n][:, :, :12] for n in ("ring_d", "ring_k", "ring_rawk", "ring_rawv")},
     r"L=12 must be a power of two"),
], ids=["rawk-dtype", "ring_d-shape", "ring_k-dtype", "cursor-dtype", "ssm-dtype", "ring-len"])
def test_validation(change, match):
  inp = make_inputs(Case(2, 2, 16, 1, 2, 16, 16, 16, act="bfloat16", ring="bfloat16"))
  for fn in (replay_verify, replay_verify_reference):
    with pytest.raises(ValueError, match=match):
      fn(**_bad(inp, **change(inp)), tuning=KernelTuning(block_v=16), dot_precision="ieee",
         interpret=True)


def test_knob_validation():
  inp = make_inputs(Case(2, 2, 16, 1, 2, 16, 16, 16))
  with pytest.raises(ValueError, match="dot_precision='fp64'"):
    replay_verify(**inp, tuning=KernelTuning(block_v=16), dot_precision="fp64", interpret=True)
  with pytest.raises(ValueError, match="block_v=12"):
    replay_verify(**inp, tuning=KernelTuning(block_v=12), dot_precision="ieee", interpret=True)
  with pytest.raises(ValueError, match="coefficients='cublas' is unknown"):
    replay_split.replay_verify_split(**inp, tuning=KernelTuning(block_v=16),
                                     dot_precision="ieee", interpret=True, coefficients="cublas")
  with pytest.raises(ValueError, match="coefficient_window_mma needs bfloat16 activations"):
    replay_split.replay_verify_split(**inp, tuning=KernelTuning(block_v=16), dot_precision="ieee",
                                     interpret=True, coefficient_window_mma=True)
  with pytest.raises(ValueError, match="STREAM_EARLY='always' is unknown"):
    _under_knob(replay_split, "STREAM_EARLY", "always", lambda: replay_split.replay_verify_split(
        **inp, tuning=KernelTuning(block_v=16), dot_precision="ieee", interpret=True))


@pytest.mark.parametrize("T,B", [(1, 1), (1, 8), (1, 63), (1, 64), (1, 256), (4, 1), (4, 15),
                                 (4, 16), (4, 256)])
def test_default_launches_hold_the_fold(T, B, monkeypatch):
  """Each form's default launch holds whole fold tiles (`replay_split.stream_fold_block_v`), so
  its programs can fold the flush rows themselves; a vector tile of 32 rows over 4 warps cannot
  (benchmarks/NOTES.md run 43: its steps folded behind a conditional instead)."""
  V = 128
  fold_tuning = KernelTuning.state_default(V)
  assert replay_split.stream_fold_block_v(KernelTuning.replay_default(V, T, B), fold_tuning) > 0
  monkeypatch.setattr(backend, "VEC_TILE", (32, 4, 32))
  narrow = KernelTuning.replay_default(V, T, B)
  assert (replay_split.stream_fold_block_v(narrow, fold_tuning) == 0) == (
      backend.replay_form(T, B) == "vec")


@pytest.mark.skipif(HAS_GPU, reason="checks the CPU refusal")
def test_interpret_flag_reaches_pallas_call():
  inp = make_inputs(Case(1, 1, 2, 1, 1, 16, 16, 16))
  with pytest.raises(ValueError, match="interpret"):
    replay_verify(**inp, tuning=KernelTuning(block_v=16), dot_precision="ieee", interpret=False)


@pytest.mark.parametrize("form", [f for f in FORMS if f != "vec"])  # vec: no dot
def test_interpreted_ieee_dots_ask_for_fp32(form):
  """Interpreted, every dot of an ``"ieee"`` verify asks XLA for exact fp32: on a GPU XLA's
  default is tf32, which took the interpreted ieee cases to 3e-4 of the oracle (H100, session
  39); the CPU is exact either way, so this is checked on the traced program."""
  c = CASES[0]
  verify = functools.partial(replay_verify, tuning=KernelTuning(block_v=c.block_v),
                             dot_precision="ieee", interpret=True, form=form)
  text = str(jax.make_jaxpr(lambda inp: verify(**inp))(make_inputs(c)))
  dots = text.count("dot_general[")
  assert dots > 0, "no dot in the traced verify"
  assert text.count("precision=(Precision.HIGHEST, Precision.HIGHEST)") == dots, text


@pytest.mark.parametrize("m,k,n", [(1, 128, 16), (4, 128, 4), (4, 4, 16), (8, 16, 2)])
def test_inline_products_match_dots(m, k, n):
  """`replay_parts.dot` and `dot_nt` written out as a multiply and a sum: the product of a dot
  in fp32 (against float64), and written out exactly when `inlines` says so."""
  rng = np.random.default_rng(m * k * n)
  x, y = rng.standard_normal((m, k)), rng.standard_normal((k, n))
  exact = x @ y
  hp = jax.lax.Precision.HIGHEST
  for inline in (None, 0, m * k * n - 1, m * k * n):
    got = replay_parts.dot(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32), hp, inline)
    got_nt = replay_parts.dot_nt(jnp.asarray(x, jnp.float32), jnp.asarray(y.T, jnp.float32), hp,
                                 inline)
    for g in (got, got_nt):
      assert g.shape == (m, n) and g.dtype == jnp.float32
      assert rel_err(np.asarray(g, np.float64), exact) <= 1e-6
  assert not replay_parts.inlines(m, k, n, None)
  assert replay_parts.inlines(m, k, n, m * k * n)
  assert replay_parts.inlines(m, k, n, 0) == (m == 1 or n == 1)  # a single row or column
  assert replay_parts.inlines(m, k, n, m * k * n - 1) == (m == 1 or n == 1)


def _under_knob(module, name: str, value, run):
  """``run()`` with every kernel traced under ``module.name = value`` (a knob read when a
  kernel is traced, so the caches are cleared on the way in and out)."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(module, name, value)
    jax.clear_caches()
    out = jax.block_until_ready(run())
  jax.clear_caches()
  return out


def _under_grid(grid: str, run):
  """``run()`` with every kernel traced in the ``grid`` launch order (`backend.TILE_GRID`)."""
  return _under_knob(backend, "TILE_GRID", grid, run)


def test_grid_orders_keep_the_bits(interpret):
  """Launching a row's programs together (``"tiles"``) or one head of every row after the other
  (``"rows"``) changes no bit of any kernel that takes the order: recurrent verify and decode,
  the fold, the split form's coefficients and stream (with and without the fold inside), and
  the one-kernel forms."""
  c = FUSED_CASES[0]
  inp = make_inputs(c, seed=4)
  (count, fold_base), cursors = _flush_some_rows(inp, c)
  folding = {**inp, **cursors}
  state = KernelTuning(block_v=c.block_v // 2, num_warps=2, k_chunk=16)
  split = KernelTuning(block_v=c.block_v // 2, num_warps=2)  # four V-blocks a head (V=32)
  rec = (inp["ssm"], *(inp[n] for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias")),
         inp["slot_ids"])
  inter = jnp.zeros((inp["ssm"].shape[0], c.T, *inp["ssm"].shape[1:]), jnp.float32)
  runs = {
      "recurrent verify": lambda: recurrent.recurrent_verify(
          rec[0], inter, *rec[1:], tuning=state, interpret=interpret),
      "recurrent decode": lambda: recurrent.recurrent_decode(
          rec[0], *(x[:, :1] for x in rec[1:6]), *rec[6:], tuning=state, interpret=interpret),
      "fold": lambda: fold.fold(inp["ssm"], inp["ring_rawk"], inp["ring_rawv"], inp["ring_g"],
                                inp["ring_beta"], inp["slot_ids"], count, fold_base,
                                tuning=state, interpret=interpret),
      **{f"{form} verify": functools.partial(
          replay_verify, **inp, tuning=split if form == "split" else KernelTuning(block_v=16),
          dot_precision=c.precision, interpret=interpret, form=form) for form in FORMS},
      "split verify, fold inside": lambda: fold_and_replay_verify(
          **folding, fold_count=count, fold_base=fold_base, tuning=split, fold_tuning=state,
          dot_precision=c.precision, interpret=interpret, form="split", fold_first=False),
  }
  for name, run in runs.items():
    rows, tiles = (_under_grid(grid, run) for grid in ("rows", "tiles"))
    for x, y in zip(jax.tree.leaves(rows), jax.tree.leaves(tiles)):
      np.testing.assert_array_equal(bits(x), bits(y), err_msg=name)


def test_grid_order_names_the_programs():
  """`row_grid` and `row_ids` agree: the row is the first grid axis in ``"rows"`` order and the
  last in ``"tiles"`` order, the other axes reversed with it."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(backend, "TILE_GRID", "rows")
    assert backend.row_grid(5, 3, 2) == (5, 3, 2)
    patch.setattr(backend, "TILE_GRID", "tiles")
    assert backend.row_grid(5, 3, 2) == (2, 3, 5)
    assert backend.row_grid(5, 3) == (3, 5)
