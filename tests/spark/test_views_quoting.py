"""The generated view statements, run by a real Spark session, with hostile folder names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from statequery.catalog.views import view_statements
from tests.conftest import fixture_dir

pytestmark = pytest.mark.spark


def test_hostile_folder_views_in_spark(  # type: ignore[no-untyped-def]
    spark, spark_warehouse: Path, tmp_path: Path,
) -> None:
    name = "wc'; CREATE TABLE pwn AS SELECT 1; --"
    (tmp_path / name).symlink_to(fixture_dir("sql-hashmap-canonical"))
    before = {t.name for t in spark.catalog.listTables()}
    statements = view_statements(str(tmp_path))
    # the views stay to the end of the module (tests/conftest.py's spark drops them then)
    for s in statements:
        spark.sql(s.rstrip(";"))
    views = {t.name for t in spark.catalog.listTables()} - before
    assert "pwn" not in views and not (spark_warehouse / "pwn").exists()
    assert views == {s.split("`")[1] for s in statements}
    rows = spark.sql(
        "SELECT key.f0 AS word, value.f0 AS cnt FROM wc_create_table_pwn_as_select_1__"
        "groupaggregate_7__accstate WHERE key.f0 = 'w3'"
    ).collect()
    assert [(r["word"], r["cnt"]) for r in rows] == [("w3", 30)]


@pytest.mark.parametrize(("args", "feature"), [
    (["spark-views"], "statequery spark-views"),
    (["attach", "--print"], "statequery attach"),
])
def test_core_install_names_the_missing_extra(args: list[str], feature: str) -> None:
    """Without sqlglot (a core install), the SQL-printing commands say which extra to install."""
    import subprocess

    code = ("import sys; sys.modules['sqlglot'] = None\n"
            f"from statequery.cli import main; sys.exit(main({args!r}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"statequery: {feature} needs the package 'sqlglot': pip install 'statequery[spark]'"
    )
