"""The shipped catalog in a local Spark session: one temporary view per state.

    python examples/spark_example.py
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from statequery.spark import register_views

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
spark = SparkSession.builder.master("local[2]").getOrCreate()
views = register_views(spark)
print(f"{len(views)} views, e.g. {views[:3]}")

spark.sql(
    "SELECT state_name, kind, key_type, value_type FROM user_activity__state_meta"
).show(truncate=False)
spark.sql(
    "SELECT key, value.tier, value.totalAmount FROM user_activity__user_state__profile "
    "ORDER BY value.totalAmount DESC LIMIT 5"
).show()
spark.sql(
    "SELECT key.f0 AS word, value.f0 AS count, value.f4 AS max_id "
    "FROM word_counts__groupaggregate_7__accstate ORDER BY word"
).show()
# one key: the `key` option plans only the key group that can hold it (one partition)
one = (
    spark.read.format("statequery").option("database", "user_activity")
    .option("table", "user_state__profile").option("key", "user-3").load()
)
print(f"user-3 reads {one.rdd.getNumPartitions()} partition(s)")
one.select("key", "value.tier", "value.totalAmount").show()
spark.stop()
