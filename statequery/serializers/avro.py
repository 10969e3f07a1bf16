"""Avro values as Flink's ``AvroSerializer`` writes them, decoded from the writer schema.

Flink's ``AvroSerializerSnapshot`` keeps the schema the values were written with (the runtime
class name, then ``Schema.toString()``). The bytes are *not* Avro's binary encoding: the
serializer drives Avro's ``GenericDatumWriter`` through Flink's ``DataOutputEncoder``, which writes
to a ``DataOutputView``:

| Avro type | bytes |
|---|---|
| null | nothing |
| boolean | 1 byte (non-zero: true) |
| int, long, float, double | big-endian 4 / 8 / 4 / 8 bytes (``writeInt`` ...) |
| bytes, string | int32 length + the bytes (strings UTF-8) |
| fixed | ``size`` bytes |
| enum, union branch | int32 index |
| array, map | blocks of an unsigned LEB128 count and the items (map: key string + value), then 0 |
| record | the fields in schema order |

so no Avro library reads them (fastavro's ``schemaless_reader`` takes zig-zag varints and
little-endian floats). :func:`parse_schema` turns the schema text into a tree of
:class:`AvroType`; :func:`avro_reader` builds, once per schema, a tree of closures that decodes
one value: records as dicts keyed by the Avro field names, unions of null and one type as that
type (``None`` for null), other unions as ``{"branch": index, <branch name>: value, ...}`` (only
the chosen branch set; ``None`` when the null branch is chosen), enums as the symbol, fixed and
bytes as ``bytes``, arrays as lists, maps as lists of ``(key, value)`` pairs, and the logical types
as Arrow takes them: decimal as :class:`decimal.Decimal`, date as days, time as ms / us,
timestamps as epoch ms / us / ns, uuid as its text.

Bounds: every length and count is checked against the bytes left before anything is allocated
(a count of zero-byte items, as of an array of null, is capped); recursion follows the schema, so
its depth is the schema's nesting depth, never the data's. A recursive schema (a record that
contains itself) has no finite Arrow type: :func:`parse_schema` refuses it and the values stay
raw bytes with that reason.
"""

from __future__ import annotations

import decimal
import json
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from statequery.decoder import DecodeError

__all__ = [
    "AvroSchemaError",
    "AvroType",
    "avro_reader",
    "min_size",
    "parse_schema",
    "union_member_names",
]

ReadAt = Callable[[bytes, int, int], tuple[Any, int]]

_PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")
#: the deepest nesting of types a schema may have (records, arrays, maps, unions)
MAX_DEPTH = 64
#: the largest item count accepted for zero-byte items (an array of null)
_MAX_ZERO_SIZE_COUNT = 1 << 20

_I32 = struct.Struct(">i").unpack_from
_I64 = struct.Struct(">q").unpack_from
_F32 = struct.Struct(">f").unpack_from
_F64 = struct.Struct(">d").unpack_from
_DEC_CTX = decimal.Context(prec=200, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)


class AvroSchemaError(ValueError):
    """The schema text is not a schema statequery can decode (malformed, recursive, too deep)."""


@dataclass(frozen=True)
class AvroType:
    """One node of a parsed Avro schema.

    ``kind`` is a primitive name or ``record``, ``enum``, ``array``, ``map``, ``union``,
    ``fixed``; ``name`` the full name of a named type; ``fields`` the record's ``(name, type)``
    pairs; ``items`` the array item or map value type; ``branches`` the union's types;
    ``symbols`` the enum's; ``size`` the fixed size; ``logical`` the logical type that applies
    (only when it is valid for the underlying type, as Avro ignores the others), with
    ``precision`` and ``scale`` for decimals.
    """

    kind: str
    name: str | None = None
    fields: tuple[tuple[str, AvroType], ...] = ()
    items: AvroType | None = None
    branches: tuple[AvroType, ...] = ()
    symbols: tuple[str, ...] = ()
    size: int = 0
    logical: str | None = None
    precision: int = 0
    scale: int = 0

    @property
    def short_name(self) -> str:
        return (self.name or self.kind).rsplit(".", 1)[-1]


# -- parsing -------------------------------------------------------------------------------------


def parse_schema(text: str) -> AvroType:
    """The :class:`AvroType` tree of an Avro schema (JSON text, as in the snapshot)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise AvroSchemaError(f"the Avro schema is not JSON: {e}") from None
    return _Parser().parse(data, None, 0)


class _Parser:
    def __init__(self) -> None:
        self.named: dict[str, AvroType] = {}
        self.defining: set[str] = set()

    def parse(self, data: Any, namespace: str | None, depth: int) -> AvroType:
        if depth > MAX_DEPTH:
            raise AvroSchemaError(f"the Avro schema nests deeper than {MAX_DEPTH} types")
        if isinstance(data, str):
            return self.reference(data, namespace)
        if isinstance(data, list):
            branches = tuple(self.parse(b, namespace, depth + 1) for b in data)
            if not branches:
                raise AvroSchemaError("an Avro union without branches")
            return AvroType("union", branches=branches)
        if not isinstance(data, dict):
            raise AvroSchemaError(f"not an Avro schema: {data!r:.80}")
        kind = data.get("type")
        if isinstance(kind, (dict, list)):
            return self.parse(kind, namespace, depth + 1)
        if not isinstance(kind, str):
            raise AvroSchemaError(f"an Avro schema without a type: {data!r:.80}")
        if kind in _PRIMITIVES:
            return _with_logical(AvroType(kind), data)
        if kind in ("record", "error"):
            return self.record(data, namespace, depth)
        if kind == "enum":
            full = self.full_name(data, namespace)
            symbols = data.get("symbols")
            if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
                raise AvroSchemaError(f"Avro enum {full} has no list of symbols")
            return self.define(full, AvroType("enum", name=full, symbols=tuple(symbols)))
        if kind == "fixed":
            full = self.full_name(data, namespace)
            size = data.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise AvroSchemaError(f"Avro fixed {full} has no valid size")
            return self.define(full, _with_logical(AvroType("fixed", name=full, size=size), data))
        if kind == "array":
            return AvroType("array", items=self.parse(data.get("items"), namespace, depth + 1))
        if kind == "map":
            return AvroType("map", items=self.parse(data.get("values"), namespace, depth + 1))
        return self.reference(kind, namespace)

    def record(self, data: dict[str, Any], namespace: str | None, depth: int) -> AvroType:
        full = self.full_name(data, namespace)
        if full in self.named or full in self.defining:
            raise AvroSchemaError(f"Avro type {full} is defined twice")
        self.defining.add(full)
        inner_ns = full.rsplit(".", 1)[0] if "." in full else None
        raw_fields = data.get("fields")
        if not isinstance(raw_fields, list):
            raise AvroSchemaError(f"Avro record {full} has no list of fields")
        fields = []
        for f in raw_fields:
            if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                raise AvroSchemaError(f"Avro record {full} has a field without a name")
            fields.append((f["name"], self.parse(f.get("type"), inner_ns, depth + 1)))
        self.defining.discard(full)
        return self.define(full, AvroType("record", name=full, fields=tuple(fields)))

    def full_name(self, data: dict[str, Any], namespace: str | None) -> str:
        name = data.get("name")
        if not isinstance(name, str) or not name:
            raise AvroSchemaError(f"a named Avro type without a name: {data!r:.80}")
        if "." in name:
            return name
        ns = data.get("namespace", namespace)
        return f"{ns}.{name}" if isinstance(ns, str) and ns else name

    def define(self, full: str, t: AvroType) -> AvroType:
        if full in self.named:
            raise AvroSchemaError(f"Avro type {full} is defined twice")
        self.named[full] = t
        return t

    def reference(self, name: str, namespace: str | None) -> AvroType:
        if name in _PRIMITIVES:
            return AvroType(name)
        candidates = [name]
        if "." not in name and namespace:
            candidates = [f"{namespace}.{name}", name]
        for c in candidates:
            if c in self.defining:
                raise AvroSchemaError(
                    f"the Avro schema is recursive (record {c} contains itself): no Arrow type"
                )
            if c in self.named:
                return self.named[c]
        raise AvroSchemaError(f"unknown Avro type {name!r}")


_TEMPORAL = {
    ("date", "int"), ("time-millis", "int"), ("time-micros", "long"),
    ("timestamp-millis", "long"), ("timestamp-micros", "long"), ("timestamp-nanos", "long"),
    ("local-timestamp-millis", "long"), ("local-timestamp-micros", "long"),
    ("local-timestamp-nanos", "long"), ("uuid", "string"),
}


def _with_logical(t: AvroType, data: dict[str, Any]) -> AvroType:
    """``t`` with its logical type when Avro would apply it (an invalid one is ignored)."""
    logical = data.get("logicalType")
    if not isinstance(logical, str):
        return t
    if (logical, t.kind) in _TEMPORAL or (logical == "uuid" and t.kind == "fixed" and t.size == 16):
        return AvroType(t.kind, t.name, size=t.size, logical=logical)
    if logical == "decimal" and t.kind in ("bytes", "fixed"):
        precision, scale = data.get("precision"), data.get("scale", 0)
        if not isinstance(precision, int) or not isinstance(scale, int) or precision <= 0:
            return t
        if scale < 0 or scale > precision:
            return t
        if t.kind == "fixed" and precision > _max_fixed_precision(t.size):
            return t
        return AvroType(t.kind, t.name, size=t.size, logical=logical, precision=precision,
                        scale=scale)
    return t


def _max_fixed_precision(size: int) -> int:
    if size <= 0:
        return 0
    return len(str(2 ** (8 * size - 1) - 1))


def union_member_names(t: AvroType) -> tuple[str, ...]:
    """The struct field names of a union's non-null branches (after ``branch``): the type name
    (short name for named types), the full name when two short names collide."""
    members = [b for b in t.branches if b.kind != "null"]
    short = [b.short_name for b in members]
    names = []
    for b, s in zip(members, short, strict=True):
        name = s if short.count(s) == 1 and s != "branch" else (b.name or b.kind)
        names.append(name)
    return tuple(names)


# -- decoding ------------------------------------------------------------------------------------


def _need(n: int, pos: int, end: int, what: str) -> None:
    if n > end - pos:
        raise DecodeError(f"Avro {what} needs {n} bytes, {end - pos} left", pos)


def _length(buf: bytes, pos: int, end: int, what: str) -> int:
    _need(4, pos, end, what + " length")
    n: int = _I32(buf, pos)[0]
    if n < 0:
        raise DecodeError(f"negative Avro {what} length {n}", pos)
    _need(n, pos + 4, end, what)
    return n


def _count(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """Flink's ``readVarLongCount``: an unsigned LEB128 long."""
    value = 0
    shift = 0
    start = pos
    while True:
        if pos >= end:
            raise DecodeError("Avro block count runs past the end of the value", start)
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise DecodeError("Avro block count longer than 10 bytes", start)
    if value >= 1 << 63:
        raise DecodeError(f"Avro block count {value} exceeds a Java long", start)
    return value, pos


def _read_null(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
    return None, pos


def _read_boolean(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
    _need(1, pos, end, "boolean")
    return buf[pos] != 0, pos + 1


def _fixed_width(unpack: Callable[[bytes, int], tuple[Any, ...]], n: int, what: str) -> ReadAt:
    def read(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        _need(n, pos, end, what)
        return unpack(buf, pos)[0], pos + n

    return read


def _read_bytes(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
    n = _length(buf, pos, end, "bytes")
    return bytes(buf[pos + 4 : pos + 4 + n]), pos + 4 + n


def _read_string(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
    n = _length(buf, pos, end, "string")
    try:
        return bytes(buf[pos + 4 : pos + 4 + n]).decode("utf-8"), pos + 4 + n
    except UnicodeDecodeError as e:
        raise DecodeError(f"Avro string is not UTF-8: {e}", pos) from None


def min_size(t: AvroType) -> int:
    """The fewest bytes one value of ``t`` takes."""
    k = t.kind
    if k in ("int", "float", "bytes", "string", "enum", "union"):
        return 4
    if k in ("long", "double"):
        return 8
    if k == "boolean":
        return 1
    if k == "fixed":
        return t.size
    if k in ("array", "map"):
        return 1
    if k == "record":
        return sum(min_size(f) for _, f in t.fields)
    return 0


def avro_reader(t: AvroType) -> ReadAt:
    """``read_at(buf, pos, end) -> (value, new_pos)`` for values of ``t`` (see the module)."""
    k = t.kind
    if k == "null":
        return _read_null
    if k == "boolean":
        return _read_boolean
    if k == "int":
        return _fixed_width(_I32, 4, "int")
    if k == "long":
        return _fixed_width(_I64, 8, "long")
    if k == "float":
        return _fixed_width(_F32, 4, "float")
    if k == "double":
        return _fixed_width(_F64, 8, "double")
    if k == "string":
        return _read_string
    if k == "bytes":
        return _decimal_reader(_read_bytes, t) if t.logical == "decimal" else _read_bytes
    if k == "fixed":
        read_fixed = _fixed_reader(t.size)
        if t.logical == "decimal":
            return _decimal_reader(read_fixed, t)
        if t.logical == "uuid":
            return _uuid_fixed_reader(read_fixed)
        return read_fixed
    if k == "enum":
        return _enum_reader(t)
    if k == "array":
        assert t.items is not None
        return _blocks_reader(avro_reader(t.items), min_size(t.items), None)
    if k == "map":
        assert t.items is not None
        return _blocks_reader(avro_reader(t.items), 4 + min_size(t.items), _read_string)
    if k == "union":
        return _union_reader(t)
    if k == "record":
        return _record_reader(t)
    raise AvroSchemaError(f"no reader for Avro type {k!r}")


def _fixed_reader(size: int) -> ReadAt:
    def read(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        _need(size, pos, end, "fixed")
        return bytes(buf[pos : pos + size]), pos + size

    return read


def _uuid_fixed_reader(read_fixed: ReadAt) -> ReadAt:
    def read(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        raw, pos = read_fixed(buf, pos, end)
        return str(uuid.UUID(bytes=raw)), pos

    return read


def _decimal_reader(read_raw: ReadAt, t: AvroType) -> ReadAt:
    precision, scale = t.precision, t.scale

    def read(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        start = pos
        raw, pos = read_raw(buf, pos, end)
        if not raw:
            raise DecodeError("Avro decimal with no bytes", start)
        unscaled = int.from_bytes(raw, "big", signed=True)
        if len(str(abs(unscaled))) > precision:
            raise DecodeError(
                f"Avro decimal {unscaled}E-{scale} has more than {precision} digits", start
            )
        return decimal.Decimal(unscaled).scaleb(-scale, _DEC_CTX), pos

    return read


def _enum_reader(t: AvroType) -> ReadAt:
    symbols = t.symbols
    n_symbols = len(symbols)

    def read(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        _need(4, pos, end, "enum")
        i = _I32(buf, pos)[0]
        if not 0 <= i < n_symbols:
            raise DecodeError(f"Avro enum {t.name} index {i} of {n_symbols} symbols", pos)
        return symbols[i], pos + 4

    return read


def _blocks_reader(item: ReadAt, item_min: int, key: ReadAt | None) -> ReadAt:
    """Arrays (``key`` None) and maps: blocks of a count and that many items, until count 0."""

    def read(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        out: list[Any] = []
        append = out.append
        while True:
            n, pos = _count(buf, pos, end)
            if n == 0:
                return out, pos
            if item_min > 0:
                if n * item_min > end - pos:
                    raise DecodeError(f"Avro block of {n} items exceeds the {end - pos} "
                                      "bytes left", pos)
            elif n + len(out) > _MAX_ZERO_SIZE_COUNT:
                raise DecodeError(f"Avro block of {n} zero-byte items is implausibly large", pos)
            if key is None:
                for _ in range(n):
                    v, pos = item(buf, pos, end)
                    append(v)
            else:
                for _ in range(n):
                    k, pos = key(buf, pos, end)
                    v, pos = item(buf, pos, end)
                    append((k, v))

    return read


def _union_reader(t: AvroType) -> ReadAt:
    branches = [avro_reader(b) for b in t.branches]
    n_branches = len(branches)
    non_null = [i for i, b in enumerate(t.branches) if b.kind != "null"]
    if len(non_null) <= 1:
        # null + T: the value of T, or None (a single-branch union: that branch)

        def read_nullable(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
            _need(4, pos, end, "union index")
            i = _I32(buf, pos)[0]
            if not 0 <= i < n_branches:
                raise DecodeError(f"Avro union index {i} of {n_branches} branches", pos)
            value, pos = branches[i](buf, pos + 4, end)
            return value, pos

        return read_nullable
    names = dict(zip(non_null, union_member_names(t), strict=True))
    empty = {"branch": None, **dict.fromkeys(names.values())}

    def read_union(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        _need(4, pos, end, "union index")
        i = _I32(buf, pos)[0]
        if not 0 <= i < n_branches:
            raise DecodeError(f"Avro union index {i} of {n_branches} branches", pos)
        value, pos = branches[i](buf, pos + 4, end)
        name = names.get(i)
        if name is None:  # the null branch
            return None, pos
        out = dict(empty)
        out["branch"] = i
        out[name] = value
        return out, pos

    return read_union


def _record_reader(t: AvroType) -> ReadAt:
    pairs = tuple((name, avro_reader(f)) for name, f in t.fields)

    def read(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        out = {}
        for name, r in pairs:
            out[name], pos = r(buf, pos, end)
        return out, pos

    return read
