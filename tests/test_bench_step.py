"""The end-to-end step benchmark: a --tiny smoke run on the CPU and its aliasing check.

The numbers of a tiny CPU run mean nothing; these tests check that every stage runs (one
subprocess per mode, as on the GPU), that the JSON holds what the device run will report,
and that the no-copy check accepts the donated per-layer loop and catches real copies.
"""

from __future__ import annotations

import json
import math

import jax.numpy as jnp
import pytest

from replayssm_jax.bench import step
from replayssm_jax.kernels import backend as kernel_backend


def test_tiny_smoke_run(tmp_path):
  out = tmp_path / "step.json"
  assert step.main(["--tiny", "--batch", "3", "--layers", "2", "--reps", "3", "--out", str(out)]) == 0
  result = json.loads(out.read_text())
  rows = {row["mode"]: row for row in result["rows"]}
  assert set(rows) == {"recurrent", "replayssm"}
  for row in rows.values():
    assert row["status"] == "ok", row.get("error")
    assert row["B"] == 3 and row["layers"] == 2 and row["backend"] == "xla"
    for key in ("median_us", "p20_us", "p80_us"):
      assert math.isfinite(row[key]) and row[key] > 0
    assert row["no_cache_copy"] and row["cache_copies"] == []
    assert "span_us" in row and row["set"] == {}
    assert row["alias_bytes"] >= row["cache_bytes"] > 0
    assert row["analysis_peak_bytes"] > 0 and row["temp_bytes"] >= 0
  assert rows["replayssm"]["scratch_bytes"] < rows["recurrent"]["scratch_bytes"]
  assert rows["replayssm"]["checkpoint_bytes"] == rows["recurrent"]["checkpoint_bytes"]
  (summary,) = result["summary"]
  assert summary["B"] == 3 and summary["scratch_vs_peak"] > 0 and summary["speedup"] > 0
  assert result["layers"] == 2 and result["tiny"]


@pytest.mark.parametrize("in_process", [False, True])
def test_set_knob_reaches_every_mode(tmp_path, in_process):
  """``--set`` reaches each mode's process (the rows record what that process set) and is
  restored after an in-process run; a knob of no module is refused."""
  out = tmp_path / "step.json"
  knob = "kernels.backend.VEC_TILE=(32, 2, 32)"
  before = kernel_backend.VEC_TILE
  assert step.main(["--tiny", "--batch", "2", "--layers", "1", "--reps", "2", "--modes",
                    "replayssm", "--set", knob, "--out", str(out)]
                   + (["--in-process"] if in_process else [])) == 0
  result = json.loads(out.read_text())
  expected = {"replayssm_jax.kernels.backend.VEC_TILE": "(32, 2, 32)"}
  (row,) = result["rows"]
  assert row["status"] == "ok", row.get("error")
  assert result["set"] == row["set"] == expected
  assert row["span_us"] is None or row["span_us"] > 0  # a span where the device has events
  assert kernel_backend.VEC_TILE == before
  with pytest.raises(SystemExit):
    step.main(["--tiny", "--set", "kernels.backend.NO_SUCH_KNOB=1", "--out", str(out)])


def test_budget_stops_before_a_new_batch(tmp_path):
  out = tmp_path / "step.json"
  assert step.main(["--tiny", "--budget-s", "0", "--batch", "2", "--out", str(out)]) == 0
  result = json.loads(out.read_text())
  assert result["rows"] == [] and result["stopped_before_B"] == 2


def _compiled(mode: str, layout: str, *, donate: bool = True, chain: bool = True):
  gdn, B, layers = step.geometry(True), 3, 2
  spec = step.spec_for(mode, "xla")
  caches = step.make_caches(gdn, spec, B, layers, layout=layout)
  inputs = step.make_inputs(gdn, B, layers, layout=layout)
  fn = step.make_step(spec, layout, donate=donate, chain=chain)
  args = (caches, inputs, jnp.arange(B, dtype=jnp.int32), step.accepted_counts(B))
  return fn.lower(*args).compile(), caches


@pytest.mark.parametrize("chain", [True, False])
@pytest.mark.parametrize("mode", step.MODES)
def test_donated_loop_step_copies_no_cache(mode, chain):
  compiled, caches = _compiled(mode, "loop", chain=chain)
  step.assert_no_cache_copy(compiled, caches)


@pytest.mark.parametrize("mode", step.MODES)
def test_no_copy_check_catches_copies(mode):
  """The stacked scan copies the checkpoint (its outputs are fresh buffers); without donation
  nothing aliases. The check must fail on both."""
  compiled, caches = _compiled(mode, "scan")
  copies = step.cache_copies(compiled, caches)
  stacked_checkpoint = "f32[" + ",".join(map(str, caches.ssm.shape)) + "]"
  assert any(stacked_checkpoint in line for line in copies), copies
  with pytest.raises(AssertionError, match="copies of cache arrays"):
    step.assert_no_cache_copy(compiled, caches)
  compiled, caches = _compiled(mode, "loop", donate=False)
  with pytest.raises(AssertionError, match="donated cache bytes alias"):
    step.assert_no_cache_copy(compiled, caches)


def test_scratch_bytes_match_the_memory_report():
  """The recurrent and ReplaySSM spec scratch of the full geometry equals `memory_report`'s."""
  from replayssm_jax.memory import memory_report

  gdn = step.geometry(False)
  report = memory_report(gdn, num_slots=256, draft_tokens=step.T, ring_len=step.L)
  rec = step.static_bytes(gdn, step.spec_for("recurrent", "xla"), 256, gdn.num_gdn_layers)
  rep = step.static_bytes(gdn, step.spec_for("replayssm", "xla"), 256, gdn.num_gdn_layers)
  assert rec["scratch_bytes"] == report.intermediate_bytes
  assert rep["scratch_bytes"] == report.ring_bytes
  assert rec["checkpoint_bytes"] == rep["checkpoint_bytes"] == report.checkpoint_bytes
  copy = memory_report(gdn, num_slots=256, draft_tokens=step.T, ring_len=step.L,
                       checkpoint_copy=jnp.bfloat16)
  rep = step.static_bytes(gdn, step.spec_for("replayssm", "xla", "bfloat16"), 256,
                          gdn.num_gdn_layers)
  assert rep["scratch_bytes"] == copy.replayssm_scratch_bytes == report.ring_bytes + copy.copy_bytes


def test_checkpoint_copy_step(tmp_path):
  """``--checkpoint-copy``: the ReplaySSM step keeps and aliases the copy (its scratch counts
  it), the recurrent step is as before, and the file and summary say so."""
  out = tmp_path / "step.json"
  assert step.main(["--tiny", "--batch", "3", "--layers", "2", "--reps", "2",
                    "--checkpoint-copy", "bfloat16", "--out", str(out)]) == 0
  result = json.loads(out.read_text())
  rows = {row["mode"]: row for row in result["rows"]}
  assert result["checkpoint_copy"] == "bfloat16"
  assert rows["replayssm"]["checkpoint_copy"] == "bfloat16"
  assert rows["replayssm"]["no_cache_copy"] and rows["replayssm"]["status"] == "ok"
  half = rows["replayssm"]["checkpoint_bytes"] // 2
  rings = step.static_bytes(step.geometry(True), step.spec_for("replayssm", "xla"), 3, 2)
  assert rows["replayssm"]["scratch_bytes"] == rings["scratch_bytes"] + half
  assert rows["recurrent"]["scratch_bytes"] == step.static_bytes(
      step.geometry(True), step.spec_for("recurrent", "xla", "bfloat16"), 3, 2)["scratch_bytes"]
  (summary,) = result["summary"]
  assert summary["copy"]
