"""The PySpark data source ``statequery`` (Spark 4.1+ Python Data Source API).

A thin facade over the Spark-free core: the schema comes from metadata only, partitions are the
scan planner's picklable tasks (:func:`statequery.scan.plan`), and a reader streams the Arrow
record batches of :func:`statequery.scan.execute`. Spark finds it statically through the
top-level module ``pyspark_statequery`` (``USING statequery`` / ``format("statequery")``).

The package: :mod:`~statequery.spark.source` (the data source), :mod:`~statequery.spark.reader`
(its readers and partitions), :mod:`~statequery.spark.options` (the options, documented there),
:mod:`~statequery.spark.resolve` (the savepoint the options name), :mod:`~statequery.spark.
arrowtypes` (Arrow types Spark accepts), :mod:`~statequery.spark.views` (temporary views);
beside them the JVM bridge (``jvm``, ``jvmworker``), ``catalog``, ``session``, ``server`` and
the ranged data sources (``ranged``, ``diff``, ``stats``).
"""

from __future__ import annotations

from statequery.exceptions import require_extra

require_extra("pyspark", "spark", "the Spark data source")

from statequery.spark.arrowtypes import spark_arrow_schema  # noqa: E402
from statequery.spark.options import (  # noqa: E402
    CHANGES_SUFFIX,
    OPTIONS_METADATA_KEY,
    PER_QUERY_OPTIONS,
    ReadOptions,
    options_from_schema,
    parse_key_group_list,
)
from statequery.spark.reader import (  # noqa: E402
    ChangesPartition,
    ChangesReader,
    StatequeryReader,
    TaskPartition,
)
from statequery.spark.source import StatequeryDataSource  # noqa: E402
from statequery.spark.views import register_views, view_statements  # noqa: E402

__all__ = [
    "CHANGES_SUFFIX",
    "OPTIONS_METADATA_KEY",
    "PER_QUERY_OPTIONS",
    "ChangesPartition",
    "ChangesReader",
    "ReadOptions",
    "StatequeryDataSource",
    "StatequeryReader",
    "TaskPartition",
    "options_from_schema",
    "parse_key_group_list",
    "register_views",
    "spark_arrow_schema",
    "view_statements",
]
