"""``statequery sql --classpath``: the job's jar reaches every table the query reads, so Kryo
values are structs (without it: bytes with a reason), as with ``read``/``lookup --classpath``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from statequery.cli import main
from tests.conftest import FIXTURES, fixture_dir

NAME = "types-kryo-hashmap-canonical"


def _catalog(tmp_path: Path) -> Path:
    """A catalog whose database is the savepoint alone (no job.jar beside it)."""
    (tmp_path / "kryo_types").symlink_to(fixture_dir(NAME))
    return tmp_path


def _rows(capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]


QUERY = ("SELECT o.key, o.value.customer AS customer, o.value_reason AS o_reason, "
         "s.value_reason AS s_reason FROM kryo_types.kryo_types__order o "
         "JOIN kryo_types.kryo_types__shapes s ON o.key = s.key ORDER BY o.key")


def test_sql_classpath_decodes_kryo_values_of_every_table(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cat = str(_catalog(tmp_path))
    jar = str(FIXTURES / NAME / "job.jar")
    assert main(["sql", QUERY, "--catalog", cat, "--json", "--classpath", jar]) == 0
    rows = _rows(capsys)
    assert {"", "a", "plain ascii"} <= {r["customer"] for r in rows}
    assert all(r["o_reason"] is None and r["s_reason"] is None for r in rows)


def test_sql_without_classpath_keeps_bytes_naming_the_option(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cat = str(_catalog(tmp_path))
    assert main(["sql", "SELECT value_reason FROM kryo_types.kryo_types__order",
                 "--catalog", cat, "--json"]) == 0
    rows = _rows(capsys)
    assert rows and all("--classpath" in str(r["value_reason"]) for r in rows)


def test_sql_classpath_missing_jar_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cat = str(_catalog(tmp_path))
    missing = str(tmp_path / "missing.jar")
    assert main(["sql", QUERY, "--catalog", cat, "--classpath", missing]) != 0
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_sql_api_classpath_with_a_catalog_object(tmp_path: Path) -> None:
    """``statequery.sql(..., classpath=)`` over a Catalog already opened without it: the query
    reads with the jar, the Catalog given stays as it was."""
    import statequery
    from statequery.catalog import Catalog

    cat = Catalog(str(_catalog(tmp_path)))
    query = "SELECT value_reason FROM kryo_types.kryo_types__order"
    assert all(r["value_reason"] for r in statequery.sql(query, cat).to_pylist())
    jar = FIXTURES / NAME / "job.jar"
    rows = statequery.sql(query, cat, classpath=[str(jar)]).to_pylist()
    assert len(rows) == 8 and all(r["value_reason"] is None for r in rows)
    assert cat.classpath is None
