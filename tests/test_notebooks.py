"""The notebooks in `notebooks/` run headless, and the committed copies hold their outputs.

Each notebook is executed top to bottom with nbclient in a fresh ``python3`` kernel (jupyter_client
starts it with this interpreter) from the notebooks folder; the executed copy is written to a
temporary folder, never over the committed file. A committed notebook must have been executed in
one run (execution counts 1, 2, ...), without errors, with at least one PNG plot, and stay below
1 MB, so a stale or unexecuted notebook fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REASON = "the notebook tests need nbclient, nbformat, ipykernel and matplotlib (pip install -e '.[test]')"
nbformat = pytest.importorskip("nbformat", reason=REASON)
nbclient = pytest.importorskip("nbclient", reason=REASON)
pytest.importorskip("ipykernel", reason=REASON)
pytest.importorskip("matplotlib", reason=REASON)

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
EXPECTED = {"01_quickstart.ipynb", "02_memory_and_bandwidth.ipynb", "03_long_generation_drift.ipynb"}
CELL_TIMEOUT_S = 300
MAX_BYTES = 1 << 20


def _code_cells(nb) -> list:
  return [cell for cell in nb.cells if cell.cell_type == "code"]


def _count_png(nb) -> int:
  return sum("image/png" in out.get("data", {}) for cell in _code_cells(nb) for out in cell.outputs)


def _errors(nb) -> list[str]:
  return [f"{out.ename}: {out.evalue}" for cell in _code_cells(nb) for out in cell.outputs
          if out.output_type == "error"]


def test_all_notebooks_present():
  assert EXPECTED <= {path.name for path in NOTEBOOKS}, sorted(p.name for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebook_is_executed(path: Path):
  """The file in the repository was run top to bottom, cleanly, with its plots saved."""
  assert path.stat().st_size < MAX_BYTES, f"{path.name} is {path.stat().st_size} bytes; keep it < 1 MB"
  nb = nbformat.read(path, as_version=4)
  counts = [cell.execution_count for cell in _code_cells(nb)]
  assert counts == list(range(1, len(counts) + 1)), (
      f"{path.name} is not executed in one run (execution counts {counts}); re-execute it and save")
  assert not _errors(nb), _errors(nb)
  assert _count_png(nb) >= 1, f"{path.name} holds no image/png output"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path: Path, tmp_path: Path):
  """Run the notebook in a fresh kernel: no cell raises and at least one PNG plot comes out."""
  nb = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                   resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
  client.execute()  # raises CellExecutionError, naming the cell, on the first error
  nbformat.write(nb, tmp_path / path.name)
  assert not _errors(nb), _errors(nb)
  assert _count_png(nb) >= 1, f"{path.name} produced no image/png output"
