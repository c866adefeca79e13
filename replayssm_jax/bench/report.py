"""Markdown tables from a benchmark results file (`replayssm_jax.bench.kernels`), or arms of
an A/B run (`benchmarks/ab_h200.sh`) side by side.

    python -m replayssm_jax.bench.report benchmarks/results_h200.json
    python -m replayssm_jax.bench.report --ab benchmarks/ab_h200_run45_fold_rows_r{1,2,4}_1.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import NamedTuple

import numpy as np

# SGLang's Triton kernels on the same H200 (shared/research/anchor-bench.md), median us.
ANCHOR_US = {
    "rec_verify": {1: 15.9, 16: 54.3, 64: 189.0, 256: 704.0, 512: 1390.3},
    "rssm_verify": {1: 14.5, 16: 29.2, 64: 78.6, 256: 265.4, 512: 499.2},
    "exact_fold": {1: 38.7, 16: 88.8, 64: 253.5, 256: 843.8, 512: 1629.0},
    "rssm_step_mixed": {1: 48.8, 16: 77.0, 64: 214.0, 256: 732.4, 512: 1377.7},
    "rec_decode": {1: 9.6, 16: 27.5, 64: 83.2, 256: 294.5, 512: 575.9},
}


def path_label(row) -> str:
  """A row's path as the tables name it: the kernel, with its ring length or write position."""
  if row["kernel"] in ("rssm_decode_cycle", "rssm_decode_spread"):
    return f"{row['kernel']} L={row['L']} (per step)"
  if row["wp"] > 0:
    return f"{row['kernel']} (wp={row['wp']})"
  return row["kernel"]


def kernel_table(result: dict) -> str:
  """One row per (path, B), by B (a file may hold batch sizes of several calls in any order):
  median, p20-p80, minimal bytes, TB/s, % of copy, anchor; and the device span of a call
  where the file has it (from run 37): the median is its kernels' summed time, so a span
  well above it is a call that left the GPU idle between kernels."""
  spans = any(row.get("span_us") is not None for row in result["rows"])
  lines = ["| B | path | median us | p20-p80 us | min MB | TB/s | % copy | SGLang anchor us |"
           + (" span us |" if spans else ""),
           "|---:|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if spans else "")]
  for row in sorted(result["rows"], key=lambda r: r["B"]):  # stable: paths keep their order
    anchor = ANCHOR_US.get(row["kernel"], {}).get(row["B"])
    spread = ("-" if row.get("p20_us") is None  # rows recovered from a log: medians only
              else f"{row['p20_us']:.1f}-{row['p80_us']:.1f}")
    span = row.get("span_us")
    lines.append(
        f"| {row['B']} | {path_label(row)} | {row['median_us']:.1f} | {spread} "
        f"| {row['min_bytes'] / 1e6:.2f} | {row['tbps']:.2f} | {row['pct_copy']:.1f} "
        f"| {'' if anchor is None else f'{anchor:.1f}'} |"
        + ((" - |" if span is None else f" {span:.1f} |") if spans else ""))
  return "\n".join(lines)


def summary_table(result: dict) -> str:
  """The ratios the issues set targets on, per B (batch sizes missing a row are left out),
  and those of the paths with the rows out of phase where the file has them (else "-")."""
  by = {(r["kernel"], r["B"], r["L"]): r["median_us"] for r in result["rows"]}
  lines = ["| B | rec verify + commit us | mixed ReplaySSM step us | speed-up "
           "| ReplaySSM verify traffic us | speed-up | rec decode us "
           "| ReplaySSM decode (L=16 cycle) us | speed-up | decode out of phase us | speed-up |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  needed = (("rec_verify", 0), ("rec_commit", 0), ("rssm_step_mixed", 16), ("rec_decode", 0),
            ("rssm_decode_cycle", 16))

  def against(base, key):  # "us | speed-up" of an optional path
    us = by.get(key)
    return "- | -" if us is None else f"{us:.1f} | {base / us:.2f}x"

  for B in sorted({r["B"] for r in result["rows"]}):
    if any((name, B, L) not in by for name, L in needed):  # a run cut short: no ratio to show
      continue
    rec = by[("rec_verify", B, 0)] + by[("rec_commit", B, 0)]
    dec = by[("rec_decode", B, 0)]
    lines.append(f"| {B} | {rec:.1f} | {against(rec, ('rssm_step_mixed', B, 16))} "
                 f"| {against(rec, ('rssm_traffic', B, 16))} | {dec:.1f} "
                 f"| {against(dec, ('rssm_decode_cycle', B, 16))} "
                 f"| {against(dec, ('rssm_decode_spread', B, 16))} |")
  return "\n".join(lines)


def size_table(result: dict) -> str:
  """Per B with both rows: the replay verify against one launch copying its bytes
  (``copy_verify_bytes``), whose % of the 4 GiB probe's rate is what a single call of that size
  can reach; "" for files without the copy rows (before session 34)."""
  by = {(r["kernel"], r["B"]): r for r in result["rows"]}
  batches = sorted({B for kernel, B in by if kernel == "copy_verify_bytes"
                    and ("rssm_verify", B) in by})
  if not batches:
    return ""
  lines = ["| B | replay verify us | % copy | copy of its bytes us | % copy | verify / copy |",
           "|---:|---:|---:|---:|---:|---:|"]
  for B in batches:
    verify, copy = by[("rssm_verify", B)], by[("copy_verify_bytes", B)]
    lines.append(f"| {B} | {verify['median_us']:.1f} | {verify['pct_copy']:.1f} "
                 f"| {copy['median_us']:.1f} | {copy['pct_copy']:.1f} "
                 f"| {verify['median_us'] / copy['median_us']:.2f}x |")
  return "\n".join(lines)


class Fit(NamedTuple):
  """``time = fixed_us + bytes / rate`` over a path's batch sizes (least squares)."""

  fixed_us: float  # what a call costs besides its bytes: launch, ramp, tail, latency
  tbps: float  # the marginal rate, TB/s
  batches: tuple[int, ...]
  worst_us: float  # the largest distance of a row from the line


def fixed_cost_fits(result: dict, min_batch: int = 64) -> dict[str, Fit]:
  """A `Fit` per path (as the kernel table labels it) with rows at two or more batch sizes
  from ``min_batch`` on: below 64 rows the replay verify and decode run other forms (the
  one-kernel ones), whose costs follow other lines."""
  series: dict[str, list[dict]] = {}
  for row in result["rows"]:
    if row["B"] >= min_batch and row.get("min_bytes"):
      series.setdefault(path_label(row), []).append(row)
  fits = {}
  for label, rows in series.items():
    if len({r["B"] for r in rows}) < 2:
      continue
    x = np.array([r["min_bytes"] for r in rows], np.float64)
    y = np.array([r["median_us"] for r in rows], np.float64)
    (slope, fixed), *_ = np.linalg.lstsq(np.stack([x, np.ones_like(x)], 1), y, rcond=None)
    fits[label] = Fit(fixed_us=float(fixed), tbps=float(1e-6 / slope) if slope > 0 else np.inf,
                      batches=tuple(sorted({r["B"] for r in rows})),
                      worst_us=float(np.abs(y - (slope * x + fixed)).max()))
  return fits


def fit_table(result: dict, min_batch: int = 64) -> str:
  """`fixed_cost_fits` as a table, with the fixed cost's share of the smallest batch's time;
  "" when no path has two batch sizes."""
  fits = fixed_cost_fits(result, min_batch)
  if not fits:
    return ""
  by = {(path_label(r), r["B"]): r["median_us"] for r in result["rows"]}
  lines = ["| path | B | fixed us | rate TB/s | fixed share at the smallest B "
           "| worst row off by us |", "|---|---|---:|---:|---:|---:|"]
  for label, f in fits.items():
    share = f.fixed_us / by[(label, f.batches[0])]
    lines.append(f"| {label} | {', '.join(map(str, f.batches))} | {f.fixed_us:.1f} "
                 f"| {f.tbps:.2f} | {100 * share:.0f}% | {f.worst_us:.1f} |")
  return "\n".join(lines)


def arm_labels(names: list[str]) -> list[str]:
  """Short labels of A/B result files: their stems less the stem all share up to a "_"
  (``ab_x_r1_1.json``, ``ab_x_r2_1.json`` -> ``r1_1``, ``r2_1``)."""
  stems = [os.path.splitext(os.path.basename(n))[0] for n in names]
  if len(set(stems)) < len(stems):
    return [os.path.splitext(n)[0] for n in names]  # same stems, other folders: the paths
  common = os.path.commonprefix(stems)
  cut = common.rfind("_") + 1 if len(stems) > 1 else 0
  return [stem[cut:] for stem in stems]


def ab_table(arms: dict[str, dict]) -> str:
  """One row per (B, path) of any arm, one column per arm: median us / span us ("-" where the
  arm lacks the row or its span), then the arm with the shortest median (the span where
  every arm has one; a call's span counts the GPU's idle gaps, the median does not)."""
  cells: dict[tuple, dict[str, dict]] = {}
  for name, result in arms.items():
    for row in result["rows"]:
      cells.setdefault((row["B"], path_label(row)), {})[name] = row
  lines = ["| B | path | " + " | ".join(f"{name} us" for name in arms) + " | fastest |",
           "|---:|---|" + "---:|" * len(arms) + "---|"]
  for (B, label), rows in sorted(cells.items(), key=lambda kv: kv[0][0]):
    def cell(name):
      row = rows.get(name)
      if row is None:
        return "-"
      span = row.get("span_us")
      return f"{row['median_us']:.1f} / {'-' if span is None else f'{span:.1f}'}"

    by_span = all(rows[n].get("span_us") is not None for n in rows)
    best = min(rows, key=lambda n: rows[n]["span_us" if by_span else "median_us"])
    lines.append(f"| {B} | {label} | " + " | ".join(cell(n) for n in arms)
                 + f" | {best}{' (span)' if by_span else ''} |")
  return "\n".join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("results", nargs="+", help="a results file, or with --ab the arms' files")
  p.add_argument("--ab", action="store_true",
                 help="the files are arms of one A/B run: one table, a column an arm")
  args = p.parse_args(argv)
  if args.ab:
    arms = {}
    for label, name in zip(arm_labels(args.results), args.results):
      with open(name) as f:
        arms[label] = json.load(f)
    for label, result in arms.items():
      knobs = ", ".join([f"{k.removeprefix('replayssm_jax.')}={v}"
                         for k, v in result.get("set", {}).items()]
                        + [f"{k}={result[k]}" for k in ("checkpoint_copy", "fold_together")
                           if result.get(k) is not None]) or "defaults"
      print(f"- {label}: {result['device']}, copy {result['copy_tbps']:.2f} TB/s, L2 flushed "
            f"by a {result.get('l2_flush', 'write')} pass; {knobs}")
    print("\nmedian (the call's kernels summed) / span (first kernel's start to last one's "
          "end), us:\n")
    print(ab_table(arms))
    return 0
  if len(args.results) > 1:
    p.error("one results file, or --ab with the arms' files")
  with open(args.results[0]) as f:
    result = json.load(f)
  print(f"{result['device']}, jax {result['jax']}, {result['date']}; copy ceiling "
        f"{result['copy_tbps']:.2f} TB/s; timing: {result['copy_method']}, L2 flushed by a "
        f"{result.get('l2_flush', 'write')} pass\n")  # files before run 36: the write
  print(summary_table(result) + "\n")
  sizes = size_table(result)
  if sizes:
    print("The replay verify against one launch copying its bytes (the copy probe at its size):")
    print(sizes + "\n")
  print(kernel_table(result))
  fits = fit_table(result)
  if fits:
    print("\nEach path's time as fixed + bytes / rate over its batch sizes from 64 on "
          "(least squares):")
    print(fits)
  return 0


if __name__ == "__main__":
  sys.exit(main())
