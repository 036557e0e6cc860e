"""Every notebook in notebooks/ runs from top to bottom in a fresh kernel without an error.

The kernel imports ddbloader from this checkout (the repository root leads PYTHONPATH) and runs
with notebooks/ as its working directory, as a user's would. A cell may raise only when tagged
``raises-exception``; such a cell must show ddbloader's compact error rendering. Set
DDBLOADER_SKIP_NOTEBOOKS=1 to skip these tests.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
for _module in ("ipykernel", "matplotlib", "vega_datasets"):
    pytest.importorskip(_module, reason="install the notebooks extra: pip install -e '.[notebooks]'")

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
#: What each notebook needs besides the package, relative to the repository root.
NEEDS = {"03_throughput.ipynb": REPO / "benchmarks" / "throughput.py"}
ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: Per notebook, edits of its code that shorten the run, not what runs: the throughput figures are
#: not under test (benchmarks/ measures them), so one round of each contender's child interpreter,
#: and one warm epoch after the cold one, instead of three of each.
SHORTER = {"03_throughput.ipynb": {"rounds=3)": "rounds=1)", '"epochs": 3}': '"epochs": 2}'}}

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        bool(os.environ.get("DDBLOADER_SKIP_NOTEBOOKS")), reason="DDBLOADER_SKIP_NOTEBOOKS set"
    ),
]


def test_the_three_notebooks_exist() -> None:
    assert [p.name for p in NOTEBOOKS] == [
        "01_quickstart.ipynb",
        "02_from_dolphindb.ipynb",
        "03_throughput.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path) -> None:
    needed = NEEDS.get(path.name)
    if needed is not None and not needed.exists():
        pytest.skip(f"{needed.relative_to(REPO)} is not in this checkout")
    notebook = nbformat.read(path, as_version=4)
    for before, after in SHORTER.get(path.name, {}).items():
        cells = [c for c in notebook.cells if c.cell_type == "code" and before in c.source]
        assert len(cells) == 1, f"{path.name}: {before!r} is in {len(cells)} code cells, not one"
        cells[0].source = cells[0].source.replace(before, after)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    client = nbclient.NotebookClient(
        notebook,
        timeout=240,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute(env=env)  # raises CellExecutionError on an error in an untagged cell
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        if "raises-exception" in cell.metadata.get("tags", []):
            assert errors, f"the cell tagged raises-exception did not raise:\n{cell.source}"
            shown = ANSI.sub("", "\n".join(errors[0].traceback)).splitlines()
            # ddbloader's rendering: the culprit on top, the cause, no wall of frames
            assert shown[0].endswith(" in ddbloader:"), shown
            assert any(line.startswith("↳ ") and "subquery" in line for line in shown[1:3]), shown
            assert any(line.startswith("cause: ") for line in shown), shown
            assert len(shown) < 15, shown
        else:
            assert not errors
