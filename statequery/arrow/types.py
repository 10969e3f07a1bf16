"""SerializerSpec -> pyarrow DataType, matching the values of :mod:`statequery.serializers.readers`.

| serializer / SQL type | Arrow type |
|---|---|
| boolean, byte, short, int, long | bool, int8, int16, int32, int64 |
| float, double | float32, float64 |
| char, String, StringData, CHAR/VARCHAR | string |
| byte[], BINARY/VARBINARY | binary |
| BigInteger, BigDecimal (unbounded) | string (``toPlainString``) |
| DecimalData / DECIMAL(p, s) | decimal128(p, s) |
| java.util.Date, java.sql.Date/Time | timestamp[ms] |
| java.sql.Timestamp, LocalDateTime | timestamp[ns] |
| Instant | timestamp[ns, UTC] |
| LocalDate, SQL DATE | date32 |
| LocalTime | time64[ns]; SQL TIME: time32[ms] |
| TimestampData / TIMESTAMP(p) | timestamp[ms / us] by precision (<= 3, <= 6); 7..9: exact text |
| TIMESTAMP_LTZ(p) | the same with tz UTC (text: `...Z`) |
| enum | string (the constant name; Spark has no dictionary type) |
| Tuple, Row, POJO, ROW | struct (Tuple: f0..fn; Row/ROW: names or f0..fn; POJO: fields) |
| List, Set, arrays, ARRAY, ListView | list |
| Map, MAP | map; MULTISET: map<element, int32> |
| Nullable | the inner type |
| Either | struct<left, right> |
| TtlValue | struct<last_access: timestamp[ms, UTC], value> |
| TimeWindow | struct<start: timestamp[ms, UTC], end: timestamp[ms, UTC]> |
| VoidNamespace, GlobalWindow, Void | null |
| Avro (``AvroSerializer``) | from the writer schema (:func:`avro_arrow_type`) |
| opaque (Kryo, Java, unknown, a recursive Avro schema) | binary |
"""

from __future__ import annotations

import pyarrow as pa

from statequery.exceptions import UnsupportedFormatError
from statequery.serializers.avro import AvroType, union_member_names
from statequery.serializers.avro import parse_schema as parse_avro_schema
from statequery.serializers.readers import primitive_name, timestamp_unit
from statequery.serializers.spec import (
    ArrayDataSpec,
    AvroSpec,
    EitherSpec,
    EnumSpec,
    GenericArraySpec,
    LinkedListSpec,
    ListSpec,
    MapDataSpec,
    MapSpec,
    NamespaceSpec,
    NullableSpec,
    OpaqueSpec,
    OptionalSpec,
    PojoSpec,
    PrimitiveArraySpec,
    PrimitiveSpec,
    RawValueSpec,
    RowDataSpec,
    RowSpec,
    SerializerSpec,
    SqlType,
    StructSpec,
    TimerSpec,
    TtlSpec,
    TupleSpec,
    WindowKeySpec,
)

__all__ = ["EPOCH_MS", "arrow_type", "avro_arrow_type", "sql_arrow_type"]

#: Arrow type of event-time instants in epoch milliseconds (timers, windows, TTL timestamps).
EPOCH_MS = pa.timestamp("ms", tz="UTC")

_PRIMITIVE_TYPES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "byte": pa.int8(),
    "short": pa.int16(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "char": pa.string(),
    "string": pa.string(),
    "void": pa.null(),
    "null_value": pa.null(),
    "bigint": pa.string(),
    "bigdec": pa.string(),
    "date": pa.timestamp("ms"),
    "sql_date": pa.timestamp("ms"),
    "sql_time": pa.timestamp("ms"),
    "sql_timestamp": pa.timestamp("ns"),
    "instant": pa.timestamp("ns", tz="UTC"),
    "local_date": pa.date32(),
    "local_time": pa.time64("ns"),
    "local_date_time": pa.timestamp("ns"),
    "string_data": pa.string(),
    "bytes": pa.binary(),
}

_ENUM_TYPE = pa.string()


def arrow_type(spec: SerializerSpec) -> pa.DataType:
    """The Arrow type of the values of ``spec`` (binary for opaque serializers)."""
    if isinstance(spec, PrimitiveSpec):
        name = primitive_name(spec.name)
        if name == "decimal_data":
            return _decimal_type(spec.precision, spec.scale)
        if name == "timestamp_data":
            unit = timestamp_unit(spec.precision)
            return pa.string() if unit is None else pa.timestamp(unit)
        try:
            return _PRIMITIVE_TYPES[name]
        except KeyError:
            raise UnsupportedFormatError(f"no Arrow type for primitive {spec.name!r}") from None
    if isinstance(spec, NamespaceSpec):
        if spec.name == "time_window":
            return pa.struct([("start", EPOCH_MS), ("end", EPOCH_MS)])
        if spec.name == "count_window":
            return pa.int64()
        return pa.null()
    if isinstance(spec, PrimitiveArraySpec):
        element = primitive_name(spec.element)
        if element == "byte":
            return pa.binary()
        return pa.list_(_PRIMITIVE_TYPES[element])
    if isinstance(spec, EnumSpec):
        return _ENUM_TYPE
    if isinstance(spec, TupleSpec):
        return pa.struct([(f"f{i}", arrow_type(f)) for i, f in enumerate(spec.fields)])
    if isinstance(spec, RowSpec):
        pairs = zip(spec.field_names, spec.fields, strict=True)
        return pa.struct([(n, arrow_type(f)) for n, f in pairs])
    if isinstance(spec, PojoSpec):
        return pa.struct(
            [(f.name, arrow_type(f.spec) if f.spec is not None else pa.null()) for f in spec.fields]
        )
    if isinstance(spec, (ListSpec, LinkedListSpec)):
        return pa.list_(arrow_type(spec.element))
    if isinstance(spec, GenericArraySpec):
        return pa.list_(arrow_type(spec.element))
    if isinstance(spec, MapSpec):
        if spec.is_set or spec.value is None:
            return pa.list_(arrow_type(spec.key))
        return pa.map_(arrow_type(spec.key), arrow_type(spec.value))
    if isinstance(spec, NullableSpec):
        return arrow_type(spec.inner)
    if isinstance(spec, EitherSpec):
        return pa.struct([("left", arrow_type(spec.left)), ("right", arrow_type(spec.right))])
    if isinstance(spec, TtlSpec):
        return pa.struct([("last_access", EPOCH_MS), ("value", arrow_type(spec.inner))])
    if isinstance(spec, TimerSpec):
        return pa.struct(
            [
                ("timestamp", EPOCH_MS),
                ("key", arrow_type(spec.key)),
                ("namespace", arrow_type(spec.namespace)),
            ]
        )
    if isinstance(spec, RowDataSpec):
        row = sql_arrow_type(spec.type, spec)
        if spec.derived:  # values computed from the fields, after them (RowDataSpec.derived)
            row = pa.struct([*row, *(pa.field(d[0], DERIVED_TYPES[d[4]]) for d in spec.derived)])
        if spec.row_kind:  # the RowKind, before the fields (RowDataSpec.row_kind)
            return pa.struct([pa.field("row_kind", pa.string()), *row])
        return row
    if isinstance(spec, ArrayDataSpec):
        return pa.list_(sql_arrow_type(spec.element))
    if isinstance(spec, MapDataSpec):
        return pa.map_(sql_arrow_type(spec.key), sql_arrow_type(spec.value))
    if isinstance(spec, RawValueSpec):
        return arrow_type(spec.inner) if spec.inner.decodable else pa.binary()
    if isinstance(spec, WindowKeySpec):
        return pa.struct([("window", pa.int64()), ("key", arrow_type(spec.key))])
    if isinstance(spec, StructSpec):
        return pa.struct([(n, arrow_type(f)) for n, f in zip(spec.names, spec.fields, strict=True)])
    if isinstance(spec, OptionalSpec):
        return arrow_type(spec.inner)
    if isinstance(spec, OpaqueSpec):
        return pa.binary()
    if isinstance(spec, AvroSpec):
        return avro_arrow_type(parse_avro_schema(spec.schema))
    raise UnsupportedFormatError(f"no Arrow type for serializer kind {spec.kind!r}")


_AVRO_PRIMITIVES: dict[str, pa.DataType] = {
    "null": pa.null(), "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(),
    "float": pa.float32(), "double": pa.float64(), "bytes": pa.binary(), "string": pa.string(),
    "fixed": pa.binary(), "enum": pa.string(),
}
_AVRO_LOGICAL: dict[str, pa.DataType] = {
    "date": pa.date32(), "time-millis": pa.time32("ms"), "time-micros": pa.time64("us"),
    "timestamp-millis": pa.timestamp("ms", tz="UTC"),
    "timestamp-micros": pa.timestamp("us", tz="UTC"),
    "timestamp-nanos": pa.timestamp("ns", tz="UTC"),
    "local-timestamp-millis": pa.timestamp("ms"), "local-timestamp-micros": pa.timestamp("us"),
    "local-timestamp-nanos": pa.timestamp("ns"), "uuid": pa.string(),
}


def avro_arrow_type(t: AvroType) -> pa.DataType:
    """The Arrow type of Avro values (:mod:`statequery.serializers.avro`): records as structs
    with the Avro field names, null + T as T, other unions as ``struct<branch: int32, <one
    field per non-null branch>>``, enums as strings, fixed and bytes as binary, arrays as lists,
    maps as ``map<string, V>``, logical types as date32, time32/64, timestamp (UTC for
    ``timestamp-*``, none for ``local-timestamp-*``), decimal(p, s) and uuid strings."""
    if t.logical == "decimal":
        return _decimal_type(t.precision, t.scale)
    if t.logical is not None:
        return _AVRO_LOGICAL[t.logical]
    if t.kind in _AVRO_PRIMITIVES:
        return _AVRO_PRIMITIVES[t.kind]
    if t.kind == "record":
        return pa.struct([(name, avro_arrow_type(f)) for name, f in t.fields])
    if t.kind == "array":
        assert t.items is not None
        return pa.list_(avro_arrow_type(t.items))
    if t.kind == "map":
        assert t.items is not None
        return pa.map_(pa.string(), avro_arrow_type(t.items))
    if t.kind == "union":
        members = [b for b in t.branches if b.kind != "null"]
        if not members:
            return pa.null()
        if len(members) == 1:
            return avro_arrow_type(members[0])
        names = union_member_names(t)
        return pa.struct([("branch", pa.int32()),
                          *((n, avro_arrow_type(b)) for n, b in zip(names, members, strict=True))])
    raise UnsupportedFormatError(f"no Arrow type for Avro type {t.kind!r}")


#: the Arrow types of :attr:`RowDataSpec.derived` values, by their SQL type root
DERIVED_TYPES = {"TINYINT": pa.int8(), "SMALLINT": pa.int16(), "INTEGER": pa.int32(),
                 "BIGINT": pa.int64(), "FLOAT": pa.float32(), "DOUBLE": pa.float64()}


def _decimal_type(precision: int | None, scale: int | None) -> pa.DataType:
    p = 38 if precision is None else precision
    s = 0 if scale is None else scale
    if p > 38:
        return pa.decimal256(p, s)
    return pa.decimal128(max(p, 1), s)


def sql_arrow_type(t: SqlType, spec: SerializerSpec | None = None) -> pa.DataType:
    """The Arrow type of a Flink SQL logical type (as decoded from ``BinaryRowData``).

    ``spec`` is the stored serializer of the value, when known: a ``RAW`` value whose serializer
    can be decoded takes that serializer's Arrow type (``null`` for the ``NullSerializer``
    placeholders of state-backed data views), and a ROW takes its fields' stored serializers.
    """
    while t.root == "DISTINCT_TYPE" and t.element is not None:
        t = t.element
    r = t.root
    if r == "RAW" and isinstance(spec, RawValueSpec) and spec.inner.decodable:
        return arrow_type(spec.inner)
    if r == "BOOLEAN":
        return pa.bool_()
    if r == "TINYINT":
        return pa.int8()
    if r == "SMALLINT":
        return pa.int16()
    if r == "INTEGER":
        return pa.int32()
    if r == "BIGINT":
        return pa.int64()
    if r == "FLOAT":
        return pa.float32()
    if r == "DOUBLE":
        return pa.float64()
    if r == "DECIMAL":
        return _decimal_type(t.precision, t.scale)
    if r in ("CHAR", "VARCHAR"):
        return pa.string()
    if r in ("BINARY", "VARBINARY", "RAW", "VARIANT", "SYMBOL"):
        return pa.binary()
    if r == "DATE":
        return pa.date32()
    if r == "TIME_WITHOUT_TIME_ZONE":
        return pa.time32("ms")
    if r in ("TIMESTAMP_WITHOUT_TIME_ZONE", "TIMESTAMP_WITH_LOCAL_TIME_ZONE"):
        unit = timestamp_unit(t.precision)
        if unit is None:  # 7..9 digits: exact text (readers.sql_timestamp_text)
            return pa.string()
        return pa.timestamp(unit, tz="UTC" if r == "TIMESTAMP_WITH_LOCAL_TIME_ZONE" else None)
    if r == "INTERVAL_YEAR_MONTH":
        return pa.int32()
    if r == "INTERVAL_DAY_TIME":
        return pa.int64()
    if r == "ARRAY":
        return pa.list_(sql_arrow_type(t.element or SqlType("NULL")))
    if r == "MULTISET":
        return pa.map_(sql_arrow_type(t.element or SqlType("NULL")), pa.int32())
    if r == "MAP":
        return pa.map_(
            sql_arrow_type(t.key or SqlType("NULL")), sql_arrow_type(t.value or SqlType("NULL"))
        )
    if r in ("ROW", "STRUCTURED_TYPE"):
        row_spec = spec if isinstance(spec, RowDataSpec) else None
        out = []
        for i, f in enumerate(t.fields):
            field_spec = row_spec.field_spec(i) if row_spec is not None else None
            out.append(_sql_field(f.name or f"f{i}", f.type, field_spec))
        return pa.struct(out)
    if r == "NULL":
        return pa.null()
    raise UnsupportedFormatError(f"no Arrow type for SQL type {t}")


def _sql_field(name: str, t: SqlType, spec: SerializerSpec | None) -> pa.Field:
    """A ROW field; a RAW field left as raw bytes says why in its metadata."""
    typ = sql_arrow_type(t, spec)
    root = t.root
    while root == "DISTINCT_TYPE" and t.element is not None:
        t = t.element
        root = t.root
    if root in ("TIMESTAMP_WITHOUT_TIME_ZONE", "TIMESTAMP_WITH_LOCAL_TIME_ZONE") and (
        pa.types.is_string(typ)
    ):
        # the text of a TIMESTAMP(7..9): the field says which SQL type it holds
        return pa.field(name, typ, metadata={b"statequery.sql_type": _sql_text(t).encode()})
    if root != "RAW" or not pa.types.is_binary(typ):
        return pa.field(name, typ)
    if isinstance(spec, RawValueSpec):
        reason = raw_value_reason(spec.inner)
    else:
        reason = "no field serializer stored in the snapshot"
    return pa.field(name, typ, metadata={b"statequery.raw_reason": reason.encode()})


def _sql_text(t: SqlType) -> str:
    base = "TIMESTAMP_LTZ" if t.root == "TIMESTAMP_WITH_LOCAL_TIME_ZONE" else "TIMESTAMP"
    return f"{base}({t.precision})"


def raw_value_reason(inner: SerializerSpec) -> str:
    """Why a RAW value written by ``inner`` stays raw bytes."""
    stack = [inner]
    while stack:
        s = stack.pop()
        if isinstance(s, OpaqueSpec):
            what = s.type_class or s.snapshot_class or "unknown class"
            return f"{s.family} serializer ({what})" + (f": {s.reason}" if s.reason else "")
        stack.extend(s.children())
    return "not decodable"
