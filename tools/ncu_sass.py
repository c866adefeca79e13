"""A summary of Nsight Compute's SASS page: where a kernel's instructions and stalls go.

Export the per-instruction page of a report (`replayssm_jax.bench.profile` is the usual
target; its docstring has the ``ncu`` command), then summarise it::

    ncu --import prof.ncu-rep --page source --csv --print-source sass > sass.csv
    python tools/ncu_sass.py sass.csv [--programs 4096] [--top 8] [--bins 100]

For each kernel in the file: warp instructions executed (per program with ``--programs``), the
opcode mix, the stall samples by reason and by opcode, the hottest instructions, and the
samples over stretches of ``--bins`` instructions (Pallas' Triton lowering emits no line
info, so the stretches are how a straight-line kernel's phases are found). Benchmarks'
``ncu/*.txt`` files quote its output.
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
import sys
from collections.abc import Iterator
from typing import NamedTuple

EXECUTED = "Instructions Executed"
SAMPLES = "Warp Stall Sampling (All Samples)"


class Instruction(NamedTuple):
  index: int
  text: str  # the SASS line, predicate included
  opcode: str  # without predicate and modifiers: "FADD", "SHFL", ...
  executed: float  # warp instructions executed
  samples: float  # warp-stall samples at this instruction
  stalls: dict[str, float]  # samples by reason ("long_sb", "wait", ...)


def opcode(text: str) -> str:
  """``"@!P0 IMAD.IADD.U32 R1, ..."`` -> ``"IMAD"``."""
  words = text.split()
  if words and words[0].startswith("@"):
    words = words[1:]
  return re.split(r"[.\s]", words[0])[0] if words else ""


def _number(value: str) -> float:
  try:
    return float(value.replace(",", ""))
  except ValueError:
    return 0.0


def read(path: str) -> Iterator[tuple[str, list[Instruction]]]:
  """``(kernel name, instructions)`` for each kernel of an exported SASS page."""
  with open(path, newline="") as f:
    rows = [r for r in csv.reader(f) if r]
  i = 0
  while i < len(rows):
    if rows[i][0] != "Kernel Name":
      i += 1
      continue
    name, header = rows[i][1], rows[i + 1]
    col = {h: j for j, h in enumerate(header)}
    stall_cols = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    i += 2
    instructions = []
    while i < len(rows) and rows[i][0] != "Kernel Name":
      r = rows[i]
      text = r[col["Source"]].strip()
      instructions.append(Instruction(
          len(instructions), text, opcode(text), _number(r[col[EXECUTED]]),
          _number(r[col[SAMPLES]]), {h[len("stall_"):]: _number(r[col[h]]) for h in stall_cols}))
      i += 1
    yield name, instructions


def _shares(counter: collections.Counter, total: float, n: int) -> str:
  return ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in counter.most_common(n) if v)


def summary(name: str, ins: list[Instruction], *, programs: int | None = None, top: int = 8,
            bins: int = 100) -> str:
  """The text `main` prints for one kernel."""
  executed = sum(x.executed for x in ins) or 1.0
  samples = sum(x.samples for x in ins) or 1.0
  by_op, samples_by_op, stalls = (collections.Counter() for _ in range(3))
  for x in ins:
    by_op[x.opcode] += x.executed
    samples_by_op[x.opcode] += x.samples
    stalls.update(x.stalls)
  lines = [f"== {name}: {len(ins)} instructions in the SASS, {executed:,.0f} warp instructions "
           f"executed" + (f" ({executed / programs:,.0f} a program)" if programs else ""),
           f"opcode mix: {_shares(by_op, executed, 16)}",
           f"stall samples by reason ({samples:,.0f}): {_shares(stalls, samples, 8)}",
           f"stall samples by opcode: {_shares(samples_by_op, samples, 10)}",
           "hottest instructions (index, samples, executed, SASS):"]
  for x in sorted(ins, key=lambda x: -x.samples)[:top]:
    lines.append(f"  {x.index:5d} {x.samples:6.0f} {x.executed:9.0f}  {x.text}")
  lines.append(f"samples over stretches of {bins} instructions (start: samples, top opcodes):")
  for start in range(0, len(ins), bins):
    part = ins[start:start + bins]
    ops = collections.Counter(x.opcode for x in part)
    lines.append(f"  {start:5d}: {sum(x.samples for x in part):6.0f}  "
                 + " ".join(f"{k} {v}" for k, v in ops.most_common(4)))
  return "\n".join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("csv", help="ncu --page source --csv --print-source sass output")
  p.add_argument("--programs", type=int, help="programs of the launch, for a per-program count")
  p.add_argument("--top", type=int, default=8, help="hottest instructions to list")
  p.add_argument("--bins", type=int, default=100, help="instructions per stretch")
  args = p.parse_args(argv)
  kernels = list(read(args.csv))
  if not kernels:
    print(f"{args.csv}: no 'Kernel Name' row; export with --page source --csv --print-source sass",
          file=sys.stderr)
    return 1
  for name, ins in kernels:
    print(summary(name, ins, programs=args.programs, top=args.top, bins=args.bins))
  return 0


if __name__ == "__main__":
  sys.exit(main())
