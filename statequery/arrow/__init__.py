"""statequery.arrow: serializer specs as Arrow types, state tables as Arrow schemas and batches.

* :func:`arrow_type` / :func:`sql_arrow_type` — the Arrow type of a serializer's values;
* :func:`state_schema` — a state's row shape (of a :class:`StateInfo`, the one state class);
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
    state_schema,
)
from statequery.arrow.types import EPOCH_MS, arrow_type, sql_arrow_type
from statequery.metadata.state import StateInfo

__all__ = [
    "EPOCH_MS",
    "KEYED_KINDS",
    "MODES",
    "OPERATOR_KINDS",
    "TIMER_KINDS",
    "BatchBuilder",
    "StateInfo",
    "arrow_type",
    "python_rows",
    "sql_arrow_type",
    "state_schema",
]
