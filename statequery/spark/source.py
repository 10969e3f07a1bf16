"""The data source ``statequery`` (:class:`StatequeryDataSource`): the schema of a read, from
metadata only, carrying the read's resolved options, and the reader for it."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader
from pyspark.sql.types import StructField, StructType

from statequery.exceptions import InvalidOptionError
from statequery.spark.arrowtypes import _to_spark_struct, spark_arrow_schema
from statequery.spark.options import (
    _TABLE_PROPERTIES,
    _WHAT_OPTIONS,
    OPTIONS_METADATA_KEY,
    PER_QUERY_OPTIONS,
    ReadOptions,
    _asks_for_changes,
    _per_query_error,
    _pickled_refusal,
    _with_query_options,
    options_from_schema,
)
from statequery.spark.reader import ChangesReader, StatequeryReader
from statequery.spark.resolve import _check_fingerprint, _open, _operator_table, _resolve, _within

if TYPE_CHECKING:
    from statequery.savepoint import Savepoint


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


def _changes_schema(opts: ReadOptions) -> pa.Schema:
    """The change feed's columns: :data:`statequery.history.CHANGES_SCHEMA`, or with ``cdc``
    Spark's change-data-capture layout (:mod:`statequery.spark.cdc`)."""
    if opts.cdc:
        from statequery.spark.cdc import CDC_SCHEMA

        return CDC_SCHEMA
    from statequery.history import CHANGES_SCHEMA

    return CHANGES_SCHEMA


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
