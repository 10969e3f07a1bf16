"""A decoder mirroring Java's ``DataInputView`` over bytes in memory.

Every multi-byte value is big-endian (Flink's ``DataOutputView``). Each ``read_*`` checks the bytes
that remain first and raises :class:`~statequery.exceptions.CorruptStateError` naming the source and
the absolute offset, so a truncated or corrupt file never yields a wrong value or a huge allocation.
"""

from __future__ import annotations

import struct

from statequery.exceptions import CorruptStateError

__all__ = [
    "DecodeError",
    "Decoder",
    "decode_modified_utf8",
    "read_string_value",
    "utf16_units_to_str",
]

_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")


def _replace_lone_surrogates(text: str) -> str:
    """Lone surrogates (legal in Java strings, not in UTF-8/Arrow) become U+FFFD."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def decode_modified_utf8(data: bytes) -> str:
    """Java's modified UTF-8 (``writeUTF``).

    ``C0 80`` is NUL and supplementary characters are CESU-8 surrogate pairs.
    """
    if b"\xc0\x80" in data:
        data = data.replace(b"\xc0\x80", b"\x00")
    text = data.decode("utf-8", "surrogatepass")
    if any("\ud800" <= ch <= "\udfff" for ch in text):
        text = _replace_lone_surrogates(text)
    return text


class DecodeError(Exception):
    """Bytes that cannot be what the serializer wrote; ``pos`` is the position in the buffer."""

    def __init__(self, message: str, pos: int) -> None:
        super().__init__(message)
        self.message = message
        self.pos = pos


def utf16_units_to_str(units: list[int]) -> str:
    """A Java string from its UTF-16 code units."""
    raw = struct.pack(f">{len(units)}H", *units)
    return _replace_lone_surrogates(raw.decode("utf-16-be", "surrogatepass"))


def read_string_value(buf: bytes, pos: int, end: int) -> tuple[str | None, int]:
    """``StringValue.writeString``: varint (length+1, 0 = null), then one varint per UTF-16 unit."""
    b = buf[pos]
    pos += 1
    if b < 0x80:
        if b == 0:
            return None, pos
        n = b - 1
        e = pos + n
        if e <= end:
            chunk = buf[pos:e]
            if chunk.isascii():  # every byte < 0x80 is one code unit
                return chunk.decode("ascii"), e
    else:
        n = b & 0x7F
        shift = 7
        while True:
            if pos >= end:
                raise DecodeError("string length runs past the end of the data", pos)
            b = buf[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
            if shift > 28:
                raise DecodeError("string length varint longer than 5 bytes", pos)
        n -= 1
        if n < 0:
            return None, pos
        e = pos + n
        if e <= end:
            chunk = buf[pos:e]
            if chunk.isascii():
                return chunk.decode("ascii"), e
    if n > end - pos:
        raise DecodeError(f"string of {n} chars exceeds the {end - pos} bytes left", pos)
    units: list[int] = []
    append = units.append
    for _ in range(n):
        c = buf[pos]
        pos += 1
        if c >= 0x80:
            c &= 0x7F
            shift = 7
            while True:
                if pos >= end:
                    raise DecodeError("string runs past the end of the data", pos)
                b = buf[pos]
                pos += 1
                c |= (b & 0x7F) << shift
                if b < 0x80:
                    break
                shift += 7
                if shift > 14:
                    raise DecodeError("string code unit longer than 3 bytes", pos)
            if c > 0xFFFF:
                raise DecodeError(f"string code unit {c:#x} out of range", pos)
        append(c)
    if pos > end:
        raise DecodeError("string runs past the end of the data", pos)
    return utf16_units_to_str(units), pos


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
        """Check a count read from the data against the bytes that remain (no huge allocations)."""
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
        start = self.pos
        try:
            value, pos = read_string_value(self.buf, start, self.end)
        except DecodeError as e:
            raise self.error(e.message, e.pos) from e
        except IndexError as e:
            raise self.error("string runs past the end of the data", start) from e
        if pos > self.end:
            raise self.error("string runs past the end of the data", start)
        self.pos = pos
        return value

    def sub(self, n: int) -> Decoder:
        """A decoder over the next ``n`` bytes (consumed here), keeping absolute offsets."""
        pos = self._need(n)
        return Decoder(self.buf, pos, pos + n, self.source, self.base_offset)
