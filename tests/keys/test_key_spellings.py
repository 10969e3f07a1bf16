"""Keys of every SQL type on every front end: the accepted spellings find the same rows, anything
else is an :class:`InvalidKeyError`, never zero rows (statequery.keys, docs/cli.md).

Fixture ``keys-sql-*`` (examples/flink-jobs/sql_keys_job.py): ``GroupAggregate[4]`` groups by
``(d DATE, amt DECIMAL(10, 2), b BYTES, flag BOOLEAN, s STRING)``, ``[8]`` by ``amt`` (with the
distinct map state), ``[12]`` by ``d``, ``[16]`` by ``big DECIMAL(25, 4)``, ``[20]`` by
``(ts3 TIMESTAMP(3), ts6 TIMESTAMP(6), ltz TIMESTAMP_LTZ(3), t TIME)``, ``[24]`` by
``(i8 TINYINT, i16 SMALLINT, i64 BIGINT, f32 FLOAT, f64 DOUBLE)``.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from conftest import fixture_dir

import statequery
from statequery.catalog import Catalog
from statequery.cli import main
from statequery.exceptions import InvalidKeyError
from statequery.keys import parse_key_text, resolve_key
from statequery.serializers.spec import NullableSpec, PrimitiveSpec, TupleSpec

FIXTURES = ["keys-sql-hashmap-native", "keys-sql-hashmap-canonical", "keys-sql-rocksdb-native"]
UTC = dt.timezone.utc
NEW_YEAR = dt.date(2024, 1, 1)
COMPOSITE = {"f0": dt.date(2024, 2, 29), "f1": Decimal("0.00"),
             "f2": b"longer than seven bytes", "f3": True, "f4": "x\x00y"}
TIMES = {"f0": dt.datetime(2024, 1, 1, 12, 34, 56, 789000),
         "f1": dt.datetime(2024, 1, 1, 12, 34, 56, 123456),
         "f2": dt.datetime(2024, 1, 1, 12, 34, 56, 789000, tzinfo=UTC),
         "f3": dt.time(12, 34, 56)}


def _open(name: str) -> Any:
    return statequery.open(str(fixture_dir(name)), use_snapshot=False)


def _values(sp: Any, op: str, key: Any) -> list[Any]:
    return [r["value"] for r in sp.read(op, "accState", key=key).to_pylist()]


# the same key, spelled as read() returns it and in the other accepted ways
SPELLINGS = [
    ("GroupAggregate[12]", {"f0": NEW_YEAR}, [NEW_YEAR, "2024-01-01", {"f0": "2024-01-01"},
                                              (NEW_YEAR,), [NEW_YEAR]]),
    ("GroupAggregate[8]", {"f0": Decimal("12.50")},
     [Decimal("12.5"), Decimal("12.500"), "12.5", 12.5, {"f0": "12.50"}]),
    ("GroupAggregate[16]", {"f0": Decimal("-1.0000")}, [Decimal("-1"), -1, "-1.0", -1.0]),
    ("GroupAggregate[4]", COMPOSITE,
     [{**COMPOSITE, "f0": "2024-02-29", "f1": "0",
       "f2": {"$bytes": "bG9uZ2VyIHRoYW4gc2V2ZW4gYnl0ZXM="}},
      [COMPOSITE[f"f{i}"] for i in range(5)], tuple(COMPOSITE.values())]),
    ("GroupAggregate[20]", TIMES,
     [{"f0": "2024-01-01T12:34:56.789", "f1": "2024-01-01 12:34:56.123456",
       "f2": "2024-01-01T12:34:56.789Z", "f3": "12:34:56"},
      {**TIMES, "f2": dt.datetime(2024, 1, 1, 13, 34, 56, 789000,
                                  tzinfo=dt.timezone(dt.timedelta(hours=1)))}]),
    ("GroupAggregate[24]", {"f0": 1, "f1": 300, "f2": 5000000000, "f3": 1.5, "f4": 2.25},
     [[1.0, "300", Decimal(5000000000), Decimal("1.5"), "2.25"]]),
]


@pytest.mark.parametrize("name", FIXTURES)
def test_every_spelling_finds_the_same_rows(name: str, decode_path: str) -> None:
    sp = _open(name)
    for op, key, spellings in SPELLINGS:
        want = _values(sp, op, key)
        assert len(want) == 1, (op, key)
        for spelling in spellings:
            assert _values(sp, op, spelling) == want, (op, spelling)
            found = sp.lookup(spelling, op)
            assert [r["value"] for r in found[(op, "accState")].to_pylist()] == want


# keys that cannot be converted: a typed error naming the field, on every front end
REFUSED = [
    ("GroupAggregate[12]", 19723, "give a datetime.date or 'YYYY-MM-DD', not a day number"),
    ("GroupAggregate[12]", dt.datetime(2024, 1, 1), "a datetime is not a DATE"),
    ("GroupAggregate[12]", "2024-13-01", "field f0 is DATE"),
    ("GroupAggregate[8]", Decimal("12.505"), "has more than 2 digits after the point"),
    ("GroupAggregate[8]", 0.1 + 0.2, "has more than 2 digits after the point"),
    ("GroupAggregate[8]", Decimal("123456789.00"), "does not fit DECIMAL(10, 2)"),
    ("GroupAggregate[8]", "twelve", "field f0 is DECIMAL(10, 2)"),
    ("GroupAggregate[20]", {**TIMES, "f0": dt.datetime(2024, 1, 1, 12, 34, 56, 789001)},
     "more fractional digits than TIMESTAMP(3) holds"),
    ("GroupAggregate[20]", {**TIMES, "f0": TIMES["f2"]}, "give a naive datetime"),
    ("GroupAggregate[20]", {**TIMES, "f2": TIMES["f0"]}, "give an aware datetime"),
    ("GroupAggregate[20]", {**TIMES, "f3": dt.time(1, 2, 3, 4)}, "a TIME holds milliseconds"),
    ("GroupAggregate[24]", [300, 1, 1, 1.0, 1.0], "field f0 is TINYINT, got the number 300"),
    ("GroupAggregate[24]", [True, 1, 1, 1.0, 1.0], "field f0 is TINYINT, got the boolean"),
    ("GroupAggregate[24]", [1, 1, 1, 1e300, 1.0], "field f3 is FLOAT"),
    ("GroupAggregate[4]", [NEW_YEAR, None, None, False], "has 5 field(s)"),
    ("GroupAggregate[4]", {**COMPOSITE, "f2": "ab"}, "field f2 is BYTES"),
    ("GroupAggregate[4]", {**COMPOSITE, "f9": 1}, "has no field 'f9'"),
    ("GroupAggregate[4]", None, None),
]


@pytest.mark.parametrize("name", FIXTURES)
def test_keys_that_do_not_convert_are_typed_errors(name: str, decode_path: str) -> None:
    sp = _open(name)
    for op, key, message in REFUSED:
        if key is None:  # None is "no key" for read(); lookup refuses it
            with pytest.raises(InvalidKeyError, match="a key cannot be null"):
                sp.lookup(None, op)
            continue
        with pytest.raises(InvalidKeyError) as e:
            sp.read(op, "accState", key=key)
        assert message in str(e.value), (key, str(e.value))
        with pytest.raises(InvalidKeyError):
            sp.lookup(key, op)
        with pytest.raises(InvalidKeyError):
            sp.key_group_of(sp.state(op, "accState"), key)
    # a key no operator's key type holds: an error, not an empty lookup
    with pytest.raises(InvalidKeyError, match="no keyed operator's key type holds this key"):
        sp.lookup(dt.time(1, 2, 3, 4))
    # a key of the right type that is not there: no rows, no error
    assert sp.read("GroupAggregate[12]", "accState", key=dt.date(2000, 1, 1)).num_rows == 0


@pytest.mark.parametrize(
    ("text", "want_f0"),
    [('{"f0": "2024-02-29", "f1": "0.00", "f2": "bG9uZ2VyIHRoYW4gc2V2ZW4gYnl0ZXM=", "f3": true, '
      '"f4": "x\\u0000y"}', 1),
     ('["2024-01-01", 12.5, "YWI=", true, "a"]', 2),
     ('[null, "12.50", {"$bytes": "YWI="}, null, "b"]', 1)],
)
def test_cli_text_forms(text: str, want_f0: int, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(fixture_dir("keys-sql-hashmap-native"))
    assert main(["read", path, "groupaggregate_4__accstate", "--key", text, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["value"]["f0"] for r in rows] == [want_f0]
    assert main(["lookup", path, text, "--operator", "GroupAggregate[4]", "--json"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["read", "{path}", "groupaggregate_12__accstate", "--key", "19723"],
      "not a valid DATE (the type of field f0): write a DATE as YYYY-MM-DD, not a day number"),
     (["read", "{path}", "groupaggregate_8__accstate", "--key", "12.505"],
      "12.505 has more than 2 digits after the point"),
     (["lookup", "{path}", '["2024-01-01", 1, "not base64!", true, "a"]', "--operator",
       "GroupAggregate[4]"], "field f2 is BYTES, got the string \"not base64!\" (not base64)")],
)
def test_cli_refuses_in_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(fixture_dir("keys-sql-hashmap-native"))
    assert main([a.replace("{path}", path) for a in argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("statequery: ") and err.count("\n") == 1, err
    assert message in err, err


def test_sql_pushdown_of_typed_keys(tmp_path: Path) -> None:
    (tmp_path / "keys").symlink_to(fixture_dir("keys-sql-rocksdb-native"))
    cat = Catalog(str(tmp_path))

    def values(where: str, table: str = "groupaggregate_12__accstate") -> list[Any]:
        t = statequery.sql(f"SELECT value.f0 AS v FROM keys.{table} WHERE {where}", cat)
        return t.column("v").to_pylist()

    assert values("key = DATE '2024-01-01'") == values("key = '2024-01-01'") == [3]
    assert values("key IN ('2024-01-01', '2024-02-29')") == [3, 1] or \
        values("key IN ('2024-01-01', '2024-02-29')") == [1, 3]
    assert values("key = CAST('12.5' AS DECIMAL(10, 2))", "groupaggregate_8__accstate") == \
        values("key = 12.50", "groupaggregate_8__accstate")
    with pytest.raises(InvalidKeyError, match="not a day number"):
        values("key = 19723")
    with pytest.raises(InvalidKeyError, match="not a day number"):
        values("key = '19723'")
    with pytest.raises(InvalidKeyError, match="more than 2 digits"):
        values("key = 12.505", "groupaggregate_8__accstate")


def test_tuple_and_not_null_fields() -> None:
    pair = TupleSpec(fields=(PrimitiveSpec(name="string"), PrimitiveSpec(name="int")))
    with pytest.raises(InvalidKeyError, match="cannot be null in a Tuple key"):
        resolve_key(("a", None), pair, 128)
    nullable = TupleSpec(fields=(PrimitiveSpec(name="string"),
                                 NullableSpec(inner=PrimitiveSpec(name="int"))))
    assert resolve_key(("a", None), nullable, 128).serialized == b"\x02\x61\x01"
    got = resolve_key({"f0": "a", "f1": 7}, pair, 128)
    assert got.value == {"f0": "a", "f1": 7} and got.serialized == b"\x02\x61\x00\x00\x00\x07"
    assert parse_key_text('["a", 7]', pair) == got.value
    sp = _open("sql-ops-hashmap-native")
    op = next(o for o in sp.keyed_operators()
              if o.key_spec is not None and "NOT NULL" in str(o.key_spec.type.fields[0].type))
    with pytest.raises(InvalidKeyError, match="got null"):
        sp.lookup({"f0": None}, op.operator_id)
