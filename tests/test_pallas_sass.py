"""``tools/pallas_sass.py``: Pallas kernels lowered for an abstract H200, their Triton modules
and launch parameters found, and (with the ``triton`` extra) compiled for sm_90a."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import pallas_sass  # noqa: E402


def test_loops_are_the_backward_branches():
  sass = [("0000", "MOV R1, c[0x0][0x28]"), ("0010", "FFMA R2, R3, R4, R2"),
          ("0020", "FMUL R2, R2, R5"), ("0030", "@P0 BRA 0x10"), ("0040", "BRA 0x60"),
          ("0050", "NOP"), ("0060", "EXIT")]
  [loop] = pallas_sass.loops(sass)
  assert loop["start"] == 1 and loop["size"] == 3
  assert dict(loop["mix"]) == {"FFMA": 1, "FMUL": 1, "BRA": 1}


@pytest.mark.parametrize("kernel, expected", [
    ("fold", ["exact_fold_L16_bv32_w2"]),
    ("replay_verify", ["replay_coefficients_T4", "replay_stream_T4"])])
def test_every_pallas_call_is_captured_with_its_launch(kernel, expected):
  fn, shapes = pallas_sass.call(kernel, 256, 4, 16, interpret=False)
  modules = pallas_sass.triton_modules(fn, shapes)
  names = [m["name"] for m in modules]
  assert all(any(n.startswith(e) for n in names) for e in expected), names
  for m in modules:
    assert m["ttir"].startswith(f"module @{m['name']}") and "tt.func" in m["ttir"]
    assert m["num_warps"] >= 1 and m["num_stages"] >= 1
  fold = [m for m in modules if m["name"].startswith("exact_fold")]
  assert all(m["num_warps"] == 2 for m in fold)  # the state tuning's (32, 2)


def test_the_fold_compiles_for_sm90(tmp_path):
  pytest.importorskip("triton")
  fn, shapes = pallas_sass.call("fold", 256, 4, 16, interpret=False)
  [module] = pallas_sass.triton_modules(fn, shapes)
  r = pallas_sass.compile_sm90(module, tmp_path)
  # One record loop, without spills, at about the registers the H200 profile shows (127).
  assert 96 <= r["registers"] <= 160 and r["spill_stores"] == 0
  [loop] = r["loops"]
  assert dict(loop["mix"])["FFMA"] > 64  # the K-sum's and the update's multiply-adds


def test_a_triton_backend_kernel_compiles_for_sm90():
  pytest.importorskip("triton")
  r = pallas_sass.triton_backend_sm90("exact_fold_L16")
  assert r["name"].startswith("triton_exact_fold_L16") and r["spill_stores"] == 0
  # The record loop, 64 state elements a thread: the update's 64 fmas and some of the K-sum's
  # (3.6 chains the chunks, 3.7+ pairs them first); fewer multiplies than the decay's and the
  # K-sum's products would take written apart (128; 160 with k_hat's, before NOTES run 34).
  [loop] = r["loops"]
  mix = dict(loop["mix"])
  assert mix["FFMA"] > 64 and 64 <= mix["FMUL"] < 128
  with pytest.raises(ValueError, match="the triton backend's are"):
    pallas_sass.triton_backend_sm90("fold")


def test_the_triton_stream_on_the_copy_keeps_its_programs_an_sm():
  """The triton split stream's three stages on the bf16 copy take no more programs off an SM
  than the fp32 stream's two (8 each); three fp32 stages would (39 KB of shared memory, 5
  programs: 3-4% slower from 128 rows, benchmarks/NOTES.md run 50)."""
  pytest.importorskip("triton")
  from replayssm_jax.kernels.triton import COPY_STREAM_STAGES

  copy = pallas_sass.triton_backend_sm90("replay_split_stream_T4_copy")
  fp32 = pallas_sass.triton_backend_sm90("replay_split_stream_T4")
  assert f"_s{COPY_STREAM_STAGES}_" in copy["name"] and "_s2_" in fp32["name"]
  assert copy["per_sm"] == fp32["per_sm"] >= 8
  assert copy["shared_bytes"] < fp32["shared_bytes"] * 1.5


def test_shipped_sass_is_saved_and_compared(tmp_path, monkeypatch):
  """``shipped --save`` then ``--compare``: the same SASS; with the fold kernel's record loads
  moved, the fold's SASS differs and is named (exit 1), and a saved launch no longer compiled
  counts as changed too."""
  pytest.importorskip("triton")
  from replayssm_jax.kernels import fold

  only = ["fold_T", "recurrent_decode"]
  assert pallas_sass.main(["shipped", "--only", *only, "--save", str(tmp_path)]) == 0
  saved = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.glob("*/*.sass"))
  assert [p.split("/")[0] for p in saved] == ["fold_T4_B256", "recurrent_decode_T4_B256"]
  assert pallas_sass.main(["shipped", "--only", *only, "--compare", str(tmp_path)]) == 0
  other = next(x for x in fold.PREFETCH_ATS if x != fold.FOLD_PREFETCH_AT)
  monkeypatch.setattr(fold, "FOLD_PREFETCH_AT", other)
  found = pallas_sass.shipped_sass(only=only)
  # The fold's kernel name holds its launch, so it may show as changed and as gone.
  assert {k.split("/")[0] for k in pallas_sass.compare_sass(found, tmp_path)} == {"fold_T4_B256"}
  assert pallas_sass.main(["shipped", "--only", *only, "--compare", str(tmp_path)]) == 1
  del found[next(k for k in found if k.startswith("recurrent_decode"))]
  assert "recurrent_decode" in " ".join(pallas_sass.compare_sass(found, tmp_path))


FOLD_GEOMETRIES = [(128, 128), (16, 64), (16, 16)]  # (K, V): the anchor's, the ssm tests'


@pytest.mark.parametrize("K, V", FOLD_GEOMETRIES, ids=[f"K{k}-V{v}" for k, v in FOLD_GEOMETRIES])
def test_the_fold_writing_a_copy_keeps_its_loop(K, V, tmp_path):
  """Writing the checkpoint's bf16 copy (`SpecConfig.checkpoint_copy`) leaves the fold's record
  loop as it was: the same fp32 arithmetic and shuffles (the reduction order of the bitwise
  tie with the recurrent kernels). Rounding a block of the loop's chunk shape did not at K=16,
  V=64 (8 -> 5 shuffles), and an H100 found the folded state 1 ulp off (NOTES run 46)."""
  pytest.importorskip("triton")
  import jax
  import jax.numpy as jnp

  from replayssm_jax import SpecConfig, ssm
  from replayssm_jax.kernels import fold
  from replayssm_jax.kernels.backend import layer_shapes

  x = layer_shapes(H=1, HV=2, K=K, V=V, T=4, L=16, slots=16, B=16, act=jnp.bfloat16,
                   ring=jnp.bfloat16)
  args = [x[n] for n in ("ssm", "ring_rawk", "ring_rawv", "ring_g", "ring_beta", "slot_ids",
                         "count", "cache_base")]
  tuning = ssm.default_state_tuning(SpecConfig(backend="pallas"), V)
  plain = lambda *a: fold.fold(*a, tuning=tuning, interpret=False)
  copy = lambda *a: fold.fold(*a[:-1], tuning=tuning, interpret=False, ssm_copy=a[-1])
  kept = ("FFMA", "FMUL", "FADD", "SHFL.BFLY", "MUFU.RSQ", "MUFU.EX2")

  def compiled(fn, fn_args):
    [module] = pallas_sass.triton_modules(fn, fn_args)
    return pallas_sass.compile_sm90(module, tmp_path)

  def loop_mix(report):
    loop = max(report["loops"], key=lambda l: l["size"])
    return {op: n for op, n in loop["mix"] if op in kept}

  with_copy = compiled(copy, [*args, jax.ShapeDtypeStruct(x["ssm"].shape, jnp.bfloat16)])
  assert loop_mix(with_copy) == loop_mix(compiled(plain, args))
  assert loop_mix(with_copy)["SHFL.BFLY"] > 0
  # The read-back after the loop issues all its loads before its first store: a load after a
  # store waits for it (the copy may alias the checkpoint, for all the compiler knows), which
  # cost the fold a second L2 round trip a program (H100, run 47: 547 -> 585 us at B=256).
  tail = with_copy["sass"].split("BAR.SYNC")[-1]
  memory = re.findall(r"\b(LDG|STG)\.", tail)
  assert "STG" in memory and "LDG" not in memory[memory.index("STG"):], memory


def _record_loop_mix(report) -> dict[str, int]:
  """The arithmetic and shuffles of a kernel's innermost loop that shuffles: a fold's record
  loop (a verify that folds has its K-loop and tile loop besides)."""
  kept = ("FFMA", "FMUL", "FADD", "SHFL.BFLY", "MUFU.RSQ", "MUFU.EX2")
  loops = [l for l in report["loops"] if any(op == "SHFL.BFLY" for op, _ in l["mix"])]
  return {op: n for op, n in min(loops, key=lambda l: l["size"])["mix"] if op in kept}


STREAM_FOLD_GEOMETRIES = FOLD_GEOMETRIES[:2]  # (K=16, V=16): the stream cannot fold there


@pytest.mark.parametrize("T", [1, 4])
@pytest.mark.parametrize("K, V", STREAM_FOLD_GEOMETRIES,
                         ids=[f"K{k}-V{v}" for k, v in STREAM_FOLD_GEOMETRIES])
def test_the_stream_folding_with_a_copy_keeps_the_fold_loop(K, V, T, tmp_path):
  """The split form's stream that folds and then reads the checkpoint's bf16 copy
  (`ssm.FUSE_FOLD_WITH_COPY`) replays records with the fold kernel's record loop: the same
  arithmetic and shuffles. Its bf16 K-chunks as wide as the fold's fp32 chunks lent the fold
  their layout at K=16, V=64 (8 -> 5 shuffles; on an H100 the folded state 1 ulp off the
  recurrent one, NOTES.md session 47), which `replay_split._stream` now avoids."""
  pytest.importorskip("triton")
  import jax
  import jax.numpy as jnp

  from replayssm_jax import SpecConfig, ssm
  from replayssm_jax.kernels import fold, replay_split
  from replayssm_jax.kernels.backend import layer_shapes

  B = 16
  x = layer_shapes(H=1, HV=2, K=K, V=V, T=T, L=16, slots=B, B=B, act=jnp.bfloat16,
                   ring=jnp.bfloat16)
  spec = SpecConfig(backend="pallas", checkpoint_copy=jnp.bfloat16)
  state_tuning = ssm.default_state_tuning(spec, V)
  copy = jax.ShapeDtypeStruct(x["ssm"].shape, jnp.bfloat16)

  def compiled(fn, fn_args, prefix):
    [module] = [m for m in pallas_sass.triton_modules(fn, fn_args)
                if m["name"].startswith(prefix)]
    return pallas_sass.compile_sm90(module, tmp_path)

  fold_args = [x[n] for n in ("ssm", "ring_rawk", "ring_rawv", "ring_g", "ring_beta",
                              "slot_ids", "count", "cache_base")]
  fold_kernel = compiled(lambda *a: fold.fold(*a, tuning=state_tuning, interpret=False),
                         fold_args, "exact_fold")
  replay = [x[n] for n in ("ssm", "ring_d", "ring_k", "ring_g", "ring_beta", "ring_rawk",
                           "ring_rawv", "q", "k", "v", "a", "b", "A_log", "dt_bias",
                           "slot_ids", "write_pos", "cache_base", "count", "cache_base")]
  stream = compiled(
      lambda *a: replay_split.fold_replay_verify_split(
          *a[:-1], tuning=ssm.default_replay_tuning(spec, V, T, B), fold_tuning=state_tuning,
          dot_precision="default", interpret=False, ssm_copy=a[-1]),
      [*replay, copy], "replay_stream")
  assert _record_loop_mix(stream) == _record_loop_mix(fold_kernel)
