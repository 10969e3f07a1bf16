"""The scan layer and the one model of a savepoint's states, measured with ``FileIO.stats``:

* a cold read of one key group of one state opens only that state's files (and ``_metadata``),
  each once, and reads no other operator's file;
* with the StateMeta snapshot present, a read or a lookup reads no header byte;
* plans are small picklable tasks that run anywhere and give the same rows.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from conftest import fixture_dir

import statequery
from statequery.io import FileIO
from statequery.metadata.handles import KeyGroupsHandle
from statequery.savepoint import Savepoint
from statequery.scan import ScanTask, execute, key_group_for

KEYED = [
    "datastream-hashmap-canonical",
    "datastream-hashmap-native",
    "datastream-hashmap-checkpoint",
]


def _files(sp: Savepoint, operator: str) -> set[str]:
    out = set()
    for st in sp.operator(operator).subtasks:
        for h in (st.keyed_handle, st.operator_handle):
            if h is None:
                continue
            for sh in h.stream_handles():
                loc = sp.resolver.location(sh)
                if loc is not None:
                    out.add(loc)
    return out


def _all_files(sp: Savepoint) -> set[str]:
    return {f for op in sp.operators for f in _files(sp, op.operator_id)}


def _extent(sp: Savepoint, operator: str, kg: int) -> tuple[str, int, int]:
    """(file, start, end) of key group ``kg``'s bytes."""
    for st in sp.operator(operator).subtasks:
        h = st.keyed_handle
        r = st.key_groups
        if isinstance(h, KeyGroupsHandle) and r is not None and r.start <= kg <= r.end:
            loc = sp.resolver.location(h.delegate)
            assert loc is not None
            start = h.offsets[kg - h.start_key_group]
            later = [o for o in h.offsets if o > start]
            end = min(later) if later else len(sp.io.new_input(loc))
            return loc, start, end
    raise AssertionError(f"no subtask holds key group {kg}")


@pytest.mark.parametrize("name", KEYED)
def test_cold_read_of_one_key_group_opens_only_that_states_files_once(name: str) -> None:
    io = FileIO()
    sp = statequery.open(str(fixture_dir(name)), io=io, use_snapshot=False)
    kg = key_group_for("user-3", None, 128)
    assert kg is not None
    table = sp.read("user-state", "count", key_groups=[kg])
    assert table.column("key").to_pylist() == ["user-3"]
    assert table.column("value").to_pylist() == [10]
    ref = statequery.open(str(fixture_dir(name)), use_snapshot=False)  # its own FileIO
    own = _files(ref, "user-state")
    opened = set(io.stats.opens)
    assert opened == own | {sp.metadata_location}, opened ^ (own | {sp.metadata_location})
    assert all(n == 1 for n in io.stats.opens.values()), io.stats.opens
    # other operators' state files were not touched, not even their headers
    others = _all_files(ref) - own
    assert others and not others & (set(io.stats.bytes_read) | set(io.stats.requests))


def _with_snapshot(name: str, tmp_path: Path) -> tuple[Savepoint, FileIO]:
    first = statequery.open(str(fixture_dir(name)), use_snapshot=False)
    snapshot = first.write_snapshot(str(tmp_path / "meta.msgpack"))
    io = FileIO()
    sp = statequery.open(str(fixture_dir(name)), io=io, snapshot=snapshot)
    assert sp.from_snapshot
    io.stats.reset()
    return sp, io


@pytest.mark.parametrize("name", KEYED)
def test_with_the_snapshot_a_read_reads_no_header_byte(name: str, tmp_path: Path) -> None:
    sp, io = _with_snapshot(name, tmp_path)
    table = sp.read("user-state", "count", key="user-3")
    assert table.column("value").to_pylist() == [10]
    kg = table.column("key_group")[0].as_py()
    loc, start, end = _extent(sp, "user-state", kg)
    # exactly the key group's bytes: not one byte of the header before it
    assert dict(io.stats.bytes_read) == {loc: end - start}
    assert io.stats.opens[loc] == 1


@pytest.mark.parametrize("name", KEYED)
def test_with_the_snapshot_a_lookup_reads_no_header_byte(name: str, tmp_path: Path) -> None:
    sp, io = _with_snapshot(name, tmp_path)
    result = sp.lookup("user-3")
    assert result[("user-state", "count")].column("value").to_pylist() == [10]
    kg = result[("user-state", "count")].column("key_group")[0].as_py()
    want: dict[str, int] = {}
    for op in sp.keyed_operators():
        loc, start, end = _extent(sp, op.operator_id, kg)
        want[loc] = want.get(loc, 0) + end - start
    assert dict(io.stats.bytes_read) == want


def test_a_plan_is_small_picklable_tasks_that_run_anywhere() -> None:
    sp = statequery.open(str(fixture_dir("datastream-hashmap-native")), use_snapshot=False)
    full = sp.read("user-state", "recent-categories")
    tasks = sp.plan("user-state", "recent-categories")
    assert [t.subtask for t in tasks] == [0, 1]
    # split: tasks of at most 16 key groups, each with the byte ranges it reads
    small = sp.plan("user-state", "recent-categories", split=16)
    assert len(small) == 128 // 16
    assert all(len(t.key_groups or ()) <= 16 and t.byte_ranges for t in small)
    shipped: list[ScanTask] = pickle.loads(pickle.dumps(small))
    assert len(pickle.dumps(small[0])) < 16 << 10
    batches: list[pa.RecordBatch] = []
    for task in shipped:
        io = FileIO()  # an executor's own storage: one open per file per task
        for state, batch in execute(task, io):
            assert state == "recent-categories"
            batches.append(batch)
        assert all(n == 1 for n in io.stats.opens.values())
        assert io.stats.total_requests <= 1 + len(task.byte_ranges)
    again = pa.Table.from_batches(batches, schema=full.schema)
    assert _rows(again) == _rows(full)


def test_keys_plan_only_their_key_groups() -> None:
    sp = statequery.open(str(fixture_dir("datastream-hashmap-canonical")), use_snapshot=False)
    info = sp.state("user-state", "count")
    kgs = {key_group_for(k, info.key_spec, info.max_parallelism) for k in ("user-3", "user-5")}
    tasks = sp.plan(info, keys=["user-3", "user-5"])
    assert {kg for t in tasks for kg in t.key_groups or ()} == kgs
    table = sp.read(info)
    rows = [r for r in _rows(table) if r["key"] in ("user-3", "user-5")]
    got: list[pa.RecordBatch] = [b for t in tasks for _, b in execute(t, sp.io)]
    assert _rows(pa.Table.from_batches(got, schema=table.schema)) == rows
    # contradicting filters plan nothing
    assert sp.plan(info, keys=["user-3"], key_groups=[k for k in range(128) if k not in kgs]) == []


def _rows(table: pa.Table) -> list[Any]:
    return sorted(table.to_pylist(), key=repr)
