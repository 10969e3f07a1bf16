"""The scan layer: a read is planned into small tasks, and a task is executed into Arrow batches
(after pyiceberg's ``DataScan.plan_files()`` -> tasks -> ``ArrowScan``).

* :func:`plan` (``state``, ``keys``, ``key_groups``, ``mode``) -> :class:`ScanTask` list. A keyed
  task is a key-group range of one subtask's keyed handle, with the header facts its backend needs
  (compression, the header's states in id order) and the byte ranges it will read; an operator
  task is one subtask's operator-state stream. Tasks are frozen dataclasses of plain data and
  handles: they pickle (Spark ships them to executors) and need no savepoint object to run.
* :func:`execute` (task) -> ``(state name, RecordBatch)`` stream, reading through one
  :class:`~statequery.io.FileIO` (one open per file, adjacent key groups in one ranged read).
* :func:`key_group_for` is where a key becomes a key group (every front end asks here).

Everything a plan needs comes from the model
(:class:`~statequery.metadata.model.SavepointModel`, or one operator's part of it: with a StateMeta
snapshot present, no header byte is read again) and a :class:`ReadContext` (how the bytes are
reached); the planner never sees the ``Savepoint`` front. :meth:`Savepoint.read`,
:meth:`~Savepoint.read_batches`, :meth:`~Savepoint.lookup`, ``statequery.sql``, the CLI and the
Spark source all go through here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from statequery.arrow.batches import BatchBuilder, split_batch
from statequery.arrow.schemas import resolve_mode, state_schema
from statequery.exceptions import (
    CorruptStateError,
    InvalidKeyError,
    InvalidOptionError,
    UnsupportedFormatError,
)
from statequery.hashing import split_key_groups
from statequery.io import FileIO
from statequery.keys import ResolvedKey
from statequery.metadata.handles import (
    HandleResolver,
    KeyedHandle,
    KeyGroupsHandle,
    OperatorStreamHandle,
    StreamHandle,
)
from statequery.metadata.runindex import IndexedRuns, RunIndex, Runs, runs_of
from statequery.metadata.state import StateInfo
from statequery.serializers.spec import SerializerSpec
from statequery.serializers.usertypes import UserTypes

if TYPE_CHECKING:
    from statequery.backends.base import StateScanner
    from statequery.backends.pool import OpenDatabases
    from statequery.backends.registry import BackendKind
    from statequery.metadata.model import SavepointModel
    from statequery.metadata.statemeta import OperatorInfo, SubtaskInfo

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "ReadContext",
    "ScanTask",
    "StateSource",
    "execute",
    "index_runs",
    "key_group_for",
    "lookup",
    "normalize_key",
    "plan",
    "plan_states",
    "read_batches",
    "read_operator",
    "read_schema",
    "read_table",
    "run_tasks",
]

DEFAULT_BATCH_SIZE = 65536


def read_schema(
    layout: StateInfo,
    mode: str | None = None,
    pickled: bool = False,
    classpath: UserTypes | None = None,
) -> pa.Schema:
    """The schema of a read of a state: :func:`~statequery.arrow.schemas.state_schema`, its
    Kryo columns as structs when the job's ``classpath`` types them
    (:func:`statequery.arrow.kryo.kryo_schema`), with the ``*_py`` columns after its bytes
    columns when ``pickled`` (:func:`statequery.pickled.python_schema`)."""
    schema = state_schema(layout, mode)
    if classpath:
        from statequery.arrow.kryo import kryo_schema

        schema = kryo_schema(schema, layout, classpath)
    if pickled:
        from statequery.pickled import python_schema

        schema = python_schema(schema)
    return schema


@dataclass(frozen=True)
class ReadContext:
    """How a read reaches the bytes of one savepoint: the handle ``resolver`` (its
    :class:`~statequery.io.FileIO` and the ``_metadata`` directory relative handles resolve
    against), the ``run_index`` the planner reads only the wanted runs with and whole walks record
    into (:mod:`statequery.metadata.runindex`; None: none), and the pool of restored RocksDB
    databases kept open between reads (``open_databases``; None: each scan opens and closes its
    own). A :class:`~statequery.savepoint.Savepoint` holds one; an executor makes one from its
    ``FileIO`` (:meth:`of`)."""

    resolver: HandleResolver
    run_index: RunIndex | None = None
    open_databases: OpenDatabases | None = None
    #: the job's jars (or class directories) Kryo values are decoded with
    #: (:mod:`statequery.arrow.kryo`); empty: Kryo values stay bytes
    classpath: UserTypes = UserTypes()

    @property
    def io(self) -> FileIO:
        return self.resolver.io

    @classmethod
    def of(cls, io: FileIO, metadata_dir: str) -> ReadContext:
        """A context without run index or database pool (an executor's)."""
        return cls(HandleResolver(io, metadata_dir))


class StateSource(Protocol):
    """What the operations over a savepoint's states (:mod:`statequery.diff`,
    :mod:`statequery.stats`, :mod:`statequery.sources`, :mod:`statequery.display`) need: its
    model and its read context. :class:`~statequery.savepoint.Savepoint` is one."""

    @property
    def model(self) -> SavepointModel: ...

    @property
    def context(self) -> ReadContext: ...


@dataclass(frozen=True)
class ScanTask:
    """One unit of work over one subtask's state.

    ``states`` are the layouts of the subtask header's states in state-id order (keyed: the
    backends need them to walk the stream; operator: the one state); ``wanted`` the states whose
    rows the task returns. ``key_groups`` None means every key group of the handle; ``keys``
    (:class:`~statequery.keys.ResolvedKey`) keep only those keys' rows. ``byte_ranges`` are
    the ``(start, end)`` stream offsets the task reads (canonical and hashmap layouts; empty
    when not known up front).
    ``runs``: the run index of the task's key groups for its wanted states (canonical layout,
    when the savepoint has one, :mod:`statequery.metadata.runindex`): an uncompressed stream
    then reads only those runs, and ``byte_ranges`` are theirs. A task whose ``wanted`` is
    widened beyond ``runs.states`` walks its key groups whole.
    """

    operator: str
    operator_id: str
    subtask: int
    metadata_dir: str
    handle: KeyedHandle | OperatorStreamHandle
    states: tuple[StateInfo, ...]
    wanted: tuple[str, ...]
    max_parallelism: int
    compressed: bool = False
    key_serializer: SerializerSpec | None = None
    key_groups: tuple[int, ...] | None = None
    keys: tuple[ResolvedKey, ...] | None = None
    mode: str | None = None
    byte_ranges: tuple[tuple[int, int], ...] = ()
    runs: IndexedRuns | None = None
    #: the handle is the subtask's raw keyed stream (heap timers of a RocksDB checkpoint)
    raw: bool = False
    #: the backend that reads the handle, decided at planning from the model
    #: (:func:`~statequery.backends.registry.keyed_backend_kind`); executing only opens it
    backend: BackendKind = "operator"
    #: also the ``*_py`` columns: PyFlink's pickles in byte columns as JSON text
    #: (:func:`statequery.pickled.add_python_columns`)
    pickled: bool = False
    #: the job's jars: Kryo columns decoded with their classes (:mod:`statequery.arrow.kryo`)
    classpath: UserTypes = UserTypes()

    @property
    def keyed(self) -> bool:
        return not isinstance(self.handle, OperatorStreamHandle)

    def layout(self, name: str) -> StateInfo:
        for layout in self.states:
            if layout.name == name:
                return layout
        raise KeyError(name)

    def schema(self, name: str | None = None) -> pa.Schema:
        return read_schema(self.layout(name or self.wanted[0]), self.mode, self.pickled,
                           self.classpath)


# -- keys ----------------------------------------------------------------------------------------


def normalize_key(key: Any, spec: SerializerSpec | None) -> Any:
    """The user's key as the readers return it (dicts for rows and tuples):
    :func:`statequery.keys.convert_key`."""
    from statequery.keys import convert_key

    return convert_key(key, spec)


def resolve_keys(
    keys: Sequence[Any], spec: SerializerSpec | None, max_parallelism: int
) -> tuple[ResolvedKey, ...]:
    """Each of ``keys`` through :func:`statequery.keys.resolve_key` (duplicates dropped)."""
    from statequery.keys import resolve_key

    out: list[ResolvedKey] = []
    for k in keys:
        r = resolve_key(k, spec, max_parallelism)
        if r not in out:
            out.append(r)
    return tuple(out)


def key_group_for(key: Any, spec: SerializerSpec | None, max_parallelism: int) -> int | None:
    """The key group Flink assigns ``key`` to (:func:`statequery.keys.resolve_key`); None when
    it cannot be computed (POJO keys: then every key group is read and rows are filtered by
    key)."""
    from statequery.keys import resolve_key

    return resolve_key(key, spec, max_parallelism).key_group


def state_key_group(state: StateInfo, key: Any) -> int:
    """The key group Flink assigned ``key`` in ``state``'s operator
    (:func:`statequery.keys.resolve_key`: the spellings every ``key=`` accepts)."""
    from statequery.hashing import key_group_of
    from statequery.keys import resolve_key

    kg = resolve_key(key, state.key_spec, state.max_parallelism).key_group
    if kg is None:  # a user hashCode: the refusal names it
        return key_group_of(key, state.max_parallelism, state.key_spec)
    return kg


def _key_group_set(key_groups: Iterable[Any]) -> set[int]:
    try:
        return {int(k) for k in key_groups}
    except (TypeError, ValueError) as e:
        raise InvalidOptionError(f"key_groups must be integers: {e}") from None


# -- planning ------------------------------------------------------------------------------------


def _header_order(op: OperatorInfo, ids: dict[str, int]) -> tuple[StateInfo, ...]:
    by_name = {s.name: s for s in op.states}
    out = []
    for name, _ in sorted(ids.items(), key=lambda t: t[1]):
        info = by_name.get(name)
        out.append(info if info is not None else StateInfo(name, "unknown"))
    return tuple(out)


def _byte_ranges(
    handle: Any,
    key_groups: Sequence[int] | None,
    indexed: dict[int, Runs] | None = None,
    gap: int = 0,
) -> tuple[tuple[int, int], ...]:
    """Adjacent spans of the bytes a task reads (the last one open-ended: -1) of a key-groups
    handle: the key groups', or for key groups in ``indexed`` (an uncompressed stream's run
    index) only their runs, each from its state id on (runs at most ``gap`` bytes apart are
    read as one span, as :func:`~statequery.backends.keygroups.read_key_group_spans` does)."""
    if not isinstance(handle, KeyGroupsHandle):
        return ()
    starts = sorted(
        (o, handle.start_key_group + i) for i, o in enumerate(handle.offsets) if o > 0
    )
    wanted = None if key_groups is None else set(key_groups)
    spans: list[tuple[int, int]] = []
    for n, (start, kg) in enumerate(starts):
        if wanted is not None and kg not in wanted:
            continue
        end = starts[n + 1][0] if n + 1 < len(starts) else -1
        flat = None if indexed is None else indexed.get(kg)
        if flat is None:
            parts = [(start, end)]
        else:
            parts = [
                (start + flat[i + 1] - 2, start + flat[i + 1] + flat[i + 2])
                for i in range(0, len(flat) - 2, 3)
            ]
        for a, b in parts:
            if spans and spans[-1][1] != -1 and 0 <= a - spans[-1][1] <= gap:
                spans[-1] = (spans[-1][0], b)
            else:
                spans.append((a, b))
    return tuple(spans)


def _handle_runs(
    ctx: ReadContext, op: OperatorInfo, st: SubtaskInfo, backend: BackendKind
) -> Mapping[int, Sequence[int]]:
    """The context's run index of one subtask's canonical keyed handle (empty: none)."""
    index = ctx.run_index
    if index is None or backend != "canonical":
        return {}
    return index.runs(op.operator_id, st.index)


def _task_runs(
    indexed: Mapping[int, Sequence[int]],
    st: SubtaskInfo,
    groups: tuple[int, ...] | None,
    names: Sequence[str],
    state_ids: dict[str, int],
) -> IndexedRuns | None:
    """The runs of ``names`` in the key groups ``groups`` (None: the subtask's) the index has.
    A key group where every run is wanted is left out (walked whole, as without an index):
    the runs would skip nothing and only add the check of each run against the bytes (a
    second walk: a full scan of an open savepoint cost 40 % more the second time)."""
    if not indexed or st.key_groups is None:
        return None
    r = st.key_groups
    kgs = groups if groups is not None else range(r.start, r.end + 1)
    sids = [state_ids[n] for n in names]
    pairs: list[tuple[int, Runs]] = []
    for kg in kgs:
        every = indexed.get(kg)
        if every is None:
            continue
        mine = runs_of(every, sids)
        if mine and len(mine) == len(every):
            continue
        pairs.append((kg, mine))
    return IndexedRuns(tuple(names), tuple(pairs)) if pairs else None


def plan(
    model: SavepointModel,
    ctx: ReadContext,
    state: StateInfo,
    *,
    keys: Sequence[Any] | None = None,
    key_groups: Iterable[int] | None = None,
    mode: str | None = None,
    split: int | None = None,
    pickled: bool = False,
) -> list[ScanTask]:
    """The tasks that read ``state``: keyed state one per subtask handle holding wanted key
    groups (``split`` cuts a handle's range into tasks of at most that many key groups);
    operator state one per subtask stream holding it (broadcast: the first copy only).

    ``keys`` restricts keyed state to those keys (their key groups only), ``key_groups`` to
    those key groups; both are errors for operator state. ``pickled``: the tasks' batches have
    the ``*_py`` columns too (:attr:`ScanTask.pickled`).
    """
    layout = state
    resolve_mode(layout, mode)
    _check_readable(state)
    if not layout.keyed_rows:
        if keys is not None or key_groups is not None:
            raise InvalidOptionError(f"state {state.name!r} is operator state: it has no keys")
        op = model.operator(state.operator_id)
        tasks = _plan_operator(op, layout, op.display_name, ctx.resolver.metadata_dir)
    else:
        tasks = plan_states(
            model, ctx, [state], keys=keys, key_groups=key_groups, mode=mode, split=split
        )
    if ctx.classpath:  # Kryo values decoded with the job's classes (the state reads only:
        # read_operator, diff and stats keep them bytes)
        tasks = [replace(t, classpath=ctx.classpath) for t in tasks]
    return [replace(t, pickled=True) for t in tasks] if pickled else tasks


def _check_readable(state: StateInfo) -> None:
    layout = state
    if not (layout.keyed_rows or layout.kind in ("operator_list", "operator_union", "broadcast")):
        raise UnsupportedFormatError(
            state.reason or f"state {state.name!r} ({layout.kind}) is not readable as rows"
        )


def plan_states(
    model: SavepointModel,
    ctx: ReadContext,
    states: Sequence[StateInfo],
    *,
    keys: Sequence[Any] | None = None,
    key_groups: Iterable[int] | None = None,
    mode: str | None = None,
    split: int | None = None,
) -> list[ScanTask]:
    """The tasks that read several keyed ``states`` of one operator in one pass: one task per
    subtask handle (and ``split`` range) whose header holds any of them, ``wanted`` naming the
    states it holds. :func:`execute` walks each key group once for all of them and yields
    ``(state name, batch)`` pairs. ``keys``, ``key_groups`` and ``mode`` as in :func:`plan`.
    Each task names the backend that reads its handle (decided here, once, from the model)."""
    from statequery.backends.base import KeyedContext
    from statequery.backends.registry import keyed_backend_kind

    if not states:
        return []
    operator_ids = {s.operator_id for s in states}
    if len(operator_ids) != 1:
        raise InvalidOptionError("plan_states reads the states of one operator")
    for s in states:
        _check_readable(s)
        if not s.keyed_rows:
            raise InvalidOptionError(
                f"state {s.name!r} is operator state: plan it with plan(), not plan_states()"
            )
        resolve_mode(s, mode)
    op = model.operator(states[0].operator_id)
    wanted: set[int] | None = None if key_groups is None else _key_group_set(key_groups)
    normalized: tuple[ResolvedKey, ...] | None = None
    if keys is not None:
        normalized = resolve_keys(keys, _operator_key_spec(states), op.max_parallelism)
        groups = {k.key_group for k in normalized}
        if None not in groups:
            kgs = {g for g in groups if g is not None}
            wanted = kgs if wanted is None else wanted & kgs
    names = [s.name for s in states if s.stream != "raw_keyed"]
    raw_names = [s.name for s in states if s.stream == "raw_keyed"]
    tasks: list[ScanTask] = []
    for st in sorted(op.subtasks, key=lambda s: s.index):
        task_groups = _subtask_key_groups(st, wanted)
        if task_groups == ():
            continue
        if raw_names:
            tasks.extend(_plan_raw_keyed(ctx, op, st, raw_names, task_groups, normalized,
                                         mode, split))
        header, keyed_handle = st.keyed_header, st.keyed_handle
        held = tuple(n for n in names if header is not None and n in header.state_ids)
        if header is None or not held or keyed_handle is None:
            continue
        order = _header_order(op, header.state_ids)
        backend = keyed_backend_kind(
            keyed_handle,
            header.layout,
            KeyedContext(ctx.resolver, op.max_parallelism, op.display_name),
            header.compressed,
            len(order),
        )
        base = ScanTask(
            operator=op.display_name,
            operator_id=op.operator_id,
            subtask=st.index,
            metadata_dir=ctx.resolver.metadata_dir,
            handle=keyed_handle,
            states=order,
            wanted=held,
            max_parallelism=op.max_parallelism,
            compressed=header.compressed,
            key_serializer=op.key_spec,
            keys=normalized,
            mode=mode,
            backend=backend,
        )
        indexed = _handle_runs(ctx, op, st, backend)
        gap = _read_gap(ctx, st) if indexed else 0
        for chunk in _chunks(st, task_groups, split):
            runs = _task_runs(indexed, st, chunk, held, header.state_ids)
            tasks.append(_with_groups(base, chunk, runs, gap))
    return tasks


def _plan_raw_keyed(
    ctx: ReadContext,
    op: OperatorInfo,
    st: SubtaskInfo,
    names: list[str],
    groups: tuple[int, ...] | None,
    keys: tuple[Any, ...] | None,
    mode: str | None,
    split: int | None,
) -> Iterator[ScanTask]:
    """The tasks over one subtask's raw keyed stream (heap timers of a RocksDB checkpoint)."""
    header = st.raw_keyed_header
    handle = st.raw_keyed_handle
    if header is None or not isinstance(handle, KeyGroupsHandle):
        return
    if header.error is not None:
        # this subtask's stream did not parse as timers while the operator's others did
        raise CorruptStateError(
            f"raw keyed state of subtask {st.index}: {header.error}",
            ctx.resolver.source_name(handle.delegate),
        )
    # every subtask is walked, also one whose first key group declared none of the wanted
    # services: each key group is checked against the services its subtask's header declared
    held = tuple(names)
    declared = _header_order(op, header.state_ids)
    by_name = {s.name: s for s in op.states}
    undeclared = tuple(by_name[n] for n in held if n not in header.state_ids)
    base = ScanTask(
        operator=op.display_name,
        operator_id=op.operator_id,
        subtask=st.index,
        metadata_dir=ctx.resolver.metadata_dir,
        handle=handle,
        states=declared + undeclared,
        wanted=held,
        max_parallelism=op.max_parallelism,
        key_serializer=op.key_spec,
        keys=keys,
        mode=mode,
        raw=True,
        backend="raw_timers",
    )
    for chunk in _chunks(st, groups, split):
        yield _with_groups(base, chunk)


def _operator_key_spec(states: Sequence[StateInfo]) -> SerializerSpec | None:
    """The key type of an operator's keyed states (timers name it inside their TimerSpec)."""
    for s in states:
        if not s.is_timer:
            return s.key
    return states[0].key


def _subtask_key_groups(st: SubtaskInfo, wanted: set[int] | None) -> tuple[int, ...] | None:
    """The subtask's wanted key groups: None for all of them, ``()`` for none."""
    if (st.keyed_handle is None and st.raw_keyed_handle is None) or st.key_groups is None:
        return ()
    if wanted is None:
        return None
    r = st.key_groups
    return tuple(sorted(kg for kg in wanted if r.start <= kg <= r.end))


def _chunks(
    st: SubtaskInfo, groups: tuple[int, ...] | None, split: int | None
) -> Iterator[tuple[int, ...] | None]:
    if split is None or split <= 0:
        yield groups
        return
    r = st.key_groups
    assert r is not None
    every = groups if groups is not None else tuple(range(r.start, r.end + 1))
    if len(every) <= split:
        yield groups
        return
    for piece in split_key_groups(every, split):
        yield tuple(piece)


def _with_groups(
    base: ScanTask, groups: tuple[int, ...] | None, runs: IndexedRuns | None = None, gap: int = 0
) -> ScanTask:
    from dataclasses import replace

    indexed = None if runs is None or base.compressed else runs.by_key_group()
    return replace(
        base,
        key_groups=groups,
        byte_ranges=_byte_ranges(base.handle, groups, indexed, gap),
        runs=runs,
    )


def _read_gap(ctx: ReadContext, st: SubtaskInfo) -> int:
    from statequery.backends.keygroups import read_gap
    from statequery.exceptions import StorageError

    try:
        handle = st.keyed_handle
        return read_gap(ctx.resolver.location(handle)) if isinstance(handle, StreamHandle) else 0
    except StorageError:
        return 0


def _plan_operator(
    op: OperatorInfo, layout: StateInfo, label: str, directory: str
) -> list[ScanTask]:
    tasks = []
    for st in sorted(op.subtasks, key=lambda s: s.index):
        handle = st.operator_handle
        if handle is None:
            continue
        part = handle.partition(layout.name)
        if part is None or not part.offsets:
            continue
        header = st.operator_header
        tasks.append(
            ScanTask(
                operator=label,
                operator_id=op.operator_id,
                subtask=st.index,
                metadata_dir=directory,
                handle=handle,
                states=(layout,),
                wanted=(layout.name,),
                max_parallelism=op.max_parallelism,
                compressed=bool(header.compressed) if header is not None else False,
            )
        )
        if layout.kind == "broadcast":
            break  # every subtask holds a full copy: the first one is the state
    return tasks


# -- execution -----------------------------------------------------------------------------------


def execute(
    task: ScanTask,
    ctx: ReadContext | FileIO | None = None,
    *,
    resolver: HandleResolver | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Run one task: ``(state name, batch)`` pairs of at most ``batch_size`` rows, streamed (the
    bytes are read as the batches are consumed). ``ctx`` (a savepoint's :class:`ReadContext`)
    or a :class:`FileIO` (an executor's) reads the bytes; ``resolver`` alone: a context of it."""
    if batch_size <= 0:
        raise InvalidOptionError(f"batch_size must be positive, got {batch_size}")
    if not isinstance(ctx, ReadContext):
        ctx = ReadContext(resolver) if resolver is not None else ReadContext.of(
            ctx or FileIO(), task.metadata_dir
        )
    pairs = (_execute_operator(task, ctx.resolver, batch_size) if task.backend == "operator"
             else _execute_keyed(task, ctx, batch_size))
    if task.classpath:
        pairs = _decode_kryo(task, pairs)
    if not task.pickled:
        yield from pairs
        return
    from statequery.pickled import add_python_columns

    for name, batch in pairs:
        yield name, add_python_columns(batch)


def _decode_kryo(
    task: ScanTask, pairs: Iterator[tuple[str, pa.RecordBatch]]
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The Kryo columns of the task's batches decoded with its classpath (both decode paths
    give them as bytes; :mod:`statequery.arrow.kryo`)."""
    from statequery.arrow.kryo import decode_kryo_columns

    heap = task.backend == "hashmap"
    for name, batch in pairs:
        layout = task.layout(name)
        target = read_schema(layout, task.mode, False, task.classpath)
        yield name, decode_kryo_columns(batch, layout, task.classpath, target, heap)


def keyed_backend(task: ScanTask, ctx: ReadContext) -> StateScanner:
    """The backend the planner chose for a keyed task's handle (:attr:`ScanTask.backend`),
    opened from the model's header facts: no byte read, nothing probed."""
    from statequery.backends.base import KeyedContext
    from statequery.backends.registry import open_keyed_backend

    return open_keyed_backend(
        task.backend,
        task.handle,
        KeyedContext(ctx.resolver, task.max_parallelism, task.operator, ctx.open_databases),
        task.compressed,
        task.key_serializer,
        task.states,
    )


def _execute_keyed(
    task: ScanTask, ctx: ReadContext, batch_size: int
) -> Iterator[tuple[str, pa.RecordBatch]]:
    from statequery.backends.keyedstream import CanonicalKeyedBackend

    builders = {}
    requests = []
    for name in task.wanted:
        layout = task.layout(name)
        builder = BatchBuilder(state_schema(layout, task.mode), layout)
        builders[name] = builder
        requests.append((layout, builder))
    keys = task.keys
    # every key has its serialized bytes: the backends keep only the entries whose key bytes
    # are one of them (before decoding); otherwise (POJO keys...) rows are compared by value
    exact = keys is not None and all(k.serialized is not None for k in keys)
    by_bytes = tuple(k.serialized for k in keys or () if k.serialized is not None) if exact \
        else None
    by_value = None if keys is None or exact else [k.value for k in keys]
    wanted = None if task.key_groups is None else set(task.key_groups)
    backend = keyed_backend(task, ctx)
    scanned: Iterator[int]
    if isinstance(backend, CanonicalKeyedBackend):
        # the run index: use the task's runs, and record what whole walks find (in the
        # context's index, when it has one: a savepoint's)
        runs = task.runs
        usable = runs is not None and set(task.wanted) <= set(runs.states)
        index = ctx.run_index
        record = None
        if index is not None:
            op_id, sub = task.operator_id, task.subtask

            def record(kg: int, found: list[int]) -> None:
                index.record(op_id, sub, kg, found)

        scanned = backend.scan_states(
            requests,
            task.mode,
            wanted,
            key_bytes=by_bytes,
            runs=runs.by_key_group() if usable and runs is not None else None,
            record=record,
        )
    else:
        scanned = backend.scan_states(requests, task.mode, wanted, key_bytes=by_bytes)
    for _kg in scanned:
        for name, builder in builders.items():
            if len(builder) >= batch_size:
                yield from _flush(name, builder, by_value, batch_size)
    for name, builder in builders.items():
        yield from _flush(name, builder, by_value, batch_size)


def _flush(
    name: str,
    builder: BatchBuilder,
    by_value: list[Any] | None,
    batch_size: int,
) -> Iterator[tuple[str, pa.RecordBatch]]:
    batch = builder.flush()
    if batch is None:
        return
    if by_value is not None:
        # keys without serialized bytes: compared as read() returns them (Arrow's values)
        mask = [k in by_value for k in batch.column("key").to_pylist()]
        batch = batch.filter(pa.array(mask, type=pa.bool_()))
        if batch.num_rows == 0:
            return
    for b in split_batch(batch, batch_size):
        yield name, b


def _execute_operator(
    task: ScanTask, resolver: HandleResolver, batch_size: int
) -> Iterator[tuple[str, pa.RecordBatch]]:
    from statequery.backends.base import HandleStream
    from statequery.backends.operator import read_broadcast_state, read_operator_list_state

    handle = task.handle
    assert isinstance(handle, OperatorStreamHandle)
    layout = task.states[0]
    part = handle.partition(layout.name)
    if part is None or not part.offsets:
        return
    stream = HandleStream(resolver, handle.delegate)
    all_offsets = tuple(o for p in handle.partitions for o in p.offsets)
    builder = BatchBuilder(state_schema(layout), layout)
    if layout.kind == "broadcast":
        if len(part.offsets) != 1:
            raise CorruptStateError(
                f"broadcast state {layout.name!r} has {len(part.offsets)} offsets (1 expected)",
                stream.name,
            )
        read_broadcast_state(
            stream, layout, part.offsets[0], all_offsets, task.compressed, builder
        )
    else:
        read_operator_list_state(
            stream, layout, part.offsets, all_offsets, task.compressed, task.subtask, builder
        )
    yield from _flush(layout.name, builder, None, batch_size)


def index_runs(model: SavepointModel, ctx: ReadContext) -> RunIndex:
    """Complete ``ctx.run_index``: walk (without decoding) every key group of every canonical
    keyed stream of ``model`` that is not indexed yet; returns the index. Reads every such byte
    once (snappy key groups are decompressed)."""
    from statequery.backends.base import KeyedContext
    from statequery.backends.keyedstream import CanonicalKeyedBackend
    from statequery.backends.registry import keyed_backend_kind, open_keyed_backend
    from statequery.metadata.handles import is_heap_layout

    index = ctx.run_index
    assert index is not None
    for op in model.meta.operators:
        for st in op.subtasks:
            h, header = st.keyed_handle, st.keyed_header
            if not isinstance(h, KeyGroupsHandle) or header is None:
                continue
            if header.layout is None and is_heap_layout(h):
                continue  # hashmap, or not known without reading bytes: not indexed
            if keyed_backend_kind(h, header.layout) != "canonical":
                continue
            have = index.runs(op.operator_id, st.index)
            todo = [
                h.start_key_group + i
                for i, o in enumerate(h.offsets)
                if o > 0 and h.start_key_group + i not in have
            ]
            if not todo:
                continue
            backend = open_keyed_backend(
                "canonical",
                h,
                KeyedContext(ctx.resolver, op.max_parallelism, op.display_name),
                header.compressed,
                op.key_spec,
                _header_order(op, header.state_ids),
            )
            assert isinstance(backend, CanonicalKeyedBackend)

            def record(kg: int, runs: list[int], op_id: str = op.operator_id,
                       sub: int = st.index) -> None:
                index.record(op_id, sub, kg, runs)

            for _kg in backend.scan_states([], None, todo, record=record):
                pass
    return index


# -- the front ends' operations -----------------------------------------------------------------


def read_batches(
    model: SavepointModel,
    ctx: ReadContext,
    state: StateInfo,
    *,
    keys: Sequence[Any] | None = None,
    key_groups: Iterable[int] | None = None,
    mode: str | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    pickled: bool = False,
    workers: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """The rows of one state, task after task (planned now: bad options raise here; bytes are
    read as the batches are consumed); ``pickled``: with the ``*_py`` columns. ``workers``:
    processes a large read runs its key-group ranges in (:func:`statequery.parallel.run_tasks`;
    None: ``$STATEQUERY_WORKERS`` or every core; 1: this process), rows in the same order."""
    from statequery.parallel import resolve_workers

    if batch_size <= 0:
        raise InvalidOptionError(f"batch_size must be positive, got {batch_size}")
    n = resolve_workers(workers)
    tasks = plan(model, ctx, state, keys=keys, key_groups=key_groups, mode=mode,
                 pickled=pickled)
    return _run(ctx, tasks, batch_size, n)


def _run(
    ctx: ReadContext, tasks: list[ScanTask], batch_size: int, workers: int = 1
) -> Iterator[pa.RecordBatch]:
    for _name, batch in run_tasks(ctx, tasks, batch_size, workers):
        yield batch


# -- every core (statequery.parallel) ------------------------------------------------------------


def _task_bytes(task: ScanTask) -> int:
    """The bytes of state files ``task`` reads (its byte ranges; else its handle's streams)."""
    handle = task.handle
    if task.byte_ranges:
        size = handle.size if isinstance(handle, KeyGroupsHandle) else None
        return sum((b if b >= 0 else (size or a)) - a for a, b in task.byte_ranges)
    streams = getattr(handle, "stream_handles", None)
    return sum(getattr(s, "size", 0) or 0 for s in streams()) if streams is not None else 0


def _split_task(task: ScanTask, pieces: int) -> list[ScanTask]:
    """A task over a key-groups stream (canonical and hashmap layouts; each key group read on
    its own) cut into ``pieces`` key-group ranges: the same rows in the same order. RocksDB
    tasks (a database restored whole) and raw keyed streams stay whole."""
    handle = task.handle
    if pieces <= 1 or not task.keyed or task.raw or not isinstance(handle, KeyGroupsHandle):
        return [task]
    groups = tuple(task.key_groups) if task.key_groups is not None else tuple(
        handle.start_key_group + i for i, o in enumerate(handle.offsets) if o > 0
    )
    if len(groups) <= 1:
        return [task]
    out = []
    for piece in split_key_groups(groups, -(-len(groups) // pieces)):
        chunk = tuple(piece)
        runs = None
        if task.runs is not None:
            wanted = set(chunk)
            held = tuple(p for p in task.runs.key_groups if p[0] in wanted)
            runs = replace(task.runs, key_groups=held) if held else None
        out.append(_with_groups(task, chunk, runs))
    return out


def plan_pieces(tasks: Sequence[ScanTask], workers: int) -> list[ScanTask] | None:
    """``tasks`` cut into key-group ranges for ``workers`` processes (about
    :data:`~statequery.parallel.PIECES_PER_WORKER` each, at most
    :data:`~statequery.parallel.MAX_PIECE_BYTES` of state files each), in the same order; None
    when the read stays in this process: one worker, a key filter (lookups), or fewer than
    :data:`~statequery.parallel.MIN_PARALLEL_BYTES` of state files."""
    from statequery import parallel

    if workers <= 1 or not tasks or any(t.keys is not None for t in tasks):
        return None
    total = sum(_task_bytes(t) for t in tasks)
    if total < parallel.MIN_PARALLEL_BYTES:
        return None
    target = max(1, min(total // (workers * parallel.PIECES_PER_WORKER),
                        parallel.MAX_PIECE_BYTES))
    out = [p for t in tasks for p in _split_task(t, -(-_task_bytes(t) // target))]
    return out if len(out) > 1 else None


def _piece_pairs(
    task: ScanTask, io: FileIO, batch_size: int
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """In a worker: one piece's pairs, read through the caller's (pickled) ``io``."""
    try:
        yield from execute(task, ReadContext.of(io, task.metadata_dir), batch_size=batch_size)
    finally:
        io.close()


def warm_worker() -> None:
    """In a pool worker before its first piece (:mod:`statequery.parallel`): the modules a scan
    imports on first use, so that the first piece decodes at once."""
    import statequery.backends.keyedstream  # noqa: F401
    import statequery.backends.keygroups  # noqa: F401
    import statequery.backends.registry  # noqa: F401
    import statequery.backends.snappy  # noqa: F401
    from statequery.backends import fastpath

    fastpath.compiled()


def run_tasks(
    ctx: ReadContext, tasks: Sequence[ScanTask], batch_size: int, workers: int = 1
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The ``(state name, batch)`` pairs of ``tasks`` in task order: their key-group ranges in
    ``workers`` processes (:func:`statequery.parallel.ordered_map`) when the read is large
    enough (:func:`plan_pieces`), else in this process."""
    from functools import partial

    from statequery import parallel

    pieces = plan_pieces(tasks, workers)
    if pieces is None:
        for task in tasks:
            yield from execute(task, ctx, batch_size=batch_size)
        return
    run = partial(_piece_pairs, io=ctx.io, batch_size=batch_size)
    here = partial(execute, ctx=ctx, batch_size=batch_size)  # this process's share
    yield from parallel.ordered_map(run, pieces, workers, local=here)


def read_table(
    model: SavepointModel,
    ctx: ReadContext,
    state: StateInfo,
    *,
    keys: Sequence[Any] | None = None,
    key_groups: Iterable[int] | None = None,
    mode: str | None = None,
    pickled: bool = False,
    workers: int | None = None,
) -> pa.Table:
    """:func:`read_batches` collected into one Table."""
    _check_readable(state)  # before the schema: a state without rows says why
    schema = read_schema(state, mode, pickled, ctx.classpath)
    batches = list(read_batches(model, ctx, state, keys=keys, key_groups=key_groups, mode=mode,
                                pickled=pickled, workers=workers))
    return pa.Table.from_batches(batches, schema=schema)


def read_operator(
    model: SavepointModel,
    ctx: ReadContext,
    states: Sequence[StateInfo],
    *,
    keys: Sequence[Any] | None = None,
    key_groups: Iterable[int] | None = None,
    mode: str | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    workers: int | None = None,
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The rows of several states of one operator as ``(state name, batch)`` pairs: the keyed
    ones in one pass (each key group of each subtask handle is read and walked once for all of
    them, :func:`plan_states`), then each operator state's streams. Planned now (bad options
    raise here); bytes are read as the pairs are consumed. Memory: one batch per state (with
    ``workers`` > 1, a few key-group ranges per worker). ``workers`` as in
    :func:`read_batches`; each state's rows come in the same order."""
    from statequery.parallel import resolve_workers

    if batch_size <= 0:
        raise InvalidOptionError(f"batch_size must be positive, got {batch_size}")
    n = resolve_workers(workers)
    keyed = [s for s in states if s.keyed_rows]
    tasks = plan_states(model, ctx, keyed, keys=keys, key_groups=key_groups, mode=mode)
    for s in states:
        if not s.keyed_rows:
            tasks.extend(plan(model, ctx, s, keys=keys, key_groups=key_groups, mode=mode))
    return run_tasks(ctx, tasks, batch_size, n)


def lookup(
    model: SavepointModel, ctx: ReadContext, key: Any, operator: str | None = None
) -> dict[tuple[str, str], pa.Table]:
    """Everything every keyed state holds for ``key``: ``{(operator, state): Table}``.

    One task per operator (:func:`plan_states`): the key group that can hold the key (computed
    as Flink computes it) of the subtask that owns it, all of the operator's keyed states in one
    pass. With ``operator`` None every operator with keyed state is searched (operators whose key
    type does not accept the key are skipped). States without rows for the key are left out.
    """
    ops = [model.operator(operator)] if operator is not None else model.keyed_operators()
    out: dict[tuple[str, str], pa.Table] = {}
    refused: list[str] = []  # operators whose key type cannot hold the key, and why
    tried = 0
    for op in ops:
        refs = [s for s in op.states if s.keyed_rows]
        if not refs:
            continue
        tried += 1
        try:
            tasks = plan_states(model, ctx, refs, keys=[key])
            if ctx.classpath:  # Kryo values decoded with the job's classes (read_schema)
                tasks = [replace(t, classpath=ctx.classpath) for t in tasks]
        except (InvalidOptionError, UnsupportedFormatError, TypeError, ValueError, OverflowError) \
                as e:
            if operator is not None:
                raise
            if isinstance(e, InvalidKeyError):
                refused.append(f"{op.display_name}: {e}")
            else:
                tried -= 1
            continue
        tables: dict[str, list[pa.RecordBatch]] = {}
        for task in tasks:
            try:
                for name, batch in execute(task, ctx, batch_size=1 << 62):
                    tables.setdefault(name, []).append(batch)
            except UnsupportedFormatError:
                if operator is not None:
                    raise
                break
        for r in refs:
            if r.name in tables:
                out[(op.display_name, r.name)] = pa.Table.from_batches(
                    tables[r.name], schema=read_schema(r, None, False, ctx.classpath)
                )
    if tried and len(refused) == tried:
        # no operator's key type can hold the key: an error, not "no rows"
        raise InvalidKeyError("no keyed operator's key type holds this key (" +
                              "; ".join(refused) + ")")
    return out
