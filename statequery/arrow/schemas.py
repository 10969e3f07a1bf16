"""Per-state-kind table shapes: which columns a state's rows have, and their Arrow types.

A state is described by a :class:`~statequery.metadata.state.StateInfo` (its kind and its
per-row serializers, from :mod:`statequery.metadata.kinds`, the one kind table).
:func:`state_schema` gives the Arrow schema of its rows for a read mode:

=====================  ============================================================================
kind                   columns
=====================  ============================================================================
value, reducing,       ``key_group, key, namespace, value``
aggregating
list                   ``key_group, key, namespace, value`` (an array); mode ``flat``:
                       ``key_group, key, namespace, index, value`` (one row per element)
map                    ``key_group, key, namespace, user_key, value`` (one row per entry);
                       mode ``nested``: ``key_group, key, namespace, map``
event_timer,           ``key_group, key, namespace, timestamp, timestamp_ms`` (``timestamp_ms``: the
processing_timer       timer's long as Flink stores it; ``timestamp``: that instant, null outside
                       years 1-9999, e.g. ``Long.MAX_VALUE``)
operator_list,         ``subtask, index, value``
operator_union
broadcast              ``user_key, value``
=====================  ============================================================================

TTL states add ``last_access`` (an array for list states in the default mode). A column whose
serializer cannot be decoded (Kryo, Avro, unknown) is ``binary`` (the raw bytes of the value) and
is followed by ``<column>_reason`` (why it is raw).
"""

from __future__ import annotations

import pyarrow as pa

from statequery.arrow.types import EPOCH_MS, arrow_type, raw_value_reason
from statequery.exceptions import InvalidOptionError, UnsupportedFormatError
from statequery.metadata.kinds import (
    KEYED_KINDS,
    OPERATOR_KINDS,
    TIMER_KINDS,
)
from statequery.metadata.state import StateInfo
from statequery.serializers.readers import primitive_name
from statequery.serializers.spec import OpaqueSpec, PrimitiveSpec, SerializerSpec

__all__ = [
    "KEYED_KINDS",
    "MODES",
    "OPERATOR_KINDS",
    "TIMER_KINDS",
    "resolve_mode",
    "state_schema",
]

#: Read modes: ``rows`` (default: list values as arrays, map states one row per entry),
#: ``flat`` (list states one row per element with ``index``), ``nested`` (map states one
#: ``map`` per key and namespace).
MODES = ("rows", "flat", "nested")


def resolve_mode(layout: StateInfo, mode: str | None) -> str:
    if mode is None or mode in ("rows", "keyed", "default"):
        return "rows"
    if mode in ("flat", "keyed-flat"):
        return "flat"
    if mode in ("nested", "map"):
        return "nested"
    raise InvalidOptionError(f"unknown read mode {mode!r}; valid: {', '.join(MODES)}")


def column_type(spec: SerializerSpec | None) -> pa.DataType:
    """The Arrow type of a column holding values of ``spec`` (binary when not decodable)."""
    if spec is None:
        return pa.null()
    if not spec.decodable:
        return pa.binary()
    return arrow_type(spec)


def opaque_reason(spec: SerializerSpec) -> str:
    """Why values of ``spec`` come back as raw bytes."""
    return raw_value_reason(spec)


def raw_class(spec: SerializerSpec) -> str:
    """The Java class of an undecodable value (for ``{"$raw", "$class"}`` renderings)."""
    stack = [spec]
    while stack:
        s = stack.pop()
        if isinstance(s, OpaqueSpec):
            return s.type_class or s.snapshot_class or "unknown"
        stack.extend(s.children())
    return spec.snapshot_class or "unknown"


def _col(fields: list[pa.Field], name: str, spec: SerializerSpec | None) -> None:
    if spec is not None and not spec.decodable:
        # raw bytes; the field metadata keeps the value class, the next column the reason
        fields.append(pa.field(name, pa.binary(),
                               metadata={b"statequery.raw_class": raw_class(spec).encode()}))
        fields.append(pa.field(f"{name}_reason", pa.string()))
    else:
        typ = column_type(spec)
        if pa.types.is_string(typ) and isinstance(spec, PrimitiveSpec) and (
            primitive_name(spec.name) == "timestamp_data"
        ):  # a TimestampData(7..9) as exact text: the field says so
            sql_type = f"TIMESTAMP({spec.precision})".encode()
            fields.append(pa.field(name, typ, metadata={b"statequery.sql_type": sql_type}))
        else:
            fields.append(pa.field(name, typ))


def state_schema(layout: StateInfo, mode: str | None = None) -> pa.Schema:
    """The Arrow schema of a state's rows in ``mode`` (see the module docstring)."""
    mode = resolve_mode(layout, mode)
    fields: list[pa.Field] = []
    kind = layout.kind
    if layout.keyed_rows:
        fields.append(pa.field("key_group", pa.int32(), nullable=False))
        _col(fields, "key", layout.key)
        _col(fields, "namespace", layout.namespace)
    if kind in TIMER_KINDS:
        # Flink's long as is, and as an instant where Python, Spark and DuckDB can hold one
        fields.append(pa.field("timestamp", EPOCH_MS))
        fields.append(pa.field("timestamp_ms", pa.int64(), nullable=False))
    elif kind in ("value", "reducing", "aggregating"):
        _col(fields, "value", layout.value)
        if layout.ttl:
            fields.append(pa.field("last_access", EPOCH_MS))
    elif kind == "list":
        if layout.value is not None and not layout.value.decodable:
            # elements cannot be split at their "," delimiters: the whole joined value, raw
            _col(fields, "value", layout.value)
        elif mode == "flat":
            fields.append(pa.field("index", pa.int32(), nullable=False))
            _col(fields, "value", layout.value)
            if layout.ttl:
                fields.append(pa.field("last_access", EPOCH_MS))
        else:
            fields.append(pa.field("value", pa.list_(column_type(layout.value))))
            if layout.ttl:
                fields.append(pa.field("last_access", pa.list_(EPOCH_MS)))
    elif kind == "map":
        if mode == "nested":
            vt = column_type(layout.value)
            if layout.ttl:
                vt = pa.struct([("last_access", EPOCH_MS), ("value", vt)])
            kt = column_type(layout.user_key)
            if pa.types.is_null(kt):
                # no user-key serializer (the header could not be read past an unknown one, as
                # in CEP's shared buffer): Arrow map keys cannot be null-typed, so the keys are
                # raw bytes; such a state's entries raise UnsupportedFormatError in every mode
                kt = pa.binary()
            fields.append(pa.field("map", pa.map_(kt, vt)))
            for name, spec in (("user_key", layout.user_key), ("value", layout.value)):
                if spec is not None and not spec.decodable:
                    fields.append(pa.field(f"{name}_reason", pa.string()))
        else:
            _col(fields, "user_key", layout.user_key)
            _col(fields, "value", layout.value)
            if layout.ttl:
                fields.append(pa.field("last_access", EPOCH_MS))
    elif kind in ("operator_list", "operator_union"):
        fields.append(pa.field("subtask", pa.int32(), nullable=False))
        fields.append(pa.field("index", pa.int32(), nullable=False))
        _col(fields, "value", layout.value)
    elif kind == "broadcast":
        _col(fields, "user_key", layout.user_key)
        _col(fields, "value", layout.value)
    else:
        raise UnsupportedFormatError(f"unknown state kind {kind!r}")
    return pa.schema(
        fields,
        metadata={b"statequery.kind": kind.encode(), b"statequery.state": layout.name.encode()},
    )
