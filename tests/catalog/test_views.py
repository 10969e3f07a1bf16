"""``statequery spark-views``: statements built by sqlglot, safe for hostile folder names."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlglot
from sqlglot import exp

from statequery.catalog import Catalog
from statequery.catalog.views import view_statement, view_statements
from statequery.cli import main
from tests.conftest import fixture_dir

HOSTILE = [
    "x'; CREATE TABLE pwn AS SELECT 1; --",
    'y"`; DROP VIEW v; -- *',
    "z\\'; SELECT 2; --",
    "w\n;CREATE TABLE pwn2 USING parquet AS SELECT 1",
    "v`) OPTIONS (path 'etc') --",
]


@pytest.fixture()
def hostile_catalog(tmp_path: Path) -> Path:
    for i, name in enumerate(HOSTILE):
        fixture = "datastream-hashmap-canonical" if i % 2 else "sql-hashmap-canonical"
        (tmp_path / name).symlink_to(fixture_dir(fixture))
    return tmp_path


def _options(create: exp.Expr) -> dict[str, str]:
    props = create.find(exp.OptionsProperty)
    assert props is not None
    return {p.this.name: p.args["value"].this for p in props.expressions}


def test_hostile_folder_names_stay_literals(hostile_catalog: Path) -> None:
    cat = Catalog(str(hostile_catalog))
    statements = view_statements(str(hostile_catalog))
    want = [(db, t) for db in cat.databases() for t in cat.tables(db)]
    assert len(statements) == len(want) > len(HOSTILE)
    script = "\n".join(statements)
    parsed = [s for s in sqlglot.parse(script, read="spark") if s is not None]
    # the whole script is exactly one CREATE TEMPORARY VIEW per table, nothing else
    assert len(parsed) == len(want)
    for tree, (db, table) in zip(parsed, want, strict=True):
        assert isinstance(tree, exp.Create) and tree.args["kind"] == "VIEW"
        assert tree.find(exp.TemporaryProperty) is not None
        assert _options(tree) == {"path": cat.location(db), "table": table}
        assert not list(tree.find_all(exp.Select))


def test_view_statement_quotes_every_part() -> None:
    nasty = "a`b'c\\d\n;e"
    tree = sqlglot.parse_one(view_statement(nasty, nasty, nasty), read="spark")
    assert isinstance(tree, exp.Create)
    assert tree.this.name == nasty
    assert _options(tree) == {"path": nasty, "table": nasty}


def test_cli_spark_views(hostile_catalog: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spark-views", "--catalog", str(hostile_catalog)]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines() == "\n".join(view_statements(str(hostile_catalog))).split(
        "\n"
    )
    parsed = sqlglot.parse(out, read="spark")
    assert all(isinstance(t, exp.Create) for t in parsed if t is not None)
