"""One state: :class:`StateInfo`, the one class that describes a state in every layer.

The header parsers (:mod:`statequery.metadata.proxy`, the raw keyed and changelog readers) make
one per state of a header with :meth:`StateInfo.from_header`: name, backend state type, options,
serializers, the id in that header, the kind (from the one kind table,
:mod:`statequery.metadata.kinds`), and the operator fields empty. The model fills in the operator,
the specs ``state_meta`` shows, size, backend and format (``dataclasses.replace``); the planner
and the decoders read the same object, whose per-row serializers (:attr:`StateInfo.key`,
``namespace``, ``user_key``, ``value``, ``ttl``, ``state_value``) are derived once per object from
its serializers and key serializer (cached, never touched per row).

Instances are frozen; equality compares the fields (not the cached per-row specs). They hold
dicts (options, serializers), so they are not hashable: key dicts by ``name``. They pickle (to
worker processes and Spark executors) with their cached specs, if computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from statequery.metadata.kinds import (
    KEYED_KINDS,
    OPERATOR_KINDS,
    TIMER_KINDS,
    backend_type_name,
    kind_of,
    row_specs,
)
from statequery.serializers.spec import (
    AvroSpec,
    EnumSpec,
    GenericArraySpec,
    ListSpec,
    MapSpec,
    NamespaceSpec,
    NullableSpec,
    OpaqueSpec,
    OptionalSpec,
    PojoSpec,
    PrimitiveArraySpec,
    PrimitiveSpec,
    RowDataSpec,
    RowSpec,
    SerializerSpec,
    StructSpec,
    TtlSpec,
    TupleSpec,
)

__all__ = ["StateInfo", "type_string"]

_RowSpecs = tuple[
    SerializerSpec | None,
    SerializerSpec | None,
    SerializerSpec | None,
    SerializerSpec | None,
    bool,
    SerializerSpec | None,
]


@dataclass(frozen=True)
class StateInfo:
    """One state: of a header as parsed, then of one operator as the model places it.

    ``kind``: value, list, map, reducing, aggregating, event_timer, processing_timer,
    operator_list, operator_union, broadcast (also ``priority_queue`` for non-timer queues,
    ``unknown`` for an unsupported keyed type, ``raw`` for raw state).
    ``serializers`` holds the header's serializers unchanged (Flink's keys:
    ``NAMESPACE_SERIALIZER``, ``VALUE_SERIALIZER``, ``KEY_SERIALIZER``, ``USER_KEY_SERIALIZER``);
    ``state_id`` is the state's id in the header it was read from.

    The model's view (what ``state_meta`` shows): ``key_spec`` is the operator's key serializer
    (keyed states), ``namespace_spec`` the namespace, ``value_spec`` the value — for list states
    the *element*, for map states the map value — and ``user_key_spec`` the map key (map state)
    or broadcast key. These keep TTL wrappers (``TtlSpec``); :attr:`ttl` says so.

    The decoders' view (:attr:`key`, :attr:`namespace`, :attr:`user_key`, :attr:`value`,
    :attr:`ttl`, :attr:`state_value`): the per-row serializers with TTL unwrapped, from
    :func:`statequery.metadata.kinds.row_specs`. A header's state has ``reason`` set when the
    header could not be read whole (an unknown serializer snapshot), and no operator fields.
    """

    name: str
    kind: str
    backend_type: str = ""
    options: dict[str, str] = field(default_factory=dict)
    serializers: dict[str, SerializerSpec] = field(default_factory=dict)
    state_id: int = 0
    # -- the operator (empty for a header's state until the model places it)
    operator_id: str = ""
    operator_uid: str = ""
    operator_name: str = ""
    parallelism: int = 0
    max_parallelism: int = 0
    # -- the model's view
    key_spec: SerializerSpec | None = None
    namespace_spec: SerializerSpec | None = None
    value_spec: SerializerSpec | None = None
    user_key_spec: SerializerSpec | None = None
    decodable: bool = True
    reason: str | None = None
    size_bytes: int = 0
    backend: str | None = None
    format: str | None = None
    table_name: str = ""
    #: where the state's bytes are: ``managed`` (keyed or operator state), ``raw_keyed`` (heap
    #: timers a RocksDB checkpoint wrote into raw keyed state), ``raw_operator``
    stream: str = "managed"
    #: keyed state of the changelog state backend: the number of logged changes applied on top
    #: of the materialized base (0: none); None for every other backend
    changes: int | None = None

    @classmethod
    def from_header(
        cls,
        name: str,
        backend_type: Any,
        options: dict[str, str] | None = None,
        serializers: dict[str, SerializerSpec] | None = None,
        state_id: int = 0,
        error: str | None = None,
        key_spec: SerializerSpec | None = None,
    ) -> StateInfo:
        """A state as a header describes it (``StateMetaInfoSnapshot``): its kind from the one
        kind table, ``error`` (why the header could not be read whole) as ``reason``,
        ``key_spec`` the keyed header's key serializer; no operator yet."""
        options = dict(options or {})
        serializers = dict(serializers or {})
        kind, _ = kind_of(name, backend_type, options, serializers)
        return cls(
            name=name,
            kind=kind,
            backend_type=backend_type_name(backend_type),
            options=options,
            serializers=serializers,
            state_id=state_id,
            key_spec=key_spec if kind not in OPERATOR_KINDS else None,
            decodable=error is None,
            reason=error,
        )

    # -- header facts

    @property
    def state_type(self) -> str | None:
        """``KEYED_STATE_TYPE`` (VALUE, LIST, MAP, REDUCING, AGGREGATING…) for keyed states."""
        return self.options.get("KEYED_STATE_TYPE")

    @property
    def distribution_mode(self) -> str | None:
        return self.options.get("OPERATOR_STATE_DISTRIBUTION_MODE")

    @property
    def unsupported(self) -> str | None:
        """Why the kind is ``unknown`` (a keyed state type this reader does not know), else None."""
        if self.kind != "unknown":
            return None
        return kind_of(self.name, self.backend_type, self.options, self.serializers)[1]

    # -- kind

    @property
    def keyed(self) -> bool:
        """Keyed state (anything but operator, union and broadcast state)."""
        return self.kind not in OPERATOR_KINDS

    @property
    def keyed_rows(self) -> bool:
        """Keyed state with rows (not a non-timer queue or an unsupported keyed type)."""
        return self.kind in KEYED_KINDS

    @property
    def is_timer(self) -> bool:
        return self.kind in TIMER_KINDS

    # -- the decoders' view: derived once per object, then plain attributes of the instance
    #    (cached_property stores each in the instance dict, so per-row reads cost no call)

    @cached_property
    def _rows(self) -> _RowSpecs:
        return row_specs(self.kind, self.serializers, self.key_spec, self.reason)

    @cached_property
    def key(self) -> SerializerSpec | None:
        """The per-row key serializer (keyed states)."""
        return self._rows[0]

    @cached_property
    def namespace(self) -> SerializerSpec | None:
        return self._rows[1]

    @cached_property
    def user_key(self) -> SerializerSpec | None:
        """The map key (map state) or broadcast key."""
        return self._rows[2]

    @cached_property
    def value(self) -> SerializerSpec | None:
        """The per-row value serializer, TTL unwrapped (list: the element; map: the map value)."""
        return self._rows[3]

    @cached_property
    def ttl(self) -> bool:
        """The value serializer was a ``TtlSpec`` (rows carry ``last_access``)."""
        return self._rows[4]

    @cached_property
    def state_value(self) -> SerializerSpec | None:
        """The state's full ``VALUE_SERIALIZER`` (what the hashmap checkpoint format writes)."""
        return self._rows[5]

    @property
    def key_type(self) -> str | None:
        return type_string(self.key_spec)

    @property
    def namespace_type(self) -> str | None:
        return type_string(self.namespace_spec)

    @property
    def value_type(self) -> str | None:
        return type_string(self.value_spec)

    @property
    def user_key_type(self) -> str | None:
        return type_string(self.user_key_spec)


# -- type strings ------------------------------------------------------------------------------

_PRIMITIVE_SQL = {
    "boolean": "BOOLEAN",
    "byte": "TINYINT",
    "short": "SMALLINT",
    "int": "INT",
    "long": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "char": "CHAR",
    "string": "STRING",
    "void": "VOID",
    "bigint": "BIGINTEGER",
    "bigdec": "BIGDECIMAL",
    "date": "DATE (java.util.Date)",
    "sql_date": "DATE",
    "sql_time": "TIME",
    "sql_timestamp": "TIMESTAMP",
    "instant": "TIMESTAMP_LTZ",
    "local_date": "DATE",
    "local_time": "TIME",
    "local_date_time": "TIMESTAMP",
    "string_data": "STRING",
    "null_value": "NULL",
    "boolean_value": "BOOLEAN",
}
_NAMESPACE_SQL = {
    "void": "VOID",
    "time_window": "TimeWindow",
    "global_window": "GlobalWindow",
    "count_window": "CountWindow",
}


def type_string(spec: SerializerSpec | None) -> str | None:
    """A SQL-like type name for ``inspect`` and ``state_meta`` (TTL wrappers unwrapped)."""
    if spec is None:
        return None
    if isinstance(spec, TtlSpec):
        return type_string(spec.inner)
    if isinstance(spec, PrimitiveSpec):
        if spec.name == "decimal_data":
            return f"DECIMAL({spec.precision}, {spec.scale})"
        if spec.name == "timestamp_data":
            return f"TIMESTAMP({spec.precision})"
        return _PRIMITIVE_SQL.get(spec.name, spec.name.upper())
    if isinstance(spec, PrimitiveArraySpec):
        if spec.element == "byte":
            return "BYTES"
        inner = _PRIMITIVE_SQL.get(spec.element, spec.element.upper())
        return f"ARRAY<{inner} NOT NULL>"
    if isinstance(spec, NamespaceSpec):
        return _NAMESPACE_SQL.get(spec.name, spec.name)
    if isinstance(spec, TupleSpec):
        inner = ", ".join(type_string(f) or "?" for f in spec.fields)
        return f"TUPLE{len(spec.fields)}<{inner}>"
    if isinstance(spec, RowSpec):
        pairs = zip(spec.field_names, spec.fields, strict=True)
        inner = ", ".join(f"{n} {type_string(f)}" for n, f in pairs)
        return f"ROW<{inner}>"
    if isinstance(spec, PojoSpec):
        inner = ", ".join(f"{f.name} {type_string(f.spec) or 'REMOVED'}" for f in spec.fields)
        return f"POJO<{spec.class_name}>{{{inner}}}"
    if isinstance(spec, EnumSpec):
        return f"ENUM<{spec.class_name}>"
    if isinstance(spec, ListSpec):
        return f"ARRAY<{type_string(spec.element)}>"
    if isinstance(spec, MapSpec):
        if spec.is_set or spec.value is None:
            return f"MULTISET<{type_string(spec.key)}>"
        return f"MAP<{type_string(spec.key)}, {type_string(spec.value)}>"
    if isinstance(spec, GenericArraySpec):
        return f"ARRAY<{type_string(spec.element)}>"
    if isinstance(spec, NullableSpec):
        return type_string(spec.inner)
    if isinstance(spec, RowDataSpec):
        text = str(spec.type)
        if spec.derived and text.endswith(">"):
            text = text[:-1] + "".join(f", {d[0]} {d[4]}" for d in spec.derived) + ">"
        if spec.row_kind and text.startswith("ROW<"):
            return "ROW<row_kind STRING, " + text[4:]
        return text
    if isinstance(spec, StructSpec):
        pairs = zip(spec.names, spec.fields, strict=True)
        return "ROW<" + ", ".join(f"{n} {type_string(f)}" for n, f in pairs) + ">"
    if isinstance(spec, OptionalSpec):
        return type_string(spec.inner)
    if isinstance(spec, OpaqueSpec):
        what = spec.type_class or spec.snapshot_class or "?"
        return f"{spec.family.upper()}<{what}>"
    if isinstance(spec, AvroSpec):
        from statequery.serializers.avro import parse_schema

        return f"AVRO<{parse_schema(spec.schema).name or spec.type_class or '?'}>"
    return spec.display
