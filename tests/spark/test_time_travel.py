"""Spark SQL time travel over a job's versions: ``VERSION AS OF`` / ``TIMESTAMP AS OF`` through
statequery's catalog plugin (``statequery.StatequeryCatalog``, issue 34 item 1), against
``statequery.open_job``: the same rows, version by version, in the shared session (which has the
JVM data source's jar; the catalog is set for this module only and unset after it)."""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

import statequery
from statequery.catalog import Catalog
from tests.conftest import FIXTURES

pytestmark = pytest.mark.spark

HISTORY = "history-hashmap"
DB = "orders_job"
#: when each version completed (its _metadata's mtime): a minute apart from 10:01 UTC
BASE = datetime(2026, 11, 27, 10, 0, tzinfo=timezone.utc)


def _completed(n: int) -> datetime:
    return BASE.replace(minute=n)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A catalog folder with one database: a copy of the history fixture (a job's checkpoint
    directory), each chk-N completing at 10:0N UTC."""
    root = tmp_path_factory.mktemp("tt-catalog")
    shutil.copytree(FIXTURES / HISTORY, root / DB)
    for metadata in (root / DB).glob("*/chk-*/_metadata"):
        n = int(metadata.parent.name.split("-")[1])
        t = _completed(n).timestamp()
        os.utime(metadata, (t, t))
    (root / "notes").mkdir()  # not a database: not listed
    return root


@pytest.fixture(scope="module")
def sq(spark: Any, folder: Path) -> Any:
    from statequery.spark.jvm import jar_path

    assert jar_path() is not None, "javac is on PATH here: the jar must build"
    spark.conf.set("spark.sql.catalog.sq", "statequery.StatequeryCatalog")
    spark.conf.set("spark.sql.catalog.sq.root", str(folder))
    return spark


def _state(folder: Path) -> tuple[str, str, str]:
    """(operator id, state name, table name) of the job's first keyed value state."""
    sp = statequery.open_job(str(folder / DB)).version()
    row = next(r for r in sp.state_meta().to_pylist() if r["kind"] == "value")
    return row["operator_id"], row["state_name"], row["table_name"]


def _arrow_rows(table: Any) -> list[str]:
    from statequery.spark import spark_arrow_schema

    return sorted(repr(r) for r in table.cast(spark_arrow_schema(table.schema)).to_pylist())


def _spark_rows(df: Any) -> list[str]:
    return sorted(repr(r) for r in df.toArrow().to_pylist())


def test_catalog_lists_databases_and_tables(sq: Any, folder: Path) -> None:
    assert [r[0] for r in sq.sql("SHOW NAMESPACES IN sq").collect()] == [DB]
    tables = sorted(r["tableName"] for r in sq.sql(f"SHOW TABLES IN sq.{DB}").collect())
    assert tables == sorted(Catalog(str(folder)).tables(DB))
    assert "state_meta" in tables


def test_version_as_of_reads_each_version(sq: Any, folder: Path) -> None:
    job = statequery.open_job(str(folder / DB))
    operator, state, table = _state(folder)
    ids = [v.checkpoint_id for v in job.complete_versions()]
    assert len(ids) >= 5
    seen = set()
    for cid in ids:
        expected = job.read(operator, state, version=cid)
        df = sq.sql(f"SELECT * FROM sq.{DB}.{table} VERSION AS OF {cid}")
        rows = _spark_rows(df)
        assert rows == _arrow_rows(expected), cid
        seen.add(tuple(rows))
    assert len(seen) > 1  # the versions differ: VERSION AS OF is what chose each
    # no AS OF: the newest complete version
    assert _spark_rows(sq.sql(f"SELECT * FROM sq.{DB}.{table}")) == _arrow_rows(
        job.read(operator, state))
    # state_meta of an old version: that version's
    meta = sq.sql(f"SELECT count(*) AS n FROM sq.{DB}.state_meta VERSION AS OF {ids[0]}")
    assert meta.collect()[0]["n"] == job.version(ids[0]).state_meta().num_rows


def test_timestamp_as_of_reads_the_version_completed_by_then(sq: Any, folder: Path) -> None:
    job = statequery.open_job(str(folder / DB))
    operator, state, table = _state(folder)
    ids = [v.checkpoint_id for v in job.complete_versions()]
    sq.conf.set("spark.sql.session.timeZone", "UTC")
    # half a minute after version 3 completed: version 3; exactly at 4's completion: 4
    for when, cid in [(_completed(3).replace(second=30), 3), (_completed(4), 4)]:
        assert cid in ids
        assert job.version_at(when).checkpoint_id == cid
        stamp = when.strftime("%Y-%m-%d %H:%M:%S")
        df = sq.sql(f"SELECT * FROM sq.{DB}.{table} TIMESTAMP AS OF '{stamp}'")
        assert _spark_rows(df) == _arrow_rows(job.read(operator, state, version=cid)), stamp
    # before the first version: a clear error naming the oldest
    with pytest.raises(Exception, match="no complete version .* completed at or before"):
        sq.sql(f"SELECT * FROM sq.{DB}.{table} TIMESTAMP AS OF '2026-11-27 09:00:00'").collect()


def test_unknown_version_table_and_database_are_errors(sq: Any, folder: Path) -> None:
    _, _, table = _state(folder)
    with pytest.raises(Exception, match=r"no version 999 .*versions: 1, 2"):
        sq.sql(f"SELECT * FROM sq.{DB}.{table} VERSION AS OF 999").collect()
    with pytest.raises(Exception, match="TABLE_OR_VIEW_NOT_FOUND"):
        sq.sql(f"SELECT * FROM sq.{DB}.no_such_table").collect()
    with pytest.raises(Exception, match="TABLE_OR_VIEW_NOT_FOUND"):
        sq.sql(f"SELECT * FROM sq.no_such_db.{table}").collect()
    with pytest.raises(Exception, match="read-only"):
        sq.sql(f"DROP TABLE sq.{DB}.{table}").collect()
    assert (folder / DB).is_dir()
