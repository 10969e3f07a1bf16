"""The Spark ``key`` option goes through the shared key conversion (statequery.keys)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

WORD_COUNTS = str(Path(__file__).resolve().parents[2] / "catalog" / "word_counts")


@pytest.fixture(scope="module")
def spark():  # type: ignore[no-untyped-def]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[1]")
        .appName("statequery-key-option")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .getOrCreate()
    )
    yield session
    session.stop()


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
