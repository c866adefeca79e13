"""Plots for the notebooks: the ReplaySSM ring and its cursors, benchmark rooflines.

Nothing in the core package imports this module, and matplotlib is imported inside the
functions that draw, so the package itself does not depend on matplotlib
(``pip install replayssm-jax[notebooks]`` brings it).

- `RingFrame`, `ring_frame`, `draw_ring`, `draw_ring_schedule`: the cursor protocol of
  DESIGN section 3 drawn as a ring of L cells (committed history / window / free) with
  ``cache_base`` and ``write_pos`` arrows.
- `repo_root`, `benchmark_series`, `series_styles`, `plot_bandwidth`, `plot_roofline`: a benchmark
  results file (`replayssm_jax.bench.kernels`) against the measured copy bandwidth;
  `plot_fixed_costs`: paths' times against their bytes over batch sizes, with the fixed cost
  a call pays besides its bytes (`bench.report.fixed_cost_fits`); `decode_speedups`,
  `plot_decode_speedups`: the ReplaySSM decode cycle against the recurrent decode by B.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import replayssm_jax

# Cell colours of the ring: committed history, the pending verify window, free/stale cells.
RING_COLORS = {"history": "#4C72B0", "window": "#F28E2B", "free": "#E6E6E6"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RingFrame:
  """The cursors of one slot at one moment, and what the picture should show.

  Attributes:
    ring_len: L, cells of the ring.
    cache_base: ring index of logical record 0.
    write_pos: committed records since the checkpoint (logical 0 .. write_pos - 1).
    window: records of a pending (uncommitted) verify window, at logical
      ``write_pos .. write_pos + window - 1``; 0 after a commit.
    is_flush: the next verify folds the history into the checkpoint first.
    label: title of the panel.
  """

  ring_len: int
  cache_base: int
  write_pos: int
  window: int = 0
  is_flush: bool = False
  label: str = ""

  def cell_kind(self, p: int) -> str:
    """``"history"``, ``"window"`` or ``"free"`` for ring index ``p``."""
    i = (p - self.cache_base) % self.ring_len  # logical index of the cell
    if i < self.write_pos:
      return "history"
    if i < self.write_pos + self.window:
      return "window"
    return "free"


def ring_frame(cache: Any, slot: int, *, window: int = 0, label: str = "") -> RingFrame:
  """A `RingFrame` of slot ``slot`` read from a `replayssm_jax.state.ReplayCache`.

  Args:
    cache: a ReplayCache (only its cursors and ring length are read).
    slot: the slot to draw.
    window: records of the pending verify window (``spec.draft_tokens`` right after a
      verify, 0 after a commit or a decode).
    label: panel title.
  """
  return RingFrame(ring_len=int(cache.ring_len), cache_base=int(cache.cache_base[slot]),
                   write_pos=int(cache.write_pos[slot]), window=window,
                   is_flush=bool(cache.is_flush[slot]), label=label)


def draw_ring(ax: Any, frame: RingFrame) -> None:
  """Draw ``frame`` on the matplotlib axes ``ax`` as L wedges of a circle.

  Cell p sits clockwise from the top; its ring index is written inside. Colours are
  `RING_COLORS`; the ``cache_base`` arrow points at logical record 0, the ``write_pos``
  arrow at the cell the next record goes to, ``(cache_base + write_pos) & (L - 1)``.
  """
  from matplotlib.patches import FancyArrowPatch, Wedge

  L = frame.ring_len
  step = 360.0 / L

  def angle(p: float) -> float:  # degrees (counter-clockwise from +x) of the middle of cell p
    return 90.0 - (p + 0.5) * step

  for p in range(L):
    mid = angle(p)
    ax.add_patch(Wedge((0, 0), 1.0, mid - step / 2, mid + step / 2, width=0.38,
                       facecolor=RING_COLORS[frame.cell_kind(p)], edgecolor="white", lw=1.5))
    rad = math.radians(mid)
    ax.text(0.81 * math.cos(rad), 0.81 * math.sin(rad), str(p), ha="center", va="center",
            fontsize=7, color="black" if frame.cell_kind(p) == "free" else "white")

  def arrow(p: int, color: str, r_from: float, r_to: float) -> None:
    rad = math.radians(angle(p))
    ax.add_patch(FancyArrowPatch((r_from * math.cos(rad), r_from * math.sin(rad)),
                                 (r_to * math.cos(rad), r_to * math.sin(rad)),
                                 arrowstyle="-|>", mutation_scale=10, color=color, lw=1.6))

  # cache_base from outside the ring, write_pos from inside: both stay visible on one cell.
  arrow(frame.cache_base, "black", 1.38, 1.02)
  arrow((frame.cache_base + frame.write_pos) % L, "#C44E52", 0.34, 0.6)
  status = "\nis_flush" if frame.is_flush else ""
  ax.text(0, 0, f"base={frame.cache_base}\nwp={frame.write_pos}{status}", ha="center",
          va="center", fontsize=7, linespacing=1.1)
  ax.set_xlim(-1.4, 1.4)
  ax.set_ylim(-1.4, 1.4)
  ax.set_aspect("equal")
  ax.axis("off")
  if frame.label:
    ax.set_title(frame.label, fontsize=8)


def draw_ring_schedule(frames: Sequence[RingFrame], *, ncols: int = 4,
                       panel_size: float = 2.2, title: str | None = None) -> Any:
  """A grid of `draw_ring` panels, one per frame, with a shared legend.

  Args:
    frames: the frames, in reading order (left to right, top to bottom).
    ncols: panels per row.
    panel_size: inches per panel.
    title: figure title.

  Returns:
    The matplotlib figure.
  """
  import matplotlib.pyplot as plt
  from matplotlib.lines import Line2D
  from matplotlib.patches import Patch

  nrows = max(1, -(-len(frames) // ncols))
  fig, axes = plt.subplots(nrows, ncols, figsize=(panel_size * ncols, panel_size * nrows + 0.5),
                           squeeze=False)
  for ax in axes.flat:
    ax.axis("off")
  for ax, frame in zip(axes.flat, frames):
    draw_ring(ax, frame)
  handles = [Patch(color=RING_COLORS["history"], label="committed history (logical < write_pos)"),
             Patch(color=RING_COLORS["window"], label="verify window (not yet committed)"),
             Patch(color=RING_COLORS["free"], label="free / stale"),
             Line2D([], [], color="black", marker=">", label="cache_base"),
             Line2D([], [], color="#C44E52", marker=">", label="write_pos (next record)")]
  fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
  if title:
    fig.suptitle(title, fontsize=10)
  fig.tight_layout(rect=(0, 0.08, 1, 1))
  return fig


# ----------------------------------------------------------------------------- benchmarks


def repo_root(start: Path | None = None, marker: str = "benchmarks") -> Path:
  """Find the repository root.

  It is the first of ``start`` (default: the working directory) and its parents that holds
  ``pyproject.toml`` and ``marker``; else the folder above the installed package (an
  editable install sits in the checkout).

  Raises:
    FileNotFoundError: neither place holds ``marker``.
  """
  start = Path.cwd() if start is None else Path(start)
  candidates = [start.resolve(), *start.resolve().parents,
                Path(replayssm_jax.__file__).resolve().parents[1]]
  for folder in candidates:
    if (folder / "pyproject.toml").is_file() and (folder / marker).exists():
      return folder
  raise FileNotFoundError(f"no repository root with {marker}/ above {start} or the package; "
                          "run from inside the replayssm-jax checkout.")


def series_label(row: dict[str, Any], multi_l: bool) -> str:
  """Legend label of a benchmark row: the kernel, with L when one kernel ran at several L."""
  return f"{row['kernel']} L={row['L']}" if multi_l else row["kernel"]


def benchmark_series(result: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
  """Rows of a results file grouped into series (one per path), each sorted by B.

  A kernel measured at several ring lengths (the ``rssm_decode_*`` cycles) gives one series
  per L. Whatever kernels and batch sizes the file holds are used; nothing is assumed.
  """
  ls_of: dict[str, set[int]] = {}
  for row in result["rows"]:
    ls_of.setdefault(row["kernel"], set()).add(row.get("L", 0))
  series: dict[str, list[dict[str, Any]]] = {}
  for row in result["rows"]:
    label = series_label(row, len(ls_of[row["kernel"]]) > 1)
    series.setdefault(label, []).append(row)
  return {k: sorted(v, key=lambda r: r["B"]) for k, v in series.items()}


def series_styles(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
  """Matplotlib keyword arguments per series: distinct colours, recurrent paths (``rec_*``)
  solid with circles, the ReplaySSM paths dashed with squares. Both plots use them, so a
  path has the same look in each."""
  import matplotlib.pyplot as plt

  labels = list(benchmark_series(result))
  cmap = plt.get_cmap("tab20")
  order = [*range(0, 20, 2), *range(1, 20, 2)]  # the saturated colours first
  styles = {}
  for i, label in enumerate(labels):
    recurrent = label.startswith("rec_")
    styles[label] = dict(color=cmap(order[i % 20]), ls="-" if recurrent else "--",
                         marker="o" if recurrent else "s")
  return styles


def plot_bandwidth(ax: Any, result: dict[str, Any]) -> None:
  """Achieved TB/s (minimal bytes / median time) per path against B, with the copy line."""
  styles = series_styles(result)
  for label, rows in benchmark_series(result).items():
    ax.plot([r["B"] for r in rows], [r["tbps"] for r in rows], ms=4, label=label, **styles[label])
  ax.axhline(result["copy_tbps"], color="black", ls=":", lw=1.2,
             label=f"measured copy {result['copy_tbps']:.2f} TB/s")
  ax.set_xscale("log", base=2)
  ax.set_xlabel("batch rows B")
  ax.set_ylabel("achieved TB/s (minimal bytes / median)")
  ax.set_ylim(0, result["copy_tbps"] * 1.1)
  ax.grid(alpha=0.3)


def plot_roofline(ax: Any, result: dict[str, Any]) -> None:
  """Median time against minimal bytes for every row (log-log), with ``bytes / copy BW``."""
  styles = series_styles(result)
  for label, rows in benchmark_series(result).items():
    style = styles[label]
    ax.scatter([r["min_bytes"] for r in rows], [r["median_us"] for r in rows], s=20,
               color=style["color"], marker=style["marker"], label=label)
  nbytes = np.array([r["min_bytes"] for r in result["rows"]], np.float64)
  x = np.geomspace(nbytes.min() / 2, nbytes.max() * 2, 50)
  ax.plot(x, x / (result["copy_tbps"] * 1e12) * 1e6, color="black", ls=":", lw=1.2,
          label=f"copy roofline ({result['copy_tbps']:.2f} TB/s)")
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("minimal bytes moved")
  ax.set_ylabel("median time (us)")
  ax.grid(alpha=0.3, which="both")


def plot_fixed_costs(ax: Any, result: dict[str, Any], paths: Sequence[str], *,
                     min_batch: int = 64) -> None:
  """Median time against minimal bytes (linear axes) for ``paths`` (`bench.report.path_label`
  names) from ``min_batch`` rows on, each with its `bench.report.fixed_cost_fits` line drawn
  back to zero bytes, where it meets the time axis at the path's fixed cost; and the copy
  line."""
  from replayssm_jax.bench import report

  fits = report.fixed_cost_fits(result, min_batch)
  missing = [p for p in paths if p not in fits]
  if missing:
    raise ValueError(f"no fit for {missing}: the file has none of these paths at two batch "
                     f"sizes from {min_batch} (fitted: {sorted(fits)}).")
  top = 0.0
  for i, label in enumerate(paths):
    rows = [r for r in result["rows"] if report.path_label(r) == label and r["B"] >= min_batch]
    gb = np.array([r["min_bytes"] for r in rows]) / 1e9
    top = max(top, gb.max())
    fit = fits[label]
    ax.scatter(gb, [r["median_us"] for r in rows], color=f"C{i}", zorder=3)
    x = np.linspace(0, gb.max() * 1.05, 20)
    ax.plot(x, fit.fixed_us + x * 1e3 / fit.tbps, color=f"C{i}",
            label=f"{label}: {fit.fixed_us:.1f} us + bytes at {fit.tbps:.2f} TB/s")
    for r, g in zip(rows, gb):
      ax.annotate(f"B={r['B']}", (g, r["median_us"]), textcoords="offset points",
                  xytext=(4, -10), fontsize=7, color=f"C{i}")
  x = np.linspace(0, top * 1.05, 20)
  ax.plot(x, x * 1e3 / result["copy_tbps"], color="black", ls=":", lw=1.2,
          label=f"copy probe rate ({result['copy_tbps']:.2f} TB/s, no fixed cost)")
  ax.set_xlim(0, None)
  ax.set_ylim(0, None)
  ax.set_xlabel("minimal bytes moved (GB)")
  ax.set_ylabel("median time (us)")
  ax.grid(alpha=0.3)


def decode_speedups(result: dict[str, Any], *, ring_len: int = 16) -> dict[int, float]:
  """``{B: recurrent decode / ReplaySSM decode step}`` of a results file: the recurrent decode
  (``rec_decode``, one step a call) over a step of the in-phase ReplaySSM decode cycle
  (``rssm_decode_cycle`` at ``ring_len``), at each B the file has both of; above 1 the
  ReplaySSM decode is the faster."""
  rec = {r["B"]: r["median_us"] for r in result["rows"] if r["kernel"] == "rec_decode"}
  cycle = {r["B"]: r["median_us"] for r in result["rows"]
           if r["kernel"] == "rssm_decode_cycle" and r.get("L") == ring_len}
  both = sorted(rec.keys() & cycle.keys())
  if not both:
    raise ValueError(f"no batch size with both rec_decode and rssm_decode_cycle at L={ring_len} "
                     f"(rec_decode at {sorted(rec)}, the cycle at {sorted(cycle)}).")
  return {B: rec[B] / cycle[B] for B in both}


def plot_decode_speedups(ax: Any, arms: dict[str, dict[str, Any]], *, target: float | None = None,
                         ring_len: int = 16) -> None:
  """`decode_speedups` of each results file in ``arms`` (legend label: its key) against B, with
  the break-even line at 1 and, if given, a ``target`` line."""
  for i, (name, result) in enumerate(arms.items()):
    speedups = decode_speedups(result, ring_len=ring_len)
    ax.plot(list(speedups), list(speedups.values()), marker="o", color=f"C{i}", label=name)
    for B, x in speedups.items():
      ax.annotate(f"{x:.2f}x", (B, x), textcoords="offset points", xytext=(4, 4), fontsize=7,
                  color=f"C{i}")
  ax.axhline(1.0, color="black", ls=":", lw=1.2, label="break-even")
  if target is not None:
    ax.axhline(target, color="grey", ls="--", lw=1.0, label=f"target {target:g}x")
  ax.set_xscale("log", base=2)
  ax.set_xlabel("batch rows B")
  ax.set_ylabel(f"recurrent decode / ReplaySSM decode step (L={ring_len})")
  ax.grid(alpha=0.3)
