"""Recurrent decode/verify kernels and the exact fold: against the references and the fp64 oracle."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oracle
from conftest import TOLERANCE, rel_err
from replayssm_jax.kernels import fold, recurrent
from replayssm_jax.kernels.backend import KernelTuning

# (B, T, H, HV, K, V, block_v): GQA 1/2/4, T 1..8, K and V 16/32/128.
CASES = [
    (3, 4, 2, 4, 16, 32, 16),
    (2, 1, 2, 2, 32, 16, 16),
    (2, 2, 1, 4, 16, 16, 8),
    (2, 8, 2, 4, 32, 32, 32),
    (2, 4, 1, 2, 128, 128, 32),
]
DTYPES = [jnp.float32, jnp.bfloat16]


def case_id(case):
  B, T, H, HV, K, V, bv = case
  return f"B{B}-T{T}-H{H}-HV{HV}-K{K}-V{V}-bv{bv}"


def make_inputs(rng, B, T, H, HV, K, V, dtype, slots=6):
  f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  return dict(
      q=f(B, T, H, K).astype(dtype), k=f(B, T, H, K).astype(dtype), v=f(B, T, HV, V).astype(dtype),
      a=f(B, T, HV).astype(dtype), b=f(B, T, HV).astype(dtype),
      A_log=jnp.log(jnp.asarray(rng.uniform(0.01, 0.5, HV), jnp.float32)),
      dt_bias=0.3 * f(HV),
      ssm=0.3 * f(slots, HV, V, K),
  )


def slot_ids_for(rng, B, slots=6):
  """Distinct slots with the last row as padding."""
  ids = rng.permutation(slots)[:B].astype(np.int32)
  ids[-1] = -1
  return jnp.asarray(ids)


def check_recurrent_verify(case, dtype, verify) -> None:
  """``verify(args, block_v) -> (o, intermediate)`` against the oracle and the XLA reference.

  Shared by every backend's tests: outputs poisoned with NaN, padding rows zero, slots no row
  names untouched.
  """
  B, T, H, HV, K, V, bv = case
  rng = np.random.default_rng(abs(hash((case, jnp.dtype(dtype).name))) % 2**32)
  x = make_inputs(rng, B, T, H, HV, K, V, dtype)
  slots = slot_ids_for(rng, B)
  num_slots = x["ssm"].shape[0]
  poison = jnp.full((num_slots, T, HV, V, K), jnp.nan, jnp.float32)
  args = (x["ssm"], poison, x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], slots)
  o, inter = verify(args, bv)
  o_ref, inter_ref = recurrent.recurrent_verify_reference(*args)
  assert o.dtype == dtype and inter.dtype == jnp.float32

  valid = np.asarray(slots) >= 0
  s = np.asarray(slots)[valid]
  o64, states64, _ = oracle.run_tokens(np.asarray(x["ssm"])[s], *(np.asarray(x[n], np.float32)[valid] for n in "qkvab"),
                                       x["A_log"], x["dt_bias"])
  tol = TOLERANCE[(jnp.dtype(dtype).name, "ieee")]
  assert rel_err(o[valid], o64) < tol
  assert rel_err(inter[s], states64) < 1e-5  # states stay fp32 whatever the activations
  assert rel_err(inter[s], inter_ref[s]) < 1e-6
  assert rel_err(o, o_ref) < tol
  # Padding rows: zero output; slots no row names keep their poison.
  np.testing.assert_array_equal(np.asarray(o[~valid], np.float32), 0)
  untouched = np.setdiff1d(np.arange(num_slots), s)
  assert np.isnan(np.asarray(inter)[untouched]).all()
  assert not np.isnan(np.asarray(inter)[s]).any()


def check_recurrent_decode(case, decode) -> None:
  """``decode(args, block_v) -> (o, ssm)``: one token per row, the state updated in place."""
  B, _, H, HV, K, V, bv = case
  rng = np.random.default_rng(7)
  x = make_inputs(rng, B, 1, H, HV, K, V, jnp.float32)
  slots = slot_ids_for(rng, B)
  before = np.asarray(x["ssm"])
  args = (x["ssm"], x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], slots)
  o, ssm = decode(args, bv)
  valid = np.asarray(slots) >= 0
  s = np.asarray(slots)[valid]
  o64, states64, _ = oracle.run_tokens(before[s], *(np.asarray(x[n])[valid] for n in "qkvab"),
                                       x["A_log"], x["dt_bias"])
  assert rel_err(ssm[s], states64[:, 0]) < 1e-5
  assert rel_err(o[valid], o64) < 1e-5
  untouched = np.setdiff1d(np.arange(before.shape[0]), s)
  np.testing.assert_array_equal(np.asarray(ssm)[untouched], before[untouched])
  np.testing.assert_array_equal(np.asarray(o)[~valid], 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_recurrent_verify(case, dtype, interpret):
  check_recurrent_verify(case, dtype, lambda args, bv: recurrent.recurrent_verify(
      *args, tuning=KernelTuning(block_v=bv), interpret=interpret))


@pytest.mark.parametrize("case", CASES[:3], ids=case_id)
def test_recurrent_decode_in_place(case, interpret):
  check_recurrent_decode(case, lambda args, bv: recurrent.recurrent_decode(
      *args, tuning=KernelTuning(block_v=bv), interpret=interpret))


def ring_from_tokens(x, slots, L, cache_base, rng):
  """Rings whose logical records 0..T-1 (at cache_base + i) hold the window tokens."""
  B, T, H, K = x["q"].shape
  HV, V = x["v"].shape[2:]
  from replayssm_jax import reference
  g, beta = reference.gdn_gating(x["a"], x["b"], x["A_log"], x["dt_bias"])
  rawk = jnp.asarray(rng.standard_normal((6, H, L, K)), x["k"].dtype)
  rawv = jnp.asarray(rng.standard_normal((6, HV, L, V)), x["v"].dtype)
  ring_g = jnp.asarray(rng.standard_normal((6, HV, L)), jnp.float32)
  ring_beta = jnp.asarray(rng.standard_normal((6, HV, L)), jnp.float32)
  for row, slot in enumerate(np.asarray(slots)):
    if slot < 0:
      continue
    p = (cache_base[row] + np.arange(T)) % L
    rawk = rawk.at[slot, :, p].set(x["k"][row])
    rawv = rawv.at[slot, :, p].set(x["v"][row])
    ring_g = ring_g.at[slot, :, p].set(g[row])
    ring_beta = ring_beta.at[slot, :, p].set(beta[row])
  return rawk, rawv, ring_g, ring_beta


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_fold_bitwise_equals_recurrent_verify(case, dtype, interpret):
  """Folding n records equals the recurrent state after n tokens, bit for bit (DESIGN section 4)."""
  check_fold(case, dtype, interpret)


@pytest.mark.parametrize("v_blocks, prefetch, interleave, ahead, at",
                         [(1, True, False, False, "start"), (2, False, False, False, "start"),
                          (4, True, False, False, "start"), (4, False, False, False, "start"),
                          (2, True, True, False, "start"), (4, False, True, False, "start"),
                          (1, True, False, True, "start"), (4, True, False, True, "start"),
                          (2, True, True, True, "start"), (1, True, False, False, "end"),
                          (1, True, False, True, "end"), (2, True, True, True, "end")])
def test_fold_launches_keep_the_bits(v_blocks, prefetch, interleave, ahead, at, interpret):
  """The fold's own launch (V-blocks per program, one after the other or interleaved in one
  record loop; record prefetch before or after an update, with the next k normalised ahead)
  leaves its bits alone."""
  case = (3, 4, 2, 4, 16, 32, 8)  # four V-tiles per head
  check_fold(case, jnp.bfloat16, interpret, v_blocks=v_blocks, prefetch=prefetch,
             interleave=interleave, normalize_ahead=ahead, prefetch_at=at)


@pytest.mark.parametrize("order, at", [
    (("k", "v", "beta", "norm", "g"), "end"),
    (("g", "k", "norm", "v", "beta"), "end"),
    (("k", "g", "v", "beta", "norm"), "start"),
    (("beta", "v", "g", "k", "norm"), "end")])
def test_fold_record_orders_keep_the_bits(order, at, interpret):
  """The order of a record's loads leaves the bits alone."""
  check_fold((3, 4, 2, 4, 16, 32, 8), jnp.bfloat16, interpret, normalize_ahead=True,
             prefetch_at=at, record_order=order)


@pytest.mark.parametrize("records, ahead", [("L1", 0), ("L2", 0), ("off", 1), ("L1", 5),
                                             ("L2", 64)])
def test_fold_cache_prefetches_keep_the_bits(records, ahead, interpret):
  """Prefetching the records (to L1 or L2) and the checkpoint tile of a later program (into
  L2; 64 is past the grid's end) leaves the bits alone. Interpreted, nothing is prefetched."""
  check_fold((3, 4, 2, 4, 16, 32, 8), jnp.bfloat16, interpret, prefetch_records_to=records,
             prefetch_tile_ahead=ahead)


@pytest.mark.parametrize("launch", [{}, dict(v_blocks=2, interleave=True)], ids=["tile", "pair"])
def test_fold_leaves_rows_without_records_alone(launch, interpret):
  """A row with no record to fold (count 0) keeps its checkpoint beside rows that fold."""
  check_fold((5, 4, 2, 4, 16, 32, 8), jnp.bfloat16, interpret, idle_rows=True, **launch)


@pytest.mark.parametrize("launch", [{}, dict(v_blocks=2, interleave=True)], ids=["tile", "pair"])
def test_fold_writes_the_checkpoint_copy(launch, interpret):
  """With a checkpoint copy (`SpecConfig.checkpoint_copy`), the fold writes each folded tile
  rounded to bf16 into it (bitwise, both backends), and nothing else: rows that fold nothing
  and slots outside the batch keep their (NaN-poisoned) copy."""
  check_fold((5, 4, 2, 4, 16, 32, 8), jnp.bfloat16, interpret, idle_rows=True, copy=True,
             **launch)


@pytest.mark.parametrize("launch, message", [
    (dict(v_blocks=3), "v_blocks=3 must divide the 2 tiles"),
    (dict(prefetch_at="middle"), "prefetch_at='middle'; expected one of"),
    (dict(prefetch_records_to="L3"), "prefetch_records_to='L3'; expected one of"),
    (dict(prefetch_tile_ahead=-1), "prefetch_tile_ahead=-1 must be >= 0"),
    (dict(record_order=("norm", "k", "v", "g", "beta")), "with 'norm' after 'k'"),
    (dict(record_order=("k", "norm", "v", "g")), "each once")])
def test_fold_refuses_an_unknown_launch(launch, message):
  with pytest.raises(ValueError, match=message):
    _small_fold(**launch)


@pytest.mark.parametrize("copy, message", [
    (lambda s: s, r"ssm_copy is float32\[.*\]; expected bfloat16"),
    (lambda s: s[..., :8].astype(jnp.bfloat16),
     r"ssm is float32\[.*, 16\]; expected float32\[.*, 8\] \(the fp32 checkpoints and their")])
def test_fold_refuses_a_copy_unlike_the_checkpoint(copy, message):
  """`fold.check_copy`, which the verify that folds with the copy shares."""
  with pytest.raises(ValueError, match=message):
    _small_fold(copy=copy)


def _small_fold(copy=None, **launch):
  """`fold.fold` of two rows on the interpreter; ``copy``: the checkpoint copy from ``ssm``."""
  x = make_inputs(np.random.default_rng(0), 2, 1, 1, 2, 16, 32, jnp.float32)
  rings = ring_from_tokens(x, jnp.array([0, 1], jnp.int32), 4, np.zeros(2, np.int32),
                           np.random.default_rng(1))
  return fold.fold(x["ssm"], *rings, jnp.array([0, 1], jnp.int32), jnp.ones(2, jnp.int32),
                   jnp.zeros(2, jnp.int32), tuning=KernelTuning(block_v=16), interpret=True,
                   ssm_copy=None if copy is None else copy(x["ssm"]), **launch)


def check_fold(case, dtype, interpret, idle_rows=False, copy=False, **launch):
  """Fold 1..T records (0..T with ``idle_rows``) of each row: bitwise the recurrent state; with
  ``copy``, into a NaN-poisoned checkpoint copy too, only the folded rows."""
  B, T, H, HV, K, V, bv = case
  L = 16
  rng = np.random.default_rng(11)
  x = make_inputs(rng, B, T, H, HV, K, V, dtype)
  slots = slot_ids_for(rng, B)
  tuning = KernelTuning(block_v=bv)
  inter = jnp.zeros((6, T, HV, V, K), jnp.float32)
  args = (x["ssm"], inter, x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], slots)
  _, inter = recurrent.recurrent_verify(*args, tuning=tuning, interpret=interpret)
  _, inter_x = recurrent.recurrent_verify_reference(*args)

  base = rng.integers(0, L, B).astype(np.int32)
  rings = ring_from_tokens(x, slots, L, base, rng)
  count = rng.integers(1, T + 1, B)
  if idle_rows:  # row 1 folds nothing
    count[1] = 0
  count = jnp.asarray(count, jnp.int32)
  if copy:
    poison = jnp.full(x["ssm"].shape, jnp.nan, jnp.bfloat16)
    launch["ssm_copy"] = poison
  folded = fold.fold(x["ssm"], *rings, slots, count, jnp.asarray(base), tuning=tuning,
                     interpret=interpret, **launch)
  folded_x = fold.fold_reference(x["ssm"], *rings, slots, count, jnp.asarray(base),
                                 **({"ssm_copy": poison} if copy else {}))
  if copy:
    (folded, folded_copy), (folded_x, folded_copy_x) = folded, folded_x
    wrote = np.zeros(6, bool)
    wrote[np.asarray(slots)[(np.asarray(slots) >= 0) & (np.asarray(count) > 0)]] = True
    for c, f in ((folded_copy, folded), (folded_copy_x, folded_x)):
      np.testing.assert_array_equal(np.asarray(c)[wrote], np.asarray(f.astype(c.dtype))[wrote])
      assert np.isnan(np.asarray(c, np.float32)[~wrote]).all()
    assert wrote.any() and not wrote.all()
  for row, slot in enumerate(np.asarray(slots)):
    if slot < 0:
      continue
    n = int(count[row])
    want = np.asarray(x["ssm"][slot]) if n == 0 else np.asarray(inter[slot, n - 1])
    want_x = np.asarray(x["ssm"][slot]) if n == 0 else np.asarray(inter_x[slot, n - 1])
    np.testing.assert_array_equal(np.asarray(folded[slot]), want)
    np.testing.assert_array_equal(np.asarray(folded_x[slot]), want_x)
  untouched = np.setdiff1d(np.arange(6), np.asarray(slots)[np.asarray(slots) >= 0])
  np.testing.assert_array_equal(np.asarray(folded)[untouched], np.asarray(x["ssm"])[untouched])
