"""Heap timers of RocksDB checkpoints: the raw keyed state they live in is listed and read.

The fixtures ``datastream-rocksdb-checkpoint-heaptimers`` (full) and
``datastream-rocksdb-incremental-checkpoint-heaptimers`` were written by Flink 2.3 with
``state.backend.rocksdb.timer-service.factory: HEAP``: their timers are in each keyed operator's
raw keyed state (one ``InternalTimerServiceSerializationProxy`` per key group), and Flink's own
reader (``RawKeyedTimers.java`` in the oracle) dumped them. The generic fixture suites compare
every row with the dump; these tests pin what is specific to raw keyed state.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

import pytest
from conftest import dump_entries, fixture_dir, fixture_record
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import statequery
from statequery.exceptions import CorruptStateError, UnsupportedFormatError
from statequery.metadata.statemeta import dumps, loads

HEAP_TIMERS = [
    "datastream-rocksdb-checkpoint-heaptimers",
    "datastream-rocksdb-incremental-checkpoint-heaptimers",
]
TIMER_STATES = {
    ("user-state", "_timer_state/event_user-timers"): "event_timer",
    ("user-state", "_timer_state/processing_user-timers"): "processing_timer",
    ("window-agg", "_timer_state/event_window-timers"): "event_timer",
    ("window-agg", "_timer_state/processing_window-timers"): "processing_timer",
}


def _open(path: Path | str) -> statequery.Savepoint:
    return statequery.open(str(path), use_snapshot=False)


def _dump_counts(name: str) -> Counter[tuple[str, str]]:
    return Counter(
        (e["operator_uid"], e["state"]) for e in dump_entries(name) if "timer" in e["kind"]
    )


@pytest.mark.parametrize("name", HEAP_TIMERS)
def test_heap_timers_are_listed_from_raw_keyed_state(name: str) -> None:
    assert fixture_record(name)["timers"] == "heap"
    sp = _open(fixture_dir(name))
    rows = {
        (r["operator_uid"], r["state_name"]): r
        for r in sp.state_meta().to_pylist()
    }
    for (uid, state), kind in TIMER_STATES.items():
        row = rows[(uid, state)]
        assert row["kind"] == kind
        assert row["decodable"] and row["reason"] is None
        assert row["backend"] == "rocksdb"
        assert row["key_type"] == "STRING"
        assert row["size_bytes"] > 0
    assert rows[("window-agg", "_timer_state/event_window-timers")]["namespace_type"] == (
        "TimeWindow"
    )
    # nothing else of the raw stream is hidden or invented
    assert not [k for k, r in rows.items() if r["kind"] == "raw"]


@pytest.mark.parametrize("name", HEAP_TIMERS)
@pytest.mark.parametrize("pure", [False, True])
def test_every_heap_timer_is_read(name: str, pure: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if pure:
        monkeypatch.setenv("STATEQUERY_PURE_PYTHON", "1")
    sp = _open(fixture_dir(name))
    want = _dump_counts(name)
    # the job's pending timers: 20 user timers (one per user) and 80 window timers
    assert want[("user-state", "_timer_state/event_user-timers")] == 20
    assert want[("window-agg", "_timer_state/event_window-timers")] == 80
    got = Counter()
    for (uid, state) in TIMER_STATES:
        got[(uid, state)] = sp.read(uid, state).num_rows
    assert +got == +want
    # one key finds its timers (the key group of user-3 only)
    found = sp.read("user-state", "_timer_state/event_user-timers", key="user-3")
    assert found.column("key").to_pylist() == ["user-3"]
    assert found.column("timestamp_ms").to_pylist() == [4_102_444_800_003]
    looked = sp.lookup("user-3")
    assert looked[("window-agg", "_timer_state/event_window-timers")].num_rows == 4


def test_the_statemeta_snapshot_keeps_raw_keyed_timers() -> None:
    sp = _open(fixture_dir(HEAP_TIMERS[0]))
    again = loads(dumps(sp.meta))
    assert again == sp.meta
    names = {s.name: s.stream for op in again.operators for s in op.states}
    assert names["_timer_state/event_user-timers"] == "raw_keyed"
    assert names["count"] == "managed"


def _raw_files(root: Path) -> list[Path]:
    """The raw keyed streams of a heap-timer checkpoint (the files starting with the marker)."""
    out = []
    for p in sorted((root / "chk-1").iterdir()):
        if p.name != "_metadata" and p.read_bytes()[:4] == bytes.fromhex("f1cd859f"):
            out.append(p)
    return out


@pytest.fixture(scope="module")
def heap_timer_copy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    src = fixture_dir(HEAP_TIMERS[0]).parent
    dest = tmp_path_factory.mktemp("heaptimers") / src.name
    shutil.copytree(src, dest)
    sp = _open(dest / "chk-1")
    original = {s: sp.read(*s).sort_by("timestamp_ms") for s in TIMER_STATES}
    return dest, original


def test_raw_keyed_streams_are_found(heap_timer_copy: tuple[Path, dict]) -> None:
    root, _ = heap_timer_copy
    assert len(_raw_files(root)) == 4  # two keyed operators x two subtasks


@settings(
    max_examples=int(os.environ.get("STATEQUERY_FUZZ_EXAMPLES", "40")),  # more: a longer hunt
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_a_flipped_byte_in_raw_keyed_state_is_an_error_or_changes_nothing(
    heap_timer_copy: tuple[Path, dict], data: st.DataObject
) -> None:
    """A flipped byte anywhere in a raw keyed stream gives a typed error, or the same rows, or
    rows whose only change is that byte's value (the stream has no checksum): never fewer rows,
    never a crash."""
    root, original = heap_timer_copy
    files = _raw_files(root)
    path = data.draw(st.sampled_from(files))
    raw = path.read_bytes()
    pos = data.draw(st.integers(0, len(raw) - 1))
    flipped = bytearray(raw)
    flipped[pos] ^= data.draw(st.sampled_from([0x01, 0x80, 0xFF]))
    path.write_bytes(bytes(flipped))
    try:
        sp = _open(root / "chk-1")
        for s, want in original.items():
            try:
                got = sp.read(*s)
            except CorruptStateError as e:
                assert path.name in str(e)
                continue
            assert got.num_rows == want.num_rows, (s, path.name, pos)
    finally:
        path.write_bytes(raw)


def test_truncated_raw_keyed_state_is_a_typed_error(heap_timer_copy: tuple[Path, dict]) -> None:
    root, _ = heap_timer_copy
    path = _raw_files(root)[0]
    raw = path.read_bytes()
    try:
        path.write_bytes(raw[: len(raw) - 7])
        sp = _open(root / "chk-1")
        with pytest.raises(CorruptStateError) as e:
            for s in TIMER_STATES:
                sp.read(*s)
        assert path.name in str(e.value)
    finally:
        path.write_bytes(raw)


RAW_STATE = ["raw-state-hashmap-canonical", "raw-state-rocksdb-native"]


@pytest.mark.parametrize("name", RAW_STATE)
def test_an_operators_own_raw_state_is_listed_never_hidden(name: str) -> None:
    """``RawStateJob`` writes its own raw keyed and raw operator bytes beside a managed value
    state: both are rows of ``state_meta`` with their size and why they are not read."""
    sp = _open(fixture_dir(name))
    rows = {r["state_name"]: r for r in sp.state_meta().to_pylist()
            if r["operator_uid"] == "raw-state"}
    assert set(rows) == {"count", "(raw keyed state)", "(raw operator state)"}
    keyed, op = rows["(raw keyed state)"], rows["(raw operator state)"]
    assert keyed["kind"] == op["kind"] == "raw"
    assert not keyed["decodable"] and "not timers" in keyed["reason"]
    assert not op["decodable"] and "raw operator state" in op["reason"]
    # 128 key groups of "raw-kg-<kg>" (writeUTF) over two subtasks; two "raw-operator-<i>"
    assert keyed["size_bytes"] == sum(2 + len(f"raw-kg-{kg}") for kg in range(128))
    assert op["size_bytes"] == sum(2 + len(f"raw-operator-{i}") for i in range(2))
    with pytest.raises(UnsupportedFormatError, match="not timers"):
        sp.read("raw-state", "(raw keyed state)")
    # the managed state beside them reads as usual: 20 users, 10 events each
    count = sp.read("raw-state", "count")
    assert sorted(count.column("value").to_pylist()) == [10] * 20


def test_the_cli_names_raw_state_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from statequery.cli import main

    path = str(fixture_dir(RAW_STATE[0]))
    assert main(["read", path, "raw_state__raw_keyed_state"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not timers" in err[0] and "Traceback" not in err[0]
