"""Savepoint.diff against the difference of Flink's own dumps of consecutive snapshots.

The series fixture holds three retained RocksDB incremental checkpoints of one job and a canonical
savepoint after them; ``dump/<name>.jsonl`` is what Flink's state backends read from each. The
diff of two snapshots must be exactly the entries whose identity appears in only one dump
(removed / added) or whose value differs (changed).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest
from support.series import RECORDS, canonical, identity, series_dir, series_dump

import statequery
from statequery.diff import DIFF_SCHEMA, diff_batches
from statequery.exceptions import NoSuchOperatorError, NoSuchStateError
from tests.conftest import fixture_dir

PAIRS = [("chk-1", "chk-2"), ("chk-2", "chk-3"), ("chk-3", "savepoint"), ("chk-1", "savepoint"),
         ("savepoint", "chk-1")]


def _value(entry: dict[str, Any]) -> str | None:
    if entry["kind"] in ("event_timer", "processing_timer"):
        return None
    return canonical(entry["value"])


def dump_difference(old: str, new: str) -> set[tuple[Any, ...]]:
    before = {identity(e): e for e in series_dump(old)}
    after = {identity(e): e for e in series_dump(new)}
    out = set()
    for ident in before.keys() | after.keys():
        o, n = before.get(ident), after.get(ident)
        if o is None:
            out.add(("added", ident, None, _value(n), n.get("key_group")))  # type: ignore[arg-type]
        elif n is None:
            out.add(("removed", ident, _value(o), None, o.get("key_group")))
        elif _value(o) != _value(n):
            out.add(("changed", ident, _value(o), _value(n), n.get("key_group")))
    return out


def diff_rows(table: pa.Table) -> set[tuple[Any, ...]]:
    out = set()
    for r in table.to_pylist():
        ident = {k: None for k in ("key", "namespace", "user_key", "timestamp", "subtask", "index")}
        for k in ("key", "namespace", "user_key"):
            if r[k] is not None:
                ident[k] = json.loads(r[k])
        for k in ("timestamp", "subtask", "index"):
            ident[k] = r[k]
        ident.update(operator_id=r["operator_id"], state=r["state"])
        out.add((r["change"], canonical(ident), r["old_value"], r["new_value"], r["key_group"]))
    return out


def _open(snapshot: str) -> statequery.Savepoint:
    return statequery.open(str(series_dir(snapshot)))


@pytest.mark.parametrize(("old", "new"), PAIRS)
def test_diff_equals_the_difference_of_the_flink_dumps(old: str, new: str) -> None:
    table = _open(old).diff(_open(new))
    assert table.schema == DIFF_SCHEMA
    want = dump_difference(old, new)
    assert len(want) > 20, "the snapshots differ"
    got = diff_rows(table)
    assert got == want
    assert table.num_rows == len(got)  # no duplicate rows


def test_diff_kinds_of_change_between_checkpoints() -> None:
    table = _open("chk-1").diff(str(series_dir("chk-2")))
    counts: dict[tuple[str, str], int] = {}
    for r in table.select(["state", "change"]).to_pylist():
        counts[(r["state"], r["change"])] = counts.get((r["state"], r["change"]), 0) + 1
    # cycle 1 touches user-3..12: user-10..12 are new keys, user-3..9 clear their flag
    assert counts[("count", "added")] == 3
    assert counts[("count", "changed")] == 7
    assert counts[("flag", "removed")] == 7
    assert ("flag", "added") not in counts
    # the source moved from record 100 to record 200 of its one NumberSequenceSplit
    src = table.filter(pa.compute.equal(table["state"], "SourceReaderState")).to_pylist()
    assert [r["change"] for r in src] == ["changed"]


def test_diff_of_a_snapshot_with_itself_and_across_backends_is_empty() -> None:
    assert _open("chk-2").diff(_open("chk-2")).num_rows == 0
    # the same job and state, canonical hashmap savepoint vs native RocksDB savepoint
    a = statequery.open(str(fixture_dir("datastream-hashmap-canonical")))
    b = statequery.open(str(fixture_dir("datastream-rocksdb-native")))
    assert a.diff(b).num_rows == 0
    # max parallelism 128 vs 256: key groups differ, entries do not
    c = statequery.open(str(fixture_dir("datastream-hashmap-canonical-maxpar256")))
    assert a.diff(c).num_rows == 0


def test_diff_filters_by_operator_state_and_key() -> None:
    old, new = _open("chk-1"), _open("chk-2")
    only = old.diff(new, operator="sequence-state", state="buckets")
    assert set(only["state"].to_pylist()) == {"buckets"}
    full = old.diff(new)
    assert only.num_rows == sum(1 for s in full["state"].to_pylist() if s == "buckets")
    one = old.diff(new, operator="sequence-state", key="user-5")
    assert set(one["key"].to_pylist()) == {'"user-5"'}
    assert {(r["state"], r["change"]) for r in one.to_pylist()} == {
        ("count", "changed"), ("flag", "removed"), ("buckets", "removed"), ("buckets", "changed"),
        ("recent", "changed"), ("_timer_state/processing_user-timers", "added"),
        ("_timer_state/processing_user-timers", "removed"),
    }
    with pytest.raises(NoSuchOperatorError):
        old.diff(new, operator="no-such-op")
    with pytest.raises(NoSuchStateError):
        old.diff(new, operator="sequence-state", state="no-such-state")


def test_diff_streams_range_by_range() -> None:
    old, new = _open("chk-2"), _open("chk-3")
    done: list[int] = []
    batches = list(diff_batches(old, new, state="count", range_size=8, progress=done.append))
    assert len(batches) > 2  # one batch per key-group range with changes
    assert sum(done) == 128
    assert sum(b.num_rows for b in batches) == old.diff(new, state="count").num_rows


def test_schema_change_is_reported_not_compared() -> None:
    old, new = _open("chk-1"), _open("chk-2")
    meta = new.meta
    ops = []
    for op in meta.operators:
        states = tuple(
            replace(s, value_spec=op.key_spec) if s.name == "count" else s for s in op.states
        )
        ops.append(replace(op, states=states))
    new.model._meta = replace(meta, operators=tuple(ops))
    table = old.diff(new, state="count")
    assert table.to_pylist() == [
        {**{k: None for k in DIFF_SCHEMA.names},
         "operator_id": table["operator_id"][0].as_py(), "operator": "sequence-state",
         "state": "count", "kind": "value", "change": "schema_changed",
         "old_value": "value, key STRING, namespace VOID, value BIGINT",
         "new_value": "value, key STRING, namespace VOID, value STRING"},
    ]


def test_records_per_snapshot() -> None:
    # the source split's position (NumberSequenceSplit.from) is the records the snapshot holds
    for snap, records in RECORDS.items():
        counts = [e["value"] for e in series_dump(snap) if e["state"] == "count"]
        assert sum(counts) == records


@pytest.mark.spark
def test_spark_diff_equals_the_difference_of_the_flink_dumps(spark) -> None:  # type: ignore[no-untyped-def]
    from statequery.spark.diff import diff_dataframe, diff_tasks

    old, new = str(series_dir("chk-2")), str(series_dir("savepoint"))
    tasks = diff_tasks(_open("chk-2"), _open("savepoint"))
    assert tasks[0] == "" and len(tasks) > 2  # operator state + key-group ranges
    df = diff_dataframe(spark, old, new)
    table = pa.Table.from_pylist([r.asDict() for r in df.collect()], schema=DIFF_SCHEMA)
    assert diff_rows(table) == dump_difference("chk-2", "savepoint")
    assert table.num_rows == len(diff_rows(table))
    one = diff_dataframe(spark, old, new, operator="sequence-state", key="user-9").collect()
    got = pa.Table.from_pylist([r.asDict() for r in one], schema=DIFF_SCHEMA)
    assert set(got["key"].to_pylist()) == {'"user-9"'} and got.num_rows > 3
    want = _open("chk-2").diff(_open("savepoint"), operator="sequence-state", key="user-9")
    assert diff_rows(got) == diff_rows(want)


def test_an_unchanged_nan_is_not_a_change() -> None:
    """NaN != NaN in Python; a double that stayed NaN (same bytes) is no difference."""
    from statequery.diff import _frozen

    nan = float("nan")
    flat = pa.chunked_array([[nan, 1.5, None]])
    assert _frozen(flat) == _frozen(pa.chunked_array([[float("nan"), 1.5, None]]))
    assert _frozen(flat) != _frozen(pa.chunked_array([[2.0, 1.5, None]]))
    nested = pa.chunked_array([[{"a": nan, "b": [nan, 1.0]}]])
    again = pa.chunked_array([[{"a": float("nan"), "b": [float("nan"), 1.0]}]])
    assert _frozen(nested) == _frozen(again)
    assert len({*_frozen(nested), *_frozen(again)}) == 1  # hashable, one distinct value
