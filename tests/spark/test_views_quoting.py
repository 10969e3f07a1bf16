"""The generated view statements, run by a real Spark session, with hostile folder names."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from statequery.catalog.views import view_statements
from tests.conftest import fixture_dir

pytestmark = pytest.mark.spark


def test_hostile_folder_views_in_spark(tmp_path: Path) -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from statequery.spark.jvm import session_conf as jvm_session_conf

    name = "wc'; CREATE TABLE pwn AS SELECT 1; --"
    (tmp_path / name).symlink_to(fixture_dir("sql-hashmap-canonical"))
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("statequery-views")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.warehouse.dir", str(tmp_path / "warehouse"))
        .config(map=jvm_session_conf())
        .getOrCreate()
    )
    try:
        before = {t.name for t in spark.catalog.listTables()}
        statements = view_statements(str(tmp_path))
        for s in statements:
            spark.sql(s.rstrip(";"))
        views = {t.name for t in spark.catalog.listTables()} - before
        assert "pwn" not in views and not (tmp_path / "warehouse" / "pwn").exists()
        assert views == {s.split("`")[1] for s in statements}
        rows = spark.sql(
            "SELECT key.f0 AS word, value.f0 AS cnt FROM wc_create_table_pwn_as_select_1__"
            "groupaggregate_7__accstate WHERE key.f0 = 'w3'"
        ).collect()
        assert [(r["word"], r["cnt"]) for r in rows] == [("w3", 30)]
    finally:
        spark.stop()


@pytest.mark.parametrize(("args", "feature"), [
    (["spark-views"], "statequery spark-views"),
    (["attach", "--print"], "statequery attach"),
])
def test_core_install_names_the_missing_extra(args: list[str], feature: str) -> None:
    """Without sqlglot (a core install), the SQL-printing commands say which extra to install."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['sqlglot'] = None\n"
            f"from statequery.cli import main; sys.exit(main({args!r}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"statequery: {feature} needs the package 'sqlglot': pip install 'statequery[spark]'"
    )
