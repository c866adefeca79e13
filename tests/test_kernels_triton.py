"""The triton backend (kernels/triton/): the Pallas kernel tests' cases and oracles, plus sm_90 compiles.

The kernel tests take a ``mode``:

- ``compiled`` (marked ``gpu``): jax-triton on a GPU (H200, 2026-11-30: 46 passed,
  benchmarks/gpu_tests_h200.md).
- ``interpreted``: Triton's CPU interpreter over host copies. ``triton.jit`` builds interpreted
  kernels only when ``TRITON_INTERPRET=1`` is set before triton is imported, so a plain run
  executes these in a subprocess (`test_interpreter_run`); they skip elsewhere.

The compile tests need no GPU: every kernel is compiled for sm_90 with the triton wheel's
compiler and ptxas, its cubin checked for spills, and the state kernels are checked to hold
their tile in one layout and to round alike (no contracted multiply-adds): the CPU-side proxies
for the fold's bitwise tie; the GPU tests check the bits.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import re
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("triton", reason="the triton backend needs the triton extra: "
                    "pip install -e '.[triton]'")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import test_kernels_recurrent as rec_tests  # noqa: E402
import test_kernels_replay_verify as replay_tests  # noqa: E402
import test_ssm_replay  # noqa: E402
from conftest import TOLERANCE, rel_err  # noqa: E402
from replayssm_jax.kernels import fold as pallas_fold  # noqa: E402
from replayssm_jax.kernels import triton as triton_kernels  # noqa: E402
from replayssm_jax.kernels.backend import KernelTuning  # noqa: E402
from replayssm_jax.kernels.triton import compile_check  # noqa: E402
from replayssm_jax.kernels.triton import replay_split as triton_split  # noqa: E402
from replayssm_jax.kernels.triton.launch import (Launch, compile_sm90, local_bytes,  # noqa: E402
                                                 programs_per_sm, resource_usage)
from replayssm_jax.kernels.triton.launch import run as run_launch  # noqa: E402
from replayssm_jax.kernels.triton.replay_verify import RING_NAMES, replay_form  # noqa: E402
from replayssm_jax.kernels.triton import tile  # noqa: E402
from replayssm_jax.kernels.triton.tile import INTERPRET  # noqa: E402

HAS_JAX_TRITON = importlib.util.find_spec("jax_triton") is not None
SLOTS = 6  # rec_tests.make_inputs' slot count


@pytest.fixture(params=[pytest.param("compiled", marks=pytest.mark.gpu), "interpreted"])
def mode(request) -> str:
  """How the kernels run: jax-triton on the GPU, or Triton's interpreter (TRITON_INTERPRET=1)."""
  if request.param == "interpreted" and not INTERPRET:
    pytest.skip("needs TRITON_INTERPRET=1 before triton is imported (test_interpreter_run)")
  if request.param == "compiled" and (INTERPRET or not HAS_JAX_TRITON):
    pytest.skip("needs jax-triton and a GPU, without TRITON_INTERPRET")
  return request.param


def state_tuning(block_v: int) -> KernelTuning:
  """The backend's state tuning at the case's block_v (the Pallas tests' knob)."""
  return dataclasses.replace(triton_kernels.state_tuning(128), block_v=block_v)


# ----------------------------------------------------------------------------- recurrent, fold


@pytest.mark.parametrize("dtype", rec_tests.DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("case", rec_tests.CASES, ids=rec_tests.case_id)
def test_recurrent_verify(case, dtype, mode):
  rec_tests.check_recurrent_verify(case, dtype, lambda args, bv: triton_kernels.recurrent_verify(
      *args, tuning=state_tuning(bv)))


@pytest.mark.parametrize("case", rec_tests.CASES[:3], ids=rec_tests.case_id)
def test_recurrent_decode_in_place(case, mode):
  rec_tests.check_recurrent_decode(case, lambda args, bv: triton_kernels.recurrent_decode(
      *args, tuning=state_tuning(bv)))


def records_of_window(x, slots, L: int, cache_base):
  """The rings after the triton replay verify of the window at logical 0..T-1 (write_pos 0):
  raw k, raw v, g and beta as the ring holds them in serving, for the fold to replay."""
  B, T, H, K = x["q"].shape
  HV, V = x["v"].shape[2:]
  act = x["q"].dtype
  rings = dict(ring_d=jnp.zeros((SLOTS, HV, L, V), act), ring_k=jnp.zeros((SLOTS, H, L, K), act),
               ring_g=jnp.zeros((SLOTS, HV, L), jnp.float32),
               ring_beta=jnp.zeros((SLOTS, HV, L), jnp.float32),
               ring_rawk=jnp.zeros((SLOTS, H, L, K), act), ring_rawv=jnp.zeros((SLOTS, HV, L, V), act))
  out = triton_kernels.replay_verify(
      x["ssm"], *rings.values(), x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"],
      x["dt_bias"], slots, jnp.zeros(B, jnp.int32), cache_base,
      tuning=triton_kernels.replay_tuning(V, T), dot_precision="default")
  rings = dict(zip(RING_NAMES, out[1:]))
  return rings["ring_rawk"], rings["ring_rawv"], rings["ring_g"], rings["ring_beta"]


@pytest.mark.parametrize("dtype", rec_tests.DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("case", rec_tests.CASES, ids=rec_tests.case_id)
def test_fold_bitwise_equals_recurrent_verify(case, dtype, mode):
  """Folding n records equals the triton recurrent state after n tokens, bit for bit.

  The records are those the triton replay verify writes for the same window (DESIGN sections
  3-4), so g and beta come from the same `tile.gating` as the recurrent kernel's.
  """
  B, T, H, HV, K, V, bv = case
  L = 16
  rng = np.random.default_rng(11)
  x = rec_tests.make_inputs(rng, B, T, H, HV, K, V, dtype)
  slots = rec_tests.slot_ids_for(rng, B)
  tuning = state_tuning(bv)
  inter = jnp.zeros((SLOTS, T, HV, V, K), jnp.float32)
  args = (x["ssm"], inter, x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], slots)
  _, inter = triton_kernels.recurrent_verify(*args, tuning=tuning)

  base = jnp.asarray(rng.integers(0, L, B).astype(np.int32))
  rings = records_of_window(x, slots, L, base)
  count = jnp.asarray(rng.integers(1, T + 1, B), jnp.int32)
  folded = triton_kernels.fold(x["ssm"], *rings, slots, count, base, tuning=tuning)
  folded_ref = pallas_fold.fold_reference(x["ssm"], *rings, slots, count, base)
  for row, slot in enumerate(np.asarray(slots)):
    if slot < 0:
      continue
    n = int(count[row])
    np.testing.assert_array_equal(np.asarray(folded[slot]), np.asarray(inter[slot, n - 1]),
                                  err_msg=f"row {row}, {n} records")
  assert rel_err(folded, folded_ref) < 1e-6
  untouched = np.setdiff1d(np.arange(SLOTS), np.asarray(slots)[np.asarray(slots) >= 0])
  np.testing.assert_array_equal(np.asarray(folded)[untouched], np.asarray(x["ssm"])[untouched])


@pytest.mark.parametrize("case", rec_tests.CASES[:3], ids=rec_tests.case_id)
def test_fold_writes_the_checkpoint_copy(case, mode):
  """With a checkpoint copy the fold writes the folded rows' tiles rounded to bf16 (bitwise
  the fp32 result rounded) and nothing else (NaN-poisoned elsewhere); the fp32 fold is the
  plain fold's, bitwise."""
  B, T, H, HV, K, V, bv = case
  rng = np.random.default_rng(12)
  x = rec_tests.make_inputs(rng, B, T, H, HV, K, V, jnp.bfloat16)
  slots = rec_tests.slot_ids_for(rng, B)
  base = jnp.asarray(rng.integers(0, 16, B).astype(np.int32))
  rings = records_of_window(x, slots, 16, base)
  count = np.asarray(rng.integers(0, T + 1, B), np.int32)
  count[0] = max(count[0], 1)
  count = jnp.asarray(count)
  tuning = state_tuning(bv)
  poison = jnp.full(x["ssm"].shape, jnp.nan, jnp.bfloat16)
  plain = triton_kernels.fold(x["ssm"], *rings, slots, count, base, tuning=tuning)
  folded, copy = triton_kernels.fold(x["ssm"], *rings, slots, count, base, tuning=tuning,
                                     ssm_copy=poison)
  np.testing.assert_array_equal(np.asarray(folded), np.asarray(plain))
  wrote = np.zeros(SLOTS, bool)
  wrote[np.asarray(slots)[(np.asarray(slots) >= 0) & (np.asarray(count) > 0)]] = True
  np.testing.assert_array_equal(np.asarray(copy)[wrote],
                                np.asarray(folded.astype(jnp.bfloat16))[wrote])
  assert wrote.any() and np.isnan(np.asarray(copy, np.float32)[~wrote]).all()


@triton.jit
def _fma_chunks_probe(S_ptr, x_ptr, out_ptr, BV: tl.constexpr, K: tl.constexpr,
                      KC: tl.constexpr):
  """``out = S x`` of a ``[BV, K]`` tile through `tile.fma_chunks`, then the chunk's columns."""
  rows, cols = tile.state_offsets(BV, K, KC)
  S, x = tile.load_tile(S_ptr, rows, cols), tile.load_vector(x_ptr, rows, cols)
  tl.store(out_ptr + tl.arange(0, BV), tl.sum(tile.fma_chunks(S, x), axis=1))


@pytest.mark.parametrize("BV,K,KC", [(16, 128, 16), (8, 64, 8), (8, 16, 16)],
                         ids=["8chunks", "8chunks_kc8", "1chunk"])
def test_fma_chunks_sums_the_chunk_products(BV, K, KC, mode):
  """`tile.fma_chunks`' pairs ``(a, b)`` stand for ``a * b``: the chain adds every chunk's
  products, the first one too, and a one-chunk tile (no combine) still multiplies. The
  interpreted kernels take ``tl.sum`` (`tile.FMA_MATVEC`), so this is its test there."""
  rng = np.random.default_rng(3)
  S, x = rng.standard_normal((BV, K)).astype(np.float32), rng.standard_normal(K).astype(np.float32)
  launch = Launch(kernel=_fma_chunks_probe, name=f"fma_chunks_probe_{BV}_{K}_{KC}",
                  grid=(1, 1, 1), inputs=dict(S=jnp.asarray(S), x=jnp.asarray(x)),
                  outputs=dict(out=jax.ShapeDtypeStruct((BV,), jnp.float32)),
                  constexprs=dict(BV=BV, K=K, KC=KC), num_warps=1, num_stages=1, fp_fusion=False)
  [out] = run_launch(launch)
  want = S.astype(np.float64) @ x.astype(np.float64)
  assert rel_err(np.asarray(out), want) < 1e-6


# ----------------------------------------------------------------------------- replay verify


def replay_tuning_for(c: replay_tests.Case, form: str) -> KernelTuning:
  """The case's block_v; the UT and split forms' tl.dot needs at least 16 (and a K-chunk of 16
  or more)."""
  return KernelTuning(block_v=c.block_v if form == "vec" else max(c.block_v, 16), k_chunk=32)


def ulp_close(got, want, dtype) -> None:
  """Equal up to 4 units in the last place of ``dtype``: the kernels' gates and norms use other
  exp / log1p implementations (libdevice; numpy in the interpreter) and sum in another order
  than XLA's."""
  eps = float(jnp.finfo(dtype).eps)
  np.testing.assert_allclose(replay_tests.f32(got), replay_tests.f32(want), rtol=4 * eps,
                             atol=4 * eps * 1e-3)


@pytest.mark.parametrize("form", ["ut", "vec", "split"])
@pytest.mark.parametrize("c", replay_tests.CASES, ids=[c.id for c in replay_tests.CASES])
def test_replay_verify(c: replay_tests.Case, form, mode):
  """Against the float64 oracle and the reference; each ring entry written right or untouched."""
  if form == "vec" and c.T != 1:
    pytest.skip("the triton vector form is the T=1 (decode) specialisation")
  check_replay_verify(c, form)


@pytest.mark.parametrize("form", ["ut", "vec", "split"])
@pytest.mark.parametrize("c", replay_tests.CASES[:3], ids=[c.id for c in replay_tests.CASES[:3]])
def test_replay_verify_reads_the_checkpoint_copy(c: replay_tests.Case, form, mode):
  """On the checkpoint's bf16 copy (`SpecConfig.checkpoint_copy`) every form gives the
  reference's outputs on that copy, within the bf16 floor (the split form's K-loop is a bf16
  dot of the window)."""
  if form == "vec" and c.T != 1:
    pytest.skip("the triton vector form is the T=1 (decode) specialisation")
  inp = replay_tests.make_inputs(c)
  inp["ssm"] = inp["ssm"].astype(jnp.bfloat16)
  tuning = replay_tuning_for(c, form)
  if form == "split":  # its stream pipelined as on the copy, over K-steps of 16 (two or more)
    tuning = dataclasses.replace(tuning, k_chunk=16, num_stages=triton_kernels.COPY_STREAM_STAGES)
  o, *_ = triton_kernels.replay_verify(**inp, tuning=tuning, dot_precision="default", form=form)
  ref_o, *_ = replay_tests.reference_jit(**inp)
  valid = np.asarray(inp["slot_ids"]) >= 0
  tol = TOLERANCE[(jnp.dtype(c.act).name, "bf16")]
  assert rel_err(replay_tests.f32(o[valid]), replay_tests.f32(ref_o[valid])) <= tol


# The split coefficients kernel's other settings: its knobs off, i.e. the window's own products
# written out rather than on the tensor cores (`WINDOW_MMA`, bf16 windows of 2-4 rows) and the
# value heads unrolled (`HEADS_LOOP`), the side wider windows take (both on since NOTES run
# 36), and the history weights from the ``[LP, LP]`` mask rather than a running sum in logical
# order (`HISTORY_SCAN`, on since session 39); and the mask alone.
COEFFICIENT_KNOBS = {"knobs_off": dict(WINDOW_MMA=False, HEADS_LOOP=False, HISTORY_SCAN=False),
                     "history_mask": dict(HISTORY_SCAN=False)}


@pytest.mark.parametrize("knobs", COEFFICIENT_KNOBS)
@pytest.mark.parametrize("c", replay_tests.CASES, ids=[c.id for c in replay_tests.CASES])
def test_split_coefficient_knobs(c: replay_tests.Case, knobs, mode, monkeypatch):
  """The split form with `COEFFICIENT_KNOBS`, checked as `test_replay_verify` checks it."""
  for name, value in COEFFICIENT_KNOBS[knobs].items():
    monkeypatch.setattr(triton_split, name, value)
  jax.clear_caches()  # the jitted verify traces its launch, knobs and all
  try:
    check_replay_verify(c, "split")
  finally:
    jax.clear_caches()


VEC_CASES = [c for c in replay_tests.CASES if c.T == 1] + [
    replay_tests.Case(3, 1, 16, 2, 4, 32, 32, 32, act="bfloat16", ring="bfloat16", pad_row=1,
                      why="decode at K=32: one, two or four K-chunks")]


@pytest.mark.parametrize("block_v", [None, 8], ids=["case-tile", "tile8"])
@pytest.mark.parametrize("k_chunk", [8, 16, 32])
@pytest.mark.parametrize("c", VEC_CASES, ids=[c.id for c in VEC_CASES])
def test_replay_verify_vec_k_chunks(c: replay_tests.Case, k_chunk, block_v, mode):
  """The vector form over K-chunks of 8, 16 and 32 (four, two and one at K=32), and in tiles
  of 8 rows of V (with K-chunks of 32 at K=32: whole rows and no K-loop, as
  `sweep.TRITON_REPLAY`'s ``[32, 128]`` tiles at K=128), as `test_replay_verify` checks it."""
  check_replay_verify(c, "vec", KernelTuning(block_v=block_v or c.block_v, k_chunk=k_chunk))


def check_replay_verify(c: replay_tests.Case, form: str,
                        tuning: KernelTuning | None = None) -> None:
  """`test_replay_verify`'s checks of one case and form (at ``tuning``, default
  `replay_tuning_for`'s)."""
  inp = replay_tests.make_inputs(c)
  out = triton_kernels.replay_verify(**inp, tuning=tuning or replay_tuning_for(c, form),
                                     dot_precision=c.precision, form=form)
  ref_out = replay_tests.reference_jit(**inp)
  o_oracle, d_oracle = replay_tests.np_oracle(inp)
  slot_ids, phys = np.asarray(inp["slot_ids"]), replay_tests.window_slots(inp, c)
  valid = slot_ids >= 0

  o, *rings = out
  assert o.dtype == inp["v"].dtype
  assert rel_err(replay_tests.f32(o[valid]), o_oracle[valid]) <= c.tol
  assert rel_err(replay_tests.f32(o[valid]), replay_tests.f32(ref_out[0][valid])) <= c.tol
  np.testing.assert_array_equal(np.asarray(o[~valid], np.float32), 0.0)

  g, beta = replay_tests.gating_jit(inp["a"], inp["b"], inp["A_log"], inp["dt_bias"])
  k_hat = replay_tests.l2_normalize_jit(inp["k"].astype(jnp.float32))
  records = dict(ring_k=k_hat, ring_g=g, ring_beta=beta, ring_rawk=inp["k"], ring_rawv=inp["v"])
  for name, ring in zip(RING_NAMES, rings):
    assert ring.dtype == inp[name].dtype and ring.shape == inp[name].shape
    got, before = np.asarray(ring), np.asarray(inp[name])
    written = np.zeros(got.shape[:3], bool)  # [slots, heads, L]
    for row in np.flatnonzero(valid):
      slot = slot_ids[row]
      written[slot][:, phys[row]] = True
      window = got[slot][:, phys[row]]  # [heads, T, ...]
      if name == "ring_d":
        assert rel_err(replay_tests.f32(window), np.swapaxes(d_oracle[row], 0, 1)) <= c.tol
        continue
      want = np.asarray(jnp.swapaxes(records[name][row], 0, 1).astype(ring.dtype))
      if name in ("ring_rawk", "ring_rawv"):  # copies of the inputs
        np.testing.assert_array_equal(replay_tests.bits(window), replay_tests.bits(want))
      else:
        ulp_close(window, want, ring.dtype)
    np.testing.assert_array_equal(replay_tests.bits(got)[~written],
                                  replay_tests.bits(before)[~written], err_msg=name)


# (case, fold tiles a stream program): a program holds a whole value head of V rows, in tiles
# of 8 or 16 rows a warp (K-chunks of 16 leave 8 lanes to rows: `stream_fold_block_v`).
FOLD_STREAM_CASES = [(c, tiles) for c in replay_tests.FUSED_CASES for tiles in (1, 2)
                     if c.V // (2 * tiles) >= 8]


@pytest.mark.parametrize("copy", [False, True], ids=["fp32", "copy"])
@pytest.mark.parametrize("c,tiles", FOLD_STREAM_CASES,
                         ids=[f"{c.id}-tiles{tiles}" for c, tiles in FOLD_STREAM_CASES])
def test_fold_inside_the_stream(c: replay_tests.Case, tiles, copy, mode):
  """`fold_and_replay_verify`: the split form's stream folds the flush rows into its
  checkpoint rows (as one tile a program or two), then streams them; against the fold kernel
  and then the split verify, to the bit (`check_fold_inside`: the checkpoint, the outputs and
  every ring; with ``copy`` a bf16 copy unlike the rounded checkpoint, folded and read)."""
  # The stream's programs of 2 warps fold tiles of as many rows a warp as the one-warp fold
  # kernel's: one layout, so the bits are the fold kernel's on a GPU too.
  tuning = KernelTuning(block_v=c.V, num_warps=2, k_chunk=16)
  fold_tuning = KernelTuning(block_v=c.V // (2 * tiles), num_warps=1, k_chunk=16)
  assert triton_split.stream_fold_block_v(tuning, fold_tuning) == c.V // tiles
  replay_tests.check_fold_inside(
      c, replay_tests.make_inputs(c, seed=4), tuning=tuning, fold_tuning=fold_tuning,
      form="split", copy=copy, kernels=(triton_kernels.fold, triton_kernels.replay_verify,
                                        triton_kernels.fold_and_replay_verify))


def test_fold_inside_the_stream_needs_whole_tiles():
  c = replay_tests.FUSED_CASES[0]
  inp = replay_tests.make_inputs(c)
  (count, fold_base), cursors = replay_tests._flush_some_rows(inp, c)
  call = functools.partial(triton_kernels.fold_and_replay_verify, **{**inp, **cursors},
                           fold_count=count, fold_base=fold_base, dot_precision="default",
                           form="split")
  with pytest.raises(ValueError, match="cannot fold in tiles of 16 rows a warp"):
    call(tuning=KernelTuning(block_v=16, num_warps=2, k_chunk=16),
         fold_tuning=KernelTuning(block_v=16, num_warps=1, k_chunk=16))
  with pytest.raises(ValueError, match="at least 8 rows a warp"):  # lanes would hold copies
    call(tuning=KernelTuning(block_v=16, num_warps=2, k_chunk=16),
         fold_tuning=KernelTuning(block_v=4, num_warps=1, k_chunk=16))
  with pytest.raises(ValueError, match="the triton ut form does not fold"):
    call(tuning=KernelTuning(block_v=16, num_warps=2, k_chunk=16),
         fold_tuning=KernelTuning(block_v=8, num_warps=1, k_chunk=16), form="ut")
  with pytest.raises(ValueError, match="fold_count is int32\\[3\\]; expected int32\\[4\\]"):
    call(tuning=KernelTuning(block_v=16, num_warps=2, k_chunk=16),
         fold_tuning=KernelTuning(block_v=8, num_warps=1, k_chunk=16), fold_count=count[:3])


def test_replay_form_and_knobs():
  c = replay_tests.Case(2, 2, 16, 1, 2, 16, 16, 16)
  inp = replay_tests.make_inputs(c)
  assert replay_form(1) == "vec" and replay_form(4) == "ut"
  assert replay_form(4, 16) == "split" and replay_form(4, 15) == "ut"
  assert replay_form(1, 32) == "split" and replay_form(1, 31) == "vec"  # decode: NOTES run 41
  with pytest.raises(ValueError, match="the split form's tl.dot needs block_v"):
    triton_kernels.replay_verify(**inp, tuning=KernelTuning(block_v=8), dot_precision="ieee",
                                 form="split")
  with pytest.raises(ValueError, match="one-token \\(decode\\) form"):
    triton_kernels.replay_verify(**inp, tuning=KernelTuning(block_v=16), dot_precision="ieee",
                                 form="vec")
  with pytest.raises(ValueError, match="block_v, k_chunk and K of at least 16"):
    triton_kernels.replay_verify(**inp, tuning=KernelTuning(block_v=8), dot_precision="ieee",
                                 form="ut")
  with pytest.raises(ValueError, match="dot_precision='fp64'"):
    triton_kernels.replay_verify(**inp, tuning=KernelTuning(block_v=16), dot_precision="fp64")
  with pytest.raises(ValueError, match="ring_d is"):
    triton_kernels.replay_verify(**{**inp, "ring_d": inp["ring_d"][:, :, :8]},
                                 tuning=KernelTuning(block_v=16), dot_precision="ieee")


def test_split_launches_pick_chunks_and_epilogue_precision():
  """The split form's launch choices: one coefficients K-chunk up to 4 window rows, two from 8
  (the wider accumulators spill otherwise; 64 wide since run 31's key products on the tensor
  cores: no spill at T=8 with triton 3.6), and the stream's epilogue products as tf32x3 MMAs
  except under the ieee ablation."""
  geometry = dict(H=16, HV=32, K=128, V=128, L=16)
  chunks = {T: compile_check.launches(T=T, **geometry)[f"replay_split_coefficients_T{T}"]
            .constexprs["KC"] for T in (1, 4, 8)}
  assert chunks == {1: 128, 4: 128, 8: 64}
  for precision, epilogue in (("default", "tf32x3"), ("bf16", "tf32x3"), ("ieee", "ieee")):
    stream = compile_check.launches(T=4, dot_precision=precision, **geometry)[
        "replay_split_stream_T4"]
    assert stream.constexprs["EPILOGUE_PRECISION"] == epilogue, precision


def test_the_stream_on_the_copy_pipelines_deeper():
  """The split form's stream over the bf16 copy takes `COPY_STREAM_STAGES` stages, its other
  fields the fp32 stream's, at every T; the other forms and the fp32 checkpoint keep theirs,
  and `ssm` passes the spec's copy through."""
  from replayssm_jax import ssm

  for T, B in [(4, 256), (4, 16), (1, 64), (1, 32)]:
    fp32 = triton_kernels.replay_tuning(128, T, B)
    assert fp32.num_stages == 2
    assert triton_kernels.replay_tuning(128, T, B, copy=True) == dataclasses.replace(
        fp32, num_stages=triton_kernels.COPY_STREAM_STAGES)
    # the spec's two fields it reads (a triton `SpecConfig` needs a GPU to be made)
    spec = types.SimpleNamespace(backend="triton", checkpoint_copy=jnp.bfloat16)
    assert ssm.default_replay_tuning(spec, 128, T, B) == triton_kernels.replay_tuning(
        128, T, B, copy=True)
  for T, B in [(4, 8), (1, 8)]:
    assert (triton_kernels.replay_tuning(128, T, B, copy=True)
            == triton_kernels.replay_tuning(128, T, B))
  assert triton_kernels.COPY_STREAM_STAGES != 2
  stream = compile_check.launches(T=4, H=16, HV=32, K=128, V=128, L=16)
  assert stream["replay_split_stream_T4_copy"].num_stages == triton_kernels.COPY_STREAM_STAGES
  assert stream["replay_split_stream_T4"].num_stages == 2


def test_state_kernels_reject_non_power_of_two_k():
  rng = np.random.default_rng(0)
  x = rec_tests.make_inputs(rng, 2, 1, 1, 2, 24, 16, jnp.float32)
  with pytest.raises(ValueError, match="K=24 must be a power of two"):
    triton_kernels.recurrent_decode(x["ssm"], x["q"], x["k"], x["v"], x["a"], x["b"],
                                    x["A_log"], x["dt_bias"], jnp.zeros(2, jnp.int32),
                                    tuning=KernelTuning(block_v=16, k_chunk=8))


# ----------------------------------------------------------------------------- the ssm API


SCHEDULES = [(4, 16, False), (1, 2, False), (2, 4, True), (8, 16, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("T,L,interleave", SCHEDULES,
                         ids=[f"T{T}-L{L}{'-decode' if i else ''}" for T, L, i in SCHEDULES])
def test_ssm_schedules_compiled(T, L, interleave):
  """``SpecConfig(backend="triton")`` through test_ssm_replay's random schedules: ReplaySSM
  against the recurrent baseline, bitwise after every fold."""
  from hypothesis import given, settings

  @settings(max_examples=2, phases=test_ssm_replay.NO_SHRINK)
  @given(test_ssm_replay._schedules(T))
  def run(schedule):
    test_ssm_replay._run_schedule(T, L, "triton", schedule, interleave=interleave)

  run()


@pytest.mark.gpu
@pytest.mark.parametrize("T,L", [(2, 4), (4, 16)])
def test_ssm_copy_schedules_compiled(T, L):
  """The same with the checkpoint's bf16 copy (`SpecConfig.checkpoint_copy`): the fold writes
  it (bitwise the checkpoint rounded, at every step), the verify and decode read it."""
  from hypothesis import given, settings

  @settings(max_examples=2, phases=test_ssm_replay.NO_SHRINK)
  @given(test_ssm_replay._schedules(T))
  def run(schedule):
    test_ssm_replay._run_schedule(T, L, "triton", schedule, interleave=True,
                                  checkpoint_copy=jnp.bfloat16)

  run()


@pytest.mark.parametrize("T,L,copy,split", [(2, 4, None, False), (4, 16, None, False),
                                             (2, 4, jnp.bfloat16, False), (2, 4, None, True),
                                             (2, 4, jnp.bfloat16, True)],
                         ids=["T2-L4", "T4-L16", "T2-L4-copy", "T2-L4-split",
                              "T2-L4-copy-split"])
def test_ssm_schedule_interpreted(T, L, copy, split, monkeypatch, request):
  """One 40-step schedule (verify, decode, commit, reset, padding) through the ssm API on the
  triton backend in Triton's interpreter: the dispatch, and the bitwise folds end to end;
  with the checkpoint's bf16 copy too (`SpecConfig.checkpoint_copy`: bitwise the checkpoint
  rounded at every step). With ``split``, its 4 rows take the split form (windows and decode),
  whose stream folds the flush rows (`ssm.TRITON_FUSE_FOLD_BELOW`,
  `ssm.TRITON_FUSE_FOLD_WITH_COPY`), in value heads of 64 rows (the stream's 64-row programs
  fold in two 32-row tiles)."""
  if not INTERPRET:
    pytest.skip("needs TRITON_INTERPRET=1 before triton is imported (test_interpreter_run)")
  from replayssm_jax import config, ssm

  # The module (the package's ``replay_verify`` is its function).
  triton_replay = importlib.import_module("replayssm_jax.kernels.triton.replay_verify")

  # SpecConfig(backend="triton") asks for jax-triton and a GPU; the interpreter needs neither.
  monkeypatch.setattr(config, "jax_triton_available", lambda: True)
  monkeypatch.setattr(config, "gpu_available", lambda: True)
  gdn = test_ssm_replay.GDN
  if split:  # the split form at 4 rows, folding in its stream (windows and the copy too)
    monkeypatch.setattr(triton_replay, "SPLIT_MIN_BATCH", {"window": 1, "decode": 1})
    monkeypatch.setattr(ssm, "TRITON_FUSE_FOLD_BELOW", dict.fromkeys(ssm.TRITON_FUSE_FOLD_BELOW))
    monkeypatch.setattr(ssm, "TRITON_FUSE_FOLD_WITH_COPY",
                        dict.fromkeys(ssm.TRITON_FUSE_FOLD_WITH_COPY, True))
    jax.clear_caches()  # read at trace time
    request.addfinalizer(jax.clear_caches)
    gdn = test_ssm_replay.GDN_WIDE
    spec = config.SpecConfig(draft_tokens=T, ring_len=L, backend="triton",
                             checkpoint_copy=copy)
    V = gdn.head_v_dim
    for t in (1, T):
      assert ssm._fuses_fold(spec, jnp.zeros((4, t)), ssm.default_state_tuning(spec, V),
                             ssm.default_replay_tuning(spec, V, t, 4))
  rng = np.random.default_rng(T * L)
  steps = [([int(s) for s in rng.integers(-1, test_ssm_replay.SLOTS, 4)],
            [int(r) for r in rng.integers(0, T + 1, 4)], int(rng.integers(0, 16)),
            bool(rng.random() < 0.3)) for _ in range(40)]
  test_ssm_replay._run_schedule(T, L, "triton", (T * L, steps), interleave=True,
                                checkpoint_copy=copy, gdn=gdn)


@pytest.mark.gpu
@pytest.mark.parametrize("stream_fold", [True, False], ids=["stream_fold", "fold_kernel"])
@pytest.mark.parametrize("T,L,decode_share,copy", [(4, 16, 0.3, None), (1, 2, 1.0, None),
                                                   (4, 16, 0.3, jnp.bfloat16),
                                                   (1, 2, 1.0, jnp.bfloat16)],
                         ids=["T4-L16", "T1-L2", "T4-L16-copy", "T1-L2-copy"])
def test_ssm_wide_batches_compiled(T, L, decode_share, copy, stream_fold, monkeypatch, request):
  """`test_ssm_replay.test_wide_batches_split_form` on the triton backend: the split form's
  rows (windows from 16, decode from 32), the flush rows folded in its stream or by the fold
  kernel before it (`ssm.TRITON_FUSE_FOLD_BELOW`, `ssm.TRITON_FUSE_FOLD_WITH_COPY`); bitwise
  after every fold."""
  from replayssm_jax import ssm
  from replayssm_jax.kernels.triton.replay_verify import SPLIT_MIN_BATCH

  monkeypatch.setattr(ssm, "TRITON_FUSE_FOLD_BELOW",
                      dict.fromkeys(ssm.TRITON_FUSE_FOLD_BELOW, None if stream_fold else 0))
  monkeypatch.setattr(ssm, "TRITON_FUSE_FOLD_WITH_COPY",
                      dict.fromkeys(ssm.TRITON_FUSE_FOLD_WITH_COPY, stream_fold))
  jax.clear_caches()  # read at trace time
  request.addfinalizer(jax.clear_caches)
  B = SPLIT_MIN_BATCH["decode" if decode_share == 1.0 else "window"]
  rng = np.random.default_rng(T + 11)
  pair = test_ssm_replay.Pair.create(T, L, "triton", rng, gdn=test_ssm_replay.GDN_WIDE,
                                     checkpoint_copy=copy)
  spec, V = pair.rep_spec, test_ssm_replay.GDN_WIDE.head_v_dim
  assert ssm._fuses_fold(spec, jnp.zeros((B, T)), ssm.default_state_tuning(spec, V),
                         ssm.default_replay_tuning(spec, V, T, B)) is stream_fold
  test_ssm_replay._drive_wide(pair, B, T, decode_share, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("verify_mode,B", test_ssm_replay.ALIAS_CASES)
def test_ssm_steps_alias_the_cache_compiled(verify_mode, B):
  test_ssm_replay.test_jitted_steps_alias_the_cache(verify_mode, B, "triton")


# ----------------------------------------------------------------------------- compile only

compiles = pytest.mark.skipif(INTERPRET, reason="the interpreter's kernels do not compile")
GEOMETRIES = {  # name: compile_check.launches arguments
    "anchor": compile_check.ANCHOR,
    "T8": dict(compile_check.ANCHOR, T=8),
    "T16-L32": dict(compile_check.ANCHOR, T=16, L=32),
    "fp32": dict(compile_check.ANCHOR, act=jnp.float32, ring=jnp.float32),
    "ieee": dict(compile_check.ANCHOR, dot_precision="ieee"),
    "bf16-dots": dict(compile_check.ANCHOR, dot_precision="bf16"),
}


@compiles
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_compiles_for_sm90_without_spills(geometry):
  """Every kernel compiles for an H200 at the default tunings; ptxas reports no spills.

  Anchor (HV=32, H=16, K=V=128, T=4, L=16, bf16; 2026-11-30, triton 3.6, the run-5 defaults):
  see `python -m replayssm_jax.kernels.triton.compile_check`.
  """
  rows = compile_check.report(compile_check.launches(**GEOMETRIES[geometry]))
  for name, row in rows.items():
    print(f"{geometry} {name}: {row}")
    assert row["spill_stores"] == row["spill_loads"] == 0, (name, row)
    assert row["n_regs"] <= 255, (name, row)


@compiles
@pytest.mark.parametrize("knobs", COEFFICIENT_KNOBS)
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_coefficient_knobs_compile_without_spills(geometry, knobs, monkeypatch):
  """The split coefficients kernel with each of `COEFFICIENT_KNOBS` compiles for an H200
  without spills at every geometry (NOTES run 36: 149 registers at the anchor against the
  shipped 91 with the knobs off, triton 3.6)."""
  for name, value in COEFFICIENT_KNOBS[knobs].items():
    monkeypatch.setattr(triton_split, name, value)
  launches = {name: launch
              for name, launch in compile_check.launches(**GEOMETRIES[geometry]).items()
              if "coefficients" in name}
  for name, row in compile_check.report(launches).items():
    print(f"{geometry} {name}: {row}")
    assert row["spill_stores"] == row["spill_loads"] == 0, (name, row)


def tile_shape(block_v: int, k_chunk: int, K: int = 128) -> str:
  """The state tile's shape in TTGIR (``"32x16x8"``), in `tile.state_offsets`' axis order."""
  dims = [block_v, K // k_chunk]
  return "x".join(map(str, dims[::-1] if tile.CHUNKS_FIRST else dims)) + f"x{k_chunk}"


def state_layouts(ttgir: str, shape: str) -> set[str]:
  """The layouts of every fp32 tensor of the state tile's shape (`tile_shape`) in TTGIR."""
  definitions = dict(re.findall(r"^(#[\w]+) = (.*)$", ttgir, re.M))
  used = set(re.findall(rf"tensor<{shape}xf32, (#\w+)>", ttgir))
  return {definitions.get(u, u) for u in used}


@compiles
@pytest.mark.parametrize("act", ["bfloat16", "float32"])
@pytest.mark.parametrize("tuning", [None, KernelTuning(block_v=16, num_warps=1, k_chunk=8),
                                    KernelTuning(block_v=32, num_warps=2, k_chunk=32)],
                         ids=["default", "bv16-w1-kc8", "bv32-w2-kc32"])
def test_state_kernels_hold_one_tile_layout(tuning, act):
  """The recurrent verify, the decode and the fold compile their state tile to one layout.

  Reduction order follows the layout, so this is what the fold's bitwise tie needs of the
  compiler (the vectors of a token are loaded into the tile's layout, `tile` docstring).
  """
  tuning = tuning or triton_kernels.state_tuning(128)
  launches = compile_check.launches(**compile_check.ANCHOR, act=jnp.dtype(act), state=tuning)
  shape = tile_shape(tuning.block_v, min(tuning.k_chunk, 128))
  layouts = {name: state_layouts(compile_sm90(launches[name]).asm["ttgir"], shape)
             for name in ("recurrent_verify_T4", "recurrent_decode", "exact_fold_L16",
                          "exact_fold_L16_copy")}
  assert all(len(v) == 1 for v in layouts.values()), layouts
  assert len(set.union(*layouts.values())) == 1, layouts


def layout_fields(layout: str) -> dict[str, list[int]]:
  """A blocked layout's ``sizePerThread``, ``threadsPerWarp`` and ``warpsPerCTA``."""
  return {field: [int(n) for n in re.search(rf"{field} = \[([\d, ]+)\]", layout)[1].split(",")]
          for field in ("sizePerThread", "threadsPerWarp", "warpsPerCTA")}


@compiles
@pytest.mark.parametrize("copy", [False, True], ids=["fp32", "copy"])
def test_stream_folds_in_the_fold_kernels_layout(copy):
  """The replay stream that folds (2 warps) holds its fold tiles as the one-warp fold kernel
  holds its tile, but for the second warp's rows, and sums a key's norm as it does, a warp
  holding a whole copy: the same reductions in the same order, which the bitwise tie needs of
  the compiler (the GPU tests check the bits)."""
  tuning = triton_kernels.state_tuning(128)
  launches = compile_check.launches(**compile_check.ANCHOR)
  stream = launches["replay_split_fold_stream_T1" + ("_copy" if copy else "")]
  rows = stream.constexprs["FOLD_BV"]
  stream_ir = compile_sm90(stream).asm["ttgir"]
  fold_ir = compile_sm90(launches["exact_fold_L16"]).asm["ttgir"]
  [fold_tile] = state_layouts(fold_ir, tile_shape(tuning.block_v, tuning.k_chunk))
  [stream_tile] = state_layouts(stream_ir, tile_shape(rows, tuning.k_chunk))
  fold_tile, stream_tile = layout_fields(fold_tile), layout_fields(stream_tile)
  assert stream_tile["sizePerThread"] == fold_tile["sizePerThread"]
  assert stream_tile["threadsPerWarp"] == fold_tile["threadsPerWarp"]
  row_axis = 1 - tile.CHUNK_AXIS
  assert stream_tile["warpsPerCTA"][row_axis] == stream.num_warps == 2
  [fold_norm] = state_layouts(fold_ir, "32x1x4")  # [lanes, copies, K // 32]
  [stream_norm] = state_layouts(stream_ir, "32x2x4")
  fold_norm, stream_norm = layout_fields(fold_norm), layout_fields(stream_norm)
  assert stream_norm["sizePerThread"] == fold_norm["sizePerThread"] == [1, 1, 4]
  assert stream_norm["threadsPerWarp"] == fold_norm["threadsPerWarp"] == [32, 1, 1]
  assert stream_norm["warpsPerCTA"] == [1, 2, 1]


@compiles
@pytest.mark.parametrize("K, V", [(128, 128), (16, 64), (16, 16)], ids=["K128", "K16-V64", "K16-V16"])
def test_fold_writing_a_copy_keeps_its_loop(K, V):
  """The fold kernel that writes the checkpoint's bf16 copy has the plain fold's record loop:
  the same fp32 arithmetic and shuffles (the Pallas fold lost it at K=16, V=64 once: NOTES
  run 46)."""
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "tools"))
  import pallas_sass

  kept = ("FFMA", "FMUL", "FADD", "SHFL.BFLY")
  launches = compile_check.launches(**dict(compile_check.ANCHOR, K=K, V=V),
                                    state=triton_kernels.state_tuning(V))

  def loop_mix(name):
    loop = max(pallas_sass._launch_report(launches[name])["loops"], key=lambda l: l["size"])
    return {op: n for op, n in loop["mix"] if op in kept}

  assert loop_mix("exact_fold_L16_copy") == loop_mix("exact_fold_L16")


@compiles
def test_state_tile_keeps_its_chunks_in_registers():
  """The state tile's chunk axis (`tile.CHUNK_AXIS`) has no lanes and no warps, so
  `tile.matvec` adds the chunks in-thread. Triton breaks the tie between the tile's two strided
  axes the other way from 3.7, and the tile's axis order follows (the `tile` docstring;
  checked with triton 3.6, 3.7.1, 3.8 and 3.9, NOTES run 32)."""
  tuning = triton_kernels.state_tuning(128)
  launches = compile_check.launches(**compile_check.ANCHOR)
  shape = tile_shape(tuning.block_v, tuning.k_chunk)
  for name in ("recurrent_verify_T4", "recurrent_decode", "exact_fold_L16"):
    [layout] = state_layouts(compile_sm90(launches[name]).asm["ttgir"], shape)
    lanes, warps = (re.search(rf"{axis} = \[(\d+), (\d+), (\d+)\]", layout).groups()
                    for axis in ("threadsPerWarp", "warpsPerCTA"))
    assert lanes[tile.CHUNK_AXIS] == warps[tile.CHUNK_AXIS] == "1", (name, layout)


@compiles
def test_state_kernels_contract_nothing_but_written_fmas():
  """Every fp32 multiply and add of the recurrent kernels and the fold is rounded on its own.

  With fp fusion on, LLVM contracted a multiply into an add in one loop and not in the other
  (H200: the fold 1 ulp off the recurrent state at K-chunks of 8). Now fusion is off, so the PTX
  spells every rounding (``mul.rn``, which ptxas never fuses) and the fmas are the written-out
  ``tl.fma``s: the update's, one per state element a thread holds, and `tile.fma_chunks`' in
  each product ``S x`` (the fold's ``S k``; the recurrent kernels' ``S k`` and ``S q``). Triton
  3.6 chains a thread's chunks in order, NC - 1 fmas a column; newer ones pair them first
  (half the elements) and add the pairs.
  """
  tuning = triton_kernels.state_tuning(128)
  per_thread = tuning.block_v * 128 // (32 * tuning.num_warps)
  chunks = 128 // tuning.k_chunk
  products = {"recurrent_verify_T4": 2, "recurrent_decode": 2, "exact_fold_L16": 1}
  launches = compile_check.launches(**compile_check.ANCHOR)
  for name, n in products.items():
    assert not launches[name].fp_fusion, name
    ptx = compile_sm90(launches[name]).asm["ptx"]
    assert not re.findall(r"\b(?:mul|add|sub)\.f32\b", ptx), name  # no unrounded (fusable) op
    fmas = len(re.findall(r"\bfma\.rn\.f32\b", ptx)) - per_thread
    assert n * per_thread // 2 <= fmas <= n * per_thread * (chunks - 1) // chunks, (name, fmas)


@compiles
def test_resource_usage_reads_the_cubin():
  launch = compile_check.launches(**compile_check.ANCHOR)["exact_fold_L16"]
  usage = resource_usage(compile_sm90(launch))
  assert set(usage) == {"n_regs", "spill_stores", "spill_loads", "shared_bytes", "per_sm"}
  assert 32 <= usage["n_regs"] <= 255


@compiles
def test_report_counts_programs_per_row_and_sm():
  """`compile_check.report`'s wave inputs at the anchor: programs per batch row from each grid
  (the coefficients one per key head, the stream one per value head and 64-wide V-block, the
  state kernels one per value head and 16-wide V-block) and programs an SM from the cubin."""
  rows = compile_check.report({name: launch for name, launch in
                               compile_check.launches(**compile_check.ANCHOR).items()
                               if name in ("replay_split_coefficients_T4",
                                           "replay_split_stream_T4", "exact_fold_L16")})
  assert {name: r["programs_per_row"] for name, r in rows.items()} == {
      "replay_split_coefficients_T4": 16, "replay_split_stream_T4": 64, "exact_fold_L16": 256}
  for r in rows.values():
    assert r["per_sm"] == programs_per_sm(r["n_regs"], r["num_warps"], r["shared_bytes"]) >= 1


@pytest.mark.parametrize("regs, warps, shared, per_sm, seen", [
    (128, 1, 0, 16, "the Pallas coefficients kernel, run 20's profile"),
    (151, 1, 8192, 13, "the triton coefficients kernel's device registers, run 31"),
    (80, 4, 66 * 1024, 3, "the Pallas stream: two 32 KB stages, run 8's profile"),
    (128, 2, 21504, 8, "the masked triton stream, run 33's profile"),
    (152, 2, 21504, 6, "the triton stream before, run 31's profile"),
    (127, 2, 0, 8, "the Pallas fold, run 23's launch statistics"),
    (32, 1, 0, 32, "the 32-program cap"),
])
def test_programs_per_sm_reads_as_the_profiles(regs, warps, shared, per_sm, seen):
  """`launch.programs_per_sm` against what Nsight Compute reported on the H200."""
  assert programs_per_sm(regs, warps, shared) == per_sm, seen


def test_local_bytes_counts_spills_by_width():
  sass = """
        /*25b0*/                   STL [R1], R10 ;
        /*25c0*/                   STL.64 [R1+0x8], R12 ;
        /*25d0*/              @!P0 STL.128 [R1+0x10], R16 ;
        /*5440*/                   LDL.LU R104, [R1] ;
        /*5450*/                   LDL.U8 R3, [R1+0x20] ;
        /*5460*/                   LDG.E.64 R28, desc[UR8][R10.64] ;
        /*5470*/                   STS.128 [R145+0x8000], R4 ;
  """
  assert local_bytes(sass, "STL") == 4 + 8 + 16
  assert local_bytes(sass, "LDL") == 4 + 1
  assert local_bytes("LDG.E R1, desc[UR4][R2.64] ;", "LDL") == 0


@compiles
def test_compile_sm90_after_jax_triton_cleared_the_cache_dir(monkeypatch):
  """jax-triton 0.3.1 (the device's) sets ``TRITON_CACHE_DIR`` to "" when imported, after which
  a plain ``triton.compile`` raises; the compile checks must still run in that process."""
  monkeypatch.setenv("TRITON_CACHE_DIR", "")
  launch = compile_check.launches(**compile_check.ANCHOR)["recurrent_decode"]
  assert resource_usage(compile_sm90(launch))["spill_stores"] == 0
  assert os.environ["TRITON_CACHE_DIR"] == ""  # left as jax-triton set it


# ----------------------------------------------------------------------------- interpreter


@pytest.mark.slow
@pytest.mark.skipif(INTERPRET, reason="this is the interpreter run")
def test_interpreter_run():
  """The ``interpreted`` tests of this file, in a subprocess with TRITON_INTERPRET=1 (CPU)."""
  env = dict(os.environ, TRITON_INTERPRET="1", JAX_PLATFORMS="cpu")
  tests = os.path.dirname(__file__)
  run = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", "interpreted",
       os.path.join(tests, "test_kernels_triton.py")],
      env=env, cwd=os.path.dirname(tests), capture_output=True, text=True, timeout=1200)
  assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
  assert " passed" in run.stdout and " failed" not in run.stdout
