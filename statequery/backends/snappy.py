"""Snappy framing (google/snappy ``framing_format.txt``) as Flink writes it.

Flink's ``SnappyStreamCompressionDecorator`` wraps xerial's ``SnappyFramedOutputStream``
(block size 64 KiB). Three uses, three shapes:

* canonical keyed savepoints: every key group is its own framed stream (identifier chunk
  included) starting at the key group's offset (:func:`decompress_framed`);
* hashmap checkpoints: a new framed stream per state block inside a key group, the streams simply
  follow each other (:func:`decompress_framed` reads the concatenation);
* operator state: one framed stream for the whole data region, offsets recorded at chunk
  boundaries (:func:`decompress_chunks_indexed` maps every chunk's file offset to its position in
  the decompressed bytes).

Checksums are verified (masked CRC-32C): a flipped bit in compressed data is reported as corrupt,
never decoded into a wrong value. Chunks are at most 64 KiB uncompressed (checked before
decompressing), so corrupt lengths never cause large allocations.
"""

from __future__ import annotations

import cramjam

from statequery.exceptions import CorruptStateError

__all__ = [
    "STREAM_IDENTIFIER",
    "decompress_chunks_indexed",
    "decompress_framed",
    "is_framed",
]

STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"
_MAX_CHUNK_DATA = 65536 + 4
_MAX_UNCOMPRESSED = 65536


def is_framed(data: bytes) -> bool:
    return data[:10] == STREAM_IDENTIFIER


def decompress_framed(data: bytes, source: str, offset: int) -> bytes:
    """Decompress one or more complete framed streams that fill ``data`` exactly.

    ``offset`` is the file position of ``data[0]`` (for error messages).
    """
    if not data.startswith(STREAM_IDENTIFIER):
        raise CorruptStateError(
            f"snappy stream identifier expected, found {data[:10].hex() or 'end of data'}",
            source,
            offset,
        )
    _validate_chunks(data, source, offset)
    try:
        return bytes(cramjam.snappy.decompress(data))
    except cramjam.DecompressionError as e:
        raise CorruptStateError(f"corrupt snappy data: {e}", source, offset) from e


def _validate_chunks(data: bytes, source: str, offset: int) -> None:
    """Walk the chunk headers: lengths inside the data, known types, bounded uncompressed sizes."""
    pos, n = 0, len(data)
    while pos < n:
        if pos + 4 > n:
            raise CorruptStateError("snappy chunk header truncated", source, offset + pos)
        ctype = data[pos]
        length = data[pos + 1] | (data[pos + 2] << 8) | (data[pos + 3] << 16)
        body = pos + 4
        if body + length > n:
            raise CorruptStateError(
                f"snappy chunk of {length} bytes runs past the end of the data "
                f"({n - body} bytes left)",
                source,
                offset + pos,
            )
        if ctype == 0x00:
            if length < 5 or length > _MAX_CHUNK_DATA:
                raise CorruptStateError(
                    f"snappy compressed chunk of {length} bytes", source, offset + pos
                )
            declared = _raw_length(data, body + 4, body + length)
            if declared is None or declared > _MAX_UNCOMPRESSED:
                raise CorruptStateError(
                    "snappy block declares an impossible length", source, offset + pos
                )
        elif ctype == 0x01:
            if length < 4 or length > _MAX_CHUNK_DATA:
                raise CorruptStateError(
                    f"snappy uncompressed chunk of {length} bytes", source, offset + pos
                )
        elif ctype == 0xFF:
            if data[pos : pos + 10] != STREAM_IDENTIFIER:
                raise CorruptStateError("invalid snappy stream identifier", source, offset + pos)
        elif 0x02 <= ctype <= 0x7F:
            raise CorruptStateError(
                f"reserved unskippable snappy chunk type {ctype:#x}", source, offset + pos
            )
        else:  # 0x80..0xFE: skippable in the framing format, but Flink never writes one
            raise CorruptStateError(
                f"snappy chunk type {ctype:#x} (skippable padding) never appears in Flink's "
                "streams: a corrupt chunk header",
                source,
                offset + pos,
            )
        pos = body + length


def _raw_length(data: bytes, pos: int, end: int) -> int | None:
    """The uncompressed length varint at the start of a raw snappy block."""
    result = shift = 0
    while pos < end and shift <= 28:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result
        shift += 7
    return None


def decompress_chunks_indexed(
    data: bytes, source: str, offset: int
) -> tuple[bytes, dict[int, int]]:
    """Decompress the chunks in ``data`` (a stream identifier may or may not lead).

    Returns the decompressed bytes and a map from each chunk's file offset (``offset`` + its
    position in ``data``) to the position of its first byte in the decompressed output. Operator
    state offsets (taken after a flush) are chunk boundaries, so they are keys of that map.
    """
    _validate_chunks(data, source, offset)
    out = bytearray()
    index: dict[int, int] = {}
    pos, n = 0, len(data)
    while pos < n:
        ctype = data[pos]
        length = data[pos + 1] | (data[pos + 2] << 8) | (data[pos + 3] << 16)
        body = pos + 4
        index[offset + pos] = len(out)
        if ctype in (0x00, 0x01):
            chunk = data[pos : body + length]
            try:
                # a one-chunk framed stream: cramjam verifies the chunk's checksum
                out += cramjam.snappy.decompress(STREAM_IDENTIFIER + chunk)
            except cramjam.DecompressionError as e:
                raise CorruptStateError(f"corrupt snappy chunk: {e}", source, offset + pos) from e
        pos = body + length
    index[offset + n] = len(out)
    return bytes(out), index
