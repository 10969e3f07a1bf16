"""The hashmap backend's own snapshot layout: checkpoints and NATIVE savepoints (type-12 handles).

``HeapSnapshotStrategy`` writes (§5 of the format reference)::

    KeyedBackendSerializationProxy                  (uncompressed)
    for EVERY key group of the handle's range, at its offset:
        int32 keyGroup                               (uncompressed)
        per state (HashMap order):
            [compressed: a new snappy framed stream]
            u16 stateId
            KEY_VALUE:      int32 n, n x (namespace, key, full state value)
            PRIORITY_QUEUE: int32 n, n x TimerSerializer element

Nothing is length-prefixed: a block ends where its last entry's serializers stop, so even states
that were not asked for are walked with their skip functions. State values use the state's full
serializer (``ListSerializer`` int32 size + elements; ``MapSerializer`` entries with null flags).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from statequery.arrow.batches import BatchBuilder
from statequery.arrow.schemas import resolve_mode
from statequery.backends.keygroups import (
    ByteStream,
    iter_key_group_extents,
    read_key_group_spans,
)
from statequery.exceptions import CorruptStateError, UnsupportedFormatError
from statequery.metadata.state import StateInfo
from statequery.serializers.readers import (
    DECODE_ERRORS,
    DecodeError,
    Reader,
    reader_for,
)
from statequery.serializers.spec import (
    ListSpec,
    MapSpec,
    NamespaceSpec,
    SerializerSpec,
    TimerSpec,
    TtlSpec,
)

__all__ = ["HeapBlockDecoder", "HeapKeyGroupStream", "scan_heap_key_group"]

_U16 = struct.Struct(">H").unpack_from
_I32 = struct.Struct(">i").unpack_from


def _streaming(spec: SerializerSpec | None, state: str, what: str) -> Reader:
    if spec is None:
        raise UnsupportedFormatError(f"state {state!r} has no {what} serializer")
    r = reader_for(spec)
    if r.greedy or not spec.decodable:
        raise UnsupportedFormatError(
            f"state {state!r}: its {what} serializer ({spec.display}) cannot be delimited in the "
            "hashmap checkpoint format (no length prefixes); the state cannot be read"
        )
    return r


class HeapBlockDecoder:
    """Reads (or skips) one state's block in a heap key group.

    ``walk(buf, pos, end, kg) -> pos`` consumes the block body after the state id; when built with
    a builder it also emits rows.
    """

    def __init__(
        self,
        layout: StateInfo,
        builder: BatchBuilder | None = None,
        mode: str | None = None,
        key_bytes: Sequence[bytes] | None = None,
    ) -> None:
        self.layout = layout
        self.builder = builder
        #: the serialized keys wanted (:func:`statequery.keys.resolve_key`); None: every key
        self.key_bytes = None if key_bytes is None else frozenset(key_bytes)
        self.mode = resolve_mode(layout, mode)
        self._walk: Callable[[bytes, int, int, int], int] | None = None
        self._error: UnsupportedFormatError | None = None
        try:
            self._walk = self._build()
        except UnsupportedFormatError as e:
            self._error = e
        else:
            if key_bytes is None:
                # the compiled path, when built and the shape is covered: the walk above stays
                # the reference (and checks the layout), the sink decodes into Arrow buffers
                self._walk = self._compiled_walk() or self._walk

    def _compiled_walk(self) -> Callable[..., int] | None:
        from statequery.backends.fastpath import heap_sink

        b = self.builder
        sink = heap_sink(self.layout, self.mode, None if b is None else b.schema)
        if sink is None:
            return None
        if b is not None:
            sink = b.attach(sink)
            return sink.walk  # type: ignore[no-any-return]
        walk, reference = sink.walk, self._walk

        def skip(buf: bytes, pos: int, end: int, n: int, kg: int) -> int:
            # the sink decodes what it skips (fast), the reference only delimits the entries:
            # bytes it does not check (an enum index, a string inside a RowData) must not fail
            # a read of another state, so on an error the reference has the last word
            try:
                return walk(buf, pos, end, n, kg)  # type: ignore[no-any-return]
            except DECODE_ERRORS:
                assert reference is not None
                return reference(buf, pos, end, n, kg)  # type: ignore[call-arg]

        return skip

    def walk(self, buf: bytes, pos: int, end: int, kg: int) -> int:
        n = _I32(buf, pos)[0]
        pos += 4
        if n < 0 or n > end - pos:
            raise DecodeError(f"impossible entry count {n} for state {self.layout.name!r}", pos - 4)
        if n == 0:
            return pos
        if self._walk is None:
            assert self._error is not None
            raise self._error
        return self._walk(buf, pos, end, n, kg)  # type: ignore[call-arg]

    def _build(self) -> Callable[..., int]:
        layout = self.layout
        if layout.is_timer:
            return self._timers()
        if layout.kind == "priority_queue":
            if self.builder is not None:
                raise UnsupportedFormatError(
                    f"state {layout.name!r} is a priority queue of "
                    f"{layout.value.display if layout.value else '?'} elements, not timers")
            element = _streaming(layout.value, layout.name, "element")
            skip_element = element.skip_at

            def skip_queue(buf: bytes, pos: int, end: int, n: int, kg: int) -> int:
                for _ in range(n):
                    pos = skip_element(buf, pos, end)
                return pos

            return skip_queue
        ns = _streaming(layout.namespace or NamespaceSpec(name="void"), layout.name, "namespace")
        key = _streaming(layout.key, layout.name, "key")
        value_spec = layout.state_value
        if value_spec is None:
            raise UnsupportedFormatError(f"state {layout.name!r} has no value serializer")
        value = _streaming(value_spec, layout.name, "value")
        ns_read, key_read, value_read = ns.read_at, key.read_at, value.read_at
        b = self.builder
        if b is None:
            ns_skip, key_skip, value_skip = ns.skip_at, key.skip_at, value.skip_at

            def skip_entries(buf: bytes, pos: int, end: int, n: int, kg: int) -> int:
                for _ in range(n):
                    pos = value_skip(buf, key_skip(buf, ns_skip(buf, pos, end), end), end)
                return pos

            return skip_entries
        emit = self._emitter(value_spec)
        if self.key_bytes is not None:
            # lookups: the serialized key is compared before anything is decoded (the bytes
            # the key serializer wrote, exactly as the other layouts compare them)
            wanted, key_skip, value_skip = self.key_bytes, key.skip_at, value.skip_at

            def read_key_entries(buf: bytes, pos: int, end: int, n: int, kg: int) -> int:
                for _ in range(n):
                    namespace, kpos = ns_read(buf, pos, end)
                    pos = key_skip(buf, kpos, end)
                    if buf[kpos:pos] not in wanted:
                        pos = value_skip(buf, pos, end)
                        continue
                    k, _ = key_read(buf, kpos, pos)
                    v, pos = value_read(buf, pos, end)
                    emit(kg, k, namespace, v)
                return pos

            return read_key_entries

        def read_entries(buf: bytes, pos: int, end: int, n: int, kg: int) -> int:
            for _ in range(n):
                namespace, pos = ns_read(buf, pos, end)
                k, pos = key_read(buf, pos, end)
                v, pos = value_read(buf, pos, end)
                emit(kg, k, namespace, v)
            return pos

        return read_entries

    def _timers(self) -> Callable[..., int]:
        layout = self.layout
        spec = layout.value
        if not isinstance(spec, TimerSpec):
            spec = TimerSpec(
                key=layout.key or NamespaceSpec(),
                namespace=layout.namespace or NamespaceSpec(name="void"),
            )
        timer = _streaming(spec, layout.name, "timer")
        b = self.builder
        if b is None:
            skip = timer.skip_at

            def skip_timers(buf: bytes, pos: int, end: int, n: int, kg: int) -> int:
                for _ in range(n):
                    pos = skip(buf, pos, end)
                return pos

            return skip_timers
        read = timer.read_at
        a_kg, a_key, a_ns, a_ts = (
            b.appender(c) for c in ("key_group", "key", "namespace", "timestamp")
        )
        wanted = self.key_bytes

        def read_timers(buf: bytes, pos: int, end: int, n: int, kg: int) -> int:
            for _ in range(n):
                start = pos
                t, pos = read(buf, pos, end)
                # a timer is its 8-byte timestamp, then the serialized key and namespace
                if wanted is not None and not any(buf.startswith(k, start + 8, pos)
                                                  for k in wanted):
                    continue
                a_kg(kg)
                a_key(t["key"])
                a_ns(t["namespace"])
                a_ts(t["timestamp"])
            return pos

        return read_timers

    def _emitter(self, value_spec: SerializerSpec) -> Callable[[int, Any, Any, Any], None]:
        layout, b = self.layout, self.builder
        assert b is not None
        kind, ttl = layout.kind, layout.ttl
        a_kg, a_key, a_ns = (b.appender(c) for c in ("key_group", "key", "namespace"))
        if kind in ("value", "reducing", "aggregating"):
            a_val = b.appender("value")
            a_ttl = b.appender("last_access") if ttl else None

            def emit_value(kg: int, key: Any, ns: Any, v: Any) -> None:
                a_kg(kg)
                a_key(key)
                a_ns(ns)
                if a_ttl is not None:
                    a_val(None if v is None else v["value"])
                    a_ttl(None if v is None else v["last_access"])
                else:
                    a_val(v)

            return emit_value
        if kind == "list":
            if not isinstance(value_spec, ListSpec):
                raise UnsupportedFormatError(
                    f"list state {layout.name!r} with a {value_spec.display} value serializer"
                )
            a_val = b.appender("value")
            a_ttl = b.appender("last_access") if ttl else None
            if self.mode == "flat":
                a_idx = b.appender("index")

                def emit_flat(kg: int, key: Any, ns: Any, elements: Any) -> None:
                    for i, v in enumerate(elements):
                        a_kg(kg)
                        a_key(key)
                        a_ns(ns)
                        a_idx(i)
                        if a_ttl is not None:
                            a_val(v["value"])
                            a_ttl(v["last_access"])
                        else:
                            a_val(v)

                return emit_flat

            def emit_list(kg: int, key: Any, ns: Any, elements: Any) -> None:
                if not elements:
                    return  # Flink does not keep empty lists
                a_kg(kg)
                a_key(key)
                a_ns(ns)
                if a_ttl is not None:
                    a_val([v["value"] for v in elements])
                    a_ttl([v["last_access"] for v in elements])
                else:
                    a_val(elements)

            return emit_list
        if kind == "map":
            if not isinstance(value_spec, MapSpec):
                raise UnsupportedFormatError(
                    f"map state {layout.name!r} with a {value_spec.display} value serializer"
                )
            if self.mode == "nested":
                a_map = b.appender("map")

                def emit_map(kg: int, key: Any, ns: Any, entries: Any) -> None:
                    if not entries:
                        return
                    a_kg(kg)
                    a_key(key)
                    a_ns(ns)
                    a_map(entries)

                return emit_map
            a_uk, a_val = b.appender("user_key"), b.appender("value")
            a_ttl = b.appender("last_access") if ttl else None

            def emit_entries(kg: int, key: Any, ns: Any, entries: Any) -> None:
                for uk, v in entries:
                    a_kg(kg)
                    a_key(key)
                    a_ns(ns)
                    a_uk(uk)
                    if a_ttl is not None:
                        a_val(None if v is None else v["value"])
                        a_ttl(None if v is None else v["last_access"])
                    else:
                        a_val(v)

            return emit_entries
        raise UnsupportedFormatError(f"state {layout.name!r}: kind {kind} is not keyed")


def scan_heap_key_group(buf: bytes, pos: int, kg: int, blocks: Sequence[HeapBlockDecoder]) -> None:
    """Walk the state blocks of one (decompressed) heap key group, ``buf[pos:]``.

    A block that cannot be walked (a state whose serializer statequery does not decode, holding
    entries) is passed over when it is not asked for: the blocks after it are found again by
    :func:`_resync` (every state has one block per key group, and the key group's end is known),
    so one unknown serializer does not hide the operator's other states.
    """
    end = len(buf)
    n_states = len(blocks)
    seen: set[int] = set()
    while pos < end:
        if pos + 2 > end:
            raise DecodeError("truncated state id", pos)
        sid = _U16(buf, pos)[0]
        if sid >= n_states:
            raise DecodeError(f"state id {sid} but the header lists {n_states} states", pos)
        start = pos
        try:
            pos = blocks[sid].walk(buf, pos + 2, end, kg)
        except UnsupportedFormatError:
            if blocks[sid].builder is not None:
                raise  # the state asked for cannot be read
            seen.add(sid)
            pos = _resync(buf, start + 6, kg, blocks, seen)
            continue
        except DecodeError:
            raise
        except DECODE_ERRORS as e:
            raise DecodeError(
                f"state {blocks[sid].layout.name!r}: {type(e).__name__}: {e}", start
            ) from e
        if pos > end:
            raise DecodeError(
                f"state {blocks[sid].layout.name!r} runs past the end of the key group", start
            )
        seen.add(sid)


def _resync(
    buf: bytes, pos: int, kg: int, blocks: Sequence[HeapBlockDecoder], seen: set[int]
) -> int:
    """Where the block after an unwalkable one starts: the first position from which the blocks
    of the states not yet seen (each exactly once) walk to exactly the end of the key group
    (walked without emitting rows). The end itself when no state is left; DecodeError when no
    position fits."""
    end = len(buf)
    left = {i for i in range(len(blocks)) if i not in seen}
    if not left:
        return end
    probes = [HeapBlockDecoder(b.layout) for b in blocks]
    for p in range(pos, end - 5):
        if _U16(buf, p)[0] in left and _walks_to_end(buf, p, kg, probes, left):
            return p
    raise DecodeError(
        "a state this key group holds cannot be delimited (no length prefixes) and the states "
        "after it were not found", pos - 6,
    )


def _walks_to_end(
    buf: bytes, pos: int, kg: int, probes: Sequence[HeapBlockDecoder], left: set[int]
) -> bool:
    end = len(buf)
    todo = set(left)
    try:
        while pos < end:
            sid = _U16(buf, pos)[0]
            if sid not in todo:
                return False
            todo.discard(sid)
            pos = probes[sid].walk(buf, pos + 2, end, kg)
    except (*DECODE_ERRORS, UnsupportedFormatError):
        return False
    return pos == end and not todo


@dataclass(frozen=True)
class HeapKeyGroupStream:
    """One hashmap checkpoint stream; ``offsets`` has an entry for every key group of the handle."""

    stream: ByteStream
    offsets: dict[int, int]
    compressed: bool

    def key_groups(self) -> list[int]:
        return sorted(self.offsets)

    def iter_extents(
        self, key_groups: Iterable[int] | None = None
    ) -> Iterator[tuple[int, int, int]]:
        """``(kg, start, end)`` for the requested key groups, in file order (each starts with
        its int32 key-group id, so holds at least 4 bytes)."""
        return iter_key_group_extents(self.stream, self.offsets.items(), key_groups, min_bytes=4)

    def key_group_bytes(
        self, key_groups: Iterable[int] | None = None
    ) -> Iterator[tuple[int, int, bytes, int]]:
        """``(kg, start, buf, pos)`` for the requested key groups, in file order: the key group's
        id is checked against the one it starts with, and ``buf[pos:]`` holds its state blocks
        (decompressed when the stream is; ``start`` is the key group's offset in the stream).
        The one walk over a hashmap stream's key groups (:meth:`scan`, and the changelog
        backend's materialized base)."""
        from statequery.backends.snappy import decompress_framed

        name = self.stream.name
        for kg, start, _end, data in read_key_group_spans(
            self.stream, self.iter_extents(key_groups)
        ):
            written = _I32(data, 0)[0]
            if written != kg:
                raise CorruptStateError(
                    f"key group {kg} starts with key group id {written}", name, start
                )
            if self.compressed:
                buf = (
                    decompress_framed(data[4:], f"{name} (key group {kg})", start + 4)
                    if len(data) > 4
                    else b""
                )
                yield kg, start, buf, 0
            else:
                yield kg, start, data, 4

    def scan(
        self, blocks: Sequence[HeapBlockDecoder], key_groups: Iterable[int] | None = None
    ) -> Iterator[int]:
        name = self.stream.name
        for kg, start, buf, pos in self.key_group_bytes(key_groups):
            try:
                scan_heap_key_group(buf, pos, kg, blocks)
            except DecodeError as e:
                offset = start + 4 if self.compressed else start + e.pos
                msg = f"key group {kg}: {e.message}"
                if self.compressed:
                    msg += f" (offset {e.pos} of the decompressed key group)"
                raise CorruptStateError(msg, name, offset) from e
            yield kg


def ttl_inner(spec: SerializerSpec | None) -> SerializerSpec | None:
    return spec.inner if isinstance(spec, TtlSpec) else spec
