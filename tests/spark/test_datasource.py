"""The Spark data source, tested for real: a local Spark session and the spark-sql CLI."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from tests.conftest import expected_entries, fixture_dir

pytestmark = pytest.mark.spark

CANONICAL = "datastream-hashmap-canonical"
SQL = "sql-hashmap-canonical"
ROCKSDB = "datastream-rocksdb-native"


@pytest.fixture(scope="module")
def spark(spark):  # type: ignore[no-untyped-def]
    """The shared session (tests/conftest.py) with filter pushdown into Python data sources on
    (undone at the end of the module)."""
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    return spark


def _expected(name: str, state: str) -> dict[object, object]:
    return {
        e["key"]: e["value"] for e in expected_entries(name) if e["state"] == state
    }


def test_state_meta_table(spark) -> None:  # type: ignore[no-untyped-def]
    import statequery

    df = spark.read.format("statequery").load(str(fixture_dir(CANONICAL)))
    rows = df.collect()
    meta = statequery.open(str(fixture_dir(CANONICAL))).state_meta()
    assert len(rows) == meta.num_rows
    kinds = {(r["operator_uid"], r["state_name"]): r["kind"] for r in rows}
    assert kinds[("user-state", "count")] == "value"
    assert kinds[("user-state", "recent-categories")] == "list"
    assert kinds[("window-agg", "_timer_state/event_window-timers")] == "event_timer"
    assert kinds[("operator-state", "union-markers")] == "operator_union"


@pytest.mark.parametrize("name", [CANONICAL, ROCKSDB])
def test_value_state_matches_expected(spark, name: str) -> None:  # type: ignore[no-untyped-def]
    df = (
        spark.read.format("statequery")
        .option("operator", "user-state")
        .option("state", "count")
        .load(str(fixture_dir(name)))
    )
    got = {r["key"]: r["value"] for r in df.collect()}
    assert got == _expected(name, "count")
    assert len(got) == 20


def test_key_equality_filter(spark) -> None:  # type: ignore[no-untyped-def]
    df = (
        spark.read.format("statequery")
        .option("operator", "user-state")
        .option("state", "profile")
        .load(str(fixture_dir(CANONICAL)))
    )
    rows = df.where("key = 'user-1'").select("key", "value.name", "value.address.zip",
                                            "value.tier", "value.lastAmount").collect()
    assert [tuple(r) for r in rows] == [("user-1", "user-1", 10001, "SILVER", 31)]
    # filters are never pushed into the reader (docs/spark.md): Spark filters every key group
    assert df.where("key = 'user-1'").rdd.getNumPartitions() == df.rdd.getNumPartitions() > 1
    assert df.count() == 20


def test_list_and_window_state(spark) -> None:  # type: ignore[no-untyped-def]
    path = str(fixture_dir(CANONICAL))
    lists = (
        spark.read.format("statequery").option("operator", "user-state")
        .option("state", "recent-categories").load(path)
    )
    got = {r["key"]: list(r["value"]) for r in lists.collect()}
    assert got == _expected(CANONICAL, "recent-categories")

    windows = (
        spark.read.format("statequery").option("operator", "window-agg")
        .option("state", "window-contents").load(path)
    )
    rows = (
        windows.where("key = 'user-0'")
        .selectExpr("unix_millis(namespace.start) AS start", "value")
        .orderBy("start")
        .collect()
    )
    expected = sorted(
        (e["namespace"]["start"], e["value"])
        for e in expected_entries(CANONICAL)
        if e["state"] == "window-contents" and e["key"] == "user-0"
    )
    assert [(r["start"], r["value"]) for r in rows] == expected


def test_sql_rowdata_state(spark) -> None:  # type: ignore[no-untyped-def]
    df = (
        spark.read.format("statequery").option("operator", "GroupAggregate[7]")
        .option("state", "accState").load(str(fixture_dir(SQL)))
    )
    rows = {r["key"]["f0"]: r["value"] for r in df.collect()}
    want = {e["key"]["f0"]: e["value"] for e in expected_entries(SQL) if e["state"] == "accState"}
    assert set(rows) == set(want)
    for word, acc in want.items():
        got = rows[word]
        assert got["f0"] == acc["f0"] and got["f1"] == acc["f1"] and got["f2"] == acc["f2"]
        assert got["f3"] == Decimal(acc["f3"])
        assert got["f4"] == Decimal(acc["f4"])
        assert got["f6"] == acc["f6"]


def _spark_sql_binary() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-sql"


def test_spark_sql_cli_finds_the_source_statically(tmp_path: Path) -> None:
    """`USING statequery` in the real spark-sql shell: no registration call anywhere."""
    path = fixture_dir(CANONICAL)
    script = tmp_path / "query.sql"
    script.write_text(
        f"CREATE TEMPORARY VIEW counts USING statequery "
        f"OPTIONS (path '{path}', operator 'user-state', state 'count');\n"
        "SELECT concat('ROW:', key, '=', value) FROM counts WHERE key IN ('user-3', 'user-7') "
        "ORDER BY key;\n"
        # issue 8: the count after a key query on the same view must be the full count
        "SELECT concat('COUNT:', count(*)) FROM counts WHERE key = 'user-3';\n"
        "SELECT concat('COUNT:', count(*)) FROM counts;\n"
        f"CREATE TEMPORARY VIEW one USING statequery "
        f"OPTIONS (path '{path}', operator 'user-state', state 'count', key 'user-3');\n"
        "SELECT concat('ONE:', key, '=', value) FROM one;\n"
        "SELECT concat('COUNT:', count(*)) FROM counts;\n"
    )
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = sys.executable
    env["SPARK_HOME"] = str(_spark_sql_binary().parent.parent)
    proc = subprocess.run(
        [str(_spark_sql_binary()), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
         "--conf", "spark.sql.python.filterPushdown.enabled=true", "-f", str(script)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ROW:")]
    assert lines == ["ROW:user-3=10", "ROW:user-7=10"]
    counts = [ln for ln in proc.stdout.splitlines() if ln.startswith("COUNT:")]
    assert counts == ["COUNT:1", "COUNT:20", "COUNT:20"]
    assert [ln for ln in proc.stdout.splitlines() if ln.startswith("ONE:")] == ["ONE:user-3=10"]
    # the pruned read says what it reads, on the planning worker's stderr
    assert "statequery: user_state__count: key 'user-3' -> key group(s) 40 of 128, 1 partition(s)" \
        in proc.stderr


def test_key_option_and_unknown_option(spark) -> None:  # type: ignore[no-untyped-def]
    path = str(fixture_dir(CANONICAL))
    df = (
        spark.read.format("statequery").option("operator", "user-state")
        .option("state", "amount-by-category").option("key", "user-2").load(path)
    )
    got = sorted((r["key"], r["user_key"], r["value"]) for r in df.collect())
    want = sorted(
        (e["key"], e["user_key"], e["value"])
        for e in expected_entries(CANONICAL)
        if e["state"] == "amount-by-category" and e["key"] == "user-2"
    )
    assert got == want and len(want) >= 2
    assert df.rdd.getNumPartitions() == 1

    from pyspark.errors import PySparkException

    with pytest.raises(PySparkException, match="unknown statequery option 'colour'"):
        _ = spark.read.format("statequery").option("colour", "red").load(path).schema


def test_catalog_views(spark) -> None:  # type: ignore[no-untyped-def]
    from statequery.spark import register_views

    names = register_views(spark, databases=["word_counts"])
    assert "word_counts__state_meta" in names
    assert "word_counts__groupaggregate_7__accstate" in names
    rows = spark.sql(
        "SELECT key.f0 AS word, value.f0 AS cnt FROM word_counts__groupaggregate_7__accstate "
        "WHERE key.f0 = 'w3'"
    ).collect()
    assert [(r["word"], r["cnt"]) for r in rows] == [("w3", 30)]


def test_option_parsing() -> None:
    from statequery.exceptions import InvalidOptionError
    from statequery.spark import ReadOptions

    # a persistent table's stored options: `option.` prefix and Spark's reserved properties
    opts = ReadOptions.parse({"option.table": "t", "path": "/x", "location": "file:/x",
                              "owner": "me", "provider": "statequery"})
    assert (opts.path, opts.table) == ("/x", "t")
    assert ReadOptions.parse({"path": "/x", "operator.uid": "u", "state": "s"}).operator == "u"
    with pytest.raises(InvalidOptionError, match="statequery attach"):
        ReadOptions.parse({})
    with pytest.raises(InvalidOptionError, match="'state' needs 'operator'"):
        ReadOptions.parse({"path": "/x", "state": "s"})
    with pytest.raises(InvalidOptionError, match="not both"):
        ReadOptions.parse({"path": "/x", "operator": "u", "state": "s", "states": "a,b"})
    # operator without state: the operator table
    opts = ReadOptions.parse({"path": "/x", "operator": "u", "states": "a, b"})
    assert not opts.is_state_meta and opts.state_names == ["a", "b"]
    with pytest.raises(InvalidOptionError, match="batch_size must be an integer"):
        ReadOptions.parse({"path": "/x", "batch_size": "many"})


def test_key_groups_option_parsing() -> None:
    from statequery.exceptions import InvalidOptionError
    from statequery.spark import parse_key_group_list

    assert parse_key_group_list("5") == {5}
    assert parse_key_group_list("1,4, 7-9") == {1, 4, 7, 8, 9}
    for bad in ("", "a", "3-1", "-2", "1,,2"):
        with pytest.raises(InvalidOptionError, match="key_groups"):
            parse_key_group_list(bad)


def test_key_groups_outside_the_range_read_nothing(spark) -> None:  # type: ignore[no-untyped-def]
    df = (
        spark.read.format("statequery").option("operator", "user-state").option("state", "count")
        .option("key_groups", "100000").load(str(fixture_dir(CANONICAL)))
    )
    assert df.count() == 0


def test_sql_state_with_the_query_names(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A savepoint whose StateMeta snapshot carries the job's compiled plan: the Spark table of
    the Top-N state shows the query's columns (issue: names from the query)."""
    import shutil

    import statequery
    from statequery.cli import main
    from tests.conftest import FIXTURES

    src = fixture_dir("sql-ops-hashmap-native")
    copy = tmp_path / src.name
    shutil.copytree(src, copy)
    assert main(["snapshot", str(copy), "--plan", str(FIXTURES / "plans" / "sql-ops.json")]) == 0
    rank = next(o for o in statequery.open(str(copy)).operators if o.name.startswith("Rank["))
    df = (
        spark.read.format("statequery").option("operator", rank.operator_id)
        .option("state", "data-state-with-append").load(str(copy))
    )
    assert df.schema["key"].dataType.fieldNames() == ["category"]
    assert df.schema["user_key"].dataType.fieldNames() == ["amount"]
    # Top-N keeps each row with its RowKind (docs/decoding.md, "Row kinds")
    fields = df.schema["value"].dataType.elementType.fieldNames()
    assert fields == ["row_kind", "id", "amount", "category"]
    rows = df.where("key.category = 'books'").collect()
    assert max(r["user_key"]["amount"] for r in rows) == 100
    assert all(v["category"] == "books" for r in rows for v in r["value"])
    assert {v["row_kind"] for r in rows for v in r["value"]} <= {"+I", "+U", "-U", "-D"}


def test_avro_record_state(spark) -> None:  # type: ignore[no-untyped-def]
    """Avro GenericRecords (docs/avro.md) reach Spark as structs with the Avro field names, the
    logical types as Spark's decimal, date and timestamp types."""
    df = (
        spark.read.format("statequery")
        .option("operator", "avro-state")
        .option("state", "everything")
        .load(str(fixture_dir("types-avro-rocksdb-native")))
    )
    assert df.schema["value"].dataType["dec_bytes"].dataType.simpleString() == "decimal(20,4)"
    rows = df.where("key = 'k2'").selectExpr(
        "value.nested.label", "value.multi.branch", "value.dec_bytes", "value.day"
    ).collect()
    assert [tuple(r) for r in rows] == [
        ("\U0001F600", 2, Decimal("9999999999999999.9999"), datetime.date(9999, 12, 31))
    ]
