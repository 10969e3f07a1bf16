"""Spellings a user writes in ``statequery sql`` that DuckDB would read otherwise, or not at all
(docs/sql.md, "Columns and types"): each does what it means in Spark SQL, or is refused with a
typed error naming what to write. Over the shipped catalog and a fixture whose plan-named
accumulators have dots in their names."""

from __future__ import annotations

import datetime
import decimal
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

import statequery
from statequery.catalog import Catalog
from statequery.exceptions import InvalidOptionError
from tests.conftest import FIXTURES, expected_entries, fixture_dir

LIST = "user_activity.user_state__recent_categories"


@pytest.fixture(scope="module")
def aggs(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    """A catalog database ``aggs``: sql-aggs-hashmap-canonical with its compiled plan in a
    StateMeta snapshot (AVG's accumulator fields are ``avg_amount.sum``/``avg_amount.count``)."""
    root = tmp_path_factory.mktemp("catalog")
    src = fixture_dir("sql-aggs-hashmap-canonical")
    shutil.copytree(src, root / "aggs" / src.name)
    sp = statequery.open(str(root / "aggs" / src.name), use_snapshot=False,
                         plan=str(FIXTURES / "plans" / "sql-aggs.json"))
    sp.write_snapshot()
    return Catalog(str(root))


def _one(query: str, catalog: Catalog | None = None) -> list[dict]:
    return statequery.sql(query, catalog or Catalog()).to_pylist()


def test_a_double_quoted_field_name_is_the_field(aggs: Catalog) -> None:
    t = 'aggs."6_group_aggregate__accstate"'
    want = _one(f"SELECT key.category, value['avg_amount.count'] AS n, "
                f"value['avg_amount.sum'] AS s FROM {t} ORDER BY 1", aggs)
    assert [r["category"] for r in want] == ["books", "games", "music"]
    assert all(r["n"] == 20 and r["s"] > 0 for r in want)
    for spelling in ('value."avg_amount.count" AS n, value."avg_amount.sum" AS s',
                     'a.value."avg_amount.count" AS n, a.value.`avg_amount.sum` AS s'):
        assert _one(f"SELECT key.category, {spelling} FROM {t} a ORDER BY 1", aggs) == want
    # nested: a quoted field of a quoted field
    rows = _one(f'SELECT key.category, value."first_amount"."firstValue" AS v FROM {t} '
                "ORDER BY 1", aggs)
    assert rows == _one(f"SELECT key.category, value.first_amount.firstValue AS v FROM {t} "
                        "ORDER BY 1", aggs)
    # alone, "..." stays a string (Spark SQL)
    assert _one(f'SELECT "a.b" AS s FROM {t} LIMIT 1', aggs) == [{"s": "a.b"}]


def test_the_element_past_the_end_is_refused_with_the_last_one() -> None:
    [row] = _one(f"SELECT value FROM {LIST} WHERE key = 'user-3'")
    values = row["value"]
    assert len(values) == 10
    for length in ("len", "size", "cardinality", "array_size", "length", "array_length"):
        with pytest.raises(InvalidOptionError, match=r"is past the end: arrays are indexed "
                           r"from 0 .* value\[size\(value\) - 1\] or element_at\(value, -1\)"):
            statequery.sql(f"SELECT value[{length}(value)] FROM {LIST}", Catalog())
    # what the error names is the last element; value[0] the first
    [row] = _one(f"SELECT value[size(value) - 1] AS a, element_at(value, -1) AS b, "
                 f"value[len(value) - 1] AS c, value[0] AS d FROM {LIST} WHERE key = 'user-3'")
    assert row == {"a": values[-1], "b": values[-1], "c": values[-1], "d": values[0]}


def test_epoch_numbers_to_timestamps() -> None:
    [row] = _one(
        "SELECT timestamp_millis(1700000000123) AS ms, timestamp_seconds(1700000000) AS s, "
        "timestamp_seconds(1700000000.123456) AS fs, timestamp_micros(1700000000123456) AS us, "
        "timestamp_millis(key_group) AS kg, timestamp_seconds(CAST(NULL AS BIGINT)) AS n "
        f"FROM {LIST} WHERE key = 'user-3'")
    at = datetime.datetime(2023, 11, 14, 22, 13, 20)
    assert row == {
        "ms": at + datetime.timedelta(milliseconds=123),
        "s": at,
        "fs": at + datetime.timedelta(microseconds=123456),
        "us": at + datetime.timedelta(microseconds=123456),
        "kg": datetime.datetime(1970, 1, 1) + datetime.timedelta(milliseconds=40),
        "n": None,
    }
    t = statequery.sql(f"SELECT timestamp_seconds(1) AS s, timestamp_millis(1) AS ms "
                       f"FROM {LIST} LIMIT 1", Catalog())
    assert t.schema.field("s").type == pa.timestamp("us")  # a TIMESTAMP, as in Spark
    assert t.schema.field("ms").type == pa.timestamp("us")
    with pytest.raises(InvalidOptionError, match=r"timestamp_millis\(\) takes 1 argument"):
        statequery.sql(f"SELECT timestamp_millis(1, 2) FROM {LIST}", Catalog())


def test_a_timestamp_field_from_epoch_millis_equals_the_decoded_one(tmp_path: Path) -> None:
    # the SQL fixture's TIMESTAMP accumulator field (microseconds), decoded, against the same
    # instant given to timestamp_millis as its epoch milliseconds (truncated to them)
    (tmp_path / "sqlfix").symlink_to(fixture_dir("sql-hashmap-canonical"))
    want = {e["key"]["f0"]: e["value"] for e in expected_entries("sql-hashmap-canonical")
            if e["state"] == "accState"}
    [row] = _one("SELECT value.f5 AS latest, timestamp_millis(unix_millis(value.f5)) AS again "
                 "FROM sqlfix.groupaggregate_7__accstate WHERE key = 'w13'", Catalog(str(tmp_path)))
    latest = datetime.datetime(1970, 1, 1) + datetime.timedelta(
        microseconds=want["w13"]["f5"] // 1000)
    assert latest.microsecond % 1000 != 0  # the truncation shows
    assert row["latest"] == latest
    assert row["again"] == latest.replace(microsecond=latest.microsecond // 1000 * 1000)


def test_spark_functions_duckdb_lacks() -> None:
    [row] = _one(
        "SELECT isnull(key) AS a, isnotnull(key) AS b, bround(2.5) AS c, bround(3.45, 1) AS d, "
        f"bround(-2.5) AS e FROM {LIST} WHERE key = 'user-3'")
    assert row == {"a": False, "b": True, "c": decimal.Decimal("2"),
                   "d": decimal.Decimal("3.4"), "e": decimal.Decimal("-2")}
    [row] = _one(f"SELECT every(key_group >= 0) AS a, some(key_group > 1000) AS b, "
                 f"every(key = 'user-3') AS c, count(*) AS n FROM {LIST}")
    assert row == {"a": True, "b": False, "c": False, "n": 20}
    for call, alternative in (("pmod(key_group, 3)", "((a % n) + n) % n"),
                              ("array_union(value, value)", "array_distinct(concat(a, b))"),
                              ("arrays_overlap(value, value)", "size(array_intersect(a, b)) > 0"),
                              ("forall(value, x -> x IS NOT NULL)", "size(filter(a, x -> NOT")):
        with pytest.raises(InvalidOptionError, match="a Spark SQL function DuckDB does not "
                           "have; write " + alternative.replace("(", r"\(").replace(")", r"\)")
                           .replace("%", "%").replace("+", r"\+")):
            statequery.sql(f"SELECT {call} FROM {LIST}", Catalog())


def test_an_index_of_any_type_counts_from_0() -> None:
    # sqlglot shifts an index into an array by 1 only when it knows the index is an integer:
    # a column or a function sqlglot does not model would have read the next element
    rows = _one(f"SELECT key_group, value, value[key_group % 3] AS a, "
                f"value[cardinality(value) - 1] AS b, t.value[(key_group + 1) % 2] AS c "
                f"FROM {LIST} t")
    assert len(rows) == 20
    for r in rows:
        v, kg = r["value"], r["key_group"]
        assert (r["a"], r["b"], r["c"]) == (v[kg % 3], v[-1], v[(kg + 1) % 2]), r


def test_a_map_column_is_looked_up_by_key(tmp_path: Path) -> None:
    (tmp_path / "edge").symlink_to(fixture_dir("edge-datastream-hashmap-canonical"))
    cat = Catalog(str(tmp_path))
    rows = _one("SELECT key, value, value[map_keys(value)[0]] AS first, "
                "element_at(value, map_keys(value)[0]) AS again "
                "FROM edge.edge_state__nullable_map WHERE cardinality(value) > 0", cat)
    assert rows
    for r in rows:
        assert r["first"] == r["again"] == r["value"][0][1], r
    longs = _one("SELECT key_group, value, value[size(value) - 1] AS last, "
                 "value[key_group % 2] AS kg FROM edge.edge_state__nullable_longs "
                 "WHERE size(value) > 2", cat)
    assert longs
    for r in longs:
        assert (r["last"], r["kg"]) == (r["value"][-1], r["value"][r["key_group"] % 2]), r
