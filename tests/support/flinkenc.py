"""A small encoder of Flink's serializer formats, for tests: the inverse of
:mod:`statequery.serializers.readers` for every shape the compiled decode path handles
(``statequery/backends/fastpath.py``), and the containers the walkers consume (canonical key-group
streams, hashmap-checkpoint key groups, RocksDB key/value pairs).

Values are in the form the pure-Python readers return (ints, floats, str, bytes, ``Decimal``,
dicts for structs, lists, ``(key, value)`` lists for maps, ``{"last_access", "value"}`` for TTL
values). The byte layouts follow Flink 2.3's serializers; ``tests/backends/test_differential.py``
checks this encoder against real fixture bytes (values decoded from Flink-written savepoints
re-encode to exactly the bytes Flink wrote).
"""

from __future__ import annotations

import decimal
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from statequery.metadata.state import StateInfo
from statequery.serializers.avro import AvroType
from statequery.serializers.readers import primitive_name, sql_fixed_size
from statequery.serializers.spec import (
    ROW_KINDS,
    ArrayDataSpec,
    AvroSpec,
    EnumSpec,
    ListSpec,
    MapSpec,
    NamespaceSpec,
    PojoSpec,
    PrimitiveArraySpec,
    PrimitiveSpec,
    RawValueSpec,
    RowDataSpec,
    RowSpec,
    SerializerSpec,
    SqlType,
    TimerSpec,
    TtlSpec,
    TupleSpec,
)

LONG_MIN = -(1 << 63)
#: the value of a non-null field whose serializer writes a constant (``VoidSerializer``'s 0 byte,
#: e.g. the RAW NullSerializer placeholders of SQL data views) and which reads back as None
VOID = type("Void", (), {"__repr__": lambda self: "VOID"})()
LIST_DELIMITER = b","
END_OF_KEY_GROUP = 0xFFFF
_DEC = decimal.Context(prec=200, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)

_AVRO_STRING = AvroType("string")
_FIXED = {
    "long": ">q",
    "int": ">i",
    "short": ">h",
    "byte": ">b",
    "double": ">d",
    "float": ">f",
}


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def string_value(s: str | None) -> bytes:
    """``StringValue.writeString``: varint(length + 1) (0: null), one varint per UTF-16 unit."""
    if s is None:
        return b"\x00"
    units = s.encode("utf-16-be", "surrogatepass")
    out = bytearray(varint(len(units) // 2 + 1))
    for i in range(0, len(units), 2):
        out += varint((units[i] << 8) | units[i + 1])
    return bytes(out)


def avro_value(t: Any, v: Any) -> bytes:
    """Flink's ``AvroSerializer`` bytes (``DataOutputEncoder``: big-endian fixed-width numbers,
    int32 lengths and indexes, LEB128 block counts; docs/avro.md) of ``v`` in the reader's form
    (:mod:`statequery.serializers.avro`) for the parsed schema ``t``."""
    import decimal
    import uuid

    from statequery.serializers.avro import union_member_names

    k = t.kind
    if k == "union":
        members = [i for i, b in enumerate(t.branches) if b.kind != "null"]
        nulls = [i for i, b in enumerate(t.branches) if b.kind == "null"]
        if v is None:
            return struct.pack(">i", nulls[0])
        if len(members) == 1:
            return struct.pack(">i", members[0]) + avro_value(t.branches[members[0]], v)
        name = dict(zip(members, union_member_names(t), strict=True))[v["branch"]]
        return struct.pack(">i", v["branch"]) + avro_value(t.branches[v["branch"]], v[name])
    if k == "record":
        return b"".join(avro_value(f, v[n]) for n, f in t.fields)
    if k in ("array", "map"):
        body = b"".join(avro_value(t.items, x) if k == "array"
                        else avro_value(_AVRO_STRING, x[0]) + avro_value(t.items, x[1])
                        for x in v)
        return (varint(len(v)) + body if v else b"") + b"\x00"
    if t.logical == "decimal":
        unscaled = int(decimal.Decimal(v).scaleb(t.scale))
        n = t.size if k == "fixed" else max(1, (unscaled.bit_length() + 8) // 8)
        raw = unscaled.to_bytes(n, "big", signed=True)
        return raw if k == "fixed" else struct.pack(">i", len(raw)) + raw
    if t.logical == "uuid" and k == "fixed":
        return uuid.UUID(v).bytes
    if k == "null":
        return b""
    if k == "boolean":
        return b"\x01" if v else b"\x00"
    if k in ("int", "long", "float", "double"):
        return struct.pack({"int": ">i", "long": ">q", "float": ">f", "double": ">d"}[k], v)
    if k == "enum":
        return struct.pack(">i", t.symbols.index(v))
    raw = v.encode("utf-8") if isinstance(v, str) else bytes(v)
    return raw if k == "fixed" else struct.pack(">i", len(raw)) + raw


def encode(spec: SerializerSpec, v: Any) -> bytes:
    """The bytes Flink's serializer for ``spec`` writes for ``v``."""
    if isinstance(spec, AvroSpec):
        from statequery.serializers.avro import parse_schema

        return avro_value(parse_schema(spec.schema), v)
    if isinstance(spec, PrimitiveSpec):
        name = primitive_name(spec.name)
        fmt = _FIXED.get(name)
        if fmt is not None:
            return struct.pack(fmt, v)
        if name == "boolean":
            return b"\x01" if v else b"\x00"
        if name == "string":
            return string_value(v)
        if name == "string_data":
            b = v.encode("utf-8")
            return struct.pack(">i", len(b)) + b
        if name == "void":
            return b"\x00"
        if name == "null_value":
            return b""
        raise NotImplementedError(name)
    if isinstance(spec, PrimitiveArraySpec):
        assert primitive_name(spec.element) == "byte"
        return struct.pack(">i", len(v)) + bytes(v)
    if isinstance(spec, EnumSpec):
        return struct.pack(">i", spec.constants.index(v))
    if isinstance(spec, NamespaceSpec):
        if spec.name in ("void", "global_window"):
            return b"\x00"
        if spec.name == "time_window":
            return struct.pack(">qq", v["start"], v["end"])
        if spec.name == "count_window":
            return struct.pack(">q", v)
        raise NotImplementedError(spec.name)
    if isinstance(spec, TupleSpec):
        return b"".join(encode(f, v[f"f{i}"]) for i, f in enumerate(spec.fields))
    if isinstance(spec, RowSpec):
        off = 2 if spec.supports_row_kind else 0
        mask = bytearray((off + len(spec.fields) + 7) // 8)
        body = b""
        for i, (name, f) in enumerate(zip(spec.field_names, spec.fields, strict=True)):
            if v[name] is None:
                bit = off + i
                mask[bit >> 3] |= 0x80 >> (bit & 7)
            else:
                body += encode(f, v[name])
        return bytes(mask) + body
    if isinstance(spec, PojoSpec):
        if v is None:
            return b"\x01"
        out = b"\x02"
        for f in spec.fields:
            x = v[f.name]
            out += b"\x01" if x is None else b"\x00" + encode(f.spec, x)  # type: ignore[arg-type]
        return out
    if isinstance(spec, ListSpec):
        return struct.pack(">i", len(v)) + b"".join(encode(spec.element, x) for x in v)
    if isinstance(spec, MapSpec):
        out = struct.pack(">i", len(v))
        for k, x in v:
            out += encode(spec.key, k)
            out += b"\x01" if x is None else b"\x00" + encode(spec.value, x)  # type: ignore[arg-type]
        return out
    if isinstance(spec, TtlSpec):
        return struct.pack(">q", v["last_access"]) + encode(spec.inner, v["value"])
    if isinstance(spec, TimerSpec):
        return timer_bytes(v["timestamp"]) + encode(spec.key, v["key"]) + encode(
            spec.namespace, v["namespace"]
        )
    if isinstance(spec, RowDataSpec):
        kind = ROW_KINDS.index(v["row_kind"]) if spec.row_kind else 0
        row = binary_row(spec.type, v, spec.field_specs, kind)
        return struct.pack(">i", len(row)) + row
    if isinstance(spec, ArrayDataSpec):
        arr = binary_array(spec.element, v)
        return struct.pack(">i", len(arr)) + arr
    if isinstance(spec, RawValueSpec):
        inner = encode(spec.inner, v)
        return struct.pack(">i", len(inner)) + inner
    raise NotImplementedError(type(spec).__name__)


def timer_bytes(ts: int) -> bytes:
    """``TimerSerializer``'s timestamp: the sign bit flipped (keys sort by time)."""
    return struct.pack(">q", ts ^ LONG_MIN)


# -- Flink SQL: BinaryRowData / BinaryArrayData (little-endian inside) ---------------------------


def _resolve(t: SqlType) -> SqlType:
    while t.root == "DISTINCT_TYPE" and t.element is not None:
        t = t.element
    return t


def _word(n: int) -> int:
    return (n + 7) & ~7


class _Writer:
    """``AbstractBinaryWriter``: a fixed part (null bits and slots) and an 8-aligned variable
    part; ``slot`` is the byte offset of a field's fixed slot, offsets are relative to the start
    of the row/array."""

    def __init__(self, fixed: int) -> None:
        self.buf = bytearray(fixed)

    def var(self, data: bytes, reserve: int | None = None) -> int:
        off = len(self.buf)
        self.buf += data
        self.buf += b"\x00" * (_word(reserve if reserve is not None else len(data)) - len(data))
        return off

    def put(self, slot: int, fmt: str, v: Any) -> None:
        struct.pack_into(fmt, self.buf, slot, v)

    def offset_and_len(self, slot: int, off: int, n: int) -> None:
        struct.pack_into("<Q", self.buf, slot, (off << 32) | n)

    def bytes_field(self, slot: int, b: bytes) -> None:
        """``writeString``/``writeBinary``: <= 7 bytes inline (length | 0x80 in the slot's last
        byte), longer ones in the variable part."""
        if len(b) <= 7:
            self.buf[slot : slot + 8] = b + b"\x00" * (7 - len(b)) + bytes([0x80 | len(b)])
        else:
            self.offset_and_len(slot, self.var(b), len(b))

    def value(self, t: SqlType, slot: int, v: Any, spec: SerializerSpec | None,
              width: int = 8) -> None:
        t = _resolve(t)
        r = t.root
        if r == "BOOLEAN":
            self.buf[slot] = 1 if v else 0
        elif r == "TINYINT":
            self.put(slot, "<b", v)
        elif r == "SMALLINT":
            self.put(slot, "<h", v)
        elif r in ("INTEGER", "DATE", "TIME_WITHOUT_TIME_ZONE", "INTERVAL_YEAR_MONTH"):
            self.put(slot, "<i", v)
        elif r in ("BIGINT", "INTERVAL_DAY_TIME"):
            self.put(slot, "<q", v)
        elif r == "FLOAT":
            self.put(slot, "<f", v)
        elif r == "DOUBLE":
            self.put(slot, "<d", v)
        elif r == "DECIMAL":
            p = 10 if t.precision is None else t.precision
            unscaled = int(v.scaleb(t.scale or 0, _DEC))
            if p <= 18:
                self.put(slot, "<q", unscaled)
            else:
                # BigInteger.toByteArray: minimal two's complement, 16 bytes reserved
                bits = unscaled.bit_length() if unscaled >= 0 else (~unscaled).bit_length()
                n = bits // 8 + 1
                b = unscaled.to_bytes(n, "big", signed=True)
                self.offset_and_len(slot, self.var(b, 16), len(b))
        elif r in ("TIMESTAMP_WITHOUT_TIME_ZONE", "TIMESTAMP_WITH_LOCAL_TIME_ZONE"):
            p = 6 if t.precision is None else t.precision
            if p <= 3:
                self.put(slot, "<q", v)
            else:
                unit = 1_000_000 if p > 6 else 1000
                millis, rest = divmod(v, unit)
                nanos = rest if p > 6 else rest * 1000
                self.offset_and_len(slot, self.var(struct.pack("<q", millis)), nanos)
        elif r in ("CHAR", "VARCHAR"):
            self.bytes_field(slot, v.encode("utf-8"))
        elif r in ("BINARY", "VARBINARY"):
            self.bytes_field(slot, bytes(v))
        elif r in ("ROW", "STRUCTURED_TYPE"):
            specs = spec.field_specs if isinstance(spec, RowDataSpec) else ()
            row = binary_row(t, v, specs)
            self.offset_and_len(slot, self.var(row), len(row))
        elif r == "ARRAY":
            arr = binary_array(t.element or SqlType("NULL"), v)
            self.offset_and_len(slot, self.var(arr), len(arr))
        elif r == "RAW":
            assert isinstance(spec, RawValueSpec)
            inner = encode(spec.inner, v)
            self.offset_and_len(slot, self.var(inner), len(inner))
        else:
            raise NotImplementedError(r)

    def null(self, t: SqlType, slot: int) -> None:
        """What the writers leave in a null field's slot: non-compact DECIMAL and TIMESTAMP still
        reserve their variable-part bytes (offset, length 0)."""
        t = _resolve(t)
        if t.root == "DECIMAL" and (t.precision or 10) > 18:
            self.offset_and_len(slot, self.var(b"", 16), 0)
        elif t.root.startswith("TIMESTAMP") and (6 if t.precision is None else t.precision) > 3:
            self.offset_and_len(slot, self.var(b"\x00" * 8), 0)


def binary_row(t: SqlType, v: dict[str, Any], field_specs: Sequence[SerializerSpec] = (),
               row_kind: int = 0) -> bytes:
    """A ``BinaryRowData``'s bytes (without the int32 size): null bits (byte 0 the RowKind,
    field i's bit i + 8), one 8-byte slot per field, the variable part."""
    fields = t.fields
    arity = len(fields)
    specs = list(field_specs) if len(field_specs) == arity else [None] * arity
    null_bytes = ((arity + 63 + 8) // 64) * 8
    w = _Writer(null_bytes + 8 * arity)
    w.buf[0] = row_kind
    for i, f in enumerate(fields):
        x = v[f.name or f"f{i}"]
        slot = null_bytes + 8 * i
        if x is None:
            w.buf[(i + 8) >> 3] |= 1 << ((i + 8) & 7)
            w.null(f.type, slot)
        else:
            w.value(f.type, slot, x, specs[i])
    return bytes(w.buf)


def binary_array(element: SqlType, values: Sequence[Any]) -> bytes:
    """A ``BinaryArrayData``: int32 n (LE), null bits ``((n + 31) // 32) * 4`` bytes, n element
    slots of the element's size, padded to 8 bytes, the variable part."""
    n = len(values)
    size = sql_fixed_size(_resolve(element))
    header = 4 + ((n + 31) // 32) * 4
    w = _Writer(_word(header + size * n))
    w.put(0, "<i", n)
    for i, x in enumerate(values):
        slot = header + size * i
        if x is None:
            w.buf[4 + (i >> 3)] |= 1 << (i & 7)
            w.null(element, slot)
        else:
            w.value(element, slot, x, None, size)
    return bytes(w.buf)


# -- state entries and their containers ---------------------------------------------------------


@dataclass
class Entry:
    """One state entry: ``ns`` None for the VoidNamespace; ``user_key`` for map entries;
    ``value`` the whole entry value (a list for list state, the value for value state, a map
    value — None: null — for map entries, the timestamp for timers)."""

    kg: int
    key: Any
    ns: Any = None
    user_key: Any = None
    value: Any = None


@dataclass
class StateBytes:
    """What one layout's entries look like on disk (the encoder of a state)."""

    kind: str  # value | list | map | timer
    key: SerializerSpec
    ns: SerializerSpec
    value: SerializerSpec | None = None  # the value / list element / map value
    user_key: SerializerSpec | None = None
    ttl: bool = False
    prefix_len: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    def _ttl(self, v: Any) -> bytes:
        assert self.value is not None
        if self.ttl:
            return encode(TtlSpec(inner=self.value), v)
        return encode(self.value, v)

    def key_ns(self, e: Entry) -> bytes:
        return encode(self.key, e.key) + encode(self.ns, e.ns)

    def composite(self, e: Entry) -> tuple[bytes, bytes]:
        """``(key, value)`` as RocksDB stores it and the canonical format writes it: the key
        with its key-group prefix (``SerializedCompositeKeyBuilder``)."""
        prefix = e.kg.to_bytes(self.prefix_len, "big")
        if self.kind == "timer":
            return prefix + timer_bytes(e.value) + self.key_ns(e), b""
        if self.kind == "value":
            return prefix + self.key_ns(e), self._ttl(e.value)
        if self.kind == "list":
            # ListDelimitedSerializer: elements joined by ","
            return prefix + self.key_ns(e), LIST_DELIMITER.join(self._ttl(x) for x in e.value)
        assert self.user_key is not None
        k = prefix + self.key_ns(e) + encode(self.user_key, e.user_key)
        return k, b"\x01" if e.value is None else b"\x00" + self._ttl(e.value)

    def heap(self, e: Entry) -> bytes:
        """The hashmap checkpoint format: namespace, key, the state's full value (timers: the
        TimerSerializer element). ``e.value`` of a map is its ``(user key, value)`` list."""
        if self.kind == "timer":
            return timer_bytes(e.value) + encode(self.key, e.key) + encode(self.ns, e.ns)
        head = encode(self.ns, e.ns) + encode(self.key, e.key)
        if self.kind == "value":
            return head + self._ttl(e.value)
        if self.kind == "list":
            return head + struct.pack(">i", len(e.value)) + b"".join(self._ttl(x) for x in e.value)
        out = head + struct.pack(">i", len(e.value))
        assert self.user_key is not None
        for k, x in e.value:
            out += encode(self.user_key, k)
            out += b"\x01" if x is None else b"\x00" + self._ttl(x)
        return out


def canonical_stream(runs: Iterable[tuple[int, int, Sequence[tuple[bytes, bytes]]]],
                     ) -> tuple[bytes, dict[int, int]]:
    """A canonical keyed-state stream (``FullSnapshotAsyncWriter``): per key group, runs of
    ``(state id, entries)``: u16 state id, then ``int32 klen, key, int32 vlen, value`` per entry,
    the last entry of a run flagged by the high bit of its key's first byte; u16 0xFFFF ends the
    key group. ``runs``: ``(key group, state id, [(key, value), ...])`` in stream order (entries
    non-empty). Returns the bytes (after an 8-byte stand-in header) and the key-group offsets."""
    out = bytearray(b"\x00" * 8)
    offsets: dict[int, int] = {}
    current = -1
    for kg, sid, entries in runs:
        assert entries
        if kg != current:
            if current >= 0:
                out += struct.pack(">H", END_OF_KEY_GROUP)
            offsets[kg] = len(out)
            current = kg
        out += struct.pack(">H", sid)
        for i, (k, v) in enumerate(entries):
            if i == len(entries) - 1:
                k = bytes([k[0] | 0x80]) + k[1:]
            out += struct.pack(">i", len(k)) + k + struct.pack(">i", len(v)) + v
    if current >= 0:
        out += struct.pack(">H", END_OF_KEY_GROUP)
    return bytes(out), offsets


def heap_stream(groups: Iterable[tuple[int, Sequence[tuple[int, Sequence[bytes]]]]],
                ) -> tuple[bytes, dict[int, int]]:
    """A hashmap checkpoint stream (``HeapSnapshotStrategy``, uncompressed): per key group its
    int32 id, then per state u16 state id, int32 n, the n entries. ``groups``: ``(key group,
    [(state id, [entry bytes, ...]), ...])``. Returns the bytes and the key-group offsets."""
    out = bytearray(b"\x00" * 8)
    offsets: dict[int, int] = {}
    for kg, blocks in groups:
        offsets[kg] = len(out)
        out += struct.pack(">i", kg)
        for sid, entries in blocks:
            out += struct.pack(">Hi", sid, len(entries))
            for b in entries:
                out += b
    return bytes(out), offsets


class MemoryStream:
    """A :class:`statequery.backends.keygroups.ByteStream` over bytes in memory."""

    def __init__(self, data: bytes, name: str = "differential-stream") -> None:
        self.data = data
        self.name = name

    def size(self) -> int:
        return len(self.data)

    def read_range(self, start: int, length: int) -> bytes:
        return self.data[start : start + length]


def row_state(
    name: str,
    kind: str,
    *,
    key: SerializerSpec | None = None,
    namespace: SerializerSpec | None = None,
    user_key: SerializerSpec | None = None,
    value: SerializerSpec | None = None,
    ttl: bool = False,
    state_value: SerializerSpec | None = None,
) -> StateInfo:
    """A :class:`~statequery.metadata.state.StateInfo` of ``kind`` whose per-row specs are these
    (``value`` TTL-unwrapped, as the decoders see it): the header serializers Flink would write
    for them (``state_value``, when given, is the full ``VALUE_SERIALIZER``)."""
    wrapped = TtlSpec(inner=value) if ttl and value is not None else value
    sers: dict[str, SerializerSpec] = {}
    key_spec = key
    if kind in ("list", "map", "value", "reducing", "aggregating"):
        if namespace is not None:
            sers["NAMESPACE_SERIALIZER"] = namespace
        full = state_value
        if full is None and wrapped is not None:
            if kind == "list":
                full = ListSpec(element=wrapped)
            elif kind == "map":
                assert user_key is not None
                full = MapSpec(key=user_key, value=wrapped)
            else:
                full = wrapped
        if kind == "map" and user_key is not None and not isinstance(full, MapSpec):
            sers["USER_KEY_SERIALIZER"] = user_key
    elif kind == "broadcast":
        full = state_value or value
        if user_key is not None:
            sers["KEY_SERIALIZER"] = user_key
    else:  # timers, queues, operator state: the value is the whole serializer
        full = state_value or value
        key_spec = key if kind in ("event_timer", "processing_timer", "priority_queue") else None
    if full is not None:
        sers["VALUE_SERIALIZER"] = full
    s = StateInfo(name, kind, serializers=sers, key_spec=key_spec)
    got = (s.key, s.namespace, s.user_key, s.value, s.ttl)
    assert got == (key, namespace or s.namespace, user_key, value, ttl), (got, kind)
    return s
