"""``Savepoint``: one Flink savepoint or retained checkpoint, opened for inspection and reading.

>>> sp = statequery.open("/savepoints/savepoint-3305c6-b004b8ed05c4")
>>> [s.table_name for s in sp.states]
>>> sp.state_meta()                       # pyarrow.Table, one row per state

Opening reads ``_metadata``. The states (operators, kinds, serializers) come from the StateMeta
snapshot next to ``_metadata`` when one exists and was derived from the same ``_metadata`` bytes;
otherwise they are derived once — ``_metadata`` plus the header of every state file, read in
parallel through the storage seam — and cached: :class:`~statequery.metadata.model.SavepointModel`
(:attr:`Savepoint.model`). Reads are planned and executed by :mod:`statequery.scan` against the
model and the savepoint's :class:`~statequery.scan.ReadContext` (:attr:`Savepoint.context`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from statequery import scan
from statequery.discovery import find_metadata
from statequery.exceptions import CorruptStateError, SnapshotIgnoredWarning, StatequeryError
from statequery.io import FileIO, join_location, location_parent
from statequery.metadata.checkpoint import CheckpointMetadata
from statequery.metadata.handles import HandleResolver
from statequery.metadata.model import (
    DEFAULT_WORKERS,
    STATE_META_COLUMNS,
    SavepointModel,
    derive_state_meta,
)
from statequery.metadata.plan import CompiledPlan, PlanNode, parse_plan
from statequery.metadata.runindex import RunIndex
from statequery.metadata.statemeta import (
    FORMAT_VERSION,
    SNAPSHOT_FILE_NAME,
    JobInfo,
    KeptParts,
    OperatorInfo,
    SnapshotVersionError,
    StateInfo,
    StateMeta,
    kept_parts,
    loads,
    write_snapshot,
)
from statequery.serializers.usertypes import UserTypes

if TYPE_CHECKING:
    import pyarrow as pa

    from statequery.optable import OperatorTable
    from statequery.stats import StateStats

__all__ = [
    "DEFAULT_WORKERS",
    "STATE_META_COLUMNS",
    "Savepoint",
    "derive_state_meta",
    "find_metadata",
]



class Savepoint:
    """A savepoint or retained checkpoint. Create with :meth:`open` (or ``statequery.open``)."""

    def __init__(
        self,
        io: FileIO,
        metadata_location: str,
        metadata_bytes: bytes,
        state_meta: StateMeta | None = None,
        max_workers: int = DEFAULT_WORKERS,
        plan: CompiledPlan | None = None,
        job: JobInfo | None = None,
        classpath: UserTypes | None = None,
    ) -> None:
        self.io = io
        self.metadata_location = metadata_location
        self.location = location_parent(metadata_location)
        self.resolver = HandleResolver(io, self.location)
        #: what this savepoint holds (operators, states, tables): lazy, thread-safe
        self.model = SavepointModel(
            self.resolver, metadata_location, metadata_bytes, state_meta, max_workers, plan, job
        )
        #: where each state's run lies in each key group of the canonical streams: from the
        #: snapshot's index, and recorded by every walk of a whole key group
        #: (statequery.metadata.runindex); the scan planner reads only the wanted runs
        self.run_index = (
            state_meta.run_index
            if state_meta is not None and state_meta.run_index is not None
            else RunIndex()
        )
        # restored RocksDB databases stay open for this savepoint (bounded; closed by close())
        from statequery.backends.pool import OpenDatabases

        #: how reads reach the bytes (statequery.scan.ReadContext)
        self.context = scan.ReadContext(self.resolver, self.run_index, OpenDatabases(),
                                        classpath or UserTypes())

    @classmethod
    def open(
        cls,
        location: str,
        *,
        io: FileIO | None = None,
        storage_options: dict[str, Any] | None = None,
        use_snapshot: bool = True,
        snapshot: str | None = None,
        max_workers: int = DEFAULT_WORKERS,
        plan: str | None = None,
        rederive: bool = False,
        classpath: Sequence[str] | str | UserTypes | None = None,
        protobuf_descriptors: str | os.PathLike[str] | None = None,
        protobuf_messages: Mapping[str, str] | Sequence[str] | str | None = None,
    ) -> Savepoint:
        """Open the savepoint/checkpoint at ``location`` (directory, ``_metadata`` or URI).

        ``classpath``: the job's jars (or class directories; a string: comma or path-separator
        separated): values Flink serialized with Kryo are decoded with their classes
        (docs/decoding.md, "Kryo values"); without it they are raw bytes with a reason (a
        :class:`~statequery.serializers.usertypes.UserTypes`: its jars and Protobuf options).
        ``protobuf_descriptors``: a ``FileDescriptorSet`` (``protoc --include_imports
        --descriptor_set_out``): Protobuf messages kept through Kryo in chill-protobuf's form
        are decoded as structs (docs/decoding.md, "Protobuf messages"); ``protobuf_messages``
        maps a Java class to its message (``{CLASS: "proto.full.Name"}``) where protoc's class
        naming does not find it.

        ``snapshot`` names a StateMeta snapshot file (default: ``_statequery_meta.msgpack`` next
        to ``_metadata``); it is used only if ``use_snapshot`` and it matches ``_metadata``.
        A matching snapshot of an older format is not used (with a
        :class:`~statequery.exceptions.SnapshotIgnoredWarning`): the model is derived again,
        keeping what the snapshot holds that cannot be derived (its plan, the job it was
        captured from: :class:`~statequery.metadata.statemeta.KeptParts`). ``rederive``: the
        same with a current snapshot, silently (what ``statequery snapshot`` does before writing
        it again). ``plan`` is the location of a Flink SQL compiled plan (JSON) of the job that
        took the savepoint: its column names replace ``f0, f1, ...`` (docs/decoding.md); a
        snapshot written with a plan brings its own.
        """
        from statequery.arrow.kryo import user_types

        types = user_types(classpath, protobuf_descriptors, protobuf_messages)
        io = io or FileIO(storage_options)
        metadata_location = find_metadata(io, location)
        data = io.new_input(metadata_location).read()
        meta = None
        kept: KeptParts | None = None
        if use_snapshot or rederive:
            snap_loc = snapshot or join_location(
                location_parent(metadata_location), SNAPSHOT_FILE_NAME
            )
            f = io.new_input(snap_loc)
            if f.exists():
                raw = f.read()
                try:
                    candidate = loads(raw, f.location)
                    if candidate.matches(data):
                        if rederive:
                            kept = KeptParts(FORMAT_VERSION, candidate.plan, candidate.job)
                        else:
                            meta = candidate
                    elif snapshot is not None and not rederive:
                        warnings.warn(
                            f"ignoring the StateMeta snapshot {f.location}: it was written for "
                            f"another _metadata than {metadata_location}; reading the "
                            "state-file headers instead", SnapshotIgnoredWarning, stacklevel=2,
                        )
                except SnapshotVersionError:
                    kept = _older_snapshot(raw, data, f.location, warn=not rederive)
                except CorruptStateError as e:  # damaged or tampered: derive from _metadata
                    warnings.warn(
                        f"ignoring the StateMeta snapshot, reading _metadata instead: {e}",
                        SnapshotIgnoredWarning,
                        stacklevel=2,
                    )
            elif snapshot is not None and not rederive:  # named, not there (a typo costs reads)
                warnings.warn(
                    f"no StateMeta snapshot at {f.location}: reading the state-file headers "
                    "instead", SnapshotIgnoredWarning, stacklevel=2,
                )
        compiled = None
        if plan is not None:
            f = io.new_input(plan)
            compiled = parse_plan(f.read(), f.location)
        elif kept is not None and kept.plan:
            compiled = parse_plan(
                kept.plan, f"the plan of the StateMeta snapshot (format {kept.format_version})"
            )
        job = kept.job if kept is not None else None
        # _metadata before version 5: Flink 1.x, whose KryoSerializer is Kryo 2.24
        flink_1x = len(data) >= 8 and int.from_bytes(data[4:8], "big", signed=True) < 5
        types = replace(types, kryo_2_24=flink_1x)
        return cls(io, metadata_location, data, meta, max_workers, compiled, job, types)

    def __repr__(self) -> str:
        return f"Savepoint({self.location!r})"

    def _repr_html_(self) -> str:
        """Jupyter: the savepoint, its operators, and its states with kinds, types and sizes."""
        from statequery.display import savepoint_html

        return savepoint_html(self.model)

    # -- metadata (the model: statequery.metadata.model) ------------------------------------------

    @property
    def metadata(self) -> CheckpointMetadata:
        """The parsed ``_metadata`` (parsed on first use)."""
        return self.model.metadata

    @property
    def meta(self) -> StateMeta:
        """The StateMeta model (from the snapshot, or derived once and cached), with the column
        names of the attached SQL plan (:attr:`sql_plan`)."""
        return self.model.meta

    @property
    def from_snapshot(self) -> bool:
        """Whether the model came from a StateMeta snapshot (else from ``_metadata``)."""
        return self.model.from_snapshot

    @property
    def sql_plan(self) -> CompiledPlan | None:
        """The Flink SQL compiled plan naming the job's columns (``open(plan=...)`` or the
        snapshot)."""
        return self.model.sql_plan

    @property
    def max_workers(self) -> int:
        return self.model.max_workers

    @property
    def plan_nodes(self) -> dict[str, PlanNode]:
        """operator id -> its node of the attached SQL plan (operators matched unambiguously)."""
        return self.model.plan_nodes

    @property
    def job(self) -> JobInfo | None:
        """The job this savepoint was captured from (``statequery capture``), from its StateMeta
        snapshot; None when it was not captured."""
        return self.model.job

    @property
    def fingerprint(self) -> str:
        """The SHA-256 (hex) of this savepoint's ``_metadata``: which savepoint this is."""
        return self.model.fingerprint

    @property
    def checkpoint_id(self) -> int:
        return self.meta.checkpoint_id

    @property
    def snapshot_type(self) -> str:
        return self.meta.snapshot_type

    @property
    def format(self) -> str | None:
        return self.meta.format

    @property
    def backend(self) -> str | None:
        return self.meta.backend

    @property
    def operators(self) -> tuple[OperatorInfo, ...]:
        return self.model.operators

    @property
    def states(self) -> tuple[StateInfo, ...]:
        return self.model.states

    def operator(self, identifier: Any) -> OperatorInfo:
        """The operator with this uid, OperatorID (hex) or name (uid first, as Flink resolves),
        or the operator of a record with an ``operator_id`` (a ``StateInfo``, an ``OperatorState``
        of ``_metadata``).

        Without a StateMeta snapshot only this operator's headers are read (once), not every
        state file of the savepoint.
        """
        return self.model.operator(identifier)

    def keyed_operators(self) -> list[OperatorInfo]:
        """The operators that have keyed state (their models)."""
        return self.model.keyed_operators()

    def state(self, operator_or_table: str, name: str | None = None) -> StateInfo:
        """A state by ``(operator, state name)`` or by its ``table_name``."""
        return self.model.state(operator_or_table, name)

    def table(self, name: str) -> StateInfo:
        """The state whose table is ``name`` (every front end resolves table names here): its
        ``table_name`` (any case), else a spelling a user may type, ``<operator uid, name or
        id>__<state>`` as a SQL identifier. Raises :class:`NoSuchTableError` listing the tables
        (with the closest one)."""
        return self.model.table(name)

    def state_meta(self) -> pa.Table:
        """One row per state (keyed, timers, operator list/union, broadcast): see the columns of
        :data:`STATE_META_COLUMNS`."""
        return self.model.state_meta(_pickled_columns, self._value_decoding)

    def _value_decoding(self, state: StateInfo) -> tuple[str, str | None]:
        """``state_meta``'s ``value_decoding``/``value_decoding_hint`` with this savepoint's
        read options (a Kryo value is ``kryo-classpath`` when the classpath types it)."""
        from statequery.arrow.kryo import is_kryo, value_decoding
        from statequery.metadata.decoding import value_decoding as default_value_decoding
        from statequery.serializers.spec import OpaqueSpec

        spec = state.value
        if not is_kryo(spec):
            return default_value_decoding(state)
        assert isinstance(spec, OpaqueSpec)
        decoding, hint = value_decoding(spec, self.context.classpath)
        return decoding, None if hint is None else f"{spec.type_class}: {hint}"

    # -- snapshot --------------------------------------------------------------------------------

    @property
    def default_snapshot_location(self) -> str:
        return join_location(self.location, SNAPSHOT_FILE_NAME)

    def write_snapshot(self, location: str | None = None, index: bool = False,
                       job: JobInfo | None = None) -> str:
        """Write the StateMeta snapshot (next to ``_metadata`` by default); returns where. The
        attached plan, if any, is kept in it. ``index``: also the run index of every canonical
        keyed stream (:meth:`index_runs` walks every key group not indexed yet). ``job``: the
        job it was captured from (:func:`statequery.capture.capture`; default: the job of the
        snapshot this savepoint was opened with, if any)."""
        derived = self.model.derived
        base = replace(derived, run_index=self.index_runs() if index else None,
                       job=job if job is not None else derived.job)
        if self.sql_plan is not None:
            base = replace(base, plan=self.sql_plan.text)
        return write_snapshot(self.io, location or self.default_snapshot_location, base)

    def index_runs(self) -> RunIndex:
        """Complete :attr:`run_index`: walk (without decoding) every key group of every
        canonical keyed stream that is not indexed yet; returns the index. Reads every such
        byte once (snappy key groups are decompressed)."""
        return scan.index_runs(self.model, self.context)

    # -- data (planned and executed by the scan layer, statequery.scan) --------------------------

    def plan(
        self,
        operator: StateInfo | str,
        state: str | None = None,
        keys: Sequence[Any] | None = None,
        key_groups: Iterable[int] | None = None,
        mode: str | None = None,
        split: int | None = None,
        pickled: bool = False,
    ) -> list[Any]:
        """The :class:`~statequery.scan.ScanTask` list that reads one state (see
        :func:`statequery.scan.plan`); run each with :func:`statequery.scan.execute`.
        ``pickled`` as in :meth:`read`."""
        info = self._resolve_state(operator, state)
        return scan.plan(
            self.model, self.context, info, keys=keys, key_groups=key_groups, mode=mode,
            split=split, pickled=pickled,
        )

    def close(self) -> None:
        """Close the open file handles of this savepoint's :class:`FileIO` and the RocksDB
        databases it kept open."""
        pool = self.context.open_databases
        if pool is not None:
            pool.close()
        self.io.close()

    def __enter__(self) -> Savepoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _resolve_state(self, state: StateInfo | str, name: str | None = None) -> StateInfo:
        return self.model.resolve_state(state, name)

    def read(
        self,
        operator: StateInfo | str,
        state: str | None = None,
        key: Any = None,
        key_groups: Iterable[int] | None = None,
        mode: str | None = None,
        pickled: bool = False,
        workers: int | None = None,
    ) -> pa.Table:
        """The rows of one state as a Table.

        ``operator`` is a uid, name or id (with ``state`` the state name), a ``table_name`` from
        :meth:`state_meta`, or a :class:`StateInfo`. ``key`` (a key as this method returns it,
        or its text form: :mod:`statequery.keys`) reads only the key group that can hold it and
        only its rows (an :class:`~statequery.exceptions.InvalidKeyError` when it does not fit the
        key type); ``key_groups`` restricts the read to those key groups; ``mode`` is ``rows``,
        ``flat`` (list elements) or ``nested`` (one map per key). Columns:
        :mod:`statequery.arrow.schemas`. For large states use :meth:`read_batches`.
        ``pickled``: add ``key_py``/``user_key_py``/``value_py`` (and ``*_py_reason``) after
        the columns of a bytes type, the Python values PyFlink pickled there as JSON text,
        decoded without running code (:func:`statequery.pickled.add_python_columns`); which
        columns get them depends on the state's types only (``state_meta``'s
        ``pickled_columns``).
        ``workers``: the processes a large read runs its key-group ranges in (None:
        ``$STATEQUERY_WORKERS``, else every core; 1: this process; small reads and lookups stay
        in this process): the same table (:mod:`statequery.parallel`).
        """
        info = self._resolve_state(operator, state)
        keys = None if key is None else [key]
        return scan.read_table(
            self.model, self.context, info, keys=keys, key_groups=key_groups, mode=mode,
            pickled=pickled, workers=workers,
        )

    def read_batches(
        self,
        operator: StateInfo | str,
        state: str | None = None,
        key: Any = None,
        key_groups: Iterable[int] | None = None,
        mode: str | None = None,
        batch_size: int = 65536,
        pickled: bool = False,
        workers: int | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Like :meth:`read`, streamed as RecordBatches (memory bounded by one coalesced read;
        with several ``workers``, by a few key-group ranges per worker); ``pickled`` and
        ``workers`` as in :meth:`read`."""
        info = self._resolve_state(operator, state)
        keys = None if key is None else [key]
        return scan.read_batches(
            self.model, self.context, info, keys=keys, key_groups=key_groups, mode=mode,
            batch_size=batch_size, pickled=pickled, workers=workers,
        )

    def operator_states(
        self, operator: Any, states: Iterable[str] | None = None, keyed_only: bool = False
    ) -> list[StateInfo]:
        """The states of one operator that :meth:`read_operator` reads: ``states`` (names or
        table names, in that order), or every readable one (keyed and operator list, union and
        broadcast state; ``keyed_only``: keyed state only)."""
        return self.model.operator_states(operator, states, keyed_only)

    def operator_tables(self) -> dict[str, str]:
        """``{operator table name: operator id}``: the operators whose keyed states can be read
        as one table in one pass (:mod:`statequery.optable`)."""
        from statequery.optable import operator_table_names

        return operator_table_names(self.meta)

    def operator_table_id(self, name: str) -> str | None:
        """The operator id of the operator table ``name`` (any case; :meth:`operator_tables`),
        None when ``name`` is no operator table: every front end resolves them here (state
        tables: :meth:`table`)."""
        return {k.lower(): v for k, v in self.operator_tables().items()}.get(name.lower())

    def operator_table(self, name: str, states: Iterable[str] | None = None) -> OperatorTable:
        """The :class:`~statequery.optable.OperatorTable` of an operator table name (see
        :meth:`operator_tables`) or an operator uid, name or id, over ``states`` (default: every
        keyed state). Read it with ``table.batches(sp.read_operator(...))``."""
        from statequery.optable import OperatorTable

        op_id = self.operator_table_id(name)
        operator = op_id if op_id is not None else name
        return OperatorTable(self.operator_states(operator, states, keyed_only=True))

    def read_operator(
        self,
        operator: Any,
        states: Iterable[str] | None = None,
        key: Any = None,
        key_groups: Iterable[int] | None = None,
        mode: str | None = None,
        batch_size: int = 65536,
        workers: int | None = None,
    ) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Several states of one operator in one pass: ``(state name, RecordBatch)`` pairs.

        ``states`` are state names or table names (None: every readable state; with ``key`` or
        ``key_groups``, every keyed state). Each key group of each subtask is read and walked
        once for all the keyed states (a RocksDB subtask restored once), where reading them one
        by one with :meth:`read_batches` walks it once per state. Batches of different states
        come interleaved; each state's batches have its own schema (:meth:`read`'s columns).
        ``workers`` as in :meth:`read` (each state's rows in the same order).
        """
        _, pairs = self._read_operator(operator, states, key, key_groups, mode, batch_size,
                                       workers)
        return pairs

    def _read_operator(
        self,
        operator: Any,
        states: Iterable[str] | None,
        key: Any,
        key_groups: Iterable[int] | None,
        mode: str | None,
        batch_size: int = 65536,
        workers: int | None = None,
    ) -> tuple[list[StateInfo], Iterator[tuple[str, pa.RecordBatch]]]:
        keyed_only = key is not None or key_groups is not None
        infos = self.operator_states(operator, states, keyed_only=keyed_only)
        keys = None if key is None else [key]
        pairs = scan.read_operator(
            self.model, self.context, infos, keys=keys, key_groups=key_groups, mode=mode,
            batch_size=batch_size, workers=workers,
        )
        return infos, pairs

    def read_states(
        self,
        operator: Any,
        states: Iterable[str] | None = None,
        key: Any = None,
        key_groups: Iterable[int] | None = None,
        mode: str | None = None,
        workers: int | None = None,
    ) -> dict[str, pa.Table]:
        """:meth:`read_operator` collected: ``{state name: Table}`` (every requested state, empty
        tables included)."""
        import pyarrow as pa

        from statequery.arrow.schemas import state_schema

        infos, pairs = self._read_operator(operator, states, key, key_groups, mode,
                                           workers=workers)
        batches: dict[str, list[pa.RecordBatch]] = {s.name: [] for s in infos}
        for name, batch in pairs:
            batches[name].append(batch)
        return {
            s.name: pa.Table.from_batches(batches[s.name], schema=state_schema(s, mode))
            for s in infos
        }

    def lookup(
        self, key: Any, operator: str | None = None, pickled: bool = False
    ) -> dict[tuple[str, str], pa.Table]:
        """Everything every keyed state holds for ``key``: ``{(operator, state): Table}``.

        Reads only the key group that can hold the key, computed as Flink computes it. ``operator``
        (uid, name or id) limits the search to one operator. ``key`` as :meth:`read` takes it;
        :class:`~statequery.exceptions.InvalidKeyError` when it does not fit the key type of the
        operator (or, without ``operator``, of any operator). ``pickled`` as in :meth:`read`.
        """
        from statequery.display import LookupResult

        found = scan.lookup(self.model, self.context, key, operator)
        if pickled:
            from statequery.pickled import add_python_columns

            found = {k: add_python_columns(t) for k, t in found.items()}
        result = LookupResult(found)
        result.key = key
        return result

    def diff(
        self,
        other: Savepoint | str,
        operator: str | None = None,
        state: str | None = None,
        key: Any = None,
        workers: int | None = None,
    ) -> pa.Table:
        """What changed from this savepoint to ``other`` (a Savepoint or a path): one row per
        added, removed or changed entry, see :mod:`statequery.diff` for the columns.

        Operators are paired by uid/id and states by name; ``operator``, ``state`` (name or
        table name) and ``key`` restrict the comparison. Keyed state is compared key-group range
        by key-group range (memory bounded by one range). For large states use
        :func:`statequery.diff.diff_batches`. ``workers`` as in :meth:`read`: a large diff
        compares its key-group ranges in that many processes (the same rows, in the same order).
        """
        from statequery.diff import DIFF_SCHEMA, diff_table
        from statequery.parallel import ordered_map, resolve_workers

        new = other if isinstance(other, Savepoint) else Savepoint.open(other, io=self.io)
        n = resolve_workers(workers)
        items = _diff_pieces(self, new, operator, state, n) if n > 1 and key is None else None
        if items is None:
            return diff_table(self, new, operator=operator, state=state, key=key)
        import pyarrow as pa

        from statequery.diff import diff_batches

        # operator state and schema rows here, then the keyed ranges in the workers, in order
        batches = list(diff_batches(self, new, operator, state, key_groups=()))
        here = partial(_diff_piece, sides={self.metadata_location: self,
                                           new.metadata_location: new})
        batches.extend(b for _, b in ordered_map(_diff_piece, items, n, local=here))
        return pa.Table.from_batches(batches, schema=DIFF_SCHEMA)

    def stats(
        self, operator: str | None = None, state: str | None = None, top: int = 10,
        workers: int | None = None,
    ) -> StateStats:
        """Entries, distinct keys and serialized bytes per state and key group (``.table``, the
        ``state_stats`` table), the ``top`` heaviest keys per state (``.heaviest_keys``) and
        ``.skew(parallelism)``: see :mod:`statequery.stats`. One pass per key-group range.
        ``workers`` as in :meth:`read`: the ranges of large keyed states in that many processes
        (the same tables)."""
        from statequery.parallel import resolve_workers
        from statequery.stats import state_stats

        n = resolve_workers(workers)
        pieces = _stats_pieces(self, operator, state, top, n) if n > 1 else None
        if pieces is None:
            return state_stats(self, operator=operator, state=state, top=top)
        return _parallel_stats(self, operator, state, top, pieces, n)

    def source_splits(self, operator: str, source: str | None = None) -> pa.Table:
        """The splits of a FLIP-27 source operator as typed rows (where the job resumes
        reading): see :mod:`statequery.sources`."""
        from statequery.sources import source_splits

        return source_splits(self, operator, source)

    def key_group_of(self, state: StateInfo | str, key: Any, name: str | None = None) -> int:
        """The key group Flink assigned to ``key`` in this state's operator
        (:func:`statequery.keys.resolve_key`: the spellings every ``key=`` accepts)."""
        return scan.state_key_group(self._resolve_state(state, name), key)


#: a worker's savepoints, by ``_metadata`` location (statequery.parallel: a diff's pieces)
_WORKER_SAVEPOINTS: dict[str, Savepoint] = {}

#: one piece of a parallel diff: both sides (``_metadata`` location and FileIO), the operator
#: id, the ``state`` filter and the key groups
_DiffPiece = tuple[str, FileIO, str, FileIO, str, "str | None", tuple[int, ...]]


def _diff_pieces(
    old: Savepoint, new: Savepoint, operator: str | None, state: str | None, workers: int
) -> list[_DiffPiece] | None:
    """The keyed key-group ranges of a diff, cut into pieces for ``workers`` processes in the
    order :func:`statequery.diff.diff_batches` walks them; None when the diff stays in this
    process (small, a side with a SQL plan given at open, max parallelism differing)."""
    from statequery import parallel
    from statequery.diff import DEFAULT_RANGE_SIZE, key_group_ranges, state_pairs

    if any(sp.sql_plan is not None and not sp.from_snapshot for sp in (old, new)):
        return None  # a worker opens each side again: only what the files say
    by_op: dict[str, list[Any]] = {}
    for p in state_pairs(old, new, operator, state):
        s = p.new or p.old
        if s is not None and s.keyed:
            by_op.setdefault(p.operator_id, []).append(p)
    total = _keyed_bytes(old, set(by_op)) + _keyed_bytes(new, set(by_op))
    if total < parallel.MIN_PARALLEL_BYTES:
        return None
    out: list[_DiffPiece] = []
    for op_id, pairs in by_op.items():
        ranges = key_group_ranges(old, new, pairs, DEFAULT_RANGE_SIZE)
        if ranges is None:
            return None
        step = max(1, -(-len(ranges) // (workers * parallel.PIECES_PER_WORKER)))
        for i in range(0, len(ranges), step):
            kgs = tuple(kg for r in ranges[i:i + step] for kg in r)
            out.append((old.metadata_location, old.io, new.metadata_location, new.io, op_id,
                        state, kgs))
    return out if len(out) > 1 else None


def _keyed_bytes(sp: Savepoint, operator_ids: set[str]) -> int:
    """The bytes of the keyed state files of these operators."""
    total = 0
    for op in sp.model.operators:
        if op.operator_id in operator_ids:
            for st in op.subtasks:
                h = st.keyed_handle
                if h is not None:
                    total += sum(x.size or 0 for x in h.stream_handles())
    return total


#: one piece of parallel statistics: the savepoint (``_metadata`` location and FileIO), the
#: operator id, the ``state`` filter, ``top``, the piece's index and its key groups
_StatsPiece = tuple[str, FileIO, str, "str | None", int, int, tuple[int, ...]]


def _stats_pieces(
    sp: Savepoint, operator: str | None, state: str | None, top: int, workers: int
) -> list[_StatsPiece] | None:
    """The keyed key-group ranges :func:`statequery.stats.state_stats` walks, cut into pieces
    for ``workers`` processes in its order; None when the statistics stay in this process."""
    from statequery import parallel
    from statequery.stats import DEFAULT_RANGE_SIZE, key_group_tasks

    if sp.sql_plan is not None and not sp.from_snapshot:
        return None  # a worker opens the savepoint again: only what the files say
    tasks = key_group_tasks(sp, operator, state, DEFAULT_RANGE_SIZE)
    by_op: dict[str, list[list[int]]] = {}
    for op_id, groups in tasks:
        by_op.setdefault(op_id, []).append(groups)
    if _keyed_bytes(sp, set(by_op)) < parallel.MIN_PARALLEL_BYTES:
        return None
    out: list[_StatsPiece] = []
    for op_id, ranges in by_op.items():
        step = max(1, -(-len(ranges) // (workers * parallel.PIECES_PER_WORKER)))
        for i in range(0, len(ranges), step):
            kgs = tuple(kg for r in ranges[i:i + step] for kg in r)
            out.append((sp.metadata_location, sp.io, op_id, state, top, len(out), kgs))
    return out if len(out) > 1 else None


def _stats_piece(
    piece: _StatsPiece, sides: dict[str, Savepoint] | None = None
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """In a worker: the statistics rows and heaviest keys of one operator's keyed states in
    some key groups (``table:<piece>``, ``keys:<piece>``). ``sides``: the caller's open
    savepoints by location (its own share of the pieces)."""
    from statequery.stats import state_stats

    loc, io, op_id, state, top, index, kgs = piece
    st = state_stats(_worker_savepoint(loc, io, sides), op_id, state, top=top, key_groups=kgs,
                     operator_state=False)
    for name, table in ((f"table:{index}", st.table), (f"keys:{index}", st.heaviest_keys)):
        for batch in table.to_batches():
            yield name, batch


def _parallel_stats(
    sp: Savepoint, operator: str | None, state: str | None, top: int,
    pieces: list[_StatsPiece], workers: int,
) -> StateStats:
    """:func:`statequery.stats.state_stats` with its keyed ranges in ``workers`` processes:
    each state's rows in range order, its heaviest keys the ``top`` of every piece's by weight,
    the first seen first among equal weights (as one pass keeps them)."""
    import pyarrow as pa

    from statequery.parallel import ordered_map
    from statequery.stats import HEAVIEST_KEYS_SCHEMA, STATE_STATS_SCHEMA, StateStats, state_stats

    base = state_stats(sp, operator, state, top=top, key_groups=())  # operator state, the order
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {k: [] for k in base.max_parallelism}
    keys: dict[tuple[str, str], list[tuple[int, int, int, dict[str, Any]]]] = {
        k: [] for k in base.max_parallelism
    }
    for r in base.table.to_pylist():
        rows[(r["operator_id"], r["state"])].append(r)
    seen = 0
    here = partial(_stats_piece, sides={sp.metadata_location: sp})
    for name, batch in ordered_map(_stats_piece, pieces, workers, local=here):
        kind, index = name.split(":")
        for r in batch.to_pylist():
            k = (r["operator_id"], r["state"])
            if kind == "table":
                rows[k].append(r)
            else:
                weight = r["bytes"] if r["bytes"] is not None else r["entries"]
                seen += 1
                keys[k].append((-weight, int(index), seen, r))
    table_rows = [r for k in rows for r in rows[k]]
    key_rows = [r for k in keys for *_, r in sorted(keys[k], key=lambda t: t[:3])[:top]]
    return StateStats(
        pa.Table.from_pylist(table_rows, schema=STATE_STATS_SCHEMA),
        pa.Table.from_pylist(key_rows, schema=HEAVIEST_KEYS_SCHEMA),
        base.max_parallelism,
        base.parallelism,
    )


def _worker_savepoint(
    location: str, io: FileIO, sides: dict[str, Savepoint] | None = None
) -> Savepoint:
    if sides is not None and location in sides:
        return sides[location]
    sp = _WORKER_SAVEPOINTS.get(location)
    if sp is None:
        if len(_WORKER_SAVEPOINTS) >= 4:
            _WORKER_SAVEPOINTS.pop(next(iter(_WORKER_SAVEPOINTS))).close()
        sp = _WORKER_SAVEPOINTS[location] = Savepoint.open(location, io=io)
    return sp


def _diff_piece(
    piece: _DiffPiece, sides: dict[str, Savepoint] | None = None
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """In a worker: the diff rows of one operator's keyed states in some key groups.
    ``sides``: the caller's open savepoints by location (its own share of the pieces)."""
    from statequery.diff import diff_batches

    old_loc, old_io, new_loc, new_io, op_id, state, kgs = piece
    old = _worker_savepoint(old_loc, old_io, sides)
    new = _worker_savepoint(new_loc, new_io, sides)
    for batch in diff_batches(old, new, op_id, state, key_groups=kgs, operator_state=False):
        yield "diff", batch


def _older_snapshot(raw: bytes, metadata: bytes, source: str, warn: bool) -> KeptParts | None:
    """What a snapshot of another format keeps (:func:`kept_parts`), with a warning saying the
    model is derived again and what is kept; None (and silence) for a snapshot of a newer format
    or of another ``_metadata``."""
    try:
        kept = kept_parts(raw, metadata, source)
    except CorruptStateError as e:
        warnings.warn(
            f"ignoring the StateMeta snapshot, reading _metadata instead: {e}",
            SnapshotIgnoredWarning,
            stacklevel=3,
        )
        return None
    if kept is not None and warn:
        parts = [p for p, v in (("SQL plan", kept.plan), ("captured job", kept.job)) if v]
        warnings.warn(
            f"{source}: StateMeta snapshot format {kept.format_version}, this statequery writes "
            f"{FORMAT_VERSION}: the states are derived from _metadata and the state-file headers"
            + (f", keeping its {' and '.join(parts)}" if parts else "")
            + "; `statequery snapshot` writes it again in the current format",
            SnapshotIgnoredWarning,
            stacklevel=3,
        )
    return kept


def _pickled_columns(state: StateInfo) -> list[str]:
    """The columns of the state's rows that hold bytes (a PyFlink job's pickles, maybe): what a
    ``pickled`` read renders (``state_meta.pickled_columns``). From the types only (no state
    data is read)."""
    from statequery.arrow.schemas import state_schema
    from statequery.metadata.kinds import OPERATOR_KINDS
    from statequery.pickled import pickled_columns

    layout = state
    if not (layout.keyed_rows or layout.kind in OPERATOR_KINDS):
        return []
    try:
        return pickled_columns(state_schema(layout))
    except StatequeryError:  # no rows to read (its reason says why)
        return []
