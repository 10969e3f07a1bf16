"""What the data sources computed by key-group range share (``statequery_diff``,
``statequery_stats``): option parsing, a partition carrying its range as text, and a DataSource
whose schema is a fixed Arrow schema."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from statequery.exceptions import InvalidOptionError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

__all__ = ["RangePartition", "RangedDataSource", "parse_options"]


def parse_options(
    source: str,
    options: Mapping[str, str],
    valid: Sequence[str],
    required: Sequence[str],
    default_range_size: int,
    ignored: Sequence[str] = (),
) -> dict[str, Any]:
    """``options`` lower-cased and checked: no unknown name, the ``required`` ones present, and
    ``range_size`` (key groups per partition) a positive integer (default
    ``default_range_size``)."""
    opts: dict[str, Any] = {k.lower(): v for k, v in options.items() if k.lower() not in ignored}
    unknown = sorted(set(opts) - set(valid))
    if unknown:
        raise InvalidOptionError(
            f"unknown {source} option(s) {', '.join(unknown)}; valid: {', '.join(valid)}"
        )
    missing = [name for name in required if not opts.get(name)]
    if missing:
        raise InvalidOptionError(f"{source} needs the option(s) {' and '.join(missing)}")
    try:
        size = int(opts.get("range_size", default_range_size))
    except ValueError:
        raise InvalidOptionError(f"range_size must be an integer: {opts['range_size']!r}") from None
    if size <= 0:
        raise InvalidOptionError(f"range_size must be positive, got {size}")
    opts["range_size"] = size
    return opts


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One partition: its key-group range (or other unit of work) as text, see each source."""

    task: str


class RangedDataSource(DataSource):
    """A data source with a fixed Arrow ``SCHEMA``; subclasses set ``NAME``, ``SCHEMA`` and
    ``parse_options`` (the source's options from Spark's) and implement ``make_reader``."""

    NAME: ClassVar[str]
    SCHEMA: ClassVar[pa.Schema]

    @classmethod
    def name(cls) -> str:
        return cls.NAME

    @classmethod
    def register(cls, spark: SparkSession) -> None:
        """Make the source known to ``spark`` (``USING <name>``)."""
        spark.dataSource.register(cls)

    def __init__(self, options: MutableMapping[str, str]) -> None:
        super().__init__(options)
        self.opts = self.parse_options(dict(options))

    def parse_options(self, options: dict[str, str]) -> Any:
        raise NotImplementedError

    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(self.SCHEMA)

    def reader(self, schema: StructType) -> DataSourceReader:
        return self.make_reader(self.opts)

    def make_reader(self, opts: Any) -> DataSourceReader:
        raise NotImplementedError
