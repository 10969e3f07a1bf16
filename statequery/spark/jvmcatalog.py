"""The Python side of ``statequery.StatequeryCatalog``, the Spark catalog plugin of a statequery
catalog folder (Java source in ``statequery/spark/java``): which databases and tables there are,
and which version a ``TIMESTAMP AS OF`` reads. Answered by the pooled JVM workers
(:mod:`statequery.spark.jvmworker`), as the data source's schema and plans are.

    spark.sql.catalog.sq       statequery.StatequeryCatalog
    spark.sql.catalog.sq.root  /path/to/catalog     (default: the default catalog)

    SELECT * FROM sq.<database>.<table> VERSION AS OF 42
    SELECT * FROM sq.<database>.<table> TIMESTAMP AS OF '2026-11-27 10:00:00'
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from statequery.catalog import Catalog
from statequery.metadata.statemeta import sql_identifier

__all__ = ["databases", "tables", "version_at", "version_range"]


def _catalog(request: dict[str, Any]) -> Catalog:
    return Catalog(str(request.get("catalog") or ""))


def _name(cat: Catalog, database: str) -> str | None:
    """The catalog's own spelling of ``database`` (as :meth:`Catalog.location` matches it)."""
    for name in cat.databases():
        if name == database or sql_identifier(name) == sql_identifier(database):
            return name
    return None


def databases(request: dict[str, Any]) -> dict[str, Any]:
    """``L``: the catalog folder and its databases; with ``database``, that database's entry
    (None when there is none)."""
    cat = _catalog(request)
    if "database" not in request:
        return {"catalog": cat.root, "databases": cat.databases()}
    name = _name(cat, str(request["database"]))
    if name is None:
        return {"catalog": cat.root, "database": None}
    return {"catalog": cat.root,
            "database": {"name": name, "location": cat.folder(name), "provider": "statequery"}}


def tables(request: dict[str, Any]) -> dict[str, Any]:
    """``T``: a database's tables (``state_meta``, one per state, the operator tables) in its
    newest version."""
    return {"tables": _catalog(request).tables(str(request["database"]))}


def version_at(request: dict[str, Any]) -> dict[str, Any]:
    """``V``: the checkpoint id of the database's newest complete version that completed at or
    before ``timestamp_micros`` (Spark's ``TIMESTAMP AS OF``, microseconds since the epoch)."""
    import statequery

    cat = _catalog(request)
    when = datetime.fromtimestamp(int(request["timestamp_micros"]) / 1e6, tz=timezone.utc)
    with statequery.open_job(cat.folder(str(request["database"]))) as job:
        return {"version": job.version_at(when).checkpoint_id}


def version_range(request: dict[str, Any]) -> dict[str, Any]:
    """``W``: the checkpoint ids ``start``/``end`` (inclusive; None: unbounded) of the versions
    that completed in a ``CHANGES FROM TIMESTAMP ... TO TIMESTAMP ...`` range (microseconds;
    ``*_inclusive`` as Spark says); ``empty`` when no version did."""
    import statequery

    cat = _catalog(request)

    def at(name: str) -> datetime | None:
        value = request.get(name)
        return None if value is None else datetime.fromtimestamp(int(value) / 1e6, tz=timezone.utc)

    low, high = at("start_micros"), at("end_micros")
    with statequery.open_job(cat.folder(str(request["database"]))) as job:
        inside = []
        for v in job.complete_versions():
            t = v.completed_at
            if t is None or v.checkpoint_id is None:
                continue
            if low is not None and (t < low or (t == low and not request.get("start_inclusive"))):
                continue
            if high is not None and (t > high or (t == high and not request.get("end_inclusive"))):
                continue
            inside.append(v.checkpoint_id)
    if not inside:
        return {"empty": True, "start": None, "end": None}
    return {"empty": False, "start": min(inside), "end": max(inside)}
