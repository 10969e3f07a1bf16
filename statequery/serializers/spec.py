"""Resolved serializers: what wrote a state's bytes, and the logical type those bytes carry.

A Flink serializer snapshot (``TypeSerializerSnapshot``) is parsed once per state into a tree of
these frozen records (see :mod:`statequery.serializers.snapshots`). The tree is the single input of
everything downstream: Arrow types (:mod:`statequery.arrow`), value readers
(:mod:`statequery.serializers.readers`), the StateMeta snapshot (msgpack, via :func:`to_dict`) and
``inspect``. Every record keeps the Flink snapshot class it came from.

SQL types inside ``RowData`` are described by :class:`SqlType` (decoded from Flink's
Java-serialized ``LogicalType``), because a ``BinaryRowData`` is laid out by logical type, not by
nested serializers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

__all__ = [
    "CLASSPATH_HINT",
    "PROTOBUF_HINT",
    "SPEC_TYPES",
    "ArrayDataSpec",
    "AvroSpec",
    "EitherSpec",
    "EnumSpec",
    "GenericArraySpec",
    "LinkedListSpec",
    "ListSpec",
    "MapDataSpec",
    "MapSpec",
    "NamespaceSpec",
    "NullableSpec",
    "OpaqueSpec",
    "OptionalSpec",
    "PojoField",
    "PojoSpec",
    "PrimitiveArraySpec",
    "PrimitiveSpec",
    "RawValueSpec",
    "ROW_KINDS",
    "ROW_KIND_STATES",
    "RowDataSpec",
    "with_row_kinds",
    "RowSpec",
    "SerializerSpec",
    "SqlField",
    "SqlType",
    "StructSpec",
    "TimerSpec",
    "TtlSpec",
    "TupleSpec",
    "WindowKeySpec",
    "from_dict",
    "to_dict",
]


@dataclass(frozen=True)
class SqlType:
    """A Flink SQL ``LogicalType``.

    ``root`` is the ``LogicalTypeRoot`` name: BOOLEAN, TINYINT, SMALLINT, INTEGER, BIGINT, FLOAT,
    DOUBLE, DECIMAL, CHAR, VARCHAR, BINARY, VARBINARY, DATE, TIME_WITHOUT_TIME_ZONE,
    TIMESTAMP_WITHOUT_TIME_ZONE, TIMESTAMP_WITH_LOCAL_TIME_ZONE, TIMESTAMP_WITH_TIME_ZONE,
    INTERVAL_YEAR_MONTH, INTERVAL_DAY_TIME, ARRAY, MULTISET, MAP, ROW, STRUCTURED_TYPE, RAW, NULL,
    SYMBOL, DISTINCT_TYPE, VARIANT.
    ``element`` is the ARRAY/MULTISET element, ``key``/``value`` the MAP types, ``fields`` the ROW
    or STRUCTURED_TYPE fields. ``class_name`` keeps the RAW/STRUCTURED class when known.
    """

    root: str
    nullable: bool = True
    length: int | None = None
    precision: int | None = None
    scale: int | None = None
    element: SqlType | None = None
    key: SqlType | None = None
    value: SqlType | None = None
    fields: tuple[SqlField, ...] = ()
    class_name: str | None = None

    def __str__(self) -> str:
        return sql_type_string(self)


@dataclass(frozen=True)
class SqlField:
    name: str
    type: SqlType
    description: str | None = None


def sql_type_string(t: SqlType) -> str:
    """SQL-like text of a type, e.g. ``DECIMAL(10, 2) NOT NULL`` or ``ROW<word STRING>``."""
    r = t.root
    if r in ("CHAR", "VARCHAR", "BINARY", "VARBINARY"):
        if r == "VARCHAR" and t.length == 2147483647:
            s = "STRING"
        elif r == "VARBINARY" and t.length == 2147483647:
            s = "BYTES"
        else:
            s = f"{r}({t.length})"
    elif r == "DECIMAL":
        s = f"DECIMAL({t.precision}, {t.scale})"
    elif r == "TIMESTAMP_WITHOUT_TIME_ZONE":
        s = f"TIMESTAMP({t.precision})"
    elif r == "TIMESTAMP_WITH_LOCAL_TIME_ZONE":
        s = f"TIMESTAMP_LTZ({t.precision})"
    elif r == "TIMESTAMP_WITH_TIME_ZONE":
        s = f"TIMESTAMP({t.precision}) WITH TIME ZONE"
    elif r == "TIME_WITHOUT_TIME_ZONE":
        s = f"TIME({t.precision})"
    elif r in ("ARRAY", "MULTISET"):
        s = f"{r}<{t.element}>"
    elif r == "MAP":
        s = f"MAP<{t.key}, {t.value}>"
    elif r in ("ROW", "STRUCTURED_TYPE"):
        s = "ROW<" + ", ".join(f"{f.name} {f.type}" for f in t.fields) + ">"
    elif r == "RAW":
        s = f"RAW({t.class_name or '?'})"
    else:
        s = r
    return s if t.nullable else s + " NOT NULL"


@dataclass(frozen=True)
class SerializerSpec:
    """Base of all resolved serializers. ``snapshot_class`` is Flink's snapshot class name."""

    kind: ClassVar[str] = "abstract"
    snapshot_class: str = ""

    @property
    def display(self) -> str:
        """A short human-readable type, as ``inspect`` prints it."""
        return self.kind

    @property
    def decodable(self) -> bool:
        """False when some part of the value can only come back as raw bytes."""
        return all(child.decodable for child in self.children())

    def children(self) -> tuple[SerializerSpec, ...]:
        out: list[SerializerSpec] = []
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, SerializerSpec):
                out.append(v)
            elif isinstance(v, tuple):
                for item in v:
                    if isinstance(item, SerializerSpec):
                        out.append(item)
                    elif isinstance(item, PojoField) and item.spec is not None:
                        out.append(item.spec)
        return tuple(out)

    @property
    def fixed_length(self) -> int | None:
        """``TypeSerializer.getLength()``: the byte length when fixed, else None (variable)."""
        return None


# name -> (fixed length or None); names follow Flink's serializer classes
PRIMITIVE_LENGTHS: dict[str, int | None] = {
    "boolean": 1,
    "byte": 1,
    "short": 2,
    "int": 4,
    "long": 8,
    "float": 4,
    "double": 8,
    "char": 2,
    "string": None,  # StringSerializer (StringValue encoding)
    "void": 1,  # VoidSerializer
    "bigint": None,  # BigIntSerializer
    "bigdec": None,  # BigDecSerializer
    "date": 8,  # DateSerializer (java.util.Date)
    "sql_date": 8,
    "sql_time": 8,
    "sql_timestamp": 12,
    "instant": 12,
    "local_date": 6,
    "local_time": 7,
    "local_date_time": 13,
    "string_data": None,  # table StringDataSerializer: int32 len + UTF-8
    "decimal_data": None,  # DecimalDataSerializer; see precision/scale
    "timestamp_data": None,  # TimestampDataSerializer; see precision
    "boolean_value": 1,  # types.BooleanValue etc. (ValueSerializer family, primitive payloads)
    "null_value": 0,
}


@dataclass(frozen=True)
class PrimitiveSpec(SerializerSpec):
    """A scalar serializer. ``name`` is a key of :data:`PRIMITIVE_LENGTHS`.

    ``precision``/``scale`` are set for ``decimal_data`` and ``timestamp_data``.
    """

    kind: ClassVar[str] = "primitive"
    name: str = "long"
    precision: int | None = None
    scale: int | None = None

    @property
    def display(self) -> str:
        if self.name == "decimal_data":
            return f"DECIMAL({self.precision}, {self.scale})"
        if self.name == "timestamp_data":
            return f"TIMESTAMP({self.precision})"
        return self.name.upper() if self.name in ("string", "long", "int") else self.name

    @property
    def fixed_length(self) -> int | None:
        if self.name == "decimal_data" and self.precision is not None:
            return 8 if self.precision <= 18 else None
        if self.name == "timestamp_data" and self.precision is not None:
            return 8 if self.precision <= 3 else 12
        return PRIMITIVE_LENGTHS.get(self.name)


@dataclass(frozen=True)
class PrimitiveArraySpec(SerializerSpec):
    """``{Byte,Int,Long,...}PrimitiveArraySerializer`` and ``StringArraySerializer``.

    Layout: int32 n, then n elements.
    """

    kind: ClassVar[str] = "primitive_array"
    element: str = "byte"  # a PRIMITIVE_LENGTHS name

    @property
    def display(self) -> str:
        return "bytes" if self.element == "byte" else f"{self.element}[]"


@dataclass(frozen=True)
class NamespaceSpec(SerializerSpec):
    """Namespaces of built-in operators: ``void`` (VoidNamespace, 1 byte), ``time_window``
    (start, end), ``global_window`` (1 byte), ``count_window`` (table, int64 id)."""

    kind: ClassVar[str] = "namespace"
    name: str = "void"

    @property
    def display(self) -> str:
        return {
            "void": "VoidNamespace",
            "time_window": "TimeWindow",
            "global_window": "GlobalWindow",
            "count_window": "CountWindow",
        }.get(self.name, self.name)

    @property
    def fixed_length(self) -> int | None:
        return {"void": 0, "time_window": 16, "global_window": 1, "count_window": 8}.get(self.name)


@dataclass(frozen=True)
class EnumSpec(SerializerSpec):
    kind: ClassVar[str] = "enum"
    class_name: str = ""
    constants: tuple[str, ...] = ()

    @property
    def display(self) -> str:
        return f"enum {self.class_name.rsplit('.', 1)[-1]}"

    @property
    def fixed_length(self) -> int | None:
        return 4


@dataclass(frozen=True)
class TupleSpec(SerializerSpec):
    """Flink ``Tuple0..Tuple25``: fields f0..fn concatenated, no null flags."""

    kind: ClassVar[str] = "tuple"
    class_name: str = ""
    fields: tuple[SerializerSpec, ...] = ()

    @property
    def display(self) -> str:
        return f"Tuple{len(self.fields)}<" + ", ".join(f.display for f in self.fields) + ">"


@dataclass(frozen=True)
class RowSpec(SerializerSpec):
    """``org.apache.flink.types.Row`` (``RowSerializer``): null mask (+2 RowKind bits), fields."""

    kind: ClassVar[str] = "row"
    fields: tuple[SerializerSpec, ...] = ()
    names: tuple[str, ...] = ()  # empty: f0..fn
    supports_row_kind: bool = True

    @property
    def field_names(self) -> tuple[str, ...]:
        """``names``, or ``f0..fn`` when none are recorded (one per field)."""
        return self.names or tuple(f"f{i}" for i in range(len(self.fields)))

    @property
    def display(self) -> str:
        pairs = zip(self.field_names, self.fields, strict=True)
        return "Row<" + ", ".join(f"{n} {f.display}" for n, f in pairs) + ">"


@dataclass(frozen=True)
class PojoField:
    name: str
    declaring_class: str
    #: None: the field no longer exists in the class (skipped on restore).
    spec: SerializerSpec | None


@dataclass(frozen=True)
class PojoSpec(SerializerSpec):
    """``PojoSerializer``: flags byte, then per field (in snapshot order) a null flag and the value.

    ``registered_subclasses``/``nonregistered_subclasses`` are kept by class name; values written
    as subclasses cannot be decoded (they come back raw).
    """

    kind: ClassVar[str] = "pojo"
    class_name: str = ""
    fields: tuple[PojoField, ...] = ()
    registered_subclasses: tuple[tuple[str, SerializerSpec | None], ...] = ()
    nonregistered_subclasses: tuple[tuple[str, SerializerSpec | None], ...] = ()

    @property
    def display(self) -> str:
        return self.class_name.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class ListSpec(SerializerSpec):
    """``ListSerializer``/``ArrayListSerializer``: int32 size + elements.

    As a keyed ListState's ``VALUE_SERIALIZER`` the stored bytes are the elements joined by ``,``
    instead (canonical/RocksDB) — the state kind decides, not this record.
    """

    kind: ClassVar[str] = "list"
    element: SerializerSpec = field(default_factory=lambda: OpaqueSpec())

    @property
    def display(self) -> str:
        return f"List<{self.element.display}>"


@dataclass(frozen=True)
class MapSpec(SerializerSpec):
    """``MapSerializer``: int32 size, per entry key, null flag, value.

    Also ``SetSerializer`` (value None).
    """

    kind: ClassVar[str] = "map"
    key: SerializerSpec = field(default_factory=lambda: OpaqueSpec())
    value: SerializerSpec | None = None
    is_set: bool = False

    @property
    def display(self) -> str:
        if self.is_set or self.value is None:
            return f"Set<{self.key.display}>"
        return f"Map<{self.key.display}, {self.value.display}>"


@dataclass(frozen=True)
class GenericArraySpec(SerializerSpec):
    """``GenericArraySerializer``: int32 n, per element a presence flag and the element."""

    kind: ClassVar[str] = "generic_array"
    component_class: str = ""
    element: SerializerSpec = field(default_factory=lambda: OpaqueSpec())

    @property
    def display(self) -> str:
        return f"{self.element.display}[]"


@dataclass(frozen=True)
class NullableSpec(SerializerSpec):
    """``NullableSerializer``: bool isNull, then padding (if null) or the inner value."""

    kind: ClassVar[str] = "nullable"
    inner: SerializerSpec = field(default_factory=lambda: OpaqueSpec())
    padding: int = 0

    @property
    def display(self) -> str:
        return f"Nullable<{self.inner.display}>"


@dataclass(frozen=True)
class EitherSpec(SerializerSpec):
    kind: ClassVar[str] = "either"
    left: SerializerSpec = field(default_factory=lambda: OpaqueSpec())
    right: SerializerSpec = field(default_factory=lambda: OpaqueSpec())

    @property
    def display(self) -> str:
        return f"Either<{self.left.display}, {self.right.display}>"


@dataclass(frozen=True)
class TtlSpec(SerializerSpec):
    """``TtlStateFactory$TtlSerializer``: int64 last-access timestamp, then the user value."""

    kind: ClassVar[str] = "ttl"
    inner: SerializerSpec = field(default_factory=lambda: OpaqueSpec())

    @property
    def display(self) -> str:
        return f"Ttl<{self.inner.display}>"


@dataclass(frozen=True)
class TimerSpec(SerializerSpec):
    """``TimerSerializer``: int64 timestamp (sign bit flipped), key bytes, namespace bytes."""

    kind: ClassVar[str] = "timer"
    key: SerializerSpec = field(default_factory=lambda: OpaqueSpec())
    namespace: SerializerSpec = field(default_factory=lambda: NamespaceSpec())

    @property
    def display(self) -> str:
        return f"Timer<{self.key.display}, {self.namespace.display}>"


@dataclass(frozen=True)
class RowDataSpec(SerializerSpec):
    """Flink SQL ``RowDataSerializer``/``BinaryRowDataSerializer``: int32 size + BinaryRowData.

    ``type`` is a ROW :class:`SqlType` (field names when the snapshot has them, else f0..fn).
    """

    kind: ClassVar[str] = "row_data"
    type: SqlType = field(default_factory=lambda: SqlType("ROW"))
    #: The field serializers the snapshot stores (one per field; empty when the snapshot predates
    #: them). They decide how ``RAW`` fields (and the fields of nested rows) are read; the logical
    #: type stays the schema.
    field_specs: tuple[SerializerSpec, ...] = ()
    #: The row's ``RowKind`` (byte 0 of the BinaryRowData header) is shown as a leading
    #: ``row_kind`` field (``+I``, ``-U``, ``+U``, ``-D``): set for the rows SQL operators keep
    #: with their kind (:data:`ROW_KIND_STATES`).
    row_kind: bool = False
    #: Values computed from the row's fields, shown after them (an accumulator named from a
    #: compiled plan: the aggregate's current value beside its fields): ``(name, function,
    #: sum field index, count field index, result type root)``, function ``avg`` (sum / count,
    #: integer division for integral results) or ``sum`` (the sum, null while the count is 0).
    derived: tuple[tuple[str, str, int, int, str], ...] = ()

    @property
    def display(self) -> str:
        return str(self.type)

    @property
    def decodable(self) -> bool:
        # A RAW field whose serializer is unknown stays raw bytes inside the row (with a reason
        # in its Arrow field metadata); the row itself is always decodable.
        return True

    def field_spec(self, index: int) -> SerializerSpec | None:
        """The stored serializer of field ``index``, or None when the snapshot has none."""
        if len(self.field_specs) == len(self.type.fields):
            return self.field_specs[index]
        return None


@dataclass(frozen=True)
class ArrayDataSpec(SerializerSpec):
    """``ArrayDataSerializer``: int32 len + BinaryArrayData of ``element`` type."""

    kind: ClassVar[str] = "array_data"
    element: SqlType = field(default_factory=lambda: SqlType("NULL"))

    @property
    def display(self) -> str:
        return f"ARRAY<{self.element}>"


@dataclass(frozen=True)
class MapDataSpec(SerializerSpec):
    """``MapDataSerializer``: int32 len + BinaryMapData (also MULTISET: value INT counts)."""

    kind: ClassVar[str] = "map_data"
    key: SqlType = field(default_factory=lambda: SqlType("NULL"))
    value: SqlType = field(default_factory=lambda: SqlType("NULL"))

    @property
    def display(self) -> str:
        return f"MAP<{self.key}, {self.value}>"


@dataclass(frozen=True)
class RawValueSpec(SerializerSpec):
    """``RawValueDataSerializer``: int32 len + bytes written by ``inner``."""

    kind: ClassVar[str] = "raw_value"
    inner: SerializerSpec = field(default_factory=lambda: OpaqueSpec())

    @property
    def display(self) -> str:
        return f"RAW<{self.inner.display}>"


@dataclass(frozen=True)
class LinkedListSpec(SerializerSpec):
    """Table ``LinkedListSerializer`` (ListView state): int32 size, [null mask], elements."""

    kind: ClassVar[str] = "linked_list"
    element: SerializerSpec = field(default_factory=lambda: OpaqueSpec())
    has_null_mask: bool = True

    @property
    def display(self) -> str:
        return f"List<{self.element.display}>"


@dataclass(frozen=True)
class WindowKeySpec(SerializerSpec):
    """Table ``WindowKeySerializer``: int64 window, then the key."""

    kind: ClassVar[str] = "window_key"
    key: SerializerSpec = field(default_factory=lambda: OpaqueSpec())

    @property
    def display(self) -> str:
        return f"WindowKey<{self.key.display}>"


@dataclass(frozen=True)
class StructSpec(SerializerSpec):
    """Named fields concatenated with no null flags, for serializers whose layout is fixed by
    their class rather than by a generic rule (Flink CEP's ``EventId``, ``NodeId``,
    ``SharedBufferEdge``, ``Lockable``, ``NFAState``, ``ComputationState``...).

    ``class_name`` is the Java class of the values; ``names`` one per field.
    """

    kind: ClassVar[str] = "struct"
    class_name: str = ""
    names: tuple[str, ...] = ()
    fields: tuple[SerializerSpec, ...] = ()

    @property
    def display(self) -> str:
        return self.class_name.rsplit(".", 1)[-1] or "struct"

    @property
    def fixed_length(self) -> int | None:
        total = 0
        for f in self.fields:
            n = f.fixed_length
            if n is None:
                return None
            total += n
        return total


@dataclass(frozen=True)
class OptionalSpec(SerializerSpec):
    """A presence byte (``1``: a value follows, ``0``: null), then the value: CEP's
    ``NodeIdSerializer`` and the start event of a ``ComputationState``. (``NullableSpec`` is the
    opposite flag, ``isNull``.)"""

    kind: ClassVar[str] = "optional"
    inner: SerializerSpec = field(default_factory=lambda: OpaqueSpec())

    @property
    def display(self) -> str:
        return f"Optional<{self.inner.display}>"


#: how a hint names the option that decodes Kryo values (the job's classes)
CLASSPATH_HINT = "the job's jar: classpath=[...] (statequery.open, attach, Spark option " \
    "classpath) or --classpath JAR on the command line"
#: how a hint names the option that decodes Protobuf messages kept through Kryo
PROTOBUF_HINT = "its descriptor set: protobuf_descriptors=FILE (statequery.open, attach, Spark " \
    "option protobuf_descriptors) or --protobuf-descriptors FILE on the command line"


@dataclass(frozen=True)
class OpaqueSpec(SerializerSpec):
    """A serializer statequery cannot decode: Kryo, Avro (unless decoded), Java, custom, unknown.

    ``family`` is ``kryo``, ``avro``, ``java`` or ``unknown``; ``type_class`` the Java class of the
    values when the snapshot names it; ``reason`` says why it is opaque. ``avro_schema`` keeps the
    writer schema for Avro. Values of an opaque serializer that fill their slot come back as raw
    bytes with this reason.
    """

    kind: ClassVar[str] = "opaque"
    family: str = "unknown"
    type_class: str | None = None
    reason: str = ""
    avro_schema: str | None = None
    #: Kryo: the snapshot's registrations in order, (class name, has its own serializer)
    kryo_registrations: tuple[tuple[str, bool], ...] = ()
    #: Kryo: the classes with a default serializer of the job's (their bytes are not decoded)
    kryo_default_serializers: tuple[str, ...] = ()

    @property
    def display(self) -> str:
        name = (self.type_class or self.snapshot_class or "?").rsplit(".", 1)[-1]
        return f"{self.family}<{name}>"

    @property
    def decodable(self) -> bool:
        return False


@dataclass(frozen=True)
class AvroSpec(SerializerSpec):
    """Flink's ``AvroSerializer``: values decoded from the writer schema its snapshot keeps
    (:mod:`statequery.serializers.avro`). ``schema`` is that schema's JSON text, ``type_class``
    the runtime class (``GenericRecord`` or a generated ``SpecificRecord``)."""

    kind: ClassVar[str] = "avro"
    schema: str = ""
    type_class: str | None = None

    @property
    def display(self) -> str:
        return f"avro<{(self.type_class or '?').rsplit('.', 1)[-1]}>"


SPEC_TYPES: dict[str, type[SerializerSpec]] = {
    cls.kind: cls
    for cls in (
        PrimitiveSpec, PrimitiveArraySpec, NamespaceSpec, EnumSpec, TupleSpec, RowSpec, PojoSpec,
        ListSpec, MapSpec, GenericArraySpec, NullableSpec, EitherSpec, TtlSpec, TimerSpec,
        RowDataSpec, ArrayDataSpec, MapDataSpec, RawValueSpec, LinkedListSpec, WindowKeySpec,
        StructSpec, OptionalSpec, OpaqueSpec, AvroSpec,
    )
}


# -- (de)serialisation to plain data (the StateMeta snapshot stores specs as msgpack) ----------


def _encode(value: Any) -> Any:
    if isinstance(value, SerializerSpec):
        return to_dict(value)
    if isinstance(value, SqlType):
        out: dict[str, Any] = {"$sql": value.root}
        for f in fields(value):
            v = getattr(value, f.name)
            if f.name != "root" and v not in (None, ()) and not (f.name == "nullable" and v):
                out[f.name] = _encode(v)
        return out
    if isinstance(value, SqlField):
        return {"$field": value.name, "type": _encode(value.type), "description": value.description}
    if isinstance(value, PojoField):
        return {"$pojo_field": value.name, "declaring_class": value.declaring_class,
                "spec": _encode(value.spec)}
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    return value


def to_dict(spec: SerializerSpec) -> dict[str, Any]:
    """Plain data (dicts, lists, scalars) for msgpack/JSON; :func:`from_dict` inverts it."""
    out: dict[str, Any] = {"$kind": spec.kind}
    for f in fields(spec):
        out[f.name] = _encode(getattr(spec, f.name))
    return out


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if "$kind" in value:
            return from_dict(value)
        if "$sql" in value:
            kwargs = {k: _decode(v) for k, v in value.items() if k != "$sql"}
            if "fields" in kwargs:
                kwargs["fields"] = tuple(kwargs["fields"])
            return SqlType(root=value["$sql"], **kwargs)
        if "$field" in value:
            return SqlField(value["$field"], _decode(value["type"]), value.get("description"))
        if "$pojo_field" in value:
            return PojoField(value["$pojo_field"], value["declaring_class"], _decode(value["spec"]))
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(_decode(v) for v in value)
    return value


def from_dict(data: dict[str, Any]) -> SerializerSpec:
    cls = SPEC_TYPES[data["$kind"]]
    kwargs = {k: _decode(v) for k, v in data.items() if k != "$kind"}
    return cls(**kwargs)


#: RowKind's byte values (``RowKind.toByteValue``) and short strings
ROW_KINDS = ("+I", "-U", "+U", "-D")

#: The keyed states whose RowData values are rows a Flink SQL operator keeps with their RowKind:
#: deduplication and ChangelogNormalize (``deduplicate-state``), regular joins
#: (``left-records``/``right-records``), the temporal join (``left``/``right``), Top-N
#: (``data-state-with-append``/``-retract``) and the sink's upsert materializer (``values``).
#: Only values are marked (a row kept as a MapState key, as a join without unique key does,
#: has its kind in the key bytes, which Flink sets to ``+I`` before storing it).
ROW_KIND_STATES = frozenset({
    "deduplicate-state", "left-records", "right-records", "left", "right", "values",
    "data-state-with-append", "data-state-with-retract",
})


def with_row_kinds(spec: SerializerSpec) -> SerializerSpec:
    """``spec`` (a keyed state's value serializer) with its top-level rows showing their
    RowKind: a RowData value, the RowData elements of a list, the RowData values (or lists of
    them) of a map, the RowData fields of a tuple, inside TTL. A row with a field named
    ``row_kind`` is left as it is."""
    if isinstance(spec, RowDataSpec):
        if any(f.name == "row_kind" for f in spec.type.fields):
            return spec
        return replace(spec, row_kind=True)
    if isinstance(spec, ListSpec):
        return replace(spec, element=with_row_kinds(spec.element))
    if isinstance(spec, MapSpec) and spec.value is not None:
        return replace(spec, value=with_row_kinds(spec.value))
    if isinstance(spec, TtlSpec):
        return replace(spec, inner=with_row_kinds(spec.inner))
    if isinstance(spec, TupleSpec):  # an outer join's (row, number of matches)
        return replace(spec, fields=tuple(with_row_kinds(f) for f in spec.fields))
    return spec
