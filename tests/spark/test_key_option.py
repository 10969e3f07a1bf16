"""The Spark ``key`` option goes through the shared key conversion (statequery.keys)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

WORD_COUNTS = str(Path(__file__).resolve().parents[2] / "catalog" / "word_counts")


@pytest.fixture(scope="module")
def spark(spark):  # type: ignore[no-untyped-def]
    """The shared session (tests/conftest.py) with one shuffle partition (undone at the end of
    the module)."""
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    return spark


def _read(spark, key: str):  # type: ignore[no-untyped-def]
    return (
        spark.read.format("statequery")
        .option("table", "groupaggregate_7__accstate")
        .option("key", key)
        .load(WORD_COUNTS)
    )


def test_composite_key_option(spark) -> None:  # type: ignore[no-untyped-def]
    rows = _read(spark, '["w13"]').select("key.f0", "value.f0").collect()
    assert [(r[0], r[1]) for r in rows] == [("w13", 29)]

    from pyspark.errors import PySparkException

    for key, got in (("[5]", "the number 5"), ("[true]", "the boolean true")):
        with pytest.raises(PySparkException) as e:
            _read(spark, key).collect()
        assert "InvalidKeyError" in str(e.value) and "AttributeError" not in str(e.value)
        assert f"field f0 is STRING, got {got}" in str(e.value)


KEYS_SQL = str(
    Path(__file__).resolve().parents[1]
    / "fixtures"
    / "keys-sql-hashmap-native"
    / "savepoint-e16c06-3f0eb3ac5850"
)


def _read_table(spark, table: str, key: str):  # type: ignore[no-untyped-def]
    return spark.read.format("statequery").option("table", table).option("key", key).load(KEYS_SQL)


def test_typed_key_options(spark) -> None:  # type: ignore[no-untyped-def]
    """DATE, DECIMAL, BYTES (base64), BOOLEAN and STRING fields, nulls included, as text: the
    same text forms as the CLI (docs/spark.md)."""
    def values(table: str, key: str) -> list[int]:
        return [r[0] for r in _read_table(spark, table, key).select("value.f0").collect()]

    assert values("groupaggregate_12__accstate", "2024-01-01") == [3]
    assert values("groupaggregate_8__accstate", "12.5") == [2]
    assert values("groupaggregate_4__accstate",
                  '["2024-02-29", "0.00", "bG9uZ2VyIHRoYW4gc2V2ZW4gYnl0ZXM=", true, "x\\u0000y"]'
                  ) == [1]
    assert values("groupaggregate_4__accstate", '[null, "12.50", "YWI=", null, "b"]') == [1]

    from pyspark.errors import PySparkException

    with pytest.raises(PySparkException) as e:
        _read_table(spark, "groupaggregate_12__accstate", "19723").collect()
    assert "InvalidKeyError" in str(e.value) and "not a day number" in str(e.value)


def test_pickled_option(spark) -> None:  # type: ignore[no-untyped-def]
    """The option ``pickled``: a DataFrame read, a table created as ``attach --pickled`` creates
    it, and a query's ``WITH ('pickled' = ...)`` (which must agree with the table's own)."""
    import json

    from pyspark.errors import PySparkException

    from statequery.spark.catalog import attach_plans
    from tests.conftest import fixture_dir

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "flink-jobs"))
    import pyflink_model as pm

    path = str(fixture_dir("pyflink-thread-hashmap-canonical"))
    df = (spark.read.format("statequery").option("table", "py_pickled__pair_count")
          .option("pickled", "true").load(path))
    assert df.columns == ["key_group", "key", "key_py", "key_py_reason", "namespace", "value"]
    got = {tuple(json.loads(r[0])): r[1] for r in df.select("key_py", "value").collect()}
    assert got == pm.pair_counts()

    [plan] = attach_plans(path, "pyt_pickled", pickled=True)
    made = {s.split("`.`", 1)[1].split("`", 1)[0]: s for s in plan.create_tables()}
    assert "pickled 'true'" in made["py_pickled__pair_count"]
    assert "pickled 'true'" not in made["py_typed__count"] + made["state_meta"]
    spark.sql(plan.create_database())
    try:
        for table in ("py_pickled__pair_count", "py_typed__count"):
            spark.sql(made[table])
        rows = spark.sql("SELECT key_py FROM pyt_pickled.py_pickled__pair_count "
                         "WITH ('pickled' = 'true', 'key_groups' = '5')").collect()
        assert sorted(json.loads(r[0])[1] for r in rows) == [0]
        with pytest.raises(PySparkException, match="attach --pickled"):
            spark.sql("SELECT * FROM pyt_pickled.py_typed__count "
                      "WITH ('pickled' = 'true')").collect()
    finally:
        spark.sql("DROP DATABASE pyt_pickled CASCADE")


def test_classpath_option(spark) -> None:  # type: ignore[no-untyped-def]
    """The option ``classpath`` (issue 32): a DataFrame read of a Kryo state gets the value
    struct the job's classes give; ``attach(classpath=...)`` stores it in every table."""
    from statequery.spark.catalog import attach_plans
    from tests.conftest import FIXTURES, fixture_dir

    name = "types-kryo-rocksdb-native"
    path, jar = str(fixture_dir(name)), str(FIXTURES / name / "job.jar")
    # (key k4: k0's Instant has nanoseconds, which Spark's microsecond TIMESTAMP cannot hold
    # and refuses, as for any value of nanosecond precision)
    df = (spark.read.format("statequery").option("operator", "kryo-types")
          .option("state", "order").option("classpath", jar).option("key", "k4").load(path))
    assert df.columns == ["key_group", "key", "namespace", "value", "value_reason", "value_raw"]
    [row] = df.collect()
    assert row["value"]["customer"] == "non-BMP \U0001f600 smile"
    shape = row["value"]["shape"]
    assert shape["Rect"]["height"] == 25000 and shape["Circle"] is None
    assert row["value_raw"] is None and row["value_reason"] is None
    raw = (spark.read.format("statequery").option("operator", "kryo-types")
           .option("state", "order").load(path))
    assert dict(raw.dtypes)["value"] == "binary"
    [plan] = attach_plans(path, "kryo_types", classpath=[jar])
    assert all(f"classpath '{jar}'" in s for s in plan.create_tables())


def test_protobuf_descriptors_option(spark) -> None:  # type: ignore[no-untyped-def]
    """The option ``protobuf_descriptors`` (issue 32): a DataFrame read of a state of Protobuf
    messages (Kryo, chill-protobuf's form) gets the message's struct."""
    from tests.conftest import FIXTURES, fixture_dir

    name = "types-protobuf-rocksdb-native"
    path, desc = str(fixture_dir(name)), str(FIXTURES / name / "descriptors.pb")
    df = (spark.read.format("statequery").option("operator", "proto-types")
          .option("state", "reading").option("protobuf_descriptors", desc).option("key", "k4")
          .load(path))
    assert df.columns == ["key_group", "key", "namespace", "value", "value_reason", "value_raw"]
    [row] = df.collect()
    assert row["value"]["name"] == "" and row["value"]["point"]["label"] == "p4"
    assert dict(row["value"]["counts"])[""] == -(2**31)
    assert row["value_raw"] is None and row["value_reason"] is None
