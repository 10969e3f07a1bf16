"""The PySpark data source ``statequery`` (Spark 4.1+ Python Data Source API).

This is a thin facade over the Spark-free core: the schema comes from metadata only, partitions
are the scan planner's picklable tasks (:func:`statequery.scan.plan`: key-group ranges of one
handle, or one operator-state stream), and ``read()`` streams the Arrow record batches of
:func:`statequery.scan.execute` (one open per file per task). An operator table
(:mod:`statequery.optable`: every keyed state of an operator, one row per entry) is read in one
pass: each partition walks its key groups once for all the states. Spark finds it statically
through the top-level module ``pyspark_statequery`` (``USING statequery`` /
``spark.read.format("statequery")``).

Options (case-insensitive):

==============================  ===================================================================
``path``                        savepoint/checkpoint directory, its ``_metadata``, or an fsspec URI
``catalog``, ``database``       instead of ``path``: a catalog folder and a database in it
``table``                       a table of that database (``state_meta``, a ``table_name`` from
                                ``state_meta``, or an operator table); instead of ``operator``
``operator``                    operator uid, name or id (``operator.uid`` / ``operator.uid.hash``)
``state``                       state name (omit both for the ``state_meta`` table; omit only
                                ``state`` for the operator table)
``states``                      the operator table over only these states (comma-separated names)
``mode``                        ``rows`` (default), ``flat`` (list: one row per element) or
                                ``nested`` (map: one map per key)
``key``                         read only this key (a string, or JSON for structured keys)
``key_groups``                  read only these key groups: ``5``, ``1,4``, ``0-15`` (inclusive)
``key_groups_per_partition``    key groups in one Spark partition (default: one subtask's range)
``batch_size``                  rows per Arrow batch (default 65536)
``pushdown``                    ``auto``/``false`` (accepted, no effect); ``true`` is refused
``fingerprint``                 the SHA-256 of the ``_metadata`` the read must find (set by
                                ``attach`` and by ``CREATE TABLE ... USING statequery``)
``pickled``                     ``true``: a state table gets ``key_py``, ``user_key_py``,
                                ``value_py`` (and ``*_py_reason``) after its bytes columns,
                                PyFlink's pickles as JSON text (:mod:`statequery.pickled`)
``classpath``                   the job's jars (comma-separated paths every worker can read):
                                Kryo values decoded with their classes (docs/decoding.md)
``protobuf_descriptors``        a Protobuf descriptor set every worker can read: Protobuf
                                messages kept through Kryo decoded as structs (docs/decoding.md)
``version``                     ``path`` (or the database) is a job's checkpoint directory: read
                                the version with this checkpoint id (docs/history.md)
``changes``                     ``true``: the job's change feed (``Job.changes``) instead of a
                                state; ``operator``/``state`` (or ``table`` ``<state>__changes``)
                                narrow it, ``start``/``end`` bound its checkpoint ids
``cdc``                         ``true``: the change feed in Spark's change-data-capture layout
                                (``_change_type``, ``_commit_version``, ``_commit_timestamp``;
                                what ``CHANGES FROM VERSION`` reads, :mod:`statequery.spark.cdc`)
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

import json
import sys
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from statequery.exceptions import InvalidOptionError, SavepointChangedError, require_extra

require_extra("pyspark", "spark", "the Spark data source")

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition  # noqa: E402
from pyspark.sql.types import StructField, StructType  # noqa: E402

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
    states: str | None = None
    mode: str | None = None
    key: str | None = None
    key_groups: str | None = None
    key_groups_per_partition: int | None = None
    batch_size: int = 65536
    pushdown: str = "auto"
    fingerprint: str | None = None
    pickled: bool = False
    classpath: str | None = None
    protobuf_descriptors: str | None = None
    version: int | None = None
    changes: bool = False
    start: int | None = None
    end: int | None = None
    cdc: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        """The options of one read, complete: where (``path`` or ``database``) and what."""
        if not options:
            raise InvalidOptionError(
                "statequery got no options: give 'path' (or 'database') and 'table'. Spark (4.x) "
                "gives a Python data source no options when it reads a persistent table, so "
                "statequery keeps them in the table's schema: create tables with "
                "CREATE TABLE name USING statequery OPTIONS (path '...', table '...') or "
                "`statequery attach`, never with a column list of your own"
            )
        return cls.from_values(cls.parse_values(options))

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> ReadOptions:
        """The options of :meth:`parse_values`, checked as a whole."""
        opts = cls(**values)
        if opts.protobuf_descriptors:  # carried by the classpath (statequery.arrow.kryo)
            from statequery.arrow.kryo import with_protobuf

            entries = with_protobuf((), opts.protobuf_descriptors)
            opts = replace(opts, classpath=",".join(filter(None, (opts.classpath, *entries))),
                           protobuf_descriptors=None)
        if opts.path is None and (opts.catalog is None or opts.database is None):
            from statequery.catalog import DEFAULT_CATALOG

            if opts.database is None:
                raise InvalidOptionError(
                    "statequery needs option 'path' (a savepoint) or 'database' "
                    "(with optional 'catalog' folder)"
                )
            opts = replace(opts, catalog=opts.catalog or DEFAULT_CATALOG)
        if opts.table is not None and opts.table.lower().endswith(CHANGES_SUFFIX):
            if opts.version is not None:
                raise InvalidOptionError(
                    f"table {opts.table!r} is a change feed: it has no option 'version'"
                )
            opts = replace(opts, table=opts.table[: -len(CHANGES_SUFFIX)], changes=True)
        if opts.changes and opts.version is not None:
            raise InvalidOptionError(
                "option 'version' reads one version; the change feed (changes=true) takes "
                "'start' and 'end' (checkpoint ids)"
            )
        if not opts.changes and (opts.start is not None or opts.end is not None):
            raise InvalidOptionError("options 'start' and 'end' need changes=true")
        if opts.cdc and not opts.changes:
            raise InvalidOptionError("option cdc=true is a layout of the change feed: it needs "
                                     "changes=true (or table '<state>__changes')")
        if opts.start is not None and opts.end is not None and opts.start > opts.end:
            raise InvalidOptionError(f"option start ({opts.start}) is after end ({opts.end})")
        if opts.changes and (opts.states is not None or opts.mode is not None
                             or opts.pickled or opts.key_groups is not None):
            raise InvalidOptionError(
                "the change feed (changes=true) takes the options path (or database), operator, "
                "state (or table '<state>__changes'), start, end, key and classpath"
            )
        if opts.state is not None and opts.operator is None and opts.table is None:
            raise InvalidOptionError("option 'state' needs 'operator'")
        if opts.states is not None and opts.state is not None:
            raise InvalidOptionError(
                "option 'states' names the states of an operator table: give 'state' or "
                "'states', not both"
            )
        if opts.is_state_meta and (opts.key is not None or opts.key_groups is not None):
            raise InvalidOptionError(
                "the state_meta table has no keys: the options key and key_groups apply to "
                "state tables and operator tables"
            )
        return opts

    @classmethod
    def parse_values(cls, options: Mapping[str, str]) -> dict[str, Any]:
        """The options checked one by one (names, integers, lists), maybe incomplete."""
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
        for int_key in ("version", "start", "end"):
            if int_key in values:
                try:
                    values[int_key] = int(values[int_key])
                except ValueError:
                    raise InvalidOptionError(
                        f"option {int_key} must be a checkpoint id (an integer), got "
                        f"{values[int_key]!r}"
                    ) from None
        for flag in ("changes", "cdc"):
            if flag in values:
                values[flag] = _flag(flag, values[flag])
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
        if "pickled" in values:
            values["pickled"] = _flag("pickled", values["pickled"])
        return values

    def to_json(self) -> str:
        """The options that differ from the defaults, as JSON (what a table stores)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        default = ReadOptions()
        return json.dumps(
            {k: v for k, v in values.items() if v != getattr(default, k)}, sort_keys=True
        )

    @property
    def is_state_meta(self) -> bool:
        if self.changes:
            return False
        if self.table is not None:
            return self.table.lower() == "state_meta"
        return self.operator is None

    @property
    def state_names(self) -> list[str] | None:
        """The option ``states`` as a list (None: every keyed state)."""
        if self.states is None:
            return None
        return [n.strip() for n in self.states.split(",") if n.strip()]


#: a table name ending so is the change feed of the state (or operator table) before it
CHANGES_SUFFIX = "__changes"

_OPEN: dict[tuple[Any, ...], Savepoint] = {}


def _base(opts: ReadOptions) -> str:
    """The job the options name: ``path``, or the catalog database's folder."""
    if opts.path is not None:
        return opts.path
    from statequery.catalog import Catalog

    assert opts.catalog is not None and opts.database is not None
    return Catalog(opts.catalog).folder(opts.database)


def _open(opts: ReadOptions, fresh: bool = False) -> tuple[Savepoint, str | None, str | None]:
    """The savepoint and the (operator, state) the options name.

    Savepoints are cached per process by location and expected fingerprint; ``fresh`` opens the
    location again (planning does, so a query sees the files as they are now, and a checkpoint
    folder its newest ``chk-N``). Readers get options resolved by :func:`_resolve`: an exact
    ``_metadata`` location and its fingerprint, which every worker checks.
    """
    import statequery
    from statequery.catalog import Catalog

    operator, state = opts.operator, opts.state
    cache_key = (opts.path, opts.catalog, opts.database, opts.fingerprint, opts.classpath,
                 opts.version)
    if fresh or cache_key not in _OPEN:
        _OPEN.pop(cache_key, None)
        if opts.version is not None:  # one version of a job (statequery.history)
            job = statequery.open_job(_base(opts), classpath=opts.classpath)
            sp = statequery.open(job.location_of(opts.version), classpath=opts.classpath)
        elif opts.path is not None:
            sp = statequery.open(opts.path, classpath=opts.classpath)
        elif opts.classpath:
            assert opts.catalog is not None and opts.database is not None
            sp = statequery.open(Catalog(opts.catalog).location(opts.database),
                                 classpath=opts.classpath)
        else:
            assert opts.catalog is not None and opts.database is not None
            sp = Catalog(opts.catalog).savepoint(opts.database)
        _check_fingerprint(sp, opts.fingerprint)
        _OPEN[cache_key] = sp
    sp = _OPEN[cache_key]
    if opts.table is not None and not opts.is_state_meta:
        row = _resolve_table(sp, opts.table)
        operator, state = row["operator_id"], row["state_name"]
    return sp, operator, state


def _check_fingerprint(sp: Savepoint, expected: str | None) -> None:
    if expected is not None and sp.fingerprint != expected:
        raise SavepointChangedError(
            f"{sp.metadata_location} is not the savepoint this table was set up over: its "
            f"_metadata has SHA-256 {sp.fingerprint}, the table expects {expected}. "
            "Re-attach it (statequery attach --replace) or drop the table"
        )


def _resolve_table(sp: Savepoint, table: str) -> dict[str, Any]:
    operator_id = sp.operator_table_id(table)
    if operator_id is not None:
        return {"operator_id": operator_id, "state_name": None}
    info = sp.table(table)  # the one table resolution (statequery.savepoint)
    return {"operator_id": info.operator_id, "state_name": info.name}


def _operator_table(opts: ReadOptions) -> Any:
    """The :class:`~statequery.optable.OperatorTable` the options name, or None (a state)."""
    sp, operator, state = _open(opts)
    if opts.is_state_meta or state is not None:
        return None
    assert operator is not None
    return sp.operator_table(operator, opts.state_names)


# -- Arrow types Spark accepts --------------------------------------------------------------------


def _spark_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz=t.tz)
    if pa.types.is_time32(t):
        # milliseconds (or seconds) of the day: Spark has no TIME type for data sources, and
        # Arrow casts time32 to int32 only (also inside structs, lists and maps)
        return pa.int32()
    if pa.types.is_time(t):
        return pa.int64()  # time64: micro- or nanoseconds of the day
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


#: the key of the field metadata that carries a table's options through Spark's metastore
OPTIONS_METADATA_KEY = "statequery.options"


class StatequeryDataSource(DataSource):
    """``spark.read.format("statequery")``: state_meta or one state of a savepoint as a table.

    The schema it reports carries the read's options, resolved to the savepoint's own location
    and ``_metadata`` fingerprint, in the metadata of its first field. Spark stores that schema
    with a persistent table (``CREATE TABLE ... USING statequery``, :func:`attach`) but gives a
    Python data source no options when such a table is read (Spark 4.x): :meth:`reader` takes
    them back from the schema, so a table reads the savepoint it was created over, or fails.
    """

    @classmethod
    def name(cls) -> str:
        return "statequery"

    def __init__(self, options: MutableMapping[str, str]) -> None:
        super().__init__(options)
        self.given = {k: v for k, v in options.items() if k.lower() not in _TABLE_PROPERTIES}
        values = ReadOptions.parse_values(self.given)  # each option checked when the read is set up
        # only per-query options (a query's WITH (...) on a persistent table): the rest of the
        # read comes from the table's schema in reader()
        self.per_query_only = bool(values) and set(values) <= PER_QUERY_OPTIONS | {"pickled"}

    def _given(self) -> ReadOptions:
        """The given options, complete (a DataFrame read, a temporary view), or an error."""
        return ReadOptions.parse(self.given)

    def schema(self) -> StructType:
        stored = _resolve(self._given())
        if stored.changes:
            return _with_options(
                _to_spark_struct(spark_arrow_schema(_changes_schema(stored))), stored,
                {"checkpoint_id" if not stored.cdc else "_commit_version":
                 f"the change feed of {stored.path}"},
            )
        sp, _, _ = _open(stored)
        comments = _column_comments(sp, stored)
        return _with_options(_to_spark_struct(_arrow_schema(stored)), stored, comments)

    def reader(self, schema: StructType) -> DataSourceReader:
        stored = options_from_schema(schema)
        if stored is None:
            if self.per_query_only:
                raise InvalidOptionError(
                    "this table has no statequery options in its schema (it was created with a "
                    "column list of its own?): re-create it with CREATE TABLE name USING "
                    "statequery OPTIONS (path '...', table '...') or `statequery attach`"
                )
            resolved = _resolve(self._given())  # raises when there are none
        elif self.per_query_only or not self.given:
            resolved = _resolve(_with_query_options(stored, self.given))
        elif stored.changes or _asks_for_changes(self.given):
            given = ReadOptions.parse(self.given)
            if given.changes != stored.changes:
                raise _per_query_error(stored, "the options name another table")
            resolved = _resolve(given)  # a change feed's schema is the same for every state
        else:
            resolved = _same_table(self.given, stored)
        if resolved.changes:
            return ChangesReader(resolved, spark_arrow_schema(_changes_schema(resolved)))
        return StatequeryReader(resolved, _arrow_schema(resolved))


#: the options a query may give a persistent table (``WITH ('key' = '...')``): they choose what
#: to read of the table, or how, never which savepoint, state or columns
PER_QUERY_OPTIONS = frozenset(
    {"key", "key_groups", "key_groups_per_partition", "batch_size", "pushdown"}
)
#: the options that say what a table is: a query's options must agree with the table's own
_WHAT_OPTIONS = ("table", "operator", "state", "states", "mode")


def _changes_schema(opts: ReadOptions) -> pa.Schema:
    """The change feed's columns: :data:`statequery.history.CHANGES_SCHEMA`, or with ``cdc``
    Spark's change-data-capture layout (:mod:`statequery.spark.cdc`)."""
    if opts.cdc:
        from statequery.spark.cdc import CDC_SCHEMA

        return CDC_SCHEMA
    from statequery.history import CHANGES_SCHEMA

    return CHANGES_SCHEMA


def _asks_for_changes(given: Mapping[str, str]) -> bool:
    """Whether a query's own options ask for a change feed (``changes``, or a ``table`` named
    ``<state>__changes``); checked one by one, since they need not be complete."""
    values = ReadOptions.parse_values(given)
    table = values.get("table")
    return bool(values.get("changes")) or (
        isinstance(table, str) and table.lower().endswith(CHANGES_SUFFIX)
    )


def _per_query_error(stored: ReadOptions, detail: str) -> InvalidOptionError:
    what = ", ".join(
        f"{name} {getattr(stored, name)!r}" for name in ("path", *_WHAT_OPTIONS)
        if getattr(stored, name) is not None
    )
    return InvalidOptionError(
        f"{detail}: this statequery table reads {what}; a query on it may give only the "
        f"options {', '.join(sorted(PER_QUERY_OPTIONS))} "
        "(e.g. SELECT ... FROM t WITH ('key' = 'user-3'))"
    )


def _with_query_options(stored: ReadOptions, given: Mapping[str, str]) -> ReadOptions:
    """A persistent table's own options (from its schema) with one query's options.

    Spark passes a query's ``WITH (...)`` options to the data source of a persistent table, and
    nothing else: the table's own options are those its schema carries. A query may only narrow
    the read (``key``, ``key_groups``) or tune it; a key option that contradicts the table's own
    is refused, never widened.
    """
    values = ReadOptions.parse_values(given)
    if values.get("pickled", stored.pickled) != stored.pickled:
        raise _per_query_error(stored, _pickled_refusal(stored))
    for name in ("key", "key_groups"):
        mine = getattr(stored, name)
        if name in values and mine is not None and values[name] != mine:
            raise _per_query_error(
                stored, f"option {name} {values[name]!r} contradicts the table's own {mine!r}"
            )
    merged = {f.name: getattr(stored, f.name) for f in fields(stored)}
    merged.update(values)
    return ReadOptions.from_values(merged)


def _same_table(options: Mapping[str, str], stored: ReadOptions) -> ReadOptions:
    """``options`` parsed, when they name the table ``stored`` describes.

    A DataFrame read passes its options with the schema planned from them; a query on a
    persistent table may repeat the table's own options in its ``WITH (...)``; in both, what
    the options name must be what the schema was made for.
    """
    shown = ", ".join(f"{k} {v!r}" for k, v in options.items())
    try:
        given = ReadOptions.parse(options)
    except InvalidOptionError as e:
        raise _per_query_error(stored, f"the options {shown} ({e})") from None
    if given.pickled != stored.pickled:
        raise _per_query_error(stored, _pickled_refusal(stored))
    for name in _WHAT_OPTIONS:
        mine, theirs = getattr(stored, name), getattr(given, name)
        if name == "table" and mine is not None and theirs is not None:
            mine, theirs = mine.lower(), theirs.lower()
        if mine != theirs:
            raise _per_query_error(stored, f"the options {shown} name another table")
    for name in ("key", "key_groups"):
        mine = getattr(stored, name)
        if mine is not None and getattr(given, name) != mine:
            raise _per_query_error(
                stored, f"option {name} {getattr(given, name)!r} contradicts the table's own"
            )
    # a folder of savepoints (a checkpoint folder: its newest chk-N) may move on; anything else
    # is another savepoint than the one the schema was made for
    if given.path is not None and not _within(given.path, stored.path):
        raise _per_query_error(stored, f"the options {shown} name another savepoint")
    resolved = _resolve(given)
    if resolved.path != stored.path:
        if given.path is None or not _within(given.path, resolved.path):
            raise _per_query_error(stored, f"the options {shown} name another savepoint")
    elif given.fingerprint is None:
        # a DataFrame planned over one savepoint must not read another one
        _check_fingerprint(_open(resolved)[0], stored.fingerprint)
    return resolved


def _within(folder: str, location: str | None) -> bool:
    """Whether ``location`` is ``folder`` or inside it (locations as :func:`_resolve` makes)."""
    import os

    from statequery.io import normalize_location

    if location is None:
        return False
    base = normalize_location(folder).rstrip("/")
    if base.endswith("/_metadata"):
        base = base[: -len("/_metadata")]
    if "://" not in base:
        base = os.path.abspath(base)
    return location == base or location.startswith(base + "/")


def _resolve(opts: ReadOptions) -> ReadOptions:
    """``opts`` naming the savepoint as it is now: its exact location and fingerprint.

    The savepoint is opened once, and cached under the resolved options too, so the planning
    that follows does not open it again.
    """
    if opts.changes:
        return _resolve_changes(opts)
    sp, _, _ = _open(opts, fresh=True)
    resolved = replace(opts, path=sp.location, catalog=None, database=None,
                       fingerprint=sp.fingerprint, version=None)
    _OPEN[(resolved.path, None, None, resolved.fingerprint, resolved.classpath, None)] = sp
    return resolved


def _resolve_changes(opts: ReadOptions) -> ReadOptions:
    """A change feed's options naming the job's location, and the operator and state of its
    ``table`` (resolved in the newest complete version)."""
    import statequery

    location = _base(opts)
    with statequery.open_job(location, classpath=opts.classpath) as job:
        operator, state = opts.operator, opts.state
        if opts.table is not None:
            row = _resolve_table(job.version(), opts.table)
            operator, state = row["operator_id"], row["state_name"]
        elif operator is not None:
            info = job.version().operator(operator)
            operator = info.operator_id
            if state is not None:
                state = job.version().state(operator, state).name
    return replace(opts, path=job.locations[0], catalog=None, database=None, table=None,
                   operator=operator, state=state)


def _arrow_schema(opts: ReadOptions) -> pa.Schema:
    sp, operator, state = _open(opts)
    if opts.is_state_meta:
        return spark_arrow_schema(sp.state_meta().schema)
    from statequery.reader import schema_of

    table = _operator_table(opts)
    if table is not None:
        return spark_arrow_schema(table.schema)
    assert operator is not None and state is not None  # ReadOptions.parse ensures both
    return spark_arrow_schema(schema_of(sp, operator, state, opts.mode, opts.pickled))


def _with_options(
    schema: StructType, opts: ReadOptions, comments: Mapping[str, str]
) -> StructType:
    out = []
    for i, f in enumerate(schema.fields):
        metadata = dict(f.metadata or {})
        if f.name in comments:
            metadata["comment"] = comments[f.name]
        if i == 0:
            metadata[OPTIONS_METADATA_KEY] = opts.to_json()
        out.append(StructField(f.name, f.dataType, f.nullable, metadata))
    return StructType(out)


def _column_comments(sp: Savepoint, opts: ReadOptions) -> dict[str, str]:
    """What ``DESCRIBE`` shows for each column: the state, its Flink types, the savepoint."""
    if opts.is_state_meta:
        return {"operator_id": f"operators and states of {sp.location}"}
    from statequery.spark.catalog import operator_table_comments, state_comment

    table = _operator_table(opts)
    if table is not None:
        return operator_table_comments(sp, table)
    _, operator, state = _open(opts)
    assert operator is not None and state is not None
    info = sp.state(operator, state)
    row = next(
        r for r in sp.state_meta().to_pylist()
        if r["operator_id"] == info.operator_id and r["state_name"] == info.name
    )
    return {
        "key_group": f"{state_comment(row)}; in {sp.location}",
        "key": f"{row['key_type']} ({row['key_serializer']})",
        "namespace": f"{row['namespace_type']} ({row['namespace_serializer']})",
        "user_key": f"{row['user_key_type']} ({row['user_key_serializer']})",
        "value": f"{row['value_type']} ({row['value_serializer']})",
    }


def options_from_schema(schema: StructType) -> ReadOptions | None:
    """The options a statequery schema carries (see :class:`StatequeryDataSource`), or None."""
    for f in schema.fields:
        text = (f.metadata or {}).get(OPTIONS_METADATA_KEY)
        if text is not None:
            try:
                values = json.loads(text)
            except ValueError:
                raise InvalidOptionError(
                    f"the schema's {OPTIONS_METADATA_KEY} metadata is not JSON: {text[:200]!r}"
                ) from None
            if not isinstance(values, dict) or not values:
                raise InvalidOptionError(f"bad {OPTIONS_METADATA_KEY} metadata: {text[:200]!r}")
            return ReadOptions.parse({str(k): str(v) for k, v in values.items()})
    return None


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
        self.table = None if opts.is_state_meta else _operator_table(opts)
        if not opts.is_state_meta and opts.key is not None:
            from statequery.keys import parse_key_text

            sp, operator, state = _open(opts)
            assert operator is not None
            if self.table is not None:
                spec = sp.operator(operator).key_spec
            else:
                assert state is not None
                spec = sp.state(operator, state).key_spec
            self.keys = [parse_key_text(opts.key, spec)]
        if opts.key_groups is not None:
            self.key_groups = parse_key_group_list(opts.key_groups)

    def partitions(self) -> Sequence[InputPartition]:
        if self.opts.is_state_meta:
            return [TaskPartition(None)]
        sp, operator, state = _open(self.opts)
        assert operator is not None
        if self.table is not None:
            from statequery.scan import plan_states

            tasks = plan_states(
                sp.model, sp.context, list(self.table.states), keys=self.keys,
                key_groups=self.key_groups,
                split=self.opts.key_groups_per_partition,
            )
        else:
            assert state is not None
            tasks = sp.plan(
                operator, state, keys=self.keys, key_groups=self.key_groups,
                mode=self.opts.mode, split=self.opts.key_groups_per_partition,
                pickled=self.opts.pickled,
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
            pairs = execute(partition.task, io, batch_size=self.opts.batch_size)
            if self.table is not None:  # every state of the operator, walked once
                for batch in self.table.batches(pairs):
                    yield _cast(batch, self.arrow_schema)
                return
            for _, batch in pairs:
                if batch.num_rows:
                    yield _cast(batch, self.arrow_schema)
        finally:
            io.close()


@dataclass(frozen=True)
class ChangesPartition(InputPartition):
    """The changes of one version of a job (``checkpoint_id``; None: nothing to read)."""

    checkpoint_id: int | None = None


class ChangesReader(DataSourceReader):
    """The change feed (:meth:`statequery.history.Job.changes`): one partition per version,
    each the changes between it and the complete version before it."""

    def __init__(self, opts: ReadOptions, arrow_schema: pa.Schema) -> None:
        self.opts = opts
        self.arrow_schema = arrow_schema
        self.key: Any = None
        if opts.key is not None:
            import statequery
            from statequery.keys import parse_key_text

            with statequery.open_job(self._location, classpath=opts.classpath) as job:
                sp = job.version()
                ops = [sp.operator(opts.operator)] if opts.operator else list(sp.operators)
                spec = next((o.key_spec for o in ops if o.key_spec is not None), None)
                if spec is None:
                    raise InvalidOptionError(
                        f"option key: no keyed state in the newest version of {self._location}"
                    )
                self.key = parse_key_text(opts.key, spec)

    @property
    def _location(self) -> str:
        assert self.opts.path is not None  # _resolve_changes sets it
        return self.opts.path

    def partitions(self) -> Sequence[InputPartition]:
        import statequery

        with statequery.open_job(self._location, classpath=self.opts.classpath) as job:
            done = job.complete_versions()
        ids = sorted({
            v.checkpoint_id for v in done[1:] if v.checkpoint_id is not None
            and (self.opts.start is None or v.checkpoint_id >= self.opts.start)
            and (self.opts.end is None or v.checkpoint_id <= self.opts.end)
        })
        return [ChangesPartition(i) for i in ids] or [ChangesPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ChangesPartition)  # what partitions() returns
        if partition.checkpoint_id is None:
            return
        import statequery

        cid = partition.checkpoint_id
        with statequery.open_job(self._location, classpath=self.opts.classpath) as job:
            completed = next((v.completed_at for v in job.complete_versions()
                              if v.checkpoint_id == cid), None)
            for batch in job.change_batches(self.opts.operator, self.opts.state, start=cid,
                                            end=cid, key=self.key):
                if batch.num_rows:
                    if self.opts.cdc:
                        from statequery.spark.cdc import cdc_batch

                        batch = cdc_batch(batch, completed)
                    yield _cast(batch, self.arrow_schema)


def _flag(name: str, value: Any) -> bool:
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise InvalidOptionError(f"option {name} must be true or false, got {value!r}")
    return text == "true"


def _pickled_refusal(stored: ReadOptions) -> str:
    """Why a query's ``pickled`` cannot differ from a persistent table's own: the ``*_py``
    columns are part of the table's schema, which Spark keeps."""
    return (
        f"option pickled {'false' if stored.pickled else 'true'} differs from the table's own "
        f"({str(stored.pickled).lower()}): the *_py columns are part of a table's schema. "
        "Attach with `statequery attach --pickled` (or CREATE TABLE ... USING statequery "
        "OPTIONS (..., pickled 'true')), or read spark.read.format('statequery')"
        ".option('pickled', 'true')"
    )


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
    assert operator is not None
    if state is None:
        label = f"{sp.operator(operator).display_name} (operator table)"
        max_par = sp.operator(operator).max_parallelism
    else:
        info = sp.state(operator, state)
        label = info.table_name or info.operator_uid + "/" + info.name
        max_par = info.max_parallelism
    ranges = _ranges(
        kg
        for t in tasks
        for kg in (t.key_groups if t.key_groups is not None else _handle_key_groups(t))
    )
    groups = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges) or "none"
    why = f"key {opts.key!r}" if opts.key is not None else f"key_groups {opts.key_groups!r}"
    print(
        f"statequery: {label}: {why} -> "
        f"key group(s) {groups} of {max_par}, {len(tasks)} partition(s)",
        file=sys.stderr, flush=True,
    )


def view_statements(catalog: str | None = None, databases: Sequence[str] = ()) -> list[str]:
    """``CREATE TEMPORARY VIEW`` statements for a catalog (:mod:`statequery.catalog.views`).

    Persistent databases are better: see :func:`statequery.spark.catalog.attach`.
    """
    from statequery.catalog.views import view_statements as build

    return build(catalog, databases)


def _views(catalog: str | None, databases: Sequence[str]) -> list[tuple[str, str]]:
    from statequery.catalog import DEFAULT_CATALOG, Catalog
    from statequery.catalog.views import view_name, view_statement

    cat = Catalog(catalog or DEFAULT_CATALOG)
    out = []
    for db in databases or cat.databases():
        location = cat.location(db)
        for table in cat.tables(db):
            name = view_name(db, table)
            out.append((name, view_statement(name, location, table).rstrip(";")))
    return out


def register_views(
    spark: Any, catalog: str | None = None, databases: Sequence[str] = ()
) -> list[str]:
    """Run :func:`view_statements` in ``spark``; returns the view names."""
    names = []
    for name, statement in _views(catalog, databases):
        spark.sql(statement)
        names.append(name)
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
