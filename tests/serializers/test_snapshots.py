"""Serializer snapshots -> SerializerSpec, on bytes Flink 2.3 wrote (vectors, fixture headers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from statequery.decoder import Decoder
from statequery.exceptions import CorruptStateError, UnknownSerializerError
from statequery.savepoint import Savepoint
from statequery.serializers.snapshots import read_top_level_snapshot, read_versioned_snapshot
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
    PojoSpec,
    PrimitiveArraySpec,
    PrimitiveSpec,
    RawValueSpec,
    RowDataSpec,
    RowSpec,
    TimerSpec,
    TtlSpec,
    TupleSpec,
    from_dict,
    to_dict,
)
from tests.conftest import fixture_dir

VECTORS = Path(__file__).parent / "data" / "flink_vectors.jsonl"


def _snapshots() -> dict[str, bytes]:
    out = {}
    with open(VECTORS, encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            if d["kind"] == "snapshot":
                out[d["name"]] = bytes.fromhex(d["hex"])
    return out


SNAPSHOTS = _snapshots()


def parse(name: str) -> Any:
    d = Decoder(SNAPSHOTS[name], source=name)
    spec = read_top_level_snapshot(d)
    assert d.at_end(), f"{name}: {d.remaining} bytes left unread"
    return spec


def test_every_vector_parses_exactly_and_round_trips_through_dicts() -> None:
    assert len(SNAPSHOTS) >= 35
    for name in SNAPSHOTS:
        spec = parse(name)
        assert from_dict(json.loads(json.dumps(to_dict(spec)))) == spec, name


def test_scalars_and_arrays() -> None:
    assert parse("long") == PrimitiveSpec(
        snapshot_class="org.apache.flink.api.common.typeutils.base.LongSerializer$LongSerializerSnapshot",
        name="long",
    )
    assert parse("string").name == "string"
    assert parse("bytes") == PrimitiveArraySpec(
        snapshot_class=parse("bytes").snapshot_class, element="byte"
    )
    assert parse("int_array").element == "int"
    assert parse("string_array").element == "string"
    assert parse("value").name == "long"  # ValueSerializer<LongValue>
    assert parse("string_data").name == "string_data"
    dec = parse("decimal_data")
    assert (dec.name, dec.precision, dec.scale) == ("decimal_data", 30, 6)
    ts = parse("timestamp_data")
    assert (ts.name, ts.precision) == ("timestamp_data", 6)


def test_enum_keeps_constants_in_order() -> None:
    spec = parse("enum")
    assert isinstance(spec, EnumSpec)
    assert spec.class_name == "java.util.concurrent.TimeUnit"
    assert spec.constants == (
        "NANOSECONDS",
        "MICROSECONDS",
        "MILLISECONDS",
        "SECONDS",
        "MINUTES",
        "HOURS",
        "DAYS",
    )


def test_composites() -> None:
    t = parse("tuple2")
    assert isinstance(t, TupleSpec) and t.class_name == "org.apache.flink.api.java.tuple.Tuple2"
    assert [f.name for f in t.fields] == ["long", "string"]
    r = parse("row_named")
    assert isinstance(r, RowSpec) and r.supports_row_kind and len(r.fields) == 2
    assert isinstance(parse("list"), ListSpec) and parse("list").element.name == "string"
    assert isinstance(parse("arraylist"), ListSpec)
    m = parse("map")
    assert isinstance(m, MapSpec) and (m.key.name, m.value.name) == ("string", "long")
    g = parse("generic_array")
    assert isinstance(g, GenericArraySpec) and g.component_class == "java.lang.String"
    n = parse("nullable")
    assert isinstance(n, NullableSpec) and n.padding == 8 and n.inner.name == "long"
    e = parse("either")
    assert isinstance(e, EitherSpec) and (e.left.name, e.right.name) == ("long", "string")
    ttl = parse("ttl")
    assert isinstance(ttl, TtlSpec) and ttl.inner.name == "string"
    timer = parse("timer_window")
    assert isinstance(timer, TimerSpec) and timer.key.name == "long"
    assert timer.namespace == NamespaceSpec(
        snapshot_class=timer.namespace.snapshot_class, name="time_window"
    )
    assert parse("timer").namespace.name == "void"
    assert parse("global_window").name == "global_window"
    assert parse("table_time_window").name == "time_window"
    assert parse("table_count_window").name == "count_window"
    sm = parse("sorted_map")
    assert isinstance(sm, MapSpec) and (sm.key.name, sm.value.name) == ("long", "string")


def test_pojo_fields_with_names_declaring_classes_and_nested_types() -> None:
    p = parse("pojo")
    assert isinstance(p, PojoSpec) and p.class_name == "statequery.fixtures.UserProfile"
    assert [f.name for f in p.fields] == ["address", "lastAmount", "name", "tier", "totalAmount"]
    assert {f.declaring_class for f in p.fields} == {"statequery.fixtures.UserProfile"}
    address = p.fields[0].spec
    assert isinstance(address, PojoSpec) and address.class_name == "statequery.fixtures.Address"
    assert [(f.name, f.spec.name) for f in address.fields] == [("city", "string"), ("zip", "int")]
    tier = p.fields[3].spec
    assert isinstance(tier, EnumSpec) and tier.constants == ("GOLD", "SILVER", "BRONZE")


def test_opaque_families_keep_the_class() -> None:
    k = parse("kryo")
    assert isinstance(k, OpaqueSpec) and k.family == "kryo"
    assert k.type_class == "java.time.LocalDateTime" and not k.decodable
    assert parse("java").family == "java"
    b = parse("binary_row")
    assert isinstance(b, OpaqueSpec) and "3 fields" in b.reason


def test_table_types_with_logical_types() -> None:
    row = parse("row_data")
    assert isinstance(row, RowDataSpec)
    assert [str(f.type) for f in row.type.fields] == [
        "BOOLEAN",
        "TINYINT",
        "SMALLINT",
        "INTEGER NOT NULL",
        "BIGINT",
        "FLOAT",
        "DOUBLE",
        "DECIMAL(12, 2)",
        "DECIMAL(30, 6)",
        "CHAR(3)",
        "STRING",
        "VARCHAR(10)",
        "BINARY(4)",
        "BYTES",
        "DATE",
        "TIME(3)",
        "TIMESTAMP(3)",
        "TIMESTAMP(6)",
        "TIMESTAMP_LTZ(3)",
        "ARRAY<INTEGER>",
        "MAP<STRING, BIGINT>",
        "MULTISET<INTEGER>",
        "ROW<x INTEGER, y VARCHAR(5)>",
        "INTERVAL_YEAR_MONTH",
        "INTERVAL_DAY_TIME",
        "RAW(java.lang.Long)",
    ]
    assert [f.name for f in row.type.fields][:3] == ["f0", "f1", "f2"]  # top level: no names
    assert parse("row_data_unnamed").display == "ROW<f0 BIGINT, f1 STRING>"
    assert isinstance(parse("array_data"), ArrayDataSpec)
    assert str(parse("array_data").element) == "INTEGER"
    md = parse("map_data")
    assert isinstance(md, MapDataSpec) and (str(md.key), str(md.value)) == ("STRING", "BIGINT")
    assert isinstance(parse("raw_value"), RawValueSpec)
    ll = parse("linked_list")
    assert isinstance(ll, LinkedListSpec) and ll.has_null_mask
    ext = parse("external")  # ExternalSerializer: internal RowData, field names from the DataType
    assert isinstance(ext, RowDataSpec) and ext.display == "ROW<x INTEGER>"


def _rename(data: bytes, old: str, new: str) -> bytes:
    assert len(old) == len(new) and data.count(old.encode()) >= 1
    return data.replace(old.encode(), new.encode())


def test_unknown_class_raises_naming_it() -> None:
    data = _rename(
        SNAPSHOTS["long"],
        "LongSerializer$LongSerializerSnapshot",
        "XongSerializer$XongSerializerSnapshot",
    )
    with pytest.raises(UnknownSerializerError) as e:
        read_top_level_snapshot(Decoder(data, source="hdr"))
    assert e.value.class_name.endswith("XongSerializer$XongSerializerSnapshot")
    assert "hdr" in str(e.value)


def test_unknown_composite_class_is_skipped_exactly() -> None:
    data = _rename(SNAPSHOTS["list"], "ListSerializerSnapshot", "QistSerializerSnapshot")
    d = Decoder(data)
    spec = read_top_level_snapshot(d)
    assert d.at_end()
    assert isinstance(spec, OpaqueSpec) and "QistSerializerSnapshot" in spec.reason


def test_unknown_pojo_field_stays_inside_its_frame() -> None:
    data = _rename(
        SNAPSHOTS["pojo"],
        "EnumSerializer$EnumSerializerSnapshot",
        "EnumSerializer$QnumSerializerSnapshot",
    )
    d = Decoder(data)
    spec = read_top_level_snapshot(d)
    assert d.at_end() and isinstance(spec, PojoSpec)
    tier = [f for f in spec.fields if f.name == "tier"][0].spec
    assert isinstance(tier, OpaqueSpec) and not spec.decodable
    assert [f.spec.name for f in spec.fields if f.name in ("name", "totalAmount")] == [
        "string",
        "long",
    ]


def test_legacy_1_2_package_names_resolve_by_simple_name() -> None:
    # Flink 1.x: org.apache.flink.contrib.streaming.state -> 2.x org.apache.flink.state.rocksdb;
    # the registry falls back to the class name without its package
    data = SNAPSHOTS["long"].replace(
        b"org.apache.flink.api.common.typeutils.base.",
        b"org.apache.flink.api.common.typeutils.bXse.",
    )
    assert read_top_level_snapshot(Decoder(data)).name == "long"


def test_truncated_and_bad_proxy_version() -> None:
    data = SNAPSHOTS["row_data"]
    for cut in (3, 10, 200, len(data) // 2, len(data) - 1):
        with pytest.raises(CorruptStateError):
            read_top_level_snapshot(Decoder(data[:cut], source="x"))
    with pytest.raises(CorruptStateError, match="proxy version 7"):
        read_top_level_snapshot(Decoder(b"\x00\x00\x00\x07" + data[4:]))
    with pytest.raises(CorruptStateError):
        read_versioned_snapshot(Decoder(b"\x00\x00"))


# -- the serializers the fixture jobs really used ------------------------------------------------


def test_fixture_pojo_value_state() -> None:
    sp = Savepoint.open(str(fixture_dir("datastream-hashmap-canonical")))
    profile = sp.state("user-state", "profile").value_spec
    assert isinstance(profile, PojoSpec) and profile.class_name == "statequery.fixtures.UserProfile"
    assert {f.name: f.spec.display for f in profile.fields} == {
        "address": "Address",
        "lastAmount": "INT",
        "name": "STRING",
        "tier": "enum Tier",
        "totalAmount": "LONG",
    }
    avg = sp.state("user-state", "avg-amount").value_spec
    assert isinstance(avg, TupleSpec) and len(avg.fields) == 2


def test_fixture_sql_row_data() -> None:
    sp = Savepoint.open(str(fixture_dir("sql-rocksdb-native")))
    op = [o for o in sp.operators if o.name.startswith("GroupAggregate")][0]
    acc = op.state("accState")
    assert isinstance(acc.key_spec, RowDataSpec) and acc.key_spec.display == "ROW<f0 STRING>"
    types = [str(f.type) for f in acc.value_spec.type.fields]
    assert types[:7] == [
        "BIGINT",
        "BIGINT",
        "BIGINT",
        "DECIMAL(12, 2)",
        "DECIMAL(30, 6)",
        "TIMESTAMP(6)",
        "STRING",
    ]
    assert types[7].startswith("RAW(org.apache.flink.table.api.dataview.MapView")
    # the stored field serializers: the RAW placeholder's is a NullSerializer, read as null
    field_specs = acc.value_spec.field_specs
    assert len(field_specs) == 8 and isinstance(field_specs[7], RawValueSpec)
    assert field_specs[7].inner == PrimitiveSpec(
        snapshot_class="org.apache.flink.table.dataview.NullSerializer$NullSerializerSnapshot",
        name="void",
    )
    assert field_specs[6].display == "string_data"
    rows = sp.read(op.operator_id, "accState").to_pylist()
    assert len(rows) == 17 and all(r["value"]["f7"] is None for r in rows)
    distinct = op.state("distinctAcc_0")
    assert distinct.user_key_spec.name == "int" and distinct.value_spec.name == "long"
