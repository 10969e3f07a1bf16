"""Avro state (docs/avro.md): GenericRecords Flink's ``AvroSerializer`` wrote, decoded from the
writer schema in the savepoint with no option.

The ``types-avro-*`` fixtures (Flink 2.3, hashmap canonical and RocksDB native; Flink 1.20.5,
``v1.20-types-avro-*``) keep a record
with every Avro type and logical type and their edge values. Each is read completely on the
compiled and on the pure-Python path and must equal Flink's own dump (Avro's
``GenericDatumReader`` through Flink's ``AvroSerializer``, ``dump/<name>.jsonl``) entry by
entry, and the job's model (``expected/<name>.jsonl``). The reader's bounds are checked on
crafted bytes.
"""

from __future__ import annotations

import decimal
import json
import math
import os
import struct
from typing import Any

import pyarrow as pa
import pytest
from conftest import FIXTURES, dump_entries, expected_entries, fixture_dir, fixture_records
from support.childread import differences, read_in_child
from support.entries import canonical

import statequery
from statequery.backends import fastpath
from statequery.decoder import DecodeError
from statequery.serializers.avro import AvroSchemaError, avro_reader, parse_schema
from statequery.serializers.readers import reader_for
from statequery.serializers.spec import AvroSpec

AVRO = [r["name"] for r in fixture_records() if r["job"] == "types-avro"]
EVOLVED = [r["name"] for r in fixture_records() if r["job"] == "types-avro-evolved"]
# the tables named by uid (avro_state__...): a Flink 1.x _metadata records no uids
AVRO_UIDS = [n for n in AVRO if not n.startswith("v1.")]


def test_the_avro_fixtures_are_in_the_manifest() -> None:
    # v1.20-: AvroStateJob on Flink 1.20.5 (generate_version_fixtures.py --job types-avro)
    assert sorted(AVRO) == ["types-avro-hashmap-canonical", "types-avro-rocksdb-native",
                            "v1.20-types-avro-hashmap-canonical", "v1.20-types-avro-rocksdb-native"]
    assert sorted(EVOLVED) == ["types-avro-evolved-hashmap-canonical",
                               "types-avro-evolved-rocksdb-native"]


@pytest.mark.parametrize("path", ["compiled", "pure"])
@pytest.mark.parametrize("name", AVRO + EVOLVED)
def test_avro_fixture_equals_flink_dump(name: str, path: str) -> None:
    if path == "compiled" and fastpath.compiled() is None:
        assert os.environ.get("STATEQUERY_NO_EXTENSIONS"), "statequery.backends._read not built"
    mine, _ = read_in_child(name, fixture_dir(name), pure=path == "pure")
    assert not [x for x in mine if "$error" in x or "$raw" in x], mine[:3]
    dump = sorted(canonical(e) for e in dump_entries(name))
    assert len(dump) == (26 if name in EVOLVED else 66)
    assert mine == dump, f"{name} [{path}]: " + differences(mine, dump)
    got = []
    for line in mine:
        e = json.loads(line)
        e.pop("key_group", None)
        got.append(canonical(e))
    assert sorted(got) == sorted(canonical(e) for e in expected_entries(name))


def _everything(name: str) -> tuple[pa.DataType, dict[str, Any]]:
    sp = statequery.open(str(fixture_dir(name)))
    table = sp.read("avro_state__everything")
    rows = {r["key"]: r["value"] for r in table.to_pylist()}
    return table.schema.field("value").type, rows


def test_the_arrow_type_comes_from_the_writer_schema() -> None:
    t, _ = _everything("types-avro-hashmap-canonical")
    assert t.field("i").type == pa.int32() and t.field("l").type == pa.int64()
    assert t.field("f").type == pa.float32() and t.field("n").type == pa.null()
    assert t.field("color").type == pa.string() and t.field("fx").type == pa.binary()
    assert t.field("items").type == pa.list_(
        pa.struct([("name", pa.string()), ("qty", pa.int64()), ("note", pa.string())]))
    assert t.field("longs").type == pa.map_(pa.string(), pa.int64())
    assert t.field("opt_s").type == pa.string()  # ["null", "string"]: nullable string
    assert [f.name for f in t.field("multi").type] == ["branch", "int", "string", "Item", "array"]
    assert [f.name for f in t.field("either").type] == ["branch", "string", "long"]
    assert t.field("dec_bytes").type == pa.decimal128(20, 4)
    assert t.field("dec_fixed").type == pa.decimal128(21, 2)
    assert t.field("day").type == pa.date32()
    assert t.field("t_ms").type == pa.time32("ms") and t.field("t_us").type == pa.time64("us")
    assert t.field("ts_ms").type == pa.timestamp("ms", tz="UTC")
    assert t.field("ts_us").type == pa.timestamp("us", tz="UTC")
    assert t.field("lts_us").type == pa.timestamp("us")
    assert t.field("id").type == pa.string() and t.field("uid16").type == pa.string()
    inner = t.field("nested").type.field("inner").type
    assert inner.field("grid").type == pa.list_(pa.map_(pa.string(), pa.float64()))


@pytest.mark.parametrize("name", AVRO_UIDS)
def test_edge_values(name: str) -> None:
    _, rows = _everything(name)
    k1, k2, k3 = rows["k1"], rows["k2"], rows["k3"]
    assert k1["i"] == -(2**31) and k1["l"] == -(2**63) and k2["l"] == 2**63 - 1
    assert math.copysign(1.0, k1["d"]) == -1.0 and k1["d"] == 0.0
    assert math.isnan(k2["f"]) and math.isnan(k2["d"])
    assert k1["s"] == "\0" and k2["s"] == "\U0001F600 \U0001D11E \u00e9\u4e2d"
    assert rows["k0"]["s"] == "" and rows["k0"]["by"] == b"" and rows["k0"]["ints"] == []
    assert rows["k0"]["longs"] == [] and rows["k0"]["multi"] is None
    assert k1["dec_bytes"] == decimal.Decimal("-9999999999999999.9999")
    assert k2["dec_fixed"] == decimal.Decimal("9999999999999999999.99")
    assert str(k1["day"]) == "0001-01-01" and str(k2["day"]) == "9999-12-31"
    assert k1["ts_ms"].year == 1 and k2["ts_us"].microsecond == 999999
    assert k2["uid16"] == "123e4567-e89b-12d3-a456-426614174000"
    assert k1["multi"] == {"branch": 1, "int": -(2**31), "string": None, "Item": None,
                           "array": None}
    assert k3["multi"]["branch"] == 4 and k3["multi"]["array"] == [3.5, -0.0]
    assert k1["either"] == {"branch": 1, "string": None, "long": -(2**63)}
    assert sorted(k1["opt_strings"]) == [("empty", ""), ("null", None)]
    assert k2["nested"]["label"] == "\U0001F600" and k1["nested"]["inner"]["tag"] == "BLUE"


@pytest.mark.parametrize("name", AVRO_UIDS)
def test_a_specific_record(name: str) -> None:
    """A generated-style SpecificRecord (``statequery.avro.Reading``, with a generated enum):
    the snapshot names its class and holds its schema; the bytes are the same encoding."""
    sp = statequery.open(str(fixture_dir(name)))
    spec = next(s.value_spec for s in sp.states if s.name == "specific")
    assert isinstance(spec, AvroSpec) and spec.type_class == "statequery.avro.Reading"
    table = sp.read("avro_state__specific")
    t = table.schema.field("value").type
    assert t.field("at").type == pa.timestamp("ms", tz="UTC")
    assert t.field("level").type == pa.string()
    rows = {r["key"]: r["value"] for r in table.to_pylist()}
    k7 = rows["k7"]  # event 199: amount 199 * 37 % 101 = 91, category games, user-19
    assert (k7["sensor"], k7["reading"], k7["level"], k7["samples"]) == ("k7", 22.75, "HIGH",
                                                                         [199, 91])
    assert sorted(k7["tags"]) == [("category", "games"), ("user", "user-19")]
    assert k7["remark"] is None


@pytest.mark.parametrize("name", EVOLVED)
def test_an_evolved_schema_reads_with_the_schema_of_its_savepoint(name: str) -> None:
    """The job wrote V1 records (qty int, a trailing scratch string), then restored with V2
    (scratch dropped, qty a long): Flink migrated every value, and the savepoint's snapshot holds
    V2, so the values read as V2's struct with V1's data."""
    sp = statequery.open(str(fixture_dir(name)))
    table = sp.read("avro_evolve__latest")
    assert table.schema.field("value").type == pa.struct(
        [("name", pa.string()), ("qty", pa.int64()), ("note", pa.string())])
    rows = {r["key"]: r["value"] for r in table.to_pylist()}
    assert rows["k1"] == {"name": "e193", "qty": 71, "note": "games"}
    assert rows["k0"] == {"name": "e192", "qty": 34, "note": None}
    firsts = {r["key"]: r["value"] for r in sp.read("avro_evolve__firsts").to_pylist()}
    assert [x["name"] for x in firsts["k3"]] == ["e3", "e11"]


def test_state_meta_says_how_values_are_decoded() -> None:
    meta = statequery.open(str(fixture_dir("types-avro-rocksdb-native"))).state_meta()
    rows = {r["state_name"]: r for r in meta.to_pylist()}
    for s in ("everything", "items", "history"):
        assert rows[s]["value_decoding"] == "avro-schema", rows[s]
        assert rows[s]["value_decoding_hint"] is None and rows[s]["decodable"]
        record = "Everything" if s == "everything" else "Item"
        assert rows[s]["value_type"] == f"AVRO<statequery.avro.{record}>"
    assert rows["seen"]["value_decoding"] == "native"
    kryo = statequery.open(str(fixture_dir("ttl-kryo-hashmap-canonical"))).state_meta()
    k = {r["state_name"]: r for r in kryo.to_pylist()}["kryo-value"]
    assert k["value_decoding"] == "raw"
    assert "statequery.fixtures.Note" in k["value_decoding_hint"]
    assert "classpath" in k["value_decoding_hint"]


def test_sql_reads_avro_fields() -> None:
    from statequery.catalog import Catalog

    t = statequery.sql(
        "SELECT key, value.nested.label AS label, value.multi.branch AS branch, "
        "value.dec_bytes AS dec FROM types_avro_rocksdb_native.avro_state__everything "
        "WHERE key IN ('k2', 'k5') ORDER BY key",
        Catalog(str(FIXTURES)),
    )
    assert t.to_pylist() == [
        {"key": "k2", "label": "\U0001F600", "branch": 2,
         "dec": decimal.Decimal("9999999999999999.9999")},
        {"key": "k5", "label": "outer-5", "branch": 1, "dec": decimal.Decimal("11728.3945")},
    ]


# -- the reader's bounds, on crafted bytes --------------------------------------------------------

_RECORD = json.dumps({"type": "record", "name": "R", "fields": [
    {"name": "s", "type": "string"},
    {"name": "a", "type": {"type": "array", "items": "long"}},
    {"name": "u", "type": ["null", "int"]},
]})


def _read(schema: str, data: bytes) -> Any:
    value, pos = avro_reader(parse_schema(schema))(data, 0, len(data))
    assert pos == len(data)
    return value


def test_flink_encoding_round_trip() -> None:
    data = (struct.pack(">i", 2) + b"hi" + b"\x02" + struct.pack(">qq", -1, 2**40) + b"\x00"
            + struct.pack(">ii", 1, 7))
    assert _read(_RECORD, data) == {"s": "hi", "a": [-1, 2**40], "u": 7}
    # several blocks (Flink's reader takes them, its writer writes one)
    blocks = b"\x01" + struct.pack(">q", 1) + b"\x01" + struct.pack(">q", 2) + b"\x00"
    assert _read('{"type": "array", "items": "long"}', blocks) == [1, 2]


@pytest.mark.parametrize("data, what", [
    (struct.pack(">i", 2**31 - 1) + b"x", "string needs"),
    (struct.pack(">i", -5), "negative Avro string length"),
    (struct.pack(">i", 0) + b"\xff\xff\xff\xff\x0f", "exceeds the"),
    (struct.pack(">i", 0) + b"\x80" * 11, "longer than 10 bytes"),
    (struct.pack(">i", 0) + b"\x00" + struct.pack(">i", 2), "union index 2"),
    (struct.pack(">i", 0) + b"\x00" + b"\x00\x00", "union index needs 4"),
])
def test_lengths_are_checked_against_the_bytes_left(data: bytes, what: str) -> None:
    read = avro_reader(parse_schema(_RECORD))
    with pytest.raises(DecodeError, match=what):
        read(data, 0, len(data))


def test_zero_byte_items_are_capped() -> None:
    data = b"\xff\xff\xff\xff\x0f"  # 2**32 - 1 nulls in zero bytes
    with pytest.raises(DecodeError, match="implausibly large"):
        avro_reader(parse_schema('{"type": "array", "items": "null"}'))(data, 0, len(data))


def test_recursive_schema_stays_raw_with_a_reason() -> None:
    recursive = json.dumps({"type": "record", "name": "Node", "fields": [
        {"name": "next", "type": ["null", "Node"]}]})
    with pytest.raises(AvroSchemaError, match="recursive"):
        parse_schema(recursive)
    with pytest.raises(AvroSchemaError, match="deeper than"):
        parse_schema('{"type": "array", "items": ' * 70 + '"int"' + "}" * 70)


def test_reader_node_is_the_avro_reader() -> None:
    r = reader_for(AvroSpec(schema=_RECORD, type_class="org.apache.avro.generic.GenericRecord"))
    data = struct.pack(">i", 0) + b"\x00" + struct.pack(">i", 0)
    assert r.read_slot(data, 0, len(data)) == {"s": "", "a": [], "u": None}
    assert r.min_size == 4 + 1 + 4


# -- random values of the fixture's schema: round trip, then every truncation and mutation --------


def _encode(t: Any, v: Any) -> bytes:
    """Flink's DataOutputEncoder form of ``v`` (independent of the reader: docs/avro.md)."""
    k = t.kind
    if k == "null":
        return b""
    if k == "boolean":
        return b"\x01" if v else b"\x00"
    if k in ("int", "long", "float", "double"):
        fmt = {"int": ">i", "long": ">q", "float": ">f", "double": ">d"}[k]
        return struct.pack(fmt, v)
    if k in ("string", "bytes", "fixed"):
        raw = v.encode() if isinstance(v, str) else v
        return raw if k == "fixed" else struct.pack(">i", len(raw)) + raw
    if k == "enum":
        return struct.pack(">i", t.symbols.index(v))
    if k in ("array", "map"):
        body = b"".join(
            (_encode(parse_schema('"string"'), x[0]) + _encode(t.items, x[1])) if k == "map"
            else _encode(t.items, x) for x in v)
        return (bytes([len(v)]) + body if v else b"") + b"\x00"
    if k == "union":
        i, value = v
        return struct.pack(">i", i) + _encode(t.branches[i], value)
    assert k == "record"
    return b"".join(_encode(f, v[n]) for n, f in t.fields)


def _random_value(t: Any, rnd: Any) -> Any:
    k = t.kind
    if k == "null":
        return None
    if k == "boolean":
        return rnd.random() < 0.5
    if k == "int":
        return rnd.randint(-(2**31), 2**31 - 1)
    if k == "long":
        return rnd.randint(-(2**63), 2**63 - 1)
    if k in ("float", "double"):
        return float(rnd.randint(-1000, 1000)) / 8
    if k == "string":
        return "".join(rnd.choice("a\0\u00e9\U0001F600") for _ in range(rnd.randint(0, 5)))
    if k == "bytes":
        return bytes(rnd.randint(0, 255) for _ in range(rnd.randint(0, 5)))
    if k == "fixed":
        return bytes(rnd.randint(0, 255) for _ in range(t.size))
    if k == "enum":
        return rnd.choice(t.symbols)
    if k == "array":
        return [_random_value(t.items, rnd) for _ in range(rnd.randint(0, 3))]
    if k == "map":
        return [(f"k{j}", _random_value(t.items, rnd)) for j in range(rnd.randint(0, 3))]
    if k == "union":
        i = rnd.randrange(len(t.branches))
        return i, _random_value(t.branches[i], rnd)
    return {n: _random_value(f, rnd) for n, f in t.fields}


def _plain(t: Any) -> Any:
    """``t`` without logical types (the random values are of the underlying types)."""
    from dataclasses import replace

    return replace(
        t, logical=None,
        fields=tuple((n, _plain(f)) for n, f in t.fields),
        items=_plain(t.items) if t.items is not None else None,
        branches=tuple(_plain(b) for b in t.branches),
    )


def test_random_values_round_trip_and_damage_raises_decode_error() -> None:
    import random

    sp = statequery.open(str(fixture_dir("types-avro-hashmap-canonical")))
    spec = next(s.value_spec for s in sp.states if s.name == "everything")
    assert isinstance(spec, AvroSpec)
    t = _plain(parse_schema(spec.schema))
    read = avro_reader(t)
    rnd = random.Random(32)
    for _ in range(40):
        value = _random_value(t, rnd)
        data = _encode(t, value)
        got, pos = read(data, 0, len(data))
        assert pos == len(data)
        assert got["i"] == value["i"] and got["ints"] == value["ints"]
        assert got["color"] == value["color"] and got["by"] == value["by"]
        for cut in range(0, len(data), 7):  # every truncation: DecodeError, nothing else
            with pytest.raises(DecodeError):
                read(data[:cut], 0, cut)
        damaged = bytearray(data)
        for _ in range(20):  # random bytes set to 0xFF: a value or a DecodeError, never more
            damaged[rnd.randrange(len(damaged))] = 0xFF
            try:
                read(bytes(damaged), 0, len(damaged))
            except DecodeError:
                pass
