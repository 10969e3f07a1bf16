"""MATCH_RECOGNIZE, SQL state TTL, the window join and the upsert materializer of Flink 2.x, read
from snapshots Flink 2.3.0 wrote (docs/decoding.md, "MATCH_RECOGNIZE"; docs/fixtures.md,
``sql-cep-*``).

The fixtures come from one job (examples/flink-jobs/sql_operators_job.py ``--job cep``) on every
backend and format: canonical and native savepoints of the hashmap backend, its checkpoint, a
native RocksDB savepoint and an incremental RocksDB checkpoint. That every state equals Flink's own
restore entry by entry (on both decode paths) and that lookups equal filtered full reads is
checked for all fixtures by tests/reader/test_reader.py; here: what the rows mean.
"""

from __future__ import annotations

import datetime
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import statequery
from statequery.catalog import Catalog
from tests.conftest import FIXTURES, dump_entries, fixture_dir

CEP = [
    "sql-cep-hashmap-canonical",
    "sql-cep-hashmap-native",
    "sql-cep-hashmap-checkpoint",
    "sql-cep-rocksdb-native",
    "sql-cep-rocksdb-incremental-checkpoint",
]
PLAN = FIXTURES / "plans" / "sql-cep.json"
N_EVENTS, N_USERS = 60, 6
TS_BASE, MINUTE = 1_700_000_000_000, 60_000
MS = datetime.timedelta(milliseconds=1)
MATCH_STATES = {
    "nfaStateName", "sharedBuffer-events", "sharedBuffer-entries-with-lockable-edges",
    "sharedBuffer-events-count", "eventQueuesStateName", "_timer_state/event_watermark-callbacks",
    "_timer_state/processing_watermark-callbacks",
}


def _amount(i: int) -> int:
    return (i * 37) % 101


def _open(name: str, plan: str | None = None) -> Any:
    return statequery.open(str(fixture_dir(name)), use_snapshot=False, plan=plan)


def _op(sp: Any, kind: str, index: int = 0) -> Any:
    ops = sorted((o for o in sp.operators if o.uid.endswith("_" + kind)),
                 key=lambda o: int(o.uid.split("_")[0]))
    return ops[index]


def _by_user(sp: Any, op: Any, state: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in sp.read(op.operator_id, state).to_pylist():
        out.setdefault(r["key"]["f0"], []).append(r)
    return out


def _node(n: dict[str, Any]) -> tuple[int, int, str]:
    return (n["event_id"]["id"], n["event_id"]["timestamp"], n["page_name"])


@pytest.mark.parametrize("name", CEP)
def test_every_state_of_the_pattern_operator_is_read(name: str, decode_path: str) -> None:
    """The hashmap's own layout has no length prefixes: before the CEP serializers were decoded,
    one state holding entries made every state of the operator unreadable."""
    sp = _open(name)
    op = _op(sp, "match")
    assert {s.name for s in op.states} == MATCH_STATES
    meta = {r["state_name"]: r for r in sp.state_meta().to_pylist()
            if r["operator_id"] == op.operator_id}
    assert all(r["decodable"] for r in meta.values()), meta
    assert meta["nfaStateName"]["value_type"].startswith(
        "ROW<partial_matches ARRAY<ROW<state_name STRING, previous_entry ROW<event_id ROW<id INT, "
        "timestamp BIGINT>, page_name STRING>, version ARRAY<INT NOT NULL>, start_timestamp BIGINT")
    assert meta["sharedBuffer-events"]["user_key_type"] == "ROW<id INT, timestamp BIGINT>"
    counts = {s: sp.read(op.operator_id, s).num_rows for s in MATCH_STATES}
    assert counts["nfaStateName"] >= 1 and counts["sharedBuffer-events"] >= 1
    assert counts["sharedBuffer-entries-with-lockable-edges"] >= counts["sharedBuffer-events"]
    # every state's rows: as many as Flink's restore has entries
    dumped = Counter(e["state"] for e in dump_entries(name) if e["operator_id"] == op.operator_id)
    assert {s: n for s, n in counts.items() if n} == dict(dumped)


@pytest.mark.parametrize("name", CEP)
def test_partial_matches_point_into_the_shared_buffer(name: str, decode_path: str) -> None:
    sp = _open(name)
    op = _op(sp, "match")
    nfa = _by_user(sp, op, "nfaStateName")
    nodes = _by_user(sp, op, "sharedBuffer-entries-with-lockable-edges")
    events = _by_user(sp, op, "sharedBuffer-events")
    counts = _by_user(sp, op, "sharedBuffer-events-count")
    pending = 0
    for user, [row] in nfa.items():
        value = row["value"]
        assert value["completed_matches"] == []  # none held back in these snapshots
        by_node = {_node(n["user_key"]): n["value"] for n in nodes.get(user, [])}
        by_event = {(e["user_key"]["id"], e["user_key"]["timestamp"]): e["value"]
                    for e in events.get(user, [])}
        per_ts = {c["user_key"]: c["value"] for c in counts.get(user, [])}
        # an event is locked once per node that holds it; its id counts events of its timestamp
        held = Counter((n[0], n[1]) for n in by_node)
        assert {k: v["ref_count"] for k, v in by_event.items()} == dict(held)
        for (eid, ts), ev in by_event.items():
            row_ = ev["element"]
            # counts of timestamps the watermark passed are dropped
            assert eid < per_ts.get(ts, eid + 1)
            assert row_["f1"] == user and row_["f4"] == ts == TS_BASE + row_["f0"] * MINUTE
            assert row_["f2"] == _amount(row_["f0"])
        # the pages are the pattern variables; their events satisfy the DEFINE conditions
        for (eid, ts, page) in by_node:
            amount = by_event[(eid, ts)]["element"]["f2"]
            assert (page, amount > 50 if page == "A" else amount <= 95) in (("A", True),
                                                                           ("B", True))
        # a node is locked by each edge and each partial match that points at it
        refs: Counter[tuple[int, int, str]] = Counter()
        for n in by_node.values():
            for edge in n["edges"]:
                assert edge["version"]  # a Dewey number: at least one digit
                if edge["target"] is not None:
                    assert _node(edge["target"]) in by_node
                    refs[_node(edge["target"])] += 1
        for m in value["partial_matches"]:
            if m["previous_entry"] is None:  # waiting for its first event (A)
                assert m["state_name"] == "A" and m["start_event"] is None
                continue
            pending += 1
            prev = _node(m["previous_entry"])
            assert prev in by_node
            refs[prev] += 1
            assert m["state_name"] in ("B", "B:0")  # B+ expands to B:0 (first B) and B
            assert prev[2] == ("A" if m["state_name"] == "B:0" else "B")  # its last row's page
            start = m["start_event"]
            assert (start["id"], start["timestamp"]) in by_event
            assert m["start_timestamp"] == start["timestamp"]
            assert by_event[(start["id"], start["timestamp"])]["element"]["f2"] > 50  # an A
            assert m["version"][0] >= 1
        assert {k: v["ref_count"] for k, v in by_node.items()} == dict(refs)
    assert pending >= 3


@pytest.mark.parametrize("name", ["sql-cep-hashmap-native", "sql-cep-rocksdb-native"])
def test_event_queue_holds_the_events_after_the_watermark(name: str) -> None:
    """cep_events lags five minutes behind event time: the last five events wait in the queue
    (map: event time -> rows) with a watermark callback each."""
    sp = _open(name)
    op = _op(sp, "match")
    queued = sp.read(op.operator_id, "eventQueuesStateName").to_pylist()
    ids = sorted(row["f0"] for r in queued for row in r["value"])
    assert ids == list(range(N_EVENTS - 5, N_EVENTS))
    for r in queued:
        [row] = r["value"]
        assert r["user_key"] == TS_BASE + row["f0"] * MINUTE
        assert r["key"]["f0"] == row["f1"] == f"user-{row['f0'] % N_USERS}"
    timers = sp.read(op.operator_id, "_timer_state/event_watermark-callbacks").to_pylist()
    assert sorted(t["timestamp_ms"] for t in timers) == sorted(r["user_key"] for r in queued)


def test_waiting_partial_matches_in_sql(tmp_path: Path) -> None:
    """docs/decoding.md's example: which partial matches are waiting, and since when."""
    (tmp_path / "cep").symlink_to(fixture_dir("sql-cep-hashmap-native"))
    cat = Catalog(str(tmp_path))
    sp = _open("sql-cep-hashmap-native")
    table = next(r["table_name"] for r in sp.state_meta().to_pylist()
                 if r["state_name"] == "nfaStateName")
    got = statequery.sql(
        f"""SELECT key.f0 AS user_name, m.state_name AS waiting_in,
                   timestamp_millis(m.start_timestamp) AS since,
                   array_join(m.version, '.') AS version
            FROM (SELECT key, explode(value.partial_matches) AS m FROM cep.`{table}`)
            WHERE m.start_event IS NOT NULL
            ORDER BY user_name, since""",
        cat,
    ).to_pylist()
    want = []
    for r in dump_entries("sql-cep-hashmap-native"):
        if r["state"] == "nfaStateName":
            for m in r["value"]["partial_matches"]:
                if m["start_event"] is not None:
                    want.append((r["key"]["f0"], m["state_name"], m["start_timestamp"],
                                 ".".join(str(d) for d in m["version"])))
    assert got and len(got) == len(want)
    epoch = datetime.datetime(1970, 1, 1)
    assert sorted((g["user_name"], g["waiting_in"], g["since"], g["version"])
                  for g in got) == sorted((u, s, epoch + t * MS, v) for u, s, t, v in want)


# -- SQL state TTL ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", [CEP[0], CEP[4]])
def test_declared_ttl_from_the_plan(name: str) -> None:
    """The plan declares each node's TTL (table.exec.state.ttl = 1 d; STATE_TTL hint: 2 s on the
    per-user aggregation); state_meta shows it beside the TTL flag once the plan is attached."""
    without = _open(name).state_meta()
    assert set(without.column("declared_ttl_ms").to_pylist()) == {None}
    sp = _open(name, plan=str(PLAN))
    rows = {(r["operator_uid"], r["state_name"]): r for r in sp.state_meta().to_pylist()}
    per_user, per_category = (_op(sp, "group-aggregate", i).uid for i in (0, 1))
    assert rows[(per_user, "accState")]["ttl"] is True
    assert rows[(per_user, "accState")]["declared_ttl_ms"] == 2_000
    assert rows[(per_category, "accState")]["declared_ttl_ms"] == 86_400_000
    # states without a TTL wrapper (timers, the pattern's states) declare none
    assert all(r["declared_ttl_ms"] is None for r in rows.values() if not r["ttl"])


@pytest.mark.parametrize("name", ["sql-cep-hashmap-native", "sql-cep-rocksdb-native"])
def test_expired_and_live_ttl_entries(name: str) -> None:
    """Both aggregations were written in one burst when the job read its input; the savepoint
    came 8 s later (docs/fixtures.md). So the hinted one's entries (TTL 2 s) are expired -- still
    in the snapshot, as nothing read them since -- and the job-TTL ones (1 d) live: each row
    carries its last access time, the plan the TTL (``declared_ttl_ms``)."""
    sp = _open(name, plan=str(PLAN))
    short, long_ = _op(sp, "group-aggregate", 0), _op(sp, "group-aggregate", 1)
    s_rows = sp.read(short.operator_id, "accState").to_pylist()
    l_rows = sp.read(long_.operator_id, "accState").to_pylist()
    # the plan names keys and accumulators (user / category; cnt, total)
    assert sorted(r["key"]["user"] for r in s_rows) == [f"user-{u}" for u in range(N_USERS)]
    assert sorted(r["key"]["category"] for r in l_rows) == ["books", "games", "music"]
    for r in s_rows:
        mine = [i for i in range(N_EVENTS) if i % N_USERS == int(r["key"]["user"][5:])]
        assert r["value"] == {"cnt": len(mine), "total": sum(_amount(i) for i in mine)}
    accessed = [r["last_access"] for r in s_rows + l_rows]
    assert None not in accessed
    assert (max(accessed) - min(accessed)).total_seconds() < 5  # one burst of writes
    ttl = {r["operator_id"]: r["declared_ttl_ms"] for r in sp.state_meta().to_pylist()
           if r["state_name"] == "accState"}
    assert (ttl[short.operator_id], ttl[long_.operator_id]) == (2_000, 86_400_000)


# -- the window join and the upsert materializer of Flink 2.x --------------------------------


@pytest.mark.parametrize("name", ["sql-cep-hashmap-canonical", "sql-cep-rocksdb-native"])
def test_window_join_keeps_both_sides_per_window(name: str) -> None:
    sp = _open(name)
    op = _op(sp, "window-join")
    left = sp.read(op.operator_id, "left-records").to_pylist()
    right = sp.read(op.operator_id, "right-records").to_pylist()
    # list state per user and window end (the namespace, epoch ms): the rows of each side,
    # (id, user, window_start, window_end), until the window fires
    assert sorted(row["f0"] for r in left for row in r["value"]) == list(range(0, N_EVENTS, 2))
    assert sorted(row["f0"] for r in right for row in r["value"]) == list(range(0, N_EVENTS, 3))
    for r in left + right:
        for row in r["value"]:
            i = row["f0"]
            assert r["key"]["f0"] == row["f1"] == f"user-{i % N_USERS}"
            end = (TS_BASE + i * MINUTE) // (15 * MINUTE) * (15 * MINUTE) + 15 * MINUTE
            assert r["namespace"] == end
            assert row["f3"] == datetime.datetime(1970, 1, 1) + end * MS


@pytest.mark.parametrize("name", [CEP[1], CEP[4]])
def test_upsert_materializer_v2_keeps_the_rows_of_each_key(name: str) -> None:
    """table.exec.sink.upsert-materialize-strategy.type = VALUE: per sink key a list of
    (row, TTL timestamp) in arrival order; the last row is the one in the sink."""
    sp = _open(name)
    op = _op(sp, "upsert-materialize")
    rows = {r["key"]["f0"]: r["value"] for r in sp.read(op.operator_id, "list").to_pylist()}
    assert set(rows) == {"books", "games", "music"}
    for cat, entries in rows.items():
        users = [e["f0"]["f1"] for e in entries]
        assert sorted(users) == [f"user-{u}" for u in range(N_USERS)]
        for e in entries:
            mine = [i for i in range(N_EVENTS) if i % N_USERS == int(e["f0"]["f1"][5:])
                    and ["books", "games", "music"][(i // 10) % 3] == cat]
            assert e["f0"]["f0"] == cat and e["f0"]["f2"] == sum(_amount(i) for i in mine)


# -- a state nobody can decode does not hide the others (hashmap layout) ---------------------


@pytest.mark.parametrize("name", ["sql-cep-hashmap-native", "sql-cep-hashmap-checkpoint"])
def test_an_undecodable_state_is_passed_over_in_the_heap_layout(
    name: str, decode_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hashmap's own layout has no length prefixes: a state whose serializer statequery does
    not know cannot be walked. With the shared-buffer node serializer unknown (as a user's own
    serializer would be), the buffer nodes are listed as not decodable, and every other state of
    the operator still equals Flink's restore: the blocks after the unknown one are found again
    within the key group."""
    from support.entries import entry_lines, state_entries

    from statequery.serializers import snapshots

    cls = "org.apache.flink.cep.nfa.sharedbuffer.SharedBufferNodeSerializerSnapshotV2"
    monkeypatch.delitem(snapshots._BY_NAME, cls)
    monkeypatch.delitem(snapshots._BY_SIMPLE_NAME, snapshots.simple_class_name(cls))
    sp = _open(name)
    op = _op(sp, "match")
    meta = {r["state_name"]: r for r in sp.state_meta().to_pylist()
            if r["operator_id"] == op.operator_id}
    unknown = "sharedBuffer-entries-with-lockable-edges"
    assert not meta[unknown]["decodable"] and "SharedBufferNodeSerializerSnapshotV2" in str(
        meta[unknown]["value_type"]) + str(meta[unknown]["reason"])
    with pytest.raises(statequery.UnsupportedFormatError):
        sp.read(op.operator_id, unknown)
    dumped = dump_entries(name)
    checked = 0
    for st in op.states:
        if st.name == unknown:
            continue
        got = entry_lines(state_entries(sp.read(op.operator_id, st.name), st.kind, st.name,
                                        op.uid, op.operator_id))
        want = sorted(json.dumps(e, sort_keys=True, separators=(",", ":"))
                      for e in dumped
                      if e["operator_id"] == op.operator_id and e["state"] == st.name)
        assert got == want, st.name
        checked += len(want)
    assert checked > 20


@pytest.mark.parametrize("name", [CEP[3], CEP[4]])
def test_rocksdb_lookup_equals_filtered_full_read(name: str, decode_path: str) -> None:
    """(The hashmap fixtures are covered by tests/reader/test_reader.py.) A user's pattern
    state, from one key group of the RocksDB files: the same rows as a full read filtered to the
    user, in every state of the pattern operator that holds the user."""
    from support.entries import same_table

    sp = _open(name)
    op = _op(sp, "match")
    whole = {s.name: sp.read(op.operator_id, s.name) for s in op.states}
    for user in ("user-0", "user-3"):
        result = sp.lookup({"f0": user}, operator=op.operator_id)
        held = {s for s, t in whole.items() if {"f0": user} in t.column("key").to_pylist()}
        assert {s for _, s in result} == held and "nfaStateName" in held
        for (_, state), table in result.items():
            t = whole[state]
            want = t.take([i for i, k in enumerate(t.column("key").to_pylist())
                           if k == {"f0": user}])
            assert same_table(table, want)


def test_plan_names_the_buffered_rows() -> None:
    """With the compiled plan attached, the rows inside the shared buffer (``Lockable`` elements)
    and the event queue carry the query's column names, the key the PARTITION BY column."""
    sp = _open("sql-cep-hashmap-native", plan=str(PLAN))
    op = _op(sp, "match")
    events = sp.read(op.operator_id, "sharedBuffer-events").to_pylist()
    assert events
    for r in events:
        row = r["value"]["element"]
        assert list(row) == ["id", "user", "amount", "category", "ts", "rowtime"]
        assert r["key"] == {"user": row["user"]} and row["amount"] == _amount(row["id"])
        assert r["user_key"]["timestamp"] == row["ts"]
    queued = sp.read(op.operator_id, "eventQueuesStateName").to_pylist()
    assert sorted(x["id"] for r in queued for x in r["value"]) == list(range(55, 60))


def test_flink_1_15_nfa_has_no_previous_timestamp(decode_path: str) -> None:
    """Flink 1.15's NFA serializer (snapshot outer version 1) writes no previous timestamp per
    computation state (fixture v1.15-sql-cep-hashmap-native, SqlCepVersionJob): the rows have no
    such field, and the partial matches still point into the shared buffer."""
    sp = _open("v1.15-sql-cep-hashmap-native")
    [op] = [o for o in sp.operators if any(s.name == "nfaStateName" for s in o.states)]
    nfa = sp.read(op.operator_id, "nfaStateName").to_pylist()
    nodes = {(r["key"]["f0"], _node(r["user_key"])) for r in
             sp.read(op.operator_id, "sharedBuffer-entries-with-lockable-edges").to_pylist()}
    events = {(r["key"]["f0"], r["user_key"]["id"], r["user_key"]["timestamp"]): r["value"]
              for r in sp.read(op.operator_id, "sharedBuffer-events").to_pylist()}
    started = 0
    for r in nfa:
        for m in r["value"]["partial_matches"]:
            assert "previous_timestamp" not in m
            if m["start_event"] is not None:
                started += 1
                assert (r["key"]["f0"], _node(m["previous_entry"])) in nodes
                ev = events[(r["key"]["f0"], m["start_event"]["id"], m["start_event"]["timestamp"])]
                assert ev["element"]["f2"] > 50  # its first row is an A
    assert started >= 3


def test_upsert_materializer_map_strategy_is_a_linked_list_of_rows(decode_path: str) -> None:
    """table.exec.sink.upsert-materialize-strategy.type = MAP (fixture sql-cep-map-hashmap-native):
    per sink key a doubly linked list of the rows by sequence number (``sqnToNodeState``), each
    row's sequence numbers (``rowToSqnState``, keyed by the row) and the highest number and size
    (``highestSqnState``). Its header once failed every read of the savepoint (the row key
    serializer's snapshot frames its generated code objects with a length)."""
    sp = _open("sql-cep-map-hashmap-native")
    op = _op(sp, "upsert-materialize")
    meta = {r["state_name"]: r for r in sp.state_meta().to_pylist()
            if r["operator_id"] == op.operator_id}
    assert set(meta) == {"highestSqnState", "rowToSqnState", "sqnToNodeState"}
    assert all(r["decodable"] for r in meta.values())
    nodes = _by_user(sp, op, "sqnToNodeState")
    heads = {r["key"]["f0"]: r["value"] for r in sp.read(op.operator_id, "highestSqnState")
             .to_pylist()}
    sqns = _by_user(sp, op, "rowToSqnState")
    assert set(nodes) == set(heads) == set(sqns) == {"books", "games", "music"}
    for cat, rows in nodes.items():
        by_sqn = {r["user_key"]: r["value"] for r in rows}
        assert all(sqn == n["sqn"] for sqn, n in by_sqn.items())
        [first] = [n for n in by_sqn.values() if n["prev_sqn"] is None]
        chain = [first]
        while chain[-1]["next_sqn"] is not None:
            nxt = by_sqn[chain[-1]["next_sqn"]]
            assert nxt["prev_sqn"] == chain[-1]["sqn"]
            chain.append(nxt)
        assert len(chain) == len(by_sqn) == heads[cat]["size"] == N_USERS
        assert chain[-1]["sqn"] == heads[cat]["high_sqn"]
        for n in chain:
            row = n["row"]
            mine = [i for i in range(N_EVENTS) if i % N_USERS == int(row["f1"][5:])
                    and ["books", "games", "music"][(i // 10) % 3] == cat]
            assert row["f0"] == cat and row["f2"] == sum(_amount(i) for i in mine)
        where = {(r["user_key"]["f0"], r["user_key"]["f1"]): r["value"] for r in sqns[cat]}
        for n in chain:
            assert where[(n["row"]["f0"], n["row"]["f1"])] == {"first_sqn": n["sqn"],
                                                               "last_sqn": n["sqn"]}
