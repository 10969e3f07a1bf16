"""The run index (statequery.metadata.runindex) on the committed Flink-written fixtures:

* both walkers record the same runs, and the runs tile each key group exactly;
* with the index (from the StateMeta snapshot, or recorded in memory by an earlier walk) every
  state of every canonical fixture reads the identical table, on both decode paths;
* a cold single-state read with a snapshot+index reads only that state's runs, ``_metadata`` and
  the snapshot (``FileIO.stats``);
* an index that does not match the bytes never gives wrong rows: a warning naming the file, and
  the key group walked whole;
* the snapshot section (format 4) round-trips; the CLI writes it with ``--index``.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa
import pytest
from conftest import fixture_dir, fixture_records
from support.entries import same_table

import statequery
from statequery.backends import fastpath, is_heap_layout
from statequery.backends.keygroups import key_group_prefix_bytes, scan_key_group
from statequery.backends.snappy import decompress_framed
from statequery.cli import main
from statequery.exceptions import (
    CorruptStateError,
    RunIndexMismatchWarning,
    SnapshotIgnoredWarning,
)
from statequery.io import FileIO
from statequery.metadata.handles import KeyGroupsHandle
from statequery.metadata.runindex import RunIndex
from statequery.metadata.statemeta import FORMAT_VERSION, dumps, loads
from statequery.savepoint import Savepoint

CANONICAL = [
    r["name"]
    for r in fixture_records()
    if r["format"] == "canonical" and r["snapshot"] == "savepoint"
]
PLAIN = "datastream-hashmap-canonical"
SNAPPY = "datastream-rocksdb-canonical-snappy"


def _key_groups(sp: Savepoint) -> list[dict[str, Any]]:
    """Every key group of every canonical keyed handle: where its bytes are, and its runs as an
    independent walk (the file read with ``open``, the pure walker) finds them."""
    out = []
    for op in sp.operators:
        for st in op.subtasks:
            h, header = st.keyed_handle, st.keyed_header
            if not isinstance(h, KeyGroupsHandle) or header is None or is_heap_layout(h):
                continue
            loc = sp.resolver.location(h.delegate)
            if loc is None:  # inline bytes
                data = bytes(sp.resolver.read(h.delegate, 0, sp.resolver.stream_size(h.delegate)))
            else:
                data = Path(loc).read_bytes()
            starts = sorted((o, h.start_key_group + i) for i, o in enumerate(h.offsets) if o > 0)
            for n, (start, kg) in enumerate(starts):
                end = starts[n + 1][0] if n + 1 < len(starts) else len(data)
                raw = data[start:end]
                buf = decompress_framed(raw, loc or "inline", start) if header.compressed else raw
                runs: list[int] = []
                scan_key_group(
                    buf,
                    kg,
                    key_group_prefix_bytes(op.max_parallelism),
                    [None] * len(header.state_ids),
                    (),
                    runs,
                )
                out.append(
                    {
                        "operator_id": op.operator_id,
                        "subtask": st.index,
                        "kg": kg,
                        "location": loc,
                        "start": start,
                        "end": end,
                        "buf": buf,
                        "runs": runs,
                        "ids": dict(header.state_ids),
                        "prefix": key_group_prefix_bytes(op.max_parallelism),
                        "compressed": header.compressed,
                    }
                )
    return out


@pytest.mark.parametrize("name", CANONICAL)
def test_both_walkers_record_the_same_runs_and_they_tile_the_key_group(name: str) -> None:
    sp = statequery.open(str(fixture_dir(name)), use_snapshot=False)
    groups = _key_groups(sp)
    assert groups
    for g in groups:
        buf, runs = g["buf"], g["runs"]
        compiled = fastpath._compiled  # built unless STATEQUERY_NO_EXTENSIONS (conftest)
        if compiled is not None:
            again: list[int] = []
            compiled.scan_key_group(buf, g["kg"], g["prefix"], [None] * len(g["ids"]), (), again)
            assert again == runs
        pos = 0
        seen = []
        for i in range(0, len(runs), 3):
            sid, start, length = runs[i : i + 3]
            # the run starts after its 2-byte state id and ends at the next id or the end mark
            assert start == pos + 2 and int.from_bytes(buf[pos:start], "big") == sid
            assert length > 0
            pos = start + length
            seen.append(sid)
        assert buf[pos:] == b"\xff\xff"
        assert len(set(seen)) == len(seen) and set(seen) <= set(g["ids"].values())


def _indexed(name: str, tmp_path: Path) -> tuple[str, str]:
    """(savepoint path, a snapshot with the run index written for it)."""
    path = str(fixture_dir(name))
    snapshot = statequery.open(path, use_snapshot=False).write_snapshot(
        str(tmp_path / "meta.msgpack"), index=True
    )
    return path, snapshot


def _reads(sp: Savepoint) -> list[tuple[str, str | None]]:
    """(table name, mode) of every keyed, decodable state, in each of its modes."""
    out: list[tuple[str, str | None]] = []
    for s in sp.states:
        if not s.keyed or not s.decodable:
            continue
        out.append((s.table_name, None))
        if s.kind == "list":
            out.append((s.table_name, "flat"))
        if s.kind == "map":
            out.append((s.table_name, "nested"))
    return out


@pytest.mark.parametrize("name", CANONICAL)
def test_every_state_reads_the_same_table_with_the_index(
    name: str, tmp_path: Path, decode_path: str
) -> None:
    path, snapshot = _indexed(name, tmp_path)
    plain = statequery.open(path, use_snapshot=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RunIndexMismatchWarning)
        sp = statequery.open(path, snapshot=snapshot)
        assert sp.from_snapshot and sp.run_index.key_group_count == len(_key_groups(plain))
        reads = _reads(sp)
        assert reads
        for table, mode in reads:
            want = plain.read(table, mode=mode)
            got = sp.read(table, mode=mode)
            assert same_table(got, want), (table, mode)
            assert got.num_rows == want.num_rows
        # key-filtered reads of two keys of each state, and lookups of them (every state)
        looked: set[Any] = set()
        for table, mode in reads:
            keys = plain.read(table).column("key").to_pylist()
            for key in sorted({repr(k): k for k in keys}.items())[:2]:
                key = key[1]
                assert same_table(
                    sp.read(table, key=key, mode=mode), plain.read(table, key=key, mode=mode)
                ), (table, key)
                if isinstance(key, (str, int)) and key not in looked:
                    looked.add(key)
                    want_lookup = plain.lookup(key)
                    got_lookup = sp.lookup(key)
                    assert set(got_lookup) == set(want_lookup)
                    for k, t in want_lookup.items():
                        assert same_table(got_lookup[k], t)


def _state_bytes(groups: list[dict[str, Any]], operator_id: str, sid_of: Any) -> dict[str, int]:
    """Bytes of one state's runs (from its state id on) per file: what an indexed read of an
    uncompressed stream may read."""
    out: dict[str, int] = {}
    for g in groups:
        if g["operator_id"] != operator_id:
            continue
        sid = sid_of(g)
        runs = g["runs"]
        for i in range(0, len(runs), 3):
            if runs[i] == sid:
                out[g["location"]] = out.get(g["location"], 0) + runs[i + 2] + 2
    return out


def test_cold_single_state_read_reads_only_its_runs(tmp_path: Path) -> None:
    path, snapshot = _indexed(PLAIN, tmp_path)
    groups = _key_groups(statequery.open(path, use_snapshot=False))
    for state in ("count", "recent-categories", "_timer_state/event_user-timers"):
        io = FileIO()
        sp = statequery.open(path, io=io, snapshot=snapshot)
        assert sp.from_snapshot
        table = sp.read("user-state", state)
        assert table.num_rows > 0
        op = sp.operator("user-state")
        want = _state_bytes(groups, op.operator_id, lambda g, s=state: g["ids"][s])
        want[sp.metadata_location] = len(Path(sp.metadata_location).read_bytes())
        want[snapshot] = len(Path(snapshot).read_bytes())
        assert dict(io.stats.bytes_read) == want, state
        # far less than the key groups' bytes
        whole = sum(g["end"] - g["start"] for g in groups if g["operator_id"] == op.operator_id)
        assert sum(v for k, v in want.items() if k not in (snapshot, sp.metadata_location)) < (
            whole / 2
        )
        assert all(n == 1 for n in io.stats.opens.values())


def test_a_lookup_reads_only_the_runs_of_its_key_group(tmp_path: Path) -> None:
    path, snapshot = _indexed(PLAIN, tmp_path)
    io = FileIO()
    sp = statequery.open(path, io=io, snapshot=snapshot)
    io.stats.reset()
    table = sp.read("user-state", "count", key="user-3")
    assert table.column("value").to_pylist() == [10]
    kg = table.column("key_group")[0].as_py()
    groups = [g for g in _key_groups(sp) if g["kg"] == kg]
    op = sp.operator("user-state")
    want = _state_bytes(groups, op.operator_id, lambda g: g["ids"]["count"])
    assert dict(io.stats.bytes_read) == want


def test_compressed_streams_read_whole_key_groups_and_walk_the_runs(tmp_path: Path) -> None:
    path, snapshot = _indexed(SNAPPY, tmp_path)
    io = FileIO()
    sp = statequery.open(path, io=io, snapshot=snapshot)
    io.stats.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RunIndexMismatchWarning)
        got = sp.read("user-state", "count")
    groups = _key_groups(sp)
    op = sp.operator("user-state")
    want: dict[str, int] = {}
    for g in groups:
        if g["operator_id"] == op.operator_id:
            assert g["compressed"]
            want[g["location"]] = want.get(g["location"], 0) + g["end"] - g["start"]
    assert dict(io.stats.bytes_read) == want
    assert got.equals(statequery.open(path, use_snapshot=False).read("user-state", "count"))


def test_a_savepoint_records_the_index_during_a_walk_and_uses_it_next() -> None:
    io = FileIO()
    sp = statequery.open(str(fixture_dir(PLAIN)), io=io, use_snapshot=False)
    assert not sp.run_index
    first = sp.read("user-state", "count")  # a whole walk of every key group: recorded
    op = sp.operator("user-state")
    groups = [g for g in _key_groups(sp) if g["operator_id"] == op.operator_id]
    assert sp.run_index.runs(op.operator_id, 0)
    for g in groups:
        assert list(sp.run_index.runs(g["operator_id"], g["subtask"])[g["kg"]]) == g["runs"]
    io.stats.reset()
    second = sp.read("user-state", "amount-by-category")
    want = _state_bytes(groups, op.operator_id, lambda g: g["ids"]["amount-by-category"])
    assert dict(io.stats.bytes_read) == want
    plain = statequery.open(str(fixture_dir(PLAIN)), use_snapshot=False)
    assert second.equals(plain.read("user-state", "amount-by-category"))
    assert first.equals(plain.read("user-state", "count"))


def test_a_read_of_every_state_walks_whole_key_groups_with_the_index_too() -> None:
    """Once the index is recorded, a read that wants every run of a key group walks it whole
    (one walk, as the first time), not run by run (each run checked against the bytes first:
    a second walk); a read of one state still uses the runs."""
    from statequery.scan import plan_states

    sp = statequery.open(str(fixture_dir(PLAIN)), use_snapshot=False)
    op = sp.operator("user-state")
    first = sp.read_states(op)  # records the index
    assert sp.run_index.runs(op.operator_id, 0)
    keyed = [s for s in op.states if s.keyed_rows]
    tasks = plan_states(sp.model, sp.context, keyed)
    assert tasks and all(t.runs is None for t in tasks)
    one = plan_states(sp.model, sp.context, [s for s in keyed if s.name == "count"])
    assert any(t.runs is not None and t.runs.key_groups for t in one)
    again = sp.read_states(op)
    assert list(again) == list(first)
    for name, table in first.items():
        assert again[name].equals(table)


def test_tasks_carry_their_runs_and_pickle(tmp_path: Path) -> None:
    import pickle

    from statequery.scan import execute

    path, snapshot = _indexed(PLAIN, tmp_path)
    sp = statequery.open(path, snapshot=snapshot)
    tasks = sp.plan("user-state", "count", split=8)
    # every task with data carries its runs (tasks of key groups without data read nothing)
    assert tasks and all(t.runs is not None for t in tasks if t.byte_ranges)
    batches = []
    for task in pickle.loads(pickle.dumps(tasks)):
        io = FileIO()
        batches += [b for _, b in execute(task, io)]
        # an executor reads exactly the task's byte ranges
        assert io.stats.total_bytes == sum(b - a for a, b in task.byte_ranges)
    full = statequery.open(path, use_snapshot=False).read("user-state", "count")
    assert (
        pa.Table.from_batches(batches, schema=full.schema)
        .sort_by("key")
        .equals(full.sort_by("key"))
    )


# -- trust: an index that does not match the bytes --------------------------------------------


def _copy(name: str, tmp_path: Path) -> str:
    dst = tmp_path / "sp"
    shutil.copytree(fixture_dir(name), dst)
    return str(dst)


def _first_group(sp: Savepoint, state: str) -> dict[str, Any]:
    op = sp.operator("user-state")
    for g in _key_groups(sp):
        if g["operator_id"] == op.operator_id and g["ids"][state] in g["runs"][0::3]:
            return g
    raise AssertionError("no key group holds the state")


def _bad_runs(g: dict[str, Any], sid: int, how: str) -> list[int]:
    runs = list(g["runs"])
    i = runs[0::3].index(sid) * 3
    if how == "state id":
        other = next(s for s in runs[0::3] if s != sid)
        j = runs[0::3].index(other) * 3
        runs[i + 1], runs[j + 1] = runs[j + 1], runs[i + 1]  # the runs' starts swapped
        runs[i + 2], runs[j + 2] = runs[j + 2], runs[i + 2]
    elif how == "shorter":
        runs[i + 2] -= 1  # the last entry would lack its flag
    elif how == "longer":
        runs[i + 2] += 3
    elif how == "shifted":
        runs[i + 1] += 4
    elif how == "past the end":
        runs[i + 2] += g["end"] - g["start"]
    return runs


@pytest.mark.parametrize("name", [PLAIN, SNAPPY])
@pytest.mark.parametrize("how", ["state id", "shorter", "longer", "shifted", "past the end"])
def test_a_wrong_index_warns_and_walks_the_key_group_whole(
    name: str, how: str, tmp_path: Path, decode_path: str
) -> None:
    path = _copy(name, tmp_path)
    sp = statequery.open(path, use_snapshot=False)
    sp.index_runs()
    g = _first_group(sp, "count")
    sid = g["ids"]["count"]
    sp.run_index.record(g["operator_id"], g["subtask"], g["kg"], _bad_runs(g, sid, how))
    # persisted too: a snapshot with the wrong index, read by a fresh savepoint
    snapshot = sp.write_snapshot(index=True)
    assert Path(snapshot).parent == Path(path)
    want = statequery.open(path, use_snapshot=False).read("user-state", "count")
    for reader in (sp, statequery.open(path)):
        with pytest.warns(RunIndexMismatchWarning, match=f"key group {g['kg']}") as caught:
            got = reader.read("user-state", "count")
        assert str(g["location"]) in str(caught[0].message)
        assert got.equals(want)
        # the whole walk recorded the true runs: the next read uses them, silently
        assert list(reader.run_index.runs(g["operator_id"], g["subtask"])[g["kg"]]) == g["runs"]
        with warnings.catch_warnings():
            warnings.simplefilter("error", RunIndexMismatchWarning)
            assert reader.read("user-state", "count").equals(want)


def test_a_changed_state_file_is_caught_not_read_with_the_index(
    tmp_path: Path, decode_path: str
) -> None:
    """The file changes after the index was written: the flag of the last entry of a run is
    cleared, so that run no longer ends where the index says. No rows from it: the warning, then
    the whole walk finds the damage and raises a CorruptStateError naming the file."""
    path = _copy(PLAIN, tmp_path)
    sp = statequery.open(path, use_snapshot=False)
    snapshot = sp.write_snapshot(index=True)
    g = _first_group(sp, "count")
    runs, sid = g["runs"], g["ids"]["count"]
    i = runs[0::3].index(sid) * 3
    start, length = runs[i + 1], runs[i + 2]
    # the last entry of the run: walk the entries' lengths to find it
    buf, pos, last = g["buf"], start, start
    while pos < start + length:
        last = pos
        klen = int.from_bytes(buf[pos : pos + 4], "big", signed=True)
        vlen = int.from_bytes(buf[pos + 4 + klen : pos + 8 + klen], "big", signed=True)
        pos += 8 + klen + vlen
    flag_at = g["start"] + last + 4
    data = bytearray(Path(g["location"]).read_bytes())
    assert data[flag_at] & 0x80
    data[flag_at] &= 0x7F
    Path(g["location"]).write_bytes(bytes(data))
    fresh = statequery.open(path, snapshot=snapshot)
    assert fresh.from_snapshot
    with pytest.warns(RunIndexMismatchWarning):
        with pytest.raises(CorruptStateError) as e:
            fresh.read("user-state", "count")
    assert g["location"] in str(e.value)


# -- the snapshot section ---------------------------------------------------------------------


def test_the_snapshot_keeps_the_index_only_when_asked(tmp_path: Path) -> None:
    path = str(fixture_dir(PLAIN))
    sp = statequery.open(path, use_snapshot=False)
    with_index = loads(Path(sp.write_snapshot(str(tmp_path / "a"), index=True)).read_bytes())
    assert with_index.run_index is not None and with_index.run_index == sp.run_index
    assert with_index.run_index.key_group_count == len(_key_groups(sp))
    without = loads(Path(sp.write_snapshot(str(tmp_path / "b"))).read_bytes())
    assert without.run_index is None  # a snapshot without the index stays valid
    assert statequery.open(path, snapshot=str(tmp_path / "b")).from_snapshot
    # the index is a compact part of the snapshot: per key group a flat array of ints
    envelope = msgpack.unpackb((tmp_path / "a").read_bytes())
    assert envelope["format_version"] == FORMAT_VERSION == 8
    body = msgpack.unpackb(envelope["body"], strict_map_key=False)
    section = body["run_index"]
    assert section["version"] == 1
    for _op, _subtask, groups in section["handles"]:
        for runs in groups.values():
            assert len(runs) % 3 == 0 and all(isinstance(x, int) for x in runs)
    # reading reused the recorded index: writing it again walks nothing new
    assert len((tmp_path / "a").read_bytes()) - len((tmp_path / "b").read_bytes()) < 4096


def test_an_older_snapshot_format_is_ignored_and_rederived(tmp_path: Path) -> None:
    path = str(fixture_dir(PLAIN))
    sp = statequery.open(path, use_snapshot=False)
    current = msgpack.unpackb(dumps(sp.meta))
    current["format_version"] = 3
    old = tmp_path / "v3.msgpack"
    old.write_bytes(msgpack.packb(current))
    with pytest.warns(SnapshotIgnoredWarning, match="format 3, this statequery writes"):
        again = statequery.open(path, snapshot=str(old))
    assert not again.from_snapshot
    assert again.read("user-state", "count").num_rows == 20


def test_a_malformed_index_section_makes_the_snapshot_ignored(tmp_path: Path) -> None:
    import hashlib

    path = str(fixture_dir(PLAIN))
    sp = statequery.open(path, use_snapshot=False)
    envelope = msgpack.unpackb(dumps(sp.meta))
    body = msgpack.unpackb(envelope["body"], strict_map_key=False)
    body["run_index"] = {"version": 1, "handles": [["x", 0, {5: [1, 2]}]]}  # not triples
    envelope["body"] = msgpack.packb(body, use_bin_type=True)
    envelope["sha256"] = hashlib.sha256(envelope["body"]).hexdigest()
    bad = tmp_path / "bad.msgpack"
    bad.write_bytes(msgpack.packb(envelope, use_bin_type=True))
    with pytest.raises(CorruptStateError, match="run index"):
        loads(bad.read_bytes(), str(bad))
    with pytest.warns(SnapshotIgnoredWarning):
        assert not statequery.open(path, snapshot=str(bad)).from_snapshot
    # another layout version of the section: dropped, the snapshot still used
    body["run_index"] = {"version": 99, "handles": "anything"}
    envelope["body"] = msgpack.packb(body, use_bin_type=True)
    envelope["sha256"] = hashlib.sha256(envelope["body"]).hexdigest()
    bad.write_bytes(msgpack.packb(envelope, use_bin_type=True))
    later = statequery.open(path, snapshot=str(bad))
    assert later.from_snapshot and not later.run_index


def test_cli_snapshot_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _copy(PLAIN, tmp_path)
    assert main(["snapshot", path, "--index"]) == 0
    out = capsys.readouterr().out
    assert "run index of 38 key groups" in out
    written = Path(path) / "_statequery_meta.msgpack"
    meta = loads(written.read_bytes())
    assert meta.run_index is not None and meta.run_index.key_group_count == 38
    io = FileIO()
    sp = statequery.open(path, io=io)
    assert sp.from_snapshot and sp.run_index == meta.run_index
    # without --index: no index
    assert main(["snapshot", path]) == 0
    assert loads(written.read_bytes()).run_index is None
    assert isinstance(RunIndex(), RunIndex)
