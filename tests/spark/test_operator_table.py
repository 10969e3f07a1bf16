"""Operator tables in Spark: every keyed state of an operator in one scan (one pass per
partition), equal to the state tables; a join of two states as one GROUP BY; the ``key`` option
prunes to one partition; attach makes them persistent tables."""

from __future__ import annotations

import pytest

import statequery
from tests.conftest import expected_entries, fixture_dir

pytestmark = pytest.mark.spark

CANONICAL = "datastream-hashmap-canonical"
ROCKSDB = "datastream-rocksdb-native"




def _expected(name: str, state: str) -> dict[object, object]:
    return {e["key"]: e["value"] for e in expected_entries(name) if e["state"] == state}


@pytest.mark.parametrize("name", [CANONICAL, ROCKSDB])
def test_operator_table_equals_the_state_tables(spark, name: str) -> None:  # type: ignore[no-untyped-def]
    path = str(fixture_dir(name))
    sp = statequery.open(path)
    df = spark.read.format("statequery").option("operator", "user-state").load(path)
    keyed = sp.operator_states("user-state", keyed_only=True)
    assert df.columns[:3] == ["state", "key_group", "key"]
    assert len(df.columns) == 3 + len(keyed)
    per_state = {r["state"]: r["count"] for r in df.groupBy("state").count().collect()}
    assert per_state == {s.name: sp.read(s).num_rows for s in keyed}
    # one partition per subtask handle: each walks its key groups once for every state
    handles = {st.index for st in sp.operator("user-state").subtasks if st.keyed_handle}
    assert df.rdd.getNumPartitions() == len(handles)
    counts = {r["key"]: r["v"] for r in
              df.where("state = 'count'").selectExpr("key", "`count`.value AS v").collect()}
    assert counts == _expected(name, "count")
    # a join of two states in one scan: GROUP BY key over the operator table
    got = {
        r["key"]: (r["c"], r["s"])
        for r in df.where("state IN ('count', 'sum-amount')")
        .selectExpr("key", "`count`.value AS cv", "sum_amount.value AS sv")
        .groupBy("key").agg({"cv": "max", "sv": "max"})
        .withColumnRenamed("max(cv)", "c").withColumnRenamed("max(sv)", "s").collect()
    }
    sums = _expected(name, "sum-amount")
    assert got == {k: (v, sums[k]) for k, v in _expected(name, "count").items()}
    profile = df.where("key = 'user-3' AND state = 'profile'").select("profile.value.tier")
    assert [r["tier"] for r in profile.collect()] == [_expected(name, "profile")["user-3"]["tier"]]
    # the stale-reader sequence: a filtered query, then the whole table again
    assert df.count() == sum(per_state.values())


def test_key_and_states_options(spark) -> None:  # type: ignore[no-untyped-def]
    path = str(fixture_dir(CANONICAL))
    df = (spark.read.format("statequery").option("operator", "user-state")
          .option("states", "count,amount-by-category").option("key", "user-3").load(path))
    assert df.columns == ["state", "key_group", "key", "count", "amount_by_category"]
    assert df.rdd.getNumPartitions() == 1
    rows = df.collect()
    assert {r["key"] for r in rows} == {"user-3"}
    assert sorted(r["state"] for r in rows) == ["amount-by-category"] * 4 + ["count"]
    by_cat = {r["amount_by_category"]["user_key"]: r["amount_by_category"]["value"]
              for r in rows if r["state"] == "amount-by-category"}
    want = statequery.open(path).read("user-state", "amount-by-category", key="user-3")
    assert by_cat == {r["user_key"]: r["value"] for r in want.to_pylist()}
    from pyspark.errors import PySparkException

    with pytest.raises(PySparkException, match="no state 'nope'"):
        (spark.read.format("statequery").option("operator", "user-state")
         .option("states", "count,nope").load(path).collect())


def test_attach_makes_operator_tables(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from statequery.spark.catalog import attach, detach

    path = str(fixture_dir(ROCKSDB))
    assert attach(spark, path, database="optab") == ["optab"]
    try:
        tables = {r["tableName"] for r in spark.sql("SHOW TABLES IN optab").collect()}
        assert {"user_state", "window_agg", "user_state__count"} <= tables
        comments = {r["col_name"]: r["comment"]
                    for r in spark.sql("DESCRIBE optab.user_state").collect()}
        assert "every keyed state of operator 'user-state'" in comments["state"]
        assert comments["sum_amount"].startswith("reducing state 'sum-amount'")
        got = spark.sql(
            "SELECT key, max(`count`.value) AS c, max(sum_amount.value) AS s "
            "FROM optab.user_state GROUP BY key"
        ).collect()
        sums = _expected(ROCKSDB, "sum-amount")
        assert {r["key"]: (r["c"], r["s"]) for r in got} == {
            k: (v, sums[k]) for k, v in _expected(ROCKSDB, "count").items()
        }
        windows = spark.sql(
            "SELECT count(*) AS n FROM optab.window_agg WHERE state = 'window-contents'"
        ).collect()
        assert windows[0]["n"] == 80
    finally:
        detach(spark, ["optab"])
