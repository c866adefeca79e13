"""The notebook helpers of `replayssm_jax.viz` that need no matplotlib."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp

from replayssm_jax import GDNConfig, SpecConfig, ssm, viz

ROOT = Path(__file__).resolve().parents[1]


def test_ring_frame_cells_wrap_around():
  """History and window are logical ranges from cache_base, modulo L."""
  frame = viz.RingFrame(ring_len=8, cache_base=6, write_pos=3, window=2)
  kinds = [frame.cell_kind(p) for p in range(8)]
  assert kinds == ["history", "window", "window", "free", "free", "free", "history", "history"]


def test_ring_frame_reads_the_cursors_of_a_cache():
  gdn = GDNConfig(num_k_heads=1, num_v_heads=1, head_k_dim=4, head_v_dim=4, hidden_size=8,
                  num_layers=1, num_gdn_layers=1)
  spec = SpecConfig(draft_tokens=2, ring_len=4)
  cache = ssm.init(gdn, spec, num_slots=2, dtype=jnp.float32)
  frame = viz.ring_frame(cache, 1, window=2, label="x")
  assert frame == viz.RingFrame(ring_len=4, cache_base=0, write_pos=0, window=2, is_flush=False,
                                label="x")


def test_benchmark_series_uses_the_rows_it_finds():
  result = json.loads((ROOT / "benchmarks" / "results_h200.json").read_text())
  series = viz.benchmark_series(result)
  assert sum(len(rows) for rows in series.values()) == len(result["rows"])
  for rows in series.values():
    assert [r["B"] for r in rows] == sorted(r["B"] for r in rows)
  # One kernel timed at several ring lengths gives one series per L.
  multi = {r["kernel"] for r in result["rows"]
           if len({x["L"] for x in result["rows"] if x["kernel"] == r["kernel"]}) > 1}
  for kernel in multi:
    assert kernel not in series and any(label.startswith(f"{kernel} L=") for label in series)


def test_repo_root_from_anywhere(tmp_path, monkeypatch):
  assert viz.repo_root(ROOT / "notebooks") == ROOT
  monkeypatch.chdir(tmp_path)  # nothing above tmp_path: falls back to the package's checkout
  assert viz.repo_root() == ROOT


def test_plot_fixed_costs_draws_each_fit_and_names_what_it_lacks():
  """One fitted line per path and the copy line; a path without two batch sizes from 64 is
  named in the error."""
  import pytest

  matplotlib = pytest.importorskip("matplotlib")
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  result = json.loads((ROOT / "benchmarks" / "results_h200_run28.json").read_text())
  fig, ax = plt.subplots()
  viz.plot_fixed_costs(ax, result, ["rssm_verify (wp=8)", "rec_decode"])
  assert len(ax.lines) == 3 and "15.0 us" in ax.lines[0].get_label()
  with pytest.raises(ValueError, match="rssm_decode_cycle"):
    viz.plot_fixed_costs(ax, result, ["rssm_decode_cycle"])
  plt.close(fig)


def test_decode_speedups_and_plot():
  """The ratio at each B that has both paths, from run 41's flushed decode cycles; a file with
  no such B is named in the error."""
  import pytest

  result = json.loads((ROOT / "benchmarks" / "ab_h100_run41_steps_flushed_1.json").read_text())
  speedups = viz.decode_speedups(result)
  rec = {r["B"]: r["median_us"] for r in result["rows"] if r["kernel"] == "rec_decode"}
  cycle = {r["B"]: r["median_us"] for r in result["rows"] if r["kernel"] == "rssm_decode_cycle"}
  assert list(speedups) == sorted(rec) == [8, 16, 32, 64, 256]
  assert speedups == {B: rec[B] / cycle[B] for B in rec}
  assert speedups[8] < 1 < speedups[256]  # run 41: behind at 8 rows, ahead at 256
  with pytest.raises(ValueError, match="L=32"):
    viz.decode_speedups(result, ring_len=32)
  matplotlib = pytest.importorskip("matplotlib")
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots()
  viz.plot_decode_speedups(ax, {"flushed": result}, target=1.6)
  assert [line.get_label() for line in ax.lines] == ["flushed", "break-even", "target 1.6x"]
  plt.close(fig)
