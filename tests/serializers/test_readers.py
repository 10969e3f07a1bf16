"""Value readers on bytes whose encodings are documented (format reference §7) or written here
the way Flink's serializers write them."""

from __future__ import annotations

import struct
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statequery.decoder import Decoder
from statequery.exceptions import CorruptStateError, UnsupportedFormatError
from statequery.serializers.readers import (
    DECODE_ERRORS,
    DecodeError,
    decode_binary_row,
    reader_for,
)
from statequery.serializers.spec import (
    ArrayDataSpec,
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
    PojoField,
    PojoSpec,
    PrimitiveArraySpec,
    PrimitiveSpec,
    RawValueSpec,
    RowDataSpec,
    RowSpec,
    SqlField,
    SqlType,
    TimerSpec,
    TtlSpec,
    TupleSpec,
    WindowKeySpec,
)

LONG = PrimitiveSpec(name="long")
INT = PrimitiveSpec(name="int")
STRING = PrimitiveSpec(name="string")


def read(spec, data: bytes):
    d = Decoder(data, source="test")
    value = reader_for(spec).read(d)
    assert d.at_end(), f"{d.remaining} bytes left"
    return value


# -- writers mirroring Flink's serializers (for round trips) -------------------------------------


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def string_value(s: str | None) -> bytes:
    """``StringValue.writeString``."""
    if s is None:
        return b"\x00"
    units = struct.unpack(f">{len(s.encode('utf-16-be')) // 2}H", s.encode("utf-16-be"))
    return varint(len(units) + 1) + b"".join(varint(u) for u in units)


def be_long(v: int) -> bytes:
    return struct.pack(">q", v)


def be_int(v: int) -> bytes:
    return struct.pack(">i", v)


# -- StringValue ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hex_bytes", "text"),
    [
        ("06 68 65 6c 6c 6f", "hello"),
        ("01", ""),
        ("00", None),
        ("09 68 e9 01 6c 6c 6f ac 41 bd b0 03 80 bc 03", "héllo€😀"),
    ],
)
def test_string_value_reference_examples(hex_bytes: str, text: str | None) -> None:
    assert read(STRING, bytes.fromhex(hex_bytes)) == text


def test_string_longer_than_64k_and_supplementary() -> None:
    text = ("ab😀€" * 20000) + "x"
    data = string_value(text)
    assert len(data) > 65536
    assert read(STRING, data) == text
    ascii_text = "z" * 70000
    assert read(STRING, string_value(ascii_text)) == ascii_text


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_string_value_round_trip(text: str) -> None:
    assert read(STRING, string_value(text)) == text


def test_string_truncated_is_an_error_not_a_value() -> None:
    data = string_value("hello world")
    for cut in range(len(data)):
        with pytest.raises(CorruptStateError):
            read(STRING, data[:cut])


def test_string_huge_length_does_not_allocate() -> None:
    data = varint(2**31) + b"abc"
    with pytest.raises(CorruptStateError, match="exceeds"):
        read(STRING, data)


# -- scalars --------------------------------------------------------------------------------------


def test_primitives() -> None:
    assert read(LONG, be_long(-5)) == -5
    assert read(INT, be_int(7)) == 7
    assert read(PrimitiveSpec(name="short"), b"\xff\xfe") == -2
    assert read(PrimitiveSpec(name="byte"), b"\x80") == -128
    assert read(PrimitiveSpec(name="boolean"), b"\x02") is True
    assert read(PrimitiveSpec(name="double"), struct.pack(">d", 2.5)) == 2.5
    assert read(PrimitiveSpec(name="float"), struct.pack(">f", 0.5)) == 0.5
    assert read(PrimitiveSpec(name="char"), b"\x00\xe9") == "é"
    assert read(PrimitiveSpec(name="void"), b"\x00") is None
    assert read(PrimitiveSpec(name="long_value"), be_long(3)) == 3


def test_big_integer_and_big_decimal() -> None:
    big = PrimitiveSpec(name="bigint")
    assert read(big, be_int(0)) is None
    assert read(big, be_int(1)) == "0"
    assert read(big, be_int(3)) == "10"
    v = -(10**30) + 7
    raw = v.to_bytes((v.bit_length() + 8) // 8, "big", signed=True)
    assert read(big, be_int(len(raw) + 4) + raw) == str(v)
    dec = PrimitiveSpec(name="bigdec")
    raw = (1250).to_bytes(2, "big", signed=True)
    assert read(dec, be_int(len(raw) + 4) + raw + be_int(2)) == "12.50"
    assert read(dec, be_int(0)) is None
    assert read(dec, be_int(2) + be_int(-3)) == "1000"
    raw = (-5).to_bytes(1, "big", signed=True)
    assert read(dec, be_int(5) + raw + be_int(4)) == "-0.0005"


def test_java_time_types() -> None:
    assert read(PrimitiveSpec(name="local_date"), be_int(2024) + b"\x02\x1d") == 19782
    assert read(PrimitiveSpec(name="local_date"), be_int(-(2**31)) + b"\x80\x00") is None
    nanos = read(PrimitiveSpec(name="local_time"), b"\x01\x02\x03" + be_int(5))
    assert nanos == ((1 * 60 + 2) * 60 + 3) * 10**9 + 5
    assert read(PrimitiveSpec(name="instant"), be_long(10) + be_int(7)) == 10 * 10**9 + 7
    ldt = read(
        PrimitiveSpec(name="local_date_time"),
        be_int(1970) + b"\x01\x02" + b"\x00\x00\x01" + be_int(0),
    )
    assert ldt == 86400 * 10**9 + 10**9
    assert read(PrimitiveSpec(name="date"), be_long(-(2**63))) is None
    assert (
        read(PrimitiveSpec(name="sql_timestamp"), be_long(1500) + be_int(500_000_123))
        == 1 * 10**9 + 500_000_123
    )


def test_table_scalars() -> None:
    assert read(PrimitiveSpec(name="string_data"), be_int(3) + "héé".encode()[:3]) == "hé"
    assert read(
        PrimitiveSpec(name="decimal_data", precision=10, scale=2), be_long(1250)
    ) == Decimal("12.50")
    raw = (10**25 + 1).to_bytes(11, "big", signed=True)
    assert read(
        PrimitiveSpec(name="decimal_data", precision=30, scale=6), be_int(len(raw)) + raw
    ) == Decimal("10000000000000000000.000001")
    assert read(PrimitiveSpec(name="timestamp_data", precision=3), be_long(1234)) == 1234
    assert (
        read(PrimitiveSpec(name="timestamp_data", precision=6), be_long(1234) + be_int(456_000))
        == 1234456
    )
    # 7..9 digits: the exact text, over Flink's whole range (years 0000 to 9999)
    assert (
        read(PrimitiveSpec(name="timestamp_data", precision=9), be_long(1234) + be_int(456_789))
        == "1970-01-01 00:00:01.234456789"
    )
    assert (
        read(PrimitiveSpec(name="timestamp_data", precision=7),
             be_long(253_402_300_799_999) + be_int(999_999))
        == "9999-12-31 23:59:59.9999999"
    )
    assert (
        read(PrimitiveSpec(name="timestamp_data", precision=9),
             be_long(-62_167_219_200_000) + be_int(1))
        == "0000-01-01 00:00:00.000000001"
    )



@pytest.mark.parametrize(
    ("spec", "data"),
    [
        (PrimitiveSpec(name="timestamp_data", precision=6), be_long(2**62) + be_int(0)),
        (PrimitiveSpec(name="instant"), be_long(2**40) + be_int(0)),
        (PrimitiveSpec(name="sql_timestamp"), be_long(2**60) + be_int(0)),
        (
            PrimitiveSpec(name="local_date_time"),
            be_int(10**9) + b"\x01\x01" + b"\x00\x00\x00" + be_int(0),
        ),
    ],
)
def test_timestamps_beyond_64_bits_are_corrupt(spec: PrimitiveSpec, data: bytes) -> None:
    """A timestamp whose value in its Arrow unit overflows int64 is a typed error naming the
    source, not an OverflowError when the batch is built."""
    with pytest.raises(CorruptStateError, match="out of the 64-bit range") as e:
        read(spec, data)
    assert e.value.source == "test" and e.value.offset == 0


def test_binary_row_timestamp_beyond_64_bits_is_corrupt() -> None:
    t = _row_type(("ts6", SqlType("TIMESTAMP_WITHOUT_TIME_ZONE", precision=6)))
    w = RowWriter(1)
    w.put_var(0, struct.pack("<q", 2**62), low=0)
    with pytest.raises(DecodeError, match="out of the 64-bit range"):
        decode_binary_row(t, w.bytes())

def test_enum_and_namespaces() -> None:
    tier = EnumSpec(class_name="x.Tier", constants=("GOLD", "SILVER"))
    assert read(tier, be_int(1)) == "SILVER"
    with pytest.raises(CorruptStateError, match="enum index 2"):
        read(tier, be_int(2))
    assert read(NamespaceSpec(name="void"), b"\x00") is None
    with pytest.raises(CorruptStateError):
        read(NamespaceSpec(name="void"), b"\x01")
    assert read(NamespaceSpec(name="time_window"), be_long(0) + be_long(3600000)) == {
        "start": 0,
        "end": 3600000,
    }


# -- composites ------------------------------------------------------------------------------------


def test_tuple_row_pojo() -> None:
    assert read(TupleSpec(fields=(LONG, LONG)), be_long(576) + be_long(10)) == {"f0": 576, "f1": 10}
    row = RowSpec(fields=(LONG, STRING, INT), names=("a", "b", "c"), supports_row_kind=True)
    # mask: 2 kind bits (+U = 2 -> bit1 set), field b null -> bit 3  => 0b0101_0000
    assert read(row, bytes([0b0101_0000]) + be_long(1) + be_int(9)) == {"a": 1, "b": None, "c": 9}
    address = PojoSpec(
        class_name="x.Address",
        fields=(PojoField("city", "x.Address", STRING), PojoField("zip", "x.Address", INT)),
    )
    profile = PojoSpec(
        class_name="x.UserProfile",
        fields=(
            PojoField("address", "x.UserProfile", address),
            PojoField("lastAmount", "x.UserProfile", INT),
            PojoField("name", "x.UserProfile", STRING),
        ),
    )
    data = (
        b"\x02"
        + b"\x00"
        + b"\x02"
        + b"\x00"
        + string_value("city-0")
        + b"\x00"
        + be_int(1)
        + b"\x01"
        + b"\x00"
        + string_value("u")
    )
    assert read(profile, data) == {
        "address": {"city": "city-0", "zip": 1},
        "lastAmount": None,
        "name": "u",
    }
    assert read(profile, b"\x01") is None
    with pytest.raises(CorruptStateError, match="subclass"):
        read(profile, b"\x04" + b"\x00\x01x")


def test_collections() -> None:
    assert read(ListSpec(element=STRING), be_int(2) + string_value("a") + string_value("b")) == [
        "a",
        "b",
    ]
    m = MapSpec(key=STRING, value=LONG)
    assert read(
        m, be_int(2) + string_value("a") + b"\x00" + be_long(1) + string_value("b") + b"\x01"
    ) == [("a", 1), ("b", None)]
    assert read(MapSpec(key=INT, is_set=True), be_int(1) + be_int(4)) == [4]
    assert read(
        GenericArraySpec(element=STRING), be_int(2) + b"\x01" + string_value("x") + b"\x00"
    ) == ["x", None]
    assert read(PrimitiveArraySpec(element="byte"), be_int(3) + b"abc") == b"abc"
    assert read(PrimitiveArraySpec(element="long"), be_int(2) + be_long(1) + be_long(-1)) == [1, -1]
    assert read(PrimitiveArraySpec(element="string"), be_int(1) + string_value("q")) == ["q"]
    assert read(NullableSpec(inner=LONG, padding=8), b"\x01" + bytes(8)) is None
    assert read(NullableSpec(inner=LONG, padding=8), b"\x00" + be_long(4)) == 4
    assert read(EitherSpec(left=STRING, right=LONG), b"\x00" + be_long(4)) == {
        "left": None,
        "right": 4,
    }
    assert read(TtlSpec(inner=LONG), be_long(99) + be_long(4)) == {"last_access": 99, "value": 4}
    assert read(WindowKeySpec(key=LONG), be_long(7) + be_long(4)) == {"window": 7, "key": 4}
    ll = LinkedListSpec(element=LONG, has_null_mask=True)
    assert read(ll, be_int(3) + bytes([0b0100_0000]) + be_long(1) + be_long(3)) == [1, None, 3]


def test_timer_flipped_sign_bit() -> None:
    timer = TimerSpec(key=STRING, namespace=NamespaceSpec(name="void"))
    data = bytes.fromhex("800003bb2cc3d800") + bytes.fromhex("036b39") + b"\x00"
    assert read(timer, data) == {"timestamp": 4102444800000, "key": "k9", "namespace": None}


def test_impossible_counts_raise_before_allocating() -> None:
    for spec in (
        ListSpec(element=LONG),
        MapSpec(key=LONG, value=LONG),
        PrimitiveArraySpec(element="long"),
        PrimitiveArraySpec(element="byte"),
        GenericArraySpec(element=LONG),
    ):
        with pytest.raises(CorruptStateError):
            read(spec, be_int(2**31 - 1) + bytes(16))
        with pytest.raises(CorruptStateError):
            read(spec, be_int(-1))


def test_opaque_is_raw_at_slot_end_and_refused_inside() -> None:
    kryo = OpaqueSpec(family="kryo", type_class="x.Y")
    assert read(kryo, b"\x01\x02") == b"\x01\x02"
    with pytest.raises(UnsupportedFormatError, match="cannot be delimited"):
        reader_for(TupleSpec(fields=(kryo, LONG)))


# -- BinaryRowData --------------------------------------------------------------------------------

ROW_EXAMPLE = bytes.fromhex(
    "00000038"
    "0008000000000000"
    "2a00000000000000"
    "6162630000000083"
    "0d00000028000000"
    "0000000000000000"
    "6c6f6e6765722d737472696e67000000"
)


def _row_type(*fields: tuple[str, SqlType]) -> SqlType:
    return SqlType("ROW", fields=tuple(SqlField(n, t) for n, t in fields))


def test_binary_row_reference_example() -> None:
    t = _row_type(
        ("a", SqlType("BIGINT")),
        ("b", SqlType("VARCHAR", length=10)),
        ("c", SqlType("VARCHAR", length=20)),
        ("d", SqlType("INTEGER")),
    )
    assert read(RowDataSpec(type=t), ROW_EXAMPLE) == {
        "a": 42,
        "b": "abc",
        "c": "longer-string",
        "d": None,
    }


class RowWriter:
    """A minimal ``BinaryRowWriter`` (little-endian slots, 8-byte aligned variable part)."""

    def __init__(self, arity: int) -> None:
        self.null_bytes = ((arity + 63 + 8) // 64) * 8
        self.fixed = bytearray(self.null_bytes + 8 * arity)
        self.var = bytearray()

    def slot(self, i: int) -> int:
        return self.null_bytes + 8 * i

    def set_null(self, i: int) -> None:
        bit = i + 8
        self.fixed[bit >> 3] |= 1 << (bit & 7)

    def put(self, i: int, fmt: str, v: object) -> None:
        struct.pack_into(fmt, self.fixed, self.slot(i), v)

    def put_var(self, i: int, data: bytes, low: int | None = None) -> None:
        offset = len(self.fixed) + len(self.var)
        self.var += data + bytes((-len(data)) % 8)
        struct.pack_into(
            "<Q", self.fixed, self.slot(i), (offset << 32) | (len(data) if low is None else low)
        )

    def put_bytes(self, i: int, data: bytes) -> None:
        if len(data) <= 7:
            s = self.slot(i)
            self.fixed[s : s + len(data)] = data
            self.fixed[s + 7] = 0x80 | len(data)
        else:
            self.put_var(i, data)

    def bytes(self) -> bytes:
        return bytes(self.fixed + self.var)


def array_bytes(elem_size: int, values: list[bytes | None]) -> bytes:
    n = len(values)
    null_len = ((n + 31) // 32) * 4
    head = bytearray(struct.pack("<i", n) + bytes(null_len))
    for i, v in enumerate(values):
        if v is None:
            head[4 + (i >> 3)] |= 1 << (i & 7)
    body = b"".join(bytes(elem_size) if v is None else v.ljust(elem_size, b"\0") for v in values)
    out = bytes(head) + body
    return out + bytes((-len(out)) % 8)


def test_binary_row_every_sql_type() -> None:
    inner_t = _row_type(("x", SqlType("INTEGER")))
    inner = RowWriter(1)
    inner.put(0, "<i", 5)
    t = _row_type(
        ("bool", SqlType("BOOLEAN")),
        ("tiny", SqlType("TINYINT")),
        ("small", SqlType("SMALLINT")),
        ("int", SqlType("INTEGER")),
        ("big", SqlType("BIGINT")),
        ("f", SqlType("FLOAT")),
        ("d", SqlType("DOUBLE")),
        ("dec", SqlType("DECIMAL", precision=12, scale=2)),
        ("bigdec", SqlType("DECIMAL", precision=30, scale=6)),
        ("s", SqlType("CHAR", length=3)),
        ("long_s", SqlType("VARCHAR", length=100)),
        ("bin", SqlType("BINARY", length=2)),
        ("date", SqlType("DATE")),
        ("time", SqlType("TIME_WITHOUT_TIME_ZONE", precision=0)),
        ("ts3", SqlType("TIMESTAMP_WITHOUT_TIME_ZONE", precision=3)),
        ("ts6", SqlType("TIMESTAMP_WITHOUT_TIME_ZONE", precision=6)),
        ("ltz9", SqlType("TIMESTAMP_WITH_LOCAL_TIME_ZONE", precision=9)),
        ("arr", SqlType("ARRAY", element=SqlType("BIGINT"))),
        ("map", SqlType("MAP", key=SqlType("VARCHAR", length=5), value=SqlType("INTEGER"))),
        ("ms", SqlType("MULTISET", element=SqlType("INTEGER"))),
        ("row", inner_t),
        ("raw", SqlType("RAW", class_name="x.Y")),
        ("nul", SqlType("INTEGER")),
    )
    w = RowWriter(len(t.fields))
    w.put(0, "<?", True)
    w.put(1, "<b", -3)
    w.put(2, "<h", -300)
    w.put(3, "<i", 70000)
    w.put(4, "<q", -(2**40))
    w.put(5, "<f", 1.5)
    w.put(6, "<d", -2.25)
    w.put(7, "<q", 12325)
    big = -(10**25) - 123
    w.put_var(8, big.to_bytes(11, "big", signed=True))
    w.put_bytes(9, b"abc")
    w.put_bytes(10, "longer-than-seven-ü".encode())
    w.put_bytes(11, b"\x01\x02")
    w.put(12, "<i", 19782)
    w.put(13, "<i", 3600000)
    w.put(14, "<q", 1704067693123)
    w.put_var(15, struct.pack("<q", 1704067693123), low=456000)
    w.put_var(16, struct.pack("<q", -1), low=999999)
    w.put_var(17, array_bytes(8, [struct.pack("<q", 1), None, struct.pack("<q", 3)]))
    keys = array_bytes(8, [b"k1\0\0\0\0\0\x82", b"k2\0\0\0\0\0\x82"])
    values = array_bytes(4, [struct.pack("<i", 10), None])
    w.put_var(18, struct.pack("<i", len(keys)) + keys + values)
    ms_keys = array_bytes(4, [struct.pack("<i", 7)])
    ms_vals = array_bytes(4, [struct.pack("<i", 2)])
    w.put_var(19, struct.pack("<i", len(ms_keys)) + ms_keys + ms_vals)
    w.put_var(20, inner.bytes())
    w.put_var(21, b"\xca\xfe")
    w.set_null(22)
    row = w.bytes()
    assert decode_binary_row(t, row) == {
        "bool": True,
        "tiny": -3,
        "small": -300,
        "int": 70000,
        "big": -(2**40),
        "f": 1.5,
        "d": -2.25,
        "dec": Decimal("123.25"),
        "bigdec": Decimal(big).scaleb(-6),
        "s": "abc",
        "long_s": "longer-than-seven-ü",
        "bin": b"\x01\x02",
        "date": 19782,
        "time": 3600000,
        "ts3": 1704067693123,
        "ts6": 1704067693123456,
        "ltz9": "1969-12-31 23:59:59.999999999Z",  # -1 ns, exact text (7..9 digits)
        "arr": [1, None, 3],
        "map": [("k1", 10), ("k2", None)],
        "ms": [(7, 2)],
        "row": {"x": 5},
        "raw": b"\xca\xfe",
        "nul": None,
    }
    # through the serializer: int32 BE size prefix
    assert read(RowDataSpec(type=t), struct.pack(">i", len(row)) + row)["int"] == 70000
    # array/map serializers
    arr = array_bytes(4, [struct.pack("<i", 1)])
    assert read(ArrayDataSpec(element=SqlType("INTEGER")), be_int(len(arr)) + arr) == [1]
    mp = struct.pack("<i", len(ms_keys)) + ms_keys + ms_vals
    assert read(
        MapDataSpec(key=SqlType("INTEGER"), value=SqlType("INTEGER")), be_int(len(mp)) + mp
    ) == [(7, 2)]
    assert read(RawValueSpec(inner=LONG), be_int(8) + be_long(5)) == 5
    assert read(RawValueSpec(inner=OpaqueSpec()), be_int(2) + b"ab") == b"ab"


def test_binary_row_out_of_range_offsets_are_corrupt() -> None:
    t = _row_type(
        ("a", SqlType("BIGINT")),
        ("b", SqlType("VARCHAR", length=10)),
        ("c", SqlType("VARCHAR", length=20)),
        ("d", SqlType("INTEGER")),
    )
    bad = bytearray(ROW_EXAMPLE)
    bad[4 + 24 + 4] = 0x70  # field c offset far outside the row
    with pytest.raises(CorruptStateError, match="outside"):
        read(RowDataSpec(type=t), bytes(bad))
    with pytest.raises(CorruptStateError):
        read(RowDataSpec(type=t), ROW_EXAMPLE[:-8])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_random_bytes_never_crash_readers(data: bytes) -> None:
    """Arbitrary bytes give a value or a typed error, nothing else."""
    specs = [
        STRING,
        ListSpec(element=STRING),
        MapSpec(key=STRING, value=LONG),
        RowDataSpec(
            type=_row_type(
                ("a", SqlType("VARCHAR")),
                ("b", SqlType("DECIMAL", precision=30, scale=2)),
                ("c", SqlType("ARRAY", element=SqlType("VARCHAR"))),
            )
        ),
        PojoSpec(class_name="P", fields=(PojoField("a", "P", STRING),)),
        PrimitiveSpec(name="bigdec"),
        PrimitiveSpec(name="local_date_time"),
    ]
    for spec in specs:
        try:
            reader_for(spec).read(Decoder(data, source="fuzz"))
        except CorruptStateError:
            pass


def test_decode_error_is_in_the_documented_tuple() -> None:
    assert DecodeError in DECODE_ERRORS


def test_decoder_string_value_with_out_of_range_code_unit_is_corrupt() -> None:
    """``Decoder.read_string_value`` shares the reader's checks: a code unit above 0xFFFF is a
    typed error at the decoder's offset (it used to escape as ``struct.error``)."""
    d = Decoder(b"\x00\x00" + varint(2) + b"\xff\xff\x7f", pos=2, source="test", base_offset=100)
    with pytest.raises(CorruptStateError, match="out of range") as e:
        d.read_string_value()
    assert e.value.source == "test" and e.value.offset == 100 + 6
    d = Decoder(varint(4) + b"abc", source="test")
    assert d.read_string_value() == "abc" and d.at_end()
    assert Decoder(b"\x00", source="test").read_string_value() is None
    with pytest.raises(CorruptStateError, match="exceeds the 2 bytes left"):
        Decoder(varint(4) + b"abcd", end=3, source="test").read_string_value()


def test_row_fields_read_by_their_stored_serializers() -> None:
    """A RAW field is read by the serializer the RowData snapshot stored for it, not guessed from
    the logical type: NullSerializer placeholders (state-backed data views) are null, a known
    DataStream serializer gives its value, an unknown one stays bytes (with a reason in the Arrow
    field metadata); nested rows use their own stored field serializers."""
    from statequery.arrow.types import arrow_type

    void = PrimitiveSpec(name="void")
    raw_t = SqlType("RAW", class_name="org.apache.flink.table.api.dataview.MapView")
    inner_t = _row_type(("r", raw_t))
    t = _row_type(("view", raw_t), ("n", raw_t), ("kryo", raw_t), ("nested", inner_t))
    nested_spec = RowDataSpec(type=inner_t, field_specs=(RawValueSpec(inner=LONG),))
    spec = RowDataSpec(
        type=t,
        field_specs=(
            RawValueSpec(inner=void),
            RawValueSpec(inner=LONG),
            RawValueSpec(inner=OpaqueSpec(family="kryo", type_class="x.Note")),
            nested_spec,
        ),
    )
    inner = RowWriter(1)
    inner.put_var(0, be_long(-7))
    w = RowWriter(4)
    # RAW values always live in the variable-length part (writeSegmentsToVarLenPart)
    w.put_var(0, b"\x00")
    w.put_var(1, be_long(42))
    w.put_var(2, b"\x57\x01")
    w.put_var(3, inner.bytes())
    row = w.bytes()
    data = struct.pack(">i", len(row)) + row
    assert read(spec, data) == {"view": None, "n": 42, "kryo": b"\x57\x01", "nested": {"r": -7}}
    # without stored serializers (old snapshots) RAW stays raw bytes
    assert read(RowDataSpec(type=t), data)["view"] == b"\x00"

    at = arrow_type(spec)
    assert at.field("view").type == pa.null() and at.field("n").type == pa.int64()
    assert at.field("nested").type == pa.struct([("r", pa.int64())])
    assert at.field("kryo").type == pa.binary()
    assert b"kryo serializer (x.Note)" in at.field("kryo").metadata[b"statequery.raw_reason"]
    assert spec.decodable  # an unknown RAW field never turns the whole row into bytes

    # a NullSerializer placeholder holds exactly one byte
    w = RowWriter(4)
    w.put_var(0, b"\x00\x00")
    w.put_var(1, be_long(1))
    w.put_var(2, b"")
    w.put_var(3, inner.bytes())
    row = w.bytes()
    with pytest.raises(CorruptStateError):
        read(spec, struct.pack(">i", len(row)) + row)
