"""What the commands print and write: rich tables, JSON values, CSV-ready tables, files written
atomically (``--out``), and the ``--storage-option`` flags. Every command module uses these."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import TYPE_CHECKING, Any

from statequery.exceptions import InvalidOptionError, OutputError

if TYPE_CHECKING:
    import pyarrow as pa
    from rich.console import Console

__all__ = [
    "_classpath",
    "_user_types",
    "_console",
    "_csv_ready",
    "_json_default",
    "_print_rows",
    "_storage_options",
    "_write_out",
    "python_rows",
]


def _classpath(args: argparse.Namespace) -> list[str] | None:
    """``--classpath JAR`` flags (repeatable, each maybe comma separated) as the ``classpath``
    option of ``Savepoint.open`` (None: none given); :func:`_user_types` adds the Protobuf
    flags."""
    entries = [p.strip() for c in getattr(args, "classpath", None) or [] for p in c.split(",")]
    return [p for p in entries if p] or None


def _user_types(args: argparse.Namespace) -> dict[str, Any]:
    """``--classpath``, ``--protobuf-descriptors FILE`` and ``--protobuf-message CLASS=NAME``
    as the keyword arguments ``classpath``, ``protobuf_descriptors`` and ``protobuf_messages``
    of ``statequery.open`` (and of ``open_job``, ``sql``)."""
    return {"classpath": _classpath(args),
            "protobuf_descriptors": getattr(args, "protobuf_descriptors", None),
            "protobuf_messages": getattr(args, "protobuf_message", None) or None}


def _storage_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--storage-option KEY=VALUE`` flags as fsspec storage options (None: the default)."""
    pairs = getattr(args, "storage_option", None) or []
    if not pairs:
        return None
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidOptionError(f"--storage-option {pair!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def python_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Rows of a pyarrow Table; instants outside Python's datetime range as integers."""
    from statequery.arrow.batches import python_rows as rows

    return rows(table)


def _json_default(value: Any) -> Any:
    import base64
    import datetime
    import decimal

    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    return str(value)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=_json_default, ensure_ascii=False)
    return str(value) if not isinstance(value, bytes) else _json_default(value)


def _print_rows(table: pa.Table, title: str | None, total: int | None = None) -> None:
    from rich.table import Table

    console = _console()
    view = Table(title=title)
    names = table.column_names
    for name in names:
        view.add_column(name, overflow="fold")
    if len(set(names)) < len(names):  # Spark's results may repeat a name: cells by position
        table = table.rename_columns([str(i) for i in range(len(names))])
    for row in python_rows(table):
        view.add_row(*(_cell(v) for v in row.values()))
    console.print(view)
    if total is not None and total > table.num_rows:
        console.print(f"{table.num_rows} of {total} rows shown (--limit, --out or --json for more)")


def _csv_ready(table: pa.Table) -> pa.Table:
    """``table`` with only columns a CSV file can hold.

    Struct columns are flattened into ``parent.child`` columns (recursively); list, map and other
    nested columns become JSON text; binary columns become base64 text (as in ``--json``).
    """
    import base64

    import pyarrow as pa
    import pyarrow.types as pt

    while any(pt.is_struct(f.type) for f in table.schema):
        table = table.flatten()
    columns, names = [], []
    for name, col in zip(table.column_names, table.columns, strict=True):
        t = col.type
        if pt.is_binary(t) or pt.is_large_binary(t) or pt.is_fixed_size_binary(t):
            col = pa.array(
                [None if v is None else base64.b64encode(v).decode("ascii")
                 for v in col.to_pylist()],
                pa.string(),
            )
        elif pt.is_nested(t) or pt.is_dictionary(t) or pt.is_duration(t) or pt.is_interval(t):
            values = [r[name] for r in python_rows(pa.table({name: col}))]
            col = pa.array(
                [None if v is None else json.dumps(v, default=_json_default, ensure_ascii=False)
                 for v in values],
                pa.string(),
            )
        columns.append(col)
        names.append(name)
    return pa.table(columns, names=names)


def _write_out(table: pa.Table, out: str) -> None:
    """Write ``table`` to ``out`` through a temporary file in the same directory, renamed into
    place when complete: a failed write never leaves an empty or partial file behind."""
    import os
    import tempfile

    import pyarrow as pa

    lower = out.lower()
    if lower.endswith(".parquet"):
        import pyarrow.parquet as pq

        def write(path: str) -> None:
            pq.write_table(table, path)
    elif lower.endswith(".csv"):
        import pyarrow.csv as pacsv

        csv_table = _csv_ready(table)

        def write(path: str) -> None:
            pacsv.write_csv(csv_table, path)
    elif lower.endswith((".arrow", ".feather", ".ipc")):
        import pyarrow.feather as feather

        def write(path: str) -> None:
            feather.write_feather(table, path)
    else:
        raise InvalidOptionError(f"--out {out}: use a .parquet, .csv or .arrow file name")
    directory = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(directory):
        raise OutputError(f"--out {out}: the directory {directory} does not exist")
    if os.path.isdir(out):
        raise OutputError(f"--out {out}: is a directory")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".statequery-", suffix=".tmp", dir=directory)
    except OSError as e:
        raise OutputError(f"--out {out}: cannot write in {directory}: {e.strerror or e}") from e
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, out)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, (OSError, pa.ArrowException)):
            raise OutputError(f"--out {out}: cannot write it: {e}") from e
        raise


def _console() -> Console:
    """A rich Console: the terminal's width (or ``$COLUMNS``); a pipe or file gets 240 columns
    instead of 80 columns of wrapped cells.

    A closed pipe (``statequery read ... | head -1``) raises :class:`BrokenPipeError`, which
    :func:`statequery.cli.main` turns into a quiet exit 0; rich's own handling would exit 1."""
    import os

    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError(32, "Broken pipe")

    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit():
        return _Console()
    return _Console(width=240)
