"""The DataStream CEP library (``CEP.pattern(keyedStream, pattern)``), read from savepoints Flink
2.3.0 wrote (docs/decoding.md, "MATCH_RECOGNIZE"; docs/fixtures.md, "The DataStream CEP job").

The fixtures come from examples/flink-jobs/src/statequery/fixtures/CepStreamJob.java: events
0..59 (``Event`` POJOs) keyed by ``"k" + (id % 4)``, the pattern ``first (amount > 50)``, ``next
middle (amount <= 95)`` one or more, consecutive, ``next last (amount > 95)``, watermarks five
minutes behind the last event. That every state equals Flink's own restore entry by entry (on
both decode paths) is checked by tests/reader/test_reader.py; here: the events are the user's
POJOs and the partial matches point into the shared buffer.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import statequery
from statequery.catalog import Catalog
from tests.conftest import dump_entries, fixture_dir

FIXTURES = ["cep-stream-hashmap-canonical", "cep-stream-rocksdb-native"]
N_EVENTS, N_KEYS = 60, 4
TS_BASE, MINUTE = 1_700_000_000_000, 60_000
CATEGORIES = ["books", "games", "music", "food"]
STATES = {
    "nfaStateName", "sharedBuffer-events", "sharedBuffer-entries-with-lockable-edges",
    "sharedBuffer-events-count", "eventQueuesStateName", "_timer_state/event_watermark-callbacks",
    "_timer_state/processing_watermark-callbacks",
}
EVENT_TYPE = ("POJO<statequery.fixtures.Event>{amount INT, category STRING, id INT, ts BIGINT, "
              "user STRING}")


def _event(i: int) -> dict[str, Any]:
    """Event.of(i) (Event.java), as statequery reads the POJO."""
    return {"amount": (i * 37) % 101, "category": CATEGORIES[(i // 20) % 4], "id": i,
            "ts": TS_BASE + i * MINUTE, "user": f"user-{i % 20}"}


def _open(name: str) -> Any:
    return statequery.open(str(fixture_dir(name)), use_snapshot=False)


def _by_key(sp: Any, state: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in sp.read("cep-pattern", state).to_pylist():
        out.setdefault(r["key"], []).append(r)
    return out


def _node(n: dict[str, Any]) -> tuple[int, int, str]:
    return (n["event_id"]["id"], n["event_id"]["timestamp"], n["page_name"])


@pytest.mark.parametrize("name", FIXTURES)
def test_states_and_types(name: str) -> None:
    sp = _open(name)
    meta = {r["state_name"]: r for r in sp.state_meta().to_pylist()
            if r["operator_uid"] == "cep-pattern"}
    assert set(meta) == STATES
    assert all(r["decodable"] and r["reason"] is None for r in meta.values()), meta
    assert meta["sharedBuffer-events"]["value_type"] == f"ROW<ref_count INT, element {EVENT_TYPE}>"
    assert meta["eventQueuesStateName"]["value_type"] == f"ARRAY<{EVENT_TYPE}>"
    assert meta["nfaStateName"]["key_type"] == "STRING"


@pytest.mark.parametrize("name", FIXTURES)
def test_buffered_events_are_the_users_pojos(name: str, decode_path: str) -> None:
    """Every event in the shared buffer and in the queue is the job's Event, field for field."""
    sp = _open(name)
    seen = 0
    for key, rows in _by_key(sp, "sharedBuffer-events").items():
        for r in rows:
            event = r["value"]["element"]
            assert event == _event(event["id"])
            assert key == f"k{event['id'] % N_KEYS}"
            assert r["user_key"]["timestamp"] == event["ts"]
            seen += 1
    assert seen >= 10
    # the watermark is ts(59) - 5 min - 1 ms: ids 54..59 wait, each with a watermark callback
    queued = sp.read("cep-pattern", "eventQueuesStateName").to_pylist()
    assert sorted(e["id"] for r in queued for e in r["value"]) == list(range(54, N_EVENTS))
    for r in queued:
        [event] = r["value"]
        assert event == _event(event["id"])
        assert r["user_key"] == event["ts"] and r["key"] == f"k{event['id'] % N_KEYS}"
    timers = sp.read("cep-pattern", "_timer_state/event_watermark-callbacks").to_pylist()
    assert sorted(t["timestamp_ms"] for t in timers) == sorted(r["user_key"] for r in queued)


@pytest.mark.parametrize("name", FIXTURES)
def test_partial_matches_point_into_the_shared_buffer(name: str, decode_path: str) -> None:
    sp = _open(name)
    nfa = _by_key(sp, "nfaStateName")
    nodes = _by_key(sp, "sharedBuffer-entries-with-lockable-edges")
    events = _by_key(sp, "sharedBuffer-events")
    assert sorted(nfa) == [f"k{k}" for k in range(N_KEYS)]
    pending = 0
    for key, [row] in nfa.items():
        value = row["value"]
        assert value["completed_matches"] == []
        by_node = {_node(n["user_key"]): n["value"] for n in nodes.get(key, [])}
        by_event = {(e["user_key"]["id"], e["user_key"]["timestamp"]): e["value"]
                    for e in events.get(key, [])}
        # an event is locked once per node that holds it
        held = Counter((n[0], n[1]) for n in by_node)
        assert {k: v["ref_count"] for k, v in by_event.items()} == dict(held)
        # the pages are the pattern's names; their events satisfy its conditions
        for (eid, ts, page) in by_node:
            amount = by_event[(eid, ts)]["element"]["amount"]
            assert page in ("first", "middle") and (amount > 50 if page == "first"
                                                    else amount <= 95)
        refs: Counter[tuple[int, int, str]] = Counter()
        for n in by_node.values():
            for edge in n["edges"]:
                assert edge["version"]
                if edge["target"] is not None:
                    assert _node(edge["target"]) in by_node
                    refs[_node(edge["target"])] += 1
        for m in value["partial_matches"]:
            if m["previous_entry"] is None:  # the start state, waiting for a "first"
                assert m["state_name"] == "first" and m["start_event"] is None
                continue
            pending += 1
            prev = _node(m["previous_entry"])
            assert prev in by_node
            refs[prev] += 1
            assert m["state_name"] in ("middle", "middle:0")
            assert prev[2] == ("first" if m["state_name"] == "middle:0" else "middle")
            assert m["previous_timestamp"] == prev[1]
            start = by_event[(m["start_event"]["id"], m["start_event"]["timestamp"])]["element"]
            assert m["start_timestamp"] == start["ts"] and start["amount"] > 50
            # the run's rows, walked back from its last node, are consecutive events of its key
        assert {k: v["ref_count"] for k, v in by_node.items()} == dict(refs)
    assert pending >= 3


def test_partial_matches_in_sql(tmp_path: Path) -> None:
    """The runs still open per key, joined with the POJO of their first event, in SQL."""
    (tmp_path / "cep").symlink_to(fixture_dir(FIXTURES[0]))
    rows = statequery.sql(
        """SELECT m.key AS k, count(*) AS runs, min(e.value.element.id) AS first_start,
                  min(e.value.element.amount) AS min_amount
           FROM (SELECT key, explode(value.partial_matches) AS p
                 FROM cep.cep_pattern__nfastatename) m
           JOIN cep.cep_pattern__sharedbuffer_events e
             ON e.key = m.key AND e.user_key.id = m.p.start_event.id
            AND e.user_key.timestamp = m.p.start_event.timestamp
           GROUP BY 1 ORDER BY 1""",
        Catalog(str(tmp_path)),
    ).to_pylist()
    want: Counter[str] = Counter()
    for r in dump_entries(FIXTURES[0]):
        if r["state"] == "nfaStateName":
            want.update(r["key"] for m in r["value"]["partial_matches"] if m["start_event"])
    assert {r["k"]: r["runs"] for r in rows} == dict(want) and want
    for r in rows:
        assert _event(r["first_start"])["amount"] > 50 and r["min_amount"] > 50
