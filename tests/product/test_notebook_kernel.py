"""examples/notebook.ipynb executed as Jupyter executes it: headless, by nbclient, in a real
IPython kernel on this Python (ipykernel), every cell in order, its outputs checked: no error,
the savepoint and tables as HTML, the key-group plot as a PNG image (not ``<Figure ...>`` text),
the lookup's rows. One kernel for the module; the notebook reads the small catalog only."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import nbclient
import nbformat
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    """The notebook's code cells after a run (a kernel spec of this Python, in a folder of the
    test's own that ``JUPYTER_PATH`` names: no kernel installed anywhere else is used)."""
    tmp = tmp_path_factory.mktemp("notebook")
    spec = tmp / "jupyter" / "kernels" / "statequery-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "statequery tests", "language": "python",
        "env": {"STATEQUERY_PLOT_DIR": str(tmp)},
    }))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JUPYTER_PATH", str(tmp / "jupyter"))
        mp.setenv("JUPYTER_RUNTIME_DIR", str(tmp / "runtime"))
        mp.delenv("MPLBACKEND", raising=False)
        nb = nbformat.read(EXAMPLES / "notebook.ipynb", as_version=4)
        client = nbclient.NotebookClient(
            nb, kernel_name="statequery-test", timeout=600,
            resources={"metadata": {"path": str(EXAMPLES)}},
        )
        client.execute()
    assert (tmp / "key_groups.png").read_bytes().startswith(PNG_MAGIC)
    return [c for c in nb.cells if c.cell_type == "code"]


def _cell(cells: list[Any], start: str) -> Any:
    found = [c for c in cells if c.source.startswith(start)]
    assert len(found) == 1, start
    return found[0]


def test_every_cell_ran_without_an_error(executed: list[Any]) -> None:
    assert all(c.execution_count for c in executed)
    assert [o for c in executed for o in c.outputs if o.output_type == "error"] == []
    streams = [o for c in executed for o in c.outputs if o.output_type == "stream"]
    assert all(o.name == "stdout" for o in streams), [o.text for o in streams]


def test_the_plot_shows_as_a_png_image(executed: list[Any]) -> None:
    plot = _cell(executed, "import os\n\nfrom statequery.plot import plot_key_groups")
    images = [o for o in plot.outputs if "image/png" in o.get("data", {})]
    assert len(images) == 1, [o.get("data", {}).keys() for o in plot.outputs]
    assert base64.b64decode(images[0]["data"]["image/png"]).startswith(PNG_MAGIC)


def test_the_savepoint_and_tables_show_as_html(executed: list[Any]) -> None:
    first = _cell(executed, "import statequery\n")
    html = first.outputs[-1]["data"]["text/html"]
    assert "user_state__profile" in html and "<td>operator_union</td>" in html
    meta = _cell(executed, "from statequery.display import enable_table_html")
    assert "<td>user_state__profile</td>" in meta.outputs[-1]["data"]["text/html"]
    splits = _cell(executed, 'chk2.source_splits("sequence-source")')
    assert "number_sequence" in splits.outputs[-1]["data"]["text/html"]


def test_the_lookup_prints_the_keys_rows(executed: list[Any]) -> None:
    lookup = _cell(executed, 'for (operator, state), table in sp.lookup("user-3")')
    text = "".join(o.text for o in lookup.outputs if o.output_type == "stream")
    assert "user-state count [{'key_group': 40, 'key': 'user-3', 'namespace': None, " \
        "'value': 10}]" in text
