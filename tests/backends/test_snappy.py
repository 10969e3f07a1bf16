"""Snappy framing as Flink writes it (format reference §2.4, §5, §6)."""

from __future__ import annotations

import os

import cramjam
import pytest

from statequery.backends.snappy import (
    STREAM_IDENTIFIER,
    decompress_chunks_indexed,
    decompress_framed,
)
from statequery.exceptions import CorruptStateError


def framed(data: bytes) -> bytes:
    return bytes(cramjam.snappy.compress(data))


def test_one_and_several_streams() -> None:
    a, b = os.urandom(100_000), b"hello" * 30_000
    assert decompress_framed(framed(a), "f", 0) == a
    assert decompress_framed(framed(a) + framed(b), "f", 0) == a + b


def test_corruption_is_detected_with_offsets() -> None:
    data = framed(b"some state bytes " * 1000)
    with pytest.raises(CorruptStateError, match="identifier") as info:
        decompress_framed(data[10:], "file", 100)
    assert info.value.offset == 100
    for pos in range(10, len(data), max(1, len(data) // 40)):
        bad = bytearray(data)
        bad[pos] ^= 0x10
        with pytest.raises(CorruptStateError):
            decompress_framed(bytes(bad), "file", 0)
    with pytest.raises(CorruptStateError, match="runs past"):
        decompress_framed(data[:-3], "file", 0)


def test_impossible_declared_length_is_refused_before_decompressing() -> None:
    body = b"\x00\x00\x00\x00" + b"\xff\xff\xff\x7f" + b"\x00"  # crc + varint 2^28-1
    chunk = b"\x00" + len(body).to_bytes(3, "little") + body
    with pytest.raises(CorruptStateError, match="impossible length"):
        decompress_framed(STREAM_IDENTIFIER + chunk, "f", 0)


def test_chunk_index_maps_file_offsets() -> None:
    """Operator state: one stream, a flush (chunk boundary) before every recorded offset."""
    c = cramjam.snappy.Compressor()
    parts = [b"element-one", b"element-two" * 10, b"3"]
    out = bytearray()
    offsets = []
    for p in parts:
        c.compress(p)
        chunk = bytes(c.flush())
        if not out:
            assert chunk.startswith(STREAM_IDENTIFIER)
            out += chunk[:10]
            chunk = chunk[10:]
        offsets.append(500 + len(out))
        out += chunk
    data, index = decompress_chunks_indexed(bytes(out), "f", 500)
    assert data == b"".join(parts)
    starts = [index[o] for o in offsets]
    assert starts == [0, len(parts[0]), len(parts[0]) + len(parts[1])]
    assert index[500 + len(out)] == len(data)


def test_skippable_chunk_types_are_corruption() -> None:
    """A flipped high bit turns a data chunk into 'skippable padding': that must not drop data."""
    import cramjam

    from statequery.backends.snappy import STREAM_IDENTIFIER, decompress_framed
    from statequery.exceptions import CorruptStateError

    framed = bytes(cramjam.snappy.compress(b"timers and more timers" * 10))
    assert framed.startswith(STREAM_IDENTIFIER)
    assert decompress_framed(framed, "f", 0) == b"timers and more timers" * 10
    flipped = bytearray(framed)
    flipped[len(STREAM_IDENTIFIER)] ^= 0x80  # chunk type 0x00/0x01 -> 0x80/0x81
    with pytest.raises(CorruptStateError, match="skippable padding") as info:
        decompress_framed(bytes(flipped), "f", 100)
    assert info.value.offset == 100 + len(STREAM_IDENTIFIER)
