"""``statequery.sql``: SELECT over catalog tables with sqlglot, key pushdown, the CLI."""

from __future__ import annotations

import datetime
import decimal
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import statequery
import statequery.reader
from statequery.catalog import Catalog
from statequery.cli import main
from statequery.exceptions import InvalidOptionError, NoSuchTableError
from tests.conftest import expected_entries, fixture_dir


@pytest.fixture()
def catalog() -> Catalog:
    return Catalog()


def test_count_of_one_key(catalog: Catalog) -> None:
    t = statequery.sql(
        "SELECT key, value FROM user_activity.user_state__count WHERE key = 'user-3'", catalog
    )
    assert isinstance(t, pa.Table)
    assert t.to_pylist() == [{"key": "user-3", "value": 10}]


def test_count_state_meta(catalog: Catalog) -> None:
    t = statequery.sql("SELECT count(*) AS n FROM user_activity.state_meta", catalog)
    assert t.to_pylist() == [{"n": 15}]
    by_kind = statequery.sql(
        "SELECT kind, count(*) AS n FROM user_activity.state_meta GROUP BY kind ORDER BY kind",
        catalog,
    ).to_pylist()
    meta = catalog.savepoint("user_activity").state_meta().column("kind").to_pylist()
    assert by_kind == [{"kind": k, "n": meta.count(k)} for k in sorted(set(meta))]


def test_default_catalog() -> None:
    t = statequery.sql("SELECT value FROM user_activity.user_state__count WHERE key = 'user-3'")
    assert t.column("value").to_pylist() == [10]


def _spy_reads(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What the scan planner (every front end's one path to the bytes) was asked to plan."""
    import statequery.scan

    calls: list[dict[str, Any]] = []
    real = statequery.scan.plan

    def spy(model: Any, ctx: Any, info: Any, **kw: Any) -> list[Any]:
        keys = kw.get("keys")
        calls.append(
            {
                "state": info.name,
                "key": None if keys is None else keys[0] if len(keys) == 1 else list(keys),
                "key_groups": kw.get("key_groups"),
                "mode": kw.get("mode"),
            }
        )
        return real(model, ctx, info, **kw)

    monkeypatch.setattr(statequery.scan, "plan", spy)
    return calls


def test_key_pushdown_reads_one_key_group(monkeypatch: pytest.MonkeyPatch) -> None:
    full_cat = Catalog()
    statequery.sql("SELECT key FROM user_activity.user_state__count", full_cat)
    full_bytes = sum(full_cat.io.stats.bytes_read.values())

    cat = Catalog()
    cat.savepoint("user_activity").state_meta()  # metadata read before measuring
    before = sum(cat.io.stats.bytes_read.values())
    calls = _spy_reads(monkeypatch)
    t = statequery.sql(
        "SELECT key_group, value FROM user_activity.user_state__count "
        "WHERE value > 0 AND key = 'user-3'",
        cat,
    )
    assert t.to_pylist() == [{"key_group": 40, "value": 10}]
    assert calls == [{"state": "count", "key": "user-3", "key_groups": None, "mode": None}]
    assert cat.savepoint("user_activity").key_group_of("user_state__count", "user-3") == 40
    # one key group of 128 read, not the whole state
    assert 0 < sum(cat.io.stats.bytes_read.values()) - before < full_bytes / 4


def test_in_pushdown_and_no_pushdown(monkeypatch: pytest.MonkeyPatch, catalog: Catalog) -> None:
    calls = _spy_reads(monkeypatch)
    t = statequery.sql(
        "SELECT key, value FROM user_activity.user_state__count "
        "WHERE key IN ('user-3', 'user-5', 'user-3') ORDER BY key",
        catalog,
    )
    assert t.column("key").to_pylist() == ["user-3", "user-5"]
    assert [c["key"] for c in calls] == ["user-3", "user-5"]
    calls.clear()
    # OR is not a top-level conjunct: the whole state is read and the executor filters
    t = statequery.sql(
        "SELECT key FROM user_activity.user_state__count "
        "WHERE key = 'user-3' OR key = 'user-5' ORDER BY key",
        catalog,
    )
    assert t.column("key").to_pylist() == ["user-3", "user-5"]
    assert [c["key"] for c in calls] == [None]


def test_nested_struct_fields(catalog: Catalog) -> None:
    rows = catalog.savepoint("user_activity").read("user_state__profile").to_pylist()
    t = statequery.sql(
        "SELECT p.key, p.value.address.city AS city, value.lastamount "
        "FROM user_activity.user_state__profile AS p WHERE p.value.tier = 'GOLD' ORDER BY p.key",
        catalog,
    )
    want = sorted(
        (r["key"], r["value"]["address"]["city"], r["value"]["lastAmount"])
        for r in rows
        if r["value"]["tier"] == "GOLD"
    )
    assert want
    assert t.column_names == ["key", "city", "lastamount"]  # DuckDB: the last name as written
    assert sorted(zip(*(c.to_pylist() for c in t.columns), strict=True)) == want
    # SELECT * gives the table's own columns, structs kept whole
    star = statequery.sql(
        "SELECT * FROM user_activity.user_state__profile WHERE key = 'user-3'", catalog
    )
    assert star.column_names == ["key_group", "key", "namespace", "value"]
    assert star.to_pylist() == [r for r in rows if r["key"] == "user-3"]


def test_sql_fixture_accstate(tmp_path: Path) -> None:
    (tmp_path / "sqlfix").symlink_to(fixture_dir("sql-hashmap-canonical"))
    cat = Catalog(str(tmp_path))
    want = {
        e["key"]["f0"]: e["value"]
        for e in expected_entries("sql-hashmap-canonical")
        if e["state"] == "accState"
    }
    t = statequery.sql(
        "SELECT key.f0 AS word, value.f0 AS cnt, value.f3 AS total, value.f5 AS latest "
        "FROM sqlfix.groupaggregate_7__accstate WHERE key = 'w13'",
        cat,
    )
    [row] = t.to_pylist()
    assert row["word"] == "w13"
    assert row["cnt"] == want["w13"]["f0"]
    assert row["total"] == decimal.Decimal(want["w13"]["f3"])
    assert row["latest"] == datetime.datetime(1970, 1, 1) + datetime.timedelta(
        microseconds=want["w13"]["f5"] // 1000
    )
    agg = statequery.sql(
        "SELECT count(*) AS n, sum(value.f0) AS c, sum(value.f3) AS s "
        "FROM sqlfix.groupaggregate_7__accstate",
        cat,
    ).to_pylist()
    assert agg == [{
        "n": len(want),
        "c": sum(v["f0"] for v in want.values()),
        "s": sum(decimal.Decimal(v["f3"]) for v in want.values()),
    }]
    late = statequery.sql(
        "SELECT key.f0 AS w FROM sqlfix.groupaggregate_7__accstate "
        "WHERE value.f5 > CAST('2024-01-01 00:08:09' AS TIMESTAMP)",
        cat,
    ).column("w").to_pylist()
    cutoff = int(datetime.datetime(2024, 1, 1, 0, 8, 9, tzinfo=datetime.timezone.utc).timestamp())
    assert sorted(late) == sorted(w for w, v in want.items() if v["f5"] > cutoff * 10**9)


def test_join_and_cte(catalog: Catalog) -> None:
    t = statequery.sql(
        "SELECT c.key, c.value AS n, p.value.tier AS tier "
        "FROM user_activity.user_state__count c JOIN user_activity.user_state__profile p "
        "ON c.key = p.key WHERE c.key = 'user-3'",
        catalog,
    )
    assert t.to_pylist() == [{"key": "user-3", "n": 10, "tier": "GOLD"}]
    counts = catalog.savepoint("user_activity").read("user_state__count").column("value")
    m = statequery.sql(
        "WITH c AS (SELECT key, value FROM user_activity.user_state__count) "
        "SELECT max(value) AS m FROM c",
        catalog,
    )
    assert m.to_pylist() == [{"m": max(counts.to_pylist())}]


def test_empty_result_keeps_types(catalog: Catalog) -> None:
    t = statequery.sql(
        "SELECT key_group, key, value FROM user_activity.user_state__count WHERE key = 'nope'",
        catalog,
    )
    assert t.num_rows == 0
    assert t.schema.field("key_group").type == pa.int32()
    assert t.schema.field("value").type == pa.int64()


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ("SELEC key FROM user_activity.state_meta", InvalidOptionError),
        ("DELETE FROM user_activity.state_meta", InvalidOptionError),
        ("INSERT INTO user_activity.state_meta VALUES (1)", InvalidOptionError),
        ("SELECT * FROM user_activity.no_such_table", NoSuchTableError),
        ("SELECT * FROM no_such_db.state_meta", NoSuchTableError),
        ("SELECT * FROM state_meta", NoSuchTableError),
        ("SELECT 1", InvalidOptionError),
    ],
)
def test_errors(catalog: Catalog, query: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        statequery.sql(query, catalog)


def test_cli_sql_json(capsys: pytest.CaptureFixture[str]) -> None:
    q = "SELECT key, value FROM user_activity.user_state__count WHERE key IN ('user-3', 'user-5')"
    assert main(["sql", q, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    assert sorted(rows, key=lambda r: r["key"]) == [
        {"key": "user-3", "value": 10},
        {"key": "user-5", "value": 10},
    ]


def test_cli_sql_table_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sql", "SELECT count(*) AS n FROM user_activity.state_meta",
                 "--catalog", str(Path(statequery.catalog.DEFAULT_CATALOG))]) == 0
    out = capsys.readouterr().out
    assert "15" in out
    assert main(["sql", "DROP TABLE user_activity.state_meta"]) == 1
    assert "only SELECT" in capsys.readouterr().err
    assert main(["sql", "SELECT * FROM user_activity.nope"]) == 1
    assert "no table 'nope'" in capsys.readouterr().err


def test_operator_table_joins_states_in_one_read(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``user_activity.user_state``: every keyed state of the operator, one read of its files."""
    sp = catalog.savepoint("user_activity")
    counts = {r["key"]: r["value"] for r in sp.read("user-state", "count").to_pylist()}
    sums = {r["key"]: r["value"] for r in sp.read("user-state", "sum-amount").to_pylist()}
    t = statequery.sql(
        "SELECT key, max(count.value) AS c, max(sum_amount.value) AS s "
        "FROM user_activity.user_state GROUP BY key ORDER BY key",
        catalog,
    )
    assert t.to_pylist() == [{"key": k, "c": counts[k], "s": sums[k]} for k in sorted(counts)]
    # the key predicate reads one key group, and keeps every state's rows of the key
    read = []
    from statequery.savepoint import Savepoint

    original = Savepoint.read_operator

    def spy(self: Any, operator: Any, states: Any = None, **kw: Any) -> Any:
        read.append(kw.get("key"))
        return original(self, operator, states, **kw)

    monkeypatch.setattr(Savepoint, "read_operator", spy)
    one = statequery.sql(
        "SELECT state, key FROM user_activity.user_state WHERE key = 'user-3' ORDER BY state",
        catalog,
    )
    assert read == ["user-3"]
    assert {r["key"] for r in one.to_pylist()} == {"user-3"}
    assert [r["state"] for r in one.to_pylist()].count("amount-by-category") == 4
    assert len(one) == 4 + 7  # four map entries, one row in each other keyed state
