"""The options of a ``statequery`` read (case-insensitive), parsed once into :class:`ReadOptions`:


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

A persistent table keeps its options in its schema (:data:`OPTIONS_METADATA_KEY`); a query on it
may give only :data:`PER_QUERY_OPTIONS`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from pyspark.sql.types import StructType

from statequery.exceptions import InvalidOptionError

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
        if opts.protobuf_descriptors:  # checked here, absolute (statequery.arrow.kryo)
            from statequery.arrow.kryo import user_types

            types = user_types(None, opts.protobuf_descriptors)
            opts = replace(opts, protobuf_descriptors=types.protobuf_descriptors)
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


#: the key of the field metadata that carries a table's options through Spark's metastore
OPTIONS_METADATA_KEY = "statequery.options"


#: the options a query may give a persistent table (``WITH ('key' = '...')``): they choose what
#: to read of the table, or how, never which savepoint, state or columns
PER_QUERY_OPTIONS = frozenset(
    {"key", "key_groups", "key_groups_per_partition", "batch_size", "pushdown"}
)


#: the options that say what a table is: a query's options must agree with the table's own
_WHAT_OPTIONS = ("table", "operator", "state", "states", "mode")


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
