"""``tools/ncu_sass.py``: the summary of an exported SASS page, on a small made-up export."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import ncu_sass  # noqa: E402

HEADER = ["Address", "Source", ncu_sass.SAMPLES, "Warp Stall Sampling (Not-issued Samples)",
          ncu_sass.EXECUTED, "stall_long_sb", "stall_wait", "stall_long_sb (Not Issued)"]


def _export(path: Path, kernels: dict[str, list[tuple[str, int, int, int, int]]]) -> None:
  """Rows as ncu writes them: a 'Kernel Name' row, the header, one row per instruction
  (SASS, samples, executed, long_sb samples, wait samples); numbers with thousands commas."""
  with open(path, "w", newline="") as f:
    w = csv.writer(f, quoting=csv.QUOTE_ALL)
    for name, rows in kernels.items():
      w.writerow(["Kernel Name", name, ""])
      w.writerow(HEADER)
      for i, (sass, samples, executed, long_sb, wait) in enumerate(rows):
        w.writerow([hex(i * 16), f"      {sass}", samples, 0, f"{executed:,}", long_sb, wait,
                    99])


def test_summary_counts_opcodes_stalls_and_hot_spots(tmp_path, capsys):
  path = tmp_path / "sass.csv"
  _export(path, {
      "fold": [("LDG.E.128 R4, desc[UR4][R2.64]", 1, 4096, 1, 0),
               ("@!P0 FADD R1, R2, R3", 30, 4096, 20, 10),
               ("FADD R5, R1, R4", 5, 4096, 0, 5),
               ("SHFL.BFLY PT, R6, R5, 0x1, 0x1f", 4, 4096, 0, 4)],
      "stream": [("HMMA.1688.F32.TF32 R8, R12, R16, R8", 7, 1000, 7, 0)]})
  assert ncu_sass.main([str(path), "--programs", "4096", "--top", "2", "--bins", "2"]) == 0
  out = capsys.readouterr().out
  fold, stream = out.split("== stream")
  assert fold.startswith("== fold: 4 instructions in the SASS, 16,384 warp instructions "
                         "executed (4 a program)")
  assert "opcode mix: FADD 50.0%, LDG 25.0%, SHFL 25.0%" in fold  # the predicate is no opcode
  assert "stall samples by reason (40): long_sb 52.5%, wait 47.5%" in fold  # not the Not Issued
  assert "stall samples by opcode: FADD 87.5%, SHFL 10.0%, LDG 2.5%" in fold
  hot = fold.split("hottest instructions")[1].splitlines()[1:3]
  assert [line.split()[0] for line in hot] == ["1", "2"]  # by samples, at most --top
  assert "    0:     31  " in fold and "    2:      9  " in fold  # stretches of --bins
  assert "1 instructions in the SASS, 1,000 warp instructions" in stream
  assert "opcode mix: HMMA 100.0%" in stream


def test_an_export_without_kernels_is_refused(tmp_path, capsys):
  path = tmp_path / "empty.csv"
  path.write_text('"==PROF== nothing here"\n')
  assert ncu_sass.main([str(path)]) == 1
  assert "no 'Kernel Name' row" in capsys.readouterr().err
