"""The function API of reading: thin wrappers over :class:`~statequery.savepoint.Savepoint`.

``savepoint`` is a :class:`~statequery.savepoint.Savepoint` or a location (opened with
:func:`statequery.open`); ``operator`` a uid, name or id, or a record naming one (a
``StateInfo``, an ``OperatorInfo`` or an ``OperatorState`` of ``_metadata``). States are the
StateMeta model's :class:`~statequery.metadata.statemeta.StateInfo` records.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from statequery.exceptions import InvalidOptionError, NoSuchStateError
from statequery.metadata.kinds import OPERATOR_KINDS
from statequery.metadata.statemeta import StateInfo
from statequery.savepoint import Savepoint
from statequery.scan import DEFAULT_BATCH_SIZE, key_group_for, read_schema

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "key_group_of_key",
    "list_states",
    "lookup",
    "read_state",
    "read_table",
    "schema_of",
]

#: the key group of a key (None for keys it cannot be computed for); see scan.key_group_for
key_group_of_key = key_group_for


def _as_savepoint(savepoint: Savepoint | str) -> Savepoint:
    if isinstance(savepoint, str):
        return Savepoint.open(savepoint)
    return savepoint


def _state(sp: Savepoint, operator: Any, state: str | None, what: str) -> StateInfo:
    if state is None:
        if isinstance(operator, StateInfo):
            return operator
        raise InvalidOptionError(f"{what} needs a state name (or a StateInfo)")
    op = sp.operator(operator)
    found = op.state(state)
    if found is None:
        names = sorted(s.name for s in op.states)
        raise NoSuchStateError(
            f"operator {op.display_name!r} has no state {state!r}; "
            f"states: {', '.join(names) or 'none'}"
        )
    return found


def list_states(savepoint: Savepoint | str, operator: Any) -> list[StateInfo]:
    """The readable states of ``operator`` (keyed with rows, operator list/union, broadcast)."""
    sp = _as_savepoint(savepoint)
    op = sp.operator(operator)
    return [s for s in op.states if s.keyed_rows or s.kind in OPERATOR_KINDS]


def schema_of(
    savepoint: Savepoint | str, operator: Any, state: str | None = None, mode: str | None = None,
    pickled: bool = False,
) -> pa.Schema:
    """The Arrow schema :func:`read_state` produces for this state, mode and ``pickled``."""
    sp = _as_savepoint(savepoint)
    return read_schema(_state(sp, operator, state, "schema_of"), mode, pickled,
                       sp.context.classpath)


def read_state(
    savepoint: Savepoint | str,
    operator: Any,
    state: str | None = None,
    key: Any = None,
    key_groups: Iterable[int] | None = None,
    mode: str | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    pickled: bool = False,
) -> Iterator[pa.RecordBatch]:
    """The rows of one state as RecordBatches of at most ``batch_size`` rows (see
    :func:`statequery.scan.read_batches`); ``key`` reads only the key group that can hold it;
    ``pickled``: with the ``*_py`` columns (:meth:`Savepoint.read`)."""
    sp = _as_savepoint(savepoint)
    info = _state(sp, operator, state, "read_state")
    return sp.read_batches(
        info, key=key, key_groups=key_groups, mode=mode, batch_size=batch_size, pickled=pickled
    )


def read_table(
    savepoint: Savepoint | str,
    operator: Any,
    state: str | None = None,
    key: Any = None,
    key_groups: Iterable[int] | None = None,
    mode: str | None = None,
) -> pa.Table:
    """:func:`read_state` collected into one Table."""
    sp = _as_savepoint(savepoint)
    info = _state(sp, operator, state, "read_table")
    return sp.read(info, key=key, key_groups=key_groups, mode=mode)


def lookup(
    savepoint: Savepoint | str, key: Any, operator: Any = None
) -> dict[tuple[str, str], pa.Table]:
    """Everything every keyed state holds for ``key`` (see :func:`statequery.scan.lookup`).

    ``lookup(savepoint, state_info, key)`` reads one state's rows for one key.
    """
    sp = _as_savepoint(savepoint)
    if isinstance(key, StateInfo):
        info, key = key, operator
        op = sp.operator(info)
        return {(op.display_name, info.name): sp.read(info, key=key)}
    return dict(sp.lookup(key, None if operator is None else sp.operator(operator).operator_id))
