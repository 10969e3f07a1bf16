"""The changelog state backend's change log, parsed (the model's view of it).

A ``ChangelogStateBackendHandle`` (:class:`~statequery.metadata.handles.ChangelogHandle`) holds
the underlying backend's own snapshot (the *materialized* base, empty before the first
materialization) and the state changes logged since: ``ChangelogStateHandleStreamImpl`` (file
handles and offsets into the file-system change log) or ``InMemoryChangelogStateHandle``
(inline in ``_metadata``). This module reads the log: its metadata records (a state's
``StateMetaInfoSnapshot``, TTL flag, default value, short id) and its data changes in order, so
the model can list the states a log registers and count the changes applied to each
(:func:`summarize`). :mod:`statequery.backends.changelog` applies them.

The byte formats are described in docs/format-notes.md ("Changelog state backend").
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from statequery.decoder import DecodeError, Decoder
from statequery.exceptions import CorruptStateError, StatequeryError, UnsupportedFormatError
from statequery.metadata.handles import (
    ChangelogHandle,
    ChangelogStreamHandle,
    IncrementalHandle,
    InMemoryChangelogHandle,
    KeyGroupsHandle,
)
from statequery.metadata.javaser import TtlConfig, read_ttl_config
from statequery.metadata.proxy import _read_state_meta, _Unknown
from statequery.metadata.state import StateInfo
from statequery.serializers.readers import reader_for
from statequery.serializers.spec import (
    PojoField,
    PojoSpec,
    PrimitiveSpec,
    SerializerSpec,
    TimerSpec,
)

__all__ = [
    "ChangeLog",
    "ChangelogSummary",
    "read_change_log",
    "skipper",
    "summarize",
    "unmerged_meta",
    "unmerged_reason",
]


#: StateChangeOperation codes as Flink 2.3 writes them (metadata records are 8 in its logs;
#: some Flink sources list a REMOVE_FIRST_ELEMENT 8 and METADATA 9, which its logs do not use)
CLEAR, SET, SET_INTERNAL, ADD, MERGE_NS = 0, 1, 2, 3, 4
ADD_ELEMENT, ADD_OR_UPDATE_ELEMENT, REMOVE_ELEMENT, METADATA = 5, 6, 7, 8
OPERATIONS = (
    "CLEAR", "SET", "SET_INTERNAL", "ADD", "MERGE_NS", "ADD_ELEMENT", "ADD_OR_UPDATE_ELEMENT",
    "REMOVE_ELEMENT", "METADATA",
)
#: the key group of metadata records (AbstractStateChangeLogger.COMMON_KEY_GROUP)
META_KEY_GROUP = -1

#: the state holding the values a reducing or aggregating state's ``MERGE_NS`` could not merge
#: without the job's function: ``<state>/unmerged`` (:func:`unmerged_meta`)
UNMERGED_SUFFIX = "/unmerged"
#: the class name of its values (``merges_into``, ``reason``, ``value``)
UNMERGED_CLASS = "statequery.UnmergedValue"
#: why they are not merged
UNMERGED_REASON = (
    "MERGE_NS of a {kind} state in the change log: merging two or more values needs the "
    "job's {function}, which the checkpoint does not hold"
)
#: the keyed state types whose MERGE_NS needs the job's function
MERGING_WITH_FUNCTION = {"REDUCING": "ReduceFunction", "AGGREGATING": "AggregateFunction"}


@dataclass
class ChangeLog:
    """The parsed change log of one subtask: the states its metadata records register (in
    registration order, last registration wins), and the data changes in log order as
    ``(key group, operation, state name, payload)`` (payload: the bytes after the state id)."""

    states: dict[str, StateInfo] = field(default_factory=dict)
    changes: list[tuple[int, int, str, bytes]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    source: str = ""
    #: state name -> its StateTtlConfig, as the metadata record carries it
    ttl: dict[str, TtlConfig] = field(default_factory=dict)
    #: the reducing and aggregating states with a ``MERGE_NS`` in the log, in log order
    merging: list[str] = field(default_factory=list)
    #: the state ids of the metadata records
    ids: dict[int, str] = field(default_factory=dict)

    @property
    def key_spec(self) -> SerializerSpec | None:
        """The key serializer as a timer state's ``TimerSerializer`` records it (the change log
        itself does not record the operator's key serializer)."""
        for meta in self.states.values():
            spec = meta.serializers.get("VALUE_SERIALIZER")
            if isinstance(spec, TimerSpec):
                return spec.key
        return None


def _file_cache(resolver: Any) -> dict[str, bytes]:
    """The change-log files read for one savepoint (its resolver), by location: one file holds
    the change sets of every subtask of a task (and of several checkpoints), so each subtask's
    handle, the model's summary and the merge would otherwise read it again."""
    try:
        cache: dict[str, bytes] = resolver.__dict__.setdefault("_changelog_files", {})
    except AttributeError:  # a resolver without a __dict__: no cache across calls
        return {}
    return cache


def _stream_bytes(resolver: Any, handle: Any, cache: dict[str, bytes]) -> bytes:
    """A change-log file's bytes after its compression flag, decompressed."""
    name = resolver.source_name(handle)
    # files only, by location (inline bytes cost no read and may share a display name)
    key = resolver.location(handle) if hasattr(resolver, "location") else None
    if not key:
        return _read_stream(resolver, handle, name)
    got = cache.get(key)
    if got is not None:
        return got
    reading = (id(cache), key)
    with _REGISTRY_LOCK:  # one read per file when subtasks' summaries run in parallel
        lock = _FILE_LOCKS.setdefault(reading, threading.Lock())
    try:
        with lock:
            got = cache.get(key)
            if got is None:
                got = cache[key] = _read_stream(resolver, handle, name)
    finally:
        with _REGISTRY_LOCK:
            _FILE_LOCKS.pop(reading, None)
    return got


#: per (file cache, change-log file location), while it is being read
_FILE_LOCKS: dict[tuple[int, str], threading.Lock] = {}


def _read_stream(resolver: Any, handle: Any, name: str) -> bytes:
    """A change-log file read whole, its compression flag checked and dropped."""
    # the whole file: the handle's size counts the (uncompressed) bytes after the one-byte
    # compression flag, not the file's
    raw = bytes(resolver.read(handle, 0, None))
    if not raw:
        raise CorruptStateError("empty change-log file", name, 0)
    if raw[0] == 0:
        data = raw[1:]
    elif raw[0] == 1:
        data = _snappy(raw[1:], name)
    else:
        raise CorruptStateError(f"change-log compression flag {raw[0]} (want 0 or 1)", name, 0)
    return data


def _change_set(data: bytes, offset: int, name: str) -> Iterator[tuple[int, bytes]]:
    """The changes of one change set (``StateChangeFormat``): int groups, then per group int
    count, int key group, count × (int length, bytes)."""
    d = Decoder(data, source=name)
    d.pos = offset
    groups = d.read_int()
    if not 0 <= groups <= len(data):
        raise d.error(f"impossible key-group count {groups} in a change set", offset)
    for _ in range(groups):
        n = d.read_int()
        kg = d.read_int()
        if not 0 <= n <= len(data):
            raise d.error(f"impossible change count {n}", d.pos - 8)
        for _ in range(n):
            size = d.read_int()
            if not 0 <= size <= len(data) - d.pos:
                raise d.error(f"impossible change length {size}", d.pos - 4)
            yield kg, d.read_bytes(size)


def raw_changes(
    resolver: Any, handle: ChangelogHandle, skip: int = 0
) -> Iterator[tuple[int, bytes, str]]:
    """Every logged change of ``handle``'s non-materialized part, in order:
    ``(key group, change bytes, source name)``; ``skip``: after its first ``skip`` change sets
    (:func:`log_parts`), which are not read."""
    cache = _file_cache(resolver)
    for part in handle.non_materialized:
        if isinstance(part, ChangelogStreamHandle):
            for stream, offset in part.streams:
                if skip > 0:
                    skip -= 1
                    continue
                name = resolver.source_name(stream)
                data = _stream_bytes(resolver, stream, cache)
                if not 0 <= offset <= len(data):
                    raise CorruptStateError(
                        f"change set offset {offset} past the end ({len(data)} bytes)", name, 0
                    )
                for kg, change in _change_set(data, offset, name):
                    yield kg, change, name
        elif isinstance(part, InMemoryChangelogHandle):
            if skip > 0:
                skip -= 1
                continue
            for kg, change in part.changes:
                yield kg, change, "_metadata (inline change log)"
        else:
            raise UnsupportedFormatError(
                f"change-log handle {type(part).__name__} "
                f"(type {getattr(part, 'handle_type', '?')}) is not supported"
            )


def log_parts(resolver: Any, handle: ChangelogHandle) -> tuple[tuple[str, int], ...]:
    """The change sets of ``handle``'s log, in order, as ``(file location, offset)`` (an inline
    log: a name no other handle has). A later checkpoint of the same subtask on the same
    materialized base lists the earlier one's change sets first, then its own."""
    out: list[tuple[str, int]] = []
    for part in handle.non_materialized:
        if isinstance(part, ChangelogStreamHandle):
            for stream, offset in part.streams:
                loc = resolver.location(stream) if hasattr(resolver, "location") else None
                out.append((loc or f"inline:{id(stream)}", offset))
        else:
            out.append((f"inline:{id(part)}", 0))
    return tuple(out)


def base_parts(resolver: Any, handle: ChangelogHandle) -> tuple[str, ...]:
    """The files of ``handle``'s materialized base (empty before the first materialization)."""
    out: list[str] = []
    for base in handle.materialized:
        for stream in base.stream_handles():
            loc = resolver.location(stream) if hasattr(resolver, "location") else None
            out.append(loc or f"inline:{id(stream)}")
    return tuple(out)


def chain_key(resolver: Any, handle: ChangelogHandle, *extra: Any) -> tuple[Any, ...] | None:
    """What the checkpoints of one subtask on one materialized base share: the base's files,
    else (the log alone) the first change set, which no other subtask's log has; None when
    neither names it (no base and an empty log)."""
    base = base_parts(resolver, handle)
    if base:
        return ("base", base, handle.start_key_group, handle.num_key_groups, *extra)
    parts = log_parts(resolver, handle)
    if parts and not parts[0][0].startswith("inline:"):
        return ("log", parts[0], handle.start_key_group, handle.num_key_groups, *extra)
    return None


class ChainRegistry:
    """The last result per :func:`chain_key`, for one FileIO (the versions a job opens share
    it): a later checkpoint of the same chain resumes from it and reads only its own change
    sets. Bounded (the oldest chains are dropped)."""

    LIMIT = 256

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[Any, tuple[tuple[tuple[str, int], ...], Any]] = {}

    def get(self, key: Any, parts: tuple[tuple[str, int], ...]) -> Any:
        """The stored value whose change sets are a prefix of ``parts`` (None if none)."""
        if key is None:
            return None
        with self._lock:
            got = self._items.get(key)
        if got is None or parts[: len(got[0])] != got[0]:
            return None
        return got

    def put(self, key: Any, parts: tuple[tuple[str, int], ...], value: Any) -> None:
        if key is None:
            return
        with self._lock:
            self._items.pop(key, None)
            self._items[key] = (parts, value)
            while len(self._items) > self.LIMIT:
                del self._items[next(iter(self._items))]


def chain_registry(resolver: Any, name: str) -> ChainRegistry | None:
    """The :class:`ChainRegistry` ``name`` of the resolver's FileIO (None without one)."""
    io = getattr(resolver, "io", None)
    try:
        store = io.__dict__
    except AttributeError:
        return None
    with _REGISTRY_LOCK:
        got = store.get(f"_changelog_{name}")
        if got is None:
            got = store[f"_changelog_{name}"] = ChainRegistry()
    return got


_REGISTRY_LOCK = threading.Lock()


def read_change_log(
    resolver: Any, handle: ChangelogHandle, resume: ChangeLog | None = None, skip: int = 0
) -> ChangeLog:
    """Parse ``handle``'s change log (metadata records and data changes, in order). With
    ``resume`` (the log of the same subtask's first ``skip`` change sets): only the change sets
    after them are read; the result has their states, ids and counts, and only the new
    changes."""
    log = ChangeLog()
    if resume is not None:
        log = ChangeLog(states=dict(resume.states), counts=dict(resume.counts),
                        source=resume.source, ttl=dict(resume.ttl),
                        merging=list(resume.merging), ids=dict(resume.ids))
    ids = log.ids
    lo, hi = handle.start_key_group, handle.start_key_group + handle.num_key_groups - 1
    for kg, change, name in raw_changes(resolver, handle, skip if resume is not None else 0):
        log.source = log.source or name
        if not change:
            raise CorruptStateError(f"empty state change in key group {kg}", name, 0)
        op = change[0]
        d = Decoder(change, source=name)
        d.pos = 1
        if op == METADATA:
            meta, sid, ttl = _metadata_record(d)
            ids[sid] = meta.name
            log.states[meta.name] = meta
            if ttl is not None:
                log.ttl[meta.name] = ttl
            log.counts.setdefault(meta.name, 0)
            continue
        if op >= len(OPERATIONS):
            raise CorruptStateError(f"unknown state change operation {op}", name, 0)
        sid = d.read_short()
        state = ids.get(sid)
        if state is None:
            raise CorruptStateError(
                f"state change for state id {sid}, which no metadata record registered", name, 0
            )
        if not lo <= kg <= hi:
            continue  # Flink applies only the changes of the handle's key groups
        log.changes.append((kg, op, state, change[3:]))
        if (op == MERGE_NS and state not in log.merging
                and log.states[state].state_type in MERGING_WITH_FUNCTION):
            log.merging.append(state)
        log.counts[state] = log.counts.get(state, 0) + 1
    return log


def _metadata_record(d: Decoder) -> tuple[StateInfo, int, TtlConfig | None]:
    """A METADATA record after its operation byte: int version, the ``StateMetaInfoSnapshot``,
    for key-value states the TTL flag (+ Java-serialized ``StateTtlConfig``) and the default
    value flag (+ value), then the short state id and the byte backend state type. Returns the
    meta-info, the state id and the TTL config (None without TTL)."""
    version = d.read_int()
    if version < 6:
        raise UnsupportedFormatError(
            f"{d.source}: change-log metadata record of state meta-info version {version}"
        )
    try:
        meta = _read_state_meta(d, 0)
    except _Unknown as e:  # the record has no length: nothing after an unknown payload is found
        raise UnsupportedFormatError(
            f"{d.source}: change-log metadata record of state {e.partial.name!r}: {e}") from e
    if meta.reason:
        raise UnsupportedFormatError(f"{d.source}: state {meta.name!r}: {meta.reason}")
    ttl = None
    if meta.backend_type in ("KEY_VALUE", "KEY_VALUE_V2"):
        if d.read_bool():
            # the Java-serialized StateTtlConfig (ObjectOutputStream, no length prefix): parsed
            # by its stream structure; the values' layout does not depend on it (the value
            # serializer in the meta-info snapshot is already the TtlSerializer)
            ttl = read_ttl_config(d)
        if d.read_bool():
            value = meta.serializers.get("VALUE_SERIALIZER")
            skip = skipper(value, meta.name, "default value")
            at = d.pos
            try:
                d.pos = skip(d.buf, d.pos, len(d.buf))
            except (DecodeError, IndexError, struct.error) as e:
                raise d.error(f"state {meta.name!r}: corrupt default value ({e})", at) from e
            if d.pos > len(d.buf):
                raise d.error(f"state {meta.name!r}: the default value runs past the record", at)
    sid = d.read_short()
    d.read_byte()  # the backend state type again
    return meta, sid, ttl


def skipper(spec: SerializerSpec | None, state: str, what: str) -> Any:
    """``skip_at(buf, pos, end) -> pos`` of ``spec``'s values (the log has no lengths)."""
    if spec is None:
        raise UnsupportedFormatError(f"state {state!r} has no {what} serializer")
    r = reader_for(spec)
    if r.greedy or not spec.decodable:
        raise UnsupportedFormatError(
            f"state {state!r}: its {what} serializer ({spec.display}) cannot be delimited in the "
            "change log (no length prefixes); the state cannot be read")
    return r.skip_at


def _snappy(data: bytes, name: str) -> bytes:
    """A snappy-compressed log (``SnappyStreamCompressionDecorator``: the framing format)."""
    import cramjam

    if not data.startswith(b"\xff\x06\x00\x00sNaPpY"):
        raise CorruptStateError("snappy stream identifier expected after the flag", name, 1)
    try:
        return bytes(cramjam.snappy.decompress(data))
    except cramjam.DecompressionError as e:
        raise CorruptStateError(f"corrupt snappy data: {e}", name, 1) from e


@dataclass(frozen=True)
class ChangelogSummary:
    """What one subtask's change log says, for the StateMeta model: the states it registers
    (base states first), the changes logged per state, the key serializer when it can tell,
    or the error that stops reading it."""

    states: tuple[StateInfo, ...] = ()
    counts: dict[str, int] = field(default_factory=dict)
    key: SerializerSpec | None = None
    error: str | None = None


def summarize(resolver: Any, handle: ChangelogHandle) -> ChangelogSummary:
    for base in handle.materialized:
        if not (isinstance(base, IncrementalHandle)
                or (isinstance(base, KeyGroupsHandle) and _heap_layout(base))):
            return ChangelogSummary(error=(
                f"changelog state backend: materialized handle {type(base).__name__} (type "
                f"{getattr(base, 'handle_type', '?')}) is not read under a change log"))
    try:
        log = chained_change_log(resolver, handle, "summaries")
    except (StatequeryError, ValueError) as e:
        return ChangelogSummary(error=f"changelog state backend: {e}")
    unmerged = tuple(unmerged_meta(log.states[n]) for n in log.merging)
    return ChangelogSummary(tuple(log.states.values()) + unmerged,
                            {**log.counts, **{m.name: 0 for m in unmerged}}, log.key_spec)


def chained_change_log(resolver: Any, handle: ChangelogHandle, name: str) -> ChangeLog:
    """:func:`read_change_log`, resumed from the last log of the same chain (:func:`chain_key`)
    read through the same FileIO when it is a prefix of this one: only the new change sets are
    read. The result's ``changes`` are then only the new ones (the states and counts are the
    whole log's); callers that need every change use :func:`read_change_log`."""
    registry = chain_registry(resolver, name)
    key = chain_key(resolver, handle)
    parts = log_parts(resolver, handle)
    got = registry.get(key, parts) if registry is not None else None
    if got is None:
        log = read_change_log(resolver, handle)
    else:
        log = read_change_log(resolver, handle, got[1], len(got[0]))
    if registry is not None:
        registry.put(key, parts, ChangeLog(
            states=dict(log.states), counts=dict(log.counts), source=log.source,
            ttl=dict(log.ttl), merging=list(log.merging), ids=dict(log.ids)))
    return log


def unmerged_meta(meta: StateInfo) -> StateInfo:
    """The state ``<state>/unmerged`` of a reducing or aggregating state whose change log merges
    namespaces (session windows) before a materialization: a value state in the same key and
    namespace (the window a value was in) whose values are ``{merges_into, reason, value}``
    (the window it merges into, why it is not merged, the value or accumulator). Flink merges
    them with the job's function, which a checkpoint does not hold."""
    value = meta.serializers.get("VALUE_SERIALIZER")
    ns = meta.serializers.get("NAMESPACE_SERIALIZER")
    fields = (
        PojoField("merges_into", UNMERGED_CLASS, ns),
        PojoField("reason", UNMERGED_CLASS, PrimitiveSpec(name="string")),
        PojoField("value", UNMERGED_CLASS, value),
    )
    serializers = {k: v for k, v in meta.serializers.items() if k != "VALUE_SERIALIZER"}
    serializers["VALUE_SERIALIZER"] = PojoSpec(class_name=UNMERGED_CLASS, fields=fields)
    return StateInfo.from_header(
        name=meta.name + UNMERGED_SUFFIX,
        backend_type=meta.backend_type,
        options={**meta.options, "KEYED_STATE_TYPE": "VALUE"},
        serializers=serializers,
        error=meta.reason,
        key_spec=meta.key_spec,
    )


def unmerged_reason(meta: StateInfo) -> str:
    """The ``reason`` of ``meta``'s unmerged values."""
    kind = meta.state_type or ""
    return UNMERGED_REASON.format(
        kind=kind.lower(), function=MERGING_WITH_FUNCTION.get(kind, "function"))


def _heap_layout(handle: KeyGroupsHandle) -> bool:
    """A type-12 handle with an offset for every key group: the hashmap layout."""
    offsets = tuple(handle.offsets)
    return handle.handle_type == 12 and bool(offsets) and all(o > 0 for o in offsets)
