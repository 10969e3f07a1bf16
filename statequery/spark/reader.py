"""The readers of the data source: their partitions (the scan planner's picklable tasks, or one
version of a change feed) and the Arrow record batches they stream.

Key pruning comes only from the options of a read (``key``, ``key_groups``), never from the
query's filters: Spark 4.1-4.3 keep the reader planned for one query's pushed filters and reuse it
for later queries over the same relation (a DataFrame, a temporary view), which would return the
filtered rows for an unfiltered query. So the data source implements no ``pushFilters``: a
``WHERE key = ...`` is evaluated by Spark over every key group, and is always right. A pruned read
prints one line on the planning worker's standard error, and plans one partition per subtask
handle holding the wanted key groups.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from statequery.exceptions import InvalidOptionError
from statequery.spark.arrowtypes import _cast
from statequery.spark.options import ReadOptions, parse_key_group_list
from statequery.spark.resolve import _open, _operator_table, _user_types

if TYPE_CHECKING:
    from statequery.metadata.handles import KeyedHandle
    from statequery.savepoint import Savepoint
    from statequery.scan import ScanTask


@dataclass(frozen=True)
class TaskPartition(InputPartition):
    """One :class:`~statequery.scan.ScanTask` (None: the ``state_meta`` table, or nothing to
    read when a pruned read plans no task)."""

    task: ScanTask | None = None


class StatequeryReader(DataSourceReader):
    """Reads key-group ranges; the options ``key`` and ``key_groups`` restrict them.

    Everything the reader reads is decided by the options when it is created, never by a query,
    so the reader Spark caches for a relation is right for every query over it.
    """

    def __init__(self, opts: ReadOptions, arrow_schema: pa.Schema) -> None:
        self.opts = opts
        self.arrow_schema = arrow_schema
        self.keys: list[Any] | None = None
        self.key_groups: set[int] | None = None
        self.table = None if opts.is_state_meta else _operator_table(opts)
        if not opts.is_state_meta and opts.key is not None:
            from statequery.keys import parse_key_text

            sp, operator, state = _open(opts)
            assert operator is not None
            if self.table is not None:
                spec = sp.operator(operator).key_spec
            else:
                assert state is not None
                spec = sp.state(operator, state).key_spec
            self.keys = [parse_key_text(opts.key, spec)]
        if opts.key_groups is not None:
            self.key_groups = parse_key_group_list(opts.key_groups)

    def partitions(self) -> Sequence[InputPartition]:
        if self.opts.is_state_meta:
            return [TaskPartition(None)]
        sp, operator, state = _open(self.opts)
        assert operator is not None
        if self.table is not None:
            from statequery.scan import plan_states

            tasks = plan_states(
                sp.model, sp.context, list(self.table.states), keys=self.keys,
                key_groups=self.key_groups,
                split=self.opts.key_groups_per_partition,
            )
        else:
            assert state is not None
            tasks = sp.plan(
                operator, state, keys=self.keys, key_groups=self.key_groups,
                mode=self.opts.mode, split=self.opts.key_groups_per_partition,
                pickled=self.opts.pickled,
            )
        if self.keys is not None or self.key_groups is not None:
            _report_pruning(sp, operator, state, self.opts, tasks)
        return [TaskPartition(t) for t in tasks] or [TaskPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TaskPartition)  # what partitions() returns
        if self.opts.is_state_meta:
            sp, _, _ = _open(self.opts)
            for batch in sp.state_meta().to_batches():
                yield _cast(batch, self.arrow_schema)
            return
        if partition.task is None:
            return
        from statequery.io import FileIO
        from statequery.scan import execute

        io = FileIO()  # this task's own storage: its files opened once, closed at the end
        try:
            pairs = execute(partition.task, io, batch_size=self.opts.batch_size)
            if self.table is not None:  # every state of the operator, walked once
                for batch in self.table.batches(pairs):
                    yield _cast(batch, self.arrow_schema)
                return
            for _, batch in pairs:
                if batch.num_rows:
                    yield _cast(batch, self.arrow_schema)
        finally:
            io.close()


@dataclass(frozen=True)
class ChangesPartition(InputPartition):
    """The changes of one version of a job (``checkpoint_id``; None: nothing to read)."""

    checkpoint_id: int | None = None


class ChangesReader(DataSourceReader):
    """The change feed (:meth:`statequery.history.Job.changes`): one partition per version,
    each the changes between it and the complete version before it."""

    def __init__(self, opts: ReadOptions, arrow_schema: pa.Schema) -> None:
        self.opts = opts
        self.arrow_schema = arrow_schema
        self.key: Any = None
        if opts.key is not None:
            import statequery
            from statequery.keys import parse_key_text

            with statequery.open_job(self._location, **_user_types(opts)) as job:
                sp = job.version()
                ops = [sp.operator(opts.operator)] if opts.operator else list(sp.operators)
                spec = next((o.key_spec for o in ops if o.key_spec is not None), None)
                if spec is None:
                    raise InvalidOptionError(
                        f"option key: no keyed state in the newest version of {self._location}"
                    )
                self.key = parse_key_text(opts.key, spec)

    @property
    def _location(self) -> str:
        assert self.opts.path is not None  # _resolve_changes sets it
        return self.opts.path

    def partitions(self) -> Sequence[InputPartition]:
        import statequery

        with statequery.open_job(self._location, **_user_types(self.opts)) as job:
            done = job.complete_versions()
        ids = sorted({
            v.checkpoint_id for v in done[1:] if v.checkpoint_id is not None
            and (self.opts.start is None or v.checkpoint_id >= self.opts.start)
            and (self.opts.end is None or v.checkpoint_id <= self.opts.end)
        })
        return [ChangesPartition(i) for i in ids] or [ChangesPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ChangesPartition)  # what partitions() returns
        if partition.checkpoint_id is None:
            return
        import statequery

        cid = partition.checkpoint_id
        with statequery.open_job(self._location, **_user_types(self.opts)) as job:
            completed = next((v.completed_at for v in job.complete_versions()
                              if v.checkpoint_id == cid), None)
            for batch in job.change_batches(self.opts.operator, self.opts.state, start=cid,
                                            end=cid, key=self.key):
                if batch.num_rows:
                    if self.opts.cdc:
                        from statequery.spark.cdc import cdc_batch

                        batch = cdc_batch(batch, completed)
                    yield _cast(batch, self.arrow_schema)


def _report_pruning(
    sp: Savepoint, operator: str | None, state: str | None, opts: ReadOptions,
    tasks: Sequence[ScanTask],
) -> None:
    """One line on the planning worker's stderr: what a pruned read plans to read."""
    assert operator is not None
    if state is None:
        label = f"{sp.operator(operator).display_name} (operator table)"
        max_par = sp.operator(operator).max_parallelism
    else:
        info = sp.state(operator, state)
        label = info.table_name or info.operator_uid + "/" + info.name
        max_par = info.max_parallelism
    ranges = _ranges(
        kg
        for t in tasks
        for kg in (t.key_groups if t.key_groups is not None else _handle_key_groups(t))
    )
    groups = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges) or "none"
    why = f"key {opts.key!r}" if opts.key is not None else f"key_groups {opts.key_groups!r}"
    print(
        f"statequery: {label}: {why} -> "
        f"key group(s) {groups} of {max_par}, {len(tasks)} partition(s)",
        file=sys.stderr, flush=True,
    )


def _handle_key_groups(task: ScanTask) -> range:
    r = cast("KeyedHandle", task.handle).key_group_range  # a keyed task's handle
    return range(r.start, r.end + 1)


def _ranges(key_groups: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted key groups as inclusive ``(start, end)`` runs."""
    out: list[tuple[int, int]] = []
    for kg in sorted(set(key_groups)):
        if out and out[-1][1] == kg - 1:
            out[-1] = (out[-1][0], kg)
        else:
            out.append((kg, kg))
    return out
