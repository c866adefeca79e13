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
