"""``tools/trace_fingerprint.py``: it sees a traced change and only that."""

from __future__ import annotations

import sys
from pathlib import Path

from replayssm_jax.kernels import fold

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import trace_fingerprint  # noqa: E402


def test_a_launch_knob_changes_its_kernel_trace_only(tmp_path, monkeypatch):
  """Saved, then compared: the same traces; with the fold kernel's loads moved, the fold's
  trace differs and the recurrent kernels' do not (the compare names it and exits 1)."""
  names = ["recurrent_verify", "recurrent_decode", "fold"]
  assert trace_fingerprint.main(["--only", *names, "--save", str(tmp_path)]) == 0
  assert trace_fingerprint.main(["--only", *names, "--compare", str(tmp_path)]) == 0
  other = next(x for x in fold.PREFETCH_ATS if x != fold.FOLD_PREFETCH_AT)
  monkeypatch.setattr(fold, "FOLD_PREFETCH_AT", other)
  before = {n: (tmp_path / f"{n}.txt").read_text() for n in names}
  after = trace_fingerprint.traces(names)
  assert [n for n in names if after[n] != before[n]] == ["fold"]
  assert trace_fingerprint.main(["--only", *names, "--compare", str(tmp_path)]) == 1


def test_every_path_traces():
  texts = trace_fingerprint.traces()
  assert set(texts) == set(trace_fingerprint.paths())
  assert all("pallas_call" in t for n, t in texts.items() if "xla" not in n)
