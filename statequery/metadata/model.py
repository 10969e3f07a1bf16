"""The model of one savepoint or retained checkpoint: its operators, states and tables, the
StateMeta table and the header facts (after pyiceberg's ``TableMetadata`` beside ``Table``).

:class:`SavepointModel` is built from ``_metadata`` (plus the header of every state file, read in
parallel through the storage seam, or one operator's headers at a time) or from a StateMeta
snapshot; it is lazy and thread-safe. The planner (:mod:`statequery.scan`) plans against it;
:class:`statequery.savepoint.Savepoint` is the public front over it.
"""

from __future__ import annotations

import dataclasses
import difflib
import posixpath
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statequery.decoder import Decoder
from statequery.exceptions import (
    CorruptStateError,
    NoSuchOperatorError,
    NoSuchStateError,
    NoSuchTableError,
    StatequeryError,
    UnknownSerializerError,
)
from statequery.hashing import operator_id_from_uid
from statequery.io import location_parent
from statequery.metadata.checkpoint import CheckpointMetadata, OperatorState, parse_metadata
from statequery.metadata.decoding import value_decoding as default_value_decoding
from statequery.metadata.handles import (
    ChangelogHandle,
    ChangelogStreamHandle,
    FileHandle,
    HandleResolver,
    IncrementalHandle,
    InMemoryChangelogHandle,
    KeyedHandle,
    KeyGroupsHandle,
    OperatorStreamHandle,
    StreamHandle,
    is_heap_layout,
    is_heap_stream,
    layout_by_first_bytes,
    layout_probe,
)
from statequery.metadata.kinds import OPERATOR_KINDS
from statequery.metadata.plan import (
    CompiledPlan,
    PlanNode,
    apply_descriptions,
    apply_plan,
    match_operators,
    name_operator,
    parse_plan,
    table_stem,
)
from statequery.metadata.proxy import (
    MAX_HEADER,
    KeyedBackendProxy,
    OperatorBackendProxy,
    read_header,
    read_header_bytes,
    read_keyed_proxy,
    read_operator_proxy,
)
from statequery.metadata.rawkeyed import (
    RAW_KEYED_STATE,
    RAW_OPERATOR_STATE,
    RawKeyedHeader,
    read_raw_keyed_header,
)
from statequery.metadata.statemeta import (
    HeaderInfo,
    JobInfo,
    OperatorInfo,
    StateInfo,
    StateMeta,
    SubtaskInfo,
    assign_table_names,
    fingerprint,
    operator_label,
    sql_identifier,
    type_string,
)
from statequery.serializers.spec import (
    ListSpec,
    MapSpec,
    OpaqueSpec,
    SerializerSpec,
    TimerSpec,
)

if TYPE_CHECKING:
    import pyarrow as pa

from statequery._version import __version__

__all__ = [
    "DEFAULT_WORKERS",
    "STATE_META_COLUMNS",
    "SavepointModel",
    "derive_operator",
    "derive_state_meta",
    "read_headers",
    "state_meta_table",
]

DEFAULT_WORKERS = 16
_CHK = re.compile(r"^chk-(\d+)$")


class SavepointModel:
    """What one savepoint holds: operators, states, tables, the StateMeta table and the header
    facts, from the StateMeta snapshot (``state_meta``) or derived from ``_metadata`` and the
    state files' headers (read through ``resolver``, once, in parallel; one operator's headers at
    a time until the whole model is asked for). Lazy and thread-safe."""

    def __init__(
        self,
        resolver: HandleResolver,
        metadata_location: str,
        metadata_bytes: bytes,
        state_meta: StateMeta | None = None,
        max_workers: int = DEFAULT_WORKERS,
        plan: CompiledPlan | None = None,
        job: JobInfo | None = None,
    ) -> None:
        self.resolver = resolver
        self.metadata_location = metadata_location
        self.location = location_parent(metadata_location)
        self._metadata_bytes = metadata_bytes
        self._metadata: CheckpointMetadata | None = None
        self._meta = state_meta
        self._named_meta: StateMeta | None = None
        self.from_snapshot = state_meta is not None
        if plan is None and state_meta is not None and state_meta.plan:
            plan = parse_plan(state_meta.plan, "the StateMeta snapshot's plan")
        #: the Flink SQL compiled plan naming the job's columns (``open(plan=...)`` or the snapshot)
        self.sql_plan = plan
        #: the job a snapshot of an older format was captured from, kept for the derived model
        self._job = job
        self._plan_nodes: dict[str, PlanNode] | None = None
        self.max_workers = max_workers
        # headers read so far and operators modelled one at a time (before the whole model)
        self._headers: dict[tuple[int, int, str], Any] = {}
        self._lazy_operators: dict[int, OperatorInfo] = {}
        self._lock = threading.RLock()

    @property
    def metadata(self) -> CheckpointMetadata:
        """The parsed ``_metadata`` (parsed on first use)."""
        if self._metadata is None:
            self._metadata = parse_metadata(self._metadata_bytes, self.metadata_location)
        return self._metadata

    @property
    def meta(self) -> StateMeta:
        """The StateMeta model (from the snapshot, or derived once and cached), with the column
        names of the attached SQL plan (:attr:`sql_plan`)."""
        with self._lock:
            if self._meta is None:
                self._meta = derive_state_meta(
                    self.metadata,
                    self.resolver,
                    self._metadata_bytes,
                    self.max_workers,
                    headers=self._headers,
                )
                if self._job is not None:
                    self._meta = dataclasses.replace(self._meta, job=self._job)
                self._lazy_operators.clear()
            if self.sql_plan is None and self._meta.job is None:
                return self._meta
            if self._named_meta is None:
                if self.sql_plan is not None:
                    self._named_meta = apply_plan(self._meta, self.sql_plan)
                else:  # captured (statequery.capture): names from the vertex descriptions
                    assert self._meta.job is not None
                    self._named_meta = apply_descriptions(self._meta, self._meta.job)
            return self._named_meta

    @property
    def derived(self) -> StateMeta:
        """The StateMeta model without the names of an attached plan (what a snapshot keeps)."""
        self.meta  # noqa: B018  (derive)
        assert self._meta is not None
        return self._meta

    @property
    def plan_nodes(self) -> dict[str, PlanNode]:
        """operator id -> its node of the attached SQL plan (operators matched unambiguously)."""
        if self.sql_plan is None:
            return {}
        if self._plan_nodes is None:
            self._plan_nodes = match_operators(self.sql_plan, self._identities())
        return self._plan_nodes

    @property
    def job(self) -> JobInfo | None:
        """The job this savepoint was captured from (``statequery capture``), from its StateMeta
        snapshot; None when it was not captured."""
        return self._meta.job if self._meta is not None else self._job

    @property
    def fingerprint(self) -> str:
        """The SHA-256 (hex) of this savepoint's ``_metadata``: which savepoint this is."""
        return fingerprint(self._metadata_bytes)[1]

    @property
    def operators(self) -> tuple[OperatorInfo, ...]:
        return self.meta.operators

    @property
    def states(self) -> tuple[StateInfo, ...]:
        return self.meta.states

    def operator(self, identifier: Any) -> OperatorInfo:
        """The operator with this uid, OperatorID (hex) or name (uid first, as Flink resolves),
        or the operator of a record with an ``operator_id`` (a ``StateInfo``, an ``OperatorState``
        of ``_metadata``).

        Without a StateMeta snapshot only this operator's headers are read (once), not every
        state file of the savepoint.
        """
        if isinstance(identifier, OperatorInfo):
            return identifier
        return self._operator_at(self._operator_index(identifier))

    def _identities(self) -> Sequence[Any]:
        """The operators' identities (uid, name, id) in ``_metadata`` order, from the model when
        it is built, else from ``_metadata`` (no header read)."""
        if self._meta is not None:
            return self._meta.operators
        return self.metadata.operators

    def keyed_operators(self) -> list[OperatorInfo]:
        """The operators that have keyed state (their models)."""
        indices = []
        for i, op in enumerate(self._identities()):
            if isinstance(op, OperatorInfo):
                keyed = any(st.keyed_handle is not None for st in op.subtasks)
            else:
                keyed = any(st.managed_keyed is not None for st in op.subtasks)
            if keyed:
                indices.append(i)
        with self._lock:
            if self._meta is None:  # their headers in one parallel pass
                have = {k[0] for k in self._headers}
                missing = [i for i in indices if i not in have]
                if missing:
                    self._headers.update(
                        read_headers(self.metadata, self.resolver, missing, self.max_workers)
                    )
        return [self._operator_at(i) for i in indices]

    def _operator_index(self, identifier: Any) -> int:
        ops = list(self._identities())
        ident = getattr(identifier, "operator_id", None)
        if ident is not None:
            for i, op in enumerate(ops):
                if op.operator_id == ident:
                    return i
            identifier = ident
        identifier = str(identifier)
        for attr in ("uid", "operator_id", "name"):
            matches = [i for i, op in enumerate(ops) if getattr(op, attr) == identifier]
            if len(matches) == 1:
                return matches[0]
            if len(matches) > 1:
                raise NoSuchOperatorError(
                    f"{len(matches)} operators are named {identifier!r} in {self.location}; "
                    "use the uid or operator id"
                )
        hashed = operator_id_from_uid(identifier)
        for i, op in enumerate(ops):
            if op.operator_id == hashed:
                return i
        known = ", ".join(operator_label(op) for op in ops)
        raise NoSuchOperatorError(f"no operator {identifier!r} in {self.location} (have: {known})")

    def _operator_at(self, i: int) -> OperatorInfo:
        if self._meta is not None or (self._job is not None and self.sql_plan is None):
            # (a kept captured job names columns from the job graph: the whole model)
            return self.meta.operators[i]
        with self._lock:
            found = self._lazy_operators.get(i)
            if found is None:
                md = self.metadata
                if not any(k[0] == i for k in self._headers):
                    self._headers.update(read_headers(md, self.resolver, [i], self.max_workers))
                found = derive_operator(md, i, self._headers, _facts(md).format)
                node = self.plan_nodes.get(found.operator_id)
                if node is not None and self.sql_plan is not None:
                    stem = table_stem(node, found.name)
                    found = assign_table_names([name_operator(self.sql_plan, node, found)],
                                               {found.operator_id: stem})[0]
                else:
                    found = assign_table_names([found])[0]
                self._lazy_operators[i] = found
        return found

    def state(self, operator_or_table: str, name: str | None = None) -> StateInfo:
        """A state by ``(operator, state name)`` or by its ``table_name``."""
        if name is None:
            try:
                return self.table(operator_or_table)
            except NoSuchTableError as e:
                raise NoSuchStateError(str(e)) from None
        op = self.operator(operator_or_table)
        found = op.state(name)
        if found is None:
            have = ", ".join(x.name for x in op.states) or "none"
            raise NoSuchStateError(
                f"operator {op.display_name!r} has no state {name!r} (has: {have})"
            )
        return found

    def resolve_state(self, state: StateInfo | str, name: str | None = None) -> StateInfo:
        """``state`` itself when it is a :class:`StateInfo`, else :meth:`state`."""
        if isinstance(state, StateInfo):
            return state
        return self.state(state, name)

    def table(self, name: str) -> StateInfo:
        """The state whose table is ``name`` (every front end resolves table names here): its
        ``table_name`` (any case), else a spelling a user may type, ``<operator uid, name or
        id>__<state>`` as a SQL identifier. Raises :class:`NoSuchTableError` listing the tables
        (with the closest one)."""
        wanted = name.lower()
        for s in self.states:
            if s.table_name.lower() == wanted:
                return s
        ident = sql_identifier(name)
        for s in self.states:
            for op in (s.operator_uid, s.operator_name, s.operator_id):
                if op and sql_identifier(f"{op}__{s.name}") == ident:
                    return s
        tables = [s.table_name for s in self.states]
        close = difflib.get_close_matches(name, tables, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        detail = f"{hint}tables: {', '.join(tables) or 'none'}"
        raise NoSuchTableError(f"no state table {name!r} in {self.location} ({detail})", detail)

    def operator_states(
        self, operator: Any, states: Iterable[str] | None = None, keyed_only: bool = False
    ) -> list[StateInfo]:
        """The states of one operator that are read together: ``states`` (names or table
        names, in that order), or every readable one (keyed and operator list, union and
        broadcast state; ``keyed_only``: keyed state only)."""
        op = self.operator(operator)
        if states is None:
            found = [
                s for s in op.states
                if s.keyed_rows or (not keyed_only and s.kind in OPERATOR_KINDS)
            ]
            if not found:
                what = "keyed state (a key or key groups were given)" if keyed_only else "state"
                raise NoSuchStateError(f"operator {op.display_name!r} has no readable {what}")
            return found
        if isinstance(states, str):
            states = [states]
        out: list[StateInfo] = []
        for name in states:
            info = op.state(name) or next((s for s in op.states if s.table_name == name), None)
            if info is None:
                raise NoSuchStateError(
                    f"operator {op.display_name!r} has no state {name!r}; states: "
                    + (", ".join(sorted(s.name for s in op.states)) or "none")
                )
            if info not in out:
                out.append(info)
        return out

    def state_meta(
        self,
        pickled_columns: Callable[[StateInfo], list[str]] | None = None,
        value_decoding: Callable[[StateInfo], tuple[str, str | None]] | None = None,
    ) -> pa.Table:
        """One row per state (keyed, timers, operator list/union, broadcast): see the columns of
        :data:`STATE_META_COLUMNS`. With a SQL plan attached, ``declared_ttl_ms`` holds the TTL
        the plan declares for each TTL state (:mod:`statequery.metadata.ttl`).
        ``pickled_columns``: a state's bytes columns, from the Arrow schema of its rows, which
        the layers above the model draw (the facade passes it); empty lists without it."""
        meta = self.meta
        declared = None
        if self.sql_plan is not None:
            from statequery.metadata.ttl import declared_ttls

            declared = declared_ttls(self.plan_nodes, meta.operators)
        return state_meta_table(meta, declared, pickled_columns, value_decoding)


# -- deriving the StateMeta model ----------------------------------------------------------------


@dataclass
class _HeaderJob:
    op_index: int
    subtask: int
    kind: str  # keyed | operator | raw_keyed
    handle: StreamHandle
    prefix: dict[str, int] = dataclasses.field(default_factory=dict)


def _prefix(handle: StreamHandle) -> dict[str, int]:
    """``read_header``'s first read: up to the first key group's data when the offsets say
    where it starts (canonical and hashmap layouts), else its default."""
    if isinstance(handle, KeyGroupsHandle):
        positive = [o for o in handle.offsets if o > 0]
        if positive:
            return {"prefix": min(positive)}
    return {}


def _keyed_header_stream(h: KeyedHandle | None) -> StreamHandle | None:
    if isinstance(h, KeyGroupsHandle):
        return h
    if isinstance(h, IncrementalHandle):
        return h.meta
    if isinstance(h, ChangelogHandle):
        for m in h.materialized:
            s = _keyed_header_stream(m)
            if s is not None:
                return s
    return None


def _keyed_proxy(header: Any) -> KeyedBackendProxy | None:
    return header if isinstance(header, KeyedBackendProxy) else None


def _stream_bytes(handles: tuple[StreamHandle, ...]) -> int:
    return sum(h.size or 0 for h in handles)


# ForSt's working directory (Flink 2.x ``ForStPathContainer``):
# ``<base>/op_<operator>_<id>__<subtask>_<parallelism>__attempt_<n>/db/<file>``. RocksDB names its
# instance directories ``job_<job-id>_op_<...>__uuid_<uuid>/db`` and never hands them to a
# checkpoint; ForSt with its primary directory in the checkpoint directory (State V2 jobs) does:
# the checkpoint's tables are the database's own files, referenced where they are.
_FORST_DB_FILE = re.compile(r"/op_[^/]+__\d+_\d+__attempt_\d+/db/[^/]+$")


def _is_forst_handle(h: IncrementalHandle) -> bool:
    return any(
        isinstance(s, FileHandle) and _FORST_DB_FILE.search(s.path) is not None
        for _, s in (*h.shared, *h.private)
    )


def _forst_header(kp: object) -> bool:
    """``KEY_VALUE_V2`` states (State V2): in Flink 2.x only ForSt's asynchronous keyed backend
    writes them (hashmap and RocksDB serve State V2 through an adaptor that writes V1 states)."""
    return isinstance(kp, KeyedBackendProxy) and any(
        st.backend_type == "KEY_VALUE_V2" for st in kp.states
    )


def _backend_of(h: KeyedHandle | None, proxy: KeyedBackendProxy | None = None) -> str | None:
    if isinstance(h, IncrementalHandle):
        return "forst" if _is_forst_handle(h) else "rocksdb"
    if isinstance(h, KeyGroupsHandle):
        if h.handle_type != 12:
            return None
        # type 12 with an offset per key group is the hashmap layout; type 12 in the key-group
        # stream layout is a full (non-incremental) RocksDB checkpoint of Flink 1.15, which has
        # an offset per key group too when each holds data: the header read says which
        return "hashmap" if is_heap_stream(h, None if proxy is None else proxy.layout) else (
            "rocksdb"
        )
    if isinstance(h, (ChangelogHandle, ChangelogStreamHandle, InMemoryChangelogHandle)):
        return "changelog"
    return None


def _first_opaque(specs: tuple[SerializerSpec | None, ...]) -> str | None:
    for spec in specs:
        if spec is None:
            continue
        stack = [spec]
        while stack:
            s = stack.pop()
            if isinstance(s, OpaqueSpec):
                what = s.type_class or s.snapshot_class
                return s.reason or f"{s.family} serializer {what} is not decodable"
            stack.extend(s.children())
    return None


def _partition_bytes(handle: OperatorStreamHandle, name: str) -> int:
    """Bytes of one operator state's elements inside the subtask's stream."""
    part = handle.partition(name)
    if part is None or not part.offsets:
        return 0
    end = handle.delegate.size or 0
    bounds = sorted({o for p in handle.partitions for o in p.offsets} | {end})
    total = 0
    for o in part.offsets:
        i = bounds.index(o)
        nxt = bounds[i + 1] if i + 1 < len(bounds) else end
        total += max(0, nxt - o)
    return total


def _state_info(
    op: OperatorState,
    info: StateInfo,
    key_spec: SerializerSpec | None,
    backend: str | None,
    fmt: str | None,
) -> StateInfo:
    kind = info.kind  # the one kind table (statequery.metadata.kinds), as the header parse set it
    sers = info.serializers
    value = sers.get("VALUE_SERIALIZER")
    namespace = sers.get("NAMESPACE_SERIALIZER")
    user_key = None
    key = key_spec
    if kind == "list" and isinstance(value, ListSpec):
        value = value.element
    elif kind == "map":
        if "USER_KEY_SERIALIZER" in sers:
            user_key = sers["USER_KEY_SERIALIZER"]
        elif isinstance(value, MapSpec):
            user_key, value = value.key, value.value
    elif kind in ("event_timer", "processing_timer", "priority_queue"):
        if isinstance(value, TimerSpec):
            namespace = value.namespace
            value = None
    elif kind == "broadcast":
        user_key = sers.get("KEY_SERIALIZER")
        key = None
    elif kind in ("operator_list", "operator_union"):
        key = None
    reason = info.reason or info.unsupported or _first_opaque((key, namespace, value, user_key))
    return dataclasses.replace(
        info,
        # the header's ids are per subtask header (HeaderInfo.state_ids), not the state's
        state_id=0,
        operator_id=op.operator_id,
        operator_uid=op.uid,
        operator_name=op.name,
        parallelism=op.parallelism,
        max_parallelism=op.max_parallelism,
        key_spec=key,
        namespace_spec=namespace,
        value_spec=value,
        user_key_spec=user_key,
        serializers=dict(sers),
        options=dict(info.options),
        decodable=reason is None,
        reason=reason,
        backend=backend if kind not in ("operator_list", "operator_union", "broadcast") else None,
        format=fmt,
    )


def read_headers(
    md: CheckpointMetadata,
    resolver: HandleResolver,
    op_indices: Iterable[int] | None = None,
    max_workers: int = DEFAULT_WORKERS,
) -> dict[tuple[int, int, str], Any]:
    """The state-file headers of the operators ``op_indices`` (all when None), read in
    parallel: ``{(operator index, subtask, "keyed" | "operator"): proxy}``."""
    wanted = None if op_indices is None else set(op_indices)
    jobs: list[_HeaderJob] = []
    for i, op in enumerate(md.operators):
        if wanted is not None and i not in wanted:
            continue
        for st in op.subtasks:
            ks = _keyed_header_stream(st.managed_keyed)
            if ks is not None:
                jobs.append(_HeaderJob(i, st.index, "keyed", ks))
            if isinstance(st.managed_keyed, ChangelogHandle) and st.managed_keyed.non_materialized:
                jobs.append(_HeaderJob(i, st.index, "changelog", st.managed_keyed))  # type: ignore[arg-type]
            rk = st.raw_keyed
            if isinstance(rk, KeyGroupsHandle) and rk.offsets:
                jobs.append(_HeaderJob(i, st.index, "raw_keyed", rk))
            oh = st.managed_operator
            if oh is not None and oh.partitions and not oh.is_empty:
                offsets = [o for p in oh.partitions for o in p.offsets if o > 0]
                prefix = {"prefix": min(offsets)} if offsets else {}
                jobs.append(_HeaderJob(i, st.index, "operator", oh.delegate, prefix))

    def run(job: _HeaderJob) -> KeyedBackendProxy | OperatorBackendProxy | RawKeyedHeader:
        # where data starts is known from the handle's offsets: read exactly the header
        if job.kind == "keyed":
            return _keyed_header(resolver, job.handle)
        if job.kind == "raw_keyed":
            assert isinstance(job.handle, KeyGroupsHandle)
            return _raw_keyed_header(resolver, job.handle)
        if job.kind == "changelog":
            from statequery.metadata.changelog import summarize

            return summarize(resolver, job.handle)  # type: ignore[arg-type,return-value]
        return read_header(resolver, job.handle, read_operator_proxy, **job.prefix)

    if len(jobs) > 1 and max_workers > 1:
        with ThreadPoolExecutor(max_workers=min(max_workers, len(jobs))) as pool:
            results = list(pool.map(run, jobs))
    else:
        results = [run(j) for j in jobs]
    return {(j.op_index, j.subtask, j.kind): r for j, r in zip(jobs, results, strict=True)}


def _raw_keyed_header(resolver: HandleResolver, handle: KeyGroupsHandle) -> RawKeyedHeader:
    """The first key group of a raw keyed stream: its timer services (heap timers of a RocksDB
    checkpoint), or why it is not a timer stream (the state is then listed as ``raw``). Reads
    exactly that key group's bytes (its extent is known from the offsets)."""
    offsets = handle.offsets
    first = offsets[0]
    later = [o for o in offsets[1:] if o > first]
    source = resolver.source_name(handle.delegate)
    try:
        end = later[0] if later else resolver.stream_size(handle.delegate)
        if end - first > MAX_HEADER:
            return RawKeyedHeader(
                0, error=f"raw keyed state: its first key group is {end - first} bytes"
            )
        data = resolver.read(handle.delegate, first, end - first)
        return read_raw_keyed_header(Decoder(data, source=source, base_offset=first))
    except (CorruptStateError, UnknownSerializerError) as e:
        return RawKeyedHeader(0, error=f"raw keyed state header: {e}")


def _raw_states(
    op: OperatorState,
    subtasks: list[SubtaskInfo],
    headers: list[RawKeyedHeader],
    backend: str | None,
    fmt: str | None,
) -> list[StateInfo]:
    """The states of an operator's raw keyed and raw operator streams: the timer queues of the
    raw keyed timer services, else one ``raw`` row per kind of stream, with its size and why it
    is not read. Never nothing: a stream Flink restores is a row of ``state_meta``."""
    states: list[StateInfo] = []
    raw_keyed = sum(s.raw_keyed_bytes for s in subtasks)
    raw_operator = sum(s.raw_operator_bytes for s in subtasks)
    timers = [h for h in headers if h.timers and h.states]
    if timers:
        seen: dict[str, StateInfo] = {}
        for h in timers:
            for meta in h.states:
                seen.setdefault(meta.name, meta)
        error = next((h.error for h in headers if h.error), None)
        for meta in seen.values():
            info = _state_info(op, meta, None, backend, fmt)
            reason = info.reason or error
            states.append(
                dataclasses.replace(
                    info,
                    key_spec=info.key,
                    size_bytes=raw_keyed,
                    decodable=reason is None,
                    reason=reason,
                    stream="raw_keyed",
                )
            )
    elif any(s.raw_keyed_handle is not None for s in subtasks):
        reason = next(
            (h.error for h in headers if h.error),
            "raw keyed state: statequery does not decode it",
        )
        states.append(_raw_state(op, RAW_KEYED_STATE, reason, raw_keyed, fmt, "raw_keyed"))
    if any(s.raw_operator_handle is not None for s in subtasks):
        states.append(
            _raw_state(
                op,
                RAW_OPERATOR_STATE,
                "raw operator state written by the operator itself: its layout is the "
                "operator's own, statequery does not decode it",
                raw_operator,
                fmt,
                "raw_operator",
            )
        )
    return states


#: the state_meta row of keyed state whose states no header names (never dropped silently)
UNREAD_KEYED_STATE = "(keyed state)"


def _headerless_reason(h: KeyedHandle) -> str:
    """Why a keyed handle's states cannot be listed (it has no state-file header to read)."""
    if isinstance(h, ChangelogHandle) and not h.materialized:
        return (
            "changelog state backend: this keyed handle has neither a materialized base nor a "
            f"change log statequery could read ({len(h.non_materialized)} change-log "
            "handle(s)), so its states and their names are unknown"
        )
    return (
        f"keyed state handle {type(h).__name__} (type {getattr(h, 'handle_type', '?')}) "
        "has no state-file header "
        "statequery reads"
    )


def _raw_state(
    op: OperatorState, name: str, reason: str, size: int, fmt: str | None, stream: str
) -> StateInfo:
    return StateInfo(
        operator_id=op.operator_id,
        operator_uid=op.uid,
        operator_name=op.name,
        parallelism=op.parallelism,
        max_parallelism=op.max_parallelism,
        name=name,
        kind="raw",
        backend_type="RAW",
        decodable=False,
        reason=reason,
        size_bytes=size,
        format=fmt,
        stream=stream,
    )


@dataclass(frozen=True)
class _Facts:
    snapshot_type: str
    format: str | None
    backend: str | None


#: how far past the header's end the layout probe's 4 bytes may start and still come with the
#: header's read (a key group 0 of a few KB before them costs less than a request of their own)
PROBE_SLACK = 4 << 10


def _keyed_header(resolver: HandleResolver, handle: StreamHandle) -> KeyedBackendProxy:
    """A keyed stream's header, with its layout when the handle cannot tell (:func:`_with_layout`).

    The offsets say where the header ends; the bytes that decide the layout come with the
    header's read when they start at most :data:`PROBE_SLACK` bytes past its end (always for a
    handle not starting at key group 0: its first key group follows the header)."""
    prefix = _prefix(handle)
    probe = layout_probe(handle) if _ambiguous(handle) else None
    if probe is not None and prefix and probe[0] - prefix["prefix"] <= PROBE_SLACK:
        prefix = {"prefix": probe[0] + 4}
    proxy, head = read_header_bytes(resolver, handle, read_keyed_proxy, **prefix)
    return _with_layout(proxy, handle, resolver, head)


def _ambiguous(handle: StreamHandle) -> bool:
    return isinstance(handle, KeyGroupsHandle) and is_heap_layout(handle)


def _with_layout(
    proxy: KeyedBackendProxy,
    handle: StreamHandle | KeyGroupsHandle,
    resolver: HandleResolver,
    head: bytes = b"",
) -> KeyedBackendProxy:
    """A type-12 stream with an offset for every key group is a hashmap checkpoint, or a Flink
    1.15 full RocksDB checkpoint whose every key group holds data: 4 bytes of a key group tell
    which (:func:`~statequery.metadata.handles.layout_by_first_bytes`), taken from ``head`` (the
    stream's first bytes, already read) when it holds them."""
    if not isinstance(handle, KeyGroupsHandle) or not is_heap_layout(handle):
        return proxy
    delegate = handle.delegate

    def read(start: int, n: int) -> bytes:
        if start + n <= len(head):
            return head[start : start + n]
        return bytes(resolver.read(delegate, start, n))

    try:
        layout = layout_by_first_bytes(handle, read)
    except StatequeryError:
        return proxy  # reading reports it; the listing keeps what the handle says
    return proxy if layout is None else dataclasses.replace(proxy, layout=layout)


def _facts(
    md: CheckpointMetadata, headers: dict[tuple[int, int, str], Any] | None = None
) -> _Facts:
    """Snapshot type, format and backend: from ``_metadata`` (and the keyed headers read, which
    tell a Flink 1.15 full RocksDB checkpoint from a hashmap one when the handles cannot)."""
    snapshot_type = (
        md.properties.snapshot_type
        if md.properties
        else (
            "checkpoint"
            if _CHK.match(posixpath.basename(md.directory.rstrip("/")))
            else "savepoint"
        )
    )
    keyed_types = {
        st.managed_keyed.type_code
        if not isinstance(st.managed_keyed, KeyGroupsHandle)
        else st.managed_keyed.handle_type
        for op in md.operators
        for st in op.subtasks
        if st.managed_keyed is not None
    }
    if md.properties and md.properties.format:
        fmt: str | None = md.properties.format.lower()
    elif snapshot_type == "checkpoint":
        fmt = "native"
    elif keyed_types:
        fmt = "canonical" if keyed_types <= {3, 7} else "native"
    else:
        fmt = None
    known = headers or {}
    backends = {
        _backend_of(st.managed_keyed, _keyed_proxy(known.get((i, st.index, "keyed"))))
        for i, op in enumerate(md.operators)
        for st in op.subtasks
        if st.managed_keyed is not None
    }
    backend = backends.pop() if len(backends) == 1 else None
    return _Facts(snapshot_type, fmt, backend)


def derive_state_meta(
    md: CheckpointMetadata,
    resolver: HandleResolver,
    metadata_bytes: bytes,
    max_workers: int = DEFAULT_WORKERS,
    headers: dict[tuple[int, int, str], Any] | None = None,
) -> StateMeta:
    """Build the StateMeta model from ``_metadata`` and every state-file header (in parallel;
    ``headers`` already read are reused)."""
    headers = dict(headers or {})
    have = {i for i, _, _ in headers}
    missing = [i for i in range(len(md.operators)) if i not in have]
    if missing:
        headers.update(read_headers(md, resolver, missing, max_workers))
    facts = _facts(md, headers)
    operators = [derive_operator(md, i, headers, facts.format) for i in range(len(md.operators))]
    operators = _one_state_backend(operators)
    if facts.backend == "rocksdb" and any(op.backend == "forst" for op in operators):
        facts = dataclasses.replace(facts, backend="forst")
    size, digest = fingerprint(metadata_bytes)
    return StateMeta(
        checkpoint_id=md.checkpoint_id,
        metadata_version=md.version,
        snapshot_type=facts.snapshot_type,
        format=facts.format,
        backend=facts.backend,
        metadata_size=size,
        metadata_sha256=digest,
        operators=assign_table_names(operators),
        statequery_version=__version__,
    )


def _one_state_backend(operators: list[OperatorInfo]) -> list[OperatorInfo]:
    """A job has one state backend: when one operator's files or header say ForSt, the operators
    whose RocksDB-format state says nothing more (ForSt's synchronous State V1 operators, local
    files) are ForSt's too."""
    if not any(op.backend == "forst" for op in operators):
        return operators
    return [
        dataclasses.replace(
            op,
            backend="forst",
            states=tuple(
                dataclasses.replace(s, backend="forst") if s.backend == "rocksdb" else s
                for s in op.states
            ),
        )
        if op.backend == "rocksdb"
        else op
        for op in operators
    ]


def derive_operator(
    md: CheckpointMetadata,
    i: int,
    headers: dict[tuple[int, int, str], Any],
    fmt: str | None,
) -> OperatorInfo:
    """The model of operator ``i`` from ``_metadata`` and its headers (table names unassigned)."""
    op = md.operators[i]
    key_spec: SerializerSpec | None = None
    merged: dict[str, tuple[StateInfo, str | None]] = {}
    op_backend = None
    subtasks = []
    header_errors: list[str] = []
    raw_headers: list[RawKeyedHeader] = []
    changelogs: list[Any] = []  # the subtasks' ChangelogSummary (statequery.backends.changelog)
    for st in op.subtasks:
        kp = headers.get((i, st.index, "keyed"))
        opp = headers.get((i, st.index, "operator"))
        rkp = headers.get((i, st.index, "raw_keyed"))
        clp = headers.get((i, st.index, "changelog"))
        if clp is not None:
            changelogs.append(clp)
        keyed_header = operator_header = raw_keyed_header = None
        if isinstance(rkp, RawKeyedHeader):
            raw_headers.append(rkp)
            raw_keyed_header = HeaderInfo(
                rkp.version,
                False,
                rkp.header_end,
                {s.name: s.state_id for s in rkp.states},
                rkp.error,
            )
        if st.managed_keyed is not None:
            op_backend = op_backend or _backend_of(st.managed_keyed, _keyed_proxy(kp))
            if op_backend == "rocksdb" and _forst_header(kp):
                op_backend = "forst"
        if isinstance(kp, KeyedBackendProxy):
            key_spec = key_spec or kp.key_serializer
            keyed_header = HeaderInfo(
                kp.version,
                kp.compressed,
                kp.header_end,
                {s.name: s.state_id for s in kp.states},
                kp.error,
                kp.layout,
            )
            for s in kp.states:
                merged.setdefault(s.name, (s, "keyed"))
            if kp.error:
                header_errors.append(kp.error)
        if clp is not None and not clp.error:
            # the states the change log registers join the base header's (the reader lays the
            # merged state out with the base's states first, then the log's new ones)
            ids = dict(keyed_header.state_ids) if keyed_header is not None else {}
            for meta in clp.states:
                ids.setdefault(meta.name, len(ids))
            keyed_header = HeaderInfo(
                keyed_header.version if keyed_header is not None else 0,
                False,
                keyed_header.header_end if keyed_header is not None else None,
                ids,
                None,
            )
        if isinstance(opp, OperatorBackendProxy):
            operator_header = HeaderInfo(
                opp.version,
                opp.compressed,
                opp.header_end,
                {s.name: n for n, s in enumerate(opp.states)},
                opp.error,
            )
            for s in opp.states:
                merged.setdefault(s.name, (s, "operator"))
            if opp.error:
                header_errors.append(opp.error)
        mk = st.managed_keyed
        subtasks.append(
            SubtaskInfo(
                index=st.index,
                key_groups=mk.key_group_range
                if mk is not None
                else (st.raw_keyed.key_group_range if st.raw_keyed is not None else None),
                keyed_handle=mk,
                operator_handle=st.managed_operator,
                raw_keyed_handle=st.raw_keyed,
                raw_operator_handle=st.raw_operator,
                keyed_header=keyed_header,
                operator_header=operator_header,
                keyed_bytes=_stream_bytes(mk.stream_handles()) if mk is not None else 0,
                operator_bytes=(st.managed_operator.delegate.size or 0)
                if st.managed_operator is not None
                else 0,
                raw_keyed_header=raw_keyed_header,
                raw_keyed_bytes=_stream_bytes(st.raw_keyed.stream_handles())
                if st.raw_keyed is not None
                else 0,
                raw_operator_bytes=(st.raw_operator.delegate.size or 0)
                if st.raw_operator is not None
                else 0,
            )
        )
    keyed_bytes = sum(s.keyed_bytes for s in subtasks)
    # the states a change log registers (a change log without a materialized base has no
    # header): listed as keyed states, with the number of changes logged for each
    changes: dict[str, int] | None = None
    changelog_error = next((c.error for c in changelogs if c.error), None)
    if changelogs:
        changes = {}
        for c in changelogs:
            key_spec = key_spec or c.key
            for meta in c.states:
                merged.setdefault(meta.name, (meta, "keyed"))
            for name, n in c.counts.items():
                changes[name] = changes.get(name, 0) + n
    if any(isinstance(s.keyed_handle, ChangelogHandle) for s in subtasks):
        changes = changes if changes is not None else {}
    read_logs = {s.index for s in subtasks if (i, s.index, "changelog") in headers}
    # keyed handles whose states no header names (a change log statequery could not read, a
    # handle type statequery does not read): never dropped without a word
    headerless = [
        (s, changelog_error or _headerless_reason(s.keyed_handle))
        for s in subtasks
        if s.keyed_handle is not None and s.keyed_header is None
        and (s.index not in read_logs or changelog_error)
    ]
    if headerless:
        sub, why = headerless[0]
        header_errors.append(f"the keyed state of subtask {sub.index} cannot be read: {why}")
    states = []
    for info, where in merged.values():
        state = _state_info(op, info, key_spec if where == "keyed" else None, op_backend, fmt)
        if where == "keyed":
            size = keyed_bytes
        else:
            size = sum(
                _partition_bytes(s.operator_handle, info.name)
                for s in subtasks
                if s.operator_handle is not None
            )
        reason = state.reason
        if reason is None and where == "keyed" and changelog_error:
            reason = changelog_error
        if reason is None and where == "keyed" and changes is not None and key_spec is None:
            reason = (
                "changelog state backend: the change log does not record the key serializer "
                "and this operator has no materialized base or timer that names it"
            )
        if reason is None and header_errors:
            reason = header_errors[0]
        states.append(
            dataclasses.replace(
                state,
                size_bytes=size,
                decodable=reason is None,
                reason=reason,
                changes=changes.get(info.name, 0)
                if changes is not None and where == "keyed"
                else None,
            )
        )
    if headerless and not any(st.keyed for st in states):
        states.append(
            _raw_state(
                op,
                UNREAD_KEYED_STATE,
                headerless[0][1],
                sum(s.keyed_bytes for s, _ in headerless),
                fmt,
                "managed",
            )
        )
    managed = {s.name for s in states}
    states.extend(
        s
        for s in _raw_states(op, subtasks, raw_headers, op_backend, fmt)
        if s.name not in managed
    )
    if key_spec is None:
        key_spec = next((s.key_spec for s in states if s.stream == "raw_keyed"), None)
    return OperatorInfo(
        operator_id=op.operator_id,
        uid=op.uid,
        name=op.name,
        parallelism=op.parallelism,
        max_parallelism=op.max_parallelism,
        key_spec=key_spec,
        backend=op_backend,
        coordinator_state=op.coordinator_state,
        fully_finished=op.fully_finished,
        finished_subtasks=op.finished_subtasks,
        subtasks=tuple(subtasks),
        states=tuple(states),
    )


# -- the state_meta table ------------------------------------------------------------------------


def _schema() -> pa.Schema:
    import pyarrow as pa

    kg = pa.struct([("subtask", pa.int32()), ("start", pa.int32()), ("end", pa.int32())])
    return pa.schema(
        [
            ("operator_id", pa.string()),
            ("operator_uid", pa.string()),
            ("operator_name", pa.string()),
            ("parallelism", pa.int32()),
            ("max_parallelism", pa.int32()),
            ("state_name", pa.string()),
            ("kind", pa.string()),
            ("key_type", pa.string()),
            ("namespace_type", pa.string()),
            ("user_key_type", pa.string()),
            ("value_type", pa.string()),
            ("key_serializer", pa.string()),
            ("namespace_serializer", pa.string()),
            ("user_key_serializer", pa.string()),
            ("value_serializer", pa.string()),
            ("ttl", pa.bool_()),
            ("backend", pa.string()),
            ("format", pa.string()),
            ("decodable", pa.bool_()),
            ("reason", pa.string()),
            ("size_bytes", pa.int64()),
            ("key_groups", pa.list_(kg)),
            ("table_name", pa.string()),
            ("changelog_changes", pa.int64()),
            ("declared_ttl_ms", pa.int64()),
            ("pickled_columns", pa.list_(pa.string())),
            ("value_decoding", pa.string()),
            ("value_decoding_hint", pa.string()),
        ]
    )


def _snapshot_class(spec: SerializerSpec | None) -> str | None:
    if spec is None:
        return None
    return spec.snapshot_class or None


def state_meta_table(
    meta: StateMeta,
    declared_ttl: dict[tuple[str, str], int] | None = None,
    pickled_columns: Callable[[StateInfo], list[str]] | None = None,
    value_decoding: Callable[[StateInfo], tuple[str, str | None]] | None = None,
) -> pa.Table:
    """The ``state_meta`` table of a StateMeta model (one row per state); ``declared_ttl``:
    ``(operator id, state) -> ms`` from a SQL plan (:func:`~statequery.metadata.ttl.declared_ttls`).
    ``value_decoding``: how a state's values are decoded and, when raw, what to supply (the
    facade's, which knows the read options; default :func:`default_value_decoding`).
    """
    import pyarrow as pa

    rows: dict[str, list[Any]] = {name: [] for name in _schema().names}
    for op in meta.operators:
        ranges = [
            {"subtask": s.index, "start": s.key_groups.start, "end": s.key_groups.end}
            for s in op.subtasks
            if s.key_groups is not None
        ]
        for s in op.states:
            rows["operator_id"].append(op.operator_id)
            rows["operator_uid"].append(op.uid)
            rows["operator_name"].append(op.name)
            rows["parallelism"].append(op.parallelism)
            rows["max_parallelism"].append(op.max_parallelism)
            rows["state_name"].append(s.name)
            rows["kind"].append(s.kind)
            rows["key_type"].append(type_string(s.key_spec))
            rows["namespace_type"].append(type_string(s.namespace_spec))
            rows["user_key_type"].append(type_string(s.user_key_spec))
            rows["value_type"].append(type_string(s.value_spec))
            rows["key_serializer"].append(_snapshot_class(s.key_spec))
            rows["namespace_serializer"].append(_snapshot_class(s.namespace_spec))
            rows["user_key_serializer"].append(_snapshot_class(s.user_key_spec))
            rows["value_serializer"].append(_snapshot_class(s.value_spec))
            rows["ttl"].append(s.ttl)
            rows["backend"].append(s.backend)
            rows["format"].append(s.format)
            rows["decodable"].append(s.decodable)
            rows["reason"].append(s.reason)
            rows["size_bytes"].append(s.size_bytes)
            rows["key_groups"].append(ranges if s.keyed else [])
            rows["table_name"].append(s.table_name)
            rows["changelog_changes"].append(s.changes)
            rows["declared_ttl_ms"].append((declared_ttl or {}).get((op.operator_id, s.name)))
            rows["pickled_columns"].append(pickled_columns(s) if pickled_columns else [])
            decoding, hint = (value_decoding or default_value_decoding)(s)
            rows["value_decoding"].append(decoding)
            rows["value_decoding_hint"].append(hint)
    return pa.Table.from_pydict(rows, schema=_schema())


STATE_META_COLUMNS = (
    "operator_id",
    "operator_uid",
    "operator_name",
    "parallelism",
    "max_parallelism",
    "state_name",
    "kind",
    "key_type",
    "namespace_type",
    "user_key_type",
    "value_type",
    "key_serializer",
    "namespace_serializer",
    "user_key_serializer",
    "value_serializer",
    "ttl",
    "backend",
    "format",
    "decodable",
    "reason",
    "size_bytes",
    "key_groups",
    "table_name",
    "changelog_changes",
    "declared_ttl_ms",
    "pickled_columns",
    "value_decoding",
    "value_decoding_hint",
)
