"""The backend protocol: what every keyed-state backend offers and what it is given.

A :class:`KeyedBackend` serves one subtask's keyed handle (one key-group range); the planner
(:mod:`statequery.scan`) decides which one reads a handle (:mod:`statequery.backends.registry`)
and executing a task only opens it and reads. :class:`KeyedContext` is what a backend is given
(the handle resolver, the operator's max parallelism, the header's states from the model);
:class:`HandleStream` reads a stream handle's bytes; :func:`read_proxy` parses a keyed header
for the backends that read one themselves (RocksDB's meta stream, a changelog's base).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from statequery.arrow.batches import BatchBuilder
from statequery.decoder import Decoder
from statequery.exceptions import StorageError
from statequery.metadata.handles import HandleResolver, StreamHandle
from statequery.metadata.proxy import KeyedBackendProxy, read_keyed_proxy
from statequery.metadata.state import StateInfo
from statequery.serializers.spec import SerializerSpec

if TYPE_CHECKING:
    from statequery.backends.pool import OpenDatabases

__all__ = ["HandleStream", "KeyedBackend", "KeyedContext", "StateScanner", "read_proxy"]


class HandleStream:
    """A :class:`~statequery.backends.keygroups.ByteStream` over a stream handle."""

    __slots__ = ("_handle", "_resolver", "_size", "name", "read_gap")

    def __init__(self, resolver: HandleResolver, handle: StreamHandle) -> None:
        from statequery.backends.keygroups import read_gap

        location = _location(resolver, handle)
        self._resolver = resolver
        self._handle = handle
        self._size: int | None = None
        self.name = resolver.source_name(handle)
        #: bytes between two wanted runs read through instead of a second request
        self.read_gap = read_gap(location)

    def size(self) -> int:
        if self._size is None:
            self._size = int(self._resolver.stream_size(self._handle))
        return self._size

    def read_range(self, start: int, length: int) -> bytes:
        return bytes(self._resolver.read(self._handle, start, length))


def _location(resolver: HandleResolver, handle: StreamHandle) -> str | None:
    try:
        return resolver.location(handle)
    except (StorageError, AttributeError):
        return None


@dataclass
class KeyedContext:
    """What a backend factory gets: the storage resolver and the operator's max parallelism."""

    resolver: HandleResolver
    max_parallelism: int
    operator: str = ""
    #: the reader's pool of restored RocksDB databases (kept open until it closes); None: a
    #: database is opened for one scan and closed after it
    open_databases: OpenDatabases | None = None
    #: the layouts of the handle's header states in state-id order, from the model (None: the
    #: backend reads them from the header)
    order: tuple[StateInfo, ...] | None = None


class StateScanner(Protocol):
    """What executing a keyed task needs of its backend: the key groups it holds and one pass
    over them for several states (a :class:`KeyedBackend`, or the raw timers' reader)."""

    name: str

    @property
    def key_groups(self) -> Sequence[int]: ...

    def scan_states(
        self,
        requests: Sequence[tuple[StateInfo, BatchBuilder]],
        mode: str | None,
        key_groups: Iterable[int] | None = None,
        key_bytes: Sequence[bytes] | None = None,
    ) -> Iterator[int]:
        """Several states in one pass over the key groups (each key group read once)."""
        ...


class KeyedBackend(Protocol):
    """One subtask's keyed state in one layout."""

    name: str
    layouts: dict[str, StateInfo]

    @property
    def key_groups(self) -> Sequence[int]: ...

    @property
    def key_serializer(self) -> SerializerSpec | None: ...

    @property
    def compressed(self) -> bool: ...

    def scan(
        self,
        layout: StateInfo,
        mode: str | None,
        builder: BatchBuilder,
        key_groups: Iterable[int] | None = None,
    ) -> Iterator[int]:
        """Append the rows of ``layout``'s state to ``builder``; yield after every key group."""
        ...

    def scan_states(
        self,
        requests: Sequence[tuple[StateInfo, BatchBuilder]],
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


def read_proxy(stream: HandleStream, header_end: int) -> KeyedBackendProxy:
    """Parse the ``KeyedBackendSerializationProxy`` at the start of ``stream`` (its bytes up to
    ``header_end``; 0 or less: the whole stream)."""
    size = stream.size()
    end = min(header_end, size) if header_end > 0 else size
    data = stream.read_range(0, end)
    return read_keyed_proxy(Decoder(data, source=stream.name))
