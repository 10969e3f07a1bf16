"""A job's retained checkpoints and savepoints as versions of one database (issue 34).

>>> job = statequery.open_job("/checkpoints/3305c6...")   # <job-id>/chk-* + shared/, or savepoints
>>> job.versions_table()                                   # one row per version
>>> job.read("user-state", "count", version=42)            # newest complete version by default
>>> job.changes("user-state", start=40, end=45)            # the change feed
>>> job.history("user-3")                                  # one key through every version

A *version* is one checkpoint or savepoint directory. Versions are ordered by checkpoint id, then
by the time their ``_metadata`` was written (several directories, a job restarted from a
savepoint under a new job id, merge into one history: Flink continues the checkpoint ids of the
snapshot it restores). A version that cannot be read (no ``_metadata``: still being written or
failed; a state file it references is gone: an incremental checkpoint whose shared files were
deleted once it was subsumed) is listed with ``complete = False`` and the reason, and skipped by
:meth:`Job.changes` and :meth:`Job.history`; it never fails the others.

The change feed between two consecutive complete versions is exactly what
:func:`statequery.diff.diff_batches` finds between them, with ``added``/``removed``/``changed``
named ``insert``/``delete``/``update`` (``schema_changed`` and ``not_compared`` keep their
names).
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from statequery import incdiff
from statequery.diff import DIFF_SCHEMA, diff_batches, entry_fields
from statequery.discovery import METADATA_FILE
from statequery.exceptions import (
    InvalidOptionError,
    SavepointNotFoundError,
    StatequeryError,
    StorageError,
)
from statequery.incdiff import IncrementalDiff
from statequery.io import FileIO, join_location, normalize_location

if TYPE_CHECKING:
    from statequery.savepoint import Savepoint
    from statequery.serializers.usertypes import UserTypes

__all__ = [
    "CHANGES_SCHEMA",
    "HISTORY_SCHEMA",
    "VERSIONS_SCHEMA",
    "Job",
    "Version",
    "changes_of",
    "open_job",
]

_CHK = re.compile(r"^chk-(\d+)$")
_JOB_ID = re.compile(r"^[0-9a-f]{32}$")
_SKIP = ("shared", "taskowned")

#: ``added``/``removed``/``changed`` of a diff, as the change feed names them
CHANGE_NAMES = {"added": "insert", "removed": "delete", "changed": "update"}

VERSIONS_SCHEMA = pa.schema(
    [
        ("checkpoint_id", pa.int64()),
        ("kind", pa.string()),
        ("incremental", pa.bool_()),
        ("format", pa.string()),
        ("job_id", pa.string()),
        ("completed_at", pa.timestamp("ms", tz="UTC")),
        ("size_bytes", pa.int64()),
        ("complete", pa.bool_()),
        ("reason", pa.string()),
        ("location", pa.string()),
    ]
)

#: the change feed: the version pair, the change, then :data:`statequery.diff.DIFF_SCHEMA`'s columns
CHANGES_SCHEMA = pa.schema(
    [
        ("checkpoint_id", pa.int64()),
        ("previous_checkpoint_id", pa.int64()),
        ("change", pa.string()),
        *(f for f in DIFF_SCHEMA if f.name != "change"),
    ]
)

HISTORY_SCHEMA = pa.schema(
    [
        ("checkpoint_id", pa.int64()),
        ("completed_at", pa.timestamp("ms", tz="UTC")),
        ("operator_id", pa.string()),
        ("operator", pa.string()),
        ("state", pa.string()),
        ("kind", pa.string()),
        ("key_group", pa.int32()),
        ("key", pa.string()),
        ("namespace", pa.string()),
        ("user_key", pa.string()),
        ("timestamp", pa.int64()),
        ("value", pa.string()),
    ]
)


@dataclass(frozen=True)
class Version:
    """One checkpoint or savepoint of a job.

    ``completed_at`` is the modification time of its ``_metadata`` file (Flink writes it last,
    when the checkpoint completes; ``_metadata`` holds no time), None when the store gives none
    or the version has no ``_metadata``: after a copy (``git clone``, ``cp`` without ``-p``) it is
    the copy's time, so versions are ordered by ``checkpoint_id`` first. ``size_bytes``: the
    ``_metadata`` file and every state file it references (shared files of incremental
    checkpoints included). ``complete``: readable; else ``reason`` says why not.
    """

    location: str
    checkpoint_id: int | None
    kind: str
    incremental: bool
    format: str | None
    job_id: str | None
    completed_at: datetime | None
    size_bytes: int | None
    complete: bool
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in VERSIONS_SCHEMA.names}


def _mtime(io: FileIO, location: str) -> datetime | None:
    """The modification time of a file from its version token, when the store gives one."""
    try:
        _, token = io.version(location)
    except StatequeryError:
        return None
    name, _, value = token.partition("=")
    if name == "mtime_ns":
        ns = int(value.split(";", 1)[0])
        return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)
    if name in ("LastModified", "last_modified", "mtime", "updated", "modified"):
        try:
            return datetime.fromisoformat(value).astimezone(timezone.utc)
        except ValueError:
            try:
                return datetime.fromtimestamp(float(value), tz=timezone.utc)
            except ValueError:
                return None
    return None


def _job_id_of(location: str) -> str | None:
    parent = posixpath.basename(posixpath.dirname(location.rstrip("/")))
    return parent if _JOB_ID.match(parent) else None


def _candidates(io: FileIO, location: str, depth: int = 2) -> list[tuple[str, int | None]]:
    """``(directory, id from its name)`` of every version under ``location``: its ``chk-N``
    directories, the directories holding ``_metadata`` (savepoints), ``savepoint-*``
    directories without one, and those of job directories below it (``depth`` levels)."""
    if io.new_input(join_location(location, METADATA_FILE)).exists():
        m = _CHK.match(posixpath.basename(location.rstrip("/")))
        return [(location, int(m.group(1)) if m else None)]
    if depth < 0 or not io.is_dir(location):
        return []
    out: list[tuple[str, int | None]] = []
    for child in io.list_dir(location):
        if child.startswith(".") or child in _SKIP:
            continue
        loc = join_location(location, child)
        m = _CHK.match(child)
        if m:
            out.append((loc, int(m.group(1))))
        elif child.startswith("savepoint-") and io.is_dir(loc):
            out.append((loc, None))
        elif io.is_dir(loc):
            out.extend(_candidates(io, loc, depth - 1))
    return out


class _Listing:
    """Whether files exist, one directory listing per directory (a job's ``shared/`` holds the
    files of every version: listed once, not one request per file and version)."""

    def __init__(self, io: FileIO) -> None:
        self.io = io
        self._names: dict[str, set[str] | None] = {}

    def exists(self, location: str) -> bool:
        parent, _, name = location.rstrip("/").rpartition("/")
        if parent not in self._names:
            try:
                self._names[parent] = set(self.io.list_dir(parent))
            except StatequeryError:
                self._names[parent] = None
        names = self._names[parent]
        if names is None:  # no listing (a store that cannot list): ask for the file
            return self.io.new_input(location).exists()
        return name in names


def _version(io: FileIO, location: str, name_id: int | None, listing: _Listing) -> Version:
    """Read one candidate's ``_metadata`` and check every file it references exists."""
    from statequery.metadata.checkpoint import load_metadata
    from statequery.metadata.handles import HandleResolver, IncrementalHandle

    meta_loc = join_location(location, METADATA_FILE)
    job_id = _job_id_of(location)
    kind = "savepoint" if name_id is None else "checkpoint"
    if not io.new_input(meta_loc).exists():
        return Version(
            location, name_id, kind, False, None, job_id, None, None, False,
            f"no {METADATA_FILE}: Flink writes it last, when the version completes "
            "(still being written, or failed)",
        )
    completed_at = _mtime(io, meta_loc)
    try:
        meta = load_metadata(io, meta_loc)
    except StatequeryError as e:
        return Version(location, name_id, kind, False, None, job_id, completed_at, None, False,
                       str(e))
    if meta.properties is not None:
        kind = meta.properties.snapshot_type
    fmt = meta.properties.format.lower() if meta.properties and meta.properties.format else None
    resolver = HandleResolver(io, location)
    size = meta.size
    incremental = False
    missing: list[str] = []
    seen: set[str] = set()
    for op in meta.operators:
        for sub in op.subtasks:
            for handle in (sub.managed_keyed, sub.raw_keyed, sub.managed_operator,
                           sub.raw_operator):
                if handle is None:
                    continue
                if isinstance(handle, IncrementalHandle) and kind == "checkpoint":
                    incremental = True
                for stream in handle.stream_handles():
                    try:
                        loc = resolver.location(stream)
                    except StorageError as e:
                        missing.append(str(e))
                        continue
                    if loc is None or loc in seen:
                        continue
                    seen.add(loc)
                    size += stream.size or 0
                    if not listing.exists(loc):
                        missing.append(loc)
    reason = None
    if missing:
        shared = [m for m in missing if "/shared/" in m.replace("\\", "/")]
        why = (
            "shared files of an incremental checkpoint, deleted once it was subsumed"
            if shared
            else "deleted or never written"
        )
        reason = f"{len(missing)} state file(s) it references are gone ({why}): {missing[0]}"
    return Version(location, meta.checkpoint_id, kind, incremental, fmt, job_id, completed_at,
                   size, not missing, reason)


def _order(v: Version) -> tuple[int, float]:
    t = v.completed_at.timestamp() if v.completed_at is not None else 0.0
    return (v.checkpoint_id if v.checkpoint_id is not None else 1 << 62, t)


class Job:
    """The versions of one job, from one or several directories. Create with :func:`open_job`.

    The versions are listed once, when the job is opened; :meth:`refresh` lists them again.
    Opened versions stay open until :meth:`close`.
    """

    def __init__(self, io: FileIO, locations: list[str], max_workers: int | None = None,
                 classpath: Sequence[str] | str | UserTypes | None = None) -> None:
        self.io = io
        self.locations = locations
        self.max_workers = max_workers
        #: the job's jars, for its Kryo values (:meth:`Savepoint.open`'s ``classpath``)
        self.classpath = classpath
        self._open: dict[str, Savepoint] = {}
        self._versions: list[Version] = []
        self.refresh()

    def refresh(self) -> None:
        """List the versions again (new checkpoints, subsumed ones gone)."""
        found: dict[str, int | None] = {}
        for location in self.locations:
            candidates = _candidates(self.io, location)
            if not candidates:
                raise SavepointNotFoundError(
                    f"no checkpoint or savepoint under {location}: expected a job's checkpoint "
                    "directory (<job-id>/chk-N, shared/), a folder of its savepoints, or a "
                    "folder holding such job directories"
                )
            for loc, ident in candidates:
                found.setdefault(loc, ident)
        listing = _Listing(self.io)
        versions = [_version(self.io, loc, ident, listing) for loc, ident in found.items()]
        self._versions = sorted(versions, key=_order)

    def __repr__(self) -> str:
        return f"Job({', '.join(map(repr, self.locations))}, {len(self._versions)} versions)"

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every opened version (restored RocksDB databases)."""
        for sp in self._open.values():
            sp.close()
        self._open.clear()

    # -- versions ----------------------------------------------------------------------------

    def versions(self) -> list[Version]:
        """Every version, oldest first, complete or not."""
        return list(self._versions)

    def versions_table(self) -> pa.Table:
        """:meth:`versions` as a Table of :data:`VERSIONS_SCHEMA`."""
        rows = [v.as_dict() for v in self._versions]
        return pa.Table.from_pylist(rows, schema=VERSIONS_SCHEMA)

    def complete_versions(self) -> list[Version]:
        return [v for v in self._versions if v.complete]

    def latest(self) -> Version:
        """The newest complete version."""
        done = self.complete_versions()
        if not done:
            raise SavepointNotFoundError(
                f"no complete version in {', '.join(self.locations)}: "
                + "; ".join(f"{v.location}: {v.reason}" for v in self._versions[-3:])
            )
        return done[-1]

    def _find(self, version: int | None) -> Version:
        if version is None:
            return self.latest()
        if isinstance(version, bool) or not isinstance(version, int):
            raise InvalidOptionError(f"version must be a checkpoint id (int), got {version!r}")
        matches = [v for v in self._versions if v.checkpoint_id == version]
        if not matches:
            known = ", ".join(str(v.checkpoint_id) for v in self._versions)
            raise InvalidOptionError(
                f"no version {version} in {', '.join(self.locations)} (versions: {known})"
            )
        done = [v for v in matches if v.complete]
        if not done:
            raise SavepointNotFoundError(
                f"version {version} at {matches[-1].location} cannot be read: {matches[-1].reason}"
            )
        return done[-1]

    def version_at(self, when: datetime) -> Version:
        """The newest complete version that completed at or before ``when`` (a naive ``when``
        is UTC): what Spark's ``TIMESTAMP AS OF`` reads. A version whose completion time the
        store does not give (``completed_at`` None) is never chosen."""
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        done = [v for v in self.complete_versions()
                if v.completed_at is not None and v.completed_at <= when]
        if not done:
            times = [v.completed_at for v in self.complete_versions() if v.completed_at]
            oldest = f"; the oldest completed at {min(times).isoformat()}" if times else ""
            raise InvalidOptionError(
                f"no complete version of {', '.join(self.locations)} completed at or before "
                f"{when.isoformat()}{oldest}"
            )
        return max(done, key=lambda v: (v.completed_at, v.checkpoint_id or -1))

    def location_of(self, version: int | None = None) -> str:
        """The directory of the version with checkpoint id ``version`` (the newest complete one
        when None), as :meth:`version` finds it; raises as it does."""
        return self._find(version).location

    def version(self, version: int | None = None) -> Savepoint:
        """The version with checkpoint id ``version`` (the newest complete one when None) as a
        :class:`~statequery.savepoint.Savepoint` (kept open until :meth:`close`). When several
        directories hold the same id, the last of the history."""
        return self._savepoint(self._find(version))

    def _savepoint(self, v: Version) -> Savepoint:
        sp = self._open.get(v.location)
        if sp is None:
            from statequery.savepoint import DEFAULT_WORKERS, Savepoint

            workers = DEFAULT_WORKERS if self.max_workers is None else self.max_workers
            sp = Savepoint.open(v.location, io=self.io, max_workers=workers,
                                classpath=self.classpath)
            self._open[v.location] = sp
        return sp

    def read(
        self,
        operator: str,
        state: str | None = None,
        version: int | None = None,
        key: Any = None,
        mode: str | None = None,
    ) -> pa.Table:
        """:meth:`Savepoint.read <statequery.savepoint.Savepoint.read>` on one version (the
        newest complete one by default)."""
        return self.version(version).read(operator, state, key=key, mode=mode)

    # -- the change feed ---------------------------------------------------------------------

    def _window(self, start: int | None, end: int | None) -> list[tuple[Version, Version]]:
        done = self.complete_versions()
        pairs = []
        for prev, cur in zip(done, done[1:], strict=False):
            cid = cur.checkpoint_id if cur.checkpoint_id is not None else -1
            if start is not None and cid < start:
                continue
            if end is not None and cid > end:
                continue
            pairs.append((prev, cur))
        return pairs

    def change_batches(
        self,
        operator: str | None = None,
        state: str | None = None,
        start: int | None = None,
        end: int | None = None,
        key: Any = None,
    ) -> Iterator[pa.RecordBatch]:
        """:meth:`changes` as RecordBatches, one version pair at a time."""
        if start is not None and end is not None and start > end:
            raise InvalidOptionError(f"start ({start}) is after end ({end})")
        pool = incdiff.TablePool()  # the tables a pair reads by keys, kept for the next pair
        try:
            for prev, cur in self._window(start, end):
                old, new = self._savepoint(prev), self._savepoint(cur)
                same = unchanged_key_groups(old, new)
                with IncrementalDiff(old, new, pool) as partial:
                    for batch in diff_batches(old, new, operator, state, key, unchanged=same,
                                              partial=partial if incdiff.ENABLED else None):
                        yield _change_batch(batch, cur.checkpoint_id, prev.checkpoint_id)
                    pool.keep_only(partial.new_tables)
        finally:
            pool.close()

    def changes(
        self,
        operator: str | None = None,
        state: str | None = None,
        start: int | None = None,
        end: int | None = None,
        key: Any = None,
    ) -> pa.Table:
        """The change feed: one row per entry inserted, updated or deleted between consecutive
        complete versions, for the versions ``start <= checkpoint_id <= end`` (each compared
        with the complete version before it; the oldest version is the baseline and has no
        rows). Columns :data:`CHANGES_SCHEMA`: ``checkpoint_id`` (the version the change is
        in), ``previous_checkpoint_id``, ``change`` and the columns of
        :data:`statequery.diff.DIFF_SCHEMA`. ``operator``, ``state`` and ``key`` restrict it as
        in :func:`statequery.diff.diff_batches`."""
        batches = list(self.change_batches(operator, state, start, end, key))
        return pa.Table.from_batches(batches, schema=CHANGES_SCHEMA)

    # -- one key through time ----------------------------------------------------------------

    def history(self, key: Any, operator: str | None = None) -> pa.Table:
        """Every keyed state's entries for ``key`` in every complete version, oldest first
        (:data:`HISTORY_SCHEMA`; keys and values as JSON text). Each version reads only the
        key group that can hold the key (:meth:`Savepoint.lookup
        <statequery.savepoint.Savepoint.lookup>`). A version holding nothing for the key has
        no rows."""
        cols: dict[str, list[Any]] = {name: [] for name in HISTORY_SCHEMA.names}
        for v in self.complete_versions():
            sp = self._savepoint(v)
            found = sp.lookup(key, operator)
            for (op_label, state_name), table in found.items():
                info = sp.model.resolve_state(op_label, state_name)
                for f in entry_fields(table, info.kind):
                    cols["checkpoint_id"].append(v.checkpoint_id)
                    cols["completed_at"].append(v.completed_at)
                    cols["operator_id"].append(info.operator_id)
                    cols["operator"].append(op_label)
                    cols["state"].append(state_name)
                    cols["kind"].append(info.kind)
                    for name in ("key_group", "key", "namespace", "user_key", "timestamp",
                                 "value"):
                        cols[name].append(f.get(name))
        return pa.Table.from_pydict(cols, schema=HISTORY_SCHEMA)


def unchanged_key_groups(old: Savepoint, new: Savepoint) -> dict[str, set[int]]:
    """``{operator id: key groups}`` whose keyed state is the same in both versions, known from
    ``_metadata`` alone: a subtask whose RocksDB incremental handle in ``new`` is of the same
    RocksDB instance (backend id) over the same key groups as in ``old`` and lists the same SST
    files. Flink flushes and uploads a new SST for any write (deletes included) and compacts
    only after flushes, so the same files hold the same entries; those key groups are not read
    (:func:`statequery.diff.diff_batches`'s ``unchanged``). Subtasks with raw keyed state (heap
    timers) or other handle kinds are always read."""
    from statequery.metadata.handles import IncrementalHandle

    before = {op.operator_id: op for op in old.metadata.operators}
    out: dict[str, set[int]] = {}
    for op in new.metadata.operators:
        prev = before.get(op.operator_id)
        if prev is None or prev.max_parallelism != op.max_parallelism:
            continue
        olds = {sub.index: sub for sub in prev.subtasks}
        for sub in op.subtasks:
            o = olds.get(sub.index)
            a, b = (o.managed_keyed if o else None), sub.managed_keyed
            if o is None or o.raw_keyed is not None or sub.raw_keyed is not None:
                continue
            if not (isinstance(a, IncrementalHandle) and isinstance(b, IncrementalHandle)):
                continue
            if (a.backend_id != b.backend_id or not a.backend_id
                    or a.key_group_range != b.key_group_range
                    or {n for n, _ in a.shared} != {n for n, _ in b.shared}):
                continue
            r = b.key_group_range
            out.setdefault(op.operator_id, set()).update(range(r.start, r.end + 1))
    return out


def _change_batch(batch: pa.RecordBatch, cid: int | None, prev: int | None) -> pa.RecordBatch:
    n = batch.num_rows
    change = [CHANGE_NAMES.get(c, c) for c in batch.column("change").to_pylist()]
    arrays: list[pa.Array] = [
        pa.array([cid] * n, pa.int64()),
        pa.array([prev] * n, pa.int64()),
        pa.array(change, pa.string()),
    ]
    arrays.extend(batch.column(name) for name in CHANGES_SCHEMA.names[3:])
    return pa.RecordBatch.from_arrays(arrays, schema=CHANGES_SCHEMA)


def changes_of(location: str, newest: Savepoint, table: str) -> pa.Table:
    """The change feed of one table (a state's ``table_name`` or an operator table, resolved in
    ``newest``) of the job at ``location``: the ``<table>__changes`` table of ``statequery
    sql``."""
    operator_id = newest.operator_table_id(table)
    state = None
    if operator_id is None:
        info = newest.table(table)
        operator_id, state = info.operator_id, info.name
    classpath = newest.context.classpath or None
    with open_job(location, io=newest.io, classpath=classpath) as job:
        return job.changes(operator_id, state)


def open_job(
    location: str,
    *more: str,
    io: FileIO | None = None,
    storage_options: dict[str, Any] | None = None,
    max_workers: int | None = None,
    classpath: Sequence[str] | str | UserTypes | None = None,
    protobuf_descriptors: str | os.PathLike[str] | None = None,
    protobuf_messages: Mapping[str, str] | Sequence[str] | str | None = None,
) -> Job:
    """Open a job's versions: its checkpoint directory (``<job-id>/`` with ``chk-N`` and
    ``shared/``, or the folder holding it), a folder of its savepoints, or any fsspec URI of
    those; ``more`` directories (a job restarted from a savepoint under a new job id) merge into
    one history. ``classpath``, ``protobuf_descriptors``, ``protobuf_messages``: the job's
    jars and Protobuf options, to decode its Kryo values (as in :func:`statequery.open`)."""
    from statequery.arrow.kryo import user_types

    types = user_types(classpath, protobuf_descriptors, protobuf_messages)
    io = io or FileIO(storage_options)
    locations = [normalize_location(loc.rstrip("/") if len(loc) > 1 else loc)
                 for loc in (location, *more)]
    return Job(io, locations, max_workers, types or None)
