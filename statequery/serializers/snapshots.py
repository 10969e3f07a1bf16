"""Serializer-snapshot bytes -> :class:`~statequery.serializers.spec.SerializerSpec`.

Flink writes a state's serializers as ``TypeSerializerSnapshot``s
(``TypeSerializerSnapshotSerializationUtil.writeSerializerSnapshot``):

* top level: ``int32 2`` (the snapshot-proxy version), then a versioned snapshot;
* versioned snapshot (``TypeSerializerSnapshot.writeVersionedSnapshot``): ``UTF className``,
  ``int32 version``, then the class's payload, **with no length prefix**.

The payload readers live in a registry keyed by the snapshot class name. Lookup tries the full
name, then the name without its package (``LongSerializer$LongSerializerSnapshot``), so the 1.x
and 2.x packages of a class (``org.apache.flink.contrib.streaming.state`` →
``org.apache.flink.state.rocksdb``, ``runtime.state.ttl`` → ``runtime.state.v2.ttl``) resolve alike.

A class without a reader raises :class:`~statequery.exceptions.UnknownSerializerError` — unless its
payload is recognisably a ``CompositeTypeSerializerSnapshot`` with an empty outer payload, which
can be skipped exactly and becomes an :class:`OpaqueSpec`. Kryo, Avro and Java serializers are
parsed (so reading continues after them) into :class:`OpaqueSpec` records keeping the class.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from statequery.decoder import Decoder
from statequery.exceptions import CorruptStateError, UnknownSerializerError
from statequery.serializers.avro import AvroSchemaError
from statequery.serializers.avro import parse_schema as parse_avro_schema
from statequery.serializers.logical_types import (
    logical_type_from_java,
    read_java_object,
    read_logical_type,
)
from statequery.serializers.spec import (
    CLASSPATH_HINT,
    PROTOBUF_HINT,
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
    PojoField,
    PojoSpec,
    PrimitiveArraySpec,
    PrimitiveSpec,
    RawValueSpec,
    RowDataSpec,
    RowSpec,
    SerializerSpec,
    SqlField,
    SqlType,
    StructSpec,
    TimerSpec,
    TtlSpec,
    TupleSpec,
    WindowKeySpec,
)

__all__ = [
    "COMPOSITE_MAGIC",
    "LINKED_OPTIONAL_MAP_HEADER",
    "NESTED_SNAPSHOTS_MAGIC",
    "SNAPSHOT_PROXY_VERSION",
    "read_nested_snapshots",
    "read_top_level_snapshot",
    "read_versioned_snapshot",
    "registered_snapshot_classes",
    "simple_class_name",
]

SNAPSHOT_PROXY_VERSION = 2
COMPOSITE_MAGIC = 0x000DE704  # CompositeTypeSerializerSnapshot.MAGIC_NUMBER
NESTED_SNAPSHOTS_MAGIC = 0x001457FD  # NestedSerializersSnapshotDelegate.MAGIC_NUMBER
LINKED_OPTIONAL_MAP_HEADER = 0x4F2C69A3D70  # LinkedOptionalMapSerializer.HEADER
LEGACY_CONFIG_SNAPSHOT_VERSION = 0x7A53C4F0  # TypeSerializerConfigSnapshot.ADAPTER_VERSION
MAX_NESTING = 64

# A reader gets the decoder positioned at the payload, the full class name and the version.
SnapshotReader = Callable[[Decoder, str, int], SerializerSpec]


def simple_class_name(class_name: str) -> str:
    """The class name without its package: ``LongSerializer$LongSerializerSnapshot``."""
    return class_name.rsplit(".", 1)[-1]


# nesting depth per thread: bounds recursion on corrupt input (no RecursionError)
_depth = threading.local()


def read_top_level_snapshot(decoder: Decoder) -> SerializerSpec:
    """``TypeSerializerSnapshotSerializationUtil.readSerializerSnapshot``: int32 2 + versioned."""
    start = decoder.pos
    version = decoder.read_int()
    if version != SNAPSHOT_PROXY_VERSION:
        raise decoder.error(
            f"serializer snapshot proxy version {version}, expected {SNAPSHOT_PROXY_VERSION}", start
        )
    return read_versioned_snapshot(decoder)


def read_versioned_snapshot(decoder: Decoder) -> SerializerSpec:
    """``TypeSerializerSnapshot.readVersionedSnapshot``: class name, version, payload."""
    start = decoder.pos
    class_name = decoder.read_utf()
    if not class_name or any(c in class_name for c in " \x00/;"):
        raise decoder.error(f"not a snapshot class name: {class_name!r}", start)
    version = decoder.read_int()
    if version == LEGACY_CONFIG_SNAPSHOT_VERSION:
        raise UnknownSerializerError(
            class_name,
            f"{class_name} is a legacy TypeSerializerConfigSnapshot (Flink <= 1.16); "
            "it carries a Java-serialized serializer statequery does not read",
        )
    reader = _lookup(class_name)
    level = getattr(_depth, "level", 0)
    if level >= MAX_NESTING:
        raise decoder.error(f"serializer snapshots nested deeper than {MAX_NESTING}", start)
    _depth.level = level + 1
    try:
        if reader is None:
            return _read_unknown(decoder, class_name, version)
        return reader(decoder, class_name, version)
    finally:
        _depth.level = level


def read_nested_snapshots(decoder: Decoder) -> tuple[SerializerSpec, ...]:
    """``NestedSerializersSnapshotDelegate``: magic, version 1, n × versioned snapshot."""
    start = decoder.pos
    magic = decoder.read_int()
    if magic != NESTED_SNAPSHOTS_MAGIC:
        raise decoder.error(f"nested serializer snapshots: bad magic {magic:#x}", start)
    version = decoder.read_int()
    if version != 1:
        raise decoder.error(f"nested serializer snapshots: unknown version {version}", start + 4)
    n = decoder.check_length(decoder.read_int(), "nested snapshot count", 6)
    return tuple(read_versioned_snapshot(decoder) for _ in range(n))


# -- registry ----------------------------------------------------------------------------------

_BY_NAME: dict[str, SnapshotReader] = {}
_BY_SIMPLE_NAME: dict[str, SnapshotReader] = {}


def _register(names: str | tuple[str, ...], reader: SnapshotReader) -> None:
    for name in (names,) if isinstance(names, str) else names:
        _BY_NAME[name] = reader
        _BY_SIMPLE_NAME.setdefault(simple_class_name(name), reader)


def _lookup(class_name: str) -> SnapshotReader | None:
    return _BY_NAME.get(class_name) or _BY_SIMPLE_NAME.get(simple_class_name(class_name))


def registered_snapshot_classes() -> tuple[str, ...]:
    """Every snapshot class name with a registered reader (for messages and docs)."""
    return tuple(sorted(_BY_NAME))


_BASE = "org.apache.flink.api.common.typeutils.base."
_RUNTIME = "org.apache.flink.api.java.typeutils.runtime."
_TABLE = "org.apache.flink.table.runtime.typeutils."

# -- simple (empty payload) snapshots ----------------------------------------------------------


def _simple(factory: Callable[[str], SerializerSpec]) -> SnapshotReader:
    def read(decoder: Decoder, class_name: str, version: int) -> SerializerSpec:
        return factory(class_name)

    return read


def _prim(name: str) -> SnapshotReader:
    return _simple(lambda c: PrimitiveSpec(snapshot_class=c, name=name))


for _ser, _name in {
    "BooleanSerializer": "boolean",
    "ByteSerializer": "byte",
    "ShortSerializer": "short",
    "IntSerializer": "int",
    "LongSerializer": "long",
    "FloatSerializer": "float",
    "DoubleSerializer": "double",
    "CharSerializer": "char",
    "StringSerializer": "string",
    "VoidSerializer": "void",
    "BigIntSerializer": "bigint",
    "BigDecSerializer": "bigdec",
    "DateSerializer": "date",
    "SqlDateSerializer": "sql_date",
    "SqlTimeSerializer": "sql_time",
    "SqlTimestampSerializer": "sql_timestamp",
    "InstantSerializer": "instant",
    "LocalDateSerializer": "local_date",
    "LocalTimeSerializer": "local_time",
    "LocalDateTimeSerializer": "local_date_time",
    # org.apache.flink.types.*Value: Value.write() gives the primitive encodings
    "BooleanValueSerializer": "boolean",
    "ByteValueSerializer": "byte",
    "ShortValueSerializer": "short",
    "IntValueSerializer": "int",
    "LongValueSerializer": "long",
    "FloatValueSerializer": "float",
    "DoubleValueSerializer": "double",
    "CharValueSerializer": "char",
    "StringValueSerializer": "string",
    "NullValueSerializer": "null_value",
}.items():
    _register(f"{_BASE}{_ser}${_ser}Snapshot", _prim(_name))

_register(f"{_TABLE}StringDataSerializer$StringDataSerializerSnapshot", _prim("string_data"))
_register("org.apache.flink.table.dataview.NullSerializer$NullSerializerSnapshot", _prim("void"))

for _elem in ("Boolean", "Byte", "Char", "Double", "Float", "Int", "Long", "Short"):
    _register(
        f"{_BASE}array.{_elem}PrimitiveArraySerializer${_elem}PrimitiveArraySerializerSnapshot",
        (lambda e: _simple(lambda c: PrimitiveArraySpec(snapshot_class=c, element=e)))(
            _elem.lower()
        ),
    )
_register(
    f"{_BASE}array.StringArraySerializer$StringArraySerializerSnapshot",
    _simple(lambda c: PrimitiveArraySpec(snapshot_class=c, element="string")),
)

# PyFlink process mode (flink-python): the map and broadcast state keys of the Python operators,
# a byte[] in a ByteArrayWrapper, written as a byte[] is (int32 length + bytes); empty payload
_register(
    "org.apache.flink.streaming.api.utils.ByteArrayWrapperSerializer"
    "$ByteArrayWrapperSerializerSnapshot",
    _simple(lambda c: PrimitiveArraySpec(snapshot_class=c, element="byte")),
)


def _ns(name: str) -> SnapshotReader:
    return _simple(lambda c: NamespaceSpec(snapshot_class=c, name=name))


_register(
    (
        "org.apache.flink.runtime.state.VoidNamespaceSerializer$VoidNamespaceSerializerSnapshot",
        "org.apache.flink.queryablestate.client.VoidNamespaceSerializer$VoidNamespaceSerializerSnapshot",  # noqa: E501
    ),
    _ns("void"),
)
_register(
    (
        "org.apache.flink.streaming.api.windowing.windows.TimeWindow$Serializer$TimeWindowSerializerSnapshot",  # noqa: E501
        "org.apache.flink.table.runtime.operators.window.TimeWindow$Serializer$TimeWindowSerializerSnapshot",  # noqa: E501
    ),
    _ns("time_window"),
)
_register(
    (
        "org.apache.flink.streaming.api.windowing.windows.GlobalWindow$Serializer$GlobalWindowSerializerSnapshot",  # noqa: E501
        "org.apache.flink.table.runtime.operators.window.GlobalWindow$Serializer$GlobalWindowSerializerSnapshot",  # noqa: E501
    ),
    _ns("global_window"),
)
_register(
    "org.apache.flink.table.runtime.operators.window.CountWindow$Serializer$CountWindowSerializerSnapshot",  # noqa: E501
    _ns("count_window"),
)
_register(
    f"{_RUNTIME}Tuple0SerializerSnapshot",
    _simple(
        lambda c: TupleSpec(snapshot_class=c, class_name="org.apache.flink.api.java.tuple.Tuple0")
    ),
)
_register(
    "org.apache.flink.runtime.state.JavaSerializer$JavaSerializerSnapshot",
    _simple(
        lambda c: OpaqueSpec(
            snapshot_class=c, family="java", reason="Java serialization (JavaSerializer)"
        )
    ),
)
for _opaque, _why in {
    f"{_BASE}BitmapSerializer$BitmapSerializerSnapshot": "RoaringBitmap values are not decoded",
    f"{_BASE}VariantSerializer$VariantSerializerSnapshot": "VARIANT values are not decoded",
    "org.apache.flink.table.runtime.operators.sink.SortedLongSerializer$SortedLongSerializerSnapshot": "SortedLongSerializer values are not decoded",  # noqa: E501
}.items():
    _register(
        _opaque,
        (lambda why: _simple(lambda c: OpaqueSpec(snapshot_class=c, family="unknown", reason=why)))(
            _why
        ),
    )

# -- GenericTypeSerializerSnapshot: UTF type class ---------------------------------------------

_VALUE_TYPES = {
    "org.apache.flink.types.BooleanValue": "boolean",
    "org.apache.flink.types.ByteValue": "byte",
    "org.apache.flink.types.ShortValue": "short",
    "org.apache.flink.types.IntValue": "int",
    "org.apache.flink.types.LongValue": "long",
    "org.apache.flink.types.FloatValue": "float",
    "org.apache.flink.types.DoubleValue": "double",
    "org.apache.flink.types.CharValue": "char",
    "org.apache.flink.types.StringValue": "string",
    "org.apache.flink.types.NullValue": "null_value",
}


def _read_generic_value(decoder: Decoder, class_name: str, version: int) -> SerializerSpec:
    type_class = decoder.read_utf()
    if type_class in _VALUE_TYPES:
        return PrimitiveSpec(snapshot_class=class_name, name=_VALUE_TYPES[type_class])
    return OpaqueSpec(
        snapshot_class=class_name,
        family="unknown",
        type_class=type_class,
        reason=f"user Value type {type_class} (its write() is user code)",
    )


_register(
    (
        f"{_RUNTIME}ValueSerializer$ValueSerializerSnapshot",
        f"{_RUNTIME}CopyableValueSerializer$CopyableValueSerializerSnapshot",
    ),
    _read_generic_value,
)

# -- enums -------------------------------------------------------------------------------------


def _read_enum(decoder: Decoder, class_name: str, version: int) -> SerializerSpec:
    enum_class = decoder.read_utf()
    n = decoder.check_length(decoder.read_int(), "enum constant count", 2)
    constants = tuple(decoder.read_utf() for _ in range(n))
    return EnumSpec(snapshot_class=class_name, class_name=enum_class, constants=constants)


_register(f"{_BASE}EnumSerializer$EnumSerializerSnapshot", _read_enum)

# -- composite snapshots -----------------------------------------------------------------------

# outer payload reader: (decoder, outer version) -> outer data
OuterReader = Callable[[Decoder, int], Any]
# builder: (class name, outer data, nested specs) -> spec
Builder = Callable[[str, Any, tuple[SerializerSpec, ...]], SerializerSpec]


def _no_outer(decoder: Decoder, outer_version: int) -> Any:
    return None


def _composite(
    builder: Builder, outer: OuterReader = _no_outer, arity: int | None = None
) -> SnapshotReader:
    """A ``CompositeTypeSerializerSnapshot`` reader: magic, outer version, outer payload, nested.

    Snapshots written before the composite format (no magic) hold only the nested snapshots.
    """

    def read(decoder: Decoder, class_name: str, version: int) -> SerializerSpec:
        start = decoder.pos
        if decoder.remaining >= 4 and _peek_int(decoder) == COMPOSITE_MAGIC:
            decoder.read_int()
            outer_version = decoder.read_int()
            outer_data = outer(decoder, outer_version)
        elif decoder.remaining >= 4 and _peek_int(decoder) == NESTED_SNAPSHOTS_MAGIC:
            outer_data = outer(Decoder(b""), -1)  # legacy layout: defaults only
        else:
            raise decoder.error(f"{class_name}: expected the composite snapshot magic", start)
        nested = read_nested_snapshots(decoder)
        if arity is not None and len(nested) != arity:
            raise decoder.error(
                f"{class_name}: {len(nested)} nested serializers, expected {arity}", start
            )
        return builder(class_name, outer_data, nested)

    return read


def _peek_int(decoder: Decoder) -> int:
    b = decoder.buf
    p = decoder.pos
    return int.from_bytes(bytes(b[p : p + 4]), "big", signed=True)


_register(
    (
        f"{_BASE}ListSerializerSnapshot",
        "org.apache.flink.runtime.state.ArrayListSerializerSnapshot",
    ),
    _composite(lambda c, o, n: ListSpec(snapshot_class=c, element=n[0]), arity=1),
)
_register(
    f"{_BASE}MapSerializerSnapshot",
    _composite(lambda c, o, n: MapSpec(snapshot_class=c, key=n[0], value=n[1]), arity=2),
)
_register(
    f"{_BASE}SetSerializerSnapshot",
    _composite(
        lambda c, o, n: MapSpec(snapshot_class=c, key=n[0], value=None, is_set=True), arity=1
    ),
)
_register(
    f"{_BASE}GenericArraySerializerSnapshot",
    _composite(
        lambda c, o, n: GenericArraySpec(snapshot_class=c, component_class=o or "", element=n[0]),
        lambda d, v: d.read_utf() if v >= 0 else None,
        arity=1,
    ),
)
_register(
    f"{_RUNTIME}TupleSerializerSnapshot",
    _composite(
        lambda c, o, n: TupleSpec(snapshot_class=c, class_name=o or "", fields=n),
        lambda d, v: d.read_utf() if v >= 0 else None,
    ),
)


def _row_outer(decoder: Decoder, outer_version: int) -> bool:
    # RowSerializerSnapshot: v < 3 no RowKind, v == 3 RowKind without a flag, v >= 4 a flag
    if outer_version >= 4:
        return decoder.read_bool()
    return outer_version == 3


_register(
    f"{_RUNTIME}RowSerializer$RowSerializerSnapshot",
    _composite(
        lambda c, o, n: RowSpec(snapshot_class=c, fields=n, supports_row_kind=bool(o)), _row_outer
    ),
)
_register(
    f"{_RUNTIME}NullableSerializer$NullableSerializerSnapshot",
    _composite(
        lambda c, o, n: NullableSpec(snapshot_class=c, inner=n[0], padding=o or 0),
        lambda d, v: d.check_length(d.read_int(), "null padding", 0) if v >= 0 else 0,
        arity=1,
    ),
)
_register(
    f"{_RUNTIME}JavaEitherSerializerSnapshot",
    _composite(lambda c, o, n: EitherSpec(snapshot_class=c, left=n[0], right=n[1]), arity=2),
)
_register(
    "org.apache.flink.streaming.api.operators.TimerSerializerSnapshot",
    _composite(lambda c, o, n: TimerSpec(snapshot_class=c, key=n[0], namespace=n[1]), arity=2),
)
_register(
    (
        "org.apache.flink.runtime.state.ttl.TtlStateFactory$TtlSerializerSnapshot",
        "org.apache.flink.runtime.state.v2.ttl.TtlStateFactory$TtlSerializerSnapshot",
    ),
    _composite(lambda c, o, n: TtlSpec(snapshot_class=c, inner=n[1]), arity=2),
)


def _linked_list_outer(decoder: Decoder, outer_version: int) -> bool:
    # LinkedListSerializerSnapshot: v < 2 no null mask, v == 2 null mask without a flag, v >= 3 flag
    if outer_version >= 3:
        return decoder.read_bool()
    return outer_version == 2


_register(
    f"{_TABLE}LinkedListSerializer$LinkedListSerializerSnapshot",
    _composite(
        lambda c, o, n: LinkedListSpec(snapshot_class=c, element=n[0], has_null_mask=bool(o)),
        _linked_list_outer,
        arity=1,
    ),
)
_register(
    f"{_TABLE}WindowKeySerializer$WindowKeySerializerSnapshot",
    _composite(lambda c, o, n: WindowKeySpec(snapshot_class=c, key=n[0]), arity=1),
)
_register(
    f"{_TABLE}RawValueDataSerializer$RawValueDataSerializerSnapshot",
    _composite(lambda c, o, n: RawValueSpec(snapshot_class=c, inner=n[0]), arity=1),
)


def _external_outer(decoder: Decoder, outer_version: int) -> SqlType | None:
    if outer_version < 0:
        return None
    data_type = read_java_object(decoder, "Java-serialized DataType")
    decoder.read_bool()  # isInternalInput
    try:
        return logical_type_from_java(getattr(data_type, "logicalType", None))
    except Exception:  # the DataType only adds field names; the nested snapshot has the layout
        return None


def _external(c: str, outer: SqlType | None, nested: tuple[SerializerSpec, ...]) -> SerializerSpec:
    """``ExternalSerializer`` writes the internal serializer's bytes; its DataType names fields."""
    inner = nested[0]
    if (
        isinstance(inner, RowDataSpec)
        and outer is not None
        and outer.root in ("ROW", "STRUCTURED_TYPE")
        and len(outer.fields) == len(inner.type.fields)
    ):
        return RowDataSpec(
            snapshot_class=inner.snapshot_class,
            type=SqlType("ROW", outer.nullable, fields=outer.fields),
            field_specs=inner.field_specs,
        )
    return inner


# Serializers whose bytes are exactly their (single) nested serializer's bytes.
_transparent = _composite(lambda c, o, n: n[0], arity=1)
_register(
    f"{_TABLE}ExternalSerializer$ExternalSerializerSnapshot",
    _composite(_external, _external_outer, arity=1),
)
_register(
    (
        "org.apache.flink.api.common.typeutils.SingleThreadAccessCheckingTypeSerializer$SingleThreadAccessCheckingTypeSerializerSnapshot",  # noqa: E501
        "org.apache.flink.table.dataview.ListViewSerializerSnapshot",
        "org.apache.flink.table.dataview.MapViewSerializerSnapshot",
    ),
    _transparent,
)


def _opaque_composite(reason: str, outer: OuterReader = _no_outer) -> SnapshotReader:
    return _composite(
        lambda c, o, n: OpaqueSpec(
            snapshot_class=c, family="unknown", reason=f"{simple_class_name(c)}: {reason}"
        ),
        outer,
    )


def _flag_from_v4(decoder: Decoder, outer_version: int) -> None:
    if outer_version >= 4:
        decoder.read_bool()


for _cls, _why in {
    "org.apache.flink.table.dataview.NullAwareMapSerializerSnapshot": "null-aware map layout not decoded",  # noqa: E501
    "org.apache.flink.streaming.api.datastream.CoGroupedStreams$UnionSerializerSnapshot": "tagged union not decoded",  # noqa: E501
    "org.apache.flink.streaming.api.operators.co.IntervalJoinOperator$BufferEntrySerializerSnapshot": "interval-join buffer entries not decoded",  # noqa: E501
    "org.apache.flink.streaming.runtime.streamrecord.StreamElementSerializer$StreamElementSerializerSnapshot": "stream elements not decoded",  # noqa: E501
}.items():
    _register(_cls, _opaque_composite(_why))


# The upsert materializer's sequenced multiset (Flink 2.2+, strategy MAP): CompositeSerializers,
# i.e. their nested field serializers' bytes one after the other, no flags
_LINKED = "org.apache.flink.table.runtime.sequencedmultisetstate.linked."


def _fields_struct(class_name: str, names: tuple[str, ...]) -> Builder:
    def build(c: str, o: Any, n: tuple[SerializerSpec, ...]) -> SerializerSpec:
        if len(n) != len(names):
            return OpaqueSpec(snapshot_class=c, family="unknown",
                              reason=f"{simple_class_name(c)}: {len(n)} fields, expected "
                                     f"{len(names)}")
        return StructSpec(snapshot_class=c, class_name=class_name, names=names, fields=n)

    return build


for _cls, _names in {
    "MetaSqnInfo": ("high_sqn", "size"),
    "RowSqnInfo": ("first_sqn", "last_sqn"),
    "Node": ("row", "sqn", "prev_sqn", "next_sqn", "next_sqn_for_record", "timestamp"),
}.items():
    _register(f"{_LINKED}{_cls}Serializer${_cls}SerializerSnapshot",
              _composite(_fields_struct(_LINKED + _cls, _names)))
_register(
    "org.apache.flink.streaming.api.functions.sink.legacy.TwoPhaseCommitSinkFunction$StateSerializerSnapshot",  # noqa: E501
    _opaque_composite("two-phase-commit sink state not decoded", _flag_from_v4),
)

# -- LinkedOptionalMap (POJO and Kryo snapshots) -----------------------------------------------


def _read_optional_map(
    decoder: Decoder,
    what: str,
    key_reader: Callable[[Decoder], Any] | None,
    value_reader: Callable[[Decoder], Any] | None,
) -> list[tuple[str, Any, Any]]:
    """``LinkedOptionalMapSerializer.readOptionalMap``: entries of (name, key|None, value|None).

    Key and value blobs are length-framed: each is parsed inside its own frame (a reader of None
    skips it), so an unreadable value does not lose the framing.
    """
    start = decoder.pos
    header = decoder.read_long()
    if header != LINKED_OPTIONAL_MAP_HEADER:
        raise decoder.error(f"{what}: bad LinkedOptionalMap header {header:#x}", start)
    n = decoder.check_length(decoder.read_int(), f"{what} entry count", 4)
    out: list[tuple[str, Any, Any]] = []
    for _ in range(n):
        name = decoder.read_utf()
        key = value = None
        if decoder.read_bool():
            blob = decoder.sub(decoder.check_length(decoder.read_int(), f"{what} key length"))
            key = key_reader(blob) if key_reader else None
        if decoder.read_bool():
            blob = decoder.sub(decoder.check_length(decoder.read_int(), f"{what} value length"))
            value = (
                _framed_snapshot(blob)
                if value_reader is _framed_snapshot
                else (value_reader(blob) if value_reader else None)
            )
        out.append((name, key, value))
    return out


def _framed_snapshot(blob: Decoder) -> SerializerSpec:
    """A versioned snapshot inside a length frame: an unknown class stays contained."""
    try:
        return read_versioned_snapshot(blob)
    except UnknownSerializerError as e:
        return OpaqueSpec(snapshot_class=e.class_name, family="unknown", reason=str(e))


def _read_pojo(decoder: Decoder, class_name: str, version: int) -> SerializerSpec:
    pojo_class = decoder.read_utf()

    def field_key(blob: Decoder) -> str:
        return blob.read_utf()  # PojoFieldUtils.writeField: declaring class, then field name

    fields_raw = _read_optional_map(decoder, "POJO fields", field_key, _framed_snapshot)
    registered = _read_optional_map(decoder, "POJO registered subclasses", None, _framed_snapshot)
    nonregistered = _read_optional_map(decoder, "POJO subclasses", None, _framed_snapshot)
    fields = tuple(PojoField(name, declaring or "", spec) for name, declaring, spec in fields_raw)
    return PojoSpec(
        snapshot_class=class_name,
        class_name=pojo_class,
        fields=fields,
        registered_subclasses=tuple((n, s) for n, _, s in registered),
        nonregistered_subclasses=tuple((n, s) for n, _, s in nonregistered),
    )


_register(f"{_RUNTIME}PojoSerializerSnapshot", _read_pojo)


def _kryo_registration(blob: Decoder) -> bool:
    """``KryoRegistrationSerializationProxy.write``: the class name, then the serializer
    definition's ordinal (0 UNSPECIFIED: Kryo's default serializer; 1 CLASS, 2 INSTANCE: the
    job's own). True when the job's own."""
    try:
        blob.read_utf()
        return bool(blob.read_int() != 0)
    except CorruptStateError:
        return True


def _read_kryo(decoder: Decoder, class_name: str, version: int) -> SerializerSpec:
    type_class = decoder.read_utf()
    registrations = _read_optional_map(decoder, "Kryo registrations", None, _kryo_registration)
    defaults = _read_optional_map(decoder, "Kryo default serializers", None, None)
    default_classes = _read_optional_map(decoder, "Kryo default serializer classes", None, None)
    own = any(n == type_class and (v is None or bool(v)) for n, _, v in registrations)
    reason = f"Kryo-serialized {type_class}: pass {CLASSPATH_HINT}"
    if own:  # its own Kryo serializer: the jar's fields do not explain it
        reason = (f"Kryo-serialized {type_class} with its own Kryo serializer: if a Protobuf "
                  f"message (chill-protobuf), pass {PROTOBUF_HINT}")
    return OpaqueSpec(
        snapshot_class=class_name,
        family="kryo",
        type_class=type_class,
        reason=reason,
        # a registration whose value is unreadable counts as the job's own serializer
        kryo_registrations=tuple((n, v is None or bool(v)) for n, _, v in registrations),
        kryo_default_serializers=tuple(n for n, _, _ in (*defaults, *default_classes)),
    )


_register(f"{_RUNTIME}kryo.KryoSerializerSnapshot", _read_kryo)


def _read_avro(decoder: Decoder, class_name: str, version: int) -> SerializerSpec:
    # AvroSerializerSnapshot: v1 schema; v2 runtime class and schema (the order differed in early
    # releases: the JSON schema is the string that starts with '{', '"' or '[')
    first = decoder.read_utf()
    second = decoder.read_utf() if version >= 2 else None
    schema, type_class = first, second
    if second is not None and not first.lstrip().startswith(("{", '"', "[")):
        schema, type_class = second, first
    try:
        parse_avro_schema(schema)
    except AvroSchemaError as e:
        return OpaqueSpec(
            snapshot_class=class_name,
            family="avro",
            type_class=type_class,
            avro_schema=schema,
            reason=f"Avro values with a schema statequery cannot decode: {e}",
        )
    return AvroSpec(snapshot_class=class_name, schema=schema, type_class=type_class)


_register("org.apache.flink.formats.avro.typeutils.AvroSerializerSnapshot", _read_avro)

# -- Flink SQL (table runtime) -----------------------------------------------------------------


def _row_type(types: tuple[SqlType, ...]) -> SqlType:
    return SqlType("ROW", fields=tuple(SqlField(f"f{i}", t) for i, t in enumerate(types)))


def _read_row_data(decoder: Decoder, class_name: str, version: int) -> SerializerSpec:
    n = decoder.check_length(decoder.read_int(), "RowData field count", 4)
    types = tuple(read_logical_type(decoder) for _ in range(n))
    field_specs: tuple[SerializerSpec, ...] = ()
    if version >= 3:
        # the field serializers: they read RAW fields (e.g. NullSerializer placeholders of
        # state-backed data views) and the fields of nested rows
        field_specs = read_nested_snapshots(decoder)
        if len(field_specs) != n:
            raise decoder.error(f"{class_name}: {len(field_specs)} field serializers for {n} "
                                "fields")
    return RowDataSpec(snapshot_class=class_name, type=_row_type(types), field_specs=field_specs)


_register(f"{_TABLE}RowDataSerializer$RowDataSerializerSnapshot", _read_row_data)


def _read_binary_row(decoder: Decoder, class_name: str, version: int) -> SerializerSpec:
    n = decoder.read_int()
    return OpaqueSpec(
        snapshot_class=class_name,
        family="unknown",
        type_class="BinaryRowData",
        reason=f"BinaryRowDataSerializer keeps no field types ({n} fields)",
    )


_register(f"{_TABLE}BinaryRowDataSerializer$BinaryRowDataSerializerSnapshot", _read_binary_row)


def _read_decimal(decoder: Decoder, class_name: str, version: int) -> SerializerSpec:
    precision = decoder.read_int()
    scale = decoder.read_int()
    return PrimitiveSpec(
        snapshot_class=class_name, name="decimal_data", precision=precision, scale=scale
    )


_register(f"{_TABLE}DecimalDataSerializer$DecimalSerializerSnapshot", _read_decimal)


def _read_timestamp(decoder: Decoder, class_name: str, version: int) -> SerializerSpec:
    return PrimitiveSpec(
        snapshot_class=class_name, name="timestamp_data", precision=decoder.read_int()
    )


_register(f"{_TABLE}TimestampDataSerializer$TimestampDataSerializerSnapshot", _read_timestamp)


def _read_array_data(decoder: Decoder, class_name: str, version: int) -> SerializerSpec:
    element = read_logical_type(decoder)
    read_java_object(decoder, "Java-serialized element TypeSerializer")
    return ArrayDataSpec(snapshot_class=class_name, element=element)


_register(f"{_TABLE}ArrayDataSerializer$ArrayDataSerializerSnapshot", _read_array_data)


def _read_map_data(decoder: Decoder, class_name: str, version: int) -> SerializerSpec:
    key = read_logical_type(decoder)
    value = read_logical_type(decoder)
    read_java_object(decoder, "Java-serialized key TypeSerializer")
    read_java_object(decoder, "Java-serialized value TypeSerializer")
    return MapDataSpec(snapshot_class=class_name, key=key, value=value)


_register(f"{_TABLE}MapDataSerializer$MapDataSerializerSnapshot", _read_map_data)


def _read_sorted_map(decoder: Decoder, class_name: str, version: int) -> SerializerSpec:
    read_java_object(decoder, "Java-serialized comparator")
    nested = read_nested_snapshots(decoder)
    if len(nested) != 2:
        raise decoder.error(f"{class_name}: {len(nested)} nested serializers, expected 2")
    # SortedMapSerializer (AbstractMapSerializer) writes the MapSerializer layout
    return MapSpec(snapshot_class=class_name, key=nested[0], value=nested[1])


_register(f"{_TABLE}SortedMapSerializerSnapshot", _read_sorted_map)


def _read_ttl_aware(decoder: Decoder, class_name: str, version: int) -> SerializerSpec:
    decoder.read_bool()  # ttlEnabled; the wrapped snapshot says whether values are TtlValues
    return read_versioned_snapshot(decoder)


_register("org.apache.flink.runtime.state.ttl.TtlAwareSerializerSnapshot", _read_ttl_aware)


def _read_row_data_key(decoder: Decoder, class_name: str, version: int) -> SerializerSpec:
    # RowDataKeySerializerSnapshot.store: int32 length + the Java-serialized generated record
    # equaliser, the same for the hash function, then the key's own versioned snapshot
    for what in ("generated record equaliser", "generated hash function"):
        p = decoder.pos
        if decoder.remaining >= 2 and bytes(decoder.buf[p:p + 2]) == b"\xac\xed":
            read_java_object(decoder, what)  # no length prefix
            continue
        start = decoder.pos
        blob = decoder.sub(decoder.check_length(decoder.read_int(), f"{what} length"))
        if bytes(blob.buf[blob.pos:blob.pos + 4]) != b"\xac\xed\x00\x05":
            raise decoder.error(f"{class_name}: expected a Java-serialized {what}", start)
    return read_versioned_snapshot(decoder)


_register(
    "org.apache.flink.table.runtime.sequencedmultisetstate.linked.RowDataKeySerializerSnapshot",
    _read_row_data_key,
)

# -- Flink CEP (MATCH_RECOGNIZE and the DataStream CEP library) -------------------------------
#
# flink-cep's serializers write fixed layouts (docs/decoding.md, "MATCH_RECOGNIZE"):
#   EventId            int32 id, int64 timestamp
#   NodeId             byte 1 (0: null), EventId, StringValue page (pattern state) name
#   DeweyNumber        int32 n, n x int32
#   SharedBufferEdge   NodeId target, DeweyNumber version
#   SharedBufferNode   int32 n, n x (int32 ref count, SharedBufferEdge)   (SnapshotV2)
#   Lockable<E>        int32 ref count, E
#   NFAState           partial matches, completed matches: each int32 n, n x ComputationState
#   ComputationState   StringValue state name, NodeId previous entry, DeweyNumber version,
#                      int64 start timestamp, [int64 previous timestamp: outer version >= 2 and
#                      its flag], byte 1 + EventId start event (0: none)

_CEP = "org.apache.flink.cep.nfa."
_CEP_BUFFER = _CEP + "sharedbuffer."
_INT = PrimitiveSpec(snapshot_class=f"{_BASE}IntSerializer$IntSerializerSnapshot", name="int")
_LONG = PrimitiveSpec(snapshot_class=f"{_BASE}LongSerializer$LongSerializerSnapshot", name="long")
_STRING_VALUE = PrimitiveSpec(
    snapshot_class=f"{_BASE}StringSerializer$StringSerializerSnapshot", name="string"
)


def _event_id(c: str) -> SerializerSpec:
    return StructSpec(
        snapshot_class=c, class_name=_CEP_BUFFER + "EventId", names=("id", "timestamp"),
        fields=(_INT, _LONG),
    )


def _dewey(c: str) -> SerializerSpec:
    return PrimitiveArraySpec(snapshot_class=c, element="int")


def _node_id(c: str, o: Any, n: tuple[SerializerSpec, ...]) -> SerializerSpec:
    inner = StructSpec(
        snapshot_class=c, class_name=_CEP_BUFFER + "NodeId", names=("event_id", "page_name"),
        fields=(n[0], _STRING_VALUE),
    )
    return OptionalSpec(snapshot_class=c, inner=inner)


def _edge(c: str, o: Any, n: tuple[SerializerSpec, ...]) -> SerializerSpec:
    return StructSpec(
        snapshot_class=c, class_name=_CEP_BUFFER + "SharedBufferEdge",
        names=("target", "version"), fields=n,
    )


def _buffer_node(c: str, o: Any, n: tuple[SerializerSpec, ...]) -> SerializerSpec:
    edge = n[0]
    # each edge is written as a Lockable: its reference count first, then the edge
    if isinstance(edge, StructSpec):
        element = StructSpec(
            snapshot_class=edge.snapshot_class, class_name=edge.class_name,
            names=("ref_count", *edge.names), fields=(_INT, *edge.fields),
        )
    else:
        element = StructSpec(
            snapshot_class=c, class_name=_CEP_BUFFER + "Lockable",
            names=("ref_count", "edge"), fields=(_INT, edge),
        )
    return StructSpec(
        snapshot_class=c, class_name=_CEP_BUFFER + "SharedBufferNode", names=("edges",),
        fields=(ListSpec(snapshot_class=c, element=element),),
    )


def _lockable(c: str, o: Any, n: tuple[SerializerSpec, ...]) -> SerializerSpec:
    inner = n[0]
    if isinstance(inner, StructSpec) and inner.class_name == _CEP_BUFFER + "SharedBufferNode":
        # a buffer node: {ref_count, edges}
        return StructSpec(
            snapshot_class=c, class_name=inner.class_name, names=("ref_count", *inner.names),
            fields=(_INT, *inner.fields),
        )
    return StructSpec(
        snapshot_class=c, class_name=_CEP_BUFFER + "Lockable", names=("ref_count", "element"),
        fields=(_INT, inner),
    )


def _nfa_outer(decoder: Decoder, outer_version: int) -> bool:
    # NFAStateSerializerSnapshot: from outer version 2 a flag says whether every computation
    # state carries its previous timestamp
    return decoder.read_bool() if outer_version >= 2 else False


def _nfa_state(c: str, o: Any, n: tuple[SerializerSpec, ...]) -> SerializerSpec:
    version, node_id, event_id = n
    names: tuple[str, ...] = ("state_name", "previous_entry", "version", "start_timestamp")
    fields: tuple[SerializerSpec, ...] = (_STRING_VALUE, node_id, version, _LONG)
    if o:
        names += ("previous_timestamp",)
        fields += (_LONG,)
    names += ("start_event",)
    fields += (OptionalSpec(snapshot_class=c, inner=event_id),)
    computation = StructSpec(
        snapshot_class=c, class_name=_CEP + "ComputationState", names=names, fields=fields
    )
    states = ListSpec(snapshot_class=c, element=computation)
    return StructSpec(
        snapshot_class=c, class_name=_CEP + "NFAState",
        names=("partial_matches", "completed_matches"), fields=(states, states),
    )


_register(
    _CEP_BUFFER + "EventId$EventIdSerializer$EventIdSerializerSnapshot", _simple(_event_id)
)
_register(_CEP + "DeweyNumber$DeweyNumberSerializer$DeweyNumberSerializerSnapshot", _simple(_dewey))
_register(
    _CEP_BUFFER + "NodeId$NodeIdSerializer$NodeIdSerializerSnapshot",
    _composite(_node_id, arity=1),
)
_register(
    _CEP_BUFFER + "SharedBufferEdge$SharedBufferEdgeSerializer$SharedBufferEdgeSerializerSnapshot",
    _composite(_edge, arity=2),
)
_register(
    _CEP_BUFFER + "SharedBufferNodeSerializerSnapshotV2", _composite(_buffer_node, arity=1)
)
_register(_CEP_BUFFER + "LockableTypeSerializerSnapshot", _composite(_lockable, arity=1))
_register(_CEP + "NFAStateSerializerSnapshot", _composite(_nfa_state, _nfa_outer, arity=3))

# -- unknown classes ---------------------------------------------------------------------------


def _read_unknown(decoder: Decoder, class_name: str, version: int) -> SerializerSpec:
    """An unregistered class: skippable only as a composite snapshot with an empty outer payload."""
    p = decoder.pos
    if decoder.remaining >= 12 and _peek_int(decoder) == COMPOSITE_MAGIC:
        probe = Decoder(decoder.buf, p + 8, decoder.end, decoder.source, decoder.base_offset)
        if _peek_int(probe) == NESTED_SNAPSHOTS_MAGIC:
            try:
                nested = read_nested_snapshots(probe)
            except (CorruptStateError, UnknownSerializerError):
                pass
            else:
                decoder.pos = probe.pos
                inner = ", ".join(s.display for s in nested)
                return OpaqueSpec(
                    snapshot_class=class_name,
                    family="unknown",
                    reason=f"unknown composite serializer snapshot {class_name} (nested: {inner})",
                )
    raise UnknownSerializerError(
        class_name,
        f"unknown serializer snapshot class {class_name} (version {version}) at byte "
        f"{decoder.offset} of {decoder.source}; its payload is not length-prefixed",
    )
