"""The changelog state backend's retained checkpoints read exactly (issue 26).

Flink 2.3 with ``state.changelog.enabled`` (file-system change log under the job's checkpoint
directory, ``<job-id>/dstl/``), the DataStream fixture job (docs/fixtures.md):

* ``changelog-hashmap-unmaterialized-checkpoint``: taken before the first materialization, the
  keyed state is only in the change log (metadata records and every change);
* ``changelog-hashmap-checkpoint``: 150 events, a materialization (the hashmap base), then 50
  more events: a non-empty change log on top of the base;
* ``changelog-rocksdb-checkpoint``: the same with RocksDB underneath (incremental): the base
  is RocksDB's native snapshot (SST files), read from its tables;
* ``changelog-hashmap-memory-checkpoint``: the in-memory changelog storage (``memory``): the
  change log is inline in ``_metadata`` (``InMemoryChangelogStateHandle``), no base;
* ``changelog-hashmap-snappy-checkpoint``: the file-system log snappy-compressed
  (``state.changelog.dstl.dfs.compression.enabled``), no base;
* ``changelog-ops-{hashmap,rocksdb}-checkpoint``: the changes the fixture job never makes
  (``ChangelogOps.java``): clears, map-key and timer removals, list replacement, merging session
  windows;
* ``changelog-ttl-{hashmap,rocksdb}-checkpoint``: TTL'd value, list and map state (a
  Java-serialized ``StateTtlConfig`` in each metadata record) and window contents in a POJO
  window namespace (variable length: length-suffixed RocksDB composite keys), a base and a
  non-empty log (``ChangelogTtl.java``).

Every keyed entry must equal the fixture model (``expected/<name>.jsonl``, computed from the
job's input) on both decode paths; ``state_meta`` lists every state with the changes applied.
... and Flink's own restore (``dump/<name>.jsonl``: SavepointDump through Flink's
``ChangelogStateBackend`` around the base's backend). The manifest lists these fixtures under
``changelog`` (the oracle test reads them; the other fixture suites do not).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, load_manifest
from support.entries import canonical, state_entries

import statequery
from statequery.cli import main
from statequery.exceptions import StatequeryError

KEYED = ("user-state", "window-agg")
STATES = {
    "user-state": {"count", "recent-categories", "amount-by-category", "sum-amount",
                   "avg-amount", "profile", "_timer_state/event_user-timers",
                   "_timer_state/processing_user-timers"},
    "window-agg": {"window-contents", "_timer_state/event_window-timers"},
}


def _record(name: str) -> dict[str, Any]:
    return next(r for r in load_manifest()["changelog"] if r["name"] == name)


def _open(name: str) -> Any:
    return statequery.open(str(FIXTURES / _record(name)["path"]), use_snapshot=False)


def _expected(
    name: str, where: str = "expected", operators: tuple[str, ...] = KEYED
) -> list[str]:
    lines = (FIXTURES / where / f"{name}.jsonl").read_text().splitlines()
    return sorted(
        canonical({k: v for k, v in e.items() if k != "key_group"})
        for e in map(json.loads, lines)
        if e["operator_uid"] in operators
    )


@pytest.mark.parametrize(
    "name",
    [
        "changelog-hashmap-unmaterialized-checkpoint",
        "changelog-hashmap-checkpoint",
        "changelog-rocksdb-checkpoint",
        "changelog-hashmap-memory-checkpoint",
        "changelog-hashmap-snappy-checkpoint",
    ],
)
def test_keyed_state_equals_the_model(name: str, decode_path: str) -> None:
    sp = _open(name)
    got = []
    for op in sp.operators:
        if op.uid not in KEYED:
            continue
        for s in op.states:
            table = sp.read(s)
            got += [canonical(e) for e in state_entries(
                table, s.kind, s.name, op.uid, op.operator_id, key_group=False)]
    want = _expected(name)
    assert len(want) > 300
    assert sorted(got) == want
    # ... and Flink's own restore of the checkpoint (SavepointDump through the
    # ChangelogStateBackend around the base's backend), entry by entry
    assert sorted(got) == _expected(name, "dump")


@pytest.mark.parametrize(
    "name", ["changelog-ops-hashmap-checkpoint", "changelog-ops-rocksdb-checkpoint"]
)
def test_clears_removals_and_merges_equal_flinks_restore(name: str, decode_path: str) -> None:
    # ChangelogOps.java: CLEAR (value, list), REMOVE_ELEMENT (map keys, timers), list SET,
    # MERGE_NS of session-window contents, the merging-window-set; the log alone (hashmap) and
    # on top of a RocksDB base. The model covers the ops operator; the oracle covers all.
    sp = _open(name)
    got = []
    for op in sp.operators:
        if op.uid not in ("ops", "sessions"):
            continue
        for s in op.states:
            got += [canonical(e) for e in state_entries(
                sp.read(s), s.kind, s.name, op.uid, op.operator_id, key_group=False)]
    dump = _expected(name, "dump", ("ops", "sessions"))
    assert len(dump) > 250
    assert sorted(got) == dump
    model = set(_expected(name, "expected", ("ops",)))
    assert model and model <= set(got)
    rows = {r["state_name"]: r for r in sp.state_meta().to_pylist()
            if r["operator_uid"] in ("ops", "sessions")}
    assert {"last-id", "slots", "history", "window-contents", "merging-window-set"} <= set(rows)


@pytest.mark.parametrize("name", sorted([
    "changelog-ops-hashmap-checkpoint",
    "changelog-ops-rocksdb-checkpoint",
    "changelog-hashmap-unmaterialized-checkpoint",
    "changelog-hashmap-checkpoint",
    "changelog-rocksdb-checkpoint",
    "changelog-hashmap-memory-checkpoint",
    "changelog-hashmap-snappy-checkpoint",
    "changelog-ttl-hashmap-checkpoint",
    "changelog-ttl-rocksdb-checkpoint",
]))
def test_every_state_flink_restores_is_listed(name: str) -> None:
    dumped = {
        (e["operator_uid"], e["state"])
        for e in map(json.loads, (FIXTURES / "dump" / f"{name}.jsonl").read_text().splitlines())
    }
    listed = {(r["operator_uid"], r["state_name"]) for r in _open(name).state_meta().to_pylist()}
    assert dumped and dumped <= listed


def test_state_meta_says_changelog_and_the_changes_applied() -> None:
    only_log = {r["state_name"]: r for r in _open(
        "changelog-hashmap-unmaterialized-checkpoint").state_meta().to_pylist()}
    on_base = {r["state_name"]: r for r in _open(
        "changelog-hashmap-checkpoint").state_meta().to_pylist()}
    for rows in (only_log, on_base):
        for uid, names in STATES.items():
            assert names <= set(rows), uid
        for name in set().union(*STATES.values()):
            assert rows[name]["backend"] == "changelog" and rows[name]["decodable"], name
    # 200 events logged before any materialization; 50 after it (the base holds 150)
    assert only_log["count"]["changelog_changes"] == 200
    assert on_base["count"]["changelog_changes"] == 50
    assert on_base["window-contents"]["changelog_changes"] == 50
    # operator state is outside the change log
    assert only_log["buffered-ids"]["changelog_changes"] is None


def test_a_change_log_that_cannot_be_read_is_listed_with_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the same checkpoint with its change-log file cut short: every keyed state is still
    # listed (from the base's header), not decodable, with the reason; inspect says it
    import shutil

    src = FIXTURES / _record("changelog-hashmap-checkpoint")["path"].split("/")[0]
    dst = tmp_path / "cut"
    shutil.copytree(src, dst)
    logs = [p for p in dst.rglob("*") if p.parent.name == "dstl"]
    assert logs
    for log in logs:
        log.write_bytes(log.read_bytes()[: log.stat().st_size // 2])
    path = next(dst.glob("*/chk-*"))
    sp = statequery.open(str(path), use_snapshot=False)
    rows = [r for r in sp.state_meta().to_pylist() if r["operator_uid"] in KEYED]
    assert set().union(*STATES.values()) <= {r["state_name"] for r in rows}
    for r in rows:
        assert not r["decodable"] and r["reason"].startswith("changelog state backend"), r
        assert r["size_bytes"] > 0
    with pytest.raises(StatequeryError):
        sp.read("user-state", "count")
    assert main(["inspect", str(path), "--json"]) == 0
    assert "changelog state backend" in capsys.readouterr().out


def test_inspect_lists_the_changes(capsys: pytest.CaptureFixture[str]) -> None:
    path = FIXTURES / _record("changelog-rocksdb-checkpoint")["path"]
    assert main(["inspect", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["backend"] == "changelog"
    assert {r["state_name"]: r["changelog_changes"] for r in doc["states"]}["count"] == 50
    assert main(["inspect", str(path)]) == 0
    # the 8 user states (timers included) 50 changes each, the window contents 50, its event
    # timers 100, its processing-time timers none (registered, never changed)
    assert "changelog state backend: 550 logged change(s) applied to 11 keyed state(s)" in (
        capsys.readouterr().out)


def test_a_key_lookup_reads_the_merged_state(decode_path: str) -> None:
    sp = _open("changelog-hashmap-checkpoint")
    for state in ("count", "amount-by-category", "recent-categories"):
        whole = [r for r in sp.read("user-state", state).to_pylist() if r["key"] == "user-7"]
        assert whole
        assert sp.read("user-state", state, key="user-7").to_pylist() == whole


def test_the_snapshot_keeps_the_changes(tmp_path: Path) -> None:
    import shutil

    src = FIXTURES / _record("changelog-rocksdb-checkpoint")["path"].split("/")[0]
    shutil.copytree(src, tmp_path / "c")
    path = str(next((tmp_path / "c").glob("*/chk-*")))
    statequery.open(path, use_snapshot=False).write_snapshot()
    sp = statequery.open(path)  # from the StateMeta snapshot
    rows = {r["state_name"]: r for r in sp.state_meta().to_pylist()}
    assert rows["count"]["changelog_changes"] == 50
    assert rows["rules"]["changelog_changes"] is None
    assert sp.read("user-state", "count").num_rows == 20


def test_the_fixtures_are_small() -> None:
    for r in load_manifest()["changelog"]:
        root = FIXTURES / r["path"].split("/")[0]
        size = sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())
        assert size < 400_000, (r["name"], size)


def test_operator_state_beside_the_change_log_reads_as_the_job_wrote_it() -> None:
    name = "changelog-hashmap-unmaterialized-checkpoint"
    sp = _open(name)
    want = sorted(
        canonical({k: v for k, v in e.items() if k != "operator_id"})
        for e in map(json.loads, (FIXTURES / "expected" / f"{name}.jsonl").read_text()
                     .splitlines())
        if e["operator_uid"] in ("fixture-source", "operator-state")
    )
    got = []
    for op in sp.operators:
        for s in op.states:
            if s.kind in ("operator_list", "operator_union", "broadcast"):
                got += [canonical({k: v for k, v in e.items() if k != "operator_id"})
                        for e in state_entries(sp.read(s), s.kind, s.name, op.uid,
                                               op.operator_id, False)]
    assert want and sorted(got) == want


# -- TTL'd state and variable-length namespaces (ChangelogTtl.java) ----------------------------

TTL_FIXTURES = ["changelog-ttl-hashmap-checkpoint", "changelog-ttl-rocksdb-checkpoint"]
TTL_UIDS = ("ttl", "labels")


@pytest.mark.parametrize("name", TTL_FIXTURES)
def test_ttl_state_and_pojo_windows_equal_flinks_restore(name: str, decode_path: str) -> None:
    # ttl-count/-list/-map: TTL'd value, list and map state (a Java-serialized StateTtlConfig
    # in each metadata record); labels: window contents in a POJO namespace (on RocksDB the
    # base's composite keys carry length suffixes after the key and the namespace)
    sp = _open(name)
    got = []
    for op in sp.operators:
        if op.uid not in TTL_UIDS:
            continue
        for s in op.states:
            got += [canonical(e) for e in state_entries(
                sp.read(s), s.kind, s.name, op.uid, op.operator_id, key_group=False)]
    dump = _expected(name, "dump", TTL_UIDS)
    assert len(dump) == 20 + 17 + 71 + 80
    assert sorted(got) == dump
    # the model (last_access: processing time, any) covers the ttl operator
    from support.entries import mask_any

    model = [json.loads(m) for m in _expected(name, "expected", ("ttl",))]
    assert len(model) == 108
    mine = [json.loads(g) for g in got if json.loads(g)["operator_uid"] == "ttl"]
    assert sorted(canonical(e) for e in mask_any(mine, model)) == sorted(map(canonical, model))
    # both parts of the checkpoint hold these states: the base and a non-empty change log
    rows = {r["state_name"]: r for r in sp.state_meta().to_pylist()
            if r["operator_uid"] in TTL_UIDS}
    for state in ("ttl-count", "ttl-list", "ttl-map", "window-contents"):
        assert rows[state]["decodable"] and rows[state]["changelog_changes"] > 0, state


def test_ttl_state_reads_as_on_the_plain_backends() -> None:
    # the same columns as TTL state of a hashmap or RocksDB savepoint (value + last_access)
    plain = statequery.open(str(FIXTURES / next(
        r for r in load_manifest()["fixtures"] if r["name"] == "ttl-kryo-hashmap-canonical"
    )["path"]), use_snapshot=False)
    for name in TTL_FIXTURES:
        sp = _open(name)
        for state in ("ttl-count", "ttl-list", "ttl-map"):
            got = sp.read("ttl", state).schema
            want = plain.read("ttl-kryo-state", state).schema
            assert got.names == want.names and got.types == want.types, (name, state)


def _metadata_records(name: str) -> dict[str, bytes]:
    """state name -> its first METADATA record in the fixture's change-log files."""
    from statequery.decoder import Decoder
    from statequery.metadata.changelog import METADATA
    from statequery.metadata.proxy import _read_state_meta

    out: dict[str, bytes] = {}
    root = FIXTURES / _record(name)["path"].split("/")[0]
    for path in sorted(p for p in root.rglob("*") if p.parent.name == "dstl"):
        data = path.read_bytes()[1:]
        pos = 0
        while pos < len(data):
            d = Decoder(data, source=str(path))
            d.pos = pos
            for _ in range(d.read_int()):
                n, _kg = d.read_int(), d.read_int()
                for _ in range(n):
                    change = d.read_bytes(d.read_int())
                    if change[0] == METADATA:
                        m = Decoder(change, source=str(path))
                        m.pos = 5
                        out.setdefault(_read_state_meta(m, 0).name, change)
            pos = d.pos
    return out


def test_the_java_serialized_ttl_configs() -> None:
    from statequery.decoder import Decoder
    from statequery.metadata.changelog import _metadata_record

    records = _metadata_records("changelog-ttl-hashmap-checkpoint")
    got = {}
    for state in ("ttl-count", "ttl-list", "ttl-map", "window-contents"):
        d = Decoder(records[state], source=state)
        d.pos = 1
        meta, _sid, ttl = _metadata_record(d)
        assert meta.name == state and d.pos == len(records[state])
        got[state] = ttl
    day = 86_400_000
    assert got["window-contents"] is None
    c, lst, m = got["ttl-count"], got["ttl-list"], got["ttl-map"]
    assert (c.ttl_ms, c.update_type, c.visibility, c.time_characteristic, c.cleanup) == (
        365 * day, "OnCreateAndWrite", "NeverReturnExpired", "ProcessingTime",
        ("FULL_STATE_SCAN_SNAPSHOT",))
    assert (lst.ttl_ms, lst.update_type, lst.visibility, lst.cleanup) == (
        365 * day, "OnReadAndWrite", "ReturnExpiredIfNotCleanedUp", ("INCREMENTAL_CLEANUP",))
    assert (m.ttl_ms, m.update_type, m.visibility, m.cleanup) == (
        30 * day, "OnCreateAndWrite", "NeverReturnExpired", ("ROCKSDB_COMPACTION_FILTER",))
    assert all(t.cleanup_in_background for t in (c, lst, m))


def test_a_cut_or_altered_ttl_config_is_a_typed_error() -> None:
    # every truncation and every single-byte change of a record: a typed error or a parse,
    # never another exception (the reader is bounded: no recursion or allocation runs away)
    from statequery.decoder import Decoder
    from statequery.exceptions import CorruptStateError, UnsupportedFormatError
    from statequery.metadata.changelog import _metadata_record

    record = _metadata_records("changelog-ttl-hashmap-checkpoint")["ttl-map"]
    variants = [record[:n] for n in range(len(record))]
    variants += [record[:i] + bytes([record[i] ^ 0xFF]) + record[i + 1:]
                 for i in range(0, len(record), 3)]
    typed = 0
    for v in variants:
        d = Decoder(v, source="record")
        d.pos = 1
        try:
            _metadata_record(d)
        except (CorruptStateError, UnsupportedFormatError):
            typed += 1
    assert typed >= len(record)  # every truncation fails


def test_the_java_serialization_reader_is_bounded() -> None:
    # crafted streams: class descriptors nested 200 deep, a reference to a handle never made,
    # a string of 2^40 bytes, an exception record: typed errors (no RecursionError, no
    # allocation from a length)
    import struct as _struct

    from statequery.decoder import Decoder
    from statequery.exceptions import CorruptStateError, UnsupportedFormatError
    from statequery.metadata.javaser import read_object

    desc = b"\x72\x00\x01A" + bytes(8) + b"\x02\x00\x00\x78"
    cases = {
        "deeper than": b"\xac\xed\x00\x05\x73" + desc * 200 + b"\x70",
        "unknown handle": b"\xac\xed\x00\x05\x71\x00\x7e\x00\x05",
        "string of": b"\xac\xed\x00\x05\x7c" + _struct.pack(">q", 1 << 40) + b"x",
        "exception record": b"\xac\xed\x00\x05\x7b",
        "no 0xACED": b"\xac\xee\x00\x05\x70",
    }
    for what, data in cases.items():
        with pytest.raises((CorruptStateError, UnsupportedFormatError), match=what):
            read_object(Decoder(data, source="crafted"))
    # ... and a well-formed one: an object of a class with an int and a String field
    obj = read_object(Decoder(
        b"\xac\xed\x00\x05\x73\x72\x00\x01P" + bytes(8) + b"\x02\x00\x02I\x00\x01nL\x00\x01s"
        b"\x74\x00\x12Ljava/lang/String;\x78\x70" + _struct.pack(">i", -7) + b"\x74\x00\x02hi",
        source="crafted"))
    assert (obj.class_name, obj.fields) == ("P", {"n": -7, "s": "hi"})


def test_a_base_key_group_with_another_id_is_named(tmp_path: Path, decode_path: str) -> None:
    # the materialized hashmap base is walked by the hashmap reader's own key-group iterator
    # (HeapKeyGroupStream.key_group_bytes): a key group starting with another id is the same
    # typed error, naming the base's file and the key group's offset
    import shutil
    import struct

    from statequery.exceptions import CorruptStateError
    from statequery.metadata.handles import KeyGroupsHandle

    src = FIXTURES / _record("changelog-hashmap-checkpoint")["path"].split("/")[0]
    shutil.copytree(src, tmp_path / "c")
    path = next((tmp_path / "c").glob("*/chk-*"))
    sp = statequery.open(str(path), use_snapshot=False)
    handle = sp.operator("user-state").subtasks[0].keyed_handle
    base = next(b for b in handle.materialized if isinstance(b, KeyGroupsHandle))
    assert base.start_key_group == 0
    offset = base.offsets[1]  # key group 1
    name = base.delegate.path.rsplit("/", 1)[1]
    file = next(p for p in (tmp_path / "c").rglob(name))
    data = bytearray(file.read_bytes())
    assert struct.unpack_from(">i", data, offset)[0] == 1
    struct.pack_into(">i", data, offset, 99)
    file.write_bytes(bytes(data))
    sp = statequery.open(str(path), use_snapshot=False)
    with pytest.raises(CorruptStateError) as e:
        sp.read("user-state", "count")
    assert "key group 1 starts with key group id 99" in str(e.value)
    assert name in str(e.value) and str(offset) in str(e.value)
