"""Every stateful Flink SQL operator, read from savepoints Flink 2.3.0 wrote (docs/decoding.md,
"Flink SQL operators").

The fixtures ``sql-ops-*`` and ``sql-minibatch-*`` (examples/flink-jobs/sql_operators_job.py) hold
one instance of each operator, on the hashmap and the RocksDB backend. That every state equals
Flink's own restore entry by entry is checked for all fixtures by tests/reader/test_reader.py;
here: that the operators are really there, and values whose meaning the operator defines.
"""

from __future__ import annotations

from typing import Any

import pytest

import statequery
from tests.conftest import fixture_dir

OPS = ["sql-ops-hashmap-native", "sql-ops-rocksdb-native"]
MINIBATCH = ["sql-minibatch-hashmap-native", "sql-minibatch-rocksdb-native"]

# operator name prefix -> states it must hold entries for
OPERATORS = {
    "GroupAggregate": {"accState"},
    "LocalWindowAggregate": set(),  # buffers in memory only, flushed before the snapshot
    "GlobalWindowAggregate": {"window-aggs", "_timer_state/event_window-timers", "watermark"},
    "WindowAggregate": {"window-aggs", "session-window-mapping"},
    "WindowRank": {"window_rank"},
    "WindowDeduplicate": {"window_deduplicate"},
    "Rank": {"data-state-with-append"},
    "Deduplicate": {"deduplicate-state"},
    "Join": {"left-records", "right-records"},
    "IntervalJoin": {"IntervalJoinLeftCache", "IntervalJoinRightCache"},
    "TemporalJoin": {"left", "right"},
    "OverAggregate": {"inputState"},
    "Match": {"eventQueuesStateName"},
    "ChangelogNormalize": {"deduplicate-state"},
    "SinkMaterializer": {"values"},
}
MINIBATCH_OPERATORS = {
    "LocalGroupAggregate": set(),
    "GlobalGroupAggregate": {"accState"},
    "IncrementalGroupAggregate": {"distinctAcc_0"},
}


def _open(name: str) -> Any:
    return statequery.open(str(fixture_dir(name)), use_snapshot=False)


def _by_kind(sp: Any) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for op in sp.operators:
        out.setdefault(op.name.split("[", 1)[0], []).append(op)
    return out


def _rows(sp: Any, op: Any, state: str) -> list[dict[str, Any]]:
    return sp.read(op.operator_id, state).to_pylist()  # type: ignore[no-any-return]


@pytest.mark.parametrize(("name", "operators"),
                         [(n, OPERATORS) for n in OPS] + [(n, MINIBATCH_OPERATORS)
                                                          for n in MINIBATCH])
def test_every_operator_is_there_with_its_states(name: str, operators: dict[str, set[str]]) -> None:
    sp = _open(name)
    kinds = _by_kind(sp)
    for kind, states in operators.items():
        assert kind in kinds, f"{name}: no {kind} operator in {sorted(kinds)}"
        for op in kinds[kind]:
            # uids of jobs run from a compiled plan: <plan node id>_<transformation>
            node = op.name.split("[", 1)[1].split("]", 1)[0]
            assert op.uid.startswith(node + "_"), (op.name, op.uid)
        held = {st.name for op in kinds[kind] for st in op.states}
        assert states <= held, (kind, held)


@pytest.mark.parametrize("name", OPS)
def test_state_backed_views_leave_null_placeholders(name: str) -> None:
    """category_stats: COUNT(DISTINCT), LISTAGG, MIN/MAX and FIRST/LAST_VALUE over an updating
    input keep their data in MapState/ListState views; the accumulator row keeps RAW placeholders
    whose stored NullSerializer reads null, also inside the structured accumulators."""
    sp = _open(name)
    op = next(o for o in sp.operators if o.uid.endswith("group-aggregate")
              and any(s.name == "distinctAcc_0" for s in o.states))
    rows = {r["key"]["f0"]: r["value"] for r in _rows(sp, op, "accState")}
    assert set(rows) == {"books", "games", "music"}
    acc = rows["books"]
    assert acc["f1"] == {"list": None, "retractList": None}  # LISTAGG with retraction
    assert acc["f2"]["map"] is None and acc["f2"]["mapSize"] == 6  # MIN with retraction
    assert acc["f3"]["map"] is None and acc["f3"]["max"] == 334  # MAX with retraction
    assert acc["f4"]["orderToValueMap"] is None and acc["f4"]["firstValue"] == "user-4"
    assert acc["f7"] is None  # the COUNT(DISTINCT) view
    # the views themselves: the distinct users per category, as a MapState of the operator
    distinct = _rows(sp, op, "distinctAcc_0")
    assert sorted(r["user_key"] for r in distinct if r["key"]["f0"] == "books") == [
        f"user-{u}" for u in range(6)
    ]


@pytest.mark.parametrize("name", OPS)
def test_window_slices_and_session_windows(name: str) -> None:
    sp = _open(name)
    tumble = next(o for o in sp.operators if o.name.startswith("GlobalWindowAggregate"))
    rows = _rows(sp, tumble, "window-aggs")
    # namespace: the slice end (epoch ms); one 15-minute slice per category and quarter hour
    ends = sorted({r["namespace"] for r in rows})
    assert ends[0] == 1_700_000_100_000 and all((e - ends[0]) % 300_000 == 0 for e in ends)
    session = next(o for o in sp.operators if o.name.startswith("WindowAggregate"))
    windows = _rows(sp, session, "session-window-mapping")
    # a session per category and 10-event block (1 minute apart, 5 minute gap)
    assert len(windows) == 6
    for w in windows:
        assert w["user_key"]["end"] > w["user_key"]["start"]


@pytest.mark.parametrize("name", OPS)
def test_top_n_keeps_the_sorted_rows(name: str) -> None:
    sp = _open(name)
    rank = next(o for o in sp.operators if o.name.startswith("Rank"))
    rows = _rows(sp, rank, "data-state-with-append")
    books = sorted(((r["user_key"]["f0"], r["value"]) for r in rows if r["key"]["f0"] == "books"),
                   key=lambda kv: -kv[0])
    # events 0-9, 30-39 are books (category changes every 10 events), amount (i * 37) % 101
    amounts = sorted(((i * 37) % 101 for i in [*range(10), *range(30, 40)]), reverse=True)
    assert [k for k, _ in books][:3] == amounts[:3]  # sort key -> its rows, highest first
    assert all(row["f1"] == k and row["f2"] == "books" for k, v in books for row in v)


@pytest.mark.parametrize("name", OPS)
def test_rows_keep_their_row_kind(name: str, decode_path: str) -> None:
    """Deduplication, joins, the temporal join, Top-N and the upsert materializer keep rows
    with their RowKind (byte 0 of the BinaryRowData header): a leading ``row_kind`` field."""
    sp = _open(name)
    kinds = _by_kind(sp)
    # the materializer keeps each (category, user) row as the aggregation last sent it: an update
    values = _rows(sp, kinds["SinkMaterializer"][0], "values")
    assert {row["row_kind"] for r in values for row in r["value"]} == {"+U"}
    assert list(values[0]["value"][0])[0] == "row_kind"
    # the versioned side of the temporal join: the first version of a category +I, later ones +U
    right = _rows(sp, kinds["TemporalJoin"][0], "right")
    first = {}
    for r in sorted(right, key=lambda r: r["user_key"]):
        first.setdefault(r["key"]["f0"], r["value"]["row_kind"])
    assert set(first.values()) == {"+I"}
    assert sum(r["value"]["row_kind"] == "+U" for r in right) == len(right) - 3
    # Top-N keeps its input rows (+I); keep-last deduplication the last row: RocksDB serialized
    # it as it came (+I), the heap backend keeps the row object Flink then emits as +U
    rank = _rows(sp, kinds["Rank"][0], "data-state-with-append")
    assert {row["row_kind"] for r in rank for row in r["value"]} == {"+I"}
    last = _rows(sp, next(o for o in kinds["Deduplicate"]
                          if "deduplicate-state" in {s.name for s in o.states}
                          and _rows(sp, o, "deduplicate-state")[0]["value"] is not True
                          and "f3" in _rows(sp, o, "deduplicate-state")[0]["value"]),
                 "deduplicate-state")
    assert {r["value"]["row_kind"] for r in last} == ({"+U"} if "hashmap" in name else {"+I"})


def test_row_kind_in_sql() -> None:
    """The kind is a column for SQL too: which rows of the materializer are updates."""
    from statequery.catalog import Catalog, sql_identifier

    cat = Catalog(str(fixture_dir(OPS[0]).parent))
    db = fixture_dir(OPS[0]).name
    table = next(r["table_name"] for r in cat.savepoint(db).state_meta().to_pylist()
                 if r["state_name"] == "right" and r["operator_name"].startswith("TemporalJoin"))
    db = sql_identifier(db)
    t = statequery.sql(f"SELECT value.row_kind AS kind, count(*) AS n FROM {db}.{table} "
                       "GROUP BY 1 ORDER BY 1", cat)
    assert t.to_pylist() == [{"kind": "+I", "n": 3}, {"kind": "+U", "n": 57}]
