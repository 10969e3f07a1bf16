"""Which backend reads a handle: decided once, by the planner, from the model; opened by kind.

* :func:`keyed_backend_kind` — the planner's decision for one subtask's keyed handle, from what
  the model recorded (the handle's type and the layout its header read found,
  ``HeaderInfo.layout``): a :data:`BackendKind` it puts on the task. The one case the model
  cannot tell without bytes, a type-12 handle holding key group 0 alone (both layouts may start
  with int32 0 there), is walked here, at planning; a layout the header read should have
  recorded and did not (its bytes could not be read) is a :class:`CorruptStateError`.
* :func:`open_keyed_backend` — executing a task opens the backend of its kind, reading nothing.
* :func:`register_keyed_backend` / :func:`keyed_backend_for` — the plug-ins (RocksDB native
  snapshots, type 11; the changelog backend, type 14: modules with heavy optional dependencies,
  :data:`PLUGIN_MODULES`, imported on first need) register a factory ``(handle, context) ->
  backend or None``; the first non-None answer wins.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Literal

from statequery.backends.base import HandleStream, KeyedBackend, KeyedContext, StateScanner
from statequery.exceptions import CorruptStateError, UnsupportedFormatError
from statequery.metadata.handles import (
    KeyedHandle,
    KeyGroupsHandle,
    OperatorStreamHandle,
    is_heap_layout,
    layout_probe,
)
from statequery.metadata.state import StateInfo
from statequery.serializers.spec import SerializerSpec

__all__ = [
    "PLUGIN_MODULES",
    "BackendKind",
    "KeyedBackendFactory",
    "keyed_backend_for",
    "keyed_backend_kind",
    "open_keyed_backend",
    "register_keyed_backend",
]

#: which backend reads a task's handle: a key-group stream in the canonical or the hashmap
#: layout, a raw keyed stream (heap timers), a registered plug-in (RocksDB, changelog), or an
#: operator-state stream
BackendKind = Literal["canonical", "hashmap", "raw_timers", "plugin", "operator"]

KeyedBackendFactory = Callable[[KeyedHandle, KeyedContext], "KeyedBackend | None"]
_FACTORIES: list[KeyedBackendFactory] = []
_REGISTRY_LOCK = threading.Lock()  # guards _FACTORIES (held briefly, never while importing)
_PLUGIN_LOCK = threading.Lock()  # one thread imports the plug-ins, the others wait for it

#: Backends in their own modules (heavy optional dependencies), imported on first need; each
#: registers its factory on import.
PLUGIN_MODULES = ("statequery.backends.rocksdb", "statequery.backends.changelog")
_PLUGINS_LOADED = False
_PLUGIN_ERRORS: dict[str, str] = {}


def register_keyed_backend(factory: KeyedBackendFactory, first: bool = False) -> None:
    """Add a factory ``(handle, context) -> backend or None``; the first non-None answer wins.
    Thread-safe; registering the same factory twice has no effect."""
    with _REGISTRY_LOCK:
        if factory in _FACTORIES:
            return
        if first:
            _FACTORIES.insert(0, factory)
        else:
            _FACTORIES.append(factory)


def _load_plugins() -> None:
    """Import the plug-in modules once. Other threads wait until they are imported (a thread
    that saw the flag set before the import finished would find no factory for its handle)."""
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return
    with _PLUGIN_LOCK:
        if _PLUGINS_LOADED:
            return
        for name in PLUGIN_MODULES:
            try:
                importlib.import_module(name)
            except ImportError as e:
                _PLUGIN_ERRORS[name] = str(e)
        _PLUGINS_LOADED = True


def keyed_backend_for(handle: KeyedHandle, context: KeyedContext) -> KeyedBackend:
    """The registered backend for one keyed state handle (plug-in modules are loaded on first
    miss)."""
    for attempt in range(2):
        with _REGISTRY_LOCK:
            factories = list(_FACTORIES)
        for factory in factories:
            backend = factory(handle, context)
            if backend is not None:
                return backend
        if attempt == 0:
            _load_plugins()
    missing = "; ".join(f"{m}: {e}" for m, e in _PLUGIN_ERRORS.items())
    raise UnsupportedFormatError(
        f"operator {context.operator!r}: keyed state handle {type(handle).__name__} "
        f"(type {getattr(handle, 'handle_type', '?')}) is not supported by this reader; "
        "supported: canonical savepoints (type 7), hashmap checkpoints / native savepoints "
        "(type 12)" + (f"; a backend could not be loaded ({missing})" if missing else "")
    )


# -- the planner's decision ----------------------------------------------------------------------


def keyed_backend_kind(
    handle: KeyedHandle | OperatorStreamHandle,
    layout: str | None,
    context: KeyedContext | None = None,
    compressed: bool = False,
    n_states: int = 0,
) -> BackendKind:
    """Which backend reads a subtask's keyed ``handle``, from the model: the handle's type, and
    for a type-12 key-groups handle with an offset for every key group (a hashmap checkpoint, or
    a Flink 1.15 full RocksDB checkpoint whose every key group holds data) the ``layout``
    ("heap" or "canonical") its header read recorded (``HeaderInfo.layout``).

    Without a recorded layout, a handle holding key group 0 alone is walked (``context``: how
    its bytes are reached; int32 0 starts both layouts there, the canonical walk ends on the
    end-of-key-group mark exactly when it is canonical); any other is corrupt (the header read
    could not read the bytes that tell)."""
    if isinstance(handle, OperatorStreamHandle):
        return "operator"
    if not isinstance(handle, KeyGroupsHandle):
        return "plugin"
    if not is_heap_layout(handle):
        return "canonical"  # a key group without offset: the canonical layout
    if layout is not None:
        return "canonical" if layout == "canonical" else "hashmap"
    probe = layout_probe(handle)
    if probe is not None or context is None:
        at = "" if probe is None else f" (4 bytes at offset {probe[0]}, key group {probe[1]})"
        raise CorruptStateError(
            "keyed state: the layout of this key-group stream (hashmap or canonical) is unknown: "
            f"its header read recorded none{at}",
            None if context is None else context.resolver.source_name(handle.delegate),
        )
    stream = HandleStream(context.resolver, handle.delegate)
    heap = _key_group_zero_is_heap(handle, stream, compressed, n_states, context.max_parallelism)
    return "hashmap" if heap else "canonical"


#: (stream, start key group, offsets) -> heap layout?, walked once per stream
_WALKED: dict[tuple[str, int, tuple[int, ...]], bool] = {}
_WALKED_LOCK = threading.Lock()


def _key_group_zero_is_heap(
    handle: KeyGroupsHandle,
    stream: HandleStream,
    compressed: bool,
    n_states: int,
    max_parallelism: int,
) -> bool:
    """Whether a handle of key group 0 alone holds the hashmap layout: a hashmap key group starts
    with int32 0, as does a canonical one of state 0 with a key shorter than 64 KiB: a canonical
    walk decides (remembered per stream)."""
    key = (str(stream.name), int(handle.start_key_group), tuple(handle.offsets))
    with _WALKED_LOCK:
        known = _WALKED.get(key)
    if known is not None:
        return known
    heap = _walk_key_group_zero(handle, stream, compressed, n_states, max_parallelism)
    with _WALKED_LOCK:
        if len(_WALKED) > 4096:
            _WALKED.clear()
        _WALKED[key] = heap
    return heap


def _walk_key_group_zero(
    handle: KeyGroupsHandle,
    stream: HandleStream,
    compressed: bool,
    n_states: int,
    max_parallelism: int,
) -> bool:
    from statequery.backends.keygroups import (
        iter_key_group_extents,
        key_group_prefix_bytes,
        read_key_group_spans,
        scan_key_group,
    )
    from statequery.backends.snappy import decompress_framed
    from statequery.serializers.readers import DecodeError

    starts = [(handle.start_key_group + i, o) for i, o in enumerate(handle.offsets)]
    ((_kg, start, _end, data),) = list(
        read_key_group_spans(stream, iter_key_group_extents(stream, starts))
    )
    if len(data) < 4 or int.from_bytes(data[:4], "big", signed=True) != 0:
        return False
    try:
        buf = decompress_framed(data, stream.name, start) if compressed else data
        scan_key_group(buf, 0, key_group_prefix_bytes(max_parallelism), [None] * max(n_states, 1))
    except (DecodeError, CorruptStateError, ValueError, IndexError):
        return True
    return False


# -- executing: open the decided backend ---------------------------------------------------------


def open_keyed_backend(
    kind: BackendKind,
    handle: KeyedHandle | OperatorStreamHandle,
    context: KeyedContext,
    compressed: bool,
    key_serializer: SerializerSpec | None,
    order: Sequence[StateInfo],
) -> StateScanner:
    """The backend of ``kind`` (the planner's :func:`keyed_backend_kind`) over one subtask's
    keyed handle, from what the model knows of its header (compression, the states in id order):
    no byte is read."""
    if kind == "plugin" and not isinstance(handle, OperatorStreamHandle):
        return keyed_backend_for(handle, replace(context, order=tuple(order)))
    if not isinstance(handle, KeyGroupsHandle) or kind not in ("canonical", "hashmap",
                                                               "raw_timers"):
        raise UnsupportedFormatError(
            f"operator {context.operator!r}: a {kind} backend cannot read a "
            f"{type(handle).__name__}"
        )
    stream = HandleStream(context.resolver, handle.delegate)
    if kind == "raw_timers":
        from statequery.backends.rawkeyed import RawTimersBackend

        return RawTimersBackend(
            stream.name, stream, handle.start_key_group, tuple(handle.offsets), order
        )
    from statequery.backends.keyedstream import CanonicalKeyedBackend, HeapKeyedBackend

    cls = HeapKeyedBackend if kind == "hashmap" else CanonicalKeyedBackend
    return cls(
        stream.name,
        stream,
        handle.start_key_group,
        tuple(handle.offsets),
        context.max_parallelism,
        compressed,
        key_serializer,
        list(order),
    )
