"""Validation messages, presets and value semantics of `GDNConfig` / `SpecConfig`."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest

from replayssm_jax import config
from replayssm_jax.config import PRESETS, GDNConfig, SpecConfig


def _raises(match_all: list[str], fn, *args, **kwargs) -> str:
  """Calls fn, expects ValueError, checks every fragment is in the message."""
  with pytest.raises(ValueError) as info:
    fn(*args, **kwargs)
  message = str(info.value)
  for fragment in match_all:
    assert fragment in message, f"{fragment!r} not in {message!r}"
  return message


# --- SpecConfig validation --------------------------------------------------------------------


@pytest.mark.parametrize("ring_len, fix", [(12, 16), (24, 32), (3, 8), (0, 8), (-4, 8)])
def test_ring_len_not_power_of_two(ring_len, fix):
  _raises([f"ring_len={ring_len}", "power of two", f"try ring_len={fix}"],
          SpecConfig, draft_tokens=4, ring_len=ring_len)


def test_ring_len_power_of_two_fix_also_fits_the_window():
  # ring_len=12 with T=10: 16 is the next power of two but < 2T; the fix must be 32.
  _raises(["ring_len=12", "power of two", "try ring_len=32"],
          SpecConfig, draft_tokens=10, ring_len=12)


def test_ring_len_power_of_two_recurrent_fix_is_next_power():
  _raises(["ring_len=12", "try ring_len=16"],
          SpecConfig, draft_tokens=10, ring_len=12, verify_mode="recurrent")


@pytest.mark.parametrize("draft_tokens, ring_len, fix", [(8, 8, 16), (5, 8, 16), (9, 16, 32)])
def test_ring_len_below_two_windows(draft_tokens, ring_len, fix):
  _raises([f"ring_len={ring_len}", f">= 2 * draft_tokens = {2 * draft_tokens}", "replayssm",
           f"try ring_len={fix}"],
          SpecConfig, draft_tokens=draft_tokens, ring_len=ring_len)


def test_ring_len_below_two_windows_allowed_with_recurrent():
  spec = SpecConfig(draft_tokens=8, ring_len=8, verify_mode="recurrent")
  assert spec.ring_len == 8


def test_topk_above_one_rejected_with_replayssm():
  _raises(["topk=2", "verify_mode='replayssm'", "use topk=1", "verify_mode='recurrent'"],
          SpecConfig, topk=2)


@pytest.mark.parametrize("n", [0, 17, 2.0, True, "4"])
def test_fold_together_out_of_range(n):
  _raises([f"fold_together={n!r}", "1..ring_len=16"], SpecConfig, ring_len=16, fold_together=n)


def test_fold_together_in_range():
  assert SpecConfig(ring_len=16, fold_together=16).fold_together == 16
  assert SpecConfig(ring_len=16, fold_together=1) != SpecConfig(ring_len=16)


@pytest.mark.parametrize("flag", [1, "yes", None])
def test_check_values_must_be_a_bool(flag):
  _raises([f"check_values={flag!r}", "True or False"], SpecConfig, check_values=flag)


def test_topk_above_one_allowed_with_recurrent():
  assert SpecConfig(topk=4, verify_mode="recurrent").topk == 4


@pytest.mark.parametrize("topk", [0, -1])
def test_topk_below_one(topk):
  _raises([f"topk={topk}", ">= 1"], SpecConfig, topk=topk)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, "bfloat16", jnp.float16])
def test_replayssm_needs_fp32_checkpoint(dtype):
  name = jnp.dtype(dtype).name
  _raises([f"ssm_dtype={name}", "float32", "replayssm", "use ssm_dtype=jnp.float32"],
          SpecConfig, ssm_dtype=dtype)


def test_bf16_checkpoint_allowed_with_recurrent():
  spec = SpecConfig(ssm_dtype=jnp.bfloat16, verify_mode="recurrent")
  assert spec.ssm_dtype == jnp.bfloat16


@pytest.mark.parametrize("draft_tokens", [0, -1])
def test_draft_tokens_below_one(draft_tokens):
  _raises([f"draft_tokens={draft_tokens}", ">= 1"], SpecConfig, draft_tokens=draft_tokens)


def test_unknown_verify_mode():
  _raises(["verify_mode='tree'", "unknown", "'recurrent'", "'replayssm'"],
          SpecConfig, verify_mode="tree")


def test_unknown_backend():
  _raises(["backend='cuda'", "unknown", "'xla'", "'pallas'", "'triton'"],
          SpecConfig, backend="cuda")


def test_unknown_dot_precision():
  _raises(["dot_precision='fp8'", "unknown", "'ieee'"], SpecConfig, dot_precision="fp8")


def test_checkpoint_copy_normalised_and_hashable():
  spec = SpecConfig(checkpoint_copy="bfloat16", backend="pallas")
  assert spec.checkpoint_copy == jnp.bfloat16
  assert hash(spec) == hash(SpecConfig(checkpoint_copy=jnp.bfloat16, backend="pallas"))
  assert SpecConfig(checkpoint_copy=jnp.bfloat16, dot_precision="bf16").checkpoint_copy


@pytest.mark.parametrize("kwargs, fragments", [
    (dict(verify_mode="recurrent"), ["checkpoint_copy=bfloat16", "verify_mode='replayssm'",
                                     "use None"]),
    (dict(dot_precision="ieee"), ["dot_precision='ieee'", "'default' or 'bf16'"]),
    (dict(dot_precision="tf32"), ["dot_precision='tf32'", "checkpoint_copy=None"]),
])
def test_checkpoint_copy_refused_where_it_cannot_serve(kwargs, fragments):
  _raises(fragments, SpecConfig, checkpoint_copy=jnp.bfloat16, **kwargs)


def test_checkpoint_copy_only_bf16():
  _raises(["checkpoint_copy=float16", "not supported", "jnp.bfloat16"], SpecConfig,
          checkpoint_copy=jnp.float16)


def test_checkpoint_copy_on_every_backend(monkeypatch):
  monkeypatch.setattr(config, "jax_triton_available", lambda: True)
  monkeypatch.setattr(config, "gpu_available", lambda: True)
  for backend in ("xla", "pallas", "triton"):
    assert SpecConfig(backend=backend, checkpoint_copy=jnp.bfloat16).checkpoint_copy


# --- backend='triton' -------------------------------------------------------------------------


def test_triton_backend_rejected_on_this_machine():
  if config.jax_triton_available() and config.gpu_available():
    pytest.skip("this machine has jax-triton and a GPU")
  _raises(["backend='triton'", "use backend='pallas'"], SpecConfig, backend="triton")


def test_triton_backend_without_jax_triton(monkeypatch):
  monkeypatch.setattr(config, "jax_triton_available", lambda: False)
  monkeypatch.setattr(config, "gpu_available", lambda: True)
  _raises(["backend='triton'", "jax-triton", "pip install replayssm-jax[triton]",
           "backend='pallas'"], SpecConfig, backend="triton")


def test_triton_backend_without_gpu(monkeypatch):
  monkeypatch.setattr(config, "jax_triton_available", lambda: True)
  monkeypatch.setattr(config, "gpu_available", lambda: False)
  _raises(["backend='triton'", "CUDA GPU", "backend='pallas'"], SpecConfig, backend="triton")


def test_triton_backend_with_jax_triton_and_gpu(monkeypatch):
  monkeypatch.setattr(config, "jax_triton_available", lambda: True)
  monkeypatch.setattr(config, "gpu_available", lambda: True)
  assert SpecConfig(backend="triton").backend == "triton"


def test_gpu_available_is_false_on_cpu():
  if jax.default_backend() != "cpu":
    pytest.skip("not a CPU-only run")
  assert config.gpu_available() is False


# --- GDNConfig ---------------------------------------------------------------------------------

# research/replayssm-algorithm.md section 7: layers, GDN layers, H, HV, K, V, hidden, layout.
PRESET_TABLE = {
    "qwen3-next-80b-a3b": (48, 36, 16, 32, 128, 128, 2048, "qwen3_next"),
    "qwen3.5-35b-a3b": (40, 30, 16, 32, 128, 128, 2048, "qwen3_5"),
    "qwen3.5-122b-a10b": (48, 36, 16, 64, 128, 128, 3072, "qwen3_5"),
    "qwen3.5-397b-a17b": (60, 45, 16, 64, 128, 128, 4096, "qwen3_5"),
    "qwen3.5-27b": (64, 48, 16, 48, 128, 128, 5120, "qwen3_5"),
    "qwen3.5-9b": (32, 24, 16, 32, 128, 128, 4096, "qwen3_5"),
    "qwen3.5-4b": (32, 24, 16, 32, 128, 128, 2560, "qwen3_5"),
}


def test_preset_names():
  assert set(PRESETS) == set(PRESET_TABLE)


@pytest.mark.parametrize("name", sorted(PRESET_TABLE))
def test_preset_values(name):
  layers, gdn_layers, h, hv, k, v, hidden, layout = PRESET_TABLE[name]
  gdn = GDNConfig.preset(name)
  assert (gdn.num_layers, gdn.num_gdn_layers, gdn.num_k_heads, gdn.num_v_heads, gdn.head_k_dim,
          gdn.head_v_dim, gdn.hidden_size, gdn.layout) == PRESET_TABLE[name]
  assert gdn.conv_kernel == 4
  assert gdn.conv_dim == 2 * h * k + hv * v
  assert gdn.state_shape == (hv, v, k)
  assert gdn.gqa_ratio == hv // h


@pytest.mark.parametrize("name", sorted(PRESET_TABLE))
@pytest.mark.parametrize("tp", [2, 4])
def test_preset_tp_divides_heads(name, tp):
  base, gdn = GDNConfig.preset(name), GDNConfig.preset(name, tp=tp)
  assert gdn.num_k_heads * tp == base.num_k_heads
  assert gdn.num_v_heads * tp == base.num_v_heads
  assert gdn.gqa_ratio == base.gqa_ratio
  assert (gdn.num_gdn_layers, gdn.head_k_dim, gdn.hidden_size) == (
      base.num_gdn_layers, base.head_k_dim, base.hidden_size)


def test_preset_tp_not_dividing_heads():
  _raises(["qwen3.5-35b-a3b", "tp=3", "num_k_heads=16", "use a tp in [1, 2, 4, 8, 16]"],
          GDNConfig.preset, "qwen3.5-35b-a3b", tp=3)


def test_preset_tp_not_dividing_value_heads():
  # qwen3.5-27b: H=16, HV=48; tp=32 divides neither, tp=16 both.
  GDNConfig.preset("qwen3.5-27b", tp=16)
  _raises(["tp=32", "use a tp in [1, 2, 4, 8, 16]"], GDNConfig.preset, "qwen3.5-27b", tp=32)


@pytest.mark.parametrize("tp", [0, -2])
def test_preset_tp_not_positive(tp):
  _raises([f"tp={tp}", "positive integer"], GDNConfig.preset, "qwen3.5-4b", tp=tp)


def test_unknown_preset_lists_known():
  message = _raises(["'qwen9'", "unknown preset", "known presets"], GDNConfig.preset, "qwen9")
  for name in PRESETS:
    assert name in message


def test_gdn_config_field_validation():
  base = GDNConfig.preset("qwen3.5-4b")
  _raises(["num_v_heads=24", "multiple of num_k_heads=16"],
          dataclasses.replace, base, num_v_heads=24)
  _raises(["head_k_dim=0", "positive integer"], dataclasses.replace, base, head_k_dim=0)
  _raises(["num_gdn_layers=40", "num_layers=32"], dataclasses.replace, base, num_gdn_layers=40)
  _raises(["layout='llama'", "unknown"], dataclasses.replace, base, layout="llama")


# --- value semantics ---------------------------------------------------------------------------


def test_configs_hashable_and_equal_by_value():
  assert GDNConfig.preset("qwen3.5-35b-a3b") == GDNConfig.preset("qwen3.5-35b-a3b")
  assert hash(GDNConfig.preset("qwen3.5-35b-a3b", tp=2)) == hash(
      GDNConfig.preset("qwen3.5-35b-a3b", tp=2))
  assert GDNConfig.preset("qwen3.5-35b-a3b") != GDNConfig.preset("qwen3.5-35b-a3b", tp=2)
  assert SpecConfig(draft_tokens=4) == SpecConfig(draft_tokens=4)
  assert SpecConfig(draft_tokens=4) != SpecConfig(draft_tokens=3)
  assert len({SpecConfig(), SpecConfig(), SpecConfig(ring_len=32)}) == 2


def test_dtype_normalisation():
  a, b = SpecConfig(ring_dtype="bfloat16"), SpecConfig(ring_dtype=jnp.bfloat16)
  assert a == b and hash(a) == hash(b)
  assert SpecConfig(ssm_dtype="float32") == SpecConfig(ssm_dtype=jnp.float32) == SpecConfig()
  assert isinstance(a.ring_dtype, jnp.dtype) and isinstance(a.ssm_dtype, jnp.dtype)
  assert SpecConfig(ring_dtype=None).ring_dtype_for(jnp.float16) == jnp.float16
  assert a.ring_dtype_for(jnp.float32) == jnp.bfloat16


def test_configs_are_static_jit_arguments():
  traces = []

  @functools.partial(jax.jit, static_argnames=("gdn", "spec"))
  def f(x, *, gdn, spec):
    traces.append(spec)
    return x * gdn.num_v_heads

  gdn = GDNConfig.preset("qwen3.5-4b")
  f(jnp.ones(2), gdn=gdn, spec=SpecConfig(ring_dtype="bfloat16"))
  f(jnp.ones(2), gdn=GDNConfig.preset("qwen3.5-4b"), spec=SpecConfig(ring_dtype=jnp.bfloat16))
  assert len(traces) == 1  # equal-by-value configs hit the jit cache
  f(jnp.ones(2), gdn=gdn, spec=SpecConfig(ring_len=32))
  assert len(traces) == 2


def test_flush_on_reset():
  assert SpecConfig(draft_tokens=4, ring_len=8).flush_on_reset is False
  assert SpecConfig(draft_tokens=8, ring_len=8, verify_mode="recurrent").flush_on_reset is True
