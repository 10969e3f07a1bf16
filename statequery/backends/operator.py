"""Operator (non-keyed) state: list, union-list and broadcast state (§6 of the format reference).

``DefaultOperatorStateBackendSnapshotStrategy`` writes the ``OperatorBackendSerializationProxy``
header, then every list state's elements back to back (``PartitionableListState.write``: one
offset per element, recorded in ``_metadata``), then every broadcast state
(``HeapBroadcastState.write``: one offset; ``int32 size`` and ``size x (key, value)``).

With compression (1.19+) the data region is a single snappy framed stream and every recorded
offset is a chunk boundary (the writer flushes before taking each position), so an element is the
decompressed bytes between its offset and the next one.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from statequery.arrow.batches import BatchBuilder
from statequery.backends.keygroups import ByteStream
from statequery.exceptions import CorruptStateError, UnsupportedFormatError
from statequery.metadata.state import StateInfo
from statequery.serializers.readers import (
    DECODE_ERRORS,
    DecodeError,
    raw_reader,
    reader_for,
)

__all__ = ["read_broadcast_state", "read_operator_list_state", "state_region"]

_I32 = struct.Struct(">i").unpack_from


def state_region(
    offsets: Sequence[int], all_offsets: Sequence[int], stream_size: int
) -> tuple[int, int]:
    """``(start, end)`` of one state's bytes: from its first offset to the next state's (or EOF)."""
    start, last = min(offsets), max(offsets)
    later = [o for o in all_offsets if o > last]
    return start, (min(later) if later else stream_size)


def _load(
    stream: ByteStream, start: int, end: int, compressed: bool
) -> tuple[bytes, dict[int, int] | None]:
    """The region's bytes; for compressed state also the chunk-offset -> position index."""
    if end < start:
        raise CorruptStateError(f"state data ends ({end}) before it starts", stream.name, start)
    data = stream.read_range(start, end - start)
    if len(data) != end - start:
        raise CorruptStateError(
            f"expected {end - start} bytes of operator state, the stream has {len(data)}",
            stream.name,
            start + len(data),
        )
    if not compressed:
        return data, None
    from statequery.backends.snappy import decompress_chunks_indexed

    return decompress_chunks_indexed(data, stream.name, start)


def read_operator_list_state(
    stream: ByteStream,
    layout: StateInfo,
    offsets: Sequence[int],
    all_offsets: Sequence[int],
    compressed: bool,
    subtask: int,
    builder: BatchBuilder,
) -> None:
    """One subtask's list / union-list state: a row per element (``subtask, index, value``)."""
    if not offsets:
        return
    spec = layout.value
    if spec is None:
        raise UnsupportedFormatError(f"operator state {layout.name!r} has no element serializer")
    reader = reader_for(spec) if spec.decodable else raw_reader()
    size = stream.size()
    start, end = state_region(offsets, all_offsets, size)
    buf, index = _load(stream, start, end, compressed)
    bounds = list(offsets) + [end]
    a_sub, a_idx, a_val = (builder.appender(c) for c in ("subtask", "index", "value"))
    for i in range(len(offsets)):
        o, o_next = bounds[i], bounds[i + 1]
        if o_next < o:
            raise CorruptStateError(
                f"state {layout.name!r}: element offsets not increasing ({o} then {o_next})",
                stream.name,
                o,
            )
        if index is None:
            s, e = o - start, o_next - start
        else:
            if o not in index or o_next not in index:
                bad = o if o not in index else o_next
                raise CorruptStateError(
                    f"state {layout.name!r}: offset {bad} is not a snappy chunk boundary",
                    stream.name,
                    bad,
                )
            s, e = index[o], index[o_next]
        try:
            value = reader.read_slot(buf, s, e)
        except DecodeError as err:
            at = (o + err.pos - s) if index is None else o
            raise CorruptStateError(
                f"state {layout.name!r} element {i}: {err.message}", stream.name, at
            ) from err
        except DECODE_ERRORS as err:
            raise CorruptStateError(
                f"state {layout.name!r} element {i}: {type(err).__name__}: {err}", stream.name, o
            ) from err
        a_sub(subtask)
        a_idx(i)
        a_val(value)


def read_broadcast_state(
    stream: ByteStream,
    layout: StateInfo,
    offset: int,
    all_offsets: Sequence[int],
    compressed: bool,
    builder: BatchBuilder,
) -> None:
    """Decode one copy of a broadcast state: ``int32 size``, ``size x (key, value)``."""
    key_spec, value_spec = layout.user_key, layout.value
    if key_spec is None or value_spec is None:
        raise UnsupportedFormatError(f"broadcast state {layout.name!r} lacks serializers")
    key_r = reader_for(key_spec) if key_spec.decodable else None
    value_r = reader_for(value_spec) if value_spec.decodable else None
    start, end = state_region([offset], all_offsets, stream.size())
    buf, index = _load(stream, start, end, compressed)
    if index is not None:
        if start not in index:
            raise CorruptStateError(
                f"state {layout.name!r}: offset {start} is not a snappy chunk boundary",
                stream.name,
                start,
            )
        pos, stop = index[start], len(buf)
    else:
        pos, stop = 0, len(buf)
    a_uk, a_val = builder.appender("user_key"), builder.appender("value")
    try:
        n = _I32(buf, pos)[0]
        pos += 4
        if n < 0 or n > stop - pos:
            raise DecodeError(f"impossible broadcast state size {n}", pos - 4)
        keys: list[Any] = []
        values: list[Any] = []
        for i in range(n):
            last = i == n - 1
            if key_r is None or (value_r is None and not last):
                raise UnsupportedFormatError(
                    f"broadcast state {layout.name!r}: entries of a "
                    f"{(key_spec if key_r is None else value_spec).display} serializer cannot be "
                    "delimited"
                )
            k, pos = key_r.read_at(buf, pos, stop)
            if value_r is None:
                v, pos = buf[pos:stop], stop
            else:
                v, pos = value_r.read_at(buf, pos, stop)
            if pos > stop:
                raise DecodeError("broadcast entry runs past the end of the state", pos)
            keys.append(k)
            values.append(v)
        if pos != stop:
            raise DecodeError(f"{stop - pos} bytes after the last broadcast entry", pos)
    except DecodeError as err:
        at = start + err.pos if index is None else start
        raise CorruptStateError(
            f"broadcast state {layout.name!r}: {err.message}", stream.name, at
        ) from err
    except DECODE_ERRORS as err:
        raise CorruptStateError(
            f"broadcast state {layout.name!r}: {type(err).__name__}: {err}", stream.name, start
        ) from err
    for k, v in zip(keys, values, strict=True):
        a_uk(k)
        a_val(v)
