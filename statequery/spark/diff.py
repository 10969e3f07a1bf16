"""``statequery diff`` as a Spark table: the data source ``statequery_diff`` and
:func:`diff_dataframe`.

The diff is split into partitions like a read: one per key-group range (cut at the subtask
ranges of both sides, ``range_size`` key groups at most) and one for operator state and the
schema rows; each partition opens both savepoints on its worker and compares its range
(:func:`statequery.diff.diff_batches`). Columns: :data:`statequery.diff.DIFF_SCHEMA`.

>>> from statequery.spark.diff import diff_dataframe
>>> diff_dataframe(spark, "s3://b/chk-41", "s3://b/chk-42", operator="user-state").show()

or, once registered (``register_diff_source(spark)``), in SQL::

    CREATE TEMPORARY VIEW changes USING statequery_diff
      OPTIONS (old 's3://b/chk-41', new 's3://b/chk-42', operator 'user-state');

Options: ``old``, ``new`` (required), ``operator``, ``state``, ``key`` (text, parsed by the key
serializer), ``range_size`` (key groups per partition, default 32).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from statequery.diff import DEFAULT_RANGE_SIZE, DIFF_SCHEMA
from statequery.exceptions import InvalidOptionError
from statequery.spark.ranged import RangedDataSource, RangePartition, parse_options

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from statequery.savepoint import Savepoint

__all__ = ["DiffDataSource", "diff_dataframe", "diff_tasks", "register_diff_source"]

OPTIONS = ("old", "new", "operator", "state", "key", "range_size")


def diff_tasks(
    old: Savepoint, new: Savepoint, operator: str | None = None, state: str | None = None,
    range_size: int = DEFAULT_RANGE_SIZE,
) -> list[str]:
    """The partitions of a distributed diff: ``""`` (operator state and schema rows), JSON lists
    of key groups, or ``["*"]`` when the sides' key groups differ (everything in one)."""
    from statequery.diff import key_group_ranges, state_pairs

    ranges = key_group_ranges(old, new, state_pairs(old, new, operator, state), range_size)
    if ranges is None:
        return ["*"]
    return [""] + [json.dumps(r) for r in ranges]


@dataclass(frozen=True)
class DiffOptions:
    old: str
    new: str
    operator: str | None = None
    state: str | None = None
    key: str | None = None
    range_size: int = DEFAULT_RANGE_SIZE

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> DiffOptions:
        opts = parse_options("statequery_diff", options, OPTIONS, ("old", "new"),
                             DEFAULT_RANGE_SIZE, ignored=("path",))
        return cls(opts["old"], opts["new"], opts.get("operator"), opts.get("state"),
                   opts.get("key"), opts["range_size"])

    def open(self) -> tuple[Savepoint, Savepoint, Any]:
        import statequery

        old, new = statequery.open(self.old), statequery.open(self.new)
        key = None
        if self.key is not None:
            from statequery.keys import parse_key_text

            ops = [new.operator(self.operator)] if self.operator else list(new.operators)
            spec = next((o.key_spec for o in ops if o.key_spec is not None), None)
            if spec is None:
                raise InvalidOptionError("key: no keyed state to compare")
            key = parse_key_text(self.key, spec)
        return old, new, key


class DiffDataSource(RangedDataSource):
    """``spark.read.format("statequery_diff")``: what changed between two snapshots."""

    NAME = "statequery_diff"
    SCHEMA = DIFF_SCHEMA

    def parse_options(self, options: dict[str, str]) -> DiffOptions:
        return DiffOptions.parse(options)

    def make_reader(self, opts: DiffOptions) -> DataSourceReader:
        return DiffReader(opts)


class DiffReader(DataSourceReader):
    def __init__(self, opts: DiffOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        old, new, _ = self.opts.open()
        o = self.opts
        return [RangePartition(t) for t in diff_tasks(old, new, o.operator, o.state, o.range_size)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from statequery.diff import diff_batches

        assert isinstance(partition, RangePartition)
        old, new, key = self.opts.open()
        o = self.opts
        task = partition.task
        if task == "*":
            batches = diff_batches(old, new, o.operator, o.state, key, o.range_size)
        elif not task:
            batches = diff_batches(old, new, o.operator, o.state, key, key_groups=[])
        else:
            batches = diff_batches(old, new, o.operator, o.state, key, o.range_size,
                                   key_groups=json.loads(task), operator_state=False)
        for batch in batches:
            if batch.num_rows:
                yield batch


def register_diff_source(spark: SparkSession) -> None:
    """Make ``statequery_diff`` known to this session (``USING statequery_diff``)."""
    DiffDataSource.register(spark)


def diff_dataframe(
    spark: SparkSession,
    old: str,
    new: str,
    operator: str | None = None,
    state: str | None = None,
    key: str | None = None,
    range_size: int = DEFAULT_RANGE_SIZE,
) -> DataFrame:
    """What changed from ``old`` to ``new`` (paths or URIs) as a DataFrame, computed in
    parallel by key-group range. ``key`` is the key as text (as in the CLI)."""
    register_diff_source(spark)
    reader = spark.read.format("statequery_diff").option("old", old).option("new", new)
    for name, value in (("operator", operator), ("state", state), ("key", key)):
        if value is not None:
            reader = reader.option(name, value)
    return reader.option("range_size", str(range_size)).load()
