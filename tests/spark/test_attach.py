"""Savepoints as persistent databases in Spark: attach, detach, a second process reading them."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import statequery
from tests.conftest import expected_entries, fixture_dir

pytestmark = pytest.mark.spark

CANONICAL = "datastream-hashmap-canonical"
ROCKSDB = "datastream-rocksdb-native"
REPO = Path(__file__).resolve().parents[2]




def _tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*")) if p.is_file()
    }


def _counts(name: str, state: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in expected_entries(name):
        if e["state"] == state:
            out[e["key"]] = out.get(e["key"], 0) + 1
    return out


def test_attach_reads_and_detach_keeps_the_savepoint(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from pyspark.errors import PySparkException

    from statequery.exceptions import InvalidOptionError
    from statequery.spark.catalog import attach, detach

    sp_dir = tmp_path / "sp"
    shutil.copytree(fixture_dir(CANONICAL), sp_dir)
    before = _tree_digest(sp_dir)
    assert attach(spark, str(sp_dir), database="att") == ["att"]
    tables = {r["tableName"] for r in spark.sql("SHOW TABLES IN att").collect()}
    assert {"state_meta", "user_state__count", "user_state__profile"} <= tables
    got = {r["key"]: r["value"] for r in spark.table("att.user_state__count").collect()}
    assert got == {e["key"]: e["value"] for e in expected_entries(CANONICAL)
                   if e["state"] == "count"}
    comments = {r["col_name"]: r["comment"]
                for r in spark.sql("DESCRIBE att.user_state__count").collect()}
    assert comments["key"].startswith("STRING (")
    assert "value state 'count' of operator 'user-state'" in comments["key_group"]

    with pytest.raises(InvalidOptionError, match="already attached"):
        attach(spark, str(sp_dir), database="att")
    assert attach(spark, str(sp_dir), database="att", keep_unchanged=True) == ["att"]
    spark.sql("CREATE DATABASE not_ours")
    with pytest.raises(InvalidOptionError, match="not made by statequery"):
        attach(spark, str(sp_dir), database="not_ours", replace=True)
    with pytest.raises(InvalidOptionError, match="not made by statequery"):
        detach(spark, ["not_ours"])
    spark.sql("DROP DATABASE not_ours")

    # the files at the path become another savepoint: the table refuses to read them
    other = fixture_dir("sql-hashmap-canonical") / "_metadata"
    (sp_dir / "_metadata").write_bytes(other.read_bytes())
    with pytest.raises(PySparkException, match="is not the savepoint this table was set up over"):
        spark.table("att.user_state__count").count()
    shutil.rmtree(sp_dir)
    with pytest.raises(PySparkException, match=str(sp_dir)):
        spark.table("att.user_state__count").count()

    shutil.copytree(fixture_dir(CANONICAL), sp_dir)
    assert attach(spark, str(sp_dir), database="att", replace=True) == ["att"]
    assert spark.table("att.user_state__count").count() == 20
    assert detach(spark, ["att"]) == ["att"]
    assert not spark.catalog.databaseExists("att")
    assert _tree_digest(sp_dir) == before  # attach, read and detach never write there


def test_hostile_names_stay_identifiers(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import sqlglot

    from statequery.exceptions import InvalidOptionError
    from statequery.spark import view_statements
    from statequery.spark.catalog import attach, attach_plans, detach

    hostile = "db'; CREATE TABLE pwned AS SELECT 1; -- x\\"
    cat = tmp_path / "cat"
    shutil.copytree(fixture_dir(CANONICAL), cat / hostile)
    with pytest.raises(InvalidOptionError, match="letters, digits and _"):
        attach_plans(str(cat / hostile), database="quote`d")
    # the folder's name goes into string literals (path, comments), the database name is made
    # from it with letters, digits and _ only
    (plan,) = attach_plans(str(cat / hostile))
    assert plan.database == "db_create_table_pwned_as_select_1_x"
    statements = plan.statements(replace=True)
    for statement in statements:  # each is one statement, whatever the names hold
        assert len(sqlglot.parse(statement, dialect="spark")) == 1
    views = view_statements(str(cat))
    assert all(len(sqlglot.parse(v.rstrip(";"), dialect="spark")) == 1 for v in views)

    assert attach(spark, str(cat / hostile)) == [plan.database]
    assert spark.table(f"{plan.database}.user_state__count").count() == 20
    assert not spark.catalog.tableExists("pwned")
    detach(spark, [plan.database])


def _spark_sql(args: list[str], folder: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    from statequery.spark.session import spark_sql_argv

    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = sys.executable
    env["SPARK_HOME"] = str(Path(spark_sql_argv(folder)[0]).parent.parent)
    proc = subprocess.run(
        [*spark_sql_argv(folder, "local[2]"), "--conf", "spark.ui.enabled=false",
         "--conf", "spark.sql.python.filterPushdown.enabled=true", *args],
        capture_output=True, text=True, timeout=600, env=env, cwd=cwd,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def test_second_spark_sql_process_sees_attached_databases(tmp_path: Path) -> None:
    """Acceptance of issue 10: attach in one spark-sql process, query from another."""
    folder = tmp_path / "spark"
    script = tmp_path / "attach.sql"
    lines = []
    for name, db in ((CANONICAL, "canonical"), (ROCKSDB, "rocks")):
        out = subprocess.run(
            [sys.executable, "-m", "statequery.cli", "attach", "--print", "--database", db,
             str(fixture_dir(name))],
            capture_output=True, text=True, check=True, cwd=tmp_path,
        ).stdout
        lines.append(out)
    script.write_text("".join(lines))
    _spark_sql(["-f", str(script)], folder, tmp_path)

    count_rocks = _counts(ROCKSDB, "amount-by-category")
    total = sum(count_rocks.values())
    query = tmp_path / "query.sql"
    query.write_text(
        "SHOW DATABASES;\n"
        "SHOW TABLES IN rocks;\n"
        "DESCRIBE canonical.user_state__profile;\n"
        "SELECT concat('META:', count(*)) FROM canonical.state_meta;\n"
        "SELECT concat('PROFILE:', key, '=', value.address.zip) FROM canonical.user_state__profile"
        " WHERE key = 'user-1';\n"
        # the stale-reader sequence on a persistent table and a persistent view
        "SELECT concat('N:', count(*)) FROM rocks.user_state__amount_by_category"
        " WHERE key = 'user-3';\n"
        "SELECT concat('N:', count(*)) FROM rocks.user_state__amount_by_category;\n"
        "CREATE VIEW rocks.amounts AS SELECT key, value"
        " FROM rocks.user_state__amount_by_category;\n"
        "SELECT concat('V:', count(*)) FROM rocks.amounts WHERE key = 'user-3';\n"
        "SELECT concat('V:', count(*)) FROM rocks.amounts;\n"
        # a GROUP BY, and a join of two state tables of one savepoint
        "SELECT concat('G:', key, '=', count(*)) FROM rocks.user_state__amount_by_category"
        " GROUP BY key ORDER BY key;\n"
        "SELECT concat('J:', c.key, '=', c.value, '/', s.value) FROM rocks.user_state__count c"
        " JOIN rocks.user_state__sum_amount s ON c.key = s.key ORDER BY c.key;\n"
    )
    proc = _spark_sql(["-f", str(query)], folder, tmp_path)
    out = proc.stdout.splitlines()

    def tagged(tag: str) -> list[str]:
        return [ln[len(tag):] for ln in out if ln.startswith(tag)]

    assert {"canonical", "rocks", "default"} <= {ln.strip() for ln in out}
    rocks_tables = {r["table_name"] for r in
                    statequery.open(str(fixture_dir(ROCKSDB))).state_meta().to_pylist()}
    assert rocks_tables | {"state_meta"} <= {ln.strip() for ln in out}
    assert any(ln.startswith("key_group") and "value state 'profile'" in ln for ln in out)
    meta = statequery.open(str(fixture_dir(CANONICAL))).state_meta()
    assert tagged("META:") == [str(meta.num_rows)]
    zips = {e["key"]: e["value"]["address"]["zip"] for e in expected_entries(CANONICAL)
            if e["state"] == "profile"}
    assert tagged("PROFILE:") == [f"user-1={zips['user-1']}"]
    assert tagged("N:") == [str(count_rocks["user-3"]), str(total)]
    assert tagged("V:") == [str(count_rocks["user-3"]), str(total)]
    assert tagged("G:") == [f"{k}={n}" for k, n in sorted(count_rocks.items())]
    counts = {e["key"]: e["value"] for e in expected_entries(ROCKSDB) if e["state"] == "count"}
    sums = {e["key"]: e["value"] for e in expected_entries(ROCKSDB) if e["state"] == "sum-amount"}
    assert tagged("J:") == [f"{k}={counts[k]}/{sums[k]}" for k in sorted(counts) if k in sums]
    assert len(tagged("J:")) == 20


def test_cli_sql_spark(tmp_path: Path) -> None:
    env = dict(os.environ, STATEQUERY_SPARK_DIR=str(tmp_path / "spark"))
    cli = [sys.executable, "-m", "statequery.cli"]
    ok = subprocess.run(
        [*cli, "sql", "--spark", "--master", "local[1]", "--json",
         "SELECT key, value FROM user_activity.user_state__count WHERE key = 'user-3'"],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert [json.loads(ln) for ln in ok.stdout.splitlines()] == [{"key": "user-3", "value": 10}]
    assert "starting Spark" in ok.stderr and "databases of" in ok.stderr
    bad = subprocess.run(
        [*cli, "sql", "--spark", "--master", "local[1]", "SELECT * FROM user_activity.nope"],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )
    assert bad.returncode == 1
    assert "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1].startswith("statequery: ")
    assert not (tmp_path / "derby.log").exists() and not (tmp_path / "metastore_db").exists()
