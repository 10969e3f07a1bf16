"""Flink SQL compiled plans name SQL state (statequery.metadata.plan, docs/decoding.md).

The plan is the one Flink compiled for the fixture job (tests/fixtures/plans/sql-ops.json, written
by examples/flink-jobs/sql_operators_job.py, which then executed exactly that plan)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import statequery
from statequery.exceptions import InvalidOptionError
from statequery.metadata.plan import (
    accumulator_layouts,
    match_operators,
    operator_kind,
    parse_plan,
    row_field_names,
)
from tests.conftest import FIXTURES, fixture_dir

OPS = "sql-ops-hashmap-native"
PLAN = FIXTURES / "plans" / "sql-ops.json"


def _open(name: str = OPS, plan: Path | None = PLAN) -> Any:
    return statequery.open(str(fixture_dir(name)), use_snapshot=False,
                           plan=None if plan is None else str(plan))


def _op(sp: Any, kind: str, index: int = 0) -> Any:
    ops = sorted((o for o in sp.operators if o.name.split("[")[0] == kind),
                 key=lambda o: int(o.name.split("[")[1].split("]")[0]))
    return ops[index]


def _types(sp: Any, op: Any, state: str) -> dict[str, str]:
    row = next(r for r in sp.state_meta().to_pylist()
               if r["operator_id"] == op.operator_id and r["state_name"] == state)
    return {k: row[k] for k in ("key_type", "user_key_type", "value_type", "table_name")}


# -- parsing and matching -------------------------------------------------------------------------


def test_row_types_and_bad_plans(tmp_path: Path) -> None:
    assert row_field_names("ROW<`a` INT, `b,c` ROW<`x` DECIMAL(10, 2)>, `d` MAP<STRING, INT>> "
                           "NOT NULL") == ("a", "b,c", "d")
    assert row_field_names({"type": "ROW", "fields": [{"name": "k", "fieldType": "INT"}]}) == (
        "k",)
    with pytest.raises(InvalidOptionError, match="plan.json: not JSON"):
        parse_plan("{", "plan.json")
    with pytest.raises(InvalidOptionError, match="not a Flink compiled plan"):
        parse_plan(json.dumps({"flinkVersion": "2.3"}), "x")
    bad = tmp_path / "plan.json"
    bad.write_text("[]")
    with pytest.raises(InvalidOptionError, match=str(bad)):
        statequery.open(str(fixture_dir(OPS)), plan=str(bad))


def test_matching_refuses_to_guess() -> None:
    plan = parse_plan(json.dumps({"nodes": [
        {"id": 7, "type": "stream-exec-group-aggregate_1", "outputType": "ROW<`k` INT>"},
        {"id": 9, "type": "stream-exec-join_1", "outputType": "ROW<`k` INT>"},
        {"id": 12, "type": "stream-exec-sink_2", "outputType": "ROW<`k` INT>"},
    ]}))
    op = SimpleNamespace
    got = match_operators(plan, [
        op(operator_id="a", uid="", name="GroupAggregate[7]"),  # by name
        op(operator_id="b", uid="9_join", name="Join[9]"),  # by uid (and name)
        op(operator_id="c", uid="", name="Rank[9]"),  # node 9 is no rank: no match
        op(operator_id="d", uid="7_group-aggregate", name="Join[9]"),  # contradicting
        op(operator_id="e", uid="", name="SinkMaterializer[12]"),
        op(operator_id="f", uid="", name="ConstraintEnforcer[12]"),
        op(operator_id="g", uid="", name="Calc[99]"),  # not in the plan
    ])
    assert {k: v.id for k, v in got.items()} == {"a": 7, "b": 9, "e": 12, "f": 12}
    # two operators of one kind claiming one node: neither is named
    twice = match_operators(plan, [op(operator_id="x", uid="", name="GroupAggregate[7]"),
                                   op(operator_id="y", uid="", name="GroupAggregate[7]")])
    assert twice == {}
    assert operator_kind("GlobalWindowAggregate[17]") == "global-window-aggregate"


def test_every_stateful_operator_of_the_fixture_matches_its_node() -> None:
    sp = _open()
    nodes = sp.plan_nodes
    keyed = [o for o in sp.operators if any(s.keyed for s in o.states)]
    assert keyed and all(o.operator_id in nodes for o in keyed)
    for o in keyed:
        assert o.uid.startswith(f"{nodes[o.operator_id].id}_")


# -- names in state_meta, reads and lookups ------------------------------------------------------


def test_group_aggregation_names() -> None:
    sp = _open()
    op = next(o for o in sp.operators if any(s.name == "distinctAcc_0" for s in o.states))
    t = _types(sp, op, "accState")
    node = sp.plan_nodes[op.operator_id].id
    assert t["table_name"] == f"{node}_group_aggregate__accstate"
    assert t["key_type"] == "ROW<category STRING>"
    assert t["value_type"].startswith("ROW<users BIGINT, user_list ROW<list RAW(")
    row = sp.read(t["table_name"], key={"category": "books"}).to_pylist()
    assert len(row) == 1 and row[0]["key"] == {"category": "books"}
    acc = row[0]["value"]
    # one field per aggregate, then the retraction row count and the distinct view placeholder
    assert list(acc) == ["users", "user_list", "min_total", "max_total", "first_user",
                         "last_user", "count1", "users_distinct_view"]
    assert acc["users"] == 6 and acc["count1"] == 6 and acc["users_distinct_view"] is None
    assert acc["max_total"]["max"] == 334 and acc["first_user"]["firstValue"] == "user-4"
    # user_totals: a plain aggregation without retraction
    plain = next(o for o in sp.operators if o.name.startswith("GroupAggregate")
                 and _types(sp, o, "accState")["key_type"] == "ROW<category STRING, user STRING>"
                 and "cnt" in _types(sp, o, "accState")["value_type"])
    names = sp.read(plain.operator_id, "accState").schema.field("value").type
    assert [names.field(i).name for i in range(names.num_fields)] == [
        "cnt", "total", "first_amount", "last_amount", "max_amount"]


def test_join_names_and_counts() -> None:
    sp = _open()
    inner = _op(sp, "Join", 0)  # join_inner: no unique key on either side
    t = _types(sp, inner, "left-records")
    assert (t["key_type"], t["user_key_type"], t["value_type"]) == (
        "ROW<user STRING>", "ROW<user STRING, id BIGINT>", "INT")
    rows = sp.read(inner.operator_id, "left-records", key={"user": "user-0"}).to_pylist()
    # the even ids of user-0 (0, 6, 12, ...), each seen once
    assert sorted(r["user_key"]["id"] for r in rows) == list(range(0, 60, 6))
    assert all(r["value"] == 1 and r["user_key"]["user"] == "user-0" for r in rows)
    unique = _op(sp, "Join", 2)  # join_unique: both sides keyed by user
    right = sp.read(unique.operator_id, "right-records").to_pylist()
    assert {r["value"]["user"]: r["value"]["total"] for r in right}["user-2"] == sum(
        (i * 37) % 101 for i in range(2, 60, 6))


def test_top_n_and_window_names() -> None:
    sp = _open()
    rank = _op(sp, "Rank")
    t = _types(sp, rank, "data-state-with-append")
    assert (t["key_type"], t["user_key_type"]) == ("ROW<category STRING>", "ROW<amount INTEGER>")
    assert t["value_type"] == (
        "ARRAY<ROW<row_kind STRING, id BIGINT, amount INTEGER, category STRING>>")
    tumble = _op(sp, "GlobalWindowAggregate")
    rows = sp.read(tumble.operator_id, "window-aggs").to_pylist()
    assert rows and set(rows[0]["key"]) == {"category"}
    assert set(rows[0]["value"]) == {"cnt", "total"}
    assert sum(r["value"]["cnt"] for r in rows) == 60  # every event in one tumbling slice
    wrank = _op(sp, "WindowRank")
    assert _types(sp, wrank, "window_rank")["user_key_type"] == "ROW<amount INTEGER>"
    mat = _op(sp, "SinkMaterializer")
    t = _types(sp, mat, "values")
    assert t["key_type"] == "ROW<category STRING NOT NULL>"
    assert t["value_type"] == (
        "ARRAY<ROW<row_kind STRING, category STRING NOT NULL, user STRING, total INTEGER>>")


def test_lookup_with_the_query_names_equals_a_filtered_read() -> None:
    sp = _open()
    result = sp.lookup({"category": "books"})
    rank = _op(sp, "Rank")
    label = next(k for k in result if k[1] == "data-state-with-append")
    whole = sp.read(rank.operator_id, "data-state-with-append").to_pylist()
    assert result[label].to_pylist() == [r for r in whole if r["key"] == {"category": "books"}]
    # two-field keys are not mixed up with one-field ones
    assert all(set(t.column("key")[0].as_py()) == {"category"} for t in result.values())


def test_without_a_plan_nothing_changes() -> None:
    sp = _open(plan=None)
    rank = _op(sp, "Rank")
    t = _types(sp, rank, "data-state-with-append")
    assert t["key_type"] == "ROW<f0 STRING>"
    assert t["table_name"].endswith("__data_state_with_append")
    rows = sp.read(rank.operator_id, "data-state-with-append").to_pylist()
    assert rows[0]["key"].keys() == {"f0"}


def test_snapshot_keeps_the_plan(tmp_path: Path) -> None:
    from statequery.cli import main

    src = fixture_dir(OPS)
    copy = tmp_path / src.name
    shutil.copytree(src, copy)
    assert main(["snapshot", str(copy), "--plan", str(PLAN)]) == 0
    sp = statequery.open(str(copy))  # no plan argument: the snapshot brings it
    assert sp.from_snapshot and sp.sql_plan is not None
    rank = _op(sp, "Rank")
    assert _types(sp, rank, "data-state-with-append")["key_type"] == "ROW<category STRING>"
    assert main(["snapshot", str(copy), "--plan", str(tmp_path / "missing.json")]) == 1


def test_accumulator_layouts() -> None:
    calls = [{"name": "n", "distinct": True}, {"name": "s"}]
    plan = parse_plan(json.dumps({"nodes": [
        {"id": 1, "type": "stream-exec-group-aggregate_1", "aggCalls": calls},
        {"id": 2, "type": "stream-exec-group-aggregate_1", "aggCalls": calls,
         "needRetraction": True}]}))
    assert accumulator_layouts(plan.nodes[1]) == [("n", "s", "n_distinct_view")]
    assert accumulator_layouts(plan.nodes[2]) == [("n", "s", "count1", "n_distinct_view")]


def test_two_phase_and_split_distinct_names() -> None:
    sp = _open("sql-minibatch-hashmap-native", FIXTURES / "plans" / "sql-minibatch.json")
    totals = _op(sp, "GlobalGroupAggregate", 0)
    assert _types(sp, totals, "accState")["value_type"] == (
        "ROW<cnt BIGINT, total INTEGER, max_amount INTEGER>")
    rows = sp.read(totals.operator_id, "accState", key={"category": "games"}).to_pylist()
    assert rows[0]["value"]["cnt"] == 20
    # the split distinct aggregation is keyed by the group key and the hash bucket ($f3)
    incremental = _op(sp, "IncrementalGroupAggregate")
    assert _types(sp, incremental, "distinctAcc_0")["key_type"] == (
        "ROW<category STRING, $f3 INTEGER>")


# -- every built-in aggregate function and window shape (sql_operators_job.py --job aggs) -------

AGGS = ("sql-aggs-hashmap-canonical", FIXTURES / "plans" / "sql-aggs.json")
AGGS_MB = ("sql-aggs-minibatch-rocksdb-native", FIXTURES / "plans" / "sql-aggs-minibatch.json")
WINDOW_ACC = ["avg_amount.sum", "avg_amount.count", "cnt", "total", "max_amount", "users"]
AVG = ["avg_amount"]  # the current value of AVG beside its accumulator fields


def _value_names(sp: Any, op: Any, state: str) -> list[str]:
    return list(sp.read(op.operator_id, state).schema.field("value").type.names)


def test_every_aggregate_function_is_named() -> None:
    sp = _open(*AGGS)
    plain, _, retract, distinct = (_op(sp, "GroupAggregate", i) for i in range(4))
    # AVG keeps (sum, count), LISTAGG (delimiter, concat); the others one field each
    assert _value_names(sp, plain, "accState") == [
        "avg_amount.sum", "avg_amount.count", "cnt", "total", "users", "user_list.delimiter",
        "user_list.concat", "first_amount", "last_amount", "min_amount", "max_amount",
        "user_bag", "by_id", "amounts", "users_distinct_view", "avg_amount"]
    row = sp.read(plain.operator_id, "accState", key={"category": "books"}).to_pylist()[0]
    acc = row["value"]
    assert (acc["avg_amount.sum"], acc["avg_amount.count"], acc["cnt"]) == (997, 20, 20)
    assert acc["avg_amount"] == 49  # AVG(INT) is an INT: 997 / 20, Java's division
    assert acc["user_list.delimiter"] == "," and acc["min_amount"] == 0
    assert acc["max_amount"] == 100 and acc["users"] == 6
    # with retraction: the planner rebuilt AVG and SUM from $SUM0 and COUNT ($f1, $f2), named
    # after the query's columns they pass on to; MIN/MAX/FIRST/LAST/LISTAGG keep map views
    assert _value_names(sp, retract, "accState") == [
        "sum_total", "cnt", "min_total", "max_total", "first_user", "last_user", "user_list",
        "user_bag", "by_user", "count1"]
    acc = sp.read(retract.operator_id, "accState", key={"category": "books"}).to_pylist()[0][
        "value"]
    assert acc["sum_total"] == 997 and acc["min_total"]["min"] == 78
    assert acc["max_total"]["max"] == 334 and acc["count1"] == 6
    assert _value_names(sp, distinct, "accState") == [
        "custs", "tiers", "sum_price", "custs_distinct_view", "tiers_distinct_view"]
    # SUM alone over an updating input keeps (sum, count): SumWithRetractAggFunction
    sum_retract = _op(sp, "GroupAggregate", 4)
    assert sp.read(sum_retract.operator_id, "accState", key={"category": "books"}).to_pylist()[
        0]["value"] == {"sum_total.sum": 997, "sum_total.count": 6, "count1": 6,
                        "sum_total": 997}


def test_every_window_shape_is_named() -> None:
    sp = _open(*AGGS)
    for i in range(3):  # tumble, hop, cumulate: two-phase (local buffers, global slices)
        glob = _op(sp, "GlobalWindowAggregate", i)
        assert _value_names(sp, glob, "window-aggs") == [*WINDOW_ACC, "users_distinct_view",
                                                          *AVG]
    session = _op(sp, "WindowAggregate")
    assert _value_names(sp, session, "window-aggs") == [*WINDOW_ACC, "users_distinct_view",
                                                         *AVG]
    rows = sp.read(session.operator_id, "window-aggs", key={"category": "books"}).to_pylist()
    first = min(rows, key=lambda r: r["namespace"]["start"])["value"]
    assert (first["avg_amount.sum"], first["cnt"], first["max_amount"]) == (453, 10, 94)
    assert first["avg_amount"] == 45


def test_mini_batch_two_phase_split_and_hop_names() -> None:
    sp = _open(*AGGS_MB)
    t = {r["table_name"]: r for r in sp.state_meta().to_pylist()}
    # the final aggregate of a distinct-split plan: $f1, $f2, $f3 are the query's names
    final = _op(sp, "GlobalGroupAggregate", 1)
    assert _value_names(sp, _op(sp, "GlobalGroupAggregate", 2), "accState") == [
        "sum_total.sum", "sum_total.count", "count1", "sum_total"]
    assert _value_names(sp, final, "accState") == ["custs", "tiers", "sum_price"]
    assert sp.read(final.operator_id, "accState", key={"tier": 0}).to_pylist()[0]["value"] == {
        "custs": 6, "tiers": 3, "sum_price": 1536}
    # split window aggregates: the bucket level (keyed by group key and buckets) and the final
    # one; the hop's final level has the record count the planner adds
    names = [_value_names(sp, _op(sp, "GlobalWindowAggregate", i), "window-aggs")
             for i in range(6)]
    assert names == [
        [*WINDOW_ACC, "users_distinct_view"], WINDOW_ACC,  # tumble
        [*WINDOW_ACC, "count1", "users_distinct_view"], [*WINDOW_ACC, "count1"],  # hop
        [*WINDOW_ACC, "users_distinct_view"], WINDOW_ACC,  # cumulate
    ]
    bucket = _op(sp, "GlobalWindowAggregate", 0)
    assert _types(sp, bucket, "window-aggs")["key_type"] == (
        "ROW<category STRING, $f5 INTEGER, $f6 INTEGER>")
    assert all(r["reason"] is None for r in t.values()
               if r["state_name"] in ("accState", "window-aggs"))


def test_an_accumulator_that_cannot_be_named_says_why(tmp_path: Path) -> None:
    doc = json.loads((FIXTURES / "plans" / "sql-aggs.json").read_text())
    for n in doc["nodes"]:
        if n["id"] == 22:  # agg_distinct: a call of a function statequery does not know
            n["aggCalls"][2]["internalName"] = "$MY_UDAF$1"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    sp = _open(AGGS[0], plan)
    op = _op(sp, "GroupAggregate", 3)
    assert _value_names(sp, op, "accState") == [f"f{i}" for i in range(5)]
    row = next(r for r in sp.state_meta().to_pylist()
               if r["operator_id"] == op.operator_id and r["state_name"] == "accState")
    assert "a number of fields statequery does not know" in row["reason"]
    assert sp.read(op.operator_id, "accState").num_rows == 2


@pytest.mark.parametrize(("name", "plan"), [AGGS, AGGS_MB])
def test_aggregate_lookups_equal_filtered_reads(name: str, plan: Path) -> None:
    """A lookup by the query's key names reads what a full read filtered to that key holds, in
    every accumulator state (named from the plan)."""
    sp = _open(name, plan)
    result = sp.lookup({"category": "games"})
    checked = 0
    for op in sp.operators:
        for st in op.states:
            if st.name not in ("accState", "window-aggs"):
                continue
            whole = [r for r in sp.read(op.operator_id, st.name).to_pylist()
                     if r["key"] == {"category": "games"}]
            label = next((k for k in result if k[0] in (op.uid, op.operator_id)
                          and k[1] == st.name), None)
            got = result[label].to_pylist() if label is not None else []
            assert got == whole, (op.name, st.name)
            checked += bool(whole)
    assert checked >= 4  # the bucket levels of split windows have other keys


@pytest.mark.parametrize(("name", "plan"), [AGGS, AGGS_MB])
def test_current_values_are_the_same_on_both_decode_paths(name: str, plan: Path,
                                                          decode_path: str) -> None:
    """The current value of an AVG (or SUM with retraction) beside its accumulator fields:
    computed by the compiled path from the decoded columns, by the pure path per row."""
    sp = _open(name, plan)
    shown = 0
    for op in sp.operators:
        for st in op.states:
            if st.name not in ("accState", "window-aggs"):
                continue
            for r in sp.read(op.operator_id, st.name).to_pylist():
                v = r["value"]
                for field in [k for k in v if f"{k}.sum" in v and f"{k}.count" in v]:
                    total, count = v[f"{field}.sum"], v[f"{field}.count"]
                    if field.startswith("avg"):
                        want = None if not count else int(total / count)
                    else:
                        want = None if not count else total
                    assert v[field] == want, (op.name, field, v)
                    shown += 1
    assert shown >= 6
