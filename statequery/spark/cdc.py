"""The change feed in Spark's change-data-capture layout (Spark 4.2+ ``Changelog``): what
``SELECT * FROM sq.<db>.<table> CHANGES FROM VERSION 40 TO VERSION 45`` and
``spark.read.option("startingVersion", "40").changes("sq.<db>.<table>")`` read through
statequery's catalog plugin (``statequery.StatequeryCatalog``).

Each row of :meth:`statequery.history.Job.changes` becomes Spark's rows: an ``insert`` its new
value, a ``delete`` its old value, an ``update`` two rows, ``update_preimage`` (the old value)
and ``update_postimage`` (the new value), with ``_change_type``, ``_commit_version`` (the
checkpoint id of the version the change is in) and ``_commit_timestamp`` (when that version
completed). The entry's identity (``operator_id``, ``state``, ``key``, ``namespace``,
``user_key``, ``timestamp``, ``subtask``, ``index``) is the changelog's row id, so Spark can
compute net changes over several versions itself (``deduplicationMode`` ``netChanges``).
"""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from statequery.diff import DIFF_SCHEMA

__all__ = ["CDC_SCHEMA", "ROW_ID", "cdc_batch"]

#: the columns of an entry, then the value, then Spark's change columns
CDC_SCHEMA = pa.schema(
    [
        *(f for f in DIFF_SCHEMA if f.name not in ("change", "old_value", "new_value")),
        ("value", pa.string()),
        ("_change_type", pa.string()),
        ("_commit_version", pa.int64()),
        ("_commit_timestamp", pa.timestamp("us", tz="UTC")),
    ]
)

#: the columns that name one entry (the changelog's row id)
ROW_ID = ("operator_id", "state", "key", "namespace", "user_key", "timestamp", "subtask", "index")

_ENTRY = [f.name for f in DIFF_SCHEMA if f.name not in ("change", "old_value", "new_value")]


def cdc_batch(batch: pa.RecordBatch, completed_at: datetime | None) -> pa.RecordBatch:
    """A batch of the change feed (:data:`statequery.history.CHANGES_SCHEMA`) in the layout of
    :data:`CDC_SCHEMA`: an update as its pre-image row followed by its post-image row."""
    import numpy as np

    change = batch.column("change")
    is_update = pc.equal(change, "update").to_numpy(zero_copy_only=False)
    rows = np.repeat(np.arange(batch.num_rows, dtype=np.int64), 1 + is_update.astype(np.int64))
    # the second of two equal indices is an update's post-image
    second_np = np.zeros(len(rows), dtype=bool)
    second_np[1:] = rows[1:] == rows[:-1]
    indices, second = pa.array(rows), pa.array(second_np)
    changes = pc.take(change, indices)
    old = pc.take(batch.column("old_value"), indices)
    new = pc.take(batch.column("new_value"), indices)
    is_delete = pc.equal(changes, "delete")
    pre_image = pc.and_(pc.equal(changes, "update"), pc.invert(second))
    value = pc.if_else(pc.or_(is_delete, pre_image), old, new)
    kind = pc.if_else(
        pc.equal(changes, "update"),
        pc.if_else(second, pa.scalar("update_postimage"), pa.scalar("update_preimage")),
        changes,
    )
    n = len(rows)
    columns = [pc.take(batch.column(name), indices) for name in _ENTRY]
    commit = pc.take(batch.column("checkpoint_id"), indices)
    stamp = pa.array([completed_at] * n, pa.timestamp("us", tz="UTC"))
    return pa.RecordBatch.from_arrays([*columns, value, kind, commit, stamp], schema=CDC_SCHEMA)
