"""Temporary Spark views over a catalog (:mod:`statequery.catalog.views`); persistent databases
are better: :func:`statequery.spark.catalog.attach`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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
    spark: SparkSession, catalog: str | None = None, databases: Sequence[str] = ()
) -> list[str]:
    """Run :func:`view_statements` in ``spark``; returns the view names."""
    names = []
    for name, statement in _views(catalog, databases):
        spark.sql(statement)
        names.append(name)
    return names
