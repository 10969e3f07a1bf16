"""``statequery.sql`` runs no code and reaches nothing but the catalog tables it read.

The engine is DuckDB, locked down (docs/sql.md); sqlglot only accepts one query. Each attempt below
must end in a typed error or plain rows, and must leave no file, request or process behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import statequery
from statequery.catalog import Catalog
from statequery.exceptions import InvalidOptionError, NoSuchTableError, StatequeryError
from statequery.sql import _connect, _lock
from tests.loopback import CountingServer, counting_http_server


@pytest.fixture()
def catalog() -> Catalog:
    return Catalog()


@pytest.fixture()
def server() -> Iterator[CountingServer]:
    with counting_http_server() as s:
        yield s


def test_issue_payload_runs_nothing(tmp_path: Path, catalog: Catalog) -> None:
    """The JSON-path literal that made sqlglot's Python executor run a shell command."""
    marker = tmp_path / "pwned"
    query = (
        "SELECT JSON_EXTRACT(key, '$[\"a'' + str(__import__(''os'').system(''touch "
        f"{marker}'')) + ''b\"]') AS x FROM user_activity.user_state__count"
    )
    with pytest.raises(InvalidOptionError, match="cannot run the query"):
        statequery.sql(query, catalog)
    assert not marker.exists()
    # the same text as a plain string (Spark SQL escapes quotes with a backslash) is a string
    t = statequery.sql(
        f"SELECT '__import__(\\'os\\').system(\\'touch {marker}\\')' AS s "
        "FROM user_activity.user_state__count WHERE key = 'user-3'",
        catalog,
    )
    assert t.to_pylist() == [{"s": f"__import__('os').system('touch {marker}')"}]
    assert not marker.exists()


def _attempts(marker: Path, url: str) -> list[str]:
    t = "user_activity.user_state__count"
    return [
        # stacked statements
        f"SELECT key FROM {t}; DROP TABLE x",
        f"SELECT key FROM {t}; COPY (SELECT 1) TO '{marker}'",
        f"SELECT key FROM {t}; SELECT * FROM read_csv('/etc/passwd')",
        # statements that are not queries
        f"COPY (SELECT key FROM {t}) TO '{marker}'",
        f"ATTACH '{marker}' AS x",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "PRAGMA version",
        "CALL pragma_version()",
        f"CREATE TABLE x AS SELECT * FROM {t}",
        f"INSERT INTO {t} VALUES (1)",
        f"EXPORT DATABASE '{marker}'",
        f"EXPLAIN COPY (SELECT 1) TO '{marker}'",
        f"EXPLAIN ANALYZE SELECT key FROM {t}",
        f"SELECT key INTO x FROM {t}",
        # functions and literals that touch files or the network
        "SELECT * FROM read_csv('/etc/passwd')",
        f"SELECT * FROM read_csv('{url}/x.csv')",
        f"SELECT * FROM read_parquet('{url}/x.parquet')",
        "SELECT * FROM read_text('/etc/passwd')",
        "SELECT * FROM read_blob('/etc/passwd')",
        "SELECT * FROM glob('/etc/*')",
        f"SELECT * FROM '{url}/x.csv'",
        f"SELECT * FROM `{url}/x.csv`",
        "SELECT * FROM '/etc/passwd'",
        f"SELECT * FROM {t}, query('SELECT 1')",
        f"SELECT * FROM {t}, range(10)",
        f"SELECT (SELECT count(*) FROM read_csv('{url}/y.csv')) AS n FROM {t}",
        f"WITH x AS (SELECT * FROM read_csv('{url}/z.csv')) SELECT * FROM x",
        f"SELECT key FROM {t} UNION ALL SELECT * FROM read_text('/etc/passwd')",
        f"SELECT read_text('/etc/passwd') FROM {t}",
        f"SELECT getenv('HOME') FROM {t}",
        f"SELECT key FROM {t} JOIN os ON true",  # a Python name in the caller's scope
        # quotes and comments that try to close the literal or the comment they sit in
        f"SELECT key FROM {t} WHERE key = 'user-3''; COPY (SELECT 1) TO ''{marker}''; --'",
        f"SELECT key FROM {t} -- */; COPY (SELECT 1) TO '{marker}'; /*",
        f"SELECT key /* */; COPY (SELECT 1) TO '{marker}'; /* */ FROM {t}",
        f"SELECT \"key\"\"; COPY (SELECT 1) TO '{marker}'; --\" FROM {t}",
        f"SELECT `key``; COPY (SELECT 1) TO '{marker}'; --` FROM {t}",
    ]


def test_injection_attempts_find_no_way_out(
    tmp_path: Path, catalog: Catalog, server: CountingServer
) -> None:
    marker = tmp_path / "marker"
    outcomes: dict[str, str] = {}
    rows = catalog.savepoint("user_activity").read("user_state__count").num_rows
    for query in _attempts(marker, server.url):
        try:
            t = statequery.sql(query, catalog)
        except (InvalidOptionError, NoSuchTableError) as e:
            outcomes[query] = type(e).__name__
            continue
        # what runs is one SELECT over the catalog table: one column, at most its rows
        assert t.num_columns == 1 and t.num_rows <= rows, query
        outcomes[query] = "rows"
    assert not marker.exists()
    assert list(tmp_path.iterdir()) == []
    assert server.requests == []
    # only three run, as the plain SELECTs they are: a key with a quote in it, a comment, and a
    # Spark string constant ("..." is a string in Spark SQL); the stacked ones are refused
    ran = [q for q, o in outcomes.items() if o == "rows"]
    attempts = _attempts(marker, server.url)
    assert ran == [attempts[-5], attempts[-4], attempts[-2]], ran


def test_duckdb_connection_is_locked_down(tmp_path: Path, server: CountingServer) -> None:
    """Even a statement that got past sqlglot could not reach files or the network."""
    import duckdb
    import pyarrow as pa

    marker = tmp_path / "marker"
    (tmp_path / "secret.csv").write_text("a\n1\n")
    con = _connect()
    con.register("t", pa.table({"a": [1]}))
    _lock(con)
    statements = [
        f"SELECT * FROM read_csv('{tmp_path / 'secret.csv'}')",
        f"SELECT * FROM read_csv('{server.url}/x.csv')",
        f"SELECT * FROM '{server.url}/x.parquet'",
        f"COPY (SELECT 1) TO '{marker}'",
        f"ATTACH '{marker}' AS x",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "SET lock_configuration = false",
        "SET autoload_known_extensions = true",
        "SET python_enable_replacements = true",
        "RESET enable_external_access",
        "SELECT * FROM pa",  # a Python variable in scope
    ]
    try:
        for s in statements:
            with pytest.raises(duckdb.Error):
                con.execute(s).fetchall()
        assert con.execute("SELECT a FROM t").fetchall() == [(1,)]
        assert con.execute("SELECT current_setting('enable_external_access')").fetchall() == [
            (False,)
        ]
    finally:
        con.close()
    assert not marker.exists()
    assert server.requests == []


def test_explain_and_spark_dialect(catalog: Catalog) -> None:
    plan = statequery.sql(
        "EXPLAIN SELECT key FROM user_activity.user_state__count WHERE key = 'user-3'", catalog
    )
    assert plan.column_names == ["explain_key", "explain_value"]
    assert "ARROW" in "".join(plan.column("explain_value").to_pylist()).upper()
    want = catalog.savepoint("user_activity").read(
        "user_state__recent_categories", key="user-3"
    ).column("value").to_pylist()[0]
    # Spark SQL: backquoted names, 0-based [] on arrays, size()
    t = statequery.sql(
        "SELECT `key`, value[0] AS first, value[1] AS second, size(value) AS n "
        "FROM user_activity.user_state__recent_categories WHERE key = 'user-3'",
        catalog,
    )
    assert t.to_pylist() == [{"key": "user-3", "first": want[0], "second": want[1],
                              "n": len(want)}]


def test_missing_duckdb_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "duckdb", None)  # import duckdb raises ImportError
    with pytest.raises(StatequeryError, match=r"statequery\[sql\]"):
        statequery.sql("SELECT key FROM user_activity.user_state__count")
