"""A decoder mirroring Java's ``DataInputView`` over bytes in memory.

Every multi-byte value is big-endian (Flink's ``DataOutputView``). Each ``read_*`` checks the bytes
that remain first and raises :class:`~statequery.exceptions.CorruptStateError` naming the source and
the absolute offset, so a truncated or corrupt file never yields a wrong value or a huge allocation.
"""

from __future__ import annotations

import struct

from statequery.exceptions import CorruptStateError

__all__ = ["Decoder", "decode_modified_utf8"]

_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")


def decode_modified_utf8(data: bytes) -> str:
    """Java's modified UTF-8 (``writeUTF``): ``C0 80`` is NUL, supplementary chars are CESU-8 pairs."""
    if b"\xc0\x80" in data:
        data = data.replace(b"\xc0\x80", b"\x00")
    text = data.decode("utf-8", "surrogatepass")
    if any("\ud800" <= ch <= "\udfff" for ch in text):
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


class Decoder:
    """Reads Flink's primitive encodings from ``buf[pos:end]``.

    ``source`` names the file or handle for errors; ``base_offset`` is the absolute position of
    ``buf[0]`` in that source, so errors report file offsets even for a slice.
    """

    __slots__ = ("base_offset", "buf", "end", "pos", "source")

    def __init__(
        self,
        buf: bytes,
        pos: int = 0,
        end: int | None = None,
        source: str = "<bytes>",
        base_offset: int = 0,
    ) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end
        self.source = source
        self.base_offset = base_offset

    # -- position ------------------------------------------------------------------------------

    @property
    def offset(self) -> int:
        """The absolute offset of the next byte in the source."""
        return self.base_offset + self.pos

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def at_end(self) -> bool:
        return self.pos >= self.end

    def error(self, message: str, pos: int | None = None) -> CorruptStateError:
        return CorruptStateError(
            message, self.source, self.base_offset + (self.pos if pos is None else pos)
        )

    def _need(self, n: int) -> int:
        pos = self.pos
        if n < 0:
            raise self.error(f"negative length {n}")
        if pos + n > self.end:
            raise self.error(f"needs {n} bytes, only {self.end - pos} left (truncated?)")
        self.pos = pos + n
        return pos

    def check_length(self, n: int, what: str = "length", min_bytes_each: int = 1) -> int:
        """Validate a count read from the data against the bytes that remain (no huge allocations)."""
        if n < 0:
            raise self.error(f"negative {what} {n}")
        if n * min_bytes_each > self.end - self.pos:
            raise self.error(f"{what} {n} exceeds the {self.end - self.pos} bytes left")
        return n

    # -- primitives ----------------------------------------------------------------------------

    def read_bytes(self, n: int) -> bytes:
        pos = self._need(n)
        return bytes(self.buf[pos : pos + n])

    def skip(self, n: int) -> None:
        self._need(n)

    def read_byte(self) -> int:
        pos = self._need(1)
        b = self.buf[pos]
        return b - 256 if b > 127 else b

    def read_ubyte(self) -> int:
        pos = self._need(1)
        return self.buf[pos]

    def read_bool(self) -> bool:
        pos = self._need(1)
        return self.buf[pos] != 0

    def read_short(self) -> int:
        pos = self._need(2)
        return _I16.unpack_from(self.buf, pos)[0]  # type: ignore[no-any-return]

    def read_ushort(self) -> int:
        pos = self._need(2)
        return _U16.unpack_from(self.buf, pos)[0]  # type: ignore[no-any-return]

    def read_char(self) -> str:
        return chr(self.read_ushort())

    def read_int(self) -> int:
        pos = self._need(4)
        return _I32.unpack_from(self.buf, pos)[0]  # type: ignore[no-any-return]

    def read_long(self) -> int:
        pos = self._need(8)
        return _I64.unpack_from(self.buf, pos)[0]  # type: ignore[no-any-return]

    def read_float(self) -> float:
        pos = self._need(4)
        return _F32.unpack_from(self.buf, pos)[0]  # type: ignore[no-any-return]

    def read_double(self) -> float:
        pos = self._need(8)
        return _F64.unpack_from(self.buf, pos)[0]  # type: ignore[no-any-return]

    def read_utf(self) -> str:
        """``DataInput.readUTF``: unsigned 16-bit length, then modified UTF-8."""
        n = self.read_ushort()
        start = self.pos
        pos = self._need(n)
        try:
            return decode_modified_utf8(bytes(self.buf[pos : pos + n]))
        except UnicodeDecodeError as e:
            raise self.error(f"invalid modified UTF-8 string: {e}", start) from e

    def read_varint(self) -> int:
        """An unsigned LEB128 int (7 bits per byte, low first), as ``StringValue`` writes them."""
        buf, pos, end = self.buf, self.pos, self.end
        result = shift = 0
        while True:
            if pos >= end:
                self.pos = pos
                raise self.error("varint runs past the end of the data")
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
            if shift > 35:
                self.pos = pos
                raise self.error("varint longer than 5 bytes")
        self.pos = pos
        return result

    def read_string_value(self) -> str | None:
        """``StringValue.writeString`` (Flink's ``StringSerializer``): None for a null string."""
        n = self.read_varint()
        if n == 0:
            return None
        n -= 1
        buf, pos, end = self.buf, self.pos, self.end
        # fast path: pure ASCII needs exactly one byte per code unit
        if pos + n <= end:
            chunk = buf[pos : pos + n]
            if chunk.isascii():
                self.pos = pos + n
                return chunk.decode("ascii") if isinstance(chunk, bytes) else bytes(chunk).decode()
        units = []
        append = units.append
        for _ in range(n):
            if pos >= end:
                self.pos = pos
                raise self.error("string runs past the end of the data")
            c = buf[pos]
            pos += 1
            if c >= 0x80:
                shift = 7
                c &= 0x7F
                while True:
                    if pos >= end:
                        self.pos = pos
                        raise self.error("string runs past the end of the data")
                    b = buf[pos]
                    pos += 1
                    c |= (b & 0x7F) << shift
                    if b < 0x80:
                        break
                    shift += 7
                    if shift > 14:
                        self.pos = pos
                        raise self.error("string code unit longer than 3 bytes")
            append(c)
        self.pos = pos
        raw = struct.pack(f">{len(units)}H", *units)
        return raw.decode("utf-16-be", "surrogatepass").encode("utf-16", "surrogatepass").decode(
            "utf-16", "replace"
        )

    def sub(self, n: int) -> Decoder:
        """A decoder over the next ``n`` bytes (consumed here), keeping absolute offsets."""
        pos = self._need(n)
        return Decoder(self.buf, pos, pos + n, self.source, self.base_offset)
