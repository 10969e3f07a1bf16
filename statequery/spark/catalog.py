"""Savepoints as databases in Spark's session catalog: ``attach`` and ``detach``.

Attaching a savepoint creates, in the session catalog (the Hive metastore of ``spark-sql``, or
any metastore the session uses), one database with a persistent table ``state_meta`` and one
table per state. The tables are ``CREATE TABLE ... USING statequery OPTIONS (path, table,
fingerprint)``: Spark stores the schema the data source reports, which carries those options
(see :class:`statequery.spark.StatequeryDataSource`), so a later, separate Spark process reads the
same savepoint with no set-up beyond the same metastore, and fails with a clear error if the
savepoint at that path is not the one attached any more.

Every identifier and string in the generated SQL is quoted by sqlglot, never by formatting.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from statequery.exceptions import InvalidOptionError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from statequery.optable import OperatorTable
    from statequery.savepoint import Savepoint

__all__ = ["AttachPlan", "attach", "attach_plans", "detach", "quote_identifier", "quote_string"]

#: database properties that mark a database as made by ``attach``
LOCATION_PROPERTY = "statequery.location"
FINGERPRINT_PROPERTY = "statequery.fingerprint"


def quote_identifier(name: str) -> str:
    """``name`` as a Spark SQL identifier (backquoted by sqlglot)."""
    from sqlglot import exp

    return str(exp.to_identifier(name, quoted=True).sql(dialect="spark"))


def quote_string(text: str) -> str:
    """``text`` as a Spark SQL string literal (escaped by sqlglot)."""
    from sqlglot import exp

    return str(exp.Literal.string(text).sql(dialect="spark"))


@dataclass
class AttachPlan:
    """What attaching one savepoint creates: a database and its tables, as SQL statements."""

    database: str
    location: str
    fingerprint: str
    comment: str
    tables: list[tuple[str, str]] = field(default_factory=list)  # (table, comment)
    #: the state tables created with the option pickled (``attach(pickled=True)``: those with
    #: bytes columns, state_meta's pickled_columns)
    pickled: set[str] = field(default_factory=set)
    #: the job's jars (``attach(classpath=...)``): every table reads Kryo values with them
    classpath: str | None = None
    #: a Protobuf descriptor set (``attach(protobuf_descriptors=...)``, else the database
    #: folder's ``descriptors.pb``): the tables' option ``protobuf_descriptors``
    protobuf_descriptors: str | None = None

    def create_database(self) -> str:
        props = {
            LOCATION_PROPERTY: self.location,
            FINGERPRINT_PROPERTY: self.fingerprint,
        }
        return (
            f"CREATE DATABASE {quote_identifier(self.database)} COMMENT "
            f"{quote_string(self.comment)} WITH DBPROPERTIES ("
            + ", ".join(f"{quote_string(k)} = {quote_string(v)}" for k, v in props.items())
            + ")"
        )

    def create_tables(self) -> list[str]:
        out = []
        for table, comment in self.tables:
            options = {"path": self.location, "table": table, "fingerprint": self.fingerprint}
            if table in self.pickled:
                options["pickled"] = "true"
            if self.classpath:
                options["classpath"] = self.classpath
            if self.protobuf_descriptors:
                options["protobuf_descriptors"] = self.protobuf_descriptors
            out.append(
                f"CREATE TABLE {quote_identifier(self.database)}.{quote_identifier(table)} "
                "USING statequery OPTIONS ("
                + ", ".join(f"{k} {quote_string(v)}" for k, v in options.items())
                + f") COMMENT {quote_string(comment)}"
            )
        return out

    def statements(self, replace: bool = False) -> list[str]:
        drop = [f"DROP DATABASE IF EXISTS {quote_identifier(self.database)} CASCADE"]
        return (drop if replace else []) + [self.create_database(), *self.create_tables()]


def _plan_one(sp: Savepoint, database: str, pickled: bool = False,
              classpath: str | None = None,
              protobuf_descriptors: str | None = None) -> AttachPlan:
    what = sp.snapshot_type
    details = [f"checkpoint {sp.checkpoint_id}"]
    if sp.format:
        details.append(f"format {sp.format}")
    if sp.backend:
        details.append(f"backend {sp.backend}")
    plan = AttachPlan(
        database=database,
        location=sp.location,
        fingerprint=sp.fingerprint,
        comment=f"Flink {what} {sp.location} ({', '.join(details)}), attached by statequery",
        classpath=classpath,
        protobuf_descriptors=protobuf_descriptors,
    )
    plan.tables.append(("state_meta", f"operators and states of {sp.location}"))
    for row in sp.state_meta().to_pylist():
        if row["kind"] == "raw":
            continue  # an operator's own raw bytes: a state_meta row (size, reason), no rows
        plan.tables.append((str(row["table_name"]), state_comment(row)))
        if pickled and row["pickled_columns"]:
            plan.pickled.add(str(row["table_name"]))
    for name, operator_id in sp.operator_tables().items():
        op = sp.operator(operator_id)
        plan.tables.append(
            (name, f"every keyed state of operator {op.display_name!r}, one row per entry")
        )
    return plan


def operator_table_comments(sp: Savepoint, table: OperatorTable) -> dict[str, str]:
    """What ``DESCRIBE`` shows for an operator table's columns (:mod:`statequery.optable`)."""
    first = table.states[0]
    op = sp.operator(first.operator_id)
    out = {
        "state": f"the state of the row; every keyed state of operator {op.display_name!r} "
                 f"in {sp.location}, one row per entry",
        "key_group": f"the key group (of {op.max_parallelism})",
        "key": "the key",
    }
    rows = {(r["operator_id"], r["state_name"]): r for r in sp.state_meta().to_pylist()}
    for s in table.states:
        row = rows.get((s.operator_id, s.name))
        kind = f"{row['kind']} " if row else ""
        value = f": {row['value_type']}" if row and row.get("value_type") else ""
        out[table.columns[s.name]] = f"{kind}state {s.name!r} (null on other states' rows){value}"
    return out


def state_comment(row: dict[str, Any]) -> str:
    """One line describing a state table, from its ``state_meta`` row."""
    types = [f"key {row['key_type']}"] if row.get("key_type") else []
    if row.get("namespace_type") and row["namespace_type"] != "VOID":
        types.append(f"namespace {row['namespace_type']}")
    if row.get("user_key_type"):
        types.append(f"user_key {row['user_key_type']}")
    if row.get("value_type"):
        types.append(f"value {row['value_type']}")
    text = (
        f"{row['kind']} state {row['state_name']!r} of operator "
        f"{row['operator_uid'] or row['operator_id']!r} ({row['operator_name']})"
    )
    if types:
        text += ": " + ", ".join(types)
    if row.get("ttl"):
        text += " (TTL)"
    if not row.get("decodable", True):
        text += f"; not decodable: {row.get('reason')}"
    return text


def attach_plans(
    path_or_uri: str, database: str | None = None, pickled: bool = False,
    classpath: Sequence[str] | str | None = None,
    protobuf_descriptors: str | None = None,
) -> list[AttachPlan]:
    """The databases attaching ``path_or_uri`` creates: one savepoint, or each of a catalog's.
    ``pickled``: the state tables with bytes columns get the ``*_py`` columns (the option
    ``pickled``: PyFlink's pickles as JSON text). ``classpath``: the job's jars, the tables'
    option ``classpath`` (Kryo values decoded with their classes). ``protobuf_descriptors``: a
    descriptor set, carried by the tables' ``classpath`` (Protobuf messages decoded with it).

    A folder that holds a ``_metadata`` (or resolves to one, as a checkpoint folder does) is one
    savepoint; a folder of savepoint folders is a catalog and attaches every database in it.
    """
    import statequery
    from statequery.catalog import Catalog, sql_identifier
    from statequery.exceptions import SavepointNotFoundError, require_extra

    require_extra("sqlglot", "spark", "statequery attach")
    from statequery.arrow.kryo import checked_classpath, user_types
    from statequery.io import FileIO, join_location, normalize_location

    cp = ",".join(checked_classpath(classpath)) or None
    pb = user_types(None, protobuf_descriptors).protobuf_descriptors
    io = FileIO()
    location = normalize_location(path_or_uri).rstrip("/") or "/"
    if "://" not in location:  # tables outlive this process and its working directory
        location = os.path.abspath(location)
    is_savepoint = location.endswith("_metadata") or io.new_input(
        join_location(location, "_metadata")
    ).exists()
    plans: list[AttachPlan] = []
    if is_savepoint:
        sp = statequery.open(location)
        name = database or sql_identifier(location.rstrip("/").rsplit("/", 1)[-1])
        plans.append(_plan_one(sp, name, pickled, cp, pb))
    else:
        cat = Catalog(location)
        dbs = cat.databases()
        if not dbs:
            try:  # a checkpoint folder (chk-N) or a savepoint target folder is one savepoint
                sp = statequery.open(location)
            except SavepointNotFoundError:
                raise SavepointNotFoundError(
                    f"{path_or_uri} is neither a savepoint nor a folder of savepoints"
                ) from None
            name = database or sql_identifier(location.rsplit("/", 1)[-1])
            plans.append(_plan_one(sp, name, pickled, cp, pb))
        else:
            if database is not None and len(dbs) > 1:
                raise InvalidOptionError(
                    f"{path_or_uri} is a catalog of {len(dbs)} savepoints; a database name "
                    "can be given only when attaching one savepoint"
                )
            for db in dbs:
                # a database folder's own job.jar (Catalog.job_jar) unless a classpath is given
                jar = cp or ",".join(cat.job_jar(db) or []) or None
                plans.append(_plan_one(cat.savepoint(db), database or sql_identifier(db), pickled,
                                       jar, pb or cat.job_descriptors(db)))
    seen: dict[str, str] = {}
    for plan in plans:
        if not re.fullmatch(r"[A-Za-z0-9_]+", plan.database):
            raise InvalidOptionError(
                f"database name {plan.database!r}: Spark's session catalog takes only letters, "
                "digits and _ in database names"
            )
        key = plan.database.lower()
        if key in seen:
            raise InvalidOptionError(
                f"two savepoints would both be database {plan.database!r}: {seen[key]} and "
                f"{plan.location}; attach them one at a time with a database name each"
            )
        seen[key] = plan.location
    return plans


def _properties(spark: SparkSession, database: str) -> dict[str, str]:
    rows = spark.sql(
        f"DESCRIBE DATABASE EXTENDED {quote_identifier(database)}"
    ).collect()
    for row in rows:
        if row[0] == "Properties":
            return _parse_properties(str(row[1]))
    return {}


def _parse_properties(text: str) -> dict[str, str]:
    """Spark prints database properties as ``((k1,v1), (k2,v2))``."""
    out: dict[str, str] = {}
    for part in text.strip("()").split("), ("):
        key, sep, value = part.strip("()").partition(",")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _database_exists(spark: SparkSession, database: str) -> bool:
    # SHOW DATABASES, not Catalog.databaseExists: that one parses the name, and a name holding a
    # backquote cannot be written for it
    names = {str(row[0]).lower() for row in spark.sql("SHOW DATABASES").collect()}
    return database.lower() in names


def attach(
    spark: SparkSession,
    path_or_uri: str,
    database: str | None = None,
    replace: bool = False,
    keep_unchanged: bool = False,
    pickled: bool = False,
    plans: list[AttachPlan] | None = None,
    classpath: Sequence[str] | str | None = None,
    protobuf_descriptors: str | None = None,
) -> list[str]:
    """Attach a savepoint (or every savepoint of a catalog folder) to ``spark``'s catalog.

    Returns the database names. An existing database of that name is an error unless
    ``replace``, and even then only a database that ``attach`` made is dropped. With
    ``keep_unchanged``, a database already attached to the same location and ``_metadata``
    fingerprint is kept as it is (what ``statequery shell`` does at every start). ``plans``:
    what :func:`attach_plans` gave for these arguments (``statequery attach`` makes them before
    it starts Spark, so that a wrong path is said at once).
    """
    if plans is None:
        plans = attach_plans(path_or_uri, database, pickled, classpath, protobuf_descriptors)
    todo = []
    for plan in plans:
        drop = False
        if _database_exists(spark, plan.database):
            props = _properties(spark, plan.database)
            if LOCATION_PROPERTY not in props:
                raise InvalidOptionError(
                    f"database {plan.database!r} exists and was not made by statequery; "
                    "attach under another name (database=...)"
                )
            same = (props.get(LOCATION_PROPERTY) == plan.location
                    and props.get(FINGERPRINT_PROPERTY) == plan.fingerprint)
            if keep_unchanged and same:
                continue
            if not (replace or keep_unchanged):
                raise InvalidOptionError(
                    f"database {plan.database!r} is already attached (to "
                    f"{props[LOCATION_PROPERTY]}); use replace=True (--replace) to re-attach"
                )
            drop = True
        todo.append((plan, drop))
    for plan, drop in todo:
        for statement in plan.statements(replace=drop):
            spark.sql(statement)
    return [p.database for p in plans]


def detach(spark: SparkSession, databases: Sequence[str]) -> list[str]:
    """Drop databases made by :func:`attach`; the savepoints themselves are not touched."""
    dropped = []
    for database in databases:
        if not _database_exists(spark, database):
            raise InvalidOptionError(f"no database {database!r} to detach")
        if LOCATION_PROPERTY not in _properties(spark, database):
            raise InvalidOptionError(
                f"database {database!r} was not made by statequery attach; not dropping it"
            )
        spark.sql(f"DROP DATABASE {quote_identifier(database)} CASCADE")
        dropped.append(database)
    return dropped
