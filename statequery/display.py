"""HTML views for notebooks: a savepoint, a lookup result, ``state_meta`` and any Arrow table.

``Savepoint._repr_html_`` and :class:`LookupResult` use these, so Jupyter shows a savepoint and a
lookup as tables. ``state_meta()`` and reads return plain ``pyarrow.Table`` objects: call
:func:`enable_table_html` (or ``statequery.display.table_html(t)``) to render those as HTML too.
"""

from __future__ import annotations

import html
import json
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from statequery.metadata.model import SavepointModel

__all__ = ["LookupResult", "enable_table_html", "savepoint_html", "table_html"]

MAX_ROWS = 50
MAX_CELL = 120

_STYLE = (
    "<style>.sq-t{border-collapse:collapse;font-size:12px;margin:4px 0}"
    ".sq-t th,.sq-t td{border:1px solid #ccc;padding:2px 6px;text-align:left;"
    "vertical-align:top}.sq-t th{background:#f3f3f3}.sq-cap{font-weight:bold;margin-top:8px}"
    ".sq-no{color:#a33}</style>"
)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        text = value[:48].hex() + ("…" if len(value) > 48 else "")
    elif isinstance(value, (dict, list, tuple)):
        text = json.dumps(value, default=str, ensure_ascii=False)
    else:
        text = str(value)
    if len(text) > MAX_CELL:
        text = text[: MAX_CELL - 1] + "…"
    return html.escape(text)


def _size(n: int | None) -> str:
    if n is None:
        return ""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(n)  # pragma: no cover


def _rows_html(columns: list[str], rows: list[list[str]], caption: str | None = None) -> str:
    out = [_STYLE]
    if caption:
        out.append(f'<div class="sq-cap">{html.escape(caption)}</div>')
    out.append('<table class="sq-t"><thead><tr>')
    out.extend(f"<th>{html.escape(c)}</th>" for c in columns)
    out.append("</tr></thead><tbody>")
    for r in rows:
        out.append("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def table_html(table: pa.Table, caption: str | None = None, max_rows: int = MAX_ROWS) -> str:
    """An Arrow table as an HTML table (the first ``max_rows`` rows, with the row count)."""
    shown = table.slice(0, max_rows)
    rows = [[_cell(r[c]) for c in shown.column_names] for r in shown.to_pylist()]
    text = _rows_html(shown.column_names, rows, caption)
    note = f"{table.num_rows} rows" if table.num_rows <= max_rows else (
        f"{max_rows} of {table.num_rows} rows"
    )
    return text + f"<div><small>{note}</small></div>"


def savepoint_html(sp: SavepointModel) -> str:
    """A savepoint at a glance: what it is, its operators, and its states with kinds, types and
    sizes."""
    meta = sp.meta
    head = (
        f"<div><b>{html.escape(sp.location)}</b><br>{html.escape(meta.snapshot_type)} "
        f"{meta.checkpoint_id}, format {html.escape(meta.format or '?')}, backend "
        f"{html.escape(meta.backend or 'any (canonical)')}, _metadata v{meta.metadata_version}"
        "</div>"
    )
    ops = [
        [
            _cell(op.uid or "-"), _cell(op.name or "-"), _cell(op.operator_id),
            str(op.parallelism), str(op.max_parallelism), str(len(op.states)),
            "fully finished" if op.fully_finished else "",
        ]
        for op in meta.operators
    ]
    from statequery.metadata.statemeta import type_string

    states = []
    for op in meta.operators:
        for s in op.states:
            states.append(
                [
                    f"<code>{_cell(s.table_name)}</code>",
                    _cell(s.kind),
                    _cell(type_string(s.key_spec)),
                    _cell(type_string(s.namespace_spec)),
                    _cell(type_string(s.user_key_spec)),
                    _cell(type_string(s.value_spec)) + (" (TTL)" if s.ttl else ""),
                    _size(s.size_bytes),
                    "yes" if s.decodable else f'<span class="sq-no">no: {_cell(s.reason)}</span>',
                ]
            )
    return (
        head
        + _rows_html(["uid", "name", "operator id", "par", "max par", "states", ""], ops,
                     "operators")
        + _rows_html(
            ["table", "kind", "key", "namespace", "user key", "value", "size", "decodable"],
            states,
            "states",
        )
    )


class LookupResult(dict[tuple[str, str], pa.Table]):
    """What :meth:`Savepoint.lookup` returns: ``{(operator, state): Table}``, shown in a notebook
    as one small table per state."""

    key: Any = None

    def _repr_html_(self) -> str:
        if not self:
            return f"<div>no state holds key <code>{_cell(self.key)}</code></div>"
        parts = []
        for (operator, state), table in self.items():
            cols = [c for c in table.column_names if c not in ("key_group", "key")]
            parts.append(table_html(table.select(cols), f"{operator} / {state}", max_rows=20))
        title = f"<div>key <code>{_cell(self.key)}</code></div>" if self.key is not None else ""
        return title + "".join(parts)


def enable_table_html() -> bool:
    """Render every ``pyarrow.Table`` as :func:`table_html` in this IPython session (``state_meta``,
    reads, diffs). Returns False outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    if ip is None:
        return False
    ip.display_formatter.formatters["text/html"].for_type(pa.Table, table_html)
    return True
