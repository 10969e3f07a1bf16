"""Identity and hashing as Flink computes them: OperatorIDs, Java ``hashCode``, key groups.

* :func:`operator_id_from_uid` — ``StreamGraphHasherV2.generateUserSpecifiedHash``: Guava
  ``murmur3_128(0)`` of the uid's UTF-8 bytes; the 16 hash bytes are the OperatorID.
* :func:`java_hash` — ``Object.hashCode()`` of key values: String (UTF-16 code units), boxed
  primitives, ``BigInteger``/``BigDecimal``, Flink ``Tuple``, ``Row`` (``RowUtils.deepHashCodeRow``)
  and ``BinaryRowData`` (``MurmurHashUtils`` seed 42 over the row bytes).
* :func:`murmur_hash`, :func:`key_group_for_hash`, :func:`key_group_of` —
  ``KeyGroupRangeAssignment``.
* :func:`key_group_range_for_operator_index`, :func:`operator_index_for_key_group`.
* :func:`binary_row_bytes` — a ``BinaryRowData`` writer for the common SQL types, so the key group
  of a SQL (RowData) key can be computed from plain Python values.
"""

from __future__ import annotations

import base64
import datetime as _dt
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Context, Decimal
from typing import Any

import mmh3

from statequery.exceptions import InvalidOptionError, UnsupportedFormatError
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
    "KeyGroupRange",
    "binary_row_bytes",
    "binary_row_hash",
    "compute_default_max_parallelism",
    "java_hash",
    "java_string_hash",
    "key_group_for_hash",
    "key_group_of",
    "key_group_prefix_bytes",
    "key_group_range_for_operator_index",
    "murmur_hash",
    "operator_id_from_uid",
    "operator_index_for_key_group",
    "split_key_groups",
]

_MASK32 = 0xFFFFFFFF
_MASK64 = 0xFFFFFFFFFFFFFFFF
UPPER_BOUND_MAX_PARALLELISM = 1 << 15
BINARY_ROW_HASH_SEED = 42


def _i32(v: int) -> int:
    v &= _MASK32
    return v - (1 << 32) if v & 0x80000000 else v


def _i64(v: int) -> int:
    v &= _MASK64
    return v - (1 << 64) if v & (1 << 63) else v


# -- operator ids ------------------------------------------------------------------------------


def operator_id_from_uid(uid: str) -> str:
    """The OperatorID (32 hex chars) Flink derives from an operator's uid."""
    return mmh3.hash_bytes(uid.encode("utf-8"), 0, x64arch=True).hex()


# -- murmur and key groups ---------------------------------------------------------------------


def murmur_hash(code: int) -> int:
    """``MathUtils.murmurHash(int)``: MurmurHash3_x86_32 of one int (seed 0), folded to >= 0."""
    h = mmh3.hash(struct.pack("<i", _i32(code)), 0, signed=True)
    if h >= 0:
        return h
    if h == -(1 << 31):
        return 0
    return -h


def key_group_for_hash(hash_code: int, max_parallelism: int) -> int:
    """``KeyGroupRangeAssignment.computeKeyGroupForKeyHash``."""
    if not 1 <= max_parallelism <= UPPER_BOUND_MAX_PARALLELISM:
        raise InvalidOptionError(f"max parallelism {max_parallelism} outside [1, 32768]")
    return murmur_hash(hash_code) % max_parallelism


def key_group_prefix_bytes(max_parallelism: int) -> int:
    """``CompositeKeySerializationUtils.computeRequiredBytesInKeyGroupPrefix``: 1 or 2."""
    return 1 if max_parallelism <= 128 else 2


def compute_default_max_parallelism(parallelism: int) -> int:
    """``KeyGroupRangeAssignment.computeDefaultMaxParallelism``."""
    p = parallelism + parallelism // 2
    rounded = 1 << max(0, (p - 1).bit_length())
    return min(max(rounded, 128), UPPER_BOUND_MAX_PARALLELISM)


@dataclass(frozen=True, order=True)
class KeyGroupRange:
    """An inclusive key-group range ``[start, end]`` (``KeyGroupRange``); empty when end < start."""

    start: int
    end: int

    def __len__(self) -> int:
        return max(0, self.end - self.start + 1)

    def __contains__(self, key_group: object) -> bool:
        return isinstance(key_group, int) and self.start <= key_group <= self.end

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(self.start, self.end + 1))

    def __str__(self) -> str:
        return f"[{self.start}, {self.end}]"


def key_group_range_for_operator_index(
    max_parallelism: int, parallelism: int, operator_index: int
) -> KeyGroupRange:
    """``computeKeyGroupRangeForOperatorIndex``: the key groups subtask ``operator_index`` owns."""
    if not 0 <= operator_index < parallelism or parallelism > max_parallelism:
        raise InvalidOptionError(
            f"no subtask {operator_index} at parallelism {parallelism} / max {max_parallelism}"
        )
    start = (operator_index * max_parallelism + parallelism - 1) // parallelism
    end = ((operator_index + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(start, end)


def operator_index_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """``computeOperatorIndexForKeyGroup``: the subtask that owns ``key_group``."""
    if not 0 <= key_group < max_parallelism:
        raise InvalidOptionError(f"key group {key_group} outside [0, {max_parallelism})")
    return key_group * parallelism // max_parallelism


def split_key_groups(key_groups: Iterable[int], size: int) -> list[list[int]]:
    """``key_groups`` (in their order) in consecutive pieces of at most ``size`` key groups: the
    one splitter of key groups into ranges (scan tasks, diff and stats ranges)."""
    groups = list(key_groups)
    return [groups[i : i + size] for i in range(0, len(groups), size)]


# -- Java hashCode -----------------------------------------------------------------------------


def java_string_hash(s: str) -> int:
    """``String.hashCode``: ``31*h + c`` over UTF-16 code units."""
    h = 0
    if s.isascii():
        for ch in s.encode("ascii"):
            h = (31 * h + ch) & _MASK32
        return _i32(h)
    data = s.encode("utf-16-be", "surrogatepass")
    for (unit,) in struct.iter_unpack(">H", data):
        h = (31 * h + unit) & _MASK32
    return _i32(h)


def _long_hash(v: int) -> int:
    v &= _MASK64
    return _i32(v ^ (v >> 32))


def _double_hash(v: float) -> int:
    if math.isnan(v):
        bits = 0x7FF8000000000000
    else:
        (bits,) = struct.unpack(">q", struct.pack(">d", v))
    return _long_hash(bits)


def _float_hash(v: float) -> int:
    if math.isnan(v):
        return 0x7FC00000
    bits: int = struct.unpack(">i", struct.pack(">f", v))[0]
    return bits


def _big_integer_hash(v: int) -> int:
    """``BigInteger.hashCode``: ``31*h + mag[i]`` over the 32-bit magnitude words, times signum."""
    if v == 0:
        return 0
    mag = abs(v)
    words: list[int] = []
    while mag:
        words.append(mag & _MASK32)
        mag >>= 32
    h = 0
    for w in reversed(words):
        h = (31 * h + w) & _MASK32
    return _i32(h * (1 if v > 0 else -1))


def _big_decimal_hash(v: Decimal) -> int:
    """``BigDecimal.hashCode``: ``31*unscaledValue.hashCode() + scale`` (compact form agrees)."""
    sign, digits, exponent = v.as_tuple()
    if not isinstance(exponent, int):
        raise InvalidOptionError(f"{v} has no Java BigDecimal form")
    unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
    scale = -exponent
    if abs(unscaled) < (1 << 63):  # BigDecimal keeps it compact (intCompact)
        val2 = abs(unscaled)
        temp = _i32(((val2 >> 32) * 31) + (val2 & _MASK32))
        return _i32(31 * (-temp if unscaled < 0 else temp) + scale)
    return _i32(31 * _big_integer_hash(unscaled) + scale)


def _tuple_hash(values: Sequence[Any], specs: Sequence[SerializerSpec | None]) -> int:
    """``TupleN.hashCode``: ``31*acc + f_i.hashCode()`` (null fields hash to 0)."""
    h = 0
    for i, v in enumerate(values):
        spec = specs[i] if i < len(specs) else None
        h = (31 * h + (0 if v is None else java_hash(v, spec))) & _MASK32
    return _i32(h)


def _row_deep_hash(value: Any, spec: SerializerSpec | None) -> int:
    """``RowUtils.deepHashCodeInternal`` of one field."""
    if value is None:
        return 0
    if isinstance(spec, RowSpec) or (spec is None and isinstance(value, _RowValue)):
        return (31 + java_hash(value, spec)) & _MASK32
    if isinstance(value, (list, tuple)) and not isinstance(spec, TupleSpec):
        h = 1
        for item in value:
            h = (31 * h + _row_deep_hash(item, None)) & _MASK32
        return h
    if isinstance(spec, PrimitiveArraySpec) and spec.element == "byte":
        # Arrays.deepHashCode(new Object[] {bytes}) = 31 + Arrays.hashCode(byte[]): PyFlink's
        # pickled keys, ROW<f0 BYTES>
        if isinstance(value, Mapping) and set(value) == {"$bytes"}:  # the fixtures' JSON form
            value = base64.b64decode(value["$bytes"])
        h = 1
        for b in bytes(value):
            h = (31 * h + (b - 256 if b > 127 else b)) & _MASK32
        return (31 + h) & _MASK32
    return (31 + java_hash(value, spec)) & _MASK32


class _RowValue(tuple):  # type: ignore[type-arg]
    """Marks a tuple as a Flink ``Row`` (positional fields) when no spec says so."""

    kind: int = 0


def _row_hash(values: Sequence[Any], specs: Sequence[SerializerSpec | None], kind: int = 0) -> int:
    """``Row.hashCode`` = ``RowUtils.deepHashCodeRow``: ``31*kind + deepHashCode(fields)``."""
    h = 1
    for i, v in enumerate(values):
        spec = specs[i] if i < len(specs) else None
        h = (31 * h + _row_deep_hash(v, spec)) & _MASK32
    return _i32(31 * kind + h)


def _field_values(value: Any, names: Sequence[str], arity: int) -> list[Any]:
    """Positional field values of a composite key given as a mapping, sequence or scalar."""
    if isinstance(value, Mapping):
        out = []
        for i in range(arity):
            name = names[i] if i < len(names) and names[i] else f"f{i}"
            if name in value:
                out.append(value[name])
            elif f"f{i}" in value:
                out.append(value[f"f{i}"])
            else:
                raise InvalidOptionError(f"key value has no field {name!r}: {value!r}")
        return out
    if isinstance(value, (list, tuple)):
        if len(value) != arity:
            raise InvalidOptionError(f"key value has {len(value)} fields, the key type {arity}")
        return list(value)
    if arity == 1:
        return [value]
    raise InvalidOptionError(f"a key of {arity} fields needs a mapping or sequence, got {value!r}")


def java_hash(value: Any, spec: SerializerSpec | None = None) -> int:
    """The Java ``hashCode()`` of the key ``value`` whose serializer is ``spec``.

    Without a spec the Python type decides (str → String, bool → Boolean, int → Long, float →
    Double, bytes → ``BinaryRowData`` bytes, Decimal → BigDecimal). POJO and enum keys hash with the
    user's ``hashCode``/identity and are refused (:class:`UnsupportedFormatError`).
    """
    if isinstance(spec, NullableSpec):
        return 0 if value is None else java_hash(value, spec.inner)
    if isinstance(spec, PrimitiveSpec):
        return _primitive_hash(value, spec)
    if isinstance(spec, TupleSpec):
        values = _field_values(value, (), len(spec.fields))
        return _tuple_hash(values, spec.fields)
    if isinstance(spec, RowSpec):
        kind = getattr(value, "kind", 0)
        values = _field_values(value, spec.names, len(spec.fields))
        return _row_hash(values, spec.fields, kind)
    if isinstance(spec, RowDataSpec):
        return binary_row_hash(binary_row_bytes(value, spec.type))
    if isinstance(spec, (PojoSpec, EnumSpec)):
        raise UnsupportedFormatError(
            f"the key group of a {spec.display} key depends on the user's hashCode(); "
            "statequery cannot compute it (look the key up in every key group instead)"
        )
    if spec is not None:
        raise UnsupportedFormatError(f"cannot compute the Java hashCode of a {spec.display} key")
    # no spec: infer from the Python type
    if isinstance(value, bool):
        return 1231 if value else 1237
    if isinstance(value, str):
        return java_string_hash(value)
    if isinstance(value, int):
        return _long_hash(value)
    if isinstance(value, float):
        return _double_hash(value)
    if isinstance(value, Decimal):
        return _big_decimal_hash(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return binary_row_hash(bytes(value))
    if isinstance(value, _RowValue):
        return _row_hash(list(value), (), value.kind)
    if isinstance(value, tuple):
        return _tuple_hash(value, ())
    raise UnsupportedFormatError(f"cannot compute the Java hashCode of {type(value).__name__}")


def _primitive_hash(value: Any, spec: PrimitiveSpec) -> int:
    name = spec.name
    if value is None:
        raise InvalidOptionError(f"a {name} key cannot be null")
    if name in ("string", "string_data", "char"):
        if not isinstance(value, str):
            raise InvalidOptionError(f"a {name} key must be a str, got {value!r}")
        if name == "char":
            if len(value.encode("utf-16-be", "surrogatepass")) != 2:
                raise InvalidOptionError(f"a char key must be one UTF-16 code unit: {value!r}")
            return ord(value)
        return java_string_hash(value)
    if name == "boolean":
        return 1231 if value else 1237
    if name in ("int", "short", "byte"):
        return _i32(int(value))
    if name == "long":
        return _long_hash(int(value))
    if name == "double":
        return _double_hash(float(value))
    if name == "float":
        return _float_hash(float(value))
    if name == "bigint":
        return _big_integer_hash(int(value))
    if name == "bigdec":
        return _big_decimal_hash(Decimal(value))
    if name in ("date", "sql_date", "sql_time"):  # java.util.Date: hash of getTime()
        return _long_hash(int(value))
    raise UnsupportedFormatError(f"cannot compute the Java hashCode of a {name} key")


def key_group_of(value: Any, max_parallelism: int, spec: SerializerSpec | None = None) -> int:
    """The key group Flink assigns to ``value`` (``KeyGroupRangeAssignment.assignToKeyGroup``)."""
    return key_group_for_hash(java_hash(value, spec), max_parallelism)


# -- BinaryRowData writer ----------------------------------------------------------------------


def binary_row_hash(row: bytes) -> int:
    """``BinaryRowData.hashCode``: ``MurmurHashUtils.hashUnsafeBytesByWords`` with seed 42."""
    if len(row) % 4:
        raise InvalidOptionError("BinaryRowData bytes must be a multiple of 4 long")
    return mmh3.hash(row, BINARY_ROW_HASH_SEED, signed=True)


_FIXED_ROOTS_4 = ("INTEGER", "DATE", "TIME_WITHOUT_TIME_ZONE", "INTERVAL_YEAR_MONTH")
_EPOCH = _dt.datetime(1970, 1, 1)
_EPOCH_DATE = _dt.date(1970, 1, 1)


def _null_bits_size(arity: int) -> int:
    return ((arity + 63 + 8) // 64) * 8


def _decimal_unscaled(value: Any, precision: int, scale: int) -> int:
    d = Decimal(str(value)) if isinstance(value, (str, float)) else Decimal(value)
    # the default context (28 digits) would round DECIMAL(29..38) values before the check
    exact = Context(prec=max(precision, len(d.as_tuple().digits)) + scale + 2)
    q = d.scaleb(scale, context=exact).to_integral_value(context=exact)
    if len(str(abs(int(q)))) > precision:
        raise InvalidOptionError(f"{value} does not fit DECIMAL({precision}, {scale})")
    return int(q)


def _to_bytes(value: Any) -> bytes:
    if isinstance(value, Mapping) and "$bytes" in value:
        return base64.b64decode(value["$bytes"])
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise InvalidOptionError(f"expected bytes, got {value!r}")


def _timestamp_parts(value: Any) -> tuple[int, int]:
    """(epoch millis, nano of milli) of a TIMESTAMP value: datetime or epoch nanoseconds."""
    if isinstance(value, _dt.datetime):
        # pandas.Timestamp and statequery.keys.Timestamp carry nanoseconds below the micros
        extra = int(getattr(value, "nanosecond", 0) or 0)
        if value.tzinfo is not None:
            value = value.astimezone(_dt.timezone.utc).replace(tzinfo=None)
        delta = value - _EPOCH
        micros = (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
        nanos = micros * 1000 + extra
    elif isinstance(value, int) and not isinstance(value, bool):
        nanos = value
    else:
        raise InvalidOptionError(f"expected a datetime or epoch nanoseconds, got {value!r}")
    millis, nano_of_milli = divmod(nanos, 1_000_000)
    return millis, nano_of_milli


def _fixed_value(t: SqlType, value: Any) -> bytes | None:
    """The 8-byte slot of a fixed-length value, or None when the type is variable-length."""
    r = t.root
    if r == "BOOLEAN":
        return struct.pack("<?7x", bool(value))
    if r == "TINYINT":
        return struct.pack("<b7x", int(value))
    if r == "SMALLINT":
        return struct.pack("<h6x", int(value))
    if r in _FIXED_ROOTS_4:
        if r == "DATE" and isinstance(value, _dt.date):
            value = (value - _EPOCH_DATE).days
        elif r == "TIME_WITHOUT_TIME_ZONE" and isinstance(value, _dt.time):
            value = ((value.hour * 60 + value.minute) * 60 + value.second) * 1000 + (
                value.microsecond // 1000
            )
        return struct.pack("<i4x", int(value))
    if r == "FLOAT":
        return struct.pack("<f4x", float(value))
    if r in ("BIGINT", "INTERVAL_DAY_TIME"):
        return struct.pack("<q", int(value))
    if r == "DOUBLE":
        return struct.pack("<d", float(value))
    if r == "DECIMAL" and (t.precision or 10) <= 18:
        return struct.pack("<q", _decimal_unscaled(value, t.precision or 10, t.scale or 0))
    if (
        r in ("TIMESTAMP_WITHOUT_TIME_ZONE", "TIMESTAMP_WITH_LOCAL_TIME_ZONE")
        and (t.precision if t.precision is not None else 6) <= 3
    ):
        millis, _ = _timestamp_parts(value)
        return struct.pack("<q", millis)
    return None


def _pad8(n: int) -> int:
    return (n + 7) & ~7


class _RowWriter:
    """``BinaryRowWriter`` / ``AbstractBinaryWriter`` over a bytearray (little-endian slots)."""

    def __init__(self, arity: int, header_bits: int) -> None:
        self.null_bits = header_bits
        self.fixed = self.null_bits + 8 * arity
        self.buf = bytearray(self.fixed)

    def set_null(self, pos: int, bit_base: int) -> None:
        bit = pos + bit_base
        self.buf[bit >> 3] |= 1 << (bit & 7)

    def slot(self, pos: int) -> int:
        return self.null_bits + 8 * pos

    def put_slot(self, pos: int, data: bytes) -> None:
        o = self.slot(pos)
        self.buf[o : o + 8] = data

    def append_var(self, data: bytes, reserve: int | None = None) -> int:
        offset = len(self.buf)
        size = _pad8(reserve if reserve is not None else len(data))
        self.buf.extend(data)
        self.buf.extend(b"\x00" * (size - len(data)))
        return offset

    def set_offset_and_size(self, pos: int, offset: int, size: int) -> None:
        self.put_slot(pos, struct.pack("<q", _i64((offset << 32) | (size & _MASK32))))


def _write_field(w: _RowWriter, pos: int, t: SqlType, value: Any, bit_base: int) -> None:
    r = t.root
    if value is None:
        w.set_null(pos, bit_base)
        # the generated projections (BinaryRowDataKeySelector) reserve the variable part of
        # non-compact DECIMAL and TIMESTAMP even for nulls (CodeGenUtils.binaryWriterWriteNull)
        if r == "DECIMAL" and (t.precision or 10) > 18:
            w.set_offset_and_size(pos, w.append_var(b"", 16), 0)
        elif (
            r in ("TIMESTAMP_WITHOUT_TIME_ZONE", "TIMESTAMP_WITH_LOCAL_TIME_ZONE")
            and (t.precision if t.precision is not None else 6) > 3
        ):
            w.set_offset_and_size(pos, w.append_var(b"", 8), 0)
        return
    fixed = _fixed_value(t, value)
    if fixed is not None:
        w.put_slot(pos, fixed)
        return
    if r in ("CHAR", "VARCHAR", "BINARY", "VARBINARY"):
        if r in ("CHAR", "VARCHAR") and not isinstance(value, str):
            raise InvalidOptionError(f"expected a str for {t}, got {value!r}")
        data = value.encode("utf-8") if r in ("CHAR", "VARCHAR") else _to_bytes(value)
        if len(data) <= 7:
            w.put_slot(pos, data + b"\x00" * (7 - len(data)) + bytes([0x80 | len(data)]))
        else:
            w.set_offset_and_size(pos, w.append_var(data), len(data))
        return
    if r == "DECIMAL":
        unscaled = _decimal_unscaled(value, t.precision or 10, t.scale or 0)
        data = _java_big_integer_bytes(unscaled)
        if len(data) > 16:
            raise InvalidOptionError(f"{value} does not fit DECIMAL({t.precision}, {t.scale})")
        w.set_offset_and_size(pos, w.append_var(data, 16), len(data))
        return
    if r in ("TIMESTAMP_WITHOUT_TIME_ZONE", "TIMESTAMP_WITH_LOCAL_TIME_ZONE"):
        millis, nano = _timestamp_parts(value)
        w.set_offset_and_size(pos, w.append_var(struct.pack("<q", millis)), nano)
        return
    if r == "ROW":
        data = binary_row_bytes(value, t)
        w.set_offset_and_size(pos, w.append_var(data), len(data))
        return
    if r == "ARRAY" and t.element is not None:
        data = binary_array_bytes(value, t.element)
        w.set_offset_and_size(pos, w.append_var(data), len(data))
        return
    raise UnsupportedFormatError(f"cannot build BinaryRowData bytes for a {t} field")


def _java_big_integer_bytes(v: int) -> bytes:
    """``BigInteger.toByteArray``: minimal big-endian two's complement."""
    n = (v.bit_length() + 8) // 8
    return v.to_bytes(n, "big", signed=True)


def binary_row_bytes(value: Any, row_type: SqlType, row_kind: int = 0) -> bytes:
    """The ``BinaryRowData`` bytes of a row of ``row_type`` (a ROW :class:`SqlType`).

    ``value`` is a mapping by field name (or ``f0``, ``f1``...), a sequence in field order, or a
    scalar for a one-field row. Values may be Python natives (int, float, str, bytes, Decimal,
    date, time, datetime) or the JSON normalisation of docs/fixtures.md (``{"$bytes": b64}``,
    decimal strings, epoch nanoseconds for timestamps, days/millis for DATE/TIME).
    """
    if row_type.root not in ("ROW", "STRUCTURED_TYPE"):
        raise InvalidOptionError(f"not a ROW type: {row_type}")
    fields = row_type.fields
    names = [f.name for f in fields]
    values = _field_values(value, names, len(fields))
    w = _RowWriter(len(fields), _null_bits_size(len(fields)))
    w.buf[0] = row_kind & 0xFF
    for i, (f, v) in enumerate(zip(fields, values, strict=True)):
        _write_field(w, i, f.type, v, 8)
    return bytes(w.buf)


def _array_element_size(t: SqlType) -> int:
    r = t.root
    if r in ("BOOLEAN", "TINYINT"):
        return 1
    if r == "SMALLINT":
        return 2
    if r in _FIXED_ROOTS_4 or r == "FLOAT":
        return 4
    return 8


def binary_array_bytes(values: Sequence[Any], element: SqlType) -> bytes:
    """``BinaryArrayData`` bytes (``BinaryArrayWriter``) of ``values`` with ``element`` type."""
    n = len(values)
    esize = _array_element_size(element)
    header = 4 + ((n + 31) // 32) * 4
    fixed = _pad8(header + esize * n)
    buf = bytearray(fixed)
    struct.pack_into("<i", buf, 0, n)

    class _ArrayWriter(_RowWriter):
        def __init__(self) -> None:
            self.null_bits = header
            self.buf = buf

        def slot(self, pos: int) -> int:
            return header + esize * pos

        def set_null(self, pos: int, bit_base: int) -> None:
            self.buf[4 + (pos >> 3)] |= 1 << (pos & 7)

        def put_slot(self, pos: int, data: bytes) -> None:
            o = self.slot(pos)
            self.buf[o : o + esize] = data[:esize]

    w = _ArrayWriter()
    for i, v in enumerate(values):
        if v is None:
            w.set_null(i, 0)
            continue
        _write_field(w, i, element, v, 0)
    return bytes(w.buf)
