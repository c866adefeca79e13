"""Every Pallas kernel lowers through Triton for an H200, checked without a GPU.

Interpret mode hides Triton's rules (power-of-two tensors, dot shapes, no unrolled loops);
lowering against an abstract CUDA device runs JAX's Triton lowering and its checks. Triton's
own PTX compile happens on the GPU (the `gpu`-marked tests).
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractDevice, AbstractMesh

from replayssm_jax.kernels import fold, launch_order, recurrent, replay_split, replay_verify
from replayssm_jax.kernels.backend import KernelTuning

H, HV, K, V, SLOTS, B, L = 16, 32, 128, 128, 8, 4, 16
ACT = jnp.bfloat16
FMA = "fma.rn.f32"  # `tile.fma`'s inline PTX, as it appears in the serialized Triton IR


def lower(fn, *shapes):
  mesh = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(
      device_kind="NVIDIA H200", num_cores=None, platform="cuda"))
  args = [jax.ShapeDtypeStruct(s, d) for s, d in shapes]
  with jax.sharding.use_abstract_mesh(mesh):
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert "triton" in text.lower() or "__gpu$xla.gpu.triton" in text  # a Triton custom call
  return text


def window(T):
  return [((B, T, H, K), ACT), ((B, T, H, K), ACT), ((B, T, HV, V), ACT), ((B, T, HV), ACT),
          ((B, T, HV), ACT), ((HV,), jnp.float32), ((HV,), jnp.float32), ((B,), jnp.int32)]


STATE = ((SLOTS, HV, V, K), jnp.float32)
RINGS = [((SLOTS, HV, L, V), ACT), ((SLOTS, H, L, K), ACT), ((SLOTS, HV, L), jnp.float32),
         ((SLOTS, HV, L), jnp.float32), ((SLOTS, H, L, K), ACT), ((SLOTS, HV, L, V), ACT)]
TUNINGS = [KernelTuning(), KernelTuning(block_v=64, num_warps=2),
           KernelTuning(block_v=128, num_warps=8, k_chunk=128), KernelTuning(block_v=16, k_chunk=16)]


@pytest.mark.parametrize("tuning", TUNINGS, ids=str)
@pytest.mark.parametrize("T", [1, 4])
def test_recurrent_kernels_lower(T, tuning):
  texts = [lower(functools.partial(recurrent.recurrent_verify, tuning=tuning, interpret=False),
                 STATE, ((SLOTS, T, HV, V, K), jnp.float32), *window(T)),
           lower(functools.partial(recurrent.recurrent_decode, tuning=tuning, interpret=False),
                 STATE, *window(1))]
  # On the GPU the state tiles' multiply-adds are written out (`tile.fma`): Pallas' Triton
  # contracts none.
  assert all(FMA in text for text in texts)


@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("tuning", TUNINGS, ids=str)
def test_fold_lowers(tuning, interleave):
  """The fold, one tile a program or two folded in one record loop (`fold.FOLD_INTERLEAVE`)."""
  launch = (dict(v_blocks=min(2, V // tuning.block_v), interleave=True) if interleave
            else dict(v_blocks=1, interleave=False))
  text = lower(functools.partial(fold.fold, tuning=tuning, interpret=False, **launch), STATE,
               RINGS[4], RINGS[5], RINGS[2], RINGS[3], ((B,), jnp.int32), ((B,), jnp.int32),
               ((B,), jnp.int32))
  assert FMA in text  # the same arithmetic as the recurrent kernels: the bitwise tie


@pytest.mark.parametrize("form", replay_verify.FORMS)
@pytest.mark.parametrize("T", [1, 3, 4, 8])
def test_replay_verify_lowers(T, form):
  tuning = KernelTuning.replay_default(V, T)
  text = lower(functools.partial(replay_verify.replay_verify, tuning=tuning,
                                 dot_precision="default", interpret=False, form=form),
               STATE, *RINGS, *window(T), ((B,), jnp.int32), ((B,), jnp.int32))
  assert FMA not in text  # tie to nothing bitwise; the vector form keeps mul-then-add
  assert "gpu.barrier" not in text  # only the stream that folds needs one


@pytest.mark.parametrize("variant", [dict(coefficient_key_mma=True),
                                     dict(coefficient_key_mma=False),
                                     dict(coefficient_loads_first=True)],
                         ids=["tensor_core_keys", "cuda_core_keys", "loads_first"])
@pytest.mark.parametrize("T", [1, 3, 4, 16])
def test_split_variants_lower(T, variant):
  lower(functools.partial(replay_split.replay_verify_split, tuning=KernelTuning.replay_default(V, T),
                          dot_precision="default", interpret=False, **variant),
        STATE, *RINGS, *window(T), ((B,), jnp.int32), ((B,), jnp.int32))



@pytest.mark.parametrize("fold_first", [False, True])
@pytest.mark.parametrize("fold_block_v", [32, 64])
@pytest.mark.parametrize("T", [1, 4])
def test_fold_inside_the_stream_lowers(T, fold_block_v, fold_first):
  """The split verify with the fold in its stream kernel: the fold's arithmetic is the state
  tiles' (fma), and a barrier separates the folded tile's stores from the stream's loads; one
  launch of it for all rows, after the launch order's kernel when the folding rows go first."""
  text = lower(functools.partial(
      replay_split.fold_replay_verify_split, tuning=KernelTuning.replay_default(V, T),
      fold_tuning=KernelTuning.state_default(V), fold_block_v=fold_block_v,
      fold_first=fold_first, dot_precision="default", interpret=False),
      STATE, *RINGS, *window(T), ((B,), jnp.int32), ((B,), jnp.int32), ((B,), jnp.int32),
      ((B,), jnp.int32))
  assert FMA in text and "gpu.barrier" in text
  streams = set(re.findall(r"replay_stream_\w+", text))
  assert len(streams) == 1 and streams.pop().endswith("_fold") and "stablehlo.case" not in text
  assert ("fold_first_order" in text) == fold_first


@pytest.mark.parametrize("fold_block_v", [32, 64])
def test_interleaved_fold_inside_the_stream_lowers(fold_block_v):
  """The stream folding its tiles in one record loop (`replay_split.STREAM_FOLD_INTERLEAVE`)."""
  text = lower(functools.partial(
      replay_split.fold_replay_verify_split, tuning=KernelTuning.replay_default(V, 4),
      fold_tuning=KernelTuning.state_default(V), fold_block_v=fold_block_v,
      fold_interleave=True, dot_precision="default", interpret=False),
      STATE, *RINGS, *window(4), *[((B,), jnp.int32)] * 4)
  assert FMA in text and "gpu.barrier" in text


@pytest.mark.parametrize("T", [1, 4])
def test_fold_inside_one_kernel_lowers(T):
  """The one-kernel forms (B=4: vector for T=1, UT for T=4) folding their rows first, at the
  default launches: the state tiles' arithmetic, a barrier before the verify reads them."""
  assert replay_verify.replay_form(T, B) == ("vec" if T == 1 else "ut")
  text = lower(functools.partial(
      replay_verify.fold_and_replay_verify, tuning=KernelTuning.replay_default(V, T, B),
      fold_tuning=KernelTuning.state_default(V), dot_precision="default", interpret=False),
      STATE, *RINGS, *window(T), *[((B,), jnp.int32)] * 4)
  assert FMA in text and "gpu.barrier" in text and "fold_replay_verify_" in text


@pytest.mark.parametrize("rows", [3, 256])
def test_launch_order_lowers(rows):
  """The fold-first launch order's kernel (`launch_order.fold_first_order_pallas`): a row
  count not a power of two too; and the split verify launches it before its stream."""
  lower(functools.partial(launch_order.fold_first_order_pallas, interpret=False),
        *[((rows,), jnp.int32)] * 7)
  text = lower(functools.partial(
      replay_split.fold_replay_verify_split, tuning=KernelTuning.replay_default(V, 1),
      fold_tuning=KernelTuning.state_default(V), fold_first=True, dot_precision="default",
      interpret=False),
      STATE, *RINGS, *window(1), ((B,), jnp.int32), ((B,), jnp.int32), ((B,), jnp.int32),
      ((B,), jnp.int32))
  assert "fold_first_order" in text


@pytest.mark.parametrize("order", [fold.RECORD_LOADS, ("k", "v", "beta", "norm", "g"),
                                   ("g", "k", "norm", "v", "beta")], ids="-".join)
def test_fold_record_orders_lower(order):
  """Every record order lowers, under a kernel name NVPTX accepts (letters, digits, ``_``)."""
  text = lower(functools.partial(fold.fold, tuning=KernelTuning(), interpret=False,
                                 record_order=order),
               STATE, RINGS[4], RINGS[5], RINGS[2], RINGS[3], ((B,), jnp.int32),
               ((B,), jnp.int32), ((B,), jnp.int32))
  [name] = re.findall(r'name = "(exact_fold[^"]*)"', text)
  assert re.fullmatch(r"\w+", name, re.ASCII), name
  assert ("_o" in name) == (order != fold.RECORD_LOADS)


@pytest.mark.parametrize("records, ahead", [("L1", 0), ("L2", 528), ("off", 8), ("off", 0)])
def test_fold_cache_prefetches_lower(records, ahead):
  """The fold's prefetches (`kernels.prefetch`) lower to PTX prefetches at their cache level:
  the records' at ``records``, the later program's checkpoint tile into L2."""
  text = lower(functools.partial(fold.fold, tuning=KernelTuning(), interpret=False,
                                 prefetch_records_to=records, prefetch_tile_ahead=ahead),
               STATE, RINGS[4], RINGS[5], RINGS[2], RINGS[3], ((B,), jnp.int32),
               ((B,), jnp.int32), ((B,), jnp.int32))
  assert ("prefetch.global.L1" in text) == (records == "L1")
  assert ("prefetch.global.L2" in text) == (records == "L2" or ahead > 0)


@pytest.mark.parametrize("records", ["L1", "off"])
def test_stream_fold_prefetch_lowers(records):
  """The split verify's stream prefetches its folding rows' records when asked to."""
  tuning = KernelTuning.replay_default(V, 4, 256)
  text = lower(functools.partial(
      replay_split.fold_replay_verify_split, tuning=tuning,
      fold_tuning=KernelTuning.state_default(V), fold_prefetch_records_to=records,
      dot_precision="default", interpret=False),
      STATE, *RINGS, *window(4), ((B,), jnp.int32), ((B,), jnp.int32), ((B,), jnp.int32),
      ((B,), jnp.int32))
  assert ("prefetch.global.L1" in text) == (records == "L1")
