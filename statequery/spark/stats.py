"""The ``state_stats`` table in Spark: the data source ``statequery_stats``, computed in parallel.

One partition per key-group range of each operator with keyed state (``range_size`` key groups
within one subtask's range) and one for operator state; each partition decodes its range once for
all the operator's keyed states (:func:`statequery.stats.state_stats`). Columns:
:data:`statequery.stats.STATE_STATS_SCHEMA`.

>>> from statequery.spark.stats import stats_dataframe
>>> stats_dataframe(spark, "s3://b/savepoint-1").groupBy("state").sum("bytes").show()

or, once registered (``register_stats_source(spark)``)::

    CREATE TEMPORARY VIEW st USING statequery_stats OPTIONS (path 's3://b/savepoint-1');

Options: ``path`` (required), ``operator``, ``state``, ``range_size`` (default 32).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from statequery.spark.ranged import RangedDataSource, RangePartition, parse_options
from statequery.stats import DEFAULT_RANGE_SIZE, STATE_STATS_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["StatsDataSource", "register_stats_source", "stats_dataframe"]

OPTIONS = ("path", "operator", "state", "range_size")


@dataclass(frozen=True)
class StatsOptions:
    path: str
    operator: str | None = None
    state: str | None = None
    range_size: int = DEFAULT_RANGE_SIZE

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StatsOptions:
        opts = parse_options("statequery_stats", options, OPTIONS, ("path",), DEFAULT_RANGE_SIZE)
        return cls(opts["path"], opts.get("operator"), opts.get("state"), opts["range_size"])


class StatsDataSource(RangedDataSource):
    """``spark.read.format("statequery_stats")``: the state_stats table of a savepoint.
    Partitions: ``""`` for operator state, else a JSON ``[operator id, [key groups]]``."""

    NAME = "statequery_stats"
    SCHEMA = STATE_STATS_SCHEMA

    def parse_options(self, options: dict[str, str]) -> StatsOptions:
        return StatsOptions.parse(options)

    def make_reader(self, opts: StatsOptions) -> DataSourceReader:
        return StatsReader(opts)


class StatsReader(DataSourceReader):
    def __init__(self, opts: StatsOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        import statequery
        from statequery.stats import key_group_tasks

        sp = statequery.open(self.opts.path)
        tasks = key_group_tasks(sp, self.opts.operator, self.opts.state, self.opts.range_size)
        return [RangePartition("")] + [RangePartition(json.dumps(t)) for t in tasks]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        import statequery
        from statequery.stats import state_stats

        assert isinstance(partition, RangePartition)
        sp = statequery.open(self.opts.path)
        o = self.opts
        if not partition.task:
            stats = state_stats(sp, o.operator, o.state, top=0, key_groups=[])
        else:
            op_id, kgs = json.loads(partition.task)
            stats = state_stats(sp, op_id, o.state, o.range_size, top=0, key_groups=kgs,
                                operator_state=False)
        for batch in stats.table.to_batches():
            if batch.num_rows:
                yield batch


def register_stats_source(spark: SparkSession) -> None:
    """Make ``statequery_stats`` known to this session (``USING statequery_stats``)."""
    StatsDataSource.register(spark)


def stats_dataframe(
    spark: SparkSession,
    path: str,
    operator: str | None = None,
    state: str | None = None,
    range_size: int = DEFAULT_RANGE_SIZE,
) -> DataFrame:
    """The state_stats table of ``path`` as a DataFrame, computed in parallel by key-group
    range."""
    register_stats_source(spark)
    reader = spark.read.format("statequery_stats").option("path", path)
    for name, value in (("operator", operator), ("state", state)):
        if value is not None:
            reader = reader.option(name, value)
    return reader.option("range_size", str(range_size)).load()
