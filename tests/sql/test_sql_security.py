"""``statequery.sql`` runs no code and reaches nothing but the catalog tables it read.

The engine is DuckDB, locked down (docs/sql.md); sqlglot only accepts one query. Each attempt below
must end in a typed error or plain rows, and must leave no file, request or process behind.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.loopback import CountingServer, counting_http_server

import statequery
from statequery.catalog import Catalog
from statequery.exceptions import InvalidOptionError, NoSuchTableError, StatequeryError
from statequery.sql import _connect, _lock

sqlmod = sys.modules["statequery.sql"]  # the package attribute is the function


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


# -- issue 31 item 6: DuckDB's own catalog is out of reach ----------------------------------------

T = "user_activity.user_state__count"

#: queries naming what DuckDB would find in its own catalog (settings, the list of tables, the
#: registered tables under the names statequery used to give them)
CATALOG_ESCAPES = [
    # the issue's: a CTE named like a DuckDB view, read outside the subquery that defines it
    f"SELECT s.name, s.setting FROM {T} a CROSS JOIN (WITH pg_settings AS (SELECT 1 AS x) "
    "SELECT x FROM pg_settings) b CROSS JOIN pg_settings s",
    f"SELECT s.* FROM {T} a CROSS JOIN (WITH __sq_t0 AS (SELECT 1 AS x) SELECT x FROM __sq_t0) b "
    "CROSS JOIN __sq_t0 s",
    f"SELECT key FROM {T} WHERE key IN (WITH sqlite_master AS (SELECT 'x' AS k) "
    "SELECT k FROM sqlite_master) UNION ALL SELECT name FROM sqlite_master",
    f"SELECT (SELECT count(*) FROM (WITH duckdb_tables AS (SELECT 1) SELECT 1) q) AS n, t.* "
    f"FROM {T} a, duckdb_tables t",
    # a CTE's own name in its body (not RECURSIVE), and a CTE defined after the one reading it
    f"WITH pg_settings AS (SELECT * FROM pg_settings) SELECT p.* FROM pg_settings p, {T}",
    f"WITH a AS (SELECT * FROM duckdb_settings), duckdb_settings AS (SELECT 1 AS x) "
    f"SELECT a.* FROM a, {T}",
]
#: other ways to name DuckDB's catalog objects (refused before issue 31 too: kept as a guard)
OTHER_NAMES = [
    f"SELECT * FROM {T}, pg_settings",
    f"SELECT * FROM {T}, `pg_settings`",
    f"SELECT * FROM {T}, sqlite_master",
    f"SELECT * FROM {T}, duckdb_settings",
    f"SELECT * FROM {T}, information_schema.tables",
    f"SELECT * FROM {T}, `information_schema`.`tables`",
    f"SELECT * FROM {T}, pg_catalog.pg_settings",
    f"SELECT * FROM {T}, main.__sq_t0",
    f"SELECT * FROM {T}, memory.main.__sq_t0",
    f"SELECT * FROM {T}, system.main.duckdb_settings",
    f"SELECT * FROM {T}, duckdb_settings()",
    f"SELECT * FROM {T}, LATERAL duckdb_tables()",
    f"SELECT (SELECT count(*) FROM pg_settings) AS n FROM {T}",
    f"SELECT key FROM {T} WHERE EXISTS (SELECT 1 FROM information_schema.columns)",
]


@pytest.fixture()
def runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The DuckDB texts that reached ``_run`` (what DuckDB was given)."""
    seen: list[str] = []
    real = sqlmod._run

    def spy(worker: object, text: str, *args: object) -> object:
        seen.append(text)
        return real(worker, text, *args)

    monkeypatch.setattr(sqlmod, "_run", spy)
    return seen


@pytest.mark.parametrize("query", CATALOG_ESCAPES)
def test_duckdb_catalog_names_are_refused(query: str, catalog: Catalog, runs: list[str]) -> None:
    """A bare name is a CTE only where that CTE is in scope; nothing else reaches DuckDB."""
    with pytest.raises((NoSuchTableError, InvalidOptionError)):
        statequery.sql(query, catalog)
    assert runs == []


def test_other_names_of_duckdb_catalog_objects_are_refused(
    catalog: Catalog, runs: list[str]
) -> None:
    for query in OTHER_NAMES:
        with pytest.raises((NoSuchTableError, InvalidOptionError)):
            statequery.sql(query, catalog)
    assert runs == []


@pytest.mark.parametrize("query", CATALOG_ESCAPES + OTHER_NAMES[:4])
def test_duckdb_plan_reads_only_the_registered_tables(
    query: str, catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defence in depth: were the scope check wrong (every bare name taken for a CTE in scope),
    DuckDB's plan of the query is checked before it runs: a scan of ``pg_settings``'s
    ``duckdb_settings()``, of ``duckdb_tables()``, or of a name no registered table has, is
    refused; the registered tables have names no query can write."""
    monkeypatch.setattr(sqlmod, "_cte_in_scope", lambda node: True)
    with pytest.raises(InvalidOptionError,
                       match=r"which is not a catalog table|Table with name \S+ does not exist"):
        statequery.sql(query, catalog)


def test_registered_tables_have_unguessable_names(catalog: Catalog, runs: list[str]) -> None:
    q = f"SELECT a.key FROM {T} a JOIN {T} b ON a.key = b.key WHERE a.key = 'user-3'"
    assert statequery.sql(q, catalog).to_pylist() == [{"key": "user-3"}]
    assert statequery.sql(q, catalog).to_pylist() == [{"key": "user-3"}]
    names = [re.findall(r'"(__sq_[^"]*)"', text) for text in runs]
    assert all(len(n) == 2 and all(re.fullmatch(r"__sq_[0-9a-f]{16}_[01]", x) for x in n)
               for n in names), names
    assert set(names[0]).isdisjoint(names[1])


CTES_IN_SCOPE = [
    (f"WITH x AS (SELECT key FROM {T} WHERE key = 'user-3') SELECT key FROM x", 1),
    (f"WITH x AS (SELECT key FROM {T}), y AS (SELECT key FROM x WHERE key = 'user-3') "
     "SELECT key FROM y UNION ALL SELECT key FROM x WHERE key = 'user-4'", 2),
    (f"WITH x AS (SELECT key FROM {T}) SELECT count(*) AS key FROM x WHERE key IN "
     "(SELECT key FROM x WHERE key = 'user-3')", 1),
    (f"WITH x AS (SELECT key FROM {T}) SELECT key FROM (WITH y AS (SELECT key FROM x) "
     "SELECT key FROM y) q WHERE key = 'user-3'", 1),
    (f"WITH x AS (SELECT key FROM {T}) SELECT key FROM {T} WHERE key = 'user-3' "
     "AND EXISTS (SELECT 1 FROM x)", 1),
    ("WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r WHERE n < 5) "
     f"SELECT count(*) AS key FROM r, {T} WHERE key = 'user-3'", 1),
]


@pytest.mark.parametrize(("query", "rows"), CTES_IN_SCOPE)
def test_ctes_in_scope_still_work(query: str, rows: int, catalog: Catalog) -> None:
    assert statequery.sql(query, catalog).num_rows == rows
