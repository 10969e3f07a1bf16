"""Value readers: a :class:`~statequery.serializers.spec.SerializerSpec` -> bytes -> Python values.

The resolver (:func:`reader_for`) walks a spec once per state and builds a tree of small
:class:`Reader` nodes. Each node carries two plain functions specialised for its spec:

``read_at(buf, pos, end) -> (value, new_pos)``
    decode one value starting at ``buf[pos]``; ``end`` bounds variable-length data (counts and
    lengths read from the bytes are checked against it before anything is allocated).
``skip_at(buf, pos, end) -> new_pos``
    the same without building the value.

Fixed-size primitives do not check ``end`` themselves: callers that decode a delimited slot (a
key or a value of known length) check afterwards that exactly the slot was consumed, so a value
that would run past its slot is reported as corrupt, never returned. Errors inside a reader raise
:class:`DecodeError` (or ``struct.error``/``IndexError`` from the primitive unpacks); the backends
turn those into :class:`~statequery.exceptions.CorruptStateError` naming file, key group and
offset.

Values are ready for Arrow (see :mod:`statequery.arrow`): ints, floats, str, bytes, ``Decimal``,
dicts for structs (Tuple, Row, POJO, RowData), lists, and lists of ``(key, value)`` tuples for
maps. Temporal values are integers in the unit of their Arrow type (documented per type in
``docs/decoding.md``).

Layouts follow Flink's serializers: ``org.apache.flink.api.common.typeutils.base.*``,
``org.apache.flink.api.java.typeutils.runtime.*``, ``org.apache.flink.types.StringValue`` and the
table runtime's ``BinaryRowData``/``BinaryArrayData``/``BinaryMapData`` (little-endian inside).
"""

from __future__ import annotations

import decimal
import struct
from collections.abc import Callable
from typing import Any

from statequery.decoder import DecodeError, Decoder, read_string_value
from statequery.exceptions import CorruptStateError, UnsupportedFormatError
from statequery.serializers.spec import (
    ROW_KINDS,
    ArrayDataSpec,
    AvroSpec,
    EitherSpec,
    EnumSpec,
    GenericArraySpec,
    LinkedListSpec,
    ListSpec,
    MapDataSpec,
    MapSpec,
    NamespaceSpec,
    NullableSpec,
    OpaqueSpec,
    OptionalSpec,
    PojoSpec,
    PrimitiveArraySpec,
    PrimitiveSpec,
    RawValueSpec,
    RowDataSpec,
    RowSpec,
    SerializerSpec,
    SqlType,
    StructSpec,
    TimerSpec,
    TtlSpec,
    TupleSpec,
    WindowKeySpec,
)

__all__ = [
    "DECODE_ERRORS",
    "DecodeError",
    "Reader",
    "ReadAt",
    "SkipAt",
    "decode_binary_row",
    "reader_for",
    "row_data_decoder",
    "sql_value_decoder",
]

ReadAt = Callable[[bytes, int, int], tuple[Any, int]]
SkipAt = Callable[[bytes, int, int], int]


#: Every exception a reader can raise on bad bytes (the backends catch exactly these).
DECODE_ERRORS = (DecodeError, struct.error, IndexError, ValueError, OverflowError, KeyError)


# -- struct helpers ---------------------------------------------------------------------------

_BE_I8 = struct.Struct(">b").unpack_from
_BE_I16 = struct.Struct(">h").unpack_from
_BE_U16 = struct.Struct(">H").unpack_from
_BE_I32 = struct.Struct(">i").unpack_from
_BE_I64 = struct.Struct(">q").unpack_from
_BE_F32 = struct.Struct(">f").unpack_from
_BE_F64 = struct.Struct(">d").unpack_from
_BE_I64_I32 = struct.Struct(">qi").unpack_from
_BE_I32_B_B = struct.Struct(">ibb").unpack_from
_BE_B_B_B_I32 = struct.Struct(">bbbi").unpack_from

_LE_I8 = struct.Struct("<b").unpack_from
_LE_I16 = struct.Struct("<h").unpack_from
_LE_I32 = struct.Struct("<i").unpack_from
_LE_I64 = struct.Struct("<q").unpack_from
_LE_U64 = struct.Struct("<Q").unpack_from
_LE_F32 = struct.Struct("<f").unpack_from
_LE_F64 = struct.Struct("<d").unpack_from

_DEC_CTX = decimal.Context(prec=200, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)
_LONG_MIN = -(1 << 63)
_LONG_MAX = (1 << 63) - 1
_INT_MIN = -(1 << 31)

# the largest element count accepted for zero-byte elements (cannot be checked against bytes)
_MAX_ZERO_SIZE_COUNT = 1 << 20


def _check_count(n: int, min_size: int, pos: int, end: int, what: str) -> None:
    """A count read from the data must fit in the bytes that remain (no huge allocations)."""
    if n < 0:
        raise DecodeError(f"negative {what} {n}", pos)
    if min_size > 0:
        if n * min_size > end - pos:
            raise DecodeError(f"{what} {n} exceeds the {end - pos} bytes left", pos)
    elif n > _MAX_ZERO_SIZE_COUNT:
        raise DecodeError(f"{what} {n} is implausibly large", pos)


def _checked_i64(value: int, pos: int, what: str) -> int:
    """A temporal value scaled to its Arrow unit must still fit Arrow's 64-bit integer."""
    if not _LONG_MIN <= value <= _LONG_MAX:
        raise DecodeError(f"{what} {value} is out of the 64-bit range of its Arrow type", pos)
    return value


def _checked_decimal(unscaled: int, precision: int, scale: int, pos: int) -> decimal.Decimal:
    """A DECIMAL(p, s) value; an unscaled value with more than p digits is corrupt data."""
    if not -(10**precision) < unscaled < 10**precision:
        raise DecodeError(f"decimal unscaled value {unscaled} exceeds DECIMAL({precision}, "
                          f"{scale})", pos)
    return decimal.Decimal(unscaled).scaleb(-scale, _DEC_CTX)


def _decimal(unscaled: int, scale: int) -> decimal.Decimal:
    return decimal.Decimal(unscaled).scaleb(-scale, _DEC_CTX)


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (any year, like java.time.LocalDate)."""
    if not (1 <= m <= 12 and 1 <= d <= 31):
        raise ValueError(f"invalid date {y}-{m}-{d}")
    y -= m <= 2
    era = y // 400  # floor division (Hinnant's C code adjusts truncation for negative years)
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _civil_from_days(z: int) -> tuple[int, int, int]:
    """The proleptic Gregorian (year, month, day) of ``z`` days since 1970-01-01 (any year)."""
    z += 719468
    era = z // 146097  # floor division, as in _days_from_civil
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    y = yoe + era * 400
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + (3 if mp < 10 else -9)
    return y + (m <= 2), m, d


def sql_timestamp_text(millis: int, nanos_of_milli: int, precision: int, utc: bool) -> str:
    """A TIMESTAMP(7..9) value as Flink's SQL prints it, exactly: ``YYYY-MM-DD HH:MM:SS.`` and
    ``precision`` fraction digits (``Z`` after a TIMESTAMP_LTZ, an instant in UTC).

    Arrow's nanosecond timestamps end in 1677 and 2262 and Spark's hold microseconds, while
    Flink's TIMESTAMP(9) spans years 0000 to 9999 in nanoseconds: the fixed-width text is exact
    over the whole range and sorts and compares as the timestamps do (docs/decoding.md)."""
    days, ms = divmod(millis, 86_400_000)
    y, mo, d = _civil_from_days(days)
    frac = (ms % 1000) * 1_000_000 + nanos_of_milli
    secs = ms // 1000
    text = (
        f"{y:04d}-{mo:02d}-{d:02d} {secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"
        f".{frac:09d}"[: 20 + precision]
    )
    return text + "Z" if utc else text


# -- the Reader node ---------------------------------------------------------------------------


class Reader:
    """A decoder of one serializer's values (see the module docstring for the two functions).

    ``fixed_size`` is the byte length when it is fixed (else None), ``min_size`` the fewest bytes
    one value can take, ``greedy`` whether the value extends to the end of its slot (opaque
    serializers: only decodable where a slot's end is known).
    """

    __slots__ = ("_slot", "fixed_size", "greedy", "min_size", "read_at", "skip_at", "spec")

    def __init__(
        self,
        spec: SerializerSpec | None,
        read_at: ReadAt,
        skip_at: SkipAt | None = None,
        fixed_size: int | None = None,
        min_size: int = 0,
        greedy: bool = False,
    ) -> None:
        self.spec = spec
        self.read_at = read_at
        self.fixed_size = fixed_size
        self.min_size = fixed_size if fixed_size is not None else min_size
        self.greedy = greedy
        if skip_at is None:
            if fixed_size is not None:
                n = fixed_size

                def skip_at(buf: bytes, pos: int, end: int) -> int:
                    return pos + n

            else:

                def skip_at(buf: bytes, pos: int, end: int) -> int:
                    return read_at(buf, pos, end)[1]

        self.skip_at = skip_at
        self._slot: Callable[[bytes, int, int], Any] | None = None

    @property
    def slot(self) -> Callable[[bytes, int, int], Any]:
        """``slot(buf, start, end) -> value`` for a value that must fill ``buf[start:end]``.

        Specialised for the common scalars (one unpack and a length check); raises
        :class:`DecodeError` when the value does not use exactly the slot.
        """
        if self._slot is None:
            self._slot = _make_slot(self)
        return self._slot

    def __repr__(self) -> str:
        return f"Reader({self.spec!r})"

    def read(self, decoder: Decoder) -> Any:
        """Read one value from a :class:`~statequery.decoder.Decoder` (bounds-checked)."""
        start = decoder.pos
        try:
            value, pos = self.read_at(decoder.buf, start, decoder.end)
        except DecodeError as e:
            raise decoder.error(e.message, e.pos) from e
        except DECODE_ERRORS as e:
            raise decoder.error(f"cannot decode {self._what()}: {e}", start) from e
        if pos > decoder.end:
            raise decoder.error(f"{self._what()} runs past the end of the data", start)
        decoder.pos = pos
        return value

    def skip(self, decoder: Decoder) -> None:
        start = decoder.pos
        try:
            pos = self.skip_at(decoder.buf, start, decoder.end)
        except DecodeError as e:
            raise decoder.error(e.message, e.pos) from e
        except DECODE_ERRORS as e:
            raise decoder.error(f"cannot decode {self._what()}: {e}", start) from e
        if pos > decoder.end:
            raise decoder.error(f"{self._what()} runs past the end of the data", start)
        decoder.pos = pos

    def read_slot(self, buf: bytes, start: int, end: int) -> Any:
        """Decode a value that must fill ``buf[start:end]`` exactly (else DecodeError)."""
        value, pos = self.read_at(buf, start, end)
        if pos != end:
            raise DecodeError(
                f"{self._what()} used {pos - start} of its {end - start} bytes", start
            )
        return value

    def _what(self) -> str:
        return self.spec.display if self.spec is not None else "value"


_SLOT_STRUCTS = {
    "long": ">q",
    "int": ">i",
    "short": ">h",
    "byte": ">b",
    "double": ">d",
    "float": ">f",
}


def _make_slot(reader: Reader) -> Callable[[bytes, int, int], Any]:
    spec = reader.spec
    read_at = reader.read_at
    if isinstance(spec, PrimitiveSpec):
        name = primitive_name(spec.name)
        fmt = _SLOT_STRUCTS.get(name)
        if fmt is not None:
            unpack = struct.Struct(fmt).unpack_from
            size = struct.calcsize(fmt)

            def fixed_slot(buf: bytes, start: int, end: int) -> Any:
                if end - start != size:
                    raise DecodeError(
                        f"{name} value of {end - start} bytes ({size} expected)", start
                    )
                return unpack(buf, start)[0]

            return fixed_slot
        if name == "string":

            def string_slot(buf: bytes, start: int, end: int) -> Any:
                b = buf[start]
                if 0 < b < 0x80 and b == end - start:
                    chunk = buf[start + 1 : end]
                    if chunk.isascii():
                        return chunk.decode("ascii")
                v, p = read_string_value(buf, start, end)
                if p != end:
                    raise DecodeError(f"string used {p - start} of its {end - start} bytes", start)
                return v

            return string_slot
    if isinstance(spec, RowDataSpec):
        decode_row = _spec_row_decoder(spec)

        def row_slot(buf: bytes, start: int, end: int) -> Any:
            """SQL keys: int32 size, then exactly that many BinaryRowData bytes."""
            if end - start < 4 or _BE_I32(buf, start)[0] != end - start - 4:
                raise DecodeError(f"RowData size prefix does not match its {end - start}-byte "
                                  "slot", start)
            return decode_row(buf, start + 4, end - start - 4)

        return row_slot
    what = reader._what()

    def generic_slot(buf: bytes, start: int, end: int) -> Any:
        v, p = read_at(buf, start, end)
        if p != end:
            raise DecodeError(f"{what} used {p - start} of its {end - start} bytes", start)
        return v

    return generic_slot


def _fixed(spec: SerializerSpec | None, size: int, read_at: ReadAt) -> Reader:
    return Reader(spec, read_at, fixed_size=size)


# -- scalars ------------------------------------------------------------------------------------


def _read_bool(buf: bytes, pos: int, end: int) -> tuple[bool, int]:
    return buf[pos] != 0, pos + 1


def _read_byte(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    return _BE_I8(buf, pos)[0], pos + 1


def _read_short(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    return _BE_I16(buf, pos)[0], pos + 2


def _read_int(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    return _BE_I32(buf, pos)[0], pos + 4


def _read_long(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    return _BE_I64(buf, pos)[0], pos + 8


def _read_float(buf: bytes, pos: int, end: int) -> tuple[float, int]:
    return _BE_F32(buf, pos)[0], pos + 4


def _read_double(buf: bytes, pos: int, end: int) -> tuple[float, int]:
    return _BE_F64(buf, pos)[0], pos + 8


def _char(unit: int) -> str:
    return "\ufffd" if 0xD800 <= unit <= 0xDFFF else chr(unit)


def _read_char(buf: bytes, pos: int, end: int) -> tuple[str, int]:
    return _char(_BE_U16(buf, pos)[0]), pos + 2


def _read_void(buf: bytes, pos: int, end: int) -> tuple[None, int]:
    buf[pos]  # noqa: B018  (bounds check: VoidSerializer writes one byte)
    return None, pos + 1


def _read_nothing(buf: bytes, pos: int, end: int) -> tuple[None, int]:
    return None, pos


def _skip_string_value(buf: bytes, pos: int, end: int) -> int:
    return read_string_value(buf, pos, end)[1]


def _read_big_integer(buf: bytes, pos: int, end: int) -> tuple[int | None, int]:
    """``BigIntSerializer.writeBigInteger``: int32 tag (0 null, 1 ZERO, 2 ONE, 3 TEN, len+4)."""
    tag = _BE_I32(buf, pos)[0]
    pos += 4
    if tag == 0:
        return None, pos
    if tag == 1:
        return 0, pos
    if tag == 2:
        return 1, pos
    if tag == 3:
        return 10, pos
    n = tag - 4
    if n < 0 or pos + n > end:
        raise DecodeError(f"BigInteger of {n} bytes exceeds the {end - pos} bytes left", pos - 4)
    return int.from_bytes(buf[pos : pos + n], "big", signed=True), pos + n


def _read_bigint_str(buf: bytes, pos: int, end: int) -> tuple[str | None, int]:
    v, pos = _read_big_integer(buf, pos, end)
    return (None if v is None else str(v)), pos


def _plain_decimal(unscaled: int, scale: int) -> str:
    """``BigDecimal.toPlainString``."""
    sign = "-" if unscaled < 0 else ""
    digits = str(abs(unscaled))
    if scale <= 0:
        return sign + digits + ("0" * -scale if unscaled != 0 else "")
    if len(digits) <= scale:
        digits = "0" * (scale - len(digits) + 1) + digits
    return f"{sign}{digits[:-scale]}.{digits[-scale:]}"


def _read_bigdec_str(buf: bytes, pos: int, end: int) -> tuple[str | None, int]:
    v, pos = _read_big_integer(buf, pos, end)
    if v is None:
        return None, pos
    scale = _BE_I32(buf, pos)[0]
    return _plain_decimal(v, scale), pos + 4


def _read_date_millis(buf: bytes, pos: int, end: int) -> tuple[int | None, int]:
    v = _BE_I64(buf, pos)[0]
    return (None if v == _LONG_MIN else v), pos + 8


def _read_sql_timestamp(buf: bytes, pos: int, end: int) -> tuple[int | None, int]:
    millis, nanos = _BE_I64_I32(buf, pos)
    if millis == _LONG_MIN:
        return None, pos + 12
    return _checked_i64((millis // 1000) * 1_000_000_000 + nanos, pos, "Timestamp"), pos + 12


def _read_instant(buf: bytes, pos: int, end: int) -> tuple[int | None, int]:
    seconds, nanos = _BE_I64_I32(buf, pos)
    if seconds == _LONG_MIN and nanos == _INT_MIN:
        return None, pos + 12
    return _checked_i64(seconds * 1_000_000_000 + nanos, pos, "Instant"), pos + 12


def _local_date_days(buf: bytes, pos: int) -> int | None:
    year, month, day = _BE_I32_B_B(buf, pos)
    if year == _INT_MIN:
        return None
    return _days_from_civil(year, month, day)


def _local_time_nanos(buf: bytes, pos: int) -> int | None:
    h, m, s, nano = _BE_B_B_B_I32(buf, pos)
    if h == -128:
        return None
    if not (0 <= h < 24 and 0 <= m < 60 and 0 <= s < 60 and 0 <= nano < 1_000_000_000):
        raise DecodeError(f"invalid LocalTime {h}:{m}:{s}.{nano}", pos)
    return int(((h * 60 + m) * 60 + s) * 1_000_000_000 + nano)


def _read_local_date(buf: bytes, pos: int, end: int) -> tuple[int | None, int]:
    return _local_date_days(buf, pos), pos + 6


def _read_local_time(buf: bytes, pos: int, end: int) -> tuple[int | None, int]:
    return _local_time_nanos(buf, pos), pos + 7


def _read_local_date_time(buf: bytes, pos: int, end: int) -> tuple[int | None, int]:
    days = _local_date_days(buf, pos)
    nanos = _local_time_nanos(buf, pos + 6)
    if days is None or nanos is None:
        return None, pos + 13
    return _checked_i64(days * 86_400_000_000_000 + nanos, pos, "LocalDateTime"), pos + 13


def _read_string_data(buf: bytes, pos: int, end: int) -> tuple[str, int]:
    n = _BE_I32(buf, pos)[0]
    pos += 4
    if n < 0 or pos + n > end:
        raise DecodeError(f"string of {n} bytes exceeds the {end - pos} bytes left", pos - 4)
    return buf[pos : pos + n].decode("utf-8"), pos + n


def _read_bytes(buf: bytes, pos: int, end: int) -> tuple[bytes, int]:
    """``BytePrimitiveArraySerializer``: int32 n + n bytes."""
    n = _BE_I32(buf, pos)[0]
    pos += 4
    if n < 0 or pos + n > end:
        raise DecodeError(f"byte array of {n} bytes exceeds the {end - pos} bytes left", pos - 4)
    return buf[pos : pos + n], pos + n


def _skip_bytes(buf: bytes, pos: int, end: int) -> int:
    n = _BE_I32(buf, pos)[0]
    if n < 0 or pos + 4 + n > end:
        raise DecodeError(f"byte array of {n} bytes exceeds the {end - pos - 4} bytes left", pos)
    return int(pos + 4 + n)


def _decimal_data_reader(spec: PrimitiveSpec) -> Reader:
    precision = spec.precision if spec.precision is not None else 38
    scale = spec.scale or 0
    if precision <= 18:

        def read_compact(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
            return _checked_decimal(_BE_I64(buf, pos)[0], precision, scale, pos), pos + 8

        return _fixed(spec, 8, read_compact)

    def read_big(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        n = _BE_I32(buf, pos)[0]
        pos += 4
        if n < 0 or n > 64 or pos + n > end:
            raise DecodeError(f"decimal of {n} bytes is impossible here", pos - 4)
        unscaled = int.from_bytes(buf[pos : pos + n], "big", signed=True)
        return _checked_decimal(unscaled, precision, scale, pos), pos + n

    return Reader(spec, read_big, min_size=4)


def timestamp_unit(precision: int | None) -> str | None:
    """The Arrow unit statequery uses for a SQL timestamp of this precision; None above 6
    digits (the value is text, :func:`sql_timestamp_text`)."""
    p = 6 if precision is None else precision
    return "ms" if p <= 3 else "us" if p <= 6 else None


def _timestamp_data_reader(spec: PrimitiveSpec) -> Reader:
    precision = spec.precision if spec.precision is not None else 6
    if precision <= 3:
        return _fixed(spec, 8, _read_long)
    if precision <= 6:

        def read_us(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
            millis, nanos = _BE_I64_I32(buf, pos)
            return _checked_i64(millis * 1000 + nanos // 1000, pos, "TimestampData"), pos + 12

        return _fixed(spec, 12, read_us)

    def read_text(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        millis, nanos = _BE_I64_I32(buf, pos)
        if not 0 <= nanos < 1_000_000:
            raise DecodeError(f"TimestampData with {nanos} nanoseconds of millisecond", pos)
        return sql_timestamp_text(millis, nanos, precision, False), pos + 12

    return _fixed(spec, 12, read_text)


_PRIMITIVES: dict[str, tuple[ReadAt, int | None, int]] = {
    # name: (read_at, fixed size, min size)
    "boolean": (_read_bool, 1, 1),
    "byte": (_read_byte, 1, 1),
    "short": (_read_short, 2, 2),
    "int": (_read_int, 4, 4),
    "long": (_read_long, 8, 8),
    "float": (_read_float, 4, 4),
    "double": (_read_double, 8, 8),
    "char": (_read_char, 2, 2),
    "string": (read_string_value, None, 1),
    "void": (_read_void, 1, 1),
    "bigint": (_read_bigint_str, None, 4),
    "bigdec": (_read_bigdec_str, None, 4),
    "date": (_read_date_millis, 8, 8),
    "sql_date": (_read_date_millis, 8, 8),
    "sql_time": (_read_date_millis, 8, 8),
    "sql_timestamp": (_read_sql_timestamp, 12, 12),
    "instant": (_read_instant, 12, 12),
    "local_date": (_read_local_date, 6, 6),
    "local_time": (_read_local_time, 7, 7),
    "local_date_time": (_read_local_date_time, 13, 13),
    "string_data": (_read_string_data, None, 4),
    "bytes": (_read_bytes, None, 4),
    "null_value": (_read_nothing, 0, 0),
}

# types.*Value (ValueSerializer family): the same payloads as the boxed serializers
_VALUE_ALIASES = {
    "boolean_value": "boolean",
    "byte_value": "byte",
    "short_value": "short",
    "int_value": "int",
    "long_value": "long",
    "float_value": "float",
    "double_value": "double",
    "char_value": "char",
    "string_value": "string",
}


def primitive_name(name: str) -> str:
    """The canonical primitive name (``long_value`` -> ``long``)."""
    return _VALUE_ALIASES.get(name, name)


def _primitive_reader(spec: PrimitiveSpec) -> Reader:
    name = primitive_name(spec.name)
    if name == "decimal_data":
        return _decimal_data_reader(spec)
    if name == "timestamp_data":
        return _timestamp_data_reader(spec)
    try:
        read_at, fixed, min_size = _PRIMITIVES[name]
    except KeyError:
        raise UnsupportedFormatError(
            f"no reader for primitive serializer {spec.name!r} (snapshot {spec.snapshot_class}); "
            f"supported: {', '.join(sorted(_PRIMITIVES))}, decimal_data, timestamp_data"
        ) from None
    skip_at = _skip_string_value if name == "string" else _skip_bytes if name == "bytes" else None
    return Reader(spec, read_at, skip_at, fixed_size=fixed, min_size=min_size)


def _primitive_array_reader(spec: PrimitiveArraySpec) -> Reader:
    element = primitive_name(spec.element)
    if element == "byte":
        return Reader(spec, _read_bytes, _skip_bytes, min_size=4)
    try:
        elem_read, elem_fixed, elem_min = _PRIMITIVES[element]
    except KeyError:
        raise UnsupportedFormatError(f"no reader for {element}[] arrays") from None
    if elem_fixed is not None:
        fmt = {
            "boolean": None,
            "short": "h",
            "int": "i",
            "long": "q",
            "float": "f",
            "double": "d",
            "char": "H",
        }.get(element)
        size = elem_fixed
        if fmt is not None:
            cache: dict[int, Callable[[bytes, int], tuple[Any, ...]]] = {}

            def read_fixed_array(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
                n = _BE_I32(buf, pos)[0]
                pos += 4
                _check_count(n, size, pos, end, "array length")
                unpack = cache.get(n)
                if unpack is None:
                    unpack = struct.Struct(f">{n}{fmt}").unpack_from
                    if len(cache) < 64:
                        cache[n] = unpack
                values = list(unpack(buf, pos))
                if element == "char":
                    values = [_char(c) for c in values]
                return values, pos + n * size

            def skip_fixed_array(buf: bytes, pos: int, end: int) -> int:
                n = _BE_I32(buf, pos)[0]
                _check_count(n, size, pos + 4, end, "array length")
                return int(pos + 4 + n * size)

            return Reader(spec, read_fixed_array, skip_fixed_array, min_size=4)

    def read_array(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        n = _BE_I32(buf, pos)[0]
        pos += 4
        _check_count(n, elem_min, pos, end, "array length")
        out = []
        for _ in range(n):
            v, pos = elem_read(buf, pos, end)
            out.append(v)
        return out, pos

    return Reader(spec, read_array, min_size=4)


# -- namespaces, enums ---------------------------------------------------------------------------


def _namespace_reader(spec: NamespaceSpec) -> Reader:
    if spec.name in ("void", "global_window"):

        def read_void_ns(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
            if buf[pos] != 0:
                raise DecodeError(f"{spec.display} byte is {buf[pos]}, expected 0", pos)
            return None, pos + 1

        return _fixed(spec, 1, read_void_ns)
    if spec.name == "time_window":

        def read_window(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
            start, stop = _BE_WINDOW(buf, pos)
            return {"start": start, "end": stop}, pos + 16

        return _fixed(spec, 16, read_window)
    if spec.name == "count_window":
        return _fixed(spec, 8, _read_long)
    raise UnsupportedFormatError(f"unknown namespace serializer {spec.name!r}")


_BE_WINDOW = struct.Struct(">qq").unpack_from


def _enum_reader(spec: EnumSpec) -> Reader:
    constants = spec.constants
    n_constants = len(constants)

    def read_enum(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        i = _BE_I32(buf, pos)[0]
        if not 0 <= i < n_constants:
            raise DecodeError(
                f"enum index {i} outside the {n_constants} constants of {spec.class_name}", pos
            )
        return constants[i], pos + 4

    return _fixed(spec, 4, read_enum)


# -- composites (DataStream API) ---------------------------------------------------------------


def _struct_reader(spec: SerializerSpec, names: tuple[str, ...], children: list[Reader]) -> Reader:
    """Fields concatenated with no null flags (TupleSerializer, WindowKey...)."""
    _no_greedy_inside(spec, children)
    pairs = tuple(zip(names, (c.read_at for c in children), strict=True))
    fixed = (
        sum(c.fixed_size for c in children)  # type: ignore[misc]
        if all(c.fixed_size is not None for c in children)
        else None
    )
    skips = tuple(c.skip_at for c in children)
    if len(pairs) == 2:
        (n0, r0), (n1, r1) = pairs

        def read_pair(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
            v0, pos = r0(buf, pos, end)
            v1, pos = r1(buf, pos, end)
            return {n0: v0, n1: v1}, pos

        read_at = read_pair
    else:

        def read_fields(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
            out = {}
            for name, r in pairs:
                out[name], pos = r(buf, pos, end)
            return out, pos

        read_at = read_fields

    def skip_fields(buf: bytes, pos: int, end: int) -> int:
        for s in skips:
            pos = s(buf, pos, end)
        return pos

    return Reader(
        spec,
        read_at,
        None if fixed is not None else skip_fields,
        fixed_size=fixed,
        min_size=sum(c.min_size for c in children),
    )


def _no_greedy_inside(spec: SerializerSpec, children: list[Reader], last_ok: bool = False) -> None:
    for i, c in enumerate(children):
        if c.greedy and not (last_ok and i == len(children) - 1):
            raise UnsupportedFormatError(
                f"{spec.display}: a nested {c.spec.display if c.spec else 'opaque'} value cannot "
                "be delimited (no length prefix)"
            )


def _row_reader(spec: RowSpec) -> Reader:
    """``RowSerializer``: MSB-first null mask (2 RowKind bits first if supported), fields."""
    children = [reader_for(f) for f in spec.fields]
    _no_greedy_inside(spec, children)
    offset = 2 if spec.supports_row_kind else 0
    arity = len(children)
    mask_bytes = (offset + arity + 7) // 8
    items = tuple(
        (name, r.read_at, (offset + i) >> 3, 0x80 >> ((offset + i) & 7))
        for i, (name, r) in enumerate(zip(spec.field_names, children, strict=True))
    )

    def read_row(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        mask = buf[pos : pos + mask_bytes]
        if len(mask) != mask_bytes:
            raise DecodeError("row null mask runs past the end of the data", pos)
        pos += mask_bytes
        out: dict[str, Any] = {}
        for name, r, byte_i, bit in items:
            if mask[byte_i] & bit:
                out[name] = None
            else:
                out[name], pos = r(buf, pos, end)
        return out, pos

    return Reader(spec, read_row, min_size=mask_bytes)


_POJO_IS_NULL = 1
_POJO_NO_SUBCLASS = 2
_POJO_IS_SUBCLASS = 4
_POJO_IS_TAGGED_SUBCLASS = 8


def _pojo_reader(spec: PojoSpec) -> Reader:
    """``PojoSerializer``: flags byte, then per field (snapshot order) ``bool isNull`` + value."""
    items: list[tuple[str, ReadAt]] = []
    children: list[Reader] = []
    for f in spec.fields:
        if f.spec is None:
            raise UnsupportedFormatError(
                f"POJO {spec.class_name}: field {f.name} has no serializer in the snapshot"
            )
        r = reader_for(f.spec)
        children.append(r)
        items.append((f.name, r.read_at))
    _no_greedy_inside(spec, children)
    fields_t = tuple(items)
    class_name = spec.class_name

    def read_pojo(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        flags = buf[pos]
        pos += 1
        if flags == _POJO_NO_SUBCLASS:
            out: dict[str, Any] = {}
            for name, r in fields_t:
                if buf[pos]:
                    out[name] = None
                    pos += 1
                else:
                    out[name], pos = r(buf, pos + 1, end)
            return out, pos
        if flags & _POJO_IS_NULL:
            return None, pos
        if flags & (_POJO_IS_SUBCLASS | _POJO_IS_TAGGED_SUBCLASS):
            raise DecodeError(
                f"POJO {class_name} value written as a subclass (flags {flags}); subclass values "
                "are not decodable",
                pos - 1,
            )
        raise DecodeError(f"POJO {class_name}: invalid flags byte {flags}", pos - 1)

    return Reader(spec, read_pojo, min_size=1)


def _list_reader(spec: SerializerSpec, element: Reader) -> Reader:
    """``ListSerializer``/``ArrayListSerializer``/``SetSerializer``: int32 size + elements."""
    _no_greedy_inside(spec, [element])
    elem_read = element.read_at
    elem_min = element.min_size

    def read_list(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        n = _BE_I32(buf, pos)[0]
        pos += 4
        _check_count(n, elem_min, pos, end, "list size")
        out: list[Any] = []
        append = out.append
        for _ in range(n):
            v, pos = elem_read(buf, pos, end)
            append(v)
        return out, pos

    elem_skip = element.skip_at

    def skip_list(buf: bytes, pos: int, end: int) -> int:
        # the elements' own skips (a RowData is skipped by its size, not decoded): a state
        # nobody asked for cannot fail a read on a value its reader would reject
        n = _BE_I32(buf, pos)[0]
        pos += 4
        _check_count(n, elem_min, pos, end, "list size")
        for _ in range(n):
            pos = elem_skip(buf, pos, end)
        return pos

    return Reader(spec, read_list, skip_list, min_size=4)


def _map_reader(spec: MapSpec) -> Reader:
    """``MapSerializer``: int32 size, per entry key, ``bool isNull``, value if not null."""
    key = reader_for(spec.key)
    if spec.is_set or spec.value is None:
        return _list_reader(spec, key)
    value = reader_for(spec.value)
    _no_greedy_inside(spec, [key, value])
    key_read, value_read = key.read_at, value.read_at
    entry_min = key.min_size + 1

    def read_map(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        n = _BE_I32(buf, pos)[0]
        pos += 4
        _check_count(n, entry_min, pos, end, "map size")
        out: list[Any] = []
        append = out.append
        for _ in range(n):
            k, pos = key_read(buf, pos, end)
            if buf[pos]:
                append((k, None))
                pos += 1
            else:
                v, pos = value_read(buf, pos + 1, end)
                append((k, v))
        return out, pos

    key_skip, value_skip = key.skip_at, value.skip_at

    def skip_map(buf: bytes, pos: int, end: int) -> int:
        n = _BE_I32(buf, pos)[0]
        pos += 4
        _check_count(n, entry_min, pos, end, "map size")
        for _ in range(n):
            pos = key_skip(buf, pos, end)
            if buf[pos]:
                pos += 1
            else:
                pos = value_skip(buf, pos + 1, end)
        return pos

    return Reader(spec, read_map, skip_map, min_size=4)


def _generic_array_reader(spec: GenericArraySpec) -> Reader:
    """``GenericArraySerializer``: int32 n, per element ``bool present`` + element."""
    element = reader_for(spec.element)
    _no_greedy_inside(spec, [element])
    elem_read = element.read_at

    def read_generic_array(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        n = _BE_I32(buf, pos)[0]
        pos += 4
        _check_count(n, 1, pos, end, "array length")
        out = []
        for _ in range(n):
            if buf[pos]:
                v, pos = elem_read(buf, pos + 1, end)
                out.append(v)
            else:
                out.append(None)
                pos += 1
        return out, pos

    return Reader(spec, read_generic_array, min_size=4)


def _nullable_reader(spec: NullableSpec) -> Reader:
    inner = reader_for(spec.inner)
    _no_greedy_inside(spec, [inner])
    inner_read = inner.read_at
    padding = spec.padding
    fixed = (
        1 + inner.fixed_size
        if inner.fixed_size is not None and padding == inner.fixed_size
        else None
    )

    def read_nullable(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        if buf[pos]:
            return None, pos + 1 + padding
        return inner_read(buf, pos + 1, end)

    return Reader(spec, read_nullable, fixed_size=fixed, min_size=1)


def _optional_reader(spec: OptionalSpec) -> Reader:
    """A presence byte (1: the value follows, 0: null), as CEP's ``NodeIdSerializer`` writes."""
    inner = reader_for(spec.inner)
    _no_greedy_inside(spec, [inner])
    inner_read, inner_skip = inner.read_at, inner.skip_at

    def read_optional(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        flag = buf[pos]
        if flag == 0:
            return None, pos + 1
        if flag != 1:
            raise DecodeError(f"{spec.display}: presence byte {flag}, expected 0 or 1", pos)
        return inner_read(buf, pos + 1, end)

    def skip_optional(buf: bytes, pos: int, end: int) -> int:
        flag = buf[pos]
        if flag == 0:
            return pos + 1
        if flag != 1:
            raise DecodeError(f"{spec.display}: presence byte {flag}, expected 0 or 1", pos)
        return inner_skip(buf, pos + 1, end)

    return Reader(spec, read_optional, skip_optional, min_size=1)


def _either_reader(spec: EitherSpec) -> Reader:
    left, right = reader_for(spec.left), reader_for(spec.right)
    _no_greedy_inside(spec, [left, right])
    lr, rr = left.read_at, right.read_at

    def read_either(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        if buf[pos]:
            v, pos = lr(buf, pos + 1, end)
            return {"left": v, "right": None}, pos
        v, pos = rr(buf, pos + 1, end)
        return {"left": None, "right": v}, pos

    return Reader(spec, read_either, min_size=1)


def _ttl_reader(spec: TtlSpec) -> Reader:
    """``TtlSerializer``: int64 last access, then the user value -> ``{"last_access", "value"}``."""
    inner = reader_for(spec.inner)
    inner_read = inner.read_at

    def read_ttl(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        ts = _BE_I64(buf, pos)[0]
        v, pos = inner_read(buf, pos + 8, end)
        return {"last_access": ts, "value": v}, pos

    inner_skip = inner.skip_at

    def skip_ttl(buf: bytes, pos: int, end: int) -> int:
        return inner_skip(buf, pos + 8, end)

    return Reader(
        spec,
        read_ttl,
        None if inner.fixed_size is not None else skip_ttl,
        fixed_size=None if inner.fixed_size is None else inner.fixed_size + 8,
        min_size=8 + inner.min_size,
        greedy=inner.greedy,
    )


def _timer_reader(spec: TimerSpec) -> Reader:
    """``TimerSerializer``: int64 timestamp with flipped sign bit, key, namespace."""
    key, ns = reader_for(spec.key), reader_for(spec.namespace)
    _no_greedy_inside(spec, [key], last_ok=False)
    kr, nr = key.read_at, ns.read_at

    def read_timer(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        ts = _BE_I64(buf, pos)[0] ^ _LONG_MIN
        k, pos = kr(buf, pos + 8, end)
        n, pos = nr(buf, pos, end)
        return {"timestamp": ts, "key": k, "namespace": n}, pos

    return Reader(spec, read_timer, min_size=8 + key.min_size + ns.min_size)


def _window_key_reader(spec: WindowKeySpec) -> Reader:
    key = reader_for(spec.key)
    return _struct_reader(spec, ("window", "key"), [_fixed(None, 8, _read_long), key])


def _linked_list_reader(spec: LinkedListSpec) -> Reader:
    """Table ``LinkedListSerializer``: int32 size, [MSB-first null mask], non-null elements."""
    element = reader_for(spec.element)
    _no_greedy_inside(spec, [element])
    elem_read = element.read_at
    has_mask = spec.has_null_mask

    def read_linked_list(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        n = _BE_I32(buf, pos)[0]
        pos += 4
        _check_count(n, 0 if has_mask else element.min_size, pos, end, "list size")
        out: list[Any] = []
        if has_mask:
            mask_len = (n + 7) // 8
            if pos + mask_len > end:
                raise DecodeError("list null mask runs past the end of the data", pos)
            mask = buf[pos : pos + mask_len]
            pos += mask_len
            for i in range(n):
                if mask[i >> 3] & (0x80 >> (i & 7)):
                    out.append(None)
                else:
                    v, pos = elem_read(buf, pos, end)
                    out.append(v)
        else:
            for _ in range(n):
                v, pos = elem_read(buf, pos, end)
                out.append(v)
        return out, pos

    return Reader(spec, read_linked_list, min_size=4)


def _opaque_reader(spec: OpaqueSpec) -> Reader:
    """Kryo/Avro/Java/unknown: the rest of the slot as raw bytes (where the slot end is known)."""

    def read_raw(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        if pos > end:
            raise DecodeError("opaque value starts past the end of its slot", pos)
        return buf[pos:end], end

    return Reader(spec, read_raw, greedy=True)


# -- Flink SQL internal formats ------------------------------------------------------------------


def _binary_row_size_reader(
    spec: SerializerSpec, decode: Callable[[bytes, int, int], Any]
) -> Reader:
    """int32 BE size + ``size`` bytes decoded by ``decode(buf, start, size)``."""

    def read_sized(buf: bytes, pos: int, end: int) -> tuple[Any, int]:
        n = _BE_I32(buf, pos)[0]
        pos += 4
        if n < 0 or pos + n > end:
            raise DecodeError(
                f"binary data of {n} bytes exceeds the {end - pos} bytes left", pos - 4
            )
        return decode(buf, pos, n), pos + n

    def skip_sized(buf: bytes, pos: int, end: int) -> int:
        n = _BE_I32(buf, pos)[0]
        if n < 0 or pos + 4 + n > end:
            raise DecodeError(
                f"binary data of {n} bytes exceeds the {end - pos - 4} bytes left", pos
            )
        return int(pos + 4 + n)

    return Reader(spec, read_sized, skip_sized, min_size=4)


def _raw_value_reader(spec: RawValueSpec) -> Reader:
    """``RawValueDataSerializer``: int32 len + the inner serializer's bytes."""
    inner = reader_for(spec.inner)
    if not spec.inner.decodable:
        return _binary_row_size_reader(spec, lambda buf, start, n: buf[start : start + n])

    def decode(buf: bytes, start: int, n: int) -> Any:
        return inner.read_slot(buf, start, start + n)

    return _binary_row_size_reader(spec, decode)


def sql_fixed_size(t: SqlType) -> int:
    """Bytes of an element slot in a ``BinaryArrayData`` (``calculateFixLengthPartSize``)."""
    r = t.root
    if r in ("BOOLEAN", "TINYINT"):
        return 1
    if r == "SMALLINT":
        return 2
    if r in ("INTEGER", "FLOAT", "DATE", "TIME_WITHOUT_TIME_ZONE", "INTERVAL_YEAR_MONTH"):
        return 4
    return 8


def _resolve_sql(t: SqlType) -> SqlType:
    while t.root == "DISTINCT_TYPE" and t.element is not None:
        t = t.element
    return t


SlotGetter = Callable[[bytes, int, int, int], Any]  # (buf, base, slot, size) -> value


def _var_region(buf: bytes, base: int, slot: int, size: int) -> tuple[int, int]:
    """(absolute start, length) of a variable-length field whose slot holds ``offset<<32 | len``."""
    v = _LE_U64(buf, slot)[0]
    off = v >> 32
    n = v & 0xFFFFFFFF
    if off + n > size:
        raise DecodeError(
            f"variable-length field [{off}, {off + n}) outside its {size}-byte binary section", slot
        )
    return base + off, n


def _binary_slot(buf: bytes, base: int, slot: int, size: int) -> bytes:
    """STRING/BINARY slot: inline (<= 7 bytes, high bit of byte 7 set) or offset/length."""
    b7 = buf[slot + 7]
    if b7 & 0x80:
        n = b7 & 0x7F
        if n > 7:
            raise DecodeError(f"inline binary length {n} > 7", slot)
        return buf[slot : slot + n]
    start, n = _var_region(buf, base, slot, size)
    return buf[start : start + n]


def sql_value_decoder(t: SqlType, spec: SerializerSpec | None = None) -> SlotGetter:
    """A getter for one field/element of SQL type ``t`` in a binary row or array slot.

    ``spec`` is the field serializer the snapshot stored, when known: it reads ``RAW`` fields
    (whose bytes are whatever that serializer wrote) and the fields of nested rows. Without it,
    or when it cannot be decoded, a ``RAW`` field comes back as its raw bytes.
    """
    t = _resolve_sql(t)
    r = t.root
    if r == "BOOLEAN":
        return lambda buf, base, slot, size: buf[slot] != 0
    if r == "TINYINT":
        return lambda buf, base, slot, size: _LE_I8(buf, slot)[0]
    if r == "SMALLINT":
        return lambda buf, base, slot, size: _LE_I16(buf, slot)[0]
    if r in ("INTEGER", "DATE", "TIME_WITHOUT_TIME_ZONE", "INTERVAL_YEAR_MONTH"):
        return lambda buf, base, slot, size: _LE_I32(buf, slot)[0]
    if r in ("BIGINT", "INTERVAL_DAY_TIME"):
        return lambda buf, base, slot, size: _LE_I64(buf, slot)[0]
    if r == "FLOAT":
        return lambda buf, base, slot, size: _LE_F32(buf, slot)[0]
    if r == "DOUBLE":
        return lambda buf, base, slot, size: _LE_F64(buf, slot)[0]
    if r == "DECIMAL":
        precision = t.precision if t.precision is not None else 10
        scale = t.scale or 0
        if precision <= 18:
            return lambda buf, base, slot, size: _checked_decimal(
                _LE_I64(buf, slot)[0], precision, scale, slot
            )

        def get_big_decimal(buf: bytes, base: int, slot: int, size: int) -> Any:
            start, n = _var_region(buf, base, slot, size)
            if n > 16:
                raise DecodeError(f"decimal of {n} bytes (at most 16)", slot)
            unscaled = int.from_bytes(buf[start : start + n], "big", signed=True)
            return _checked_decimal(unscaled, precision, scale, slot)

        return get_big_decimal
    if r in ("TIMESTAMP_WITHOUT_TIME_ZONE", "TIMESTAMP_WITH_LOCAL_TIME_ZONE"):
        precision = t.precision if t.precision is not None else 6
        if precision <= 3:
            return lambda buf, base, slot, size: _LE_I64(buf, slot)[0]
        text = precision > 6
        utc = r == "TIMESTAMP_WITH_LOCAL_TIME_ZONE"

        def get_timestamp(buf: bytes, base: int, slot: int, size: int) -> Any:
            v = _LE_U64(buf, slot)[0]
            off, nanos = v >> 32, v & 0xFFFFFFFF
            if off + 8 > size or nanos >= 1_000_000:
                raise DecodeError("invalid non-compact timestamp slot", slot)
            millis = _LE_I64(buf, base + off)[0]
            if text:
                return sql_timestamp_text(millis, nanos, precision, utc)
            return _checked_i64(millis * 1000 + nanos // 1000, slot, "TIMESTAMP")

        return get_timestamp
    if r in ("CHAR", "VARCHAR"):
        return lambda buf, base, slot, size: _binary_slot(buf, base, slot, size).decode("utf-8")
    if r in ("BINARY", "VARBINARY"):
        return _binary_slot
    if r in ("ROW", "STRUCTURED_TYPE"):
        decode_row = row_data_decoder(t, spec.field_specs if isinstance(spec, RowDataSpec) else ())

        def get_row(buf: bytes, base: int, slot: int, size: int) -> Any:
            start, n = _var_region(buf, base, slot, size)
            return decode_row(buf, start, n)

        return get_row
    if r in ("ARRAY", "MULTISET", "MAP"):
        decode_blob = (
            array_data_decoder(t.element or SqlType("NULL"))
            if r == "ARRAY"
            else map_data_decoder(t.element or SqlType("NULL"), SqlType("INTEGER", False))
            if r == "MULTISET"
            else map_data_decoder(t.key or SqlType("NULL"), t.value or SqlType("NULL"))
        )

        def get_blob(buf: bytes, base: int, slot: int, size: int) -> Any:
            start, n = _var_region(buf, base, slot, size)
            return decode_blob(buf, start, n)

        return get_blob
    if r == "RAW" and isinstance(spec, RawValueSpec) and spec.inner.decodable:
        inner = reader_for(spec.inner)

        def get_raw_value(buf: bytes, base: int, slot: int, size: int) -> Any:
            start, n = _var_region(buf, base, slot, size)
            return inner.read_slot(buf, start, start + n)

        return get_raw_value
    if r in ("RAW", "VARIANT", "SYMBOL"):

        def get_raw(buf: bytes, base: int, slot: int, size: int) -> Any:
            start, n = _var_region(buf, base, slot, size)
            return buf[start : start + n]

        return get_raw
    if r == "NULL":
        return lambda buf, base, slot, size: None
    raise UnsupportedFormatError(f"no decoder for SQL type {t}")


def row_data_decoder(
    t: SqlType, field_specs: tuple[SerializerSpec, ...] = ()
) -> Callable[[bytes, int, int], dict[str, Any]]:
    """A decoder of a ``BinaryRowData`` of ROW type ``t``: ``(buf, start, size) -> dict``.

    ``field_specs`` are the stored field serializers (one per field, or none): see
    :func:`sql_value_decoder`.

    Null bits: ``((arity + 63 + 8) // 64) * 8`` bytes, byte 0 the RowKind, field ``i`` null iff
    bit ``i + 8`` (LSB-first); then one 8-byte little-endian slot per field.
    """
    fields = t.fields
    arity = len(fields)
    specs: tuple[SerializerSpec | None, ...] = (
        field_specs if len(field_specs) == arity else (None,) * arity
    )
    null_bytes = ((arity + 63 + 8) // 64) * 8
    fixed_end = null_bytes + 8 * arity
    items = tuple(
        (
            f.name or f"f{i}",
            sql_value_decoder(f.type, specs[i]),
            (i + 8) >> 3,
            1 << ((i + 8) & 7),
            null_bytes + 8 * i,
        )
        for i, f in enumerate(fields)
    )

    def decode_row(buf: bytes, start: int, size: int) -> dict[str, Any]:
        if size < fixed_end:
            raise DecodeError(
                f"binary row of {size} bytes is shorter than its {fixed_end}-byte "
                f"fixed part ({arity} fields)",
                start,
            )
        out: dict[str, Any] = {}
        for name, get, byte_i, bit, slot in items:
            if buf[start + byte_i] & bit:
                out[name] = None
            else:
                out[name] = get(buf, start, start + slot, size)
        return out

    return decode_row


def decode_binary_row(t: SqlType, data: bytes) -> dict[str, Any]:
    """Decode one ``BinaryRowData`` (its bytes, without the int32 size prefix)."""
    return row_data_decoder(t)(data, 0, len(data))


def array_data_decoder(element: SqlType) -> Callable[[bytes, int, int], list[Any]]:
    """``BinaryArrayData``: int32 n (LE), null bits ``((n+31)//32)*4`` bytes, n element slots."""
    get = sql_value_decoder(element)
    elem_size = sql_fixed_size(_resolve_sql(element))

    def decode_array(buf: bytes, start: int, size: int) -> list[Any]:
        if size < 4:
            raise DecodeError(f"binary array of {size} bytes", start)
        n = _LE_I32(buf, start)[0]
        null_len = ((n + 31) // 32) * 4
        if n < 0 or 4 + null_len + n * elem_size > size:
            raise DecodeError(f"binary array of {n} elements does not fit its {size} bytes", start)
        slot = start + 4 + null_len
        out: list[Any] = []
        nulls = start + 4
        for i in range(n):
            if buf[nulls + (i >> 3)] & (1 << (i & 7)):
                out.append(None)
            else:
                out.append(get(buf, start, slot, size))
            slot += elem_size
        return out

    return decode_array


def map_data_decoder(key: SqlType, value: SqlType) -> Callable[[bytes, int, int], list[Any]]:
    """``BinaryMapData``: int32 key-array bytes (LE), key array, value array -> [(k, v), ...]."""
    keys, values = array_data_decoder(key), array_data_decoder(value)

    def decode_map(buf: bytes, start: int, size: int) -> list[Any]:
        if size < 4:
            raise DecodeError(f"binary map of {size} bytes", start)
        n = _LE_I32(buf, start)[0]
        if n < 0 or 4 + n > size:
            raise DecodeError(f"binary map key array of {n} bytes does not fit", start)
        ks = keys(buf, start + 4, n)
        vs = values(buf, start + 4 + n, size - 4 - n)
        if len(ks) != len(vs):
            raise DecodeError(f"binary map with {len(ks)} keys and {len(vs)} values", start)
        return list(zip(ks, vs, strict=True))

    return decode_map


#: the ranges of integral results of :func:`derived_value`, by SQL type root
DERIVED_RANGES = {"TINYINT": 7, "SMALLINT": 15, "INTEGER": 31, "BIGINT": 63}


def derived_value(function: str, root: str, total: Any, count: Any) -> Any:
    """An aggregate's current value from its accumulator's sum and count (RowDataSpec.derived),
    of result type ``root``: ``avg`` is sum / count (Java's division, toward zero, for integral
    results), ``sum`` the sum. Null while the count is not positive, when either is null, or
    when the value does not fit the result type (only corrupt state does that)."""
    if total is None or count is None or count <= 0:
        return None
    if function == "sum":
        value = total
    elif root in ("FLOAT", "DOUBLE"):
        return total / count
    else:
        q = abs(total) // count
        value = q if total >= 0 else -q
    bits = DERIVED_RANGES.get(root)
    if bits is not None and not -(1 << bits) <= value < (1 << bits):
        return None
    return value


def _with_derived(decode: Callable[[bytes, int, int], dict[str, Any]], spec: RowDataSpec
                  ) -> Callable[[bytes, int, int], dict[str, Any]]:
    names = [f.name or f"f{i}" for i, f in enumerate(spec.type.fields)]
    items = [(d[0], d[1], d[4], names[d[2]], names[d[3]]) for d in spec.derived]

    def decode_derived(buf: bytes, start: int, size: int) -> dict[str, Any]:
        out = decode(buf, start, size)
        for name, function, root, total, count in items:
            out[name] = derived_value(function, root, out[total], out[count])
        return out

    return decode_derived


def _row_data_reader(spec: RowDataSpec) -> Reader:
    return _binary_row_size_reader(spec, _spec_row_decoder(spec))


def _spec_row_decoder(spec: RowDataSpec) -> Callable[[bytes, int, int], dict[str, Any]]:
    """The BinaryRowData decoder of ``spec``: with a leading ``row_kind`` when it shows one."""
    decode = row_data_decoder(spec.type, spec.field_specs)
    if spec.derived:
        decode = _with_derived(decode, spec)
    if not spec.row_kind:
        return decode

    def decode_with_kind(buf: bytes, start: int, size: int) -> dict[str, Any]:
        fields = decode(buf, start, size)  # checks the size: the header byte is there
        kind = buf[start]
        if kind >= len(ROW_KINDS):
            raise DecodeError(f"binary row with an invalid row kind byte {kind}", start)
        return {"row_kind": ROW_KINDS[kind], **fields}

    return decode_with_kind


def _array_data_reader(spec: ArrayDataSpec) -> Reader:
    return _binary_row_size_reader(spec, array_data_decoder(spec.element))


def _map_data_reader(spec: MapDataSpec) -> Reader:
    return _binary_row_size_reader(spec, map_data_decoder(spec.key, spec.value))


# -- the resolver -------------------------------------------------------------------------------

_CACHE: dict[SerializerSpec, Reader] = {}


def reader_for(spec: SerializerSpec) -> Reader:
    """Build (once per distinct spec) the reader of ``spec``'s values.

    Raises :class:`~statequery.exceptions.UnsupportedFormatError` for a spec whose values cannot
    be delimited (an opaque value nested before other data).
    """
    try:
        return _CACHE[spec]
    except (KeyError, TypeError):
        pass
    reader = _build(spec)
    try:
        if len(_CACHE) < 4096:
            _CACHE[spec] = reader
    except TypeError:  # unhashable spec (should not happen: specs are frozen)
        pass
    return reader


def _avro_reader(spec: AvroSpec) -> Reader:
    """Flink's ``AvroSerializer``: one value decoded from the writer schema
    (:mod:`statequery.serializers.avro`)."""
    from statequery.serializers.avro import avro_reader, min_size, parse_schema

    t = parse_schema(spec.schema)
    return Reader(spec, avro_reader(t), min_size=min_size(t))


def _build(spec: SerializerSpec) -> Reader:
    if isinstance(spec, PrimitiveSpec):
        return _primitive_reader(spec)
    if isinstance(spec, NamespaceSpec):
        return _namespace_reader(spec)
    if isinstance(spec, PrimitiveArraySpec):
        return _primitive_array_reader(spec)
    if isinstance(spec, EnumSpec):
        return _enum_reader(spec)
    if isinstance(spec, TupleSpec):
        children = [reader_for(f) for f in spec.fields]
        return _struct_reader(spec, tuple(f"f{i}" for i in range(len(children))), children)
    if isinstance(spec, RowSpec):
        return _row_reader(spec)
    if isinstance(spec, PojoSpec):
        return _pojo_reader(spec)
    if isinstance(spec, ListSpec):
        return _list_reader(spec, reader_for(spec.element))
    if isinstance(spec, MapSpec):
        return _map_reader(spec)
    if isinstance(spec, GenericArraySpec):
        return _generic_array_reader(spec)
    if isinstance(spec, NullableSpec):
        return _nullable_reader(spec)
    if isinstance(spec, EitherSpec):
        return _either_reader(spec)
    if isinstance(spec, TtlSpec):
        return _ttl_reader(spec)
    if isinstance(spec, TimerSpec):
        return _timer_reader(spec)
    if isinstance(spec, RowDataSpec):
        return _row_data_reader(spec)
    if isinstance(spec, ArrayDataSpec):
        return _array_data_reader(spec)
    if isinstance(spec, MapDataSpec):
        return _map_data_reader(spec)
    if isinstance(spec, RawValueSpec):
        return _raw_value_reader(spec)
    if isinstance(spec, LinkedListSpec):
        return _linked_list_reader(spec)
    if isinstance(spec, WindowKeySpec):
        return _window_key_reader(spec)
    if isinstance(spec, StructSpec):
        return _struct_reader(spec, spec.names, [reader_for(f) for f in spec.fields])
    if isinstance(spec, OptionalSpec):
        return _optional_reader(spec)
    if isinstance(spec, OpaqueSpec):
        return _opaque_reader(spec)
    if isinstance(spec, AvroSpec):
        return _avro_reader(spec)
    raise UnsupportedFormatError(
        f"no reader for serializer kind {spec.kind!r} ({type(spec).__name__})"
    )


def raw_reader() -> Reader:
    """A reader returning the whole slot as bytes (used for undecodable columns)."""
    return _opaque_reader(OpaqueSpec(reason="raw"))


def to_corrupt(
    e: BaseException, source: str, base_offset: int, fallback_pos: int, context: str
) -> CorruptStateError:
    """Turn a reader exception into a :class:`CorruptStateError` naming source and offset."""
    if isinstance(e, DecodeError):
        return CorruptStateError(f"{context}: {e.message}", source, base_offset + e.pos)
    return CorruptStateError(
        f"{context}: {type(e).__name__}: {e}", source, base_offset + fallback_pos
    )
