"""The changelog state backend's keyed state: a materialized base plus the logged changes.

A ``ChangelogStateBackendHandle`` (:class:`~statequery.metadata.handles.ChangelogHandle`) holds
the underlying backend's own snapshot (the *materialized* base, empty before the first
materialization) and the state changes logged since (``ChangelogStateHandleStreamImpl``: file
handles and offsets into the file-system change log; ``InMemoryChangelogStateHandle``: inline).

Reading follows Flink's restore (``ChangelogBackendRestoreOperation``): the base is read, then
every logged change is applied in log order — metadata records (a state's
``StateMetaInfoSnapshot``, its TTL flag and default value, its short id in the log), then
``CLEAR``/``SET``/``SET_INTERNAL``/``ADD``/``ADD_ELEMENT``/``ADD_OR_UPDATE_ELEMENT``/
``REMOVE_ELEMENT``/``MERGE_NS`` on a key and namespace, and the timers' priority-queue
additions and removals. Everything is done on the serialized bytes (the serializers only
delimit them); the merged state is then laid out as one hashmap-checkpoint key-group stream in
memory and read by :class:`~statequery.backends.HeapKeyedBackend`, so both decode paths
(compiled and pure Python) read it exactly as they read a hashmap checkpoint.

The log is parsed by :mod:`statequery.metadata.changelog`; the byte formats are described in
docs/format-notes.md ("Changelog state backend").
"""

from __future__ import annotations

import copy
import dataclasses
import struct
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from statequery.backends.fastpath import length_suffixed
from statequery.backends.keygroups import skip_length_suffix
from statequery.decoder import DecodeError
from statequery.exceptions import CorruptStateError, UnsupportedFormatError
from statequery.metadata.changelog import (
    ADD,
    ADD_ELEMENT,
    ADD_OR_UPDATE_ELEMENT,
    CLEAR,
    MERGE_NS,
    OPERATIONS,
    REMOVE_ELEMENT,
    SET,
    SET_INTERNAL,
    ChangeLog,
    chain_key,
    chain_registry,
    log_parts,
    read_change_log,
    skipper,
    unmerged_meta,
    unmerged_reason,
)
from statequery.metadata.handles import ChangelogHandle, KeyGroupsHandle
from statequery.metadata.state import StateInfo
from statequery.serializers.spec import ListSpec, MapSpec, PrimitiveSpec, SerializerSpec, TtlSpec

__all__ = ["ChangelogKeyedBackend", "merge"]

_I32 = struct.Struct(">i").unpack_from
#: the heap backend's state kinds from the changelog's point of view
_VALUE, _LIST, _MAP, _QUEUE = "value", "list", "map", "queue"


def _kind(meta: StateInfo) -> str:
    if meta.backend_type == "PRIORITY_QUEUE":
        return _QUEUE
    t = meta.state_type
    if t == "LIST":
        return _LIST
    if t == "MAP":
        return _MAP
    return _VALUE


class _State:
    """One state's merged content, as serialized bytes.

    ``entries``: ``(key group, namespace bytes, key bytes) -> value`` (value: bytes; list: list
    of element bytes; map: dict of user-key bytes to the null flag + value bytes); queues:
    ``(key group, element bytes) -> None``.
    """

    def __init__(self, meta: StateInfo, key: SerializerSpec | None) -> None:
        self.meta = meta
        self.name = meta.name
        self.kind = _kind(meta)
        self.entries: dict[Any, Any] = {}
        #: reducing/aggregating state: ``(key group, target namespace, key) -> [(namespace,
        #: value)]``, the values a ``MERGE_NS`` merges into the target that only the job's
        #: function could merge (two or more of them)
        self.unmerged: dict[Any, list[tuple[bytes, bytes]]] = {}
        value = meta.serializers.get("VALUE_SERIALIZER")
        self.value_spec = value
        if self.kind == _QUEUE:
            self.element = skipper(value, self.name, "element")
            return
        self.key = skipper(key, self.name, "key")
        ns = meta.serializers.get("NAMESPACE_SERIALIZER")
        self.ns = skipper(ns, self.name, "namespace")
        # RocksDB composite keys: key and namespace both of variable length carry length
        # suffixes (SerializedCompositeKeyBuilder's "ambiguous" keys); the log's do not
        self.ambiguous = length_suffixed(key, ns)
        self.value = skipper(value, self.name, "value")
        if self.kind == _LIST:
            inner = value.inner if isinstance(value, TtlSpec) else value
            if not isinstance(inner, ListSpec):
                raise UnsupportedFormatError(
                    f"list state {self.name!r}: its serializer is not a ListSerializer")
            self.elem = skipper(inner.element, self.name, "list element")
        if self.kind == _MAP:
            if not isinstance(value, MapSpec):
                raise UnsupportedFormatError(
                    f"map state {self.name!r}: its serializer is not a MapSerializer")
            self.user_key = skipper(value.key, self.name, "map key")
            self.map_value = skipper(value.value, self.name, "map value")

    def copy(self) -> _State:
        """An independent copy (the containers copied; the bytes are immutable)."""
        out = copy.copy(self)
        out.entries = {k: list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict)
                       else v for k, v in self.entries.items()}
        out.unmerged = {k: list(v) for k, v in self.unmerged.items()}
        return out

    # -- the serialized containers -----------------------------------------------------------

    def _list(self, buf: bytes, pos: int) -> tuple[list[bytes], int]:
        n = _I32(buf, pos)[0]
        pos += 4
        out = []
        for _ in range(n):
            end = self.elem(buf, pos, len(buf))
            out.append(buf[pos:end])
            pos = end
        return out, pos

    def _map(self, buf: bytes, pos: int) -> tuple[dict[bytes, bytes], int]:
        n = _I32(buf, pos)[0]
        pos += 4
        out = {}
        for _ in range(n):
            kend = self.user_key(buf, pos, len(buf))
            null = buf[kend]
            vend = kend + 1 if null else self.map_value(buf, kend + 1, len(buf))
            out[buf[pos:kend]] = buf[kend:vend]
            pos = vend
        return out, pos

    def _value(self, buf: bytes, pos: int) -> tuple[Any, int]:
        if self.kind == _LIST:
            return self._list(buf, pos)
        if self.kind == _MAP:
            return self._map(buf, pos)
        end = self.value(buf, pos, len(buf))
        return buf[pos:end], end

    def _put(self, k: Any, v: Any) -> None:
        if self.kind in (_LIST, _MAP) and not v:
            self.entries.pop(k, None)  # the heap backend keeps no empty list or map
        else:
            self.entries[k] = v

    # -- the materialized base (hashmap layout) ------------------------------------------------

    def read_base(self, buf: bytes, pos: int, kg: int) -> int:
        n = _I32(buf, pos)[0]
        pos += 4
        end = len(buf)
        for _ in range(n):
            if self.kind == _QUEUE:
                e = self.element(buf, pos, end)
                self.entries[(kg, buf[pos:e])] = None
                pos = e
                continue
            nend = self.ns(buf, pos, end)
            kend = self.key(buf, nend, end)
            v, after = self._value(buf, kend)
            self._put((kg, buf[pos:nend], buf[nend:kend]), v)
            pos = after
        return pos

    def read_rocksdb(self, kg: int, composite: bytes, value: bytes, prefix: int) -> None:
        """One RocksDB entry of the base: key-group prefix, key, namespace (then the user key
        of a map entry), with a length suffix after the key and after the namespace when both
        are of variable length; list values are the elements joined by ``,``; map values the
        null flag and the value; a timer's key is its element, its value empty."""
        if self.kind == _QUEUE:
            self.entries[(kg, composite[prefix:])] = None
            return
        end = len(composite)
        kend = self.key(composite, prefix, end)
        nstart = kend
        if self.ambiguous:
            nstart = skip_length_suffix(composite, kend, end, kend - prefix, "key")
        nend = self.ns(composite, nstart, end)
        k = (kg, composite[nstart:nend], composite[prefix:kend])
        if self.ambiguous:
            nend = skip_length_suffix(composite, nend, end, nend - nstart, "namespace")
        if self.kind == _MAP:
            m = self.entries.setdefault(k, {})
            m[composite[nend:]] = value
            return
        if nend != end:
            raise CorruptStateError(
                f"state {self.name!r}: {end - nend} bytes after the namespace of a RocksDB key",
                "", 0)
        if self.kind == _LIST:
            elems, pos, vend = [], 0, len(value)
            while pos < vend:
                e = self.elem(value, pos, vend)
                elems.append(value[pos:e])
                pos = e
                if pos < vend:
                    if value[pos] != 0x2C:
                        raise CorruptStateError(
                            f"list state {self.name!r}: no ',' between two elements", "", 0)
                    pos += 1
            self._put(k, elems)
        else:
            self._put(k, value)

    # -- one logged change --------------------------------------------------------------------

    def apply(self, kg: int, op: int, buf: bytes) -> None:
        end = len(buf)
        if self.kind == _QUEUE:
            if op == ADD_ELEMENT:
                n = _I32(buf, 0)[0]
                pos = 4
                for _ in range(n):
                    e = self.element(buf, pos, end)
                    self.entries[(kg, buf[pos:e])] = None
                    pos = e
            elif op == REMOVE_ELEMENT:
                self.entries.pop((kg, buf[: self.element(buf, 0, end)]), None)
            else:
                raise UnsupportedFormatError(
                    f"priority queue {self.name!r}: change {OPERATIONS[op]} is not supported "
                    "(Flink's own restore does not apply it either)"
                )
            return
        kend = self.key(buf, 0, end)
        nend = self.ns(buf, kend, end)
        k = (kg, buf[kend:nend], buf[:kend])
        if op == CLEAR:
            self.entries.pop(k, None)
            self.unmerged.pop(k, None)
        elif op in (SET, SET_INTERNAL):
            v, _ = self._value(buf, nend)
            self._put(k, v)
            self.unmerged.pop(k, None)  # the job's merged value, logged again whole
        elif op == ADD and self.kind == _LIST:
            v, _ = self._list(buf, nend)
            self._put(k, [*self.entries.get(k, []), *v])
        elif op == ADD and self.kind == _MAP:
            v, _ = self._map(buf, nend)
            self._put(k, {**self.entries.get(k, {}), **v})
        elif op == ADD_ELEMENT and self.kind == _LIST:
            self._put(k, [*self.entries.get(k, []), buf[nend : self.elem(buf, nend, end)]])
        elif op in (ADD_ELEMENT, ADD_OR_UPDATE_ELEMENT) and self.kind == _MAP:
            uend = self.user_key(buf, nend, end)
            vend = self.map_value(buf, uend, end)
            self._put(k, {**self.entries.get(k, {}), buf[nend:uend]: b"\x00" + buf[uend:vend]})
        elif op == REMOVE_ELEMENT and self.kind == _MAP:
            uend = self.user_key(buf, nend, end)
            m = dict(self.entries.get(k, {}))
            m.pop(buf[nend:uend], None)
            self._put(k, m)
        elif op == MERGE_NS and self.kind == _LIST:
            # target, int n, n sources: the sources' lists appended to the target's, sources
            # removed (AbstractHeapMergingState.mergeNamespaces)
            tend = self.ns(buf, nend, end)
            target = buf[nend:tend]
            n = _I32(buf, tend)[0]
            pos = tend + 4
            merged: list[bytes] = []
            for _ in range(n):
                send = self.ns(buf, pos, end)
                merged += self.entries.pop((kg, buf[pos:send], k[2]), [])
                pos = send
            tk = (kg, target, k[2])
            self._put(tk, [*self.entries.get(tk, []), *merged])
        elif op == MERGE_NS and self.kind == _VALUE:
            self._merge_values(kg, k[2], buf, nend, end)
        else:
            raise UnsupportedFormatError(
                f"{self.kind} state {self.name!r}: change {OPERATIONS[op]} is not supported"
                + (" (merging namespaces of a reducing or aggregating state needs the job's "
                   "function)" if op == MERGE_NS else "")
            )

    def _merge_values(self, kg: int, key: bytes, buf: bytes, pos: int, end: int) -> None:
        """``MERGE_NS`` of a reducing or aggregating state (target namespace, ``int n``, ``n``
        source namespaces), as ``AbstractHeapMergingState.mergeNamespaces`` does it: each
        source's value is removed and reduced into the target's. With at most one value among
        the target and the sources no function is called: the target holds that value. Two or
        more need the job's function: they are kept, each with the namespace it was in, as
        unmerged values of the target (until a later ``SET`` or ``CLEAR`` of the target logs
        the job's result; a later merge of the target carries them on to its target)."""
        tend = self.ns(buf, pos, end)
        target = buf[pos:tend]
        n = _I32(buf, tend)[0]
        pos = tend + 4
        values: list[tuple[bytes, bytes]] = []
        for _ in range(n):
            send = self.ns(buf, pos, end)
            sk = (kg, buf[pos:send], key)
            pos = send
            v = self.entries.pop(sk, None)
            if v is not None:
                values.append((sk[1], v))
            values += self.unmerged.pop(sk, [])
        tk = (kg, target, key)
        if not values:
            return
        pending = self.unmerged.get(tk)
        tv = self.entries.get(tk)
        if pending is None and tv is None and len(values) == 1:
            self.entries[tk] = values[0][1]
            return
        pending = self.unmerged.setdefault(tk, [])
        if tv is not None:
            del self.entries[tk]
            pending.append((target, tv))
        pending += values

    def unmerged_state(self) -> _State:
        """``<state>/unmerged``: one entry per value not merged, at the namespace it was in,
        its value ``{merges_into, reason, value}`` (PojoSerializer bytes: no subclass flag,
        then each field's null flag and bytes)."""
        st = _State(unmerged_meta(self.meta), None if self.kind == _QUEUE else _NO_KEY)
        st.key = self.key
        reason = _java_string(unmerged_reason(self.meta))
        for (kg, target, key), values in self.unmerged.items():
            for ns, v in values:
                st.entries[(kg, ns, key)] = b"".join(
                    (b"\x02\x00", target, b"\x00", reason, b"\x00", v))
        return st

    # -- the hashmap layout of the merged state -----------------------------------------------

    def by_key_group(self) -> dict[int, list[tuple[Any, Any]]]:
        out: dict[int, list[tuple[Any, Any]]] = {}
        for k, v in self.entries.items():
            out.setdefault(k[0], []).append((k, v))
        return out

    def write(self, rows: list[tuple[Any, Any]], out: bytearray) -> None:
        out += struct.pack(">i", len(rows))
        if self.kind == _QUEUE:
            for (_, e), _none in rows:
                out += e
            return
        for (_, ns, key), v in rows:
            out += ns
            out += key
            if self.kind == _LIST:
                out += struct.pack(">i", len(v))
                for e in v:
                    out += e
            elif self.kind == _MAP:
                out += struct.pack(">i", len(v))
                for uk, fv in v.items():
                    out += uk
                    out += fv
            else:
                out += v


#: a key serializer placeholder for :meth:`_State.unmerged_state` (its key skipper is copied)
_NO_KEY = PrimitiveSpec(name="long")


def _java_string(text: str) -> bytes:
    """``StringValue.writeString`` of a string of BMP characters: length + 1, then each char,
    as 7-bit groups with a continuation bit."""
    out = bytearray()

    def varint(n: int) -> None:
        while n >= 0x80:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)

    varint(len(text) + 1)
    for c in text:
        varint(ord(c))
    return bytes(out)


class _MemoryStream:
    """A :class:`~statequery.backends.keygroups.ByteStream` over bytes built in memory."""

    def __init__(self, name: str, data: bytes) -> None:
        self.name = name
        self.data = data
        self.read_gap = 0

    def size(self) -> int:
        return len(self.data)

    def read_range(self, start: int, length: int) -> bytes:
        return self.data[start : start + length]


@dataclass
class Merged:
    """One subtask's keyed state after the change log: the hashmap-layout stream and what the
    log held (per state: the number of changes applied)."""

    stream: _MemoryStream
    offsets: tuple[int, ...]
    key: SerializerSpec
    states: list[StateInfo]
    counts: dict[str, int]


def _heap_base(
    resolver: Any, base: KeyGroupsHandle, key: SerializerSpec | None, states: dict[str, _State]
) -> tuple[SerializerSpec, list[StateInfo]]:
    """Read a hashmap base (type-12 key groups) into ``states`` (created from its header)."""
    from statequery.backends.base import HandleStream, read_proxy
    from statequery.backends.heap import HeapKeyGroupStream
    from statequery.metadata.handles import is_heap_layout

    if not is_heap_layout(base):
        raise UnsupportedFormatError(
            "changelog state backend: a materialized base in the key-group stream layout is "
            "not supported")
    stream = HandleStream(resolver, base.delegate)
    positive = [o for o in base.offsets if o > 0]
    proxy = read_proxy(stream, min(positive) if positive else 0)
    key = key or proxy.key_serializer
    by_id = []
    for meta in proxy.states:
        st = _State(meta, key)
        states[meta.name] = st
        by_id.append(st)
    groups = HeapKeyGroupStream(
        stream, {base.start_key_group + i: o for i, o in enumerate(base.offsets)},
        proxy.compressed)
    for kg, start, buf, pos in groups.key_group_bytes():
        try:
            while pos < len(buf):
                sid = struct.unpack_from(">H", buf, pos)[0]
                if sid >= len(by_id):
                    raise CorruptStateError(f"key group {kg}: state id {sid}", stream.name,
                                            start)
                pos = by_id[sid].read_base(buf, pos + 2, kg)
        except (IndexError, struct.error, DecodeError) as e:
            raise CorruptStateError(
                f"key group {kg} of the materialized base: {_why(e)}", stream.name, start
            ) from e
    return key, list(proxy.states)


def _rocksdb_base(
    context: Any, base: Any, key: SerializerSpec | None, states: dict[str, _State]
) -> tuple[SerializerSpec, list[StateInfo]]:
    """Read a RocksDB base (the handle of an incremental or full native snapshot) into
    ``states``: every column family's entries, from the table files (SST reader)."""
    from statequery.backends.rocksdb import RocksDBKeyedBackend

    backend = RocksDBKeyedBackend(base, context)
    proxy = backend.proxy
    key = key or proxy.key_serializer
    metas = list(proxy.states)
    db = backend.open_tables()
    try:
        prefix = db.prefix_bytes
        for meta in metas:
            st = _State(meta, key)
            states[meta.name] = st
            try:
                for kv in db.entries(meta.name):
                    st.read_rocksdb(kv.key_group, kv.key, kv.value, prefix)
            except CorruptStateError:
                raise
            except Exception as e:  # noqa: BLE001 - the reader's own errors, named
                raise db.wrap_error(meta.name, e) from e
    finally:
        db.close()
    return key, metas


def _why(e: Exception) -> str:
    """A bounds error of the readers as text: a :class:`DecodeError`'s message and position,
    else the exception's type and message (a short read ran past the end of the bytes)."""
    if isinstance(e, DecodeError):
        return f"{e.message} at byte {e.pos}"
    return f"truncated ({type(e).__name__}: {e})"


@dataclass
class _Snapshot:
    """A subtask's merged states after its whole log, kept for its next checkpoint on the same
    base (:func:`~statequery.metadata.changelog.chain_key`)."""

    states: dict[str, _State]
    order: list[StateInfo]
    key: SerializerSpec
    log: ChangeLog


def merge(context: Any, handle: ChangelogHandle, key: SerializerSpec | None) -> Merged:
    """The materialized base of ``handle`` with its change log applied.

    When the same FileIO merged an earlier checkpoint of the same subtask on the same base
    whose change sets this log starts with (the versions of a job: they share a materialization
    until the next one), the merge resumes from that result: neither the base nor those change
    sets are read again, only the change sets after them are applied (as Flink would apply
    them on top)."""
    resolver = context.resolver
    registry = chain_registry(resolver, "merges")
    ckey = chain_key(resolver, handle, int(context.max_parallelism), repr(key))
    parts = log_parts(resolver, handle)
    got = registry.get(ckey, parts) if registry is not None else None
    if got is not None:
        snap: _Snapshot = got[1]
        states = {n: st.copy() for n, st in snap.states.items()}
        order = list(snap.order)
        key = snap.key
        log = read_change_log(resolver, handle, snap.log, len(got[0]))
    else:
        states, order, key = _bases(context, handle, key)
        log = read_change_log(resolver, handle)
    merged = _apply(handle, states, order, key, log)
    if registry is not None:
        registry.put(ckey, parts, _Snapshot(
            dict(states), list(order), merged.key, ChangeLog(
                states=dict(log.states), counts=dict(log.counts), source=log.source,
                ttl=dict(log.ttl), merging=list(log.merging), ids=dict(log.ids))))
    return merged


def _bases(
    context: Any, handle: ChangelogHandle, key: SerializerSpec | None
) -> tuple[dict[str, _State], list[StateInfo], SerializerSpec | None]:
    """The materialized bases of ``handle`` read into states (in header order)."""
    from statequery.metadata.handles import IncrementalHandle

    resolver = context.resolver
    states: dict[str, _State] = {}
    order: list[StateInfo] = []
    for base in handle.materialized:
        if isinstance(base, KeyGroupsHandle):
            key, metas = _heap_base(resolver, base, key, states)
            order += [m for m in metas if m.name not in {o.name for o in order}]
        elif isinstance(base, IncrementalHandle):
            key, metas = _rocksdb_base(context, base, key, states)
            order += [m for m in metas if m.name not in {o.name for o in order}]
        else:
            raise UnsupportedFormatError(
                f"changelog state backend: materialized handle {type(base).__name__} "
                f"(type {getattr(base, 'handle_type', '?')}) is not supported")
    return states, order, key


def _apply(
    handle: ChangelogHandle, states: dict[str, _State], order: list[StateInfo],
    key: SerializerSpec | None, log: ChangeLog,
) -> Merged:
    """``log``'s states and changes applied to ``states`` (mutated), laid out as the hashmap
    key-group stream."""
    key = key or log.key_spec
    if key is None:
        raise UnsupportedFormatError(
            "changelog state backend: the change log does not record the key serializer and "
            "this operator has no materialized base or timer that names it")
    for name, meta in log.states.items():
        if name not in states:
            states[name] = _State(meta, key)
            order.append(meta)
    for kg, op, name, payload in log.changes:
        try:
            states[name].apply(kg, op, payload)
        except (IndexError, struct.error, DecodeError) as e:
            raise CorruptStateError(
                f"state {name!r}: change {OPERATIONS[op]} in key group {kg} cannot be read "
                f"({_why(e)})", log.source, 0) from e
    states = dict(states)  # the caller keeps the states without the unmerged ones
    order = list(order)
    for name in log.merging:  # listed by the model whenever the log merges such a state
        unmerged = states[name].unmerged_state()
        states[unmerged.name] = unmerged
        order.append(unmerged.meta)
    out = bytearray()
    offsets = []
    grouped = [(sid, states[m.name], states[m.name].by_key_group()) for sid, m in
               enumerate(order)]
    for kg in range(handle.start_key_group, handle.start_key_group + handle.num_key_groups):
        offsets.append(len(out))
        out += struct.pack(">i", kg)
        for sid, st, by_kg in grouped:
            rows = by_kg.get(kg)
            if rows:
                out += struct.pack(">H", sid)
                st.write(rows, out)
    name = f"{log.source or 'changelog'} (merged change log)"
    return Merged(_MemoryStream(name, bytes(out)), tuple(offsets), key, order,
                  {n: log.counts.get(n, 0) for n in states})


class ChangelogKeyedBackend:
    """One subtask's changelog keyed state, read as the hashmap layout it merges into."""

    def __init__(self, handle: ChangelogHandle, context: Any,
                 key_serializer: SerializerSpec | None = None) -> None:
        from statequery.backends import HeapKeyedBackend

        merged = _merged(context, handle, key_serializer)
        order, errors = [], {}
        for meta in merged.states:
            state = dataclasses.replace(meta, key_spec=None if not meta.keyed else merged.key)
            if state.unsupported is not None:
                errors[meta.name] = state.unsupported
            order.append(state)
        self.merged = merged
        self._heap = HeapKeyedBackend(
            merged.stream.name, merged.stream, handle.start_key_group, merged.offsets,
            context.max_parallelism, False, merged.key, order, errors)
        self.name = self._heap.name
        self.layouts = self._heap.layouts

    @property
    def key_groups(self) -> Sequence[int]:
        return self._heap.key_groups

    @property
    def key_serializer(self) -> SerializerSpec | None:
        return self.merged.key

    @property
    def compressed(self) -> bool:
        return False

    def scan(self, layout: Any, mode: str | None, builder: Any,
             key_groups: Iterable[int] | None = None) -> Iterator[int]:
        return self._heap.scan(layout, mode, builder, key_groups)

    def scan_states(self, requests: Sequence[tuple[Any, Any]], mode: str | None,
                    key_groups: Iterable[int] | None = None,
                    key_bytes: Sequence[bytes] | None = None) -> Iterator[int]:
        return self._heap.scan_states(requests, mode, key_groups, key_bytes)


_LOCK = threading.Lock()


def _merged(context: Any, handle: ChangelogHandle, key: SerializerSpec | None) -> Merged:
    """:func:`merge`, once per handle for one savepoint's resolver (every state of the subtask
    and every read of it share the merged stream)."""
    resolver = context.resolver
    try:
        cache = resolver.__dict__.setdefault("_changelog_merged", {})
    except AttributeError:  # a resolver without a __dict__: no cache
        return merge(context, handle, key)
    ident = (handle.handle_id, handle.start_key_group, handle.num_key_groups,
             int(context.max_parallelism), repr(key))
    with _LOCK:
        lock = cache.setdefault(("lock", ident), threading.Lock())
    with lock:
        got = cache.get(ident)
        if got is None:
            got = merge(context, handle, key)
            cache[ident] = got
        return got  # type: ignore[no-any-return]


def _changelog_factory(handle: Any, context: Any) -> ChangelogKeyedBackend | None:
    """The registry's factory (:func:`statequery.backends.register_keyed_backend`): the base
    with the change log applied, read as a hashmap key-group stream."""
    if not isinstance(handle, ChangelogHandle):
        return None
    return ChangelogKeyedBackend(handle, context)


def register() -> None:
    """Register the changelog backend (done on import; idempotent)."""
    global _REGISTERED
    if not _REGISTERED:
        from statequery.backends import register_keyed_backend

        register_keyed_backend(_changelog_factory)
        _REGISTERED = True


_REGISTERED = False
register()
