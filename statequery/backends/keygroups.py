"""Canonical savepoint key-group streams (``FullSnapshotAsyncWriter``), and the composite
key/value entry format they share with RocksDB.

File layout (§2 of the format reference)::

    KeyedBackendSerializationProxy            (uncompressed, from offset 0)
    per key group with data, at KeyGroupRangeOffsets[kg] (0 = no data):
        [proxy.compressed: a fresh snappy framed stream starts here]
        u16 kvStateId
        repeat: int32 keyLen, key, int32 valLen, value
                if key[0] & 0x80: (the flag is not part of the key)
                    u16 next: 0xFFFF = end of key group, else the next kvStateId

A key group's bytes end where the next non-empty key group starts (or at the end of the stream),
so adjacent key groups are read with one ranged read (:func:`read_key_group_spans`); a large
uncompressed key group is walked in pieces read one after the other
(:meth:`KeyGroupStream._walk_in_pieces`, the walk resuming where a piece cut an entry). Memory
stays bounded by one such read.

:class:`CompositeEntryDecoder` turns one state's entries (``prefix | key | [len] | namespace |
[len] | [user key]`` -> value bytes, ``SerializedCompositeKeyBuilder``)
into rows; the RocksDB backend reuses it unchanged.
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from statequery.arrow.batches import BatchBuilder
from statequery.arrow.schemas import resolve_mode
from statequery.backends.fastpath import compiled, flink_length, length_suffixed
from statequery.exceptions import (
    CorruptStateError,
    RunIndexMismatchWarning,
    UnsupportedFormatError,
)
from statequery.metadata.state import StateInfo
from statequery.serializers.readers import (
    DECODE_ERRORS,
    DecodeError,
    Reader,
    raw_reader,
    reader_for,
)
from statequery.serializers.spec import (
    NamespaceSpec,
    PrimitiveSpec,
    SerializerSpec,
    TimerSpec,
    TtlSpec,
)

__all__ = [
    "END_OF_KEY_GROUP",
    "ByteStream",
    "CompositeEntryDecoder",
    "KeyGroupStream",
    "flink_length",
    "key_group_scanner",
    "iter_key_group_extents",
    "key_group_prefix_bytes",
    "skip_length_suffix",
    "read_key_group_bytes",
    "scan_key_group",
]

END_OF_KEY_GROUP = 0xFFFF
_FLAG = 0x80
_LIST_DELIMITER = 0x2C
_LONG_MIN = -(1 << 63)

_U16 = struct.Struct(">H").unpack_from
_I32 = struct.Struct(">i").unpack_from
_I64 = struct.Struct(">q").unpack_from


class ByteStream(Protocol):
    """A state stream's bytes (file, file segment or inline bytes), addressed stream-relative."""

    name: str

    def size(self) -> int: ...

    def read_range(self, start: int, length: int) -> bytes: ...


def key_group_prefix_bytes(max_parallelism: int) -> int:
    """``CompositeKeySerializationUtils.computeRequiredBytesInKeyGroupPrefix``."""
    return 1 if max_parallelism <= 128 else 2


# -- composite key/value entries ------------------------------------------------------------------


def skip_length_suffix(buf: bytes, pos: int, end: int, expected: int, what: str) -> int:
    """Skip the "variable int bytes" written after an ambiguous key or namespace, checking it
    (little-endian, as few bytes as ``expected`` needs, at least one; within ``end``, the end of
    the composite key)."""
    value = shift = 0
    n = 0
    while True:
        if pos + n >= end:
            raise DecodeError(f"{what} length suffix runs past the end of the composite key", pos)
        value |= buf[pos + n] << shift
        n += 1
        shift += 8
        if (expected >> shift) == 0:
            break
    if value != expected:
        raise DecodeError(
            f"{what} length suffix says {value}, the {what} took {expected} bytes", pos
        )
    return pos + n


def _missing_serializer(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
    raise UnsupportedFormatError(
        "state has no serializer for this part (its header could not be read past an unknown "
        "serializer)"
    )


def _slot_reader(spec: SerializerSpec | None) -> Reader:
    if spec is None:
        # an empty state reads fine; the first entry raises (typed)
        return Reader(None, _missing_serializer)
    if not spec.decodable:
        return raw_reader()
    return reader_for(spec)


class CompositeEntryDecoder:
    """Decodes one keyed state's entries in the composite-key format into a :class:`BatchBuilder`.

    ``on_entry(buf, kpos, kend, vpos, vend, kg)``: ``buf[kpos:kend]`` is the composite key
    **after** the key-group prefix, ``buf[vpos:vend]`` the value. ``finish()`` must be called at the
    end of every key group (it completes the current row of a nested map).
    Raises :class:`DecodeError` (or a reader error) on bytes that do not decode exactly.
    """

    def __init__(
        self,
        layout: StateInfo,
        mode: str | None,
        builder: BatchBuilder,
        key_bytes: Sequence[bytes] | bytes | None = None,
    ) -> None:
        self.layout = layout
        self.mode = resolve_mode(layout, mode)
        self.builder = builder
        self.finish: Callable[[], None] = _noop
        kind = layout.kind
        if layout.is_timer:
            on_entry = self._timer_handler()
        elif kind in ("value", "reducing", "aggregating"):
            on_entry = self._value_handler()
        elif kind == "list":
            on_entry = self._list_handler()
        elif kind == "map":
            on_entry = self._map_handler()
        else:
            raise UnsupportedFormatError(f"state {layout.name!r} of kind {kind} is not keyed")
        # the compiled path, when built and the shape is covered: the handlers above stay
        # the reference (and still check the layout), the sink decodes into Arrow buffers (also
        # for lookups: a flush from buffers never converts Python lists, whose first conversion
        # in a process makes pyarrow import pandas, most of a first lookup's CPU)
        from statequery.backends.fastpath import entry_sink

        sink = entry_sink(layout, self.mode, builder.schema)
        if sink is not None:
            on_entry = builder.attach(sink)
            self.finish = on_entry.finish  # completes a nested map's row
        if key_bytes is not None:
            # lookups: entries whose serialized key differs are skipped without decoding
            # (serialized keys are prefix-free, so startswith is exact for a whole key; timer
            # keys start with the 8-byte timestamp)
            inner, skip = on_entry, 8 if layout.is_timer else 0
            wanted = (key_bytes,) if isinstance(key_bytes, bytes) else tuple(key_bytes)
            mod = compiled()
            key_filter = getattr(mod, "KeyFilter", None) if mod is not None else None

            def on_matching_entry(
                buf: bytes, kpos: int, kend: int, vpos: int, vend: int, kg: int
            ) -> None:
                start = kpos + skip
                for k in wanted:
                    # within the composite key: bytes past ``kend`` are the value's (as the
                    # compiled ``_read.KeyFilter`` compares)
                    if buf.startswith(k, start, kend):
                        inner(buf, kpos, kend, vpos, vend, kg)
                        return

            # compiled: the canonical walk compares the keys in C (a warm lookup walks a key
            # group of thousands of entries for a few rows)
            on_entry = on_matching_entry if key_filter is None else key_filter(inner, wanted, skip)
        sized = getattr(builder, "on_entry_bytes", None)
        if sized is not None:
            # state statistics (statequery.stats): each entry's serialized composite key and
            # value sizes, reported after it was decoded into its row
            decode = on_entry

            def on_sized_entry(
                buf: bytes, kpos: int, kend: int, vpos: int, vend: int, kg: int
            ) -> None:
                decode(buf, kpos, kend, vpos, vend, kg)
                sized(kend - kpos, vend - vpos)

            on_entry = on_sized_entry
        self.on_entry = on_entry

    # -- key parsing ---------------------------------------------------------------------------

    def _key_parser(
        self,
        key_spec: SerializerSpec | None,
        ns_spec: SerializerSpec | None,
        tail_fixed: int,
        ambiguous: bool,
    ) -> Callable[[bytes, int, int], tuple[Any, Any, int]]:
        """``parse(buf, p, kend) -> (key, namespace, end of namespace)``.

        ``tail_fixed`` is the fixed byte length after the namespace (0, or the user key's fixed
        length; -1 when the tail is variable).
        """
        kr = _slot_reader(key_spec)
        nr = _slot_reader(ns_spec)
        key_read, ns_read = kr.read_at, nr.read_at
        ns_fixed = nr.fixed_size
        if kr.greedy:
            if ambiguous or ns_fixed is None or tail_fixed < 0:
                raise UnsupportedFormatError(
                    f"state {self.layout.name!r}: the raw key cannot be delimited "
                    "(its namespace or user key has no fixed length)"
                )
            back = ns_fixed + tail_fixed

            def parse_raw_key(buf: bytes, p: int, kend: int) -> tuple[Any, Any, int]:
                e = kend - back
                key, p = key_read(buf, p, e)
                ns, p = ns_read(buf, p, kend)
                return key, ns, p

            return parse_raw_key
        if nr.greedy and tail_fixed != 0:
            raise UnsupportedFormatError(
                f"state {self.layout.name!r}: the raw namespace cannot be delimited"
            )
        if ambiguous:

            def parse_ambiguous(buf: bytes, p: int, kend: int) -> tuple[Any, Any, int]:
                start = p
                key, p = key_read(buf, p, kend)
                p = skip_length_suffix(buf, p, kend, p - start, "key")
                start = p
                ns, p = ns_read(buf, p, kend)
                p = skip_length_suffix(buf, p, kend, p - start, "namespace")
                return key, ns, p

            return parse_ambiguous
        if tail_fixed == 0 and _is_void(ns_spec):
            # the common case: VoidNamespace is the last byte of the key
            key_slot = kr.slot

            def parse_void(buf: bytes, p: int, kend: int) -> tuple[Any, Any, int]:
                e = kend - 1
                if buf[e] != 0:
                    raise DecodeError(f"VoidNamespace byte is {buf[e]}, expected 0", e)
                return key_slot(buf, p, e), None, kend

            return parse_void

        def parse(buf: bytes, p: int, kend: int) -> tuple[Any, Any, int]:
            key, p = key_read(buf, p, kend)
            ns, p = ns_read(buf, p, kend)
            return key, ns, p

        return parse

    def _ambiguous(self) -> bool:
        return length_suffixed(self.layout.key, self.layout.namespace)

    # -- handlers per kind ---------------------------------------------------------------------

    def _value_handler(self) -> Callable[..., None]:
        layout, b = self.layout, self.builder
        if (
            not layout.ttl
            and _is_void(layout.namespace)
            and layout.key is not None
            and layout.key.decodable
            and not self._ambiguous()
        ):
            return self._void_value_handler()
        parse = self._key_parser(layout.key, layout.namespace, 0, self._ambiguous())
        vr = _slot_reader(
            TtlSpec(inner=layout.value)
            if layout.ttl and layout.value is not None and layout.value.decodable
            else layout.value
        )
        value_read = vr.read_at
        a_kg, a_key, a_ns, a_val = (
            b.appender(n) for n in ("key_group", "key", "namespace", "value")
        )
        if layout.ttl and layout.value is not None and layout.value.decodable:
            a_last = b.appender("last_access")

            def on_ttl_value(
                buf: bytes, kpos: int, kend: int, vpos: int, vend: int, kg: int
            ) -> None:
                key, ns, p = parse(buf, kpos, kend)
                if p != kend:
                    raise DecodeError("key bytes left after the namespace", p)
                v, p = value_read(buf, vpos, vend)
                if p != vend:
                    raise DecodeError(f"value used {p - vpos} of its {vend - vpos} bytes", vpos)
                a_kg(kg)
                a_key(key)
                a_ns(ns)
                a_val(v["value"])
                a_last(v["last_access"])

            return on_ttl_value
        a_ttl: Callable[[Any], None] | None = (
            b.appender("last_access") if layout.ttl else None
        )

        def on_value(buf: bytes, kpos: int, kend: int, vpos: int, vend: int, kg: int) -> None:
            key, ns, p = parse(buf, kpos, kend)
            if p != kend:
                raise DecodeError("key bytes left after the namespace", p)
            v, p = value_read(buf, vpos, vend)
            if p != vend:
                raise DecodeError(f"value used {p - vpos} of its {vend - vpos} bytes", vpos)
            a_kg(kg)
            a_key(key)
            a_ns(ns)
            a_val(v)
            if a_ttl is not None:
                a_ttl(None)

        return on_value

    def _void_value_handler(self) -> Callable[..., None]:
        """Value/reducing/aggregating state in the VoidNamespace: the fused fast path."""
        layout, b = self.layout, self.builder
        key_slot = _slot_reader(layout.key).slot
        value_slot = _slot_reader(layout.value).slot
        a_kg, a_key, a_ns, a_val = (
            b.appender(n) for n in ("key_group", "key", "namespace", "value")
        )

        def on_void_value(buf: bytes, kpos: int, kend: int, vpos: int, vend: int, kg: int) -> None:
            e = kend - 1
            if buf[e] != 0:
                raise DecodeError(f"VoidNamespace byte is {buf[e]}, expected 0", e)
            key = key_slot(buf, kpos, e)
            value = value_slot(buf, vpos, vend)
            a_key(key)
            a_val(value)
            a_kg(kg)
            a_ns(None)

        return on_void_value

    def _list_handler(self) -> Callable[..., None]:
        layout, b = self.layout, self.builder
        parse = self._key_parser(layout.key, layout.namespace, 0, self._ambiguous())
        a_kg, a_key, a_ns, a_val = (
            b.appender(n) for n in ("key_group", "key", "namespace", "value")
        )
        if layout.value is None or not layout.value.decodable:
            raw = raw_reader().read_at

            def on_raw_list(
                buf: bytes, kpos: int, kend: int, vpos: int, vend: int, kg: int
            ) -> None:
                key, ns, p = parse(buf, kpos, kend)
                if p != kend:
                    raise DecodeError("key bytes left after the namespace", p)
                a_kg(kg)
                a_key(key)
                a_ns(ns)
                a_val(raw(buf, vpos, vend)[0])

            return on_raw_list
        ttl = layout.ttl
        er = reader_for(TtlSpec(inner=layout.value) if ttl else layout.value)
        elem_read = er.read_at

        ascii_strings = (
            not ttl and isinstance(layout.value, PrimitiveSpec) and layout.value.name == "string"
        )

        def split(buf: bytes, vpos: int, vend: int) -> list[Any]:
            """``ListDelimitedSerializer``: elements joined by ``,``."""
            out: list[Any] = []
            if vpos == vend:
                return out
            append = out.append
            p = vpos
            while True:
                if ascii_strings:
                    # fast path: a short ASCII StringValue is its length+1 byte and the chars
                    b0 = buf[p]
                    e = p + b0
                    if 0 < b0 < 0x80 and e <= vend:
                        chunk = buf[p + 1 : e]
                        if chunk.isascii():
                            append(chunk.decode("ascii"))
                            p = e
                        else:
                            v, p = elem_read(buf, p, vend)
                            append(v)
                    else:
                        v, p = elem_read(buf, p, vend)
                        append(v)
                else:
                    v, p = elem_read(buf, p, vend)
                    append(v)
                if p >= vend:
                    if p > vend:
                        raise DecodeError("list element runs past the end of the value", p)
                    return out
                if buf[p] != _LIST_DELIMITER:
                    raise DecodeError(f"list delimiter expected, found byte {buf[p]:#x}", p)
                p += 1
                if p == vend:
                    raise DecodeError("list value ends with a delimiter", p)

        flat = self.mode == "flat"
        a_ttl = b.appender("last_access") if ttl else None
        a_idx = b.appender("index") if flat else None

        def on_list(buf: bytes, kpos: int, kend: int, vpos: int, vend: int, kg: int) -> None:
            key, ns, p = parse(buf, kpos, kend)
            if p != kend:
                raise DecodeError("key bytes left after the namespace", p)
            elements = split(buf, vpos, vend)
            if flat:
                for i, v in enumerate(elements):
                    a_kg(kg)
                    a_key(key)
                    a_ns(ns)
                    a_idx(i)  # type: ignore[misc]
                    if ttl:
                        a_val(v["value"])
                        a_ttl(v["last_access"])  # type: ignore[misc]
                    else:
                        a_val(v)
                return
            a_kg(kg)
            a_key(key)
            a_ns(ns)
            if ttl:
                a_val([v["value"] for v in elements])
                a_ttl([v["last_access"] for v in elements])  # type: ignore[misc]
            else:
                a_val(elements)

        return on_list

    def _map_handler(self) -> Callable[..., None]:
        layout, b = self.layout, self.builder
        uk = _slot_reader(layout.user_key)
        tail = uk.fixed_size if uk.fixed_size is not None else -1
        parse = self._key_parser(layout.key, layout.namespace, tail, self._ambiguous())
        uk_read = uk.read_at
        ttl = bool(layout.ttl and layout.value is not None and layout.value.decodable)
        vr = _slot_reader(_with_ttl(layout.value) if ttl else layout.value)
        value_read = vr.read_at

        def entry(
            buf: bytes, kpos: int, kend: int, vpos: int, vend: int
        ) -> tuple[Any, Any, Any, Any, int]:
            key, ns, p = parse(buf, kpos, kend)
            ns_end = p
            user_key, p = uk_read(buf, p, kend)
            if p != kend:
                raise DecodeError(
                    f"user key used {p - ns_end} of its {kend - ns_end} bytes", ns_end
                )
            if vpos >= vend:
                raise DecodeError("map value without its null flag", vpos)
            if buf[vpos]:
                value = None
            else:
                value, p = value_read(buf, vpos + 1, vend)
                if p != vend:
                    raise DecodeError(
                        f"map value used {p - vpos - 1} of its {vend - vpos - 1} bytes", vpos
                    )
            return key, ns, user_key, value, ns_end

        if self.mode == "nested":
            return self._nested_map_handler(entry, ttl)
        a_kg, a_key, a_ns, a_uk, a_val = (
            b.appender(n) for n in ("key_group", "key", "namespace", "user_key", "value")
        )
        a_ttl = b.appender("last_access") if layout.ttl else None

        def on_map_entry(buf: bytes, kpos: int, kend: int, vpos: int, vend: int, kg: int) -> None:
            key, ns, user_key, value, _ = entry(buf, kpos, kend, vpos, vend)
            a_kg(kg)
            a_key(key)
            a_ns(ns)
            a_uk(user_key)
            if a_ttl is not None:
                if value is None or not ttl:
                    a_val(value)
                    a_ttl(None)
                else:
                    a_val(value["value"])
                    a_ttl(value["last_access"])
            else:
                a_val(value)

        return on_map_entry

    def _nested_map_handler(self, entry: Callable[..., Any], ttl: bool) -> Callable[..., None]:
        """One row per (key, namespace): consecutive entries with the same key prefix form a map."""
        b = self.builder
        a_kg, a_key, a_ns, a_map = (b.appender(n) for n in ("key_group", "key", "namespace", "map"))
        current: list[Any] = [None, None, None, None, None]  # prefix bytes, kg, key, ns, entries

        def finish() -> None:
            if current[0] is not None:
                a_kg(current[1])
                a_key(current[2])
                a_ns(current[3])
                a_map(current[4])
                current[0] = None

        def on_map_entry(buf: bytes, kpos: int, kend: int, vpos: int, vend: int, kg: int) -> None:
            key, ns, user_key, value, ns_end = entry(buf, kpos, kend, vpos, vend)
            prefix = buf[kpos:ns_end]
            if prefix != current[0] or kg != current[1]:
                finish()
                current[0], current[1], current[2], current[3] = prefix, kg, key, ns
                current[4] = []
            current[4].append((user_key, value))

        self.finish = finish
        return on_map_entry

    def _timer_handler(self) -> Callable[..., None]:
        layout, b = self.layout, self.builder
        spec = layout.value
        key_spec = spec.key if isinstance(spec, TimerSpec) else layout.key
        ns_spec = spec.namespace if isinstance(spec, TimerSpec) else layout.namespace
        parse = self._key_parser(key_spec, ns_spec, 0, False)
        a_kg, a_key, a_ns, a_ts = (
            b.appender(n) for n in ("key_group", "key", "namespace", "timestamp")
        )

        def on_timer(buf: bytes, kpos: int, kend: int, vpos: int, vend: int, kg: int) -> None:
            if vend != vpos:
                raise DecodeError(
                    f"timer entry with a {vend - vpos}-byte value (expected empty)", vpos
                )
            ts = _I64(buf, kpos)[0] ^ _LONG_MIN
            key, ns, p = parse(buf, kpos + 8, kend)
            if p != kend:
                raise DecodeError("timer key bytes left after the namespace", p)
            a_kg(kg)
            a_key(key)
            a_ns(ns)
            a_ts(ts)

        return on_timer


def _noop() -> None:
    return None


def serialized_key(key: Any, spec: SerializerSpec | None) -> bytes | None:
    """The exact bytes Flink's key serializer writes for ``key``
    (:func:`statequery.keys.resolve_key`); None when statequery does not write that serializer
    or the key does not fit it."""
    from statequery.exceptions import InvalidKeyError
    from statequery.keys import convert_key, serialize_key

    if spec is None or key is None:
        return None
    try:
        return serialize_key(convert_key(key, spec), spec)
    except InvalidKeyError:
        return None


def _with_ttl(spec: SerializerSpec | None) -> SerializerSpec | None:
    return None if spec is None else TtlSpec(inner=spec)


def _is_void(spec: SerializerSpec | None) -> bool:
    return isinstance(spec, NamespaceSpec) and spec.name == "void"


# -- the canonical key-group loop -----------------------------------------------------------


def scan_key_group(
    buf: bytes,
    kg: int,
    prefix_len: int,
    handlers: Sequence[Callable[..., None] | None],
    finishers: Iterable[Callable[[], None]] = (),
    runs: list[int] | None = None,
    base: int = 0,
    avail: int = -1,
    state: tuple[int, int, int] | None = None,
) -> Any:
    """Walk one decompressed canonical key group, calling ``handlers[state_id]`` per entry.

    States whose handler is None are skipped without decoding. Returns the number of entries.
    ``runs`` (a list) gets ``state id, start, length`` appended per run of one state's entries
    (``start``: the offset of its first entry in the key group, 2 bytes after the state id; the
    run ends where the next state id or the end-of-key-group mark begins): the run index
    (:mod:`statequery.metadata.runindex`).
    Raises :class:`DecodeError` (positions relative to ``buf``) on anything that is not exactly
    the canonical format; the caller adds file and key group.

    A key group walked in pieces (:meth:`KeyGroupStream._walk_in_pieces`): ``buf`` holds its
    bytes from offset ``base`` on, ``avail`` bytes of it are left from there (``-1``: ``buf``
    is all of them), ``state`` is where the walk of the piece before stopped (None: at the
    start). While ``buf`` holds fewer than ``avail`` bytes, the walk stops before the first
    entry or mark that does not fit and returns ``(entries, offset in buf, state id, phase,
    start of the run)``, the last three the ``state`` to go on with from that offset; a check
    that needs bytes past ``buf`` is made against ``avail``, so the pieces raise what one walk
    of the whole would, at the same places.
    """
    n = len(buf)
    end = n if avail < 0 else avail
    if end < n:
        raise ValueError(f"{end} bytes of the key group available, the buffer holds {n}")
    n_states = len(handlers)
    if state is None:
        if n < 2:
            if end >= 2:
                raise ValueError("a piece of a key group shorter than its state id")
            raise DecodeError("key group shorter than its state id", 0)
        sid = _U16(buf, 0)[0]
        if sid >= n_states:
            raise DecodeError(f"state id {sid} but the header lists {n_states} states", 0)
        pos = run_start = 2
        phase = 0
    else:
        sid, phase, run_start = state
        if not 0 <= sid < n_states:
            raise ValueError(f"resumed at state id {sid} of {n_states}")
        run_start -= base
        pos = 0
    handler = handlers[sid]
    entries = 0
    if prefix_len == 1:
        hi, lo = kg, -1
    else:
        hi, lo = kg >> 8, kg & 0xFF
    I32 = _I32
    while True:
        if phase == 0 and handler is None:
            # a run of entries of a state nobody asked for: walk the lengths only
            while True:
                entry = pos
                if pos + 4 > n:
                    if pos + 4 > end:
                        raise DecodeError("key group ends inside an entry (truncated?)", entry)
                    return entries, entry, sid, 0, base + run_start
                klen = I32(buf, pos)[0]
                kend = pos + 4 + klen
                if kend < 0 or kend + 4 > n:
                    if kend < 0 or kend + 4 > end:
                        raise DecodeError("key group ends inside an entry (truncated?)", entry)
                    return entries, entry, sid, 0, base + run_start
                vlen = I32(buf, kend)[0]
                if klen < prefix_len or vlen < 0:
                    raise DecodeError(f"impossible key/value length {klen}/{vlen}", entry)
                first = buf[pos + 4]
                pos = kend + 4 + vlen
                if pos > n:
                    if pos > end:
                        raise DecodeError(f"impossible value length {vlen}", kend)
                    return entries, entry, sid, 0, base + run_start
                entries += 1
                if first & _FLAG:
                    break
            if (first & 0x7F) != hi:
                raise DecodeError(f"entry of another key group inside key group {kg}", entry + 4)
        elif phase == 0:
            while True:
                entry = pos
                if pos + 4 > n:
                    if pos + 4 > end:
                        raise DecodeError("key group ends before its end mark", pos)
                    return entries, entry, sid, 0, base + run_start
                klen = I32(buf, pos)[0]
                kpos = pos + 4
                kend = kpos + klen
                if klen < prefix_len or kend + 4 > n:
                    if klen < prefix_len or kend + 4 > end:
                        raise DecodeError(f"impossible key length {klen}", entry)
                    return entries, entry, sid, 0, base + run_start
                vlen = I32(buf, kend)[0]
                vpos = kend + 4
                vend = vpos + vlen
                if vlen < 0 or vend > n:
                    if vlen < 0 or vend > end:
                        raise DecodeError(f"impossible value length {vlen}", kend)
                    return entries, entry, sid, 0, base + run_start
                first = buf[kpos]
                if (first & 0x7F) != hi or (lo >= 0 and buf[kpos + 1] != lo):
                    prefix = (first & 0x7F) if lo < 0 else ((first & 0x7F) << 8) | buf[kpos + 1]
                    raise DecodeError(f"entry of key group {prefix} inside key group {kg}", kpos)
                try:
                    handler(buf, kpos + prefix_len, kend, vpos, vend, kg)
                except DecodeError:
                    raise
                except DECODE_ERRORS as e:
                    raise DecodeError(f"{type(e).__name__}: {e}", entry) from e
                entries += 1
                pos = vend
                if first & _FLAG:
                    break
        if phase == 0:
            # the last entry of a run carried the flag: a state switch or the end of the key group
            if runs is not None:
                runs += (sid, base + run_start, pos - run_start)
            phase = 1
        if pos + 2 > n:
            if pos + 2 > end:
                raise DecodeError("key group ends inside its state-switch mark", pos)
            return entries, pos, sid, 1, base + run_start
        nxt = _U16(buf, pos)[0]
        pos += 2
        if nxt == END_OF_KEY_GROUP:
            if pos != end:
                raise DecodeError(f"{end - pos} bytes after the end-of-key-group mark", pos)
            for f in finishers:
                f()
            return entries
        if nxt >= n_states:
            raise DecodeError(f"state id {nxt} but the header lists {n_states} states", pos - 2)
        for f in finishers:
            f()
        sid = nxt
        handler = handlers[sid]
        run_start = pos
        phase = 0


def key_group_scanner() -> Callable[..., int]:
    """``scan_key_group(buf, kg, prefix_len, handlers, finishers, runs)`` of the chosen path: the
    compiled twin (:func:`statequery.backends.fastpath.compiled`) or :func:`scan_key_group`."""
    mod = compiled()
    return mod.scan_key_group if mod is not None else scan_key_group


def iter_key_group_extents(
    stream: ByteStream,
    starts: Iterable[tuple[int, int]],
    key_groups: Iterable[int] | None = None,
    min_bytes: int = 1,
) -> Iterator[tuple[int, int, int]]:
    """``(kg, start, end)`` for the requested key groups, in file order.

    ``starts`` are ``(key group, offset)`` pairs of the key groups with data; each one ends where
    the next starts (the last at the end of the stream) and must hold ``min_bytes``.
    """
    wanted = None if key_groups is None else set(key_groups)
    ordered = sorted((o, kg) for kg, o in starts)
    size: int | None = None
    for i, (start, kg) in enumerate(ordered):
        if wanted is not None and kg not in wanted:
            continue
        if i + 1 < len(ordered):
            end = ordered[i + 1][0]
        else:
            if size is None:
                size = stream.size()
            end = size
        if end - start < min_bytes:
            raise CorruptStateError(
                f"key group {kg} at offset {start} has {end - start} bytes "
                f"(at least {min_bytes} expected)",
                stream.name,
                start,
            )
        yield kg, start, end


def read_key_group_bytes(stream: ByteStream, kg: int, start: int, end: int) -> bytes:
    """The bytes ``[start, end)`` of key group ``kg``; a short read is corrupt state."""
    data = stream.read_range(start, end - start)
    if len(data) != end - start:
        raise CorruptStateError(
            f"key group {kg}: expected {end - start} bytes, the stream has {len(data)}",
            stream.name,
            start + len(data),
        )
    return data


#: A key group over twice this many bytes of a local file is walked in pieces of this size
#: (``KeyGroupStream._walk_in_pieces``): memory holds a piece, not the key group (a key group is
#: the keyed state over the maximum parallelism: 8 GB for 1 TB at 128).
WALK_PIECE_BYTES = 1 << 20

#: The same where each read is a request (object storage): fewer, longer reads.
REMOTE_WALK_PIECE_BYTES = 64 << 20

#: Adjacent key groups are fetched together in reads of up to this many bytes (one request for
#: many small key groups; memory stays bounded by one span, or by a piece of a larger key group
#: walked in pieces).
MAX_COALESCED_READ = 8 << 20

#: Reads of state runs (the run index) on remote storage also join runs separated by at most
#: this many bytes of other states: reading through such a gap costs less than another request
#: (about time-to-first-byte x bandwidth, ~30 ms x 100 MB/s on object storage). Local files read
#: exactly the runs.
REMOTE_READ_GAP = 4 << 20


def read_gap(location: str | None) -> int:
    """How many bytes between two wanted ranges of ``location`` are read through rather than
    fetched with a second request: 0 for local files and inline bytes, else
    :data:`REMOTE_READ_GAP`."""
    from statequery.io import filesystem_of

    if location is None or filesystem_of(location) == "file":
        return 0
    return REMOTE_READ_GAP


def read_key_group_spans(
    stream: ByteStream,
    extents: Iterable[tuple[int, int, int]],
    max_span: int = MAX_COALESCED_READ,
    max_gap: int = 0,
) -> Iterator[tuple[int, int, int, bytes]]:
    """``(kg, start, end, bytes)`` for ``(kg, start, end)`` extents in file order, reading runs
    of adjacent extents (or separated by at most ``max_gap`` bytes) with one ranged read each
    (at most ``max_span`` bytes, or one extent). A short read is corrupt state, reported at the
    key group it cuts."""
    run: list[tuple[int, int, int]] = []

    def flush() -> Iterator[tuple[int, int, int, bytes]]:
        if len(run) == 1:
            kg, start, end = run[0]
            yield kg, start, end, read_key_group_bytes(stream, kg, start, end)
            return
        base = run[0][1]
        data = stream.read_range(base, run[-1][2] - base)
        for kg, start, end in run:
            piece = data[start - base : end - base]
            if len(piece) != end - start:
                raise CorruptStateError(
                    f"key group {kg}: expected {end - start} bytes, the stream has {len(piece)}",
                    stream.name,
                    start + len(piece),
                )
            yield kg, start, end, piece

    for ext in list(extents):
        if run and (
            not 0 <= ext[1] - run[-1][2] <= max_gap or ext[2] - run[0][1] > max_span
        ):
            yield from flush()
            run = []
        run.append(ext)
    if run:
        yield from flush()


@dataclass(frozen=True)
class KeyGroupStream:
    """One canonical keyed-state stream: its bytes and where each key group starts.

    ``offsets`` maps key group -> stream offset (0: no data), as in ``KeyGroupRangeOffsets``.
    """

    stream: ByteStream
    offsets: dict[int, int]
    compressed: bool
    prefix_len: int

    def key_groups(self) -> list[int]:
        return sorted(self.offsets)

    def extent(self, kg: int) -> tuple[int, int] | None:
        """``(start, end)`` of key group ``kg``'s bytes, None when it has no data."""
        start = self.offsets.get(kg, 0)
        if start <= 0:
            return None
        later = [o for o in self.offsets.values() if o > start]
        end = min(later) if later else self.stream.size()
        if end <= start:
            raise CorruptStateError(
                f"key group {kg} at offset {start} is past the end of the stream ({end} bytes)",
                self.stream.name,
                start,
            )
        return start, end

    def iter_extents(
        self, key_groups: Iterable[int] | None = None
    ) -> Iterator[tuple[int, int, int]]:
        """``(kg, start, end)`` for the requested key groups that have data, in file order."""
        starts = ((kg, o) for kg, o in self.offsets.items() if o > 0)
        return iter_key_group_extents(self.stream, starts, key_groups)

    def read_key_group(self, kg: int, start: int, end: int) -> bytes:
        return self.decode_key_group(kg, start, read_key_group_bytes(self.stream, kg, start, end))

    def decode_key_group(self, kg: int, start: int, data: bytes) -> bytes:
        from statequery.backends.snappy import decompress_framed

        if self.compressed:
            return decompress_framed(data, f"{self.stream.name} (key group {kg})", start)
        return data

    def scan(
        self,
        handlers: Sequence[Callable[..., None] | None],
        finishers: Sequence[Callable[[], None]] = (),
        key_groups: Iterable[int] | None = None,
        *,
        runs: Mapping[int, Sequence[int]] | None = None,
        record: Callable[[int, list[int]], None] | None = None,
    ) -> Iterator[int]:
        """Decode the requested key groups; yields each key group after its entries were handled.

        ``runs`` (the run index of this stream: key group -> ``state id, start, length``
        triples, :mod:`statequery.metadata.runindex`) lets an uncompressed stream read only the
        runs of the states that have a handler, and a compressed one walk only those runs of the
        decompressed key group; key groups it does not cover are read whole. Every run used is
        checked against the bytes first: a mismatch warns (:class:`RunIndexMismatchWarning`) and
        walks that key group whole. ``record(kg, runs)`` gets the runs of every key group walked
        whole.
        """
        scan = key_group_scanner()
        if runs is None:
            for kg, start, end, data in self._whole_or_in_pieces(self.iter_extents(key_groups)):
                if data is None:
                    self._walk_in_pieces(scan, kg, start, end, handlers, finishers, record)
                else:
                    self._walk_whole(scan, kg, start, data, handlers, finishers, record)
                yield kg
            return
        wanted = {sid for sid, h in enumerate(handlers) if h is not None}
        units = self._plan_runs(runs, wanted, key_groups)
        spans = read_key_group_spans(
            self.stream,
            (
                (kg, start + a, start + b)
                for kg, start, end, whole, pieces in units
                for a, b in ([(0, end - start)] if whole else [(a, b) for a, b, _ in pieces])
            ),
            max_gap=getattr(self.stream, "read_gap", 0),
        )
        for kg, start, end, whole, pieces in units:
            if whole:
                buf: bytes | None = self.decode_key_group(kg, start, next(spans)[3])
                assert buf is not None
                if not pieces:
                    self._walk_whole(scan, kg, start, buf, handlers, finishers, record, True)
                    yield kg
                    continue
                # compressed (or a run outside the key group): cut the runs from the whole
                cut: list[bytes | None] = [
                    bytes(buf[a:b]) if 0 <= a and b <= len(buf) else None for a, b, _ in pieces
                ]
            elif not pieces:
                yield kg  # indexed, and none of the wanted states has entries here
                continue
            else:
                buf = None
                cut = [next(spans)[3] for _ in pieces]
            problem = self._check_runs(scan, kg, len(handlers), pieces, cut)
            if problem is not None:
                warnings.warn(
                    f"{self.stream.name}: key group {kg}: the run index does not match the "
                    f"bytes ({problem}); reading the whole key group",
                    RunIndexMismatchWarning,
                    stacklevel=2,
                )
                if buf is None:
                    buf = self.decode_key_group(
                        kg, start, read_key_group_bytes(self.stream, kg, start, end)
                    )
                self._walk_whole(scan, kg, start, buf, handlers, finishers, record, True)
                yield kg
                continue
            for (a, _b, _e), piece in zip(pieces, cut, strict=True):
                assert piece is not None
                self._walk(scan, kg, start, a, piece + _END_MARK, handlers, finishers)
            yield kg

    def _plan_runs(
        self,
        runs: Mapping[int, Sequence[int]],
        wanted: set[int],
        key_groups: Iterable[int] | None,
    ) -> list[tuple[int, int, int, bool, list[tuple[int, int, tuple[int, ...]]]]]:
        """Per key group ``(kg, start, end, whole, pieces)`` in file order. ``pieces`` are the
        wanted runs as ``(a, b, expected runs)`` offsets in the (decompressed) key group, ``a``
        2 bytes before the run (its state id), adjacent runs joined; ``whole``: read the whole
        key group (compressed, not in the index, or a run outside it), else only the pieces."""
        units: list[tuple[int, int, int, bool, list[tuple[int, int, tuple[int, ...]]]]] = []
        for kg, start, end in self.iter_extents(key_groups):
            flat = runs.get(kg)
            if flat is None:
                units.append((kg, start, end, True, []))
                continue
            pieces: list[tuple[int, int, tuple[int, ...]]] = []
            for i in range(0, len(flat) - 2, 3):
                sid, first, length = flat[i], flat[i + 1], flat[i + 2]
                if sid not in wanted:
                    continue
                a, b = first - 2, first + length
                if pieces and pieces[-1][1] == a:
                    pa, _, expected = pieces[-1]
                    pieces[-1] = (pa, b, (*expected, sid, first - pa, length))
                else:
                    pieces.append((a, b, (sid, 2, length)))
            outside = any(a < 0 or b > end - start for a, b, _ in pieces)
            whole = bool(pieces) and (self.compressed or outside)
            units.append((kg, start, end, whole, pieces))
        return units

    def _check_runs(
        self,
        scan: Callable[..., int],
        kg: int,
        n_states: int,
        pieces: Sequence[tuple[int, int, tuple[int, ...]]],
        cut: Sequence[bytes | None],
    ) -> str | None:
        """Why the pieces do not hold exactly the runs the index says (None when they do): each
        must start with the recorded state id and end, with a flagged entry, where recorded.
        Checked for every piece of the key group before any entry is decoded."""
        skip: list[Callable[..., None] | None] = [None] * n_states
        for (a, b, expected), piece in zip(pieces, cut, strict=True):
            if piece is None or a < 0 or len(piece) != b - a:
                return f"a run at [{a}, {b}) is outside the key group"
            found: list[int] = []
            try:
                scan(piece + _END_MARK, kg, self.prefix_len, skip, (), found)
            except DecodeError as e:
                return f"the run at offset {a + 2}: {e.message}"
            if tuple(found) != expected:
                return f"the runs at [{a}, {b}) are {found}, the index says {list(expected)}"
        return None

    def _walk_whole(
        self,
        scan: Callable[..., int],
        kg: int,
        start: int,
        data: bytes,
        handlers: Sequence[Callable[..., None] | None],
        finishers: Sequence[Callable[[], None]],
        record: Callable[[int, list[int]], None] | None,
        decoded: bool = False,
    ) -> None:
        buf = data if decoded else self.decode_key_group(kg, start, data)
        found: list[int] | None = [] if record is not None else None
        self._walk(scan, kg, start, 0, buf, handlers, finishers, found)
        if record is not None and found is not None:
            record(kg, found)

    def _walk(
        self,
        scan: Callable[..., Any],
        kg: int,
        start: int,
        base: int,
        buf: bytes,
        handlers: Sequence[Callable[..., None] | None],
        finishers: Sequence[Callable[[], None]],
        found: list[int] | None = None,
        avail: int = -1,
        state: tuple[int, int, int] | None = None,
    ) -> Any:
        """Walk ``buf`` (the key group's bytes from offset ``base`` on), errors named by file;
        ``avail`` and ``state``: a piece of a walk in pieces (:func:`scan_key_group`)."""
        try:
            if avail >= 0:
                return scan(buf, kg, self.prefix_len, handlers, finishers, found, base, avail,
                            state)
            if found is None:
                return scan(buf, kg, self.prefix_len, handlers, finishers)
            return scan(buf, kg, self.prefix_len, handlers, finishers, found)
        except DecodeError as e:
            pos = base + e.pos
            where = f"offset {pos} of the decompressed key group" if self.compressed else None
            offset = start if self.compressed else start + pos
            msg = f"key group {kg}: {e.message}"
            if where:
                msg += f" ({where})"
            raise CorruptStateError(msg, self.stream.name, offset) from e
        except DECODE_ERRORS as e:
            raise CorruptStateError(
                f"key group {kg}: {type(e).__name__}: {e}", self.stream.name, start
            ) from e

    def _piece_bytes(self) -> int:
        """How many bytes of a key group one read of a walk in pieces takes: little on a local
        file (the read lands in the CPU's cache and its buffer is reused), more where each read
        is a request (:func:`read_gap`)."""
        return WALK_PIECE_BYTES if not getattr(self.stream, "read_gap", 0) else (
            REMOTE_WALK_PIECE_BYTES)

    def _whole_or_in_pieces(
        self, extents: Iterable[tuple[int, int, int]]
    ) -> Iterator[tuple[int, int, int, bytes | None]]:
        """``(kg, start, end, bytes)`` per extent as :func:`read_key_group_spans` reads them,
        bytes None for a key group walked in pieces (uncompressed, over twice
        :meth:`_piece_bytes`)."""
        limit = 2 * self._piece_bytes()
        small: list[tuple[int, int, int]] = []
        for ext in list(extents):  # all first: a bad offset fails before any read, as there
            if not self.compressed and ext[2] - ext[1] > limit:
                if small:
                    yield from read_key_group_spans(self.stream, small)
                    small = []
                yield ext[0], ext[1], ext[2], None
            else:
                small.append(ext)
        if small:
            yield from read_key_group_spans(self.stream, small)

    def _walk_in_pieces(
        self,
        scan: Callable[..., Any],
        kg: int,
        start: int,
        end: int,
        handlers: Sequence[Callable[..., None] | None],
        finishers: Sequence[Callable[[], None]],
        record: Callable[[int, list[int]], None] | None,
    ) -> None:
        """Walk the uncompressed key group ``[start, end)`` read in pieces of
        :meth:`_piece_bytes` (a longer one where an entry does not fit): memory holds a piece,
        not the key group. Each piece's walk stops before the first entry or mark it does not
        hold whole; the next piece is read from there (:func:`scan_key_group`). The rows, the
        runs recorded and the errors (message, offset) are those of one walk of the whole."""
        total = end - start
        if self.stream.size() < end:  # a short stream fails as one read of the whole does
            self._walk_whole(scan, kg, start, read_key_group_bytes(self.stream, kg, start, end),
                             handlers, finishers, record)
            return
        found: list[int] | None = [] if record is not None else None
        piece = self._piece_bytes()
        base, want = 0, max(piece, 2)  # the first piece holds the state id
        state: tuple[int, int, int] | None = None
        while True:
            length = min(total - base, want)
            data = read_key_group_bytes(self.stream, kg, start + base, start + base + length)
            got = self._walk(scan, kg, start, base, data, handlers, finishers, found,
                             total - base, state)
            if base + length == total:
                break
            _entries, at, sid, phase, run_start = got
            want = piece if at > 0 else 2 * length  # nothing fitted: a longer piece
            base += at
            state = (sid, phase, run_start)
        if record is not None and found is not None:
            record(kg, found)


_END_MARK = struct.pack(">H", END_OF_KEY_GROUP)
