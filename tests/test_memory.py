"""Memory report: closed forms, container cross-check, measured bytes, table, JSON and the CLI."""

import dataclasses
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import pytest

from replayssm_jax import __version__, cli
from replayssm_jax import memory as memory_module
from replayssm_jax.config import PRESETS, GDNConfig
from replayssm_jax.memory import (AllocatedBytes, container_memory_report, format_bytes,
                                  format_measured, format_table, identify_preset,
                                  measure_step_bytes, measured_to_json, memory_report, to_json)

SGLANG_35B = dict(num_slots=49, draft_tokens=4, ring_len=16)  # research 5.1
INTERMEDIATE_35B = 30 * 49 * 4 * 32 * 128 * 128 * 4


def test_sglang_intermediate_figure():
  report = memory_report(GDNConfig.preset("qwen3.5-35b-a3b"), **SGLANG_35B)
  assert report.intermediate_bytes == INTERMEDIATE_35B
  assert format_bytes(report.intermediate_bytes) == "11.48 GiB"
  table = format_table(report)
  assert "11.48 GiB" in table
  assert "qwen3.5-35b-a3b" in table and "tp=1" in table


def test_35b_all_fields():
  r = memory_report(GDNConfig.preset("qwen3.5-35b-a3b"), **SGLANG_35B)
  assert r.checkpoint_bytes == 30 * 49 * 32 * 128 * 128 * 4  # 2.87 GiB
  assert r.conv_bytes == 30 * 49 * (2 * 16 * 128 + 32 * 128) * (3 + 4) * 2
  assert r.ring_bytes == 30 * 49 * 397_312
  assert r.cursor_bytes == 49 * 9
  assert r.recurrent_total_bytes == r.checkpoint_bytes + r.conv_bytes + INTERMEDIATE_35B
  assert r.replayssm_total_bytes == r.checkpoint_bytes + r.conv_bytes + r.ring_bytes + 441
  assert r.saved_bytes == r.recurrent_total_bytes - r.replayssm_total_bytes
  assert r.scratch_saving == pytest.approx(INTERMEDIATE_35B / (30 * 49 * 397_312))
  assert r.total_saving == pytest.approx(r.recurrent_total_bytes / r.replayssm_total_bytes)
  assert (r.preset, r.tp) == ("qwen3.5-35b-a3b", 1)
  assert (r.ssm_dtype, r.activation_dtype, r.ring_dtype) == ("float32", "bfloat16", "bfloat16")


def test_ring_bytes_per_layer_per_slot():
  """16 (2 32 128 + 2 16 128) 2 + 2 16 32 4 = 397,312 B (research 5.1)."""
  gdn = GDNConfig.preset("qwen3.5-35b-a3b")
  one_layer = dataclasses.replace(gdn, num_layers=1, num_gdn_layers=1)
  one = memory_report(one_layer, num_slots=1, draft_tokens=4, ring_len=16)
  assert one.ring_bytes == 397_312
  assert memory_report(gdn, num_slots=1, draft_tokens=4, ring_len=16).ring_bytes == 30 * 397_312


CROSS_CHECK = [
    # (preset, tp, slots, T, L, activation, ring)
    ("qwen3.5-35b-a3b", 1, 49, 4, 16, jnp.bfloat16, None),
    ("qwen3.5-35b-a3b", 4, 49, 4, 16, jnp.bfloat16, None),
    ("qwen3-next-80b-a3b", 2, 17, 2, 8, jnp.float16, None),
    ("qwen3.5-122b-a10b", 4, 128, 8, 16, jnp.bfloat16, jnp.float32),
    ("qwen3.5-397b-a17b", 8, 256, 6, 32, jnp.float32, None),
    ("qwen3.5-27b", 2, 3, 1, 2, jnp.bfloat16, jnp.float16),
    ("qwen3.5-9b", 1, 1, 3, 64, jnp.float16, jnp.bfloat16),
    ("qwen3.5-4b", 16, 7, 16, 32, jnp.float32, jnp.bfloat16),
]


@pytest.mark.parametrize("preset, tp, slots, T, L, act, ring", CROSS_CHECK,
                         ids=[f"{c[0]}-tp{c[1]}-S{c[2]}-T{c[3]}-L{c[4]}" for c in CROSS_CHECK])
def test_formulas_equal_container_accounting(preset, tp, slots, T, L, act, ring):
  gdn = GDNConfig.preset(preset, tp=tp)
  kwargs = dict(num_slots=slots, draft_tokens=T, ring_len=L, activation_dtype=act,
                ring_dtype=ring)
  formula, containers = memory_report(gdn, **kwargs), container_memory_report(gdn, **kwargs)
  assert formula == containers
  assert (formula.preset, formula.tp) == (preset, tp)


def test_checkpoint_copy_counts_as_replayssm_scratch():
  """`SpecConfig.checkpoint_copy`: half a checkpoint more, in the formula and the containers
  alike, counted as ReplaySSM's spec scratch and shown in the table."""
  gdn = GDNConfig.preset("qwen3.5-35b-a3b")
  kwargs = dict(num_slots=17, draft_tokens=4, ring_len=16)
  plain = memory_report(gdn, **kwargs)
  copy = memory_report(gdn, checkpoint_copy=jnp.bfloat16, **kwargs)
  assert copy == container_memory_report(gdn, checkpoint_copy="bfloat16", **kwargs)
  assert plain.copy_bytes == 0 and copy.copy_bytes == plain.checkpoint_bytes // 2
  assert copy.replayssm_total_bytes == plain.replayssm_total_bytes + copy.copy_bytes
  assert copy.scratch_saving == plain.intermediate_bytes / (plain.ring_bytes + copy.copy_bytes)
  assert "checkpoint copy (spec scratch)" in format_table(copy)
  assert "checkpoint copy" not in format_table(plain)
  assert to_json(copy)["copy_bytes"] == copy.copy_bytes


def test_custom_geometry_has_no_preset():
  gdn = GDNConfig(num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16, hidden_size=32,
                  num_layers=4, num_gdn_layers=3)
  assert identify_preset(gdn) == (None, None)
  report = memory_report(gdn, num_slots=3, draft_tokens=2, ring_len=8)
  assert report == container_memory_report(gdn, num_slots=3, draft_tokens=2, ring_len=8)
  assert "custom geometry" in format_table(report)
  assert to_json(report)["preset"] is None and to_json(report)["tp"] is None


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_identify_preset(name, tp):
  assert identify_preset(GDNConfig.preset(name, tp=tp)) == (name, tp)


@pytest.mark.parametrize("kwargs, fragments", [
    (dict(ring_len=12), ["ring_len=12", "power of two", "try ring_len=16"]),
    (dict(ring_len=4), ["ring_len=4", ">= 2 * draft_tokens = 8", "try ring_len=8"]),
    (dict(draft_tokens=0), ["draft_tokens=0", ">= 1"]),
    (dict(num_slots=0), ["num_slots=0", "positive integer"]),
    (dict(activation_dtype=jnp.int32), ["activation_dtype=", "floating dtype"]),
    (dict(activation_dtype="float99"), ["activation_dtype='float99'", "floating dtype"]),
    (dict(ring_dtype="int8"), ["ring_dtype='int8'", "floating dtype"]),
], ids=["L-not-pow2", "L-below-2T", "T0", "slots0", "act-int", "act-unknown", "ring-int"])
def test_invalid_inputs(kwargs, fragments):
  args = dict(SGLANG_35B) | kwargs
  with pytest.raises(ValueError) as info:
    memory_report(GDNConfig.preset("qwen3.5-35b-a3b"), **args)
  for fragment in fragments:
    assert fragment in str(info.value)


@pytest.mark.parametrize("n, text", [(0, "0 B"), (441, "441 B"), (1023, "1023 B"),
                                     (1024, "1.00 KiB"), (3 << 20, "3.00 MiB"),
                                     (INTERMEDIATE_35B, "11.48 GiB"), (5 << 40, "5120.00 GiB")])
def test_format_bytes(n, text):
  assert format_bytes(n) == text


def test_table_is_aligned():
  lines = format_table(memory_report(GDNConfig.preset("qwen3.5-35b-a3b"), **SGLANG_35B))
  lines = lines.splitlines()
  rows = [l for l in lines if l.startswith(("checkpoint", "conv", "intermediate", "rings",
                                            "cursors", "total "))]
  assert len(rows) == 6
  assert len({len(row) for row in rows}) == 1  # right-aligned columns end together
  assert any("21.11x smaller" in l for l in lines)


def test_to_json_is_serialisable():
  data = to_json(memory_report(GDNConfig.preset("qwen3.5-35b-a3b", tp=2), **SGLANG_35B))
  assert json.loads(json.dumps(data)) == data
  for key in ("checkpoint_bytes", "conv_bytes", "intermediate_bytes", "ring_bytes",
              "cursor_bytes", "recurrent_total_bytes", "replayssm_total_bytes", "saved_bytes"):
    assert type(data[key]) is int, key
  assert data["intermediate_bytes"] == INTERMEDIATE_35B // 2


# --- CLI --------------------------------------------------------------------------------------

ARGS_35B = ["memory", "--preset", "qwen3.5-35b-a3b", "--slots", "49", "--draft-tokens", "4",
            "--ring-len", "16"]


def test_cli_json(capsys):
  assert cli.main([*ARGS_35B, "--json"]) == 0
  data = json.loads(capsys.readouterr().out)
  assert data["intermediate_bytes"] == INTERMEDIATE_35B
  assert data["ring_bytes"] == 30 * 49 * 397_312
  assert data["checkpoint_bytes"] == 30 * 49 * 32 * 128 * 128 * 4
  assert data["conv_bytes"] == 30 * 49 * 8192 * 7 * 2
  assert data["cursor_bytes"] == 441
  assert data["recurrent_total_bytes"] == (data["checkpoint_bytes"] + data["conv_bytes"]
                                           + data["intermediate_bytes"])
  assert data["replayssm_total_bytes"] == (data["checkpoint_bytes"] + data["conv_bytes"]
                                           + data["ring_bytes"] + data["cursor_bytes"])
  assert data["scratch_saving"] == pytest.approx(21.1134, rel=1e-4)
  assert data["total_saving"] > 1
  assert {k: data[k] for k in ("preset", "tp", "num_slots", "draft_tokens", "ring_len",
                               "num_gdn_layers", "ssm_dtype", "activation_dtype",
                               "ring_dtype")} == {
      "preset": "qwen3.5-35b-a3b", "tp": 1, "num_slots": 49, "draft_tokens": 4, "ring_len": 16,
      "num_gdn_layers": 30, "ssm_dtype": "float32", "activation_dtype": "bfloat16",
      "ring_dtype": "bfloat16"}


def test_cli_options(capsys):
  assert cli.main([*ARGS_35B, "--tp", "4", "--activation-dtype", "float16", "--ring-dtype",
                   "float32", "--json"]) == 0
  data = json.loads(capsys.readouterr().out)
  assert (data["tp"], data["num_v_heads"], data["activation_dtype"], data["ring_dtype"]) == (
      4, 8, "float16", "float32")
  expected = memory_report(GDNConfig.preset("qwen3.5-35b-a3b", tp=4), **SGLANG_35B,
                           activation_dtype=jnp.float16, ring_dtype=jnp.float32)
  assert data == to_json(expected)


def test_cli_table(capsys):
  assert cli.main(ARGS_35B) == 0
  out = capsys.readouterr().out
  assert out == format_table(memory_report(GDNConfig.preset("qwen3.5-35b-a3b"),
                                           **SGLANG_35B)) + "\n"
  assert "11.48 GiB" in out


def _cli_error(capsys, argv: list[str]) -> str:
  with pytest.raises(SystemExit) as info:
    cli.main(argv)
  assert info.value.code == 2
  captured = capsys.readouterr()
  assert captured.out == ""
  assert "Traceback" not in captured.err
  return captured.err


def test_cli_unknown_preset(capsys):
  err = _cli_error(capsys, ["memory", "--preset", "llama-7b", "--slots", "49",
                            "--draft-tokens", "4", "--ring-len", "16"])
  assert "invalid choice: 'llama-7b'" in err
  for name in PRESETS:
    assert name in err


@pytest.mark.parametrize("extra, fragments", [
    (["--ring-len", "12"], ["ring_len=12", "power of two", "try ring_len=16"]),
    (["--draft-tokens", "0"], ["draft_tokens=0"]),
    (["--draft-tokens", "-1"], ["draft_tokens=-1"]),
    (["--slots", "0"], ["num_slots=0"]),
    (["--tp", "3"], ["tp=3", "[1, 2, 4, 8, 16]"]),
    (["--slots", "many"], ["--slots", "invalid int value: 'many'"]),
    (["--activation-dtype", "int8"], ["--activation-dtype", "invalid choice: 'int8'"]),
], ids=["L12", "T0", "T-1", "slots0", "tp3", "slots-str", "act-int8"])
def test_cli_invalid_values(capsys, extra, fragments):
  err = _cli_error(capsys, [*ARGS_35B, *extra])
  assert "replayssm-jax memory: error:" in err
  for fragment in fragments:
    assert fragment in err


def test_cli_needs_a_subcommand(capsys):
  assert "required" in _cli_error(capsys, [])


def test_cli_version(capsys):
  with pytest.raises(SystemExit) as info:
    cli.main(["--version"])
  assert info.value.code == 0
  assert capsys.readouterr().out.strip() == f"replayssm-jax {__version__}"


def _run_module(*args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "replayssm_jax", *args], capture_output=True,
                        text=True, env=env, timeout=120)


def test_python_dash_m():
  proc = _run_module(*ARGS_35B)
  assert proc.returncode == 0, proc.stderr
  assert "11.48 GiB" in proc.stdout
  proc = _run_module(*ARGS_35B, "--json")
  assert proc.returncode == 0, proc.stderr
  assert json.loads(proc.stdout)["intermediate_bytes"] == INTERMEDIATE_35B


def test_python_dash_m_error():
  proc = _run_module("memory", "--preset", "nope", "--slots", "1", "--draft-tokens", "1",
                     "--ring-len", "2")
  assert proc.returncode == 2
  assert "usage: replayssm-jax memory" in proc.stderr
  assert "Traceback" not in proc.stderr


# --- measured bytes (XLA memory analysis of the compiled per-layer steps) ---------------------

SMALL = dict(num_slots=5, draft_tokens=4, ring_len=16)  # 4 rows per step
SMALL_GDN = GDNConfig.preset("qwen3.5-35b-a3b", tp=8)  # H=2, HV=4, K=V=128, 30 GDN layers


@pytest.fixture(scope="module")
def measured():
  return measure_step_bytes(SMALL_GDN, **SMALL)


def _input_bytes(gdn: GDNConfig, B: int, T: int, act: int = 2) -> tuple[int, int]:
  """Exact bytes of the verify inputs (q, k, v, a, b, A_log, dt_bias, slot_ids) and the commit's."""
  H, HV, K, V = gdn.num_k_heads, gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim
  verify = B * T * (2 * H * K + HV * V + 2 * HV) * act + 2 * HV * 4 + B * 4
  return verify, 2 * B * 4


def test_measured_setup(measured):
  m = measured
  assert (m.platform, m.backend, m.batch) == ("cpu", "xla", 4)
  assert (m.num_slots, m.draft_tokens, m.ring_len, m.num_gdn_layers) == (5, 4, 16, 30)
  assert (m.activation_dtype, m.ring_dtype) == ("bfloat16", "bfloat16")
  assert m.recurrent.mode == "recurrent" and m.replayssm.mode == "replayssm"
  assert m.allocation_note is None
  assert all(mode.allocated is None for mode in m.modes)
  assert 0 < m.compile_seconds < 120


def test_measured_arguments_are_the_analytical_cache(measured):
  """Argument bytes = one layer's cache, as memory_report counts it, + the inputs."""
  report = memory_report(SMALL_GDN, **SMALL)
  N = SMALL_GDN.num_gdn_layers
  assert measured.recurrent.cache_bytes == (report.checkpoint_bytes
                                            + report.intermediate_bytes) // N
  # Every layer's ReplayCache holds its own cursors; memory_report counts them once.
  assert measured.replayssm.cache_bytes == ((report.checkpoint_bytes + report.ring_bytes) // N
                                            + report.cursor_bytes)
  verify_in, commit_in = _input_bytes(SMALL_GDN, B=4, T=4)
  for mode in measured.modes:
    assert (mode.verify.input_bytes, mode.commit.input_bytes) == (verify_in, commit_in)
    assert mode.verify.argument_bytes == mode.cache_bytes + verify_in, mode.mode
    assert mode.commit.argument_bytes == mode.cache_bytes + commit_in, mode.mode


def test_measured_steps_alias_the_donated_cache(measured):
  """Every donated step writes the cache in place: no full-buffer copy of it comes out."""
  B, T, HV, V = 4, 4, SMALL_GDN.num_v_heads, SMALL_GDN.head_v_dim
  o_bytes = B * T * HV * V * 2
  for mode in measured.modes:
    for name, step, extra in (("verify", mode.verify, o_bytes), ("commit", mode.commit, 0)):
      assert step.alias_bytes >= mode.cache_bytes, (mode.mode, name)
      # Outputs: the aliased cache, the verify's o, and CPU's output tuple (8 B a leaf).
      assert 0 <= step.output_bytes - mode.cache_bytes - extra <= 8 * 16, (mode.mode, name)
      assert step.device_bytes == (step.argument_bytes + step.output_bytes + step.temp_bytes
                                   - step.alias_bytes)


def test_measured_recurrent_verify_carries_intermediate(measured):
  """The recurrent cache holds T full states per slot; its verify writes T per row."""
  S, B, T = 5, 4, 4
  state = SMALL_GDN.num_v_heads * SMALL_GDN.head_v_dim * SMALL_GDN.head_k_dim * 4
  rec, rep = measured.recurrent, measured.replayssm
  assert rec.cache_bytes == S * (1 + T) * state
  # Both verifies output their cache: the difference is `intermediate` minus the rings.
  assert (rec.verify.output_bytes - rep.verify.output_bytes
          == rec.cache_bytes - rep.cache_bytes + 8 * (2 - 10))  # 2 vs 10 cache leaves
  # The xla reference stages the B T states of the window before scattering them in place.
  assert rec.verify.temp_bytes >= B * T * state
  # Commit: the recurrent one gathers the B committed states; ReplaySSM moves cursors only.
  assert rec.commit.temp_bytes >= B * state
  assert rep.commit.temp_bytes < 4096
  for step in ("verify", "commit"):
    assert getattr(rep, step).device_bytes < getattr(rec, step).device_bytes


def test_measured_all_layers(measured):
  N = 30
  for mode in measured.modes:
    assert measured.model_step_bytes(mode) == (N * mode.cache_bytes + mode.verify.device_bytes
                                               - mode.cache_bytes)


def test_measured_table_and_json(measured):
  report = memory_report(SMALL_GDN, **SMALL)
  table = format_table(report, measured)
  assert table.startswith(format_table(report) + "\n\n")
  section = format_measured(measured)
  assert table.endswith(section)
  lines = section.splitlines()
  assert lines[0] == "measured (XLA memory analysis, cpu, per layer)"
  assert "backend xla (cpu)" in lines[1] and "4 rows per step" in lines[1]
  assert "nothing allocated" in lines[2]
  rows = [l for l in lines if l.startswith(("SSM cache", "verify:", "commit:",
                                            "30 caches + one verify  "))]
  assert len(rows) == 13
  assert len({len(row) for row in rows}) == 1
  assert format_bytes(measured.recurrent.verify.temp_bytes) in section
  data = to_json(report, measured)
  assert json.loads(json.dumps(data)) == data
  assert {k: v for k, v in data.items() if k != "measured"} == to_json(report)
  m = data["measured"]
  assert (m["per_layer"], m["platform"], m["backend"], m["batch"]) == (True, "cpu", "xla", 4)
  for mode in ("recurrent", "replayssm"):
    assert m[mode]["cache_bytes"] == getattr(measured, mode).cache_bytes
    assert m[mode]["all_layers_cache_bytes"] == 30 * m[mode]["cache_bytes"]
    for step in ("verify", "commit"):
      got = m[mode][step]
      assert all(type(v) is int for v in got.values())
      assert got["device_bytes"] == (got["argument_bytes"] + got["output_bytes"]
                                     + got["temp_bytes"] - got["alias_bytes"])


def test_measure_allocate_on_cpu_allocates_nothing():
  gdn = GDNConfig(num_k_heads=1, num_v_heads=2, head_k_dim=8, head_v_dim=8, hidden_size=16,
                  num_layers=2, num_gdn_layers=1)
  m = measure_step_bytes(gdn, 3, 2, 4, allocate=True)
  assert m.allocation_note == "cpu gives no memory_stats(); nothing was allocated"
  assert m.recurrent.allocated is None and m.replayssm.allocated is None
  assert "allocate: cpu gives no memory_stats()" in format_measured(m)


def test_run_allocated_reads_the_counters():
  """The GPU path, run on CPU arrays with a fake memory_stats."""
  from replayssm_jax import ssm
  from replayssm_jax.config import SpecConfig
  from replayssm_jax.memory import _run_allocated, _struct

  gdn = GDNConfig(num_k_heads=1, num_v_heads=2, head_k_dim=8, head_v_dim=8, hidden_size=16,
                  num_layers=2, num_gdn_layers=1)
  spec = SpecConfig(draft_tokens=2, ring_len=4, verify_mode="replayssm")
  B, T, f32 = 2, 2, jnp.float32
  verify_inputs = (_struct((B, T, 1, 8), f32), _struct((B, T, 1, 8), f32),
                   _struct((B, T, 2, 8), f32), _struct((B, T, 2), f32), _struct((B, T, 2), f32),
                   _struct((2,), f32), _struct((2,), f32), _struct((B,), jnp.int32))
  commit_inputs = (_struct((B,), jnp.int32), _struct((B,), jnp.int32))
  readings = iter([{"bytes_in_use": 100, "peak_bytes_in_use": 100},
                   {"bytes_in_use": 600, "peak_bytes_in_use": 600},
                   {"bytes_in_use": 650, "peak_bytes_in_use": 900}])
  calls = []

  def verify(cache, *inputs):
    calls.append(("verify", inputs[-1].tolist()))
    return ssm.verify(cache, *inputs, spec=spec)

  def commit(cache, slot_ids, accepted):
    calls.append(("commit", slot_ids.tolist(), accepted.tolist()))
    return ssm.commit(cache, slot_ids, accepted, spec=spec)

  allocated = _run_allocated(lambda: next(readings),
                             lambda: ssm.init(gdn, spec, 3, dtype=f32), verify, commit,
                             verify_inputs, commit_inputs)
  assert calls == [("verify", [0, 1]), ("commit", [0, 1], [1, 1])]
  assert allocated == AllocatedBytes(bytes_in_use_before=100, bytes_in_use_with_cache=600,
                                     bytes_in_use_after=650, peak_bytes_in_use=900)
  assert (allocated.cache_and_inputs_bytes, allocated.peak_above_before) == (500, 800)
  assert _run_allocated(lambda: None, None, None, None, verify_inputs, commit_inputs) is None


@pytest.mark.parametrize("kwargs, fragments", [
    (dict(batch=0), ["batch=0", "1..num_slots=5"]),
    (dict(batch=6), ["batch=6", "1..num_slots=5"]),
    (dict(backend="triton"), ["backend='triton'", "'xla' or 'pallas'"]),
    (dict(ring_len=12), ["ring_len=12", "power of two"]),
    (dict(num_slots=0), ["num_slots=0"]),
], ids=["batch0", "batch-above-slots", "triton", "L12", "slots0"])
def test_measure_invalid_inputs(kwargs, fragments):
  args = dict(SMALL) | kwargs
  with pytest.raises(ValueError) as info:
    measure_step_bytes(SMALL_GDN, **args)
  for fragment in fragments:
    assert fragment in str(info.value)


SMALL_ARGS = ["memory", "--preset", "qwen3.5-35b-a3b", "--tp", "8", "--slots", "5",
              "--draft-tokens", "4", "--ring-len", "16"]


def test_cli_measure_json(capsys, measured):
  assert cli.main([*SMALL_ARGS, "--measure", "--json"]) == 0
  data = json.loads(capsys.readouterr().out)
  expected = measured_to_json(measured)
  got = data.pop("measured")
  assert data == to_json(memory_report(SMALL_GDN, **SMALL))
  got.pop("compile_seconds"), expected.pop("compile_seconds")
  assert got == expected


def test_cli_measure_table(capsys, monkeypatch, measured):
  """The options reach measure_step_bytes (stubbed here: the fixture's result, no compile)."""
  seen = []

  def fake(*args, **kwargs):
    seen.append((args, kwargs))
    return measured

  monkeypatch.setattr(memory_module, "measure_step_bytes", fake)
  assert cli.main([*SMALL_ARGS, "--measure", "--batch", "2", "--backend", "xla",
                   "--allocate", "--activation-dtype", "float16",
                   "--checkpoint-copy", "bfloat16"]) == 0
  out = capsys.readouterr().out
  assert out == format_table(memory_report(SMALL_GDN, **SMALL, activation_dtype=jnp.float16,
                                           checkpoint_copy=jnp.bfloat16), measured) + "\n"
  assert seen == [((SMALL_GDN, 5, 4, 16), dict(batch=2, activation_dtype="float16",
                                                ring_dtype=None, backend="xla", allocate=True,
                                                checkpoint_copy="bfloat16"))]


@pytest.mark.parametrize("extra, fragments", [
    (["--batch", "2"], ["--batch needs --measure"]),
    (["--backend", "xla"], ["--backend needs --measure"]),
    (["--allocate"], ["--allocate needs --measure"]),
    (["--measure", "--batch", "9"], ["batch=9", "1..num_slots=5"]),
    (["--measure", "--backend", "triton"], ["--backend", "invalid choice: 'triton'"]),
], ids=["batch", "backend", "allocate", "batch-too-big", "backend-triton"])
def test_cli_measure_invalid(capsys, extra, fragments):
  err = _cli_error(capsys, [*SMALL_ARGS, *extra])
  for fragment in fragments:
    assert fragment in err
