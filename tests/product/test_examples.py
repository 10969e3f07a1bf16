"""The examples keep working: the quickstart script and every code cell of the notebook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_quickstart_prints_the_key() -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py")],
        capture_output=True, text=True, timeout=120, check=True,
    )
    out = proc.stdout
    assert "6 operators, 15 states" in out
    assert "user-state / count" in out
    assert "'key': 'user-3', 'namespace': None, 'value': 10}" in out


def test_notebook_cells_run(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    nb = json.loads((EXAMPLES / "notebook.ipynb").read_text(encoding="utf-8"))
    monkeypatch.chdir(EXAMPLES)
    monkeypatch.setenv("STATEQUERY_PLOT_DIR", str(tmp_path))  # the notebook saves a PNG there
    scope: dict[str, object] = {}
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            exec("".join(cell["source"]), scope)  # noqa: S102 - our own notebook
    assert scope["profiles"].num_rows == 20  # type: ignore[attr-defined]
    assert os.path.isdir("../catalog")
