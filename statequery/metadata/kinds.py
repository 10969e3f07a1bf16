"""The one kind table: what a state is, decided once from Flink's own codes.

A state header (``StateMetaInfoSnapshot``) says what a state is with three of Flink's codes:

* ``BackendStateType`` (its ordinal in the header): ``KEY_VALUE``, ``OPERATOR``, ``BROADCAST``,
  ``PRIORITY_QUEUE``, ``KEY_VALUE_V2``;
* for keyed state the option ``KEYED_STATE_TYPE`` (``StateDescriptor.Type``): ``VALUE``, ``LIST``,
  ``REDUCING``, ``FOLDING``, ``AGGREGATING``, ``MAP``;
* for operator state the option ``OPERATOR_STATE_DISTRIBUTION_MODE``
  (``OperatorStateHandle.Mode``): ``SPLIT_DISTRIBUTE``, ``UNION``, ``BROADCAST``.

:func:`kind_of` maps them to the kind (one of :data:`KINDS`), :func:`row_specs` the kind and the
serializers to the per-row serializers the decoders need; both are read through
:class:`~statequery.metadata.state.StateInfo`, the one class describing a state. Every layer gets
a state's kind from here (the StateMeta model, the Arrow schemas, the backends).

Decisions (documented once, here): ``FOLDING`` (removed from Flink, its value is the
accumulator) reads as ``aggregating``; a ``PRIORITY_QUEUE`` whose elements are timers is
``event_timer`` or ``processing_timer`` by its ``_timer_state/event_`` /
``_timer_state/processing_`` name (other names: ``processing`` in the name, else event), any
other queue is ``priority_queue`` (listed, not readable as rows); a ``TtlSerializer`` around the
value (list element, map value) sets ``ttl`` and the row specs hold the inner serializer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
    "BACKEND_STATE_TYPES",
    "KEYED_KINDS",
    "KEYED_STATE_TYPES",
    "KINDS",
    "OPERATOR_KINDS",
    "DISTRIBUTION_MODES",
    "TIMER_KINDS",
    "Kind",
    "backend_type_name",
    "kind_of",
    "row_specs",
]


@dataclass(frozen=True)
class Kind:
    """One state kind: ``keyed`` (rows have key groups and keys), ``timer``, and ``readable``
    (has rows; a non-timer priority queue or an unsupported keyed type has none)."""

    name: str
    keyed: bool
    timer: bool = False
    readable: bool = True


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("value", keyed=True),
        Kind("list", keyed=True),
        Kind("map", keyed=True),
        Kind("reducing", keyed=True),
        Kind("aggregating", keyed=True),
        Kind("event_timer", keyed=True, timer=True),
        Kind("processing_timer", keyed=True, timer=True),
        Kind("priority_queue", keyed=True, readable=False),
        Kind("unknown", keyed=True, readable=False),
        Kind("operator_list", keyed=False),
        Kind("operator_union", keyed=False),
        Kind("broadcast", keyed=False),
        # raw keyed / raw operator state an operator wrote itself: listed, never read
        Kind("raw", keyed=False, readable=False),
    )
}

#: Flink's ``BackendStateType`` by ordinal (the header writes the ordinal)
BACKEND_STATE_TYPES = ("KEY_VALUE", "OPERATOR", "BROADCAST", "PRIORITY_QUEUE", "KEY_VALUE_V2")
#: ``StateDescriptor.Type`` -> kind
KEYED_STATE_TYPES = {
    "VALUE": "value",
    "LIST": "list",
    "MAP": "map",
    "REDUCING": "reducing",
    "AGGREGATING": "aggregating",
    "FOLDING": "aggregating",
}
#: ``OperatorStateHandle.Mode`` -> kind
DISTRIBUTION_MODES = {
    "SPLIT_DISTRIBUTE": "operator_list",
    "UNION": "operator_union",
    "BROADCAST": "broadcast",
}
TIMER_PREFIXES = (
    ("_timer_state/event_", "event_timer"),
    ("_timer_state/processing_", "processing_timer"),
)

KEYED_KINDS = tuple(k.name for k in KINDS.values() if k.keyed and k.readable)
TIMER_KINDS = tuple(k.name for k in KINDS.values() if k.timer)
OPERATOR_KINDS = tuple(k.name for k in KINDS.values() if not k.keyed and k.readable)


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


def backend_type_name(bt: Any) -> str:
    """``BackendStateType`` as its name, from the ordinal, an enum or a string."""
    if isinstance(bt, int):
        return BACKEND_STATE_TYPES[bt]
    name = getattr(bt, "name", bt)
    return str(name).upper() if name is not None else ""


def _unwrap_ttl(spec: SerializerSpec | None) -> tuple[SerializerSpec | None, bool]:
    if isinstance(spec, TtlSpec):
        return spec.inner, True
    return spec, False


def _timer_kind(name: str) -> str:
    for prefix, kind in TIMER_PREFIXES:
        if name.startswith(prefix):
            return kind
    return "processing_timer" if "processing" in name else "event_timer"


def kind_of(
    name: str, backend_type: Any, options: Any, serializers: Any
) -> tuple[str, str | None]:
    """A state's kind (one of :data:`KINDS`) from its header: its name, ``BackendStateType``,
    options and serializers, and why it is ``unknown`` (a keyed state type this reader does not
    know), else None."""
    backend = backend_type_name(backend_type)
    if backend == "RAW":
        return "raw", None
    if backend == "PRIORITY_QUEUE":
        value = _serializer(serializers, "VALUE_SERIALIZER")
        # a non-timer queue: not readable as rows, but its elements can be skipped
        return (_timer_kind(name) if isinstance(value, TimerSpec) else "priority_queue"), None
    if backend in ("OPERATOR", "BROADCAST"):
        mode = (_option(options, "OPERATOR_STATE_DISTRIBUTION_MODE") or "").upper()
        if backend == "BROADCAST":
            return "broadcast", None
        return DISTRIBUTION_MODES.get(mode, "operator_list"), None
    # keyed KEY_VALUE / KEY_VALUE_V2
    stype = (_option(options, "KEYED_STATE_TYPE") or "VALUE").upper()
    if stype not in KEYED_STATE_TYPES:
        return "unknown", f"state {name!r}: unsupported keyed state type {stype}"
    return KEYED_STATE_TYPES[stype], None


def row_specs(
    kind: str,
    serializers: Mapping[str, SerializerSpec],
    key_spec: SerializerSpec | None,
    error: str | None,
) -> tuple[
    SerializerSpec | None,
    SerializerSpec | None,
    SerializerSpec | None,
    SerializerSpec | None,
    bool,
    SerializerSpec | None,
]:
    """What a state's rows hold, for the decoders: ``(key, namespace, user_key, value, ttl,
    state_value)`` of a state of ``kind`` with these header ``serializers`` (Flink's keys),
    ``key_spec`` the keyed header's key serializer and ``error`` why the state is not decodable
    (when the header gave no value serializer, the value is then opaque with this reason).

    ``value`` is the per-row value serializer: the value for value/reducing/aggregating, the list
    **element** for list and operator list state, the map **value** for map and broadcast state,
    the ``TimerSpec`` for timers. ``ttl`` is True when that serializer was a ``TtlSpec`` (``value``
    is then the inner serializer and rows carry ``last_access``). ``state_value`` is the state's
    full ``VALUE_SERIALIZER`` (what the hashmap checkpoint format writes).
    """
    value = _serializer(serializers, "VALUE_SERIALIZER")
    if value is None and error:
        value = OpaqueSpec(family="unknown", reason=str(error))
    if kind in ("raw", "unknown"):
        return None, None, None, None, False, None
    if kind == "priority_queue" or kind in OPERATOR_KINDS and kind != "broadcast":
        return None, None, None, value, False, value
    if kind == "broadcast":
        return None, None, _serializer(serializers, "KEY_SERIALIZER"), value, False, value
    if kind in TIMER_KINDS:
        if isinstance(value, TimerSpec):
            return value.key, value.namespace, None, value, False, value
        return None, None, None, value, False, value
    ns = _serializer(serializers, "NAMESPACE_SERIALIZER") or NamespaceSpec(name="void")
    if kind == "list":
        element = value.element if isinstance(value, ListSpec) else value
        element, ttl = _unwrap_ttl(element)
        return key_spec, ns, None, element, ttl, value
    if kind == "map":
        user_key = _serializer(serializers, "USER_KEY_SERIALIZER")
        if isinstance(value, MapSpec) and user_key is None:
            user_key, map_value = value.key, value.value
        else:
            map_value = value
        map_value, ttl = _unwrap_ttl(map_value)
        return key_spec, ns, user_key, map_value, ttl, value
    inner, ttl = _unwrap_ttl(value)
    return key_spec, ns, None, inner, ttl, value
