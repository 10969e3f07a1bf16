"""Raw keyed state headers: the timer services of heap timers in RocksDB checkpoints.

With ``state.backend.rocksdb.timer-service.factory: HEAP`` a RocksDB job keeps its timers on the
heap; savepoints hold them as ordinary timer queues, but checkpoints write them into the
operator's raw keyed state (``RocksDBKeyedStateBackend.requiresLegacySynchronousTimerSnapshots``,
``InternalTimeServiceManagerImpl.snapshotToRawKeyedState``). The handle is a key-groups handle
with one offset per key group; at each offset ``InternalTimerServiceSerializationProxy`` wrote
(format reference §2.3)::

    F1 CD 85 9F                     PostVersionedIOReadableWritable marker
    int32 version                   2 (1: Flink 1.6/1.7 serializer configs, not read)
    int32 services
    per service:
        UTF name                    e.g. "user-timers", "window-timers"
        versioned key serializer snapshot, versioned namespace serializer snapshot
        int32 n, n x (key, namespace, int64 timestamp)     event-time timers
        int32 n, n x (key, namespace, int64 timestamp)     processing-time timers

(``InternalTimersSnapshotReaderWriters`` v2, ``LegacyTimerSerializer``: the timestamp is not
sign-flipped here.) Every key group repeats every service, so the first key group of a subtask
names the services and their serializers: :func:`read_raw_keyed_header` is the listing's header
read; :mod:`statequery.backends.rawkeyed` reads the timers. The states are the timer queues a
savepoint of the same job holds, ``_timer_state/event_<service>`` and
``_timer_state/processing_<service>``.

Raw keyed state an operator wrote itself (``StreamOperator.snapshotState`` with its own raw
stream) has no such header: it is listed as a ``raw`` state with its size and the reason it is
not read, never hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

from statequery.decoder import Decoder
from statequery.metadata.state import StateInfo
from statequery.serializers.readers import DECODE_ERRORS, reader_for
from statequery.serializers.snapshots import read_versioned_snapshot
from statequery.serializers.spec import OpaqueSpec, SerializerSpec, TimerSpec

__all__ = [
    "EVENT_PREFIX",
    "MARKER",
    "PROCESSING_PREFIX",
    "RAW_KEYED_STATE",
    "RAW_OPERATOR_STATE",
    "TIMER_PROXY_VERSION",
    "RawKeyedHeader",
    "read_raw_keyed_header",
]

#: ``PostVersionedIOReadableWritable.VERSIONED_IDENTIFIER``
MARKER = bytes((0xF1, 0xCD, 0x85, 0x9F))
#: the version ``InternalTimerServiceSerializationProxy`` writes (Flink 1.8 on)
TIMER_PROXY_VERSION = 2
#: names of the listing rows for raw state that is not timers
RAW_KEYED_STATE = "(raw keyed state)"
RAW_OPERATOR_STATE = "(raw operator state)"

EVENT_PREFIX = "_timer_state/event_"
PROCESSING_PREFIX = "_timer_state/processing_"


@dataclass(frozen=True)
class RawKeyedHeader:
    """What the first key group of a raw keyed stream says: the timer services' states (two per
    service, as :class:`~statequery.metadata.state.StateInfo` of ``PRIORITY_QUEUE`` timer
    queues), or ``error`` when the stream is not a timer stream this reader knows."""

    version: int
    states: tuple[StateInfo, ...] = ()
    error: str | None = None
    header_end: int = 0
    timers: bool = True


def _timer_states(
    name: str, key: SerializerSpec, ns: SerializerSpec, first_id: int
) -> list[StateInfo]:
    spec = TimerSpec(key=key, namespace=ns)
    return [
        StateInfo.from_header(
            name=prefix + name,
            backend_type="PRIORITY_QUEUE",
            serializers={"VALUE_SERIALIZER": spec},
            state_id=first_id + i,
        )
        for i, prefix in enumerate((EVENT_PREFIX, PROCESSING_PREFIX))
    ]


def _skip_timers(d: Decoder, key: SerializerSpec, ns: SerializerSpec, what: str) -> None:
    n = d.read_int()
    if n == 0:
        return
    kr, nr = reader_for(key), reader_for(ns)
    d.check_length(n, f"{what} timer count", 8)
    buf, pos, end = d.buf, d.pos, d.end
    try:
        for _ in range(n):
            pos = kr.skip_at(buf, pos, end)
            pos = nr.skip_at(buf, pos, end)
            pos += 8
            if pos > end:
                raise d.error("timer runs past the key group's bytes", pos)
    except DECODE_ERRORS as e:
        raise d.error(f"undecodable {what} timer: {e}", pos) from e
    d.pos = pos


def read_raw_keyed_header(d: Decoder) -> RawKeyedHeader:
    """Parse the first key group of a raw keyed stream (``d`` starts at its offset and ends at
    the next key group's): the timer services, or a reason why it is not a timer stream."""
    start = d.pos
    if d.remaining < 8 or bytes(d.buf[d.pos : d.pos + 4]) != MARKER:
        return RawKeyedHeader(
            0,
            error="raw keyed state written by the operator itself (not timers): its layout is "
            "the operator's own, statequery does not decode it",
            timers=False,
        )
    d.skip(4)
    version = d.read_int()
    if version != TIMER_PROXY_VERSION:
        return RawKeyedHeader(
            version,
            error=f"raw keyed timers of InternalTimerServiceSerializationProxy version {version} "
            f"(Flink 1.6/1.7 serializer configs) are not read; version {TIMER_PROXY_VERSION} is",
        )
    n = d.check_length(d.read_int(), "timer service count", 10)
    states: list[StateInfo] = []
    for i in range(n):
        name = d.read_utf()
        key = read_versioned_snapshot(d)
        ns = read_versioned_snapshot(d)
        states.extend(_timer_states(name, key, ns, len(states)))
        if i == n - 1:
            break  # the last service's timers need not be walked
        if any(isinstance(s, OpaqueSpec) for s in (key, ns)):
            return RawKeyedHeader(
                version,
                tuple(states),
                error=f"timer service {name!r}: its key or namespace serializer is not "
                "decodable, so the services after it cannot be listed",
                header_end=d.pos - start,
            )
        _skip_timers(d, key, ns, "event-time")
        _skip_timers(d, key, ns, "processing-time")
    return RawKeyedHeader(version, tuple(states), header_end=d.pos - start)
