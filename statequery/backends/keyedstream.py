"""The two backends of a key-group stream (a ``KeyGroupsHandle``): one subtask's keyed state
written key group after key group, at the offsets the handle records.

* :class:`CanonicalKeyedBackend` — canonical savepoints (``KeyGroupsSavepointStateHandle``,
  type 7) written by any backend, and Flink 1.15's full RocksDB checkpoints, plain or snappy
  (:mod:`statequery.backends.keygroups`);
* :class:`HeapKeyedBackend` — the hashmap backend's checkpoints and native savepoints (type 12,
  :mod:`statequery.backends.heap`).

Which of the two reads a handle is the planner's decision
(:func:`statequery.backends.registry.stream_backend`); these classes only read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from statequery.arrow.batches import BatchBuilder
from statequery.metadata.state import StateInfo
from statequery.serializers.spec import SerializerSpec

if TYPE_CHECKING:
    from statequery.backends.keygroups import ByteStream

__all__ = ["CanonicalKeyedBackend", "HeapKeyedBackend", "KeyGroupsBackend"]


@dataclass
class KeyGroupsBackend:
    """One subtask's key-group stream. ``order`` holds the layouts of the header's states in
    state-id order (from the StateMeta model: no header byte is read)."""

    name: str
    stream: ByteStream
    start_key_group: int
    offsets: tuple[int, ...]
    max_parallelism: int
    compressed: bool = False
    key_serializer: SerializerSpec | None = None
    order: list[StateInfo] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    layouts: dict[str, StateInfo] = field(init=False)
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
        layout: StateInfo,
        mode: str | None,
        builder: BatchBuilder,
        key_groups: Iterable[int] | None = None,
    ) -> Iterator[int]:
        return self.scan_states([(layout, builder)], mode, key_groups)

    def scan_states(
        self,
        requests: Sequence[tuple[StateInfo, BatchBuilder]],
        mode: str | None,
        key_groups: Iterable[int] | None = None,
        key_bytes: Sequence[bytes] | None = None,
    ) -> Iterator[int]:
        raise NotImplementedError  # each layout's subclass decodes its own key groups


class CanonicalKeyedBackend(KeyGroupsBackend):
    """Canonical savepoint key groups (:mod:`statequery.backends.keygroups`)."""

    def scan_states(
        self,
        requests: Sequence[tuple[StateInfo, BatchBuilder]],
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
        handlers: list[Callable[..., None] | None] = [None] * len(self.order)
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


class HeapKeyedBackend(KeyGroupsBackend):
    """Hashmap checkpoint / native savepoint key groups (:mod:`statequery.backends.heap`)."""

    def scan_states(
        self,
        requests: Sequence[tuple[StateInfo, BatchBuilder]],
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
