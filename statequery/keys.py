"""Keys given by a user, turned into what every read path compares: one place for all of them.

:func:`resolve_key` is the one conversion every front end uses (``Savepoint.read(key=)``,
``Savepoint.lookup``, scan planning, the CLI, SQL pushdown, the Spark ``key`` option). It turns a
key value into a :class:`ResolvedKey`:

* ``value``: the key exactly as ``read()`` returns it (composite keys as a dict by field name);
* ``serialized``: the bytes Flink's key serializer writes for it (what every backend compares,
  before decoding anything: canonical key groups, hashmap checkpoints, RocksDB), or None for key
  serializers statequery does not write (POJO, Kryo, ...; rows are then compared by ``value``);
* ``key_group``: the key group Flink assigns it (None when it depends on a user ``hashCode``).

Accepted spellings (exact conversions only; anything else is an
:class:`~statequery.exceptions.InvalidKeyError` naming the field and the type it expects):

* every value ``read()`` returns, given back: ``str``, ``int``, ``float``, ``bool``, ``bytes``,
  ``decimal.Decimal``, ``datetime.date`` (DATE), ``datetime.time`` (TIME),
  ``datetime.datetime`` (naive for TIMESTAMP, aware for TIMESTAMP_LTZ), dicts for composite keys
  (by field name or ``f0``, ``f1``...; lists or tuples in field order also do; ``None`` for a
  null field);
* the text forms ``read --json`` prints: ISO strings for DATE (``2024-01-01``), TIME
  (``12:34:56.789``), TIMESTAMP (``2024-01-01T12:34:56.789``, a space for the ``T`` also does)
  and TIMESTAMP_LTZ (with ``Z`` or an offset); a decimal string for DECIMAL (``"12.50"``; fewer
  digits after the point also do, more do not); BYTES as ``{"$bytes": base64}`` or, from text
  (CLI, SQL, Spark), a plain base64 string; integral numbers (``5.0``, ``"5"``) for integer
  types and ``"true"`` / ``"false"`` for BOOLEAN.

Rows are kept by comparing serialized key bytes, so keys equal in Python but not to Flink stay
apart (``0.0`` and ``-0.0`` are two DOUBLE keys, with different bytes).

A value that would need a guess raises: a day number for a DATE, a float for a DECIMAL whose digits
do not fit its scale, a naive datetime for a TIMESTAMP_LTZ (or an aware one for a TIMESTAMP),
sub-millisecond digits for a TIMESTAMP(3), a number out of the type's range, ``None`` for a field
that is NOT NULL or a Tuple field.

:func:`parse_key_text` reads a key typed as text (the CLI, the Spark ``key`` option, SQL
literals): the key's serializer decides, so ``42`` is the number 42 for a ``Long`` key and the
string "42" for a ``String`` key. Composite keys take a JSON array or object; a one-field row also
takes its single value as plain text.
"""

from __future__ import annotations

import base64
import binascii
import datetime as _dt
import json
import math
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Context, Decimal, InvalidOperation
from typing import Any

from statequery.exceptions import InvalidKeyError, InvalidOptionError, UnsupportedFormatError
from statequery.serializers.spec import (
    EnumSpec,
    NullableSpec,
    PojoSpec,
    PrimitiveArraySpec,
    PrimitiveSpec,
    RowDataSpec,
    RowSpec,
    SerializerSpec,
    SqlType,
    TupleSpec,
)

__all__ = [
    "ResolvedKey",
    "convert_key",
    "key_type_name",
    "parse_key_text",
    "resolve_key",
    "serialize_key",
]

# integer kinds and their two's complement width in bits
_INT_PRIMITIVES = {"long": 64, "int": 32, "short": 16, "byte": 8}
_FLOAT_PRIMITIVES = ("float", "double")
_STR_PRIMITIVES = ("string", "string_data")
_INT_SQL = {
    "TINYINT": 8,
    "SMALLINT": 16,
    "INTEGER": 32,
    "BIGINT": 64,
    "INTERVAL_YEAR_MONTH": 32,
    "INTERVAL_DAY_TIME": 64,
}
_INT_TEXT = re.compile(r"[+-]?\d+")
_TIME_TEXT = re.compile(r"(\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?")
_TIMESTAMP_TEXT = re.compile(
    r"([+-]?\d{4,}-\d{2}-\d{2})[T ](\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?)"
    r"(Z|z|[+-]\d{2}:?\d{2})?"
)
_EPOCH_DATE = _dt.date(1970, 1, 1)

FieldType = SerializerSpec | SqlType


class _Inexact(ValueError):
    """No exact conversion; the message (if any) says why."""


class Timestamp(_dt.datetime):
    """A ``datetime`` that also carries nanoseconds below its microseconds (TIMESTAMP(7..9))."""

    nanosecond: int = 0

    def __reduce_ex__(self, protocol: Any) -> Any:  # pickled with its nanoseconds (Spark)
        plain = _dt.datetime(self.year, self.month, self.day, self.hour, self.minute,
                             self.second, self.microsecond, self.tzinfo)
        return _timestamp, (plain, self.nanosecond)


def _timestamp(dt: _dt.datetime, nanosecond: int) -> Timestamp:
    out = Timestamp(dt.year, dt.month, dt.day, dt.hour, dt.minute, dt.second, dt.microsecond,
                    dt.tzinfo)
    out.nanosecond = nanosecond
    return out


@dataclass(frozen=True)
class ResolvedKey:
    """A key converted for one key type (see :func:`resolve_key`)."""

    value: Any
    serialized: bytes | None
    key_group: int | None

    def __hash__(self) -> int:
        return hash((self.serialized, self.key_group) if self.serialized is not None
                    else _original(self.value))


def key_type_name(spec: FieldType | None) -> str:
    """The type name ``inspect`` shows for a key (or key field) type."""
    if spec is None:
        return "unknown"
    if isinstance(spec, SqlType):
        return str(spec)
    from statequery.metadata.statemeta import type_string

    return type_string(spec) or spec.display


def _unwrap(spec: FieldType | None) -> FieldType | None:
    while isinstance(spec, NullableSpec):
        spec = spec.inner
    return spec


def _fields(spec: FieldType | None) -> list[tuple[str, FieldType | None]] | None:
    """``(name, type)`` of each field of a composite key type (the names ``read()`` gives its
    dicts); None for a scalar type."""
    spec = _unwrap(spec)
    if isinstance(spec, RowDataSpec):
        spec = spec.type
    if isinstance(spec, SqlType):
        if spec.root in ("ROW", "STRUCTURED_TYPE"):
            return [(f.name or f"f{i}", f.type) for i, f in enumerate(spec.fields)]
        return None
    if isinstance(spec, RowSpec):
        return list(zip(spec.field_names, spec.fields, strict=True))
    if isinstance(spec, TupleSpec):
        return [(f"f{i}", f) for i, f in enumerate(spec.fields)]
    return None


def _describe(value: Any) -> str:
    """How a value was read, for error messages."""
    if isinstance(value, bool):
        return f"the boolean {json.dumps(value)}"
    if isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
        text = format(value, "f") if isinstance(value, Decimal) else json.dumps(value)
        return f"the number {text}"
    if isinstance(value, str):
        return f"the string {json.dumps(value, ensure_ascii=False)}"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return f"the array {_dumps(value)}"
    if isinstance(value, Mapping):
        return f"the object {_dumps(value)}"
    return f"the {type(value).__name__} {value!r}"


def _dumps(value: Any) -> str:
    def default(v: Any) -> Any:
        if isinstance(v, Decimal):
            return format(v, "f")
        if isinstance(v, (bytes, bytearray)):
            return {"$bytes": base64.b64encode(bytes(v)).decode("ascii")}
        if isinstance(v, (_dt.date, _dt.time)):
            return v.isoformat()
        return str(v)

    return json.dumps(value, default=default, ensure_ascii=False)


def _fits(value: int, bits: int) -> bool:
    return not bits or -(1 << (bits - 1)) <= value < (1 << (bits - 1))


# -- scalar conversions (each raises _Inexact) ---------------------------------------------------


def _as_int(value: Any, bits: int) -> int:
    out: int | None = None
    if isinstance(value, bool):
        out = None
    elif isinstance(value, int):
        out = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        out = int(value)
    elif isinstance(value, Decimal) and value.is_finite() and value == value.to_integral_value():
        out = int(value)
    elif isinstance(value, str) and _INT_TEXT.fullmatch(value.strip()):
        out = int(value.strip())
    elif hasattr(value, "__index__") and not isinstance(value, (bytes, str)):
        out = value.__index__()  # numpy integers
    if out is None:
        raise _Inexact()
    if not _fits(out, bits):
        raise _Inexact(f"{out} is out of range")
    return out


def _as_float(value: Any, single: bool) -> float:
    out: float | None = None
    if isinstance(value, bool):
        out = None
    elif isinstance(value, float):
        out = value
    elif isinstance(value, int):
        if abs(value) <= 1 << 53:
            out = float(value)
    elif isinstance(value, (Decimal, str)):
        try:
            out = float(value)
        except ValueError:
            out = None
    elif hasattr(value, "__float__") and not isinstance(value, (bytes, str)):
        out = float(value)  # numpy floats
    if out is None:
        raise _Inexact()
    if single:
        try:
            out = struct.unpack("<f", struct.pack("<f", out))[0]
        except OverflowError:
            raise _Inexact(f"{value} is out of range") from None
    return out


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise _Inexact()


_EXACT = Context(prec=80, traps=[InvalidOperation])


def _as_decimal(value: Any, precision: int, scale: int) -> Decimal:
    d: Decimal | None = None
    if isinstance(value, bool):
        d = None
    elif isinstance(value, Decimal):
        d = value
    elif isinstance(value, int):
        d = Decimal(value)
    elif isinstance(value, float):
        d = Decimal(repr(value)) if math.isfinite(value) else None
    elif isinstance(value, str):
        try:
            d = Decimal(value.strip())
        except InvalidOperation:
            d = None
    if d is None or not d.is_finite():
        raise _Inexact()
    try:
        # an exact context: the default one holds 28 digits, DECIMAL up to 38
        q = d.quantize(Decimal(1).scaleb(-scale, _EXACT), context=_EXACT)
    except InvalidOperation:
        raise _Inexact(f"{format(d, 'f')} does not fit DECIMAL({precision}, {scale})") from None
    if q != d:
        raise _Inexact(f"{format(d, 'f')} has more than {scale} digits after the point")
    if len(q.as_tuple().digits) > precision and q != 0:
        raise _Inexact(f"{format(d, 'f')} does not fit DECIMAL({precision}, {scale})")
    return q


def _as_date(value: Any) -> _dt.date:
    if isinstance(value, _dt.datetime):
        raise _Inexact("a datetime is not a DATE: give a datetime.date")
    if isinstance(value, _dt.date):
        return value
    if isinstance(value, str):
        try:
            return _dt.date.fromisoformat(value.strip())
        except ValueError:
            day_number = _INT_TEXT.fullmatch(value.strip()) is not None
            raise _Inexact("write a DATE as YYYY-MM-DD" + (", not a day number" if day_number
                                                            else "")) from None
    if isinstance(value, int) and not isinstance(value, bool):
        raise _Inexact("give a datetime.date or 'YYYY-MM-DD', not a day number")
    raise _Inexact()


def _fraction_nanos(digits: str | None) -> int:
    return int((digits or "").ljust(9, "0")) if digits else 0


def _as_time(value: Any) -> _dt.time:
    if isinstance(value, _dt.time):
        t = value
    elif isinstance(value, str):
        m = _TIME_TEXT.fullmatch(value.strip())
        if m is None:
            raise _Inexact("write a TIME as HH:MM:SS[.fff]")
        nanos = _fraction_nanos(m.group(4))
        if nanos % 1_000_000:
            raise _Inexact("a TIME holds milliseconds, no finer digits")
        try:
            t = _dt.time(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0), nanos // 1000)
        except ValueError as e:
            raise _Inexact(str(e)) from None
    else:
        raise _Inexact()
    if t.tzinfo is not None:
        raise _Inexact("a TIME has no time zone")
    if t.microsecond % 1000:
        raise _Inexact("a TIME holds milliseconds, no finer digits")
    return t


def _parse_timestamp(text: str) -> tuple[_dt.datetime, int]:
    """``(datetime, nanoseconds below its microseconds)`` of an ISO timestamp text."""
    m = _TIMESTAMP_TEXT.fullmatch(text.strip())
    if m is None:
        raise _Inexact("write a timestamp as YYYY-MM-DDTHH:MM:SS[.fffffffff]")
    day, clock, zone = m.groups()
    hms, _, frac = clock.partition(".")
    nanos = _fraction_nanos(frac)
    try:
        dt = _dt.datetime.fromisoformat(f"{day}T{hms}").replace(microsecond=nanos // 1000)
        if zone:
            z = "+00:00" if zone in ("Z", "z") else zone
            if ":" not in z:
                z = z[:3] + ":" + z[3:]
            dt = dt.replace(tzinfo=_dt.datetime.fromisoformat("2000-01-01T00:00" + z).tzinfo)
    except ValueError as e:
        raise _Inexact(str(e)) from None
    return dt, nanos % 1000


def _as_timestamp(value: Any, precision: int, ltz: bool) -> _dt.datetime:
    name = "TIMESTAMP_LTZ" if ltz else "TIMESTAMP"
    extra = 0
    if isinstance(value, _dt.datetime):
        dt = value
        extra = int(getattr(value, "nanosecond", 0) or 0) % 1000
    elif isinstance(value, str):
        dt, extra = _parse_timestamp(value)
    else:
        if isinstance(value, int) and not isinstance(value, bool):
            raise _Inexact(f"give a datetime or an ISO string for a {name}, not a number")
        raise _Inexact()
    if ltz and dt.tzinfo is None:
        raise _Inexact(f"a {name} is an instant: give an aware datetime (or an offset, e.g. Z)")
    if not ltz and dt.tzinfo is not None:
        raise _Inexact(f"a {name} has no time zone: give a naive datetime (no offset)")
    nanos_of_second = dt.microsecond * 1000 + extra
    unit = 10 ** (9 - min(max(precision, 0), 9))
    if nanos_of_second % unit:
        raise _Inexact(f"more fractional digits than {name}({precision}) holds")
    if ltz:
        dt = dt.astimezone(_dt.timezone.utc)
    if extra:
        return _timestamp(dt, extra)
    if type(dt) is not _dt.datetime:  # pandas.Timestamp and the like: a plain datetime
        dt = _dt.datetime(dt.year, dt.month, dt.day, dt.hour, dt.minute, dt.second,
                          dt.microsecond, dt.tzinfo)
    return dt


def _as_bytes(value: Any, text: bool) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    b64 = None
    if isinstance(value, Mapping) and set(value) == {"$bytes"}:
        b64 = value["$bytes"]
    elif text and isinstance(value, str):
        b64 = value
    if isinstance(b64, str):
        try:
            return base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise _Inexact("not base64") from None
    raise _Inexact()


def _as_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise _Inexact()


def _convert_sql(value: Any, t: SqlType, text: bool) -> Any:
    r = t.root
    if r in _INT_SQL:
        return _as_int(value, _INT_SQL[r])
    if r in ("FLOAT", "DOUBLE"):
        return _as_float(value, r == "FLOAT")
    if r == "BOOLEAN":
        return _as_bool(value)
    if r in ("CHAR", "VARCHAR"):
        return _as_str(value)
    if r in ("BINARY", "VARBINARY"):
        return _as_bytes(value, text)
    if r == "DECIMAL":
        return _as_decimal(value, t.precision or 10, t.scale or 0)
    if r == "DATE":
        return _as_date(value)
    if r == "TIME_WITHOUT_TIME_ZONE":
        return _as_time(value)
    if r in ("TIMESTAMP_WITHOUT_TIME_ZONE", "TIMESTAMP_WITH_LOCAL_TIME_ZONE"):
        p = t.precision if t.precision is not None else 6
        return _as_timestamp(value, p, r == "TIMESTAMP_WITH_LOCAL_TIME_ZONE")
    return value  # ARRAY, MAP, RAW...: as given


def _convert_primitive(value: Any, spec: PrimitiveSpec, text: bool) -> Any:
    name = spec.name.removesuffix("_value")
    if name in _INT_PRIMITIVES:
        return _as_int(value, _INT_PRIMITIVES[name])
    if name in _FLOAT_PRIMITIVES:
        return _as_float(value, name == "float")
    if name == "boolean":
        return _as_bool(value)
    if name in _STR_PRIMITIVES:
        return _as_str(value)
    if name == "char":
        s = _as_str(value)
        if len(s.encode("utf-16-be", "surrogatepass")) != 2:
            raise _Inexact("a char is one UTF-16 code unit")
        return s
    if name == "bigint":  # read() gives BigInteger keys as decimal strings
        return str(_as_int(value, 0))
    if name == "bigdec":  # and BigDecimal keys as plain strings
        d = value if isinstance(value, Decimal) else None
        if isinstance(value, (int, str)) and not isinstance(value, bool):
            try:
                d = Decimal(str(value).strip())
            except InvalidOperation:
                d = None
        if d is None or not d.is_finite():
            raise _Inexact()
        return format(d, "f")
    return value  # dates and times of DataStream keys: as given (compared as read() gives them)


def _is_nullable(spec: FieldType | None) -> bool:
    if isinstance(spec, SqlType):
        return spec.nullable
    return isinstance(spec, NullableSpec)


def _convert(value: Any, spec: FieldType | None, path: str, original: str, text: bool,
             in_row: bool) -> Any:
    """``value`` converted to ``spec``; ``path`` names the field ("" for the whole key)."""
    where = f"field {path}" if path else "the key"
    if value is None:
        if not path:
            raise InvalidKeyError(f"key {original}: a key cannot be null")
        if not in_row and not _is_nullable(spec):
            raise InvalidKeyError(
                f"key {original}: {where} ({key_type_name(spec)}) cannot be null in a Tuple key"
            )
        if isinstance(spec, SqlType) and not spec.nullable:
            raise InvalidKeyError(f"key {original}: {where} is {key_type_name(spec)}, got null")
        return None
    inner = _unwrap(spec)
    fields = _fields(inner)
    if fields is None:
        if isinstance(inner, (PojoSpec, EnumSpec)) or inner is None:
            return value  # compared as read() gives them
        try:
            if isinstance(inner, SqlType):
                return _convert_sql(value, inner, text)
            if isinstance(inner, PrimitiveSpec):
                return _convert_primitive(value, inner, text)
            if isinstance(inner, PrimitiveArraySpec) and inner.element == "byte":
                # byte[] (PyFlink's pickled keys, ROW<f0 BYTES>): bytes, {"$bytes"}, base64 text
                return _as_bytes(value, text)
            return value
        except _Inexact as e:
            detail = f" ({e})" if str(e) else ""
            if isinstance(value, (int, float, Decimal)) and _expects_text(inner):
                detail = f" (for the text write {json.dumps(json.dumps(_plain(value)))})"
            raise InvalidKeyError(
                f"key {original}: {where} is {key_type_name(inner)}, "
                f"got {_describe(value)}{detail}"
            ) from None
    names = [n for n, _ in fields]
    what = f"{where} ({key_type_name(inner)})"
    if isinstance(value, (list, tuple)):
        if len(value) != len(fields):
            raise InvalidKeyError(
                f"key {original}: {what} has {len(fields)} field(s) "
                f"({', '.join(names)}), got {len(value)} value(s)"
            )
        items = list(value)
    elif isinstance(value, Mapping) and not (
        set(value) == {"$bytes"} and len(fields) == 1
    ):
        positional = {f"f{i}" for i in range(len(fields))}
        unknown = [k for k in value if k not in names and k not in positional]
        if unknown:
            raise InvalidKeyError(
                f"key {original}: {what} has no field {unknown[0]!r} "
                f"(fields: {', '.join(names)})"
            )
        items = []
        for i, name in enumerate(names):
            if name in value:
                items.append(value[name])
            elif f"f{i}" in value:
                items.append(value[f"f{i}"])
            else:
                raise InvalidKeyError(
                    f"key {original}: {what} needs field {name!r} "
                    f"(fields: {', '.join(names)})"
                )
    elif len(fields) == 1:
        items = [value]
    else:
        raise InvalidKeyError(
            f"key {original}: {what} needs a dict, list or tuple of {len(fields)} fields, "
            f"got {_describe(value)}"
        )
    row = not isinstance(inner, TupleSpec)
    return {
        n: _convert(v, t, f"{path}.{n}" if path else n, original, text, row)
        for (n, t), v in zip(fields, items, strict=True)
    }


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def _expects_text(spec: FieldType | None) -> bool:
    if isinstance(spec, SqlType):
        return spec.root in ("CHAR", "VARCHAR")
    return isinstance(spec, PrimitiveSpec) and spec.name.removesuffix("_value") in (
        *_STR_PRIMITIVES, "char"
    )


def convert_key(value: Any, spec: SerializerSpec | None, text: str | None = None) -> Any:
    """``value`` converted exactly to the key type ``spec``: the key as ``read()`` returns it
    (composite keys as a dict by field name). ``text`` is the text the value was parsed from
    (keys from the CLI, SQL or Spark; it also allows base64 text for BYTES fields).

    Raises :class:`InvalidKeyError` naming the field and the type it expects when a value has no
    exact conversion.
    """
    original = repr(text) if text is not None else _original(value)
    return _convert(value, spec, "", original, text is not None, True)


def _original(value: Any) -> str:
    try:
        return _dumps(value)
    except (TypeError, ValueError):
        return repr(value)


# -- serialized bytes ---------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _java_string(value: str) -> bytes:
    """``StringValue.writeString`` (StringSerializer): varint length + 1, varint UTF-16 units."""
    units = value.encode("utf-16-be", "surrogatepass")
    out = bytearray(_varint(len(units) // 2 + 1))
    for i in range(0, len(units), 2):
        out += _varint((units[i] << 8) | units[i + 1])
    return bytes(out)


_FIXED_FORMATS = {"long": ">q", "int": ">i", "short": ">h", "byte": ">b", "double": ">d",
                  "float": ">f"}


class _NotWritable(Exception):
    """statequery does not write this serializer's bytes."""


def _write(value: Any, spec: SerializerSpec | None) -> bytes:
    if isinstance(spec, NullableSpec):
        if value is None:
            return b"\x01" + b"\x00" * spec.padding
        return b"\x00" + _write(value, spec.inner)
    if isinstance(spec, PrimitiveSpec):
        name = spec.name.removesuffix("_value")
        if name == "string":
            return _java_string(value)
        fmt = _FIXED_FORMATS.get(name)
        if fmt is not None:
            return struct.pack(fmt, value)
        if name == "boolean":
            return b"\x01" if value else b"\x00"
        if name == "char":
            return str(value).encode("utf-16-be", "surrogatepass")
        raise _NotWritable(name)
    if isinstance(spec, TupleSpec):
        return b"".join(_write(value[f"f{i}"], f) for i, f in enumerate(spec.fields))
    if isinstance(spec, RowSpec):
        offset = 2 if spec.supports_row_kind else 0
        names = spec.field_names
        mask = bytearray((offset + len(names) + 7) // 8)
        parts = []
        for i, (n, f) in enumerate(zip(names, spec.fields, strict=True)):
            v = value[n]
            if v is None:
                mask[(offset + i) >> 3] |= 0x80 >> ((offset + i) & 7)
            else:
                parts.append(_write(v, f))
        return bytes(mask) + b"".join(parts)
    if isinstance(spec, RowDataSpec):
        row = _binary_row(value, spec)
        return struct.pack(">i", len(row)) + row
    raise _NotWritable(type(spec).__name__)


def _binary_row(value: Any, spec: RowDataSpec) -> bytes:
    from statequery.hashing import binary_row_bytes

    return binary_row_bytes(_positional(value, spec.type), spec.type)


def _positional(value: Any, t: SqlType) -> list[Any]:
    """A canonical row (dict) as positional values, nested rows too (for the row writer)."""
    out = []
    for i, f in enumerate(t.fields):
        v = value[f.name or f"f{i}"]
        if v is not None and f.type.root in ("ROW", "STRUCTURED_TYPE"):
            v = _positional(v, f.type)
        out.append(v)
    return out


def serialize_key(value: Any, spec: SerializerSpec | None) -> bytes | None:
    """The bytes Flink's key serializer ``spec`` writes for the converted key ``value`` (as
    :func:`convert_key` returns it); None for serializers statequery does not write."""
    try:
        return _write(value, spec)
    except (_NotWritable, UnsupportedFormatError):
        return None
    except (struct.error, UnicodeEncodeError, InvalidOptionError, OverflowError) as e:
        raise InvalidKeyError(f"key {_original(value)}: cannot write it: {e}") from None


# -- the one entry point ------------------------------------------------------------------------


def resolve_key(
    value: Any, spec: SerializerSpec | None, max_parallelism: int, text: str | None = None
) -> ResolvedKey:
    """``value`` (a key as ``read()`` returns it, or one of the spellings of the module doc)
    converted for the key type ``spec``: the key as ``read()`` returns it, its serialized bytes
    and its key group. ``text``: the text the value was parsed from, if any.

    Raises :class:`InvalidKeyError` when the key cannot be converted exactly.
    """
    if isinstance(value, ResolvedKey):
        value = value.value
    canonical = convert_key(value, spec, text)
    serialized = serialize_key(canonical, spec)
    key_group = _key_group(canonical, spec, serialized, max_parallelism)
    return ResolvedKey(canonical, serialized, key_group)


def _key_group(
    canonical: Any, spec: SerializerSpec | None, serialized: bytes | None, max_parallelism: int
) -> int | None:
    from statequery.hashing import binary_row_hash, java_hash, key_group_for_hash

    inner = _unwrap(spec)
    try:
        if isinstance(inner, RowDataSpec) and serialized is not None:
            code = binary_row_hash(serialized[4:])
        else:
            code = java_hash(canonical, spec)
    except UnsupportedFormatError:
        return None  # a user hashCode (POJO, enum): every key group is read
    except (InvalidOptionError, TypeError, ValueError, OverflowError) as e:
        raise InvalidKeyError(f"key {_original(canonical)}: {e}") from None
    return key_group_for_hash(code, max_parallelism)


# -- text ---------------------------------------------------------------------------------------


def _scalar_text(text: str, spec: FieldType | None, where: str) -> Any:
    inner = _unwrap(spec)
    try:
        if isinstance(inner, SqlType):
            value: Any = text
            if inner.root in _INT_SQL and not _INT_TEXT.fullmatch(text.strip()):
                value = _float_or_text(text)
            return _convert_sql(value, inner, True)
        if isinstance(inner, PrimitiveSpec):
            value = text
            name = inner.name.removesuffix("_value")
            if name in _INT_PRIMITIVES and not _INT_TEXT.fullmatch(text.strip()):
                value = _float_or_text(text)
            return _convert_primitive(value, inner, True)
        if isinstance(inner, EnumSpec) or inner is None:
            return text
        if isinstance(inner, PojoSpec):
            raise _Inexact("a POJO key needs a JSON object")
        return text
    except _Inexact as e:
        detail = f": {e}" if str(e) else ""
        raise InvalidKeyError(
            f"key {text!r} was read as the text {text!r}, which is not a valid "
            f"{key_type_name(inner)} ({where}){detail}"
        ) from None


def _float_or_text(text: str) -> Any:
    try:
        return Decimal(text.strip())
    except InvalidOperation:
        return text


def parse_key_text(text: str, spec: SerializerSpec | None) -> Any:
    """The key value ``text`` stands for, given the key's serializer ``spec`` (as ``read()``
    returns it: composite keys as a dict)."""
    fields = _fields(spec)
    stripped = text.strip()
    if fields is None:
        if isinstance(_unwrap(spec), PojoSpec) and stripped[:1] == "{":
            return _json(text)
        return _scalar_text(text, spec, "the key type")
    if stripped[:1] in ("[", "{"):
        return convert_key(_json(text), spec, text)
    if len(fields) == 1:
        name, t = fields[0]
        return {name: _scalar_text(text, t, f"the type of field {name}")}
    raise InvalidKeyError(
        f"the key has {len(fields)} fields: give it as a JSON array or object, e.g. "
        + json.dumps(["..."] * len(fields))
    )


def _json(text: str) -> Any:
    try:
        return json.loads(text.strip(), parse_float=Decimal)
    except ValueError as e:
        raise InvalidKeyError(f"key {text!r} is not valid JSON: {e}") from None
