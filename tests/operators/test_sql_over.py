"""OVER aggregations with fired frames, read from savepoints Flink 2.3.0 wrote (docs/decoding.md,
"OVER aggregation"; docs/fixtures.md, ``sql-over-*``).

The fixtures come from one job (examples/flink-jobs/sql_operators_job.py ``--job over``): one
OVER aggregation per Flink function, event time (watermark five minutes behind: the frames of ids
0..54 fired, ids 55..59 wait) and processing time (every row computed on arrival). That every
state equals Flink's own restore entry by entry (on both decode paths) is checked for all
fixtures by tests/reader/test_reader.py; here: the names the compiled plan gives and what the
rows mean.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import statequery
from tests.conftest import FIXTURES, fixture_dir

OVER = ["sql-over-hashmap-canonical", "sql-over-rocksdb-native"]
PLAN = str(FIXTURES / "plans" / "sql-over.json")
N_EVENTS, N_USERS = 60, 6
CATEGORIES = ["books", "games", "music"]
TS_BASE, MINUTE = 1_700_000_000_000, 60_000
FIRED = 55  # ids 0..54: the watermark is ts(59) - 5 min = ts(54)

# node id -> (Flink function, accumulator type with the plan attached)
NODES = {
    5: ("RowTimeRowsBoundedPrecedingFunction",
        "ROW<sum3.count BIGINT, sum3 INTEGER, n3 BIGINT>"),
    8: ("RowTimeRangeBoundedPrecedingFunction",
        "ROW<max_30m ROW<max INTEGER, mapSize BIGINT, map RAW(org.apache.flink.table.api.dataview."
        "MapView)>, avg_30m.count BIGINT, avg_30m.sum INTEGER, count1 BIGINT>"),
    14: ("RowTimeUnboundedPrecedingOverFunctionV2 (ROWS)",
         "ROW<running_min INTEGER, running_cnt BIGINT>"),
    18: ("RowTimeUnboundedPrecedingOverFunctionV2 (RANGE)", "ROW<max_id BIGINT, seen BIGINT>"),
    25: ("ProcTimeRowsBoundedPrecedingFunction",
         "ROW<proc_max4 ROW<max INTEGER, mapSize BIGINT, map RAW(org.apache.flink.table.api."
         "dataview.MapView)>, proc_cnt4 BIGINT>"),
    32: ("ProcTimeRangeBoundedPrecedingFunction",
         "ROW<proc_total.count BIGINT, proc_total BIGINT, count1 BIGINT>"),
    35: ("ProcTimeUnboundedPrecedingFunction", "ROW<proc_max_id BIGINT>"),
}


def _event(i: int) -> dict[str, Any]:
    return {"id": i, "user": f"user-{i % N_USERS}", "amount": (i * 37) % 101,
            "category": CATEGORIES[(i // 10) % 3], "ts": TS_BASE + i * MINUTE}


EVENTS = [_event(i) for i in range(N_EVENTS)]


def _open(name: str, plan: str | None = PLAN) -> Any:
    return statequery.open(str(fixture_dir(name)), use_snapshot=False, plan=plan)


def _read(sp: Any, node: int, state: str) -> list[dict[str, Any]]:
    return sp.read(f"{node}_over-aggregate", state).to_pylist()


def _by_key(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in rows:
        (k,) = r["key"].values()
        assert k not in out
        out[k] = r["value"]
    return out


def test_plan_names_every_accumulator() -> None:
    """The accumulators are named after the query's columns: a SUM the planner split into COUNT
    and $SUM0 (``sum3.count``, ``sum3``), an AVG into COUNT and $SUM0 (``.count``, ``.sum``),
    ``count1`` where a bounded frame retracts and the query has no COUNT(*)."""
    sp = _open(OVER[0])
    meta = {r["table_name"]: r for r in sp.state_meta().to_pylist()}
    for node, (_, acc) in NODES.items():
        row = meta[f"{node}_over_aggregate__accstate"]
        assert row["value_type"] == acc, node
        assert row["reason"] is None
    # the buffered rows carry the input's column names, keyed by their time (epoch ms)
    assert meta["5_over_aggregate__inputstate"]["value_type"] == (
        "ARRAY<ROW<id BIGINT, user STRING, amount INTEGER, rowtime TIMESTAMP_LTZ(3)>>")
    assert meta["5_over_aggregate__inputstate"]["user_key_type"] == "BIGINT"
    assert meta["5_over_aggregate__inputstate"]["key_type"] == "ROW<user STRING>"
    # without the plan: f0, f1, ...
    bare = {r["table_name"]: r for r in _open(OVER[0], plan=None).state_meta().to_pylist()}
    acc = next(r for t, r in bare.items() if t.startswith("5_over") and t.endswith("accstate"))
    assert acc["value_type"] == "ROW<f0 BIGINT, f1 INTEGER, f2 BIGINT>"


@pytest.mark.parametrize("name", OVER)
def test_event_time_frames(name: str, decode_path: str) -> None:
    """The event-time functions fired every row up to the watermark: their accumulators hold the
    frame of each key's last fired row; the rows after the watermark wait in ``inputState`` with
    an event-time timer each."""
    sp = _open(name)
    fired = EVENTS[:FIRED]
    for u in range(N_USERS):
        user = f"user-{u}"
        mine = [e for e in fired if e["user"] == user]
        last = mine[-1]
        rows3 = _by_key(_read(sp, 5, "accState"))[user]
        frame = [e["amount"] for e in mine[-3:]]
        assert rows3 == {"sum3.count": 3, "sum3": sum(frame), "n3": 3}
        assert _by_key(_read(sp, 5, "lastTriggeringTsState"))[user] == last["ts"]
        range30 = _by_key(_read(sp, 8, "accState"))[user]
        frame = [e["amount"] for e in mine if e["ts"] >= last["ts"] - 30 * MINUTE]
        assert range30 == {"max_30m": {"max": max(frame), "mapSize": len(set(frame)),
                                       "map": None},
                           "avg_30m.count": len(frame), "avg_30m.sum": sum(frame),
                           "count1": len(frame)}
        # the MAX's map view holds the frame's values with their counts
        view = {r["user_key"]: r["value"] for r in _read(sp, 8, "agg0$map")
                if r["key"]["user"] == user}
        assert view == {a: frame.count(a) for a in frame}
        assert _by_key(_read(sp, 18, "accState"))[user] == {"max_id": last["id"],
                                                            "seen": len(mine)}
    for cat in CATEGORIES:
        mine = [e["amount"] for e in fired if e["category"] == cat]
        assert _by_key(_read(sp, 14, "accState"))[cat] == {"running_min": min(mine),
                                                           "running_cnt": len(mine)}
    for node in (5, 8, 14, 18):
        buffered = _read(sp, node, "inputState")
        waiting = [r for r in buffered if r["user_key"] > EVENTS[FIRED - 1]["ts"]]
        ids = sorted(row["id"] for r in waiting for row in r["value"])
        assert ids == list(range(FIRED, N_EVENTS)), node
        for r in buffered:
            for row in r["value"]:
                # keyed by the row's event time; the row as the input had it
                assert r["user_key"] == TS_BASE + row["id"] * MINUTE
                assert row["rowtime"].timestamp() * 1000 == r["user_key"]
                assert {k: row[k] for k in ("user", "amount")} == {
                    k: EVENTS[row["id"]][k] for k in ("user", "amount")}
                assert list(r["key"].values()) == [row[next(iter(r["key"]))]]
        timers = {(next(iter(t["key"].values())), t["timestamp_ms"])
                  for t in _read(sp, node, "_timer_state/event_user-timers")}
        assert {(next(iter(r["key"].values())), r["user_key"]) for r in waiting} <= timers
    # the unbounded functions keep only the rows still to fire
    assert sorted(row["id"] for r in _read(sp, 18, "inputState") for row in r["value"]) == \
        list(range(FIRED, N_EVENTS))


@pytest.mark.parametrize("name", OVER)
def test_processing_time_frames(name: str, decode_path: str) -> None:
    """The processing-time functions computed every row on arrival (in id order: parallelism 1);
    the buffered rows are keyed by their processing time and the proctime column itself is not
    materialized (null)."""
    sp = _open(name)
    for u in range(N_USERS):
        user = f"user-{u}"
        mine = [e for e in EVENTS if e["user"] == user]
        frame = [e["amount"] for e in mine[-4:]]  # ROWS BETWEEN 3 PRECEDING AND CURRENT ROW
        assert _by_key(_read(sp, 25, "accState"))[user] == {
            "proc_max4": {"max": max(frame), "mapSize": len(set(frame)), "map": None},
            "proc_cnt4": 4}
        assert _by_key(_read(sp, 25, "processedCountState"))[user] == 4
        rows = [row for r in _read(sp, 25, "inputState") if r["key"]["user"] == user
                for row in r["value"]]
        assert sorted(row["id"] for row in rows) == [e["id"] for e in mine[-4:]]
        assert all(row["pt"] is None for row in rows)
        # a TTL state (ProcTimeUnboundedPrecedingFunction keeps its accumulator with a TTL)
        [acc] = [r for r in _read(sp, 35, "accState") if r["key"]["user"] == user]
        assert acc["value"] == {"proc_max_id": mine[-1]["id"]}
        assert acc["last_access"].year >= 2026  # processing time of the run
    for cat in CATEGORIES:
        mine = [e for e in EVENTS if e["category"] == cat]
        assert _by_key(_read(sp, 32, "accState"))[cat] == {
            "proc_total.count": len(mine), "proc_total": sum(e["amount"] for e in mine),
            "count1": len(mine)}
        rows = [row for r in _read(sp, 32, "inputState") if r["key"]["category"] == cat
                for row in r["value"]]
        # the whole run is within the hour; $3 is the planner's CAST(amount AS BIGINT)
        assert sorted((row["id"], row["$3"]) for row in rows) == [
            (e["id"], e["amount"]) for e in mine]


@pytest.mark.parametrize("name", OVER)
def test_cleanup_timers(name: str) -> None:
    """With table.exec.state.ttl the functions keep a cleanup time per key and a timer at it:
    processing time (1 d ahead of the run) for the ROWS and unbounded functions, event time for
    the event-time RANGE one (its last row's time + the frame + the TTL)."""
    sp = _open(name)
    for node, state in ((5, "RowTimeBoundedRowsOverCleanupTime"),
                        (14, "RowTimeUnboundedOverCleanupTime"),
                        (18, "RowTimeUnboundedOverCleanupTime"),
                        (25, "ProcTimeBoundedRowsOverCleanupTime"),
                        (32, "cleanupTsState")):
        cleanup = {tuple(r["key"].values()): r["value"] for r in _read(sp, node, state)}
        timers = {(tuple(t["key"].values()), t["timestamp_ms"])
                  for t in _read(sp, node, "_timer_state/processing_user-timers")}
        assert cleanup and set(cleanup.items()) == timers, node
    cleanup = _by_key(_read(sp, 8, "cleanupTsState"))
    timers = {(t["key"]["user"], t["timestamp_ms"])
              for t in _read(sp, 8, "_timer_state/event_user-timers")}
    assert {(u, ts) for u, ts in cleanup.items()} <= timers


def test_documented_queries(tmp_path: Path) -> None:
    """docs/decoding.md's OVER queries, over a catalog whose database ``over`` is the fixture
    snapshotted with its plan."""
    from statequery.catalog import Catalog
    from statequery.cli import main

    src = fixture_dir(OVER[0])
    shutil.copytree(src, tmp_path / "over")
    assert main(["snapshot", str(tmp_path / "over"), "--plan", PLAN]) == 0
    cat = Catalog(str(tmp_path))
    sums = statequery.sql(
        """SELECT a.key.user, a.value.sum3, a.value.n3, t.value AS last_fired_ms
           FROM over."5_over_aggregate__accstate" a
           JOIN over."5_over_aggregate__lasttriggeringtsstate" t ON a.key = t.key""",
        cat).to_pylist()
    fired = EVENTS[:FIRED]
    want = {}
    for u in range(N_USERS):
        mine = [e for e in fired if e["user"] == f"user-{u}"]
        want[f"user-{u}"] = (sum(e["amount"] for e in mine[-3:]), 3, mine[-1]["ts"])
    assert {r["user"]: (r["sum3"], r["n3"], r["last_fired_ms"]) for r in sums} == want
    waiting = statequery.sql(
        """SELECT key.user, r.id, r.rowtime
           FROM over."5_over_aggregate__inputstate", UNNEST(value) AS t(r)
           WHERE user_key > (SELECT max(value)
                             FROM over."5_over_aggregate__lasttriggeringtsstate")""",
        cat).to_pylist()
    assert sorted((r["id"], r["user"]) for r in waiting) == [
        (e["id"], e["user"]) for e in EVENTS[FIRED:]]


@pytest.mark.parametrize(("name", "plan", "table", "acc"), [
    # no frame fired (watermark a day behind): the state is empty, its type is named
    ("sql-ops-hashmap-native", "sql-ops", "125_over_aggregate__accstate",
     "ROW<sum3.count BIGINT, sum3 INTEGER, count1 BIGINT>"),
    # select items without an alias (Calcite's EXPR$13 ...) take the sink's column names
    ("edge-sql-hashmap-native", "edge-sql", "31_over_aggregate__accstate",
     "ROW<sum_l.count BIGINT, sum_l BIGINT, cnt_s2 BIGINT, max_dec38 ROW<max DECIMAL(38, 10), "
     "mapSize BIGINT, map RAW(org.apache.flink.table.api.dataview.MapView)>, count1 BIGINT>"),
])
def test_other_jobs_over_accumulators_are_named(name: str, plan: str, table: str,
                                                 acc: str) -> None:
    sp = _open(name, plan=str(FIXTURES / "plans" / f"{plan}.json"))
    [row] = [r for r in sp.state_meta().to_pylist() if r["table_name"] == table]
    assert row["value_type"] == acc and row["reason"] is None
