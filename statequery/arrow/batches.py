"""Column-wise row buffers: decoders append Python values to per-column lists; a flush turns them
into one :class:`pyarrow.RecordBatch` (one ``pa.array`` call per column)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from statequery.arrow.schemas import opaque_reason
from statequery.exceptions import CorruptStateError
from statequery.metadata.state import StateInfo

__all__ = ["INSTANT_MS_RANGE", "BatchBuilder", "python_rows", "split_batch"]

#: epoch milliseconds of 0001-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z: the instants Python's
#: datetime, Spark's TIMESTAMP and DuckDB's TIMESTAMPTZ all hold
INSTANT_MS_RANGE = (-62_135_596_800_000, 253_402_300_799_999)

#: columns filled at flush from another: timers' ``timestamp`` from their raw ``timestamp_ms``
_DERIVED = {"timestamp": "timestamp_ms"}


class BatchBuilder:
    """Per-column Python lists for ``schema``; ``<col>_reason`` columns are filled at flush.

    Decoders take ``appender(name)`` (the list's bound ``append``) once and call it per value.
    """

    __slots__ = ("_constants", "_derived", "_lists", "_order", "_sink", "schema")

    def __init__(self, schema: pa.Schema, layout: StateInfo | None = None) -> None:
        self.schema = schema
        self._constants: dict[str, str] = {}
        if layout is not None:
            for name, spec in (
                ("key", layout.key),
                ("namespace", layout.namespace),
                ("user_key", layout.user_key),
                ("value", layout.value),
            ):
                if f"{name}_reason" in schema.names and spec is not None:
                    self._constants[f"{name}_reason"] = opaque_reason(spec)
        # timers: decoders append Flink's long to "timestamp"; it is stored as "timestamp_ms"
        self._derived = {
            d: src for d, src in _DERIVED.items() if d in schema.names and src in schema.names
        }
        self._lists: dict[str, list[Any]] = {
            f.name: [] for f in schema if f.name not in self._constants
            and f.name not in self._derived
        }
        self._order = [f.name for f in schema]
        self._sink: Any = None

    def attach(self, sink: Any) -> Any:
        """Let a compiled entry sink (:mod:`statequery.backends.fastpath`) fill the columns it
        decodes: ``len(sink)`` rows, ``sink.arrays(schema)`` at flush. Returns the sink to use:
        the one already attached when several decoders (one per subtask) share this builder."""
        if self._sink is None:
            self._sink = sink
        return self._sink

    def appender(self, name: str) -> Callable[[Any], None]:
        return self._lists[self._derived.get(name, name)].append

    def column(self, name: str) -> list[Any]:
        return self._lists[self._derived.get(name, name)]

    def __len__(self) -> int:
        if self._sink is not None:
            return len(self._sink)
        for values in self._lists.values():
            return len(values)
        return 0

    def flush(self) -> pa.RecordBatch | None:
        """The buffered rows as a RecordBatch (None when empty); the buffers are cleared."""
        n = len(self)
        if n == 0:
            return None
        arrays = []
        built: dict[str, Any] = {}
        if self._sink is not None:
            try:
                built = self._sink.arrays(self.schema)
            except (pa.ArrowException, OverflowError, ValueError) as e:
                raise CorruptStateError(
                    f"state {self._state()}: decoded values do not fit the schema: {e}"
                ) from e
        for field in self.schema:
            name = field.name
            if name in built:
                arrays.append(built[name])
            elif name in self._constants:
                arrays.append(pa.array([self._constants[name]] * n, type=pa.string()))
            else:
                values = self._lists[self._derived.get(name, name)]
                if len(values) != n:
                    self._clear()
                    raise CorruptStateError(
                        f"state {self._state()}: column {name} has {len(values)} values, "
                        f"expected {n} (a row was only partly decoded)"
                    )
                if name in self._derived:
                    lo, hi = INSTANT_MS_RANGE
                    values = [v if v is None or lo <= v <= hi else None for v in values]
                try:
                    arrays.append(pa.array(values, type=field.type))
                except (pa.ArrowException, OverflowError, TypeError, ValueError) as e:
                    self._clear()
                    raise CorruptStateError(
                        f"state {self._state()}: decoded {name} values do not fit {field.type}: {e}"
                    ) from e
        self._clear()
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _clear(self) -> None:
        for values in self._lists.values():
            values.clear()

    def _state(self) -> str:
        return str((self.schema.metadata or {}).get(b"statequery.state", b"?").decode())


def split_batch(batch: pa.RecordBatch, batch_size: int) -> Iterator[pa.RecordBatch]:
    """``batch`` in slices of at most ``batch_size`` rows."""
    n = batch.num_rows
    if n <= batch_size:
        yield batch
        return
    for start in range(0, n, batch_size):
        yield batch.slice(start, batch_size)


def _without_timestamps(t: pa.DataType) -> pa.DataType:
    """``t`` with every (nested) timestamp type replaced by int64 (its value in its unit), and
    dates by their days (``date32``) or milliseconds (``date64``) since the epoch."""
    if pa.types.is_timestamp(t) or pa.types.is_date64(t):
        return pa.int64()
    if pa.types.is_date32(t):
        return pa.int32()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_without_timestamps(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(_without_timestamps(t.key_type), _without_timestamps(t.item_type))
    if pa.types.is_large_list(t):
        return pa.large_list(_without_timestamps(t.value_type))
    if pa.types.is_list(t):
        return pa.list_(_without_timestamps(t.value_type))
    return t


def python_rows(table: pa.Table) -> list[dict[str, Any]]:
    """``table.to_pylist()``, except that a column holding an instant or a date Python's datetime
    cannot represent (before year 1, after 9999) gives its timestamps as integers in the column's
    unit since the epoch (dates: days, or milliseconds for ``date64``) instead of raising
    ``OverflowError``."""
    try:
        return table.to_pylist()  # type: ignore[no-any-return]
    except (OverflowError, ValueError, pa.ArrowException):
        pass
    columns = []
    for col in table.columns:
        try:
            columns.append(col.to_pylist())
        except (OverflowError, ValueError, pa.ArrowException):
            columns.append(col.cast(_without_timestamps(col.type)).to_pylist())
    names = table.column_names
    return [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]
