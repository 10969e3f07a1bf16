"""Column-wise row buffers: decoders append Python values to per-column lists; a flush turns them
into one :class:`pyarrow.RecordBatch` (one ``pa.array`` call per column)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from statequery.arrow.schemas import StateLayout, opaque_reason
from statequery.exceptions import CorruptStateError

__all__ = ["BatchBuilder", "split_batch"]


class BatchBuilder:
    """Per-column Python lists for ``schema``; ``<col>_reason`` columns are filled at flush.

    Decoders take ``appender(name)`` (the list's bound ``append``) once and call it per value.
    """

    __slots__ = ("_constants", "_lists", "_order", "schema")

    def __init__(self, schema: pa.Schema, layout: StateLayout | None = None) -> None:
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
        self._lists: dict[str, list[Any]] = {
            f.name: [] for f in schema if f.name not in self._constants
        }
        self._order = [f.name for f in schema]

    def appender(self, name: str) -> Callable[[Any], None]:
        return self._lists[name].append

    def column(self, name: str) -> list[Any]:
        return self._lists[name]

    def __len__(self) -> int:
        for values in self._lists.values():
            return len(values)
        return 0

    def flush(self) -> pa.RecordBatch | None:
        """The buffered rows as a RecordBatch (None when empty); the buffers are cleared."""
        n = len(self)
        if n == 0:
            return None
        arrays = []
        for field in self.schema:
            name = field.name
            if name in self._constants:
                arrays.append(pa.array([self._constants[name]] * n, type=pa.string()))
            else:
                values = self._lists[name]
                if len(values) != n:
                    raise AssertionError(f"column {name} has {len(values)} values, expected {n}")
                try:
                    arrays.append(pa.array(values, type=field.type))
                except (pa.ArrowException, OverflowError, TypeError, ValueError) as e:
                    for v in self._lists.values():
                        v.clear()
                    state = (self.schema.metadata or {}).get(b"statequery.state", b"?").decode()
                    raise CorruptStateError(
                        f"state {state}: decoded {name} values do not fit {field.type}: {e}"
                    ) from e
        for values in self._lists.values():
            values.clear()
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def split_batch(batch: pa.RecordBatch, batch_size: int) -> Iterator[pa.RecordBatch]:
    """``batch`` in slices of at most ``batch_size`` rows."""
    n = batch.num_rows
    if n <= batch_size:
        yield batch
        return
    for start in range(0, n, batch_size):
        yield batch.slice(start, batch_size)
