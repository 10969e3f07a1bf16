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


# -- the change feed as Spark's change data capture (CHANGES FROM VERSION ...) ----------------


def _cdc_rows(job: Any, operator: str, state: str, start: int, end: int) -> list[str]:
    """What Spark's changelog of the state holds for versions ``start..end``: the API's change
    feed in the CDC layout (statequery.spark.cdc), version by version."""
    import pyarrow as pa

    from statequery.spark.cdc import cdc_batch

    batches = []
    for v in job.complete_versions():
        cid = v.checkpoint_id
        if start <= cid <= end:
            for b in job.changes(operator, state, start=cid, end=cid).to_batches():
                batches.append(cdc_batch(b, v.completed_at))
    return _arrow_rows(pa.Table.from_batches(batches)) if batches else []


def test_changes_from_version_is_the_change_feed(sq: Any, folder: Path) -> None:
    job = statequery.open_job(str(folder / DB))
    operator, state, table = _state(folder)
    expected = _cdc_rows(job, operator, state, 2, 4)
    assert expected
    kinds = {r.split("'_change_type': ")[1].split(",")[0] for r in expected}
    assert {"'insert'", "'update_preimage'", "'update_postimage'"} <= kinds
    df = sq.sql(f"SELECT * FROM sq.{DB}.{table} CHANGES FROM VERSION 2 TO VERSION 4")
    assert df.columns[-3:] == ["_change_type", "_commit_version", "_commit_timestamp"]
    assert _spark_rows(df) == expected
    # bounds: exclusive start, open end; the DataFrame reader's changes() reads the same
    df = sq.sql(f"SELECT * FROM sq.{DB}.{table} CHANGES FROM VERSION 2 EXCLUSIVE TO VERSION 4")
    assert _spark_rows(df) == _cdc_rows(job, operator, state, 3, 4)
    df = sq.read.option("startingVersion", "3").changes(f"sq.{DB}.{table}")
    assert _spark_rows(df) == _cdc_rows(job, operator, state, 3, 10**9)
    df = sq.sql(f"SELECT * FROM sq.{DB}.{table} CHANGES FROM VERSION 3 EXCLUSIVE "
                "TO VERSION 4 EXCLUSIVE")
    assert df.collect() == []


def test_changes_from_timestamp_reads_the_versions_completed_then(sq: Any, folder: Path) -> None:
    job = statequery.open_job(str(folder / DB))
    operator, state, table = _state(folder)
    sq.conf.set("spark.sql.session.timeZone", "UTC")
    # versions 3 (10:03) and 4 (10:04) completed in [10:02:30, 10:04:00]
    df = sq.sql(f"SELECT * FROM sq.{DB}.{table} CHANGES FROM TIMESTAMP '2026-11-27 10:02:30' "
                "TO TIMESTAMP '2026-11-27 10:04:00'")
    rows = _spark_rows(df)
    assert rows == _cdc_rows(job, operator, state, 3, 4)
    assert rows


def test_cdc_option_needs_the_change_feed() -> None:
    from statequery.exceptions import InvalidOptionError
    from statequery.spark import ReadOptions

    opts = ReadOptions.parse({"path": "/j", "table": "t__changes", "cdc": "true"})
    assert (opts.changes, opts.cdc) == (True, True)
    with pytest.raises(InvalidOptionError, match="needs changes=true"):
        ReadOptions.parse({"path": "/j", "table": "t", "cdc": "true"})
    with pytest.raises(InvalidOptionError, match="true or false"):
        ReadOptions.parse({"path": "/j", "table": "t__changes", "cdc": "yes"})


def test_net_changes_are_computed_by_spark_from_the_row_id(sq: Any, folder: Path) -> None:
    """deduplicationMode netChanges: Spark folds each entry's changes over versions 2..5 into
    one, from the entry's value before version 2 to its value at version 5."""
    job = statequery.open_job(str(folder / DB))
    operator, state, table = _state(folder)
    df = (sq.read.option("startingVersion", "2").option("endingVersion", "5")
          .option("deduplicationMode", "netChanges").option("computeUpdates", "true")
          .changes(f"sq.{DB}.{table}"))
    net = df.toArrow().to_pylist()
    # the net change is the diff of the version before the range with its last version
    from statequery.diff import diff_batches

    expected = set()
    for b in diff_batches(job.version(1), job.version(5), operator, state):
        for r in b.to_pylist():
            if r["change"] == "added":
                expected.add(("insert", r["key"], r["new_value"]))
            elif r["change"] == "removed":
                expected.add(("delete", r["key"], r["old_value"]))
            else:
                expected |= {("update_preimage", r["key"], r["old_value"]),
                             ("update_postimage", r["key"], r["new_value"])}
    assert {c for c, _, _ in expected} >= {"insert", "update_preimage"}
    assert {(r["_change_type"], r["key"], r["value"]) for r in net} == expected
