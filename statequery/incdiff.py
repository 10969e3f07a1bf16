"""Diff two RocksDB incremental checkpoints reading only what their differing SST files touch.

Between two versions of one RocksDB instance (same backend id, same key groups), most table
files are shared: the same file (RocksDB name, location, size, sequence numbers, column family)
in both. A key's visible value is decided by the entries of that key in every table of the
column family (newest sequence number, deletions, merge operands), so a key whose entries all
lie in shared tables has the same value in both versions. Only the keys that appear in a table
present in one version and not the other (a flush's new table, a compaction's inputs and
outputs) can differ. :class:`IncrementalDiff` reads those tables whole (keys only are kept),
then reads exactly those keys in both versions with point reads
(:class:`~statequery.backends.rocksdb.TableReadState`, :mod:`statequery.backends.sstpoint`:
only the blocks that can hold each key), decodes them as a scan would, and hands the two
tables to :func:`statequery.diff.diff_batches` (its ``partial``): the rows are exactly those of
the full read. A table both versions share is read through one reader (:class:`TablePool`), so
a block both versions need is read once; :meth:`statequery.history.Job.changes` keeps the pool
from one version pair to the next (the new version's tables only).

The full read is kept (``read`` returns None) when the tables that differ are a large share of
the subtask's bytes (:data:`MAX_CHANGED_SHARE`), when a differing table holds range tombstones
(they may delete keys held only in shared tables), for handles of other kinds, Kryo values
decoded with a classpath, and MANIFESTs the table reader does not support.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from statequery.arrow.batches import BatchBuilder
from statequery.arrow.schemas import state_schema
from statequery.exceptions import CorruptStateError, StatequeryError, UnsupportedFormatError

if TYPE_CHECKING:
    from statequery.backends.rocksdb import TableReadState
    from statequery.backends.sst import SstFile
    from statequery.metadata.statemeta import StateInfo
    from statequery.scan import ScanTask, StateSource

__all__ = ["ENABLED", "MAX_CHANGED_SHARE", "IncrementalDiff", "TablePool"]

#: :meth:`statequery.history.Job.changes` reads changed subtasks by keys (False: whole)
ENABLED = True

#: above this share of a subtask's table bytes (both versions) in tables that differ, the
#: subtask is read whole on both sides: point reads of most keys cost more than a walk
MAX_CHANGED_SHARE = 0.5

_Tables = dict[str, pa.Table]
_Ident = tuple[str, str | None, int | None, int, str, int, int]


class _Selected:
    """A :class:`TableReadState` that yields only the given user keys of each column family
    (their merged values; absent when deleted): what ``RocksDBKeyedBackend._scan_db`` reads."""

    def __init__(self, db: TableReadState, keys: dict[str, list[bytes]],
                 pool: TablePool) -> None:
        self.db = db
        self.keys = keys
        self.pool = pool

    @property
    def column_families(self) -> list[str]:
        return self.db.column_families

    def describe(self, state: str) -> str:
        return self.db.describe(state)

    def wrap_error(self, state: str, e: Exception) -> CorruptStateError:
        return self.db.wrap_error(state, e)

    def items(
        self, state: str, key_groups: tuple[int, int] | None = None, *,
        key_prefix: bytes | None = None, match: tuple[bytes, int] | None = None,
    ) -> tuple[Iterator[tuple[bytes, bytes]], bytes]:
        from statequery.backends.rocksdb import _key_range

        if key_prefix is not None or match is not None:
            raise StatequeryError("a selected-keys read takes no key prefix or match")
        bounds = self.db.key_group_bounds(key_groups)
        keys = self.keys.get(state, [])
        if bounds is None or not keys or state not in self.db.column_families:
            return iter(()), b""
        start, stop = _key_range(self.db.prefix_bytes, bounds, None)
        lo = bisect.bisect_left(keys, start)
        hi = bisect.bisect_left(keys, stop)
        return self._values(state, keys[lo:hi]), stop

    def _values(self, state: str, keys: Sequence[bytes]) -> Iterator[tuple[bytes, bytes]]:
        from statequery.backends.sst import merged_entries

        db = self.db
        for key in keys:
            after = key + b"\x00"  # the least user key after ``key``
            tables = [self.pool.table(db, t) for t in db.tables_for(state, key, after)]
            if tables:
                yield from merged_entries(tables, key, after)


class TablePool:
    """Opened table files by what makes two of them the same file (name, location, size,
    sequence numbers, column family), shared by the readers of every version: a table several
    versions hold is opened once and a block read once (its reader keeps the blocks read).
    :meth:`keep_only` closes those no longer needed."""

    def __init__(self) -> None:
        self._tables: dict[_Ident, SstFile] = {}

    def table(self, db: TableReadState, meta: Any) -> SstFile:
        ident = _ident(db, meta)
        table = self._tables.get(ident)
        if table is None:
            table = db._table(meta)
            db._tables.pop(meta.name, None)  # the pool closes it, not ``db``
            self._tables[ident] = table
        return table

    def keep_only(self, idents: Collection[_Ident]) -> None:
        """Close every table but ``idents``."""
        for ident in [i for i in self._tables if i not in idents]:
            self._tables.pop(ident).close()

    def close(self) -> None:
        self.keep_only(())


class _Subtask:
    """One subtask's two table readers and the user keys that can differ (None: read whole)."""

    def __init__(self, old: TableReadState, new: TableReadState, pool: TablePool) -> None:
        self.old, self.new = old, new
        self.pool = pool
        self.keys: dict[str, list[bytes]] | None = None
        #: the new version's tables
        self.new_tables: set[_Ident] = set()
        self.changed_bytes = 0
        self.total_bytes = 0

    def close(self) -> None:
        for db in (self.old, self.new):
            db.close()

    def plan(self) -> None:
        olds, news = _tables(self.old), _tables(self.new)
        self.total_bytes = sum(t.size for t in olds.values()) + sum(
            t.size for t in news.values())
        differ = [(self.old, olds[i]) for i in olds.keys() - news.keys()]
        differ += [(self.new, news[i]) for i in news.keys() - olds.keys()]
        self.changed_bytes = sum(t.size for _, t in differ)
        self.new_tables = set(news)
        if self.total_bytes and self.changed_bytes > MAX_CHANGED_SHARE * self.total_bytes:
            return
        keys: dict[str, set[bytes]] = {}
        for db, meta in differ:
            table = self.pool.table(db, meta)
            if table.range_deletions():
                return  # may delete keys held only in shared tables
            found = keys.setdefault(meta.column_family, set())
            for row in table.tuples(None, None):
                found.add(row[0])
        self.keys = {cf: sorted(ks) for cf, ks in keys.items()}


def _ident(db: TableReadState, t: Any) -> _Ident:
    f = db._by_name[t.name]
    return (t.name, f.location, f.offset, f.size, t.column_family, t.smallest_seqno,
            t.largest_seqno)


def _tables(db: TableReadState) -> dict[_Ident, Any]:
    """The live tables of ``db`` by what makes two of them the same file."""
    return {_ident(db, t): t for t in db.meta.tables.values()}


class IncrementalDiff:
    """Reads of one version pair for :func:`statequery.diff.diff_batches` (``partial``): for a
    key-group range within one subtask whose RocksDB incremental handles are of the same
    instance over the same key groups on both sides, only the keys of the tables that differ.
    Close it (or use it as a context manager) to close the table readers it opened.

    ``subtasks_read`` / ``subtasks_whole``: subtasks read by keys / whole (fallback).
    """

    def __init__(self, old: StateSource, new: StateSource, pool: TablePool | None = None) -> None:
        from statequery.metadata.handles import IncrementalHandle

        self.old, self.new = old, new
        self._own_pool = pool is None
        #: the tables read, shared with the diffs of other versions given the same pool
        self.pool = TablePool() if pool is None else pool
        #: (operator id, first key group, last key group) -> the two handles
        self._pairs: dict[tuple[str, int, int], tuple[Any, Any]] = {}
        self._subtasks: dict[tuple[str, int, int], _Subtask | None] = {}
        self.subtasks_read = 0
        self.subtasks_whole = 0
        before = {op.operator_id: op for op in old.model.metadata.operators}
        for op in new.model.metadata.operators:
            prev = before.get(op.operator_id)
            if prev is None or prev.max_parallelism != op.max_parallelism:
                continue
            olds = {sub.index: sub for sub in prev.subtasks}
            for sub in op.subtasks:
                o = olds.get(sub.index)
                if o is None or o.raw_keyed is not None or sub.raw_keyed is not None:
                    continue
                a, b = o.managed_keyed, sub.managed_keyed
                if not (isinstance(a, IncrementalHandle) and isinstance(b, IncrementalHandle)):
                    continue
                if (a.backend_id != b.backend_id or not a.backend_id
                        or a.key_group_range != b.key_group_range):
                    continue
                r = b.key_group_range
                self._pairs[(op.operator_id, r.start, r.end)] = (a, b)

    def __enter__(self) -> IncrementalDiff:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def new_tables(self) -> set[_Ident]:
        """The tables of the new version's subtasks read by keys: what the next version pair's
        diff (its old side) may read again (:meth:`TablePool.keep_only`)."""
        out: set[_Ident] = set()
        for sub in self._subtasks.values():
            if sub is not None:
                out |= sub.new_tables
        return out

    def close(self) -> None:
        """Close the table readers opened (and the pool's tables when it made its own)."""
        for sub in self._subtasks.values():
            if sub is not None:
                sub.close()
        self._subtasks.clear()
        if self._own_pool:
            self.pool.close()

    def read(
        self, operator_id: str, olds: list[StateInfo], news: list[StateInfo],
        key_groups: Sequence[int],
    ) -> tuple[_Tables, _Tables] | None:
        """The two sides' rows of ``olds`` / ``news`` in ``key_groups`` that can differ, or
        None: read them whole."""
        if not key_groups or not olds or not news:
            return None
        lo, hi = min(key_groups), max(key_groups)
        where = next((k for k in self._pairs
                      if k[0] == operator_id and k[1] <= lo and hi <= k[2]), None)
        if where is None:
            return None
        if where in self._subtasks:
            known = self._subtasks[where]
            if known is None or known.keys is None:
                return None
        old_tasks = _tasks(self.old, olds, key_groups)
        new_tasks = _tasks(self.new, news, key_groups)
        if old_tasks is None or new_tasks is None:
            return None
        sub = self._subtask(where, old_tasks[1], new_tasks[1])
        if sub is None or sub.keys is None:
            return None
        wanted = set(key_groups)
        return (_decode(old_tasks, _Selected(sub.old, sub.keys, self.pool), olds, wanted),
                _decode(new_tasks, _Selected(sub.new, sub.keys, self.pool), news, wanted))

    def _subtask(self, where: tuple[str, int, int], old_backend: Any,
                 new_backend: Any) -> _Subtask | None:
        if where in self._subtasks:
            return self._subtasks[where]
        dbs: list[TableReadState] = []
        sub: _Subtask | None = None
        try:
            dbs.append(old_backend.open_tables())
            dbs.append(new_backend.open_tables())
            sub = _Subtask(dbs[0], dbs[1], self.pool)
            sub.plan()
        except UnsupportedFormatError:  # a MANIFEST the table reader does not read: whole
            for db in dbs:
                db.close()
            sub = None
        except BaseException:
            for db in dbs:
                db.close()
            raise
        self._subtasks[where] = sub
        if sub is None or sub.keys is None:
            self.subtasks_whole += 1
        else:
            self.subtasks_read += 1
        return sub


def _tasks(sp: StateSource, infos: list[StateInfo],
           key_groups: Sequence[int]) -> tuple[ScanTask, Any] | None:
    """The one scan task of ``infos`` in ``key_groups`` and its RocksDB backend, or None when
    the read is not a plain one of a RocksDB incremental handle."""
    from statequery.backends.rocksdb import RocksDBKeyedBackend
    from statequery.scan import keyed_backend, plan_states

    tasks = plan_states(sp.model, sp.context, infos, keys=None, key_groups=key_groups)
    if len(tasks) != 1:
        return None
    task = tasks[0]
    if not task.keyed or task.raw or task.classpath or task.pickled:
        return None
    backend = keyed_backend(task, sp.context)
    if not isinstance(backend, RocksDBKeyedBackend):
        return None
    return task, backend


def _decode(found: tuple[ScanTask, Any], db: _Selected, infos: list[StateInfo],
            wanted: set[int]) -> _Tables:
    """The selected entries decoded as :func:`statequery.ranges.read_states` decodes a scan."""
    task, backend = found
    out: _Tables = {}
    for name in task.wanted:
        layout = task.layout(name)
        builder = BatchBuilder(state_schema(layout, task.mode), layout)
        for _kg in backend._scan_db(db, layout, task.mode, builder, wanted, None, None):
            pass
        batch = builder.flush()
        out[name] = pa.Table.from_batches([] if batch is None else [batch],
                                          schema=state_schema(layout))
    return {s.name: out.get(s.name, pa.Table.from_batches([], schema=state_schema(s)))
            for s in infos}
