"""No stale rows: a query after a key query over the same relation sees every row.

Spark 4.1-4.3 keep the reader planned for a query's pushed filters on the relation and reuse it
for later queries over the same DataFrame or view. statequery therefore prunes key groups only
from a read's options; these tests run filtered-then-unfiltered and unfiltered-then-filtered
sequences on every access path, with Spark's filter pushdown setting on and off, and compare
counts and values with the Python API.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import fixture_dir

import statequery

pytestmark = pytest.mark.spark

DB = Path(__file__).resolve().parents[2] / "catalog" / "user_activity"
OTHER = fixture_dir("datastream-hashmap-canonical")
TABLE = "user_state__amount_by_category"




@pytest.fixture(params=["true", "false"], ids=["pushdown-on", "pushdown-off"])
def session(spark, request) -> Iterator[object]:  # type: ignore[no-untyped-def]
    spark.conf.set("spark.sql.python.filterPushdown.enabled", request.param)
    yield spark
    spark.catalog.clearCache()


def _truth() -> list[tuple[str, str, int]]:
    table = statequery.open(str(DB)).read(TABLE)
    return sorted((r["key"], r["user_key"], r["value"]) for r in table.to_pylist())


TRUTH = _truth()
KEY = "user-3"
KEY_ROWS = [r for r in TRUTH if r[0] == KEY]
KEY_GROUP = statequery.open(str(DB)).key_group_of(TABLE, KEY)


def _rows(df) -> list[tuple[str, str, int]]:  # type: ignore[no-untyped-def]
    return sorted((r["key"], r["user_key"], r["value"]) for r in df.collect())


def _check_sequences(query) -> None:  # type: ignore[no-untyped-def]
    """``query(where)`` runs ``SELECT key, user_key, value`` with an optional WHERE clause."""
    assert len(TRUTH) > len(KEY_ROWS) >= 2
    # filtered, then unfiltered, then filtered differently, then unfiltered again
    assert _rows(query(f"key = '{KEY}'")) == KEY_ROWS
    assert _rows(query(None)) == TRUTH
    assert _rows(query(f"key IN ('{KEY}', 'user-7')")) == sorted(
        r for r in TRUTH if r[0] in (KEY, "user-7")
    )
    assert _rows(query(None)) == TRUTH
    assert _rows(query(f"key_group = {KEY_GROUP}")) == sorted(
        r for r in TRUTH if statequery.open(str(DB)).key_group_of(TABLE, r[0]) == KEY_GROUP
    )
    assert _rows(query(None)) == TRUTH
    assert _rows(query(f"key = '{KEY}'")) == KEY_ROWS


def test_same_dataframe(session) -> None:  # type: ignore[no-untyped-def]
    df = session.read.format("statequery").option("table", TABLE).load(str(DB))
    assert df.count() == len(TRUTH)  # unfiltered first
    _check_sequences(lambda where: df.where(where) if where else df)
    assert df.count() == len(TRUTH)
    assert df.where(f"key = '{KEY}'").count() == len(KEY_ROWS)
    assert df.groupBy().count().collect()[0][0] == len(TRUTH)


def test_temporary_view_from_sql(session) -> None:  # type: ignore[no-untyped-def]
    session.sql(
        f"CREATE OR REPLACE TEMPORARY VIEW stale_c USING statequery "
        f"OPTIONS (path '{DB}', table '{TABLE}')"
    )
    assert session.sql("SELECT count(*) FROM stale_c").collect()[0][0] == len(TRUTH)

    def query(where):  # type: ignore[no-untyped-def]
        return session.sql(
            "SELECT key, user_key, value FROM stale_c" + (f" WHERE {where}" if where else "")
        )

    _check_sequences(query)
    keyed = session.sql(f"SELECT count(*) FROM stale_c WHERE key = '{KEY}'")
    assert keyed.collect()[0][0] == len(KEY_ROWS)
    assert session.sql("SELECT count(*) FROM stale_c").collect()[0][0] == len(TRUTH)


def test_temporary_view_from_dataframe(session) -> None:  # type: ignore[no-untyped-def]
    df = session.read.format("statequery").option("table", TABLE).load(str(DB))
    df.createOrReplaceTempView("stale_df_view")

    def query(where):  # type: ignore[no-untyped-def]
        return session.table("stale_df_view").where(where) if where else session.table(
            "stale_df_view"
        )

    _check_sequences(query)


def test_register_views_group_by(session) -> None:  # type: ignore[no-untyped-def]
    from statequery.spark import register_views

    register_views(session, databases=["user_activity"])
    view = f"user_activity__{TABLE}"
    by_key: dict[str, int] = {}
    for key, _, _ in TRUTH:
        by_key[key] = by_key.get(key, 0) + 1
    one = session.sql(f"SELECT user_key, value FROM {view} WHERE key = '{KEY}'").collect()
    assert sorted((r[0], r[1]) for r in one) == [(u, v) for _, u, v in KEY_ROWS]
    grouped = session.sql(f"SELECT key, count(*) AS n FROM {view} GROUP BY key").collect()
    assert {r["key"]: r["n"] for r in grouped} == by_key


def test_key_option_prunes_and_stays_right(session) -> None:  # type: ignore[no-untyped-def]
    pruned = (
        session.read.format("statequery").option("table", TABLE).option("key", KEY).load(str(DB))
    )
    assert pruned.rdd.getNumPartitions() == 1
    assert _rows(pruned) == KEY_ROWS
    # a filter on a pruned read narrows it further and never widens it
    assert _rows(pruned.where("user_key IS NOT NULL")) == KEY_ROWS
    assert _rows(pruned) == KEY_ROWS
    groups = (
        session.read.format("statequery").option("table", TABLE)
        .option("key_groups", f"{KEY_GROUP},{KEY_GROUP}-{KEY_GROUP}").load(str(DB))
    )
    assert groups.rdd.getNumPartitions() == 1
    assert {r[0] for r in _rows(groups)} >= {KEY}
    full = session.read.format("statequery").option("table", TABLE).load(str(DB))
    assert full.rdd.getNumPartitions() > 1
    assert _rows(full) == TRUTH


def test_pushdown_true_is_refused(spark) -> None:  # type: ignore[no-untyped-def]
    from pyspark.errors import PySparkException

    with pytest.raises(PySparkException, match="pushdown=true is refused"):
        _ = (
            spark.read.format("statequery").option("table", TABLE).option("pushdown", "true")
            .load(str(DB)).schema
        )
    with pytest.raises(PySparkException, match="option key_groups must list"):
        _ = (
            spark.read.format("statequery").option("table", TABLE).option("key_groups", "x")
            .load(str(DB)).schema
        )


def test_reader_has_no_push_filters() -> None:
    """The reader must not offer pushFilters on the Spark versions we support (see docstring)."""
    from pyspark.sql.datasource import DataSourceReader

    from statequery.spark import StatequeryReader

    # Spark offers pushdown to a reader only when it overrides DataSourceReader.pushFilters
    assert StatequeryReader.pushFilters is DataSourceReader.pushFilters


@pytest.fixture(scope="module")
def attached(spark) -> Iterator[str]:  # type: ignore[no-untyped-def]
    from statequery.spark.catalog import attach, detach

    (name,) = attach(spark, str(DB), database="stale_db", replace=True)
    spark.sql(
        f"CREATE OR REPLACE VIEW stale_db.amounts_view AS "
        f"SELECT key, user_key, value, key_group FROM stale_db.{TABLE}"
    )
    yield name
    detach(spark, [name])


def test_persistent_table(session, attached) -> None:  # type: ignore[no-untyped-def]
    def query(where):  # type: ignore[no-untyped-def]
        return session.sql(
            f"SELECT key, user_key, value FROM {attached}.{TABLE}"
            + (f" WHERE {where}" if where else "")
        )

    _check_sequences(query)
    table = session.table(f"{attached}.{TABLE}")  # one DataFrame over the table, reused
    _check_sequences(lambda where: table.where(where) if where else table)


def test_persistent_view(session, attached) -> None:  # type: ignore[no-untyped-def]
    def query(where):  # type: ignore[no-untyped-def]
        return session.sql(
            f"SELECT key, user_key, value FROM {attached}.amounts_view"
            + (f" WHERE {where}" if where else "")
        )

    _check_sequences(query)
    view = session.table(f"{attached}.amounts_view")
    _check_sequences(lambda where: view.where(where) if where else view)


def test_persistent_table_with_key_option(session, attached) -> None:  # type: ignore[no-untyped-def]
    """``WITH ('key' = ...)`` on a persistent table: one key group, then every row again."""
    table = f"{attached}.{TABLE}"

    def query(options):  # type: ignore[no-untyped-def]
        return session.sql(f"SELECT key, user_key, value FROM {table}" + (
            " WITH (" + ", ".join(f"'{k}' = '{v}'" for k, v in options.items()) + ")"
            if options else ""))

    keyed = query({"key": KEY})
    assert keyed.rdd.getNumPartitions() == 1  # the line on stderr: tests/spark/test_shell.py
    assert _rows(keyed) == KEY_ROWS
    full = query(None)
    assert full.rdd.getNumPartitions() > 1
    assert _rows(full) == TRUTH
    assert session.sql(
        f"SELECT count(*) FROM {table} WITH ('key' = '{KEY}')"
    ).collect()[0][0] == len(KEY_ROWS)
    assert session.sql(f"SELECT count(*) FROM {table}").collect()[0][0] == len(TRUTH)
    # with a WHERE clause too, and the key_groups option; then unfiltered once more
    assert _rows(query({"key": KEY}).where("user_key IS NOT NULL")) == KEY_ROWS
    assert _rows(query({"key": "user-7"})) == [r for r in TRUTH if r[0] == "user-7"]
    groups = query({"key_groups": str(KEY_GROUP)})
    assert groups.rdd.getNumPartitions() == 1
    assert {r[0] for r in _rows(groups)} >= {KEY}
    assert _rows(query(None)) == TRUTH
    # the same table through spark.read.options(...).table(...)
    read = session.read.options(key=KEY).table(table)
    assert read.rdd.getNumPartitions() == 1
    assert _rows(read) == KEY_ROWS
    assert _rows(session.table(table)) == TRUTH


def test_persistent_operator_table_with_key_option(spark, attached) -> None:  # type: ignore[no-untyped-def]
    table = f"{attached}.user_state"
    sp = statequery.open(str(DB))
    keyed = [s.name for s in sp.operator_table("user_state").states]
    every = sum(b.num_rows for _, b in sp.read_operator("user-state", keyed))
    one = sum(b.num_rows for _, b in sp.read_operator("user-state", keyed, key=KEY))
    assert every > one > 1
    keyed = spark.sql(f"SELECT state, key FROM {table} WITH ('key' = '{KEY}')")
    assert keyed.rdd.getNumPartitions() == 1
    assert {r["key"] for r in keyed.collect()} == {KEY} and keyed.count() == one
    assert spark.sql(f"SELECT count(*) FROM {table}").collect()[0][0] == every


def test_with_options_that_would_change_the_table_are_refused(spark, attached) -> None:  # type: ignore[no-untyped-def]
    from pyspark.errors import PySparkException

    table = f"{attached}.{TABLE}"
    refused = {
        f"SELECT count(*) FROM {attached}.state_meta WITH ('key' = '{KEY}')":
            "the state_meta table has no keys",
        f"SELECT count(*) FROM {table} WITH ('table' = 'user_state__count')":
            "a query on it may give only the options",
        # another savepoint (not a folder above the table's own: /tmp may hold the checkout)
        f"SELECT count(*) FROM {table} WITH ('path' = '{OTHER}', 'table' = '{TABLE}')":
            "name another savepoint",
        f"SELECT count(*) FROM {table} WITH ('mode' = 'nested')": "may give only the options",
        f"SELECT count(*) FROM {table} WITH ('nope' = '1')": "unknown statequery option 'nope'",
        f"SELECT count(*) FROM {table} WITH ('key_groups' = 'x')": "option key_groups must list",
    }
    for sql, message in refused.items():
        with pytest.raises(PySparkException, match=message):
            spark.sql(sql).collect()
    # repeating the table's own options is not a change
    same = spark.sql(
        f"SELECT count(*) FROM {table} WITH ('path' = '{DB}', 'table' = '{TABLE}', "
        f"'key' = '{KEY}')"
    )
    assert same.collect()[0][0] == len(KEY_ROWS)
    assert spark.sql(f"SELECT count(*) FROM {attached}.state_meta").collect()[0][0] > 0
