"""statequery.arrow: serializer specs as Arrow types, state tables as Arrow schemas and batches.

* :func:`arrow_type` / :func:`sql_arrow_type` — the Arrow type of a serializer's values;
* :class:`StateLayout`, :func:`layout_from_meta`, :func:`state_schema` — a state's row shape;
* :class:`BatchBuilder` — per-column buffers turned into RecordBatches;
* :func:`python_rows` — a table as Python rows, out-of-range instants as integers.
"""

from __future__ import annotations

from statequery.arrow.batches import BatchBuilder, python_rows
from statequery.arrow.schemas import (
    KEYED_KINDS,
    MODES,
    OPERATOR_KINDS,
    TIMER_KINDS,
    StateLayout,
    layout_from_meta,
    state_schema,
)
from statequery.arrow.types import EPOCH_MS, arrow_type, sql_arrow_type

__all__ = [
    "EPOCH_MS",
    "KEYED_KINDS",
    "MODES",
    "OPERATOR_KINDS",
    "TIMER_KINDS",
    "BatchBuilder",
    "StateLayout",
    "arrow_type",
    "layout_from_meta",
    "python_rows",
    "sql_arrow_type",
    "state_schema",
]
