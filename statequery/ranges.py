"""Several keyed states of one operator, read together one key-group range at a time: what
``diff`` and ``stats`` walk. Built on the scan planner's multi-state plan
(:func:`statequery.scan.plan_states`): each subtask handle is walked once per range for all the
requested states (one RocksDB restore for all of them)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from statequery.arrow.batches import BatchBuilder
from statequery.arrow.schemas import state_schema
from statequery.scan import ScanTask, StateSource, execute, keyed_backend, plan_states

if TYPE_CHECKING:
    from statequery.metadata.statemeta import StateInfo

__all__ = ["read_states", "scan_states"]


def _tasks(
    sp: StateSource, infos: list[StateInfo], key_groups: Iterable[int] | None, key: Any
) -> list[ScanTask]:
    keys = None if key is None else [key]
    return plan_states(sp.model, sp.context, infos, keys=keys, key_groups=key_groups)


def read_states(
    sp: StateSource, infos: list[StateInfo], key_groups: Iterable[int] | None, key: Any = None
) -> dict[str, pa.Table]:
    """The rows of keyed states ``infos`` (one operator) in ``key_groups`` (None: all), only
    ``key``'s if given, as one Table per state name."""
    if not infos:
        return {}
    batches: dict[str, list[pa.RecordBatch]] = {s.name: [] for s in infos}
    for task in _tasks(sp, infos, key_groups, key):
        for name, batch in execute(task, sp.context):
            batches[name].append(batch)
    return {
        s.name: pa.Table.from_batches(batches[s.name], schema=state_schema(s))
        for s in infos
    }


def scan_states(
    sp: StateSource,
    infos: list[StateInfo],
    key_groups: Iterable[int],
    builder_factory: Callable[[pa.Schema, Any], BatchBuilder],
) -> dict[str, BatchBuilder]:
    """Like :func:`read_states`, into builders made by ``builder_factory(schema, layout)`` (which
    may collect more than rows, e.g. entry sizes); returns them unflushed."""
    builders = {s.name: builder_factory(state_schema(s), s) for s in infos}
    wanted = set(key_groups)
    for task in _tasks(sp, infos, wanted, None):
        backend = keyed_backend(task, sp.context)
        requests = [(task.layout(n), builders[n]) for n in task.wanted]
        for _kg in backend.scan_states(requests, None, wanted):
            pass
    return builders
