"""Hashing and key groups against values Flink itself computed (Java vectors and fixture dumps)."""

from __future__ import annotations

import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from statequery import hashing as H
from statequery.exceptions import InvalidOptionError, UnsupportedFormatError
from statequery.savepoint import Savepoint
from statequery.serializers.spec import (
    EnumSpec,
    PojoSpec,
    PrimitiveSpec,
    RowSpec,
    SqlField,
    SqlType,
    TupleSpec,
)
from tests.conftest import dump_entries, fixture_dir, fixture_names, fixture_records

VECTORS = Path(__file__).parents[1] / "serializers" / "data" / "flink_vectors.jsonl"


def _vectors(kind: str) -> dict[str, dict[str, Any]]:
    out = {}
    with open(VECTORS, encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            if d["kind"] == kind:
                out[d["name"]] = d
    return out


def P(name: str) -> PrimitiveSpec:
    return PrimitiveSpec(name=name)


# (value, spec) of each Java key in SnapshotVectors.java
JAVA_KEYS: dict[str, tuple[Any, Any]] = {
    "string_hello": ("hello", P("string")),
    "string_empty": ("", P("string")),
    "string_unicode": ("h\u00e9llo\u20ac\U0001f600", P("string")),
    "long_42": (42, P("long")),
    "long_neg": (-1234567890123, P("long")),
    "int_7": (7, P("int")),
    "int_min": (-(2**31), P("int")),
    "short": (-5, P("short")),
    "byte": (3, P("byte")),
    "bool_true": (True, P("boolean")),
    "bool_false": (False, P("boolean")),
    "double": (3.5, P("double")),
    "double_negzero": (-0.0, P("double")),
    "double_nan": (float("nan"), P("double")),
    "float": (1.25, P("float")),
    "char": ("x", P("char")),
    "tuple2": (("a", 1), TupleSpec(fields=(P("string"), P("long")))),
    "tuple3": ((1, "b", True), TupleSpec(fields=(P("int"), P("string"), P("boolean")))),
    "tuple2_null": ((None, 5), TupleSpec(fields=(P("string"), P("int")))),
    "row": ((1, "x"), RowSpec(fields=(P("int"), P("string")))),
    "row_nested": (
        ((2,), None, "z"),
        RowSpec(fields=(RowSpec(fields=(P("long"),)), P("int"), P("string"))),
    ),
    "big_int": (123456789012345678901234567890, P("bigint")),
    "big_dec": (Decimal("12.50"), P("bigdec")),
}


@pytest.mark.parametrize("name", sorted(JAVA_KEYS))
def test_java_hash_and_key_group_match_flink(name: str) -> None:
    expected = _vectors("hash")[name]
    value, spec = JAVA_KEYS[name]
    assert H.java_hash(value, spec) == expected["hash"]
    assert H.key_group_of(value, 128, spec) == expected["kg128"]
    assert H.key_group_of(value, 32768, spec) == expected["kg32768"]


def test_untyped_values_use_java_boxing() -> None:
    assert H.java_hash("hello") == 99162322
    assert H.java_hash(42) == 42  # Long
    assert H.java_hash(True) == 1231
    assert H.java_hash(3.5) == 1074528256
    assert H.java_hash(Decimal("12.50")) == 38752


def test_reference_murmur_values() -> None:
    assert H.murmur_hash(0) == 593689054
    assert H.murmur_hash(-(2**31)) == 1718298732
    assert H.key_group_for_hash(99162322, 32768) == 31395


def test_row_kind_enters_row_hash() -> None:
    row = H._RowValue((1, "x"))
    row.kind = 3  # DELETE
    assert H.java_hash(row) == _vectors("hash")["row_delete"]["hash"]


def test_pojo_and_enum_keys_are_refused() -> None:
    with pytest.raises(UnsupportedFormatError, match="hashCode"):
        H.java_hash({"a": 1}, PojoSpec(class_name="x.Y"))
    with pytest.raises(UnsupportedFormatError):
        H.java_hash("RED", EnumSpec(class_name="x.Color", constants=("RED",)))


def test_operator_id_from_uid() -> None:
    assert H.operator_id_from_uid("my-uid") == "8409efe6adc6d20787611f16017c808f"


def test_key_group_ranges() -> None:
    assert [
        tuple(H.key_group_range_for_operator_index(128, 3, i).__dict__.values()) for i in range(3)
    ] == [(0, 42), (43, 85), (86, 127)]
    for maxp, p in ((128, 2), (256, 7), (32768, 5), (128, 128), (7, 1)):
        ranges = [H.key_group_range_for_operator_index(maxp, p, i) for i in range(p)]
        assert ranges[0].start == 0 and ranges[-1].end == maxp - 1
        for i, r in enumerate(ranges):
            for kg in (r.start, r.end):
                assert H.operator_index_for_key_group(maxp, p, kg) == i
    with pytest.raises(InvalidOptionError):
        H.key_group_range_for_operator_index(128, 2, 2)


def test_default_max_parallelism() -> None:
    assert H.compute_default_max_parallelism(1) == 128
    assert H.compute_default_max_parallelism(100) == 256
    assert H.compute_default_max_parallelism(30000) == 32768
    assert H.key_group_prefix_bytes(128) == 1 and H.key_group_prefix_bytes(256) == 2


# -- BinaryRowData writer -----------------------------------------------------------------------

STR = SqlType("VARCHAR", length=2147483647)


def _row(*types: SqlType) -> SqlType:
    return SqlType("ROW", fields=tuple(SqlField(f"f{i}", t) for i, t in enumerate(types)))


ALL_TYPES = _row(
    SqlType("BOOLEAN"),
    SqlType("TINYINT"),
    SqlType("SMALLINT"),
    SqlType("INTEGER"),
    SqlType("BIGINT"),
    SqlType("FLOAT"),
    SqlType("DOUBLE"),
    SqlType("DECIMAL", precision=10, scale=2),
    SqlType("DECIMAL", precision=30, scale=6),
    SqlType("DATE"),
    SqlType("TIME_WITHOUT_TIME_ZONE", precision=0),
    SqlType("TIMESTAMP_WITHOUT_TIME_ZONE", precision=3),
    SqlType("TIMESTAMP_WITHOUT_TIME_ZONE", precision=9),
    SqlType("TIMESTAMP_WITH_LOCAL_TIME_ZONE", precision=6),
    SqlType("VARBINARY", length=100),
    SqlType("BINARY", length=3),
    SqlType("CHAR", length=2),
)

ROWS: dict[str, tuple[SqlType, Any]] = {
    "str_short": (SqlType("ROW", fields=(SqlField("word", STR),)), {"word": "w3"}),
    "str_long": (_row(STR), ["a-longer-string-here"]),
    "str_null": (_row(STR), [None]),
    "empty_str": (_row(STR), [""]),
    "utf8": (_row(STR), ["h\u00e9llo\u20ac"]),
    "example": (
        _row(SqlType("BIGINT"), STR, STR, SqlType("INTEGER")),
        [42, "abc", "longer-string", None],
    ),
    "all_types": (
        ALL_TYPES,
        [
            True,
            -3,
            300,
            123456,
            -9876543210,
            1.5,
            -2.25,
            Decimal("12.50"),
            "-123456789012345678.123456",
            19000,
            3600000,
            1700000000123 * 10**6,
            1700000000123 * 10**6 + 456789,
            -1000 * 10**6 + 123000,
            {"$bytes": "AQIDBAUGBwgJ"},
            bytes([9, 8, 7]),
            "ab",
        ],
    ),
}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_binary_row_bytes_equal_flink(name: str) -> None:
    expected = _vectors("row")[name]
    row_type, value = ROWS[name]
    data = H.binary_row_bytes(value, row_type)
    assert data.hex() == expected["hex"]
    assert H.binary_row_hash(data) == expected["hash"]
    assert H.key_group_of(value, 128, _row_data_spec(row_type)) == expected["kg128"]


def test_null_non_compact_fields_reserve_space_like_generated_projections() -> None:
    # RowDataSerializer.toBinaryRow (the "nulls" vector) only sets null bits; the generated key
    # projections reserve the variable part of non-compact DECIMAL/TIMESTAMP (16 and 8 bytes).
    data = H.binary_row_bytes([None] * 17, ALL_TYPES)
    assert len(data) == len(bytes.fromhex(_vectors("row")["nulls"]["hex"])) + 16 + 8 + 8


def _row_data_spec(t: SqlType) -> Any:
    from statequery.serializers.spec import RowDataSpec

    return RowDataSpec(type=t)


# -- against the fixtures: every key Flink wrote, with the key group Flink assigned --------------


@pytest.mark.parametrize("name", fixture_names())
def test_key_groups_of_every_dumped_key_match_flink(name: str) -> None:
    sp = Savepoint.open(str(fixture_dir(name)))
    by_state: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for e in dump_entries(name):
        if "key_group" in e:
            by_state[(e["operator_id"], e["state"])].append(e)
    assert by_state, "the dump has keyed entries"
    checked = 0
    for (op_id, state_name), entries in by_state.items():
        state = sp.state(op_id, state_name)
        owners = {s.index: s.key_groups for s in sp.operator(op_id).subtasks}
        for e in entries:
            kg = H.key_group_of(e["key"], state.max_parallelism, state.key_spec)
            assert kg == e["key_group"], (state_name, e["key"])
            # the subtask whose handle covers it is the one Flink's formula names
            index = H.operator_index_for_key_group(state.max_parallelism, state.parallelism, kg)
            assert kg in owners[index]
            checked += 1
    # every keyed entry of the dump (the smallest, async-sql-forst-native, holds 17: one
    # accumulator per word)
    assert checked == sum(len(v) for v in by_state.values()) >= 17


@pytest.mark.parametrize("record", fixture_records(), ids=lambda r: r["name"])
def test_operator_ids_from_uids_match_metadata(record: dict[str, Any]) -> None:
    sp = Savepoint.open(str(fixture_dir(record["name"])))
    ids = {op.operator_id for op in sp.operators}
    with_uid = [op for op in record["operators"] if op["uid"]]
    for op in with_uid:
        assert H.operator_id_from_uid(op["uid"]) == op["operator_id"]
        assert op["operator_id"] in ids
    for op in sp.operators:
        if op.uid:
            assert H.operator_id_from_uid(op.uid) == op.operator_id


@pytest.mark.parametrize("name", fixture_names())
def test_subtask_key_group_ranges_follow_flinks_formula(name: str) -> None:
    sp = Savepoint.open(str(fixture_dir(name)))
    keyed = [op for op in sp.operators if any(s.key_groups for s in op.subtasks)]
    assert keyed
    for op in keyed:
        for s in op.subtasks:
            assert s.key_groups == H.key_group_range_for_operator_index(
                op.max_parallelism, op.parallelism, s.index
            )
