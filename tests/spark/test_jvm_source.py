"""statequery's JVM data source (columnar, ``statequery.DefaultSource``) against the Python data
source: the same reads give the same rows, the same errors, in one Spark session.

The session has the jar, so ``format("statequery")`` is the JVM path (Spark resolves the class
``statequery.DefaultSource`` before Python data sources); the Python data source is registered
again under the name ``statequery_python`` for the comparison.
"""

from __future__ import annotations

import sys
from decimal import Decimal
from typing import Any

import pytest

import statequery
from statequery.spark import StatequeryDataSource
from tests.conftest import FIXTURES, fixture_dir

pytestmark = pytest.mark.spark

CANONICAL = "datastream-hashmap-canonical"
ROCKSDB = "datastream-rocksdb-native"


class PythonPath(StatequeryDataSource):
    """The Python data source under another name (the JVM class owns ``statequery``)."""

    @classmethod
    def name(cls) -> str:
        return "statequery_python"


@pytest.fixture(scope="module")
def spark(spark):  # type: ignore[no-untyped-def]
    """The shared session (tests/conftest.py: it has the jar), with the Python data source
    registered again as ``statequery_python``."""
    from statequery.spark.jvm import jar_path

    jar = jar_path()
    assert jar is not None, "javac is on PATH here: the jar must build"
    assert jar in spark.conf.get("spark.jars", "").split(",")
    from pyspark import cloudpickle

    # the test module is not importable in Spark's Python workers: send the class by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(PythonPath)
    return spark


def _plain(value: Any) -> Any:
    if hasattr(value, "asDict"):
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return sorted((repr(_plain(k)), _plain(v)) for k, v in value.items())
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _rows(df: Any) -> list[str]:
    return sorted(repr(_plain(r)) for r in df.collect())


def _both(spark: Any, path: str, **options: str) -> tuple[Any, Any]:
    return tuple(  # type: ignore[return-value]
        spark.read.format(fmt).options(**options).load(path)
        for fmt in ("statequery", "statequery_python")
    )


def _plan(df: Any) -> str:
    return str(df._jdf.queryExecution().executedPlan().toString())


def _same(spark: Any, path: str, **options: str) -> int:
    jvm, python = _both(spark, path, **options)
    assert "BatchScan statequery" in _plan(jvm) and "ColumnarToRow" in _plan(jvm)
    assert jvm.schema == python.schema
    rows = _rows(jvm)
    assert rows == _rows(python), options
    return len(rows)


def test_the_jvm_path_is_columnar_and_prunes_columns(spark) -> None:  # type: ignore[no-untyped-def]
    df = spark.read.format("statequery").option("table", "user_state__count").load(
        str(fixture_dir(CANONICAL)))
    assert "statequery columns key,value" in _plan(df.select("key", "value"))
    assert "statequery columns " in _plan(df.groupBy().count())  # count(*): no column
    assert df.count() == 20
    assert df.where("value > 0").count() == 20
    assert len(df.limit(3).collect()) == 3  # a reader closed early gives its worker back
    assert df.count() == 20


def test_persistent_table_takes_the_jvm_path(spark) -> None:  # type: ignore[no-untyped-def]
    """``USING statequery`` (what ``statequery attach`` creates) with the same SQL: the JVM
    class, also with a query's ``WITH ('key' = ...)``."""
    path = str(fixture_dir(CANONICAL))
    spark.sql(f"CREATE TABLE jvm_count USING statequery OPTIONS (path '{path}', "
              "table 'user_state__count')")
    try:
        df = spark.table("jvm_count")
        assert "BatchScan statequery" in _plan(df)
        assert df.count() == 20
        one = spark.sql("SELECT key, value FROM jvm_count WITH ('key' = 'user-3')")
        assert "BatchScan statequery" in _plan(one)
        assert [tuple(r) for r in one.collect()] == [("user-3", 10)]
    finally:
        spark.sql("DROP TABLE jvm_count")


def test_rocksdb_native(spark) -> None:  # type: ignore[no-untyped-def]
    path = str(fixture_dir(ROCKSDB))
    assert _same(spark, path, operator="user-state", state="recent-categories") > 0
    assert _same(spark, path, operator="user-state") > 20


def test_states_and_modes(spark) -> None:  # type: ignore[no-untyped-def]
    path = str(fixture_dir(CANONICAL))
    assert _same(spark, path) > 10  # state_meta
    for state, mode in (("count", None), ("profile", None), ("recent-categories", None),
                        ("recent-categories", "flat"), ("amount-by-category", None),
                        ("amount-by-category", "nested")):
        opts = {"operator": "user-state", "state": state, **({"mode": mode} if mode else {})}
        assert _same(spark, path, **opts) > 0, opts
    assert _same(spark, path, operator="window-agg", state="window-contents") > 0
    assert _same(spark, path, operator="user-state") > 20  # the operator table


def test_key_and_key_group_options(spark) -> None:  # type: ignore[no-untyped-def]
    path = str(fixture_dir(CANONICAL))
    state = {"operator": "user-state", "state": "amount-by-category"}
    assert _same(spark, path, key="user-3", **state) > 1
    kg = statequery.open(path).key_group_of("user_state__amount_by_category", "user-3")
    assert _same(spark, path, key_groups=f"{kg},0-20", **state) > 1
    assert _same(spark, path, key_groups_per_partition="16", **state) > 1
    assert _same(spark, path, key="user-3", operator="user-state") > 1
    jvm, _ = _both(spark, path, key="user-3", **state)
    assert jvm.rdd.getNumPartitions() == 1
    assert {r["key"] for r in jvm.collect()} == {"user-3"}
    assert _same(spark, path, key="nobody", **state) == 0


@pytest.mark.parametrize("name", ["keys-sql-hashmap-native", "edge-sql-rocksdb-native",
                                  "sql-cep-hashmap-native"])
def test_sql_operator_tables(spark, name: str) -> None:  # type: ignore[no-untyped-def]
    """Every keyed state of these savepoints, one operator table each: composite keys, DATE,
    TIME, DECIMAL, BYTES, timestamps, nested rows, lists and maps, row kinds."""
    sp = statequery.open(str(fixture_dir(name)))
    operators = sorted({s.operator_id for s in sp.states if s.keyed_rows})
    total = sum(_same(spark, str(fixture_dir(name)), operator=op) for op in operators)
    assert total > 0


def test_decimal_values(spark) -> None:  # type: ignore[no-untyped-def]
    df = spark.read.format("statequery").option("operator", "GroupAggregate[7]").option(
        "state", "accState").load(str(fixture_dir("sql-hashmap-canonical")))
    values = [r["value"]["f3"] for r in df.collect()]
    assert values and all(isinstance(v, Decimal) for v in values)


def _error(df_or_call: Any) -> str:
    from pyspark.errors import PySparkException

    with pytest.raises(PySparkException) as e:
        df_or_call()
    return str(e.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"operator": "user-state", "state": "count", "colour": "red"},
         "unknown statequery option 'colour'"),
        ({"operator": "user-state", "state": "nope"}, "no state 'nope'"),
        ({"operator": "user-state", "state": "count", "pushdown": "true"},
         "pushdown=true is refused"),
        ({"operator": "user-state", "state": "count", "key_groups": "x"},
         "option key_groups must list"),
    ],
)
def test_errors_are_the_python_ones(spark, options, message) -> None:  # type: ignore[no-untyped-def]
    path = str(fixture_dir(CANONICAL))
    for fmt in ("statequery", "statequery_python"):
        text = _error(
            lambda fmt=fmt: spark.read.format(fmt).options(**options).load(path).collect()
        )
        assert message in text, (fmt, text[:2000])
        if fmt == "statequery":
            assert "statequery.exceptions." in text  # the Python error's type


def test_a_changed_savepoint_is_refused(spark) -> None:  # type: ignore[no-untyped-def]
    """The fingerprint check (what a persistent table does when its savepoint's files changed:
    tests/spark/test_attach.py) raises the same typed error through the JVM path."""
    path = str(fixture_dir(CANONICAL))
    for fmt in ("statequery", "statequery_python"):
        text = _error(lambda fmt=fmt: spark.read.format(fmt).option("table", "user_state__count")
                      .option("fingerprint", "0" * 64).load(path).count())
        assert "is not the savepoint this table was set up over" in text, (fmt, text[:2000])
        if fmt == "statequery":
            assert "statequery.exceptions.SavepointChangedError" in text


def test_without_javac_the_python_data_source_is_kept(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    from statequery.spark import jvm

    monkeypatch.setenv("STATEQUERY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no javac here
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(jvm, "_warned", False)
    assert jvm.jar_path() is None
    assert jvm.session_conf() == {}
    assert capsys.readouterr().err.count("no javac") == 1  # said once
    monkeypatch.setenv("STATEQUERY_SPARK_PATH", "python")
    assert jvm.session_conf() == {}


# -- a job's versions and its change feed (statequery.history, issue 34) ----------------------

HISTORY = "history-hashmap"


def _arrow_rows(table: Any) -> list[str]:
    from statequery.spark import spark_arrow_schema

    cast = table.cast(spark_arrow_schema(table.schema))
    return sorted(repr(r) for r in cast.to_pylist())


def _spark_rows(df: Any) -> list[str]:
    return sorted(repr(r) for r in df.toArrow().to_pylist())


def _history_state() -> tuple[str, str, str]:
    """(operator id, state name, table name) of the history fixture's first keyed value state."""
    sp = statequery.open_job(str(FIXTURES / HISTORY)).version()
    row = next(r for r in sp.state_meta().to_pylist() if r["kind"] == "value")
    return row["operator_id"], row["state_name"], row["table_name"]


@pytest.mark.parametrize("fmt", ["statequery", "statequery_python"])
def test_version_option_reads_that_version_of_a_job(spark, fmt: str) -> None:  # type: ignore[no-untyped-def]
    path = str(FIXTURES / HISTORY)
    job = statequery.open_job(path)
    ids = [v.checkpoint_id for v in job.complete_versions()]
    operator, state, _ = _history_state()
    old = ids[1]
    expected = job.read(operator, state, version=old)
    # the older version differs from the newest one: the option is what chooses it
    assert _arrow_rows(expected) != _arrow_rows(job.read(operator, state))
    df = (spark.read.format(fmt).option("version", str(old)).option("operator", operator)
          .option("state", state).load(path))
    assert expected.num_rows > 0
    assert _spark_rows(df) == _arrow_rows(expected)
    if fmt == "statequery":  # the columnar JVM source, planned by the same Python code
        assert "ColumnarToRow" in _plan(df)
    # without the option: the newest complete version
    newest = spark.read.format(fmt).option("operator", operator).option("state", state).load(path)
    assert _spark_rows(newest) == _arrow_rows(job.read(operator, state))


@pytest.mark.parametrize("fmt", ["statequery", "statequery_python"])
def test_change_feed_read_equals_job_changes(spark, fmt: str) -> None:  # type: ignore[no-untyped-def]
    path = str(FIXTURES / HISTORY)
    job = statequery.open_job(path)
    expected = job.changes()
    assert {"insert", "update", "delete"} <= set(expected.column("change").to_pylist())
    df = spark.read.format(fmt).option("changes", "true").load(path)
    assert df.columns == expected.schema.names
    assert _spark_rows(df) == _arrow_rows(expected)
    if fmt == "statequery":
        assert "ColumnarToRow" in _plan(df)
    # one state's feed by its table name, between two checkpoint ids
    operator, state, table = _history_state()
    ids = [v.checkpoint_id for v in job.complete_versions()]
    one = job.changes(operator, state, start=ids[2], end=ids[4])
    assert one.num_rows > 0
    df = (spark.read.format(fmt).option("table", f"{table}__changes")
          .option("start", str(ids[2])).option("end", str(ids[4])).load(path))
    assert _spark_rows(df) == _arrow_rows(one)


def test_history_options_checked() -> None:
    from statequery.exceptions import InvalidOptionError
    from statequery.spark import ReadOptions

    opts = ReadOptions.parse({"path": "/j", "table": "counter__count__changes", "start": "2"})
    assert (opts.changes, opts.table, opts.start) == (True, "counter__count", 2)
    assert ReadOptions.parse({"path": "/j", "version": "3", "operator": "o"}).version == 3
    for bad, why in [
        ({"version": "x"}, "checkpoint id"),
        ({"changes": "true", "version": "3"}, "start"),
        ({"start": "3"}, "changes=true"),
        ({"changes": "true", "start": "5", "end": "3"}, "after end"),
        ({"changes": "true", "mode": "flat"}, "change feed"),
        ({"changes": "maybe"}, "true or false"),
    ]:
        with pytest.raises(InvalidOptionError, match=why):
            ReadOptions.parse({"path": "/j", **bad})
