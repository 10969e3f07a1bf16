"""Keyed-state backends: one per on-disk layout, chosen per keyed state handle.

A :class:`KeyedBackend` serves one subtask's keyed handle (one key-group range). ``reader.py``
asks each subtask's backend for the rows of one state, restricted to key groups, and never needs
to know the layout:

* :class:`CanonicalKeyedBackend` — canonical savepoints (``KeyGroupsSavepointStateHandle``,
  type 7) written by any backend, plain or snappy (:mod:`statequery.backends.keygroups`);
* :class:`HeapKeyedBackend` — the hashmap backend's checkpoints and native savepoints (type 12,
  :mod:`statequery.backends.heap`);
* RocksDB native snapshots (type 11) plug in the same way: a factory registered with
  :func:`register_keyed_backend` that returns a backend for ``IncrementalHandle``s. Its entries are
  the composite key/value format, so it reuses
  :class:`~statequery.backends.keygroups.CompositeEntryDecoder`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from statequery.arrow.batches import BatchBuilder
from statequery.arrow.schemas import StateLayout
from statequery.decoder import Decoder
from statequery.exceptions import UnsupportedFormatError
from statequery.metadata.handles import (
    is_heap_layout,
    is_heap_stream,
    layout_by_first_bytes,
)
from statequery.serializers.spec import SerializerSpec

if TYPE_CHECKING:
    from statequery.backends.pool import OpenDatabases

__all__ = [
    "CanonicalKeyedBackend",
    "HandleStream",
    "HeapKeyedBackend",
    "KeyedBackend",
    "KeyedContext",
    "heap_layout_of",
    "is_heap_layout",
    "is_heap_stream",
    "keyed_backend_for",
    "keyed_backend_from_model",
    "register_keyed_backend",
]


class HandleStream:
    """A :class:`~statequery.backends.keygroups.ByteStream` over a stream handle."""

    __slots__ = ("_handle", "_resolver", "_size", "name", "read_gap")

    def __init__(self, resolver: Any, handle: Any) -> None:
        from statequery.backends.keygroups import read_gap

        self._resolver = resolver
        self._handle = handle
        self._size: int | None = None
        self.name = resolver.source_name(handle)
        #: bytes between two wanted runs read through instead of a second request
        self.read_gap = read_gap(_location(resolver, handle))

    def size(self) -> int:
        if self._size is None:
            self._size = int(self._resolver.stream_size(self._handle))
        return self._size

    def read_range(self, start: int, length: int) -> bytes:
        return bytes(self._resolver.read(self._handle, start, length))


def _location(resolver: Any, handle: Any) -> str | None:
    from statequery.exceptions import StorageError

    try:
        return resolver.location(handle)  # type: ignore[no-any-return]
    except (StorageError, AttributeError):
        return None


@dataclass
class KeyedContext:
    """What a backend factory gets: the storage resolver and the operator's max parallelism."""

    resolver: Any
    max_parallelism: int
    operator: str = ""
    #: the reader's pool of restored RocksDB databases (kept open until it closes); None: a
    #: database is opened for one scan and closed after it
    open_databases: OpenDatabases | None = None
    #: the layouts of the handle's header states in state-id order, from the model (None: the
    #: backend reads them from the header)
    order: tuple[StateLayout, ...] | None = None


class KeyedBackend(Protocol):
    """One subtask's keyed state in one layout."""

    name: str
    layouts: dict[str, StateLayout]

    @property
    def key_groups(self) -> Sequence[int]: ...

    @property
    def key_serializer(self) -> SerializerSpec | None: ...

    @property
    def compressed(self) -> bool: ...

    def scan(
        self,
        layout: StateLayout,
        mode: str | None,
        builder: BatchBuilder,
        key_groups: Iterable[int] | None = None,
    ) -> Iterator[int]:
        """Append the rows of ``layout``'s state to ``builder``; yield after every key group."""
        ...

    def scan_states(
        self,
        requests: Sequence[tuple[StateLayout, BatchBuilder]],
        mode: str | None,
        key_groups: Iterable[int] | None = None,
        key_bytes: Sequence[bytes] | None = None,
    ) -> Iterator[int]:
        """Several states in one pass over the key groups (each key group read once).

        ``key_bytes``: the serialized keys (as Flink's key serializer writes them,
        :func:`statequery.keys.resolve_key`) whose entries are wanted; a backend must return
        exactly the entries whose serialized key is one of them (the caller does not filter
        again).
        """
        ...


KeyedBackendFactory = Callable[[Any, KeyedContext], "KeyedBackend | None"]
_FACTORIES: list[KeyedBackendFactory] = []
_REGISTRY_LOCK = threading.Lock()  # guards _FACTORIES (held briefly, never while importing)
_PLUGIN_LOCK = threading.Lock()  # one thread imports the plug-ins, the others wait for it


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


#: Backends in their own modules (heavy optional dependencies), imported on first need; each
#: registers its factory on import.
PLUGIN_MODULES = ("statequery.backends.rocksdb", "statequery.backends.changelog")
_PLUGINS_LOADED = False


_PLUGIN_ERRORS: dict[str, str] = {}


def _load_plugins() -> None:
    """Import the plug-in modules once. Other threads wait until they are imported (a thread
    that saw the flag set before the import finished would find no factory for its handle)."""
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return
    with _PLUGIN_LOCK:
        if _PLUGINS_LOADED:
            return
        import importlib

        for name in PLUGIN_MODULES:
            try:
                importlib.import_module(name)
            except ImportError as e:
                _PLUGIN_ERRORS[name] = str(e)
        _PLUGINS_LOADED = True


def keyed_backend_for(handle: Any, context: KeyedContext) -> KeyedBackend:
    """The backend for one keyed state handle (plug-in modules are loaded on first miss)."""
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


# -- the keyed proxy header --------------------------------------------------------------------


def _read_proxy(stream: Any, header_end: int) -> Any:
    """Parse the ``KeyedBackendSerializationProxy`` at the start of ``stream``."""
    from statequery.metadata.proxy import read_keyed_proxy

    size = stream.size()
    end = min(header_end, size) if header_end > 0 else size
    data = stream.read_range(0, end)
    return read_keyed_proxy(Decoder(data, source=stream.name))


@dataclass
class _KeyedBase:
    """One subtask's key-group stream. ``order`` holds the layouts of the header's states in
    state-id order (from the StateMeta model: no header byte is read)."""

    name: str
    stream: Any
    start_key_group: int
    offsets: tuple[int, ...]
    max_parallelism: int
    compressed: bool = False
    key_serializer: SerializerSpec | None = None
    order: list[StateLayout] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    layouts: dict[str, StateLayout] = field(init=False)
    ids: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.layouts = {layout.name: layout for layout in self.order}
        self.ids = {layout.name: i for i, layout in enumerate(self.order)}

    @property
    def key_groups(self) -> Sequence[int]:
        return range(self.start_key_group, self.start_key_group + len(self.offsets))

    def _offsets_by_key_group(self) -> dict[int, int]:
        """Key group -> stream offset, as ``KeyGroupRangeOffsets`` records them."""
        return {self.start_key_group + i: o for i, o in enumerate(self.offsets)}

    def _wanted(self, key_groups: Iterable[int] | None) -> set[int] | None:
        if key_groups is None:
            return None
        own = self.key_groups
        return {kg for kg in key_groups if kg in own}

    def scan(
        self,
        layout: StateLayout,
        mode: str | None,
        builder: BatchBuilder,
        key_groups: Iterable[int] | None = None,
    ) -> Iterator[int]:
        return self.scan_states([(layout, builder)], mode, key_groups)

    def scan_states(
        self,
        requests: Sequence[tuple[StateLayout, BatchBuilder]],
        mode: str | None,
        key_groups: Iterable[int] | None = None,
        key_bytes: Sequence[bytes] | None = None,
    ) -> Iterator[int]:
        raise NotImplementedError  # each layout's subclass decodes its own key groups


class CanonicalKeyedBackend(_KeyedBase):
    """Canonical savepoint key groups (:mod:`statequery.backends.keygroups`)."""

    def scan_states(
        self,
        requests: Sequence[tuple[StateLayout, BatchBuilder]],
        mode: str | None,
        key_groups: Iterable[int] | None = None,
        key_bytes: Sequence[bytes] | None = None,
        *,
        runs: Mapping[int, Sequence[int]] | None = None,
        record: Callable[[int, list[int]], None] | None = None,
    ) -> Iterator[int]:
        """Decode several states in one pass (each key group is read once). ``runs`` (this
        stream's run index) and ``record`` (called with each key group's runs after a walk of the
        whole key group): see :meth:`~statequery.backends.keygroups.KeyGroupStream.scan`."""
        from statequery.backends.keygroups import (
            CompositeEntryDecoder,
            KeyGroupStream,
            key_group_prefix_bytes,
        )

        wanted = self._wanted(key_groups)
        if wanted is not None and not wanted:
            return
        handlers: list[Any] = [None] * len(self.order)
        finishers = []
        for layout, builder in requests:
            decoder = CompositeEntryDecoder(layout, mode, builder, key_bytes)
            handlers[self.ids[layout.name]] = decoder.on_entry
            finishers.append(decoder.finish)
        stream = KeyGroupStream(
            self.stream,
            self._offsets_by_key_group(),
            self.compressed,
            key_group_prefix_bytes(self.max_parallelism),
        )
        if key_bytes is not None:  # a lookup: the kept per-key-group index (keyindex.py)
            from statequery.backends.keyindex import indexed_scan

            skips = [8 if lay.is_timer else 0 for lay in self.order]
            done = indexed_scan(stream, handlers, finishers, wanted, key_bytes, skips, record)
            if done is not None:
                yield from done
                return
        yield from stream.scan(handlers, finishers, wanted, runs=runs, record=record)


class HeapKeyedBackend(_KeyedBase):
    """Hashmap checkpoint / native savepoint key groups (:mod:`statequery.backends.heap`)."""

    def scan_states(
        self,
        requests: Sequence[tuple[StateLayout, BatchBuilder]],
        mode: str | None,
        key_groups: Iterable[int] | None = None,
        key_bytes: Sequence[bytes] | None = None,
    ) -> Iterator[int]:
        from statequery.backends.heap import HeapBlockDecoder, HeapKeyGroupStream

        wanted = self._wanted(key_groups)
        if wanted is not None and not wanted:
            return
        builders = {layout.name: builder for layout, builder in requests}
        blocks = [
            HeapBlockDecoder(lay, builders.get(lay.name), mode, key_bytes) for lay in self.order
        ]
        stream = HeapKeyGroupStream(
            self.stream,
            self._offsets_by_key_group(),
            self.compressed,
        )
        yield from stream.scan(blocks, wanted)


#: (stream, start key group, offsets) -> heap layout?, decided once per stream by its bytes
_LAYOUT_OF: dict[tuple[str, int, tuple[int, ...]], bool] = {}
_LAYOUT_LOCK = threading.Lock()


def heap_layout_of(handle: Any, stream: Any, compressed: bool, n_states: int,
                   max_parallelism: int) -> bool:
    """Whether a key-groups handle's stream holds the hashmap layout (else the canonical one).

    Decided by the handle when it can (:func:`is_heap_layout`: a key group without offset is
    canonical); else by 4 bytes of a key group other than 0
    (:func:`~statequery.metadata.handles.layout_by_first_bytes`); a handle holding key group 0
    alone is walked as canonical (lengths only) and is canonical exactly when that walk ends on
    the end-of-key-group mark. The model keeps the answer (``HeaderInfo.layout``), so reading
    passes it and probes nothing."""
    if not is_heap_layout(handle):
        return False
    key = (str(stream.name), int(handle.start_key_group), tuple(handle.offsets))
    with _LAYOUT_LOCK:
        known = _LAYOUT_OF.get(key)
    if known is not None:
        return known
    heap = _probe_heap_layout(handle, stream, compressed, n_states, max_parallelism)
    with _LAYOUT_LOCK:
        if len(_LAYOUT_OF) > 4096:
            _LAYOUT_OF.clear()
        _LAYOUT_OF[key] = heap
    return heap


def _probe_heap_layout(handle: Any, stream: Any, compressed: bool, n_states: int,
                       max_parallelism: int) -> bool:
    from statequery.backends.keygroups import (
        iter_key_group_extents,
        key_group_prefix_bytes,
        read_key_group_spans,
        scan_key_group,
    )
    from statequery.backends.snappy import decompress_framed
    from statequery.exceptions import CorruptStateError
    from statequery.serializers.readers import DecodeError

    hint = layout_by_first_bytes(handle, stream.read_range)
    if hint is not None:
        return hint == "heap"
    starts = [(handle.start_key_group + i, o) for i, o in enumerate(handle.offsets)]
    # key group 0 alone: a hashmap key group starts with int32 0 ...
    ((_kg, start, _end, data),) = list(
        read_key_group_spans(stream, iter_key_group_extents(stream, starts))
    )
    if len(data) < 4 or int.from_bytes(data[:4], "big", signed=True) != 0:
        return False
    # ... as does a canonical one of state 0 with a key shorter than 64 KiB: walk it
    try:
        buf = decompress_framed(data, stream.name, start) if compressed else data
        scan_key_group(buf, 0, key_group_prefix_bytes(max_parallelism), [None] * max(n_states, 1))
    except (DecodeError, CorruptStateError, ValueError, IndexError):
        return True
    return False


def keyed_backend_from_model(
    handle: Any,
    context: KeyedContext,
    compressed: bool,
    key_serializer: SerializerSpec | None,
    order: Sequence[StateLayout],
    layout: str | None = None,
) -> KeyedBackend:
    """The backend of one subtask's keyed handle from what the StateMeta model knows of its
    header (compression, states in id order, the layout its bytes showed): no header byte is
    read (without ``layout``, a handle that cannot tell is probed)."""
    from statequery.metadata.handles import KeyGroupsHandle

    if isinstance(handle, KeyGroupsHandle):
        stream = HandleStream(context.resolver, handle.delegate)
        if layout is not None or not is_heap_layout(handle):
            heap = is_heap_stream(handle, layout)
        else:
            heap = heap_layout_of(
                handle, stream, compressed, len(order), context.max_parallelism
            )
        cls: type[_KeyedBase] = HeapKeyedBackend if heap else CanonicalKeyedBackend
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
    # other layouts (RocksDB: IncrementalHandle) plug in through the registry
    return keyed_backend_for(handle, replace(context, order=tuple(order)))

