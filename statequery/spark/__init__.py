"""The PySpark data source ``statequery`` (Spark 4.1+ Python Data Source API).

This is a thin facade over the Spark-free core: the schema comes from metadata only, partitions
are the scan planner's picklable tasks (:func:`statequery.scan.plan`: key-group ranges of one
handle, or one operator-state stream), and ``read()`` streams the Arrow record batches of
:func:`statequery.scan.execute` (one open per file per task). Spark finds it statically
through the top-level module ``pyspark_statequery`` (``USING statequery`` /
``spark.read.format("statequery")``).

Options (case-insensitive):

==============================  ===================================================================
``path``                        savepoint/checkpoint directory, its ``_metadata``, or an fsspec URI
``catalog``, ``database``       instead of ``path``: a catalog folder and a database in it
``table``                       a table of that database (``state_meta`` or a ``table_name`` from
                                ``state_meta``); instead of ``operator`` + ``state``
``operator``                    operator uid, name or id (``operator.uid`` / ``operator.uid.hash``)
``state``                       state name (omit both for the ``state_meta`` table)
``mode``                        ``rows`` (default), ``flat`` (list: one row per element) or
                                ``nested`` (map: one map per key)
``key``                         read only this key (a string, or JSON for structured keys)
``key_groups``                  read only these key groups: ``5``, ``1,4``, ``0-15`` (inclusive)
``key_groups_per_partition``    key groups in one Spark partition (default: one subtask's range)
``batch_size``                  rows per Arrow batch (default 65536)
``pushdown``                    ``auto``/``false`` (accepted, no effect); ``true`` is refused
==============================  ===================================================================

Key pruning comes only from the options of a read (``key``, ``key_groups``), never from the
query's filters: Spark 4.1-4.3 keep the reader planned for one query's pushed filters and reuse it
for later queries over the same relation (a DataFrame, a temporary view), which would return the
filtered rows for an unfiltered query. So the data source implements no ``pushFilters``: a
``WHERE key = ...`` is evaluated by Spark over every key group, and is always right. A pruned read
prints one line on the planning worker's standard error, and plans one partition per subtask
handle holding the wanted key groups.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from statequery.exceptions import InvalidOptionError, require_extra

require_extra("pyspark", "spark", "the Spark data source")

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition  # noqa: E402
from pyspark.sql.types import StructType  # noqa: E402

if TYPE_CHECKING:
    from statequery.savepoint import Savepoint

__all__ = [
    "ReadOptions",
    "StatequeryDataSource",
    "register_views",
    "spark_arrow_schema",
    "view_statements",
]


#: properties Spark adds to the options of a persistent table (TableCatalog's reserved names)
_TABLE_PROPERTIES = frozenset(
    {"location", "provider", "owner", "comment", "external", "is_managed_location", "collation"}
)


@dataclass(frozen=True)
class ReadOptions:
    """The data source options, parsed once; unknown keys are rejected, naming the valid ones."""

    path: str | None = None
    catalog: str | None = None
    database: str | None = None
    table: str | None = None
    operator: str | None = None
    state: str | None = None
    mode: str | None = None
    key: str | None = None
    key_groups: str | None = None
    key_groups_per_partition: int | None = None
    batch_size: int = 65536
    pushdown: str = "auto"

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        if not options:
            raise InvalidOptionError(
                "statequery got no options. Spark (4.x) gives Python data sources no options "
                "when a persistent table (CREATE TABLE ... USING statequery) is queried: use "
                "CREATE TEMPORARY VIEW name USING statequery OPTIONS (path '...', table '...') "
                "instead (`statequery spark-views` prints them for a whole catalog)"
            )
        valid = {f.name for f in fields(cls)}
        aliases = {"operator.uid": "operator", "operator.uid.hash": "operator",
                   "state.path": "path", "state.name": "state"}
        values: dict[str, Any] = {}
        for raw_key, value in options.items():
            key = raw_key.lower()
            if key.startswith("option."):  # a persistent table's stored options
                key = key[len("option."):]
            elif key in _TABLE_PROPERTIES:  # Spark's reserved table properties, not ours
                continue
            key = aliases.get(key, key)
            if key not in valid:
                raise InvalidOptionError(
                    f"unknown statequery option {raw_key!r}; valid options: "
                    + ", ".join(sorted(valid | set(aliases)))
                )
            values[key] = value
        for int_key in ("key_groups_per_partition", "batch_size"):
            if int_key in values:
                try:
                    values[int_key] = int(values[int_key])
                except ValueError:
                    raise InvalidOptionError(
                        f"option {int_key} must be an integer, got {values[int_key]!r}"
                    ) from None
                if values[int_key] <= 0:
                    raise InvalidOptionError(f"option {int_key} must be positive")
        pushdown = values.get("pushdown", "auto").lower()
        if pushdown == "true":
            raise InvalidOptionError(
                "option pushdown=true is refused: Spark 4.1-4.3 reuse a reader planned for one "
                "query's pushed filters in later queries over the same DataFrame or view, which "
                "returns wrong rows. Use the option 'key' (or 'key_groups') to read one key"
            )
        if pushdown not in ("auto", "false"):
            raise InvalidOptionError(
                f"option pushdown must be auto or false, got {values['pushdown']!r}"
            )
        if "key_groups" in values:
            parse_key_group_list(values["key_groups"])  # refuse a bad list when the read is set up
        opts = cls(**values)
        if opts.path is None and (opts.catalog is None or opts.database is None):
            from statequery.catalog import DEFAULT_CATALOG

            if opts.database is None:
                raise InvalidOptionError(
                    "statequery needs option 'path' (a savepoint) or 'database' "
                    "(with optional 'catalog' folder)"
                )
            opts = replace(opts, catalog=opts.catalog or DEFAULT_CATALOG)
        if (opts.operator is None) != (opts.state is None) and opts.table is None:
            raise InvalidOptionError("options 'operator' and 'state' go together")
        return opts

    @property
    def is_state_meta(self) -> bool:
        if self.table is not None:
            return self.table.lower() == "state_meta"
        return self.state is None


_OPEN: dict[tuple[str, ...], Savepoint] = {}


def _open(opts: ReadOptions) -> tuple[Savepoint, str | None, str | None]:
    """The savepoint and the (operator, state) the options name (cached per worker process)."""
    import statequery
    from statequery.catalog import Catalog

    operator, state = opts.operator, opts.state
    if opts.path is not None:
        cache_key: tuple[str, ...] = ("path", opts.path)
        if cache_key not in _OPEN:
            _OPEN[cache_key] = statequery.open(opts.path)
        sp = _OPEN[cache_key]
    else:
        assert opts.catalog is not None and opts.database is not None
        cache_key = ("catalog", opts.catalog, opts.database)
        if cache_key not in _OPEN:
            _OPEN[cache_key] = Catalog(opts.catalog).savepoint(opts.database)
        sp = _OPEN[cache_key]
    if opts.table is not None and not opts.is_state_meta:
        row = _resolve_table(sp, opts.table)
        operator, state = row["operator_id"], row["state_name"]
    return sp, operator, state


def _resolve_table(sp: Savepoint, table: str) -> dict[str, Any]:
    info = sp.table(table)  # the one table resolution (statequery.savepoint)
    return {"operator_id": info.operator_id, "state_name": info.name}


# -- Arrow types Spark accepts --------------------------------------------------------------------


def _spark_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz=t.tz)
    if pa.types.is_time(t):
        return pa.int64()  # milliseconds of the day; Spark has no TIME type for data sources
    if pa.types.is_null(t):
        return pa.string()  # always null (VoidNamespace)
    if pa.types.is_dictionary(t):
        return _spark_type(t.value_type)
    if pa.types.is_uint8(t) or pa.types.is_uint16(t):
        return pa.int32()
    if pa.types.is_uint32(t) or pa.types.is_uint64(t):
        return pa.int64()
    if pa.types.is_decimal256(t):
        return pa.string()  # wider than Spark's DECIMAL(38)
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _spark_type(f.type), f.nullable) for f in t])
    if pa.types.is_map(t):
        return pa.map_(_spark_type(t.key_type), _spark_type(t.item_type))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_spark_type(t.value_type))
    return t


def spark_arrow_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the types Spark cannot take replaced by the nearest ones it can."""
    return pa.schema([pa.field(f.name, _spark_type(f.type), True) for f in schema])


def _to_spark_struct(schema: pa.Schema) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def _cast(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    if batch.schema.equals(schema):
        return batch
    columns = [col.cast(field.type) for col, field in zip(batch.columns, schema, strict=True)]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


# -- the data source ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskPartition(InputPartition):
    """One :class:`~statequery.scan.ScanTask` (None: the ``state_meta`` table, or nothing to
    read when a pruned read plans no task)."""

    task: Any = None


class StatequeryDataSource(DataSource):
    """``spark.read.format("statequery")``: state_meta or one state of a savepoint as a table."""

    @classmethod
    def name(cls) -> str:
        return "statequery"

    def __init__(self, options: MutableMapping[str, str]) -> None:
        super().__init__(options)
        self.opts = ReadOptions.parse(dict(options))

    def _arrow_schema(self) -> pa.Schema:
        sp, operator, state = _open(self.opts)
        if self.opts.is_state_meta:
            return spark_arrow_schema(sp.state_meta().schema)
        from statequery.reader import schema_of

        assert operator is not None and state is not None  # ReadOptions.parse ensures both
        return spark_arrow_schema(schema_of(sp, operator, state, self.opts.mode))

    def schema(self) -> StructType:
        return _to_spark_struct(self._arrow_schema())

    def reader(self, schema: StructType) -> DataSourceReader:
        return StatequeryReader(self.opts, self._arrow_schema())


class StatequeryReader(DataSourceReader):
    """Reads key-group ranges; the options ``key`` and ``key_groups`` restrict them.

    Everything the reader reads is decided by the options when it is created, never by a query,
    so the reader Spark caches for a relation is right for every query over it.
    """

    def __init__(self, opts: ReadOptions, arrow_schema: pa.Schema) -> None:
        self.opts = opts
        self.arrow_schema = arrow_schema
        self.keys: list[Any] | None = None
        self.key_groups: set[int] | None = None
        if not opts.is_state_meta and opts.key is not None:
            from statequery.keys import parse_key_text

            sp, operator, state = _open(opts)
            assert operator is not None and state is not None
            self.keys = [parse_key_text(opts.key, sp.state(operator, state).key_spec)]
        if opts.key_groups is not None:
            self.key_groups = parse_key_group_list(opts.key_groups)

    def partitions(self) -> Sequence[InputPartition]:
        if self.opts.is_state_meta:
            return [TaskPartition(None)]
        sp, operator, state = _open(self.opts)
        assert operator is not None and state is not None
        tasks = sp.plan(
            operator, state, keys=self.keys, key_groups=self.key_groups, mode=self.opts.mode,
            split=self.opts.key_groups_per_partition,
        )
        if self.keys is not None or self.key_groups is not None:
            _report_pruning(sp, operator, state, self.opts, tasks)
        return [TaskPartition(t) for t in tasks] or [TaskPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TaskPartition)  # what partitions() returns
        if self.opts.is_state_meta:
            sp, _, _ = _open(self.opts)
            for batch in sp.state_meta().to_batches():
                yield _cast(batch, self.arrow_schema)
            return
        if partition.task is None:
            return
        from statequery.io import FileIO
        from statequery.scan import execute

        io = FileIO()  # this task's own storage: its files opened once, closed at the end
        try:
            for _, batch in execute(partition.task, io, batch_size=self.opts.batch_size):
                if batch.num_rows:
                    yield _cast(batch, self.arrow_schema)
        finally:
            io.close()


def parse_key_group_list(text: str) -> set[int]:
    """The key groups of the option ``key_groups``: ``5``, ``1,4``, ``0-15`` or a mix."""
    out: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            start = int(lo)
            end = int(hi) if sep else start
        except ValueError:
            raise InvalidOptionError(
                f"option key_groups must list key groups like 5, 1,4 or 0-15, got {text!r}"
            ) from None
        if start < 0 or end < start:
            raise InvalidOptionError(f"option key_groups: bad range {part.strip()!r} in {text!r}")
        out.update(range(start, end + 1))
    return out


def _report_pruning(
    sp: Savepoint, operator: str | None, state: str | None, opts: ReadOptions,
    tasks: Sequence[Any],
) -> None:
    """One line on the planning worker's stderr: what a pruned read plans to read."""
    assert operator is not None and state is not None
    info = sp.state(operator, state)
    ranges = _ranges(
        kg
        for t in tasks
        for kg in (t.key_groups if t.key_groups is not None else _handle_key_groups(t))
    )
    groups = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges) or "none"
    why = f"key {opts.key!r}" if opts.key is not None else f"key_groups {opts.key_groups!r}"
    print(
        f"statequery: {info.table_name or info.operator_uid + '/' + info.name}: {why} -> "
        f"key group(s) {groups} of {info.max_parallelism}, {len(tasks)} partition(s)",
        file=sys.stderr, flush=True,
    )


def view_statements(catalog: str | None = None, databases: Sequence[str] = ()) -> list[str]:
    """``CREATE TEMPORARY VIEW`` statements exposing a catalog's savepoints to Spark SQL.

    Each table of each database becomes the view ``<database>__<table>`` (Spark's temporary views
    cannot live in a database). Run them with ``spark-sql -i views.sql`` or ``spark.sql(...)``.
    """
    from statequery.catalog import DEFAULT_CATALOG, Catalog, sql_identifier

    cat = Catalog(catalog or DEFAULT_CATALOG)
    out = []
    for db in databases or cat.databases():
        location = cat.location(db).replace("'", "\\'")
        for table in cat.tables(db):
            view = f"{sql_identifier(db)}__{table}"
            out.append(
                f"CREATE OR REPLACE TEMPORARY VIEW {view} USING statequery "
                f"OPTIONS (path '{location}', table '{table}');"
            )
    return out


def register_views(
    spark: Any, catalog: str | None = None, databases: Sequence[str] = ()
) -> list[str]:
    """Run :func:`view_statements` in ``spark``; returns the view names."""
    names = []
    for statement in view_statements(catalog, databases):
        spark.sql(statement.rstrip(";"))
        names.append(statement.split()[5])
    return names


def _handle_key_groups(task: Any) -> range:
    r = task.handle.key_group_range
    return range(r.start, r.end + 1)


def _ranges(key_groups: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted key groups as inclusive ``(start, end)`` runs."""
    out: list[tuple[int, int]] = []
    for kg in sorted(set(key_groups)):
        if out and out[-1][1] == kg - 1:
            out[-1] = (out[-1][0], kg)
        else:
            out.append((kg, kg))
    return out
