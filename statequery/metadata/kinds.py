"""The one kind table: what a state is, decided once from Flink's own codes.

A state header (``StateMetaInfoSnapshot``) says what a state is with three of Flink's codes:

* ``BackendStateType`` (its ordinal in the header): ``KEY_VALUE``, ``OPERATOR``, ``BROADCAST``,
  ``PRIORITY_QUEUE``, ``KEY_VALUE_V2``;
* for keyed state the option ``KEYED_STATE_TYPE`` (``StateDescriptor.Type``): ``VALUE``, ``LIST``,
  ``REDUCING``, ``FOLDING``, ``AGGREGATING``, ``MAP``;
* for operator state the option ``OPERATOR_STATE_DISTRIBUTION_MODE``
  (``OperatorStateHandle.Mode``): ``SPLIT_DISTRIBUTE``, ``UNION``, ``BROADCAST``.

:func:`layout_from_meta` maps them, with the serializers, to a :class:`StateLayout`: the kind
(one of :data:`KINDS`) and the per-row serializers the decoders need. Every layer gets a state's
kind from here (the StateMeta model, the Arrow schemas, the backends).

Decisions (documented once, here): ``FOLDING`` (removed from Flink, its value is the
accumulator) reads as ``aggregating``; a ``PRIORITY_QUEUE`` whose elements are timers is
``event_timer`` or ``processing_timer`` by its ``_timer_state/event_`` /
``_timer_state/processing_`` name (other names: ``processing`` in the name, else event), any
other queue is ``priority_queue`` (listed, not readable as rows); a ``TtlSerializer`` around the
value (list element, map value) sets ``ttl`` and the layout holds the inner serializer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from statequery.exceptions import UnsupportedFormatError
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
    "StateLayout",
    "backend_type_name",
    "layout_from_meta",
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


@dataclass(frozen=True)
class StateLayout:
    """What a state's rows hold (the decoders' view of a state of the model).

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
        """Keyed state with rows (not a non-timer queue or an unsupported keyed type)."""
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


def layout_from_meta(meta: Any, key_serializer: SerializerSpec | None = None) -> StateLayout:
    """The :class:`StateLayout` of a state described by ``name``, ``backend_type``, ``options``
    and ``serializers`` (a header's ``StateMetaInfo`` or the model's ``StateInfo``).

    ``key_serializer`` is the keyed header's key serializer (keyed states only). Raises
    :class:`UnsupportedFormatError` for a keyed state type this reader does not know.
    """
    name = meta.name
    backend = backend_type_name(getattr(meta, "backend_type", None))
    options = getattr(meta, "options", {})
    sers = getattr(meta, "serializers", {})
    value = _serializer(sers, "VALUE_SERIALIZER")
    error = getattr(meta, "error", None)
    if value is None and error:
        value = OpaqueSpec(family="unknown", reason=str(error))
    if backend == "RAW":
        return StateLayout(name, "raw")
    if backend == "PRIORITY_QUEUE":
        if not isinstance(value, TimerSpec):
            # a non-timer queue: not readable as rows, but its elements can be skipped
            return StateLayout(name, "priority_queue", value=value, state_value=value)
        return StateLayout(
            name,
            _timer_kind(name),
            key=value.key,
            namespace=value.namespace,
            value=value,
            state_value=value,
        )
    if backend in ("OPERATOR", "BROADCAST"):
        mode = (_option(options, "OPERATOR_STATE_DISTRIBUTION_MODE") or "").upper()
        kind = "broadcast" if backend == "BROADCAST" else DISTRIBUTION_MODES.get(
            mode, "operator_list"
        )
        if kind == "broadcast":
            return StateLayout(
                name,
                "broadcast",
                user_key=_serializer(sers, "KEY_SERIALIZER"),
                value=value,
                state_value=value,
            )
        return StateLayout(name, kind, value=value, state_value=value)
    # keyed KEY_VALUE / KEY_VALUE_V2
    stype = (_option(options, "KEYED_STATE_TYPE") or "VALUE").upper()
    if stype not in KEYED_STATE_TYPES:
        raise UnsupportedFormatError(f"state {name!r}: unsupported keyed state type {stype}")
    kind = KEYED_STATE_TYPES[stype]
    ns = _serializer(sers, "NAMESPACE_SERIALIZER") or NamespaceSpec(name="void")
    if kind == "list":
        element = value.element if isinstance(value, ListSpec) else value
        element, ttl = _unwrap_ttl(element)
        return StateLayout(
            name, "list", key=key_serializer, namespace=ns, value=element, ttl=ttl,
            state_value=value,
        )
    if kind == "map":
        user_key = _serializer(sers, "USER_KEY_SERIALIZER")
        if isinstance(value, MapSpec) and user_key is None:
            user_key, map_value = value.key, value.value
        else:
            map_value = value
        map_value, ttl = _unwrap_ttl(map_value)
        return StateLayout(
            name, "map", key=key_serializer, namespace=ns, user_key=user_key, value=map_value,
            ttl=ttl, state_value=value,
        )
    inner, ttl = _unwrap_ttl(value)
    return StateLayout(
        name, kind, key=key_serializer, namespace=ns, value=inner, ttl=ttl, state_value=value
    )


def layout_or_unknown(
    meta: Any, key_serializer: SerializerSpec | None = None
) -> tuple[StateLayout, str | None]:
    """:func:`layout_from_meta`, or an ``unknown`` layout and the reason."""
    try:
        return layout_from_meta(meta, key_serializer), None
    except UnsupportedFormatError as e:
        return StateLayout(meta.name, "unknown"), str(e)
