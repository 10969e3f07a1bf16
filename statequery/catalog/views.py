"""Spark SQL statements that expose a catalog's tables as temporary views, built by sqlglot.

Folder names, locations and table names reach Spark only as sqlglot identifiers and string
literals, quoted and escaped by sqlglot's Spark generator, never by string formatting: a database
folder named ``x'; CREATE TABLE t AS SELECT 1; --`` stays a path inside one literal. Needs no
pyspark (``statequery spark-views`` prints these; ``statequery.spark.register_views`` runs them).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["view_name", "view_statement", "view_statements"]

#: the dialect of the generated statements
DIALECT = "spark"


def view_name(database: str, table: str) -> str:
    """The view a table becomes: ``<database>__<table>`` (Spark's temporary views cannot live in
    a database), the database as a plain SQL identifier."""
    from statequery.catalog import sql_identifier

    return f"{sql_identifier(database)}__{table}"


def view_statement(view: str, location: str, table: str) -> str:
    """``CREATE OR REPLACE TEMPORARY VIEW `view` USING statequery OPTIONS ('path'=...,
    'table'=...)`` with every name quoted by sqlglot."""
    from sqlglot import exp

    create = exp.Create(
        this=exp.Table(this=exp.to_identifier(view, quoted=True)),
        kind="VIEW",
        replace=True,
        properties=exp.Properties(
            expressions=[
                exp.TemporaryProperty(),
                exp.FileFormatProperty(this=exp.to_identifier("statequery")),
                exp.OptionsProperty(
                    expressions=[
                        exp.Property(this=exp.Literal.string("path"),
                                     value=exp.Literal.string(location)),
                        exp.Property(this=exp.Literal.string("table"),
                                     value=exp.Literal.string(table)),
                    ]
                ),
            ]
        ),
    )
    return create.sql(dialect=DIALECT) + ";"


def view_statements(catalog: str | None = None, databases: Sequence[str] = ()) -> list[str]:
    """One statement per table of each database (default: all) of ``catalog`` (default: the
    shipped one). Run them with ``spark-sql -i views.sql`` or ``spark.sql(...)``."""
    from statequery.catalog import DEFAULT_CATALOG, Catalog
    from statequery.exceptions import require_extra

    require_extra("sqlglot", "spark", "statequery spark-views")
    cat = Catalog(catalog or DEFAULT_CATALOG)
    out = []
    for db in databases or cat.databases():
        location = cat.location(db)
        for table in cat.tables(db):
            out.append(view_statement(view_name(db, table), location, table))
    return out
