"""Reading the timers of an operator's raw keyed state (heap timers of RocksDB checkpoints).

The layout, and how the listing finds the timer services, is in
:mod:`statequery.metadata.rawkeyed`. This backend walks key group by key group (each key group
is its own ``InternalTimerServiceSerializationProxy``) and appends the wanted timer queues' rows.
Timers are decoded by the pure-Python readers on both decode paths: the compiled path has no
shape of its own here, so both paths read these bytes with the same code.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from statequery.arrow.batches import BatchBuilder
from statequery.decoder import Decoder
from statequery.exceptions import CorruptStateError, StatequeryError
from statequery.metadata.rawkeyed import (
    EVENT_PREFIX,
    MARKER,
    PROCESSING_PREFIX,
    TIMER_PROXY_VERSION,
)
from statequery.metadata.state import StateInfo
from statequery.serializers.readers import DECODE_ERRORS, reader_for
from statequery.serializers.snapshots import read_versioned_snapshot
from statequery.serializers.spec import SerializerSpec

if TYPE_CHECKING:
    from statequery.backends.keygroups import ByteStream

__all__ = ["RawTimersBackend"]

SPAN_BYTES = 8 << 20  # the most bytes of adjacent key groups read at once


class RawTimersBackend:
    """Reads the timers of one subtask's raw keyed stream, key group by key group.

    ``order`` holds the timer layouts (two per service, in the header's service order); a key
    group's bytes run from its offset to the next key group's (or the end of the stream).
    """

    def __init__(
        self,
        name: str,
        stream: ByteStream,
        start_key_group: int,
        offsets: tuple[int, ...],
        order: Sequence[StateInfo],
    ) -> None:
        self.name = name
        self.stream = stream
        self.start_key_group = start_key_group
        self.offsets = offsets
        self.order = list(order)
        self._layouts = {layout.name: layout for layout in self.order}
        self._key_bytes: frozenset[bytes] | None = None

    @property
    def key_groups(self) -> range:
        return range(self.start_key_group, self.start_key_group + len(self.offsets))

    def _extent(self, i: int) -> tuple[int, int]:
        start = self.offsets[i]
        end = self.offsets[i + 1] if i + 1 < len(self.offsets) else self.stream.size()
        if start < 0 or end < start:
            raise CorruptStateError(
                f"raw keyed key group {self.start_key_group + i}: offsets {start}..{end} "
                "are not increasing",
                self.name,
            )
        return start, end

    def scan_states(
        self,
        requests: Sequence[tuple[StateInfo, BatchBuilder]],
        mode: str | None,
        key_groups: Iterable[int] | None = None,
        key_bytes: Sequence[bytes] | None = None,
    ) -> Iterator[int]:
        """Append the wanted timer states' rows of each (wanted) key group; yields each key
        group when done. ``key_bytes``: only the timers whose serialized key is one of them."""
        wanted = None if key_groups is None else set(key_groups)
        self._key_bytes = None if key_bytes is None else frozenset(key_bytes)
        builders = {layout.name: builder for layout, builder in requests}
        if not builders:
            return
        for span in self._spans(wanted):
            first = self._extent(span[0])[0]
            last = self._extent(span[-1])[1]
            # adjacent wanted key groups in one read (one request on remote storage, not one
            # per key group), at most SPAN_BYTES at a time
            data = self.stream.read_range(first, last - first)
            for i in span:
                kg = self.start_key_group + i
                start, end = self._extent(i)
                if len(data) < end - first:
                    raise CorruptStateError(
                        f"raw keyed key group {kg}: {end - start} bytes expected, "
                        f"{max(len(data) - (start - first), 0)} read (truncated?)",
                        self.name,
                        start,
                    )
                part = data[start - first : end - first]
                self._key_group(Decoder(part, source=self.name, base_offset=start), kg, builders)
                yield kg

    def _spans(self, wanted: set[int] | None) -> Iterator[list[int]]:
        """Runs of adjacent wanted key-group indexes, each spanning at most ``SPAN_BYTES`` (a
        single key group larger than that is a run of its own)."""
        run: list[int] = []
        run_start = 0
        for i, kg in enumerate(self.key_groups):
            if wanted is not None and kg not in wanted:
                if run:
                    yield run
                    run = []
                continue
            start, end = self._extent(i)
            if run and end - run_start > SPAN_BYTES:
                yield run
                run = []
            if not run:
                run_start = start
            run.append(i)
        if run:
            yield run

    def _key_group(self, d: Decoder, kg: int, builders: dict[str, BatchBuilder]) -> None:
        if d.remaining < 12 or d.read_bytes(4) != MARKER:
            raise d.error(f"key group {kg}: no timer service header (marker) at its offset", 0)
        version = d.read_int()
        if version != TIMER_PROXY_VERSION:
            raise d.error(
                f"key group {kg}: timer proxy version {version}, expected {TIMER_PROXY_VERSION}"
            )
        n = d.check_length(d.read_int(), "timer service count", 10)
        for _ in range(n):
            name = d.read_utf()
            at = d.pos
            try:
                key = read_versioned_snapshot(d)
                ns = read_versioned_snapshot(d)
            except CorruptStateError:
                raise
            except StatequeryError as e:
                raise d.error(f"key group {kg}: timer service {name!r}: {e}", at) from e
            layout = self._layouts.get(EVENT_PREFIX + name)
            if layout is None or (layout.key, layout.namespace) != (key, ns):
                # every key group repeats the services of the first one, with its serializers
                raise d.error(
                    f"key group {kg}: timer service {name!r} is not the one the stream's first "
                    "key group declared",
                    at,
                )
            for prefix in (EVENT_PREFIX, PROCESSING_PREFIX):
                self._timers(d, kg, key, ns, builders.get(prefix + name), self._key_bytes)
        if not d.at_end():
            raise d.error(f"key group {kg}: {d.remaining} bytes left after its timers")

    @staticmethod
    def _timers(
        d: Decoder,
        kg: int,
        key: SerializerSpec,
        ns: SerializerSpec,
        builder: BatchBuilder | None,
        key_bytes: frozenset[bytes] | None = None,
    ) -> None:
        n = d.read_int()
        if n == 0:
            return
        d.check_length(n, "timer count", 8)
        kr, nr = reader_for(key), reader_for(ns)
        buf, pos, end = d.buf, d.pos, d.end
        if builder is None:
            _skip = kr.skip_at, nr.skip_at
            try:
                for _ in range(n):
                    pos = _skip[1](buf, _skip[0](buf, pos, end), end) + 8
            except DECODE_ERRORS as e:
                raise d.error(f"key group {kg}: undecodable timer: {e}", pos) from e
            if pos > end:
                raise d.error(f"key group {kg}: timers run past the key group's bytes", end)
            d.pos = pos
            return
        a_kg, a_key, a_ns, a_ts = (
            builder.appender(c) for c in ("key_group", "key", "namespace", "timestamp")
        )
        key_at, ns_at = kr.read_at, nr.read_at
        try:
            for _ in range(n):
                kpos = pos
                k, pos = key_at(buf, pos, end)
                keep = key_bytes is None or buf[kpos:pos] in key_bytes  # a lookup's key only
                v, pos = ns_at(buf, pos, end)
                if pos + 8 > end:
                    raise d.error(f"key group {kg}: timer runs past the key group's bytes", pos)
                ts = int.from_bytes(buf[pos : pos + 8], "big", signed=True)
                pos += 8
                if not keep:
                    continue
                a_kg(kg)
                a_key(k)
                a_ns(v)
                a_ts(ts)
        except StatequeryError:
            raise
        except DECODE_ERRORS as e:
            raise d.error(f"key group {kg}: undecodable timer: {e}", pos) from e
        d.pos = pos
