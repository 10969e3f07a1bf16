"""Operator tables: every keyed state of one operator as one table, read in one pass.

A state table holds one state; a query that needs several states of an operator (a join of
``count`` and ``sum-amount`` by key, a report over every state) reads the operator's files once
per state. The operator table reads them once: one row per entry of any of the operator's keyed
states, with

* ``state`` (string): the state name;
* ``key_group``, ``key``: as in the state tables (one key type per operator);
* one nullable struct column per state, named after it (``sql_name``: ``sum-amount`` ->
  ``sum_amount``), holding the rest of that state's row (``namespace``, ``value``,
  ``user_key``, ``timestamp`` ...); it is null on the other states' rows.

So ``SELECT key, count.value FROM op WHERE state = 'count'`` is the ``count`` table, and
``SELECT key, max(count.value), max(sum_amount.value) FROM op GROUP BY key`` joins two states
in one scan. Its name is the operator's part of its state tables' names (``user_state`` for
``user_state__count``): see :func:`operator_table_names`. It exists for operators with two or
more keyed states whose key columns have one type.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from statequery.arrow.schemas import state_schema
from statequery.exceptions import InvalidOptionError
from statequery.metadata.statemeta import sql_name

if TYPE_CHECKING:
    from statequery.metadata.statemeta import OperatorInfo, StateInfo, StateMeta

__all__ = ["OperatorTable", "operator_table_names"]

_SHARED = ("key_group", "key")


class OperatorTable:
    """The layout of one operator table over ``states`` (keyed states of one operator)."""

    def __init__(self, states: Sequence[StateInfo]) -> None:
        if not states:
            raise InvalidOptionError("an operator table needs at least one keyed state")
        self.states = tuple(states)
        self.columns: dict[str, str] = {}  # state name -> struct column
        taken = {"state", *_SHARED}
        key_field: pa.Field | None = None
        structs: list[pa.Field] = []
        for s in self.states:
            schema = state_schema(s)
            key = schema.field("key")
            if key_field is None:
                key_field = key
            elif not key.type.equals(key_field.type):
                raise InvalidOptionError(
                    f"operator {s.operator_uid or s.operator_id!r}: state {s.name!r} has keys of "
                    f"type {key.type}, {self.states[0].name!r} of {key_field.type}; read its "
                    "state tables one by one"
                )
            column = sql_name(s.name)
            n = 2
            while column in taken:
                column = f"{sql_name(s.name)}_{n}"
                n += 1
            taken.add(column)
            self.columns[s.name] = column
            rest = [f for f in schema if f.name not in _SHARED]
            structs.append(pa.field(column, pa.struct(rest), nullable=True))
        assert key_field is not None
        self.schema = pa.schema(
            [
                pa.field("state", pa.string(), nullable=False),
                pa.field("key_group", pa.int32(), nullable=False),
                key_field.with_nullable(True),
                *structs,
            ]
        )

    def batch(self, state: str, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``state``'s rows (a batch of its state table) as rows of this table."""
        n = batch.num_rows
        mine = self.columns[state]
        arrays: list[pa.Array] = [
            pa.array([state] * n, pa.string()) if n else pa.array([], pa.string()),
            batch.column("key_group"),
            batch.column("key"),
        ]
        for f in self.schema:
            if f.name in ("state", *_SHARED):
                continue
            if f.name == mine:
                children = [batch.column(c.name) for c in f.type]
                arrays.append(
                    pa.StructArray.from_arrays(children, fields=list(f.type))
                )
            else:
                arrays.append(pa.nulls(n, f.type))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def batches(self, pairs: Iterable[tuple[str, pa.RecordBatch]]) -> Iterator[pa.RecordBatch]:
        """``(state, batch)`` pairs of :meth:`Savepoint.read_operator` as this table's batches."""
        for state, b in pairs:
            if b.num_rows:
                yield self.batch(state, b)


def _stem(op: OperatorInfo, keyed: Sequence[StateInfo]) -> str:
    """The operator part of its state tables' names (``user_state`` of ``user_state__count``)."""
    for s in keyed:
        suffix = f"__{sql_name(s.name)}"
        if s.table_name.endswith(suffix):
            return s.table_name[: -len(suffix)]
    return sql_name(op.display_name)


def operator_table_names(meta: StateMeta) -> dict[str, str]:
    """``{table name: operator id}`` of the savepoint's operator tables: operators with two or
    more keyed states of one key type. A name that is already a state table's (or another
    operator's) gets no operator table."""
    taken = {s.table_name.lower() for s in meta.states}
    out: dict[str, str] = {}
    for op in meta.operators:
        keyed = [s for s in op.states if s.keyed_rows]
        if len(keyed) < 2:
            continue
        try:
            OperatorTable(keyed)
        except InvalidOptionError:
            continue
        name = _stem(op, keyed)
        if name.lower() in taken or name in out:
            continue
        out[name] = op.operator_id
    return out
