"""The example notebook runs as Jupyter runs it: every code cell in order, the value of a cell's
last expression displayed. The savepoint, the lookup and state_meta must display as HTML tables,
and the key-group plot must be saved as a PNG."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from statequery.display import table_html

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _display(value: Any) -> str | None:
    """The text/html Jupyter would show for a cell's value (pyarrow tables as
    ``enable_table_html()`` registers them)."""
    if value is None:
        return None
    if isinstance(value, pa.Table):
        return table_html(value)
    repr_html = getattr(value, "_repr_html_", None)
    return repr_html() if callable(repr_html) else None


def run_notebook(path: Path) -> tuple[dict[str, Any], list[str | None]]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    scope: dict[str, Any] = {"__name__": "__main__"}
    shown: list[str | None] = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        tree = ast.parse("".join(cell["source"]))
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<cell>", "exec"), scope)  # noqa: S102 - our own notebook
        value = None
        if last is not None:
            expr = ast.Expression(last.value)
            value = eval(compile(expr, "<cell>", "eval"), scope)  # noqa: S307
        shown.append(_display(value))
    return scope, shown


def test_notebook_shows_html_views_and_saves_a_plot(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(EXAMPLES)
    monkeypatch.setenv("STATEQUERY_PLOT_DIR", str(tmp_path))
    scope, shown = run_notebook(EXAMPLES / "notebook.ipynb")
    html = [h for h in shown if h]
    # the savepoint: operators and states with kinds, types and sizes
    sp_html = shown[0]
    assert sp_html is not None and "operators" in sp_html and "user_state__profile" in sp_html
    assert "<td>value</td>" in sp_html and "<td>operator_union</td>" in sp_html
    assert "POJO&lt;statequery.fixtures.UserProfile&gt;" in sp_html and " KiB</td>" in sp_html
    # the lookup: one small table per state
    lookup = next(h for h in html if "key <code>user-3</code>" in h)
    assert "user-state / count" in lookup and "window-agg / window-contents" in lookup
    # state_meta as a table
    assert any("table_name" in h and "size_bytes" in h for h in html)
    # the plot
    png = tmp_path / "key_groups.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert scope["skew"].num_rows > 5
    assert scope["changes"].num_rows == 8
    assert scope["chk2"].source_splits("sequence-source").column("from").to_pylist() == [200]
