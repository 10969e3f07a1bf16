"""state_stats: entries and distinct keys per state and key group equal the counts of Flink's
dump; bytes equal the serialized sizes of the entries (computed here from the dump with the
serializers' formats); skew summary and heaviest keys."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from support.series import series_dir, series_dump

import statequery
from statequery.stats import skew_summary, state_stats, subtask_of
from tests.conftest import fixture_dir


def _string(s: str) -> int:
    """StringSerializer (StringValue.writeString): varint(length + 1), then one byte per ASCII
    char."""
    assert len(s) < 127 and s.isascii()
    return 1 + len(s)


VOID = 1  # VoidNamespaceSerializer writes one byte
LONG = 8


def entry_bytes(e: dict[str, Any]) -> tuple[int, int]:
    """(composite key bytes, value bytes) of one dumped entry of the sequence job."""
    key = _string(e["key"]) + VOID
    kind = e["kind"]
    if kind == "processing_timer":
        return LONG + key, 0
    if kind == "value":
        return key, LONG
    if kind == "map":
        return key + _string(e["user_key"]), 1 + LONG  # null flag + Long
    if kind == "list":
        n = len(e["value"])
        # RocksDB and the canonical format alike: elements joined by the merge delimiter byte
        return key, n * LONG + (n - 1)
    raise AssertionError(kind)


def dump_stats(snapshot: str) -> dict[tuple[str, int], dict[str, int]]:
    out: dict[tuple[str, int], dict[str, Any]] = defaultdict(
        lambda: {"entries": 0, "keys": set(), "key_bytes": 0, "value_bytes": 0, "largest": 0}
    )
    for e in series_dump(snapshot):
        if "key_group" not in e:
            continue
        s = out[(e["state"], e["key_group"])]
        kb, vb = entry_bytes(e)
        s["entries"] += 1
        s["keys"].add(e["key"])
        s["key_bytes"] += kb
        s["value_bytes"] += vb
        s["largest"] = max(s["largest"], kb + vb)
    return {
        k: {"entries": v["entries"], "distinct_keys": len(v["keys"]), "key_bytes": v["key_bytes"],
            "value_bytes": v["value_bytes"], "largest_entry_bytes": v["largest"]}
        for k, v in out.items()
    }


@pytest.mark.parametrize("snapshot", ["chk-1", "chk-3", "savepoint"])
def test_keyed_stats_equal_the_flink_dump(snapshot: str) -> None:
    sp = statequery.open(str(series_dir(snapshot)))
    stats = state_stats(sp, operator="sequence-state", range_size=16)
    got = {
        (r["state"], r["key_group"]): {
            k: r[k] for k in ("entries", "distinct_keys", "key_bytes", "value_bytes",
                              "largest_entry_bytes")
        }
        for r in stats.table.to_pylist()
    }
    assert got == dump_stats(snapshot)
    for r in stats.table.to_pylist():
        assert r["bytes"] == r["key_bytes"] + r["value_bytes"]
        assert r["subtask"] == subtask_of(r["key_group"], 128, 2)


def test_operator_state_stats_and_heaviest_keys() -> None:
    sp = statequery.open(str(series_dir("chk-2")))
    stats = state_stats(sp, top=3)
    src = [r for r in stats.table.to_pylist() if r["state"] == "SourceReaderState"]
    # one NumberSequenceSplit in subtask 0: int version, int length, UTF "1", two longs
    assert [(r["subtask"], r["entries"], r["key_group"]) for r in src] == [(0, 1, None)]
    assert src[0]["bytes"] is not None and src[0]["bytes"] >= 4 + 4 + 3 + 16
    counts = [r for r in stats.heaviest_keys.to_pylist() if r["state"] == "count"]
    assert len(counts) == 3
    # the heaviest count entries are those of the longer keys (user-10 .. user-12)
    assert {r["bytes"] for r in counts} == {_string("user-10") + VOID + LONG}
    assert all(len(r["key"]) == len('"user-10"') for r in counts)
    assert all(r["entries"] == 1 for r in counts)


def test_skew_summary_spreads_key_groups_over_subtasks() -> None:
    sp = statequery.open(str(series_dir("savepoint")))
    stats = state_stats(sp, operator="sequence-state", state="count")
    skew = skew_summary(stats, parallelism=4).to_pylist()
    assert len(skew) == 1
    row = skew[0]
    dumped = [e for e in series_dump("savepoint") if e["state"] == "count"]
    assert row["entries"] == len(dumped) == row["distinct_keys"]
    assert row["bytes"] == sum(_string(e["key"]) + VOID + LONG for e in dumped)
    per2 = [0, 0]
    per4 = [0, 0, 0, 0]
    for e in dumped:
        b = _string(e["key"]) + VOID + LONG
        per2[subtask_of(e["key_group"], 128, 2)] += b
        per4[subtask_of(e["key_group"], 128, 4)] += b
    assert row["per_subtask"] == per2 and row["per_subtask_at"] == per4
    assert row["max_over_mean"] == pytest.approx(max(per2) / (sum(per2) / 2))
    assert row["max_over_mean_at"] == pytest.approx(max(per4) / (sum(per4) / 4))


def test_heap_layout_has_counts_but_no_bytes() -> None:
    sp = statequery.open(str(fixture_dir("datastream-hashmap-checkpoint")))
    stats = state_stats(sp, operator="user-state", state="count")
    rows = stats.table.to_pylist()
    assert sum(r["entries"] for r in rows) == 20
    assert all(r["bytes"] is None for r in rows)


def test_state_stats_is_a_sql_table_of_every_database() -> None:
    t = statequery.sql(
        "SELECT state, SUM(entries) AS n FROM user_activity.state_stats "
        "WHERE operator = 'user-state' GROUP BY state ORDER BY state"
    )
    got = dict(zip(t.column("state").to_pylist(), t.column("n").to_pylist(), strict=True))
    # 20 users: one count, profile, list and timer each; 80 map entries (20 users x 4 categories)
    assert got["count"] == 20 and got["recent-categories"] == 20
    assert got["amount-by-category"] == 80


@pytest.mark.spark
def test_spark_state_stats_equal_the_python_ones(spark) -> None:  # type: ignore[no-untyped-def]
    from statequery.spark.stats import stats_dataframe
    from statequery.stats import STATE_STATS_SCHEMA, key_group_tasks

    path = str(series_dir("chk-3"))
    sp = statequery.open(path)
    assert len(key_group_tasks(sp, range_size=16)) == 8  # 2 subtasks x 64 key groups / 16
    df = stats_dataframe(spark, path, range_size=16)
    assert df.rdd.getNumPartitions() == 9  # 8 key-group ranges + operator state
    got = sorted(
        (tuple(r.asDict()[c] for c in STATE_STATS_SCHEMA.names) for r in df.collect()),
        key=str,
    )
    want = sorted(
        (tuple(r[c] for c in STATE_STATS_SCHEMA.names) for r in sp.stats().table.to_pylist()),
        key=str,
    )
    assert got == want and len(got) > 50


def test_plot_key_groups_draws_every_state() -> None:
    pytest.importorskip("matplotlib")
    from statequery.exceptions import InvalidOptionError
    from statequery.plot import plot_key_groups

    stats = statequery.open(str(series_dir("chk-1"))).stats()
    fig = plot_key_groups(stats, parallelism=4)
    assert len(fig.axes) == 2 * 5  # five keyed states: histogram + per-subtask bars each
    bars = fig.axes[0].patches
    count = [r for r in stats.table.to_pylist() if r["state"] == "count"]
    title = fig.axes[0].get_title()
    assert title.startswith("sequence-state / ")
    state = title.split(" / ")[1].split(":")[0]
    mine = [r for r in stats.table.to_pylist() if r["state"] == state]
    assert len(bars) == len(mine) and count
    assert sorted(b.get_height() for b in bars) == sorted(r["bytes"] for r in mine)
    assert len(fig.axes[1].patches) == 4
    with pytest.raises(InvalidOptionError):
        plot_key_groups(stats, state="no-such-state")
