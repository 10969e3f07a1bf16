"""``statequery export``: several states of one operator to files, read in one pass
(:meth:`statequery.savepoint.Savepoint.read_operator`).

One file per state, ``DIR/<table_name>.<format>`` (Parquet, Arrow IPC or CSV as ``read --out``
writes it), streamed batch by batch: memory stays bounded by one batch per state whatever the
state's size. Every file is written to a temporary name in ``DIR`` and renamed into place only
when the whole read succeeded: a failed export leaves no partial file behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from statequery.arrow.schemas import state_schema
from statequery.exceptions import OutputError

if TYPE_CHECKING:
    from statequery.savepoint import Savepoint

__all__ = ["FORMATS", "export_operator"]

FORMATS = ("parquet", "arrow", "csv")


class _Writer:
    """One state's output file, written under a temporary name."""

    def __init__(self, directory: str, name: str, fmt: str, schema: pa.Schema) -> None:
        self.path = os.path.join(directory, f"{name}.{fmt}")
        if os.path.isdir(self.path):
            raise OutputError(f"--out: {self.path} is a directory")
        try:
            fd, self.tmp = tempfile.mkstemp(prefix=".statequery-", suffix=".tmp", dir=directory)
        except OSError as e:
            raise OutputError(f"--out {directory}: cannot write in it: {e.strerror or e}") from e
        os.close(fd)
        self.fmt = fmt
        self.rows = 0
        if fmt == "parquet":
            import pyarrow.parquet as pq

            self._w: Any = pq.ParquetWriter(self.tmp, schema)
        elif fmt == "arrow":
            self._w = pa.ipc.new_file(self.tmp, schema)
        else:
            import pyarrow.csv as pacsv

            from statequery.cli.output import _csv_ready

            self._w = pacsv.CSVWriter(self.tmp, _csv_ready(schema.empty_table()).schema)

    def write(self, batch: pa.RecordBatch) -> None:
        if self.fmt == "csv":
            from statequery.cli.output import _csv_ready

            self._w.write_table(_csv_ready(pa.Table.from_batches([batch])))
        else:
            self._w.write_batch(batch)
        self.rows += batch.num_rows

    def close(self) -> None:
        self._w.close()

    def publish(self) -> None:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.tmp, 0o666 & ~umask)  # mkstemp made it private; the result is not
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._w.close()
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)


def export_operator(
    sp: Savepoint,
    operator: Any,
    directory: str,
    fmt: str = "parquet",
    states: Iterable[str] | None = None,
    key: Any = None,
    mode: str | None = None,
    workers: int | None = None,
) -> list[tuple[str, int]]:
    """Write ``operator``'s ``states`` (default: every readable one; with ``key``, every keyed
    one) to ``directory``; returns ``(path, rows)`` per state, in the operator's state order.
    ``workers``: as :meth:`~statequery.savepoint.Savepoint.read_operator` takes it."""
    if fmt not in FORMATS:
        raise OutputError(f"--format {fmt}: use one of {', '.join(FORMATS)}")
    keyed_only = key is not None
    infos = sp.operator_states(operator, states, keyed_only=keyed_only)
    # plan first: a bad option or state fails before anything is written
    pairs = sp.read_operator(operator, [s.name for s in infos], key=key, mode=mode,
                             workers=workers)
    parent = os.path.dirname(os.path.abspath(directory))
    if not os.path.isdir(parent):
        raise OutputError(f"--out {directory}: the directory {parent} does not exist")
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise OutputError(f"--out {directory}: is a file; export writes one file per state "
                          "into a directory")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise OutputError(f"--out {directory}: cannot create it: {e.strerror or e}") from e
    if not os.path.isdir(directory):
        raise OutputError(f"--out {directory}: is not a directory")
    writers: dict[str, _Writer] = {}
    try:
        for s in infos:
            writers[s.name] = _Writer(
                directory, s.table_name or s.name, fmt, state_schema(s, mode)
            )
        for name, batch in pairs:
            writers[name].write(batch)
        for w in writers.values():
            w.close()
    except BaseException as e:
        for w in writers.values():
            w.abort()
        if isinstance(e, (OSError, pa.ArrowException)):
            raise OutputError(f"--out {directory}: cannot write it: {e}") from e
        raise
    for w in writers.values():  # every file complete: now they take their names
        w.publish()
    return [(writers[s.name].path, writers[s.name].rows) for s in infos]
