"""The StateMeta snapshot: round trip, use when consistent, no state-file reads with it."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgpack
import pytest

from statequery.exceptions import CorruptStateError
from statequery.io import FileIO
from statequery.metadata.statemeta import (
    FORMAT_VERSION,
    SNAPSHOT_FILE_NAME,
    SnapshotVersionError,
    dumps,
    loads,
    sql_name,
)
from statequery.savepoint import Savepoint
from tests.conftest import fixture_dir, fixture_names


def _copy(name: str, tmp_path: Path) -> Path:
    src = fixture_dir(name)
    if src.name.startswith("chk-"):  # keep the checkpoint's job tree (shared/ next to chk-N)
        dst = tmp_path / src.parent.name
        shutil.copytree(src.parent, dst)
        return dst / src.name
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("name", fixture_names())
def test_snapshot_round_trips(name: str) -> None:
    meta = Savepoint.open(str(fixture_dir(name))).meta
    assert loads(dumps(meta)) == meta


@pytest.mark.parametrize("name", fixture_names())
def test_inspect_with_a_snapshot_reads_no_state_file_bytes(name: str, tmp_path: Path) -> None:
    sp_dir = _copy(name, tmp_path)
    derived = Savepoint.open(str(sp_dir))
    where = derived.write_snapshot()
    assert where == str(sp_dir / SNAPSHOT_FILE_NAME)
    assert not [p for p in sp_dir.iterdir() if p.name.startswith(".statequery-")]  # no temp left

    io = FileIO()
    sp = Savepoint.open(str(sp_dir), io=io)
    table = sp.state_meta()
    assert sp.from_snapshot
    assert table.equals(derived.state_meta())
    assert sp.states == derived.states
    read = set(io.stats.bytes_read)
    assert read == {str(sp_dir / "_metadata"), str(sp_dir / SNAPSHOT_FILE_NAME)}


def test_stale_or_foreign_snapshot_is_ignored(tmp_path: Path) -> None:
    sp_dir = _copy("datastream-hashmap-canonical", tmp_path)
    Savepoint.open(str(sp_dir)).write_snapshot()
    # a snapshot of another savepoint copied over: the _metadata fingerprint differs
    other = _copy("datastream-rocksdb-canonical", tmp_path / "o")
    shutil.copy(sp_dir / SNAPSHOT_FILE_NAME, other / SNAPSHOT_FILE_NAME)
    sp = Savepoint.open(str(other))
    assert not sp.from_snapshot and len(sp.states) == 15
    # a snapshot of an unknown format version is ignored too
    doc = msgpack.unpackb((sp_dir / SNAPSHOT_FILE_NAME).read_bytes(), raw=False)
    doc["format_version"] = FORMAT_VERSION + 1
    (sp_dir / SNAPSHOT_FILE_NAME).write_bytes(msgpack.packb(doc, use_bin_type=True))
    assert not Savepoint.open(str(sp_dir)).from_snapshot
    with pytest.raises(SnapshotVersionError):
        loads((sp_dir / SNAPSHOT_FILE_NAME).read_bytes())
    # and use_snapshot=False always derives
    Savepoint.open(str(sp_dir)).write_snapshot()
    assert Savepoint.open(str(sp_dir)).from_snapshot
    assert not Savepoint.open(str(sp_dir), use_snapshot=False).from_snapshot


def test_snapshot_elsewhere(tmp_path: Path) -> None:
    sp = Savepoint.open(str(fixture_dir("sql-hashmap-native")))
    out = tmp_path / "meta.msgpack"
    sp.write_snapshot(str(out))
    again = Savepoint.open(str(fixture_dir("sql-hashmap-native")), snapshot=str(out))
    assert again.from_snapshot and again.states == sp.states


def test_corrupt_snapshot_bytes() -> None:
    for data in (
        b"",
        b"\xc1",
        msgpack.packb({"magic": "nope"}),
        msgpack.packb([1, 2]),
        msgpack.packb({"magic": "statequery-statemeta", "format_version": FORMAT_VERSION}),
    ):
        with pytest.raises(CorruptStateError):
            loads(data)


def test_snapshot_keeps_handles_and_header_facts() -> None:
    meta = loads(
        dumps(Savepoint.open(str(fixture_dir("datastream-rocksdb-canonical-snappy"))).meta)
    )
    op = [o for o in meta.operators if o.uid == "user-state"][0]
    assert [s.index for s in op.subtasks] == [0, 1]
    for s in op.subtasks:
        assert s.keyed_header is not None and s.keyed_header.compressed
        assert set(s.keyed_header.state_ids) == {st.name for st in op.states}
        assert s.keyed_handle.handle_type == 7 and s.keyed_bytes > 0
    assert meta.checkpoint_id >= 1 and meta.metadata_version == 6
    assert (meta.snapshot_type, meta.format, meta.backend) == ("savepoint", "canonical", None)


def test_sql_names() -> None:
    assert sql_name("_timer_state/event_user-timers") == "timer_state_event_user_timers"
    assert sql_name("GroupAggregate[7]") == "groupaggregate_7"
    assert sql_name("///") == "unnamed"
