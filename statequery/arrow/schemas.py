"""Per-state-kind table shapes: which columns a state's rows have, and their Arrow types.

A state is described by a :class:`StateLayout` (its kind and resolved serializers), built from the
metadata layer's ``StateMetaInfo`` with :func:`layout_from_meta`. :func:`state_schema` gives the
Arrow schema of its rows for a read mode:

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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from statequery.arrow.types import EPOCH_MS, arrow_type, raw_value_reason
from statequery.exceptions import InvalidOptionError, UnsupportedFormatError
from statequery.serializers.spec import (
    ListSpec,
    MapSpec,
    NamespaceSpec,
    OpaqueSpec,
    SerializerSpec,
    TimerSpec,
    TtlSpec,
)

__all__ = [
    "KEYED_KINDS",
    "MODES",
    "OPERATOR_KINDS",
    "TIMER_KINDS",
    "StateLayout",
    "layout_from_meta",
    "resolve_mode",
    "state_schema",
]

KEYED_KINDS = ("value", "list", "map", "reducing", "aggregating", "event_timer", "processing_timer")
TIMER_KINDS = ("event_timer", "processing_timer")
OPERATOR_KINDS = ("operator_list", "operator_union", "broadcast")

#: Read modes: ``rows`` (default: list values as arrays, map states one row per entry),
#: ``flat`` (list states one row per element with ``index``), ``nested`` (map states one
#: ``map`` per key and namespace).
MODES = ("rows", "flat", "nested")


@dataclass(frozen=True)
class StateLayout:
    """What a state's rows hold.

    ``value`` is the per-row value serializer: the value for value/reducing/aggregating, the list
    **element** for list and operator list state, the map **value** for map and broadcast state,
    the ``TimerSpec`` for timers. ``ttl`` is True when that serializer was a ``TtlSpec`` (the
    layout then holds the inner serializer and rows carry ``last_access``). ``state_value`` keeps
    the state's full ``VALUE_SERIALIZER`` (what the hashmap checkpoint format writes).
    """

    name: str
    kind: str
    key: SerializerSpec | None = None
    namespace: SerializerSpec | None = None
    user_key: SerializerSpec | None = None
    value: SerializerSpec | None = None
    ttl: bool = False
    state_value: SerializerSpec | None = None

    @property
    def keyed(self) -> bool:
        return self.kind in KEYED_KINDS

    @property
    def is_timer(self) -> bool:
        return self.kind in TIMER_KINDS


def _option(options: Any, name: str) -> str | None:
    if isinstance(options, Mapping):
        v = options.get(name)
        return None if v is None else str(v)
    for k, v in options or ():
        if k == name:
            return str(v)
    return None


def _serializer(serializers: Any, name: str) -> SerializerSpec | None:
    if isinstance(serializers, Mapping):
        found = serializers.get(name)
        return found if isinstance(found, SerializerSpec) else None
    for k, v in serializers or ():
        if k == name:
            return v  # type: ignore[no-any-return]
    return None


def _backend_type(meta: Any) -> str:
    bt = getattr(meta, "backend_type", None)
    if isinstance(bt, int):
        return ("KEY_VALUE", "OPERATOR", "BROADCAST", "PRIORITY_QUEUE", "KEY_VALUE_V2")[bt]
    name = getattr(bt, "name", bt)
    return str(name).upper() if name is not None else ""


def _unwrap_ttl(spec: SerializerSpec | None) -> tuple[SerializerSpec | None, bool]:
    if isinstance(spec, TtlSpec):
        return spec.inner, True
    return spec, False


def layout_from_meta(meta: Any, key_serializer: SerializerSpec | None = None) -> StateLayout:
    """A :class:`StateLayout` from a ``StateMetaInfo`` (name, backend_type, options, serializers).

    ``key_serializer`` is the keyed proxy's key serializer (keyed states only).
    """
    name = meta.name
    backend = _backend_type(meta)
    options = getattr(meta, "options", {})
    sers = getattr(meta, "serializers", {})
    value = _serializer(sers, "VALUE_SERIALIZER")
    error = getattr(meta, "error", None)
    if value is None and error:
        value = OpaqueSpec(family="unknown", reason=str(error))
    if backend == "PRIORITY_QUEUE":
        if not isinstance(value, TimerSpec):
            # a non-timer queue: not readable as rows, but its elements can be skipped
            return StateLayout(name, "priority_queue", value=value, state_value=value)
        kind = "processing_timer" if name.startswith("_timer_state/processing_") else (
            "event_timer" if name.startswith("_timer_state/event_") else
            "processing_timer" if "processing" in name else "event_timer")
        key: SerializerSpec | None = value.key
        ns: SerializerSpec | None = value.namespace
        return StateLayout(name, kind, key=key, namespace=ns, value=value, state_value=value)
    if backend in ("OPERATOR", "BROADCAST"):
        mode = (_option(options, "OPERATOR_STATE_DISTRIBUTION_MODE") or "").upper()
        if backend == "BROADCAST" or mode == "BROADCAST":
            return StateLayout(
                name,
                "broadcast",
                user_key=_serializer(sers, "KEY_SERIALIZER"),
                value=value,
                state_value=value,
            )
        kind = "operator_union" if mode == "UNION" else "operator_list"
        return StateLayout(name, kind, value=value, state_value=value)
    # keyed KEY_VALUE / KEY_VALUE_V2
    stype = (_option(options, "KEYED_STATE_TYPE") or "VALUE").upper()
    ns = _serializer(sers, "NAMESPACE_SERIALIZER") or NamespaceSpec(name="void")
    if stype == "LIST":
        element = value.element if isinstance(value, ListSpec) else value
        element, ttl = _unwrap_ttl(element)
        return StateLayout(
            name,
            "list",
            key=key_serializer,
            namespace=ns,
            value=element,
            ttl=ttl,
            state_value=value,
        )
    if stype == "MAP":
        user_key = _serializer(sers, "USER_KEY_SERIALIZER")
        if isinstance(value, MapSpec) and user_key is None:
            user_key, map_value = value.key, value.value
        else:
            map_value = value
        map_value, ttl = _unwrap_ttl(map_value)
        return StateLayout(
            name,
            "map",
            key=key_serializer,
            namespace=ns,
            user_key=user_key,
            value=map_value,
            ttl=ttl,
            state_value=value,
        )
    value_kind = {
        "VALUE": "value",
        "REDUCING": "reducing",
        "AGGREGATING": "aggregating",
        "FOLDING": "aggregating",
    }.get(stype)
    if value_kind is None:
        raise UnsupportedFormatError(f"state {name!r}: unsupported keyed state type {stype}")
    inner, ttl = _unwrap_ttl(value)
    return StateLayout(
        name, value_kind, key=key_serializer, namespace=ns, value=inner, ttl=ttl,
        state_value=value,
    )


def resolve_mode(layout: StateLayout, mode: str | None) -> str:
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
        fields.append(pa.field(name, column_type(spec)))


def state_schema(layout: Any, mode: str | None = None) -> pa.Schema:
    """The Arrow schema of a state's rows in ``mode`` (see the module docstring).

    ``layout`` is a :class:`StateLayout` or the metadata layer's ``StateInfo`` (anything with
    ``name``, ``backend_type``, ``options``, ``serializers`` and ``key_spec``).
    """
    if not isinstance(layout, StateLayout):
        layout = layout_from_meta(layout, getattr(layout, "key_spec", None))
    mode = resolve_mode(layout, mode)
    fields: list[pa.Field] = []
    kind = layout.kind
    if layout.keyed:
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
            fields.append(pa.field("map", pa.map_(column_type(layout.user_key), vt)))
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
