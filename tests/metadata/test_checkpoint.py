"""_metadata parsing on every fixture, handle kinds, remapping of moved checkpoints, errors."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

from statequery.exceptions import CorruptStateError, StorageError, UnsupportedFormatError
from statequery.io import FileIO
from statequery.metadata.checkpoint import load_metadata, parse_metadata
from statequery.metadata.handles import (
    ByteStreamHandle,
    FileHandle,
    HandleResolver,
    IncrementalHandle,
    KeyGroupsHandle,
    RelativeFileHandle,
    handle_from_dict,
    handle_to_dict,
)
from tests.conftest import fixture_dir, fixture_record, fixture_records


def _md(name: str) -> Any:
    return load_metadata(FileIO(), str(fixture_dir(name) / "_metadata"))


# The _metadata version each Flink release writes (measured on the fixtures, docs/fixtures.md);
# versions before 5 hold no operator name or uid (statequery reports them as ""), version 3 no
# checkpoint properties (snapshot type and format).
METADATA_VERSIONS = {"2.3": 6, "2.2": 6, "2.1": 6, "2.0": 5, "1.20": 4, "1.19": 4, "1.18": 4,
                     "1.17": 4, "1.16": 4, "1.15": 3}


@pytest.mark.parametrize("record", fixture_records(), ids=lambda r: r["name"])
def test_operators_match_the_manifest(record: dict[str, Any]) -> None:
    md = _md(record["name"])
    minor = ".".join(record["flink_version"].split(".")[:2])
    assert md.version == METADATA_VERSIONS[minor] and md.checkpoint_id >= 1
    if md.version == 3:  # Flink 1.15: no CheckpointProperties in _metadata yet
        assert md.properties is None
    else:
        assert md.properties is not None
        assert md.properties.snapshot_type == record["snapshot"]
        if record["snapshot"] == "savepoint":
            assert md.properties.format == record["format"].upper()
    ops = {op.operator_id: op for op in md.operators}
    assert set(ops) == {op["operator_id"] for op in record["operators"]}
    for want in record["operators"]:
        op = ops[want["operator_id"]]
        assert (op.uid, op.name) == (want["uid"], want["name"])
        assert op.parallelism == want["parallelism"]
        assert op.max_parallelism == want["max_parallelism"]
        # a non-parallel (legacy) source, e.g. PyFlink's from_collection, has max parallelism 1
        assert op.max_parallelism in (record["max_parallelism"], 1 if op.parallelism == 1 else -1)
        assert op.fully_finished == bool(want.get("fully_finished"))
        if "coordinator_state_bytes" in want:
            assert isinstance(op.coordinator_state, ByteStreamHandle)
            assert op.coordinator_state.size == want["coordinator_state_bytes"]
        # subtasks without any state are not written; the others are distinct and in range
        indexes = [s.index for s in op.subtasks] + list(op.finished_subtasks)
        assert len(set(indexes)) == len(indexes) and all(0 <= i < op.parallelism for i in indexes)
        if want["states"]:
            assert [s.index for s in op.subtasks] == list(range(op.parallelism))


# which keyed handle each fixture kind must hold
KEYED_HANDLES = {
    ("savepoint", "canonical"): (KeyGroupsHandle, 7),
    ("savepoint", "native", "hashmap"): (KeyGroupsHandle, 12),
    ("savepoint", "native", "rocksdb"): (IncrementalHandle, 11),
    ("checkpoint", "native", "hashmap"): (KeyGroupsHandle, 12),
    ("checkpoint", "native", "rocksdb"): (IncrementalHandle, 11),
    # Flink 1.15, RocksDB without incremental checkpoints: a native savepoint is the canonical
    # key-group layout and a checkpoint too, in a type-12 handle (the hashmap layout's type)
    ("savepoint", "native", "rocksdb", "1.15"): (KeyGroupsHandle, 7),
    ("checkpoint", "native", "rocksdb", "1.15"): (KeyGroupsHandle, 12),
}


@pytest.mark.parametrize("record", fixture_records(), ids=lambda r: r["name"])
def test_keyed_and_operator_handles(record: dict[str, Any]) -> None:
    md = _md(record["name"])
    key = (record["snapshot"], record["format"])
    flink_115 = (*key, record["backend"], "1.15")
    if record["flink_version"].startswith("1.15.") and not record["incremental"] and (
        flink_115 in KEYED_HANDLES
    ):
        key = flink_115
    cls, code = KEYED_HANDLES.get(key) or KEYED_HANDLES[(*key, record["backend"])]
    keyed = [s.managed_keyed for op in md.operators for s in op.subtasks if s.managed_keyed]
    assert keyed and all(isinstance(h, cls) and h.handle_type == code for h in keyed)
    for h in keyed:
        if isinstance(h, KeyGroupsHandle):
            assert len(h.offsets) == h.num_key_groups
            if code == 12 and record["backend"] == "hashmap":
                # heap layout: an offset for every key group, increasing
                assert all(o > 0 for o in h.offsets) and list(h.offsets) == sorted(h.offsets)
            elif code == 12 and record["name"].endswith("-maxpar6"):
                # 1.15 RocksDB, every key group holding data: every offset set, as in a hashmap
                # checkpoint (the bytes tell them apart: metadata.handles.layout_by_first_bytes)
                assert all(o > 0 for o in h.offsets)
            elif code == 12:  # 1.15 RocksDB: key-group streams, empty key groups have offset 0
                assert not all(o > 0 for o in h.offsets)
            delegate = h.delegate
            if record["inline"]:
                assert isinstance(delegate, ByteStreamHandle)
            else:
                assert isinstance(
                    delegate,
                    RelativeFileHandle
                    if record["snapshot"] == "savepoint"
                    else (FileHandle, RelativeFileHandle),
                )
        else:
            assert h.private and h.handle_id
            names = {p for p, _ in h.private + h.shared}
            assert any(n.startswith("MANIFEST-") for n in names) and "CURRENT" in names
            if record["snapshot"] == "checkpoint" and record["incremental"]:
                assert h.shared and all(n.endswith(".sst") for n, _ in h.shared)
                assert all(isinstance(s, FileHandle) for _, s in h.shared)
            elif record["snapshot"] == "checkpoint":
                # a full RocksDB checkpoint: every file is the checkpoint's own
                assert not h.shared and any(n.endswith(".sst") for n, _ in h.private)
    op_state = [op for op in md.operators if op.uid == "operator-state"]
    if op_state:
        for st in op_state[0].subtasks:
            parts = {p.name: (p.mode, len(p.offsets)) for p in st.managed_operator.partitions}
            assert parts == {
                "buffered-ids": ("SPLIT_DISTRIBUTE", 2),
                "union-markers": ("UNION", 1),
                "rules": ("BROADCAST", 1),
            }


def test_fully_finished_operators_of_the_sql_job() -> None:
    md = _md("sql-hashmap-canonical")
    finished = sorted(op.name for op in md.operators if op.fully_finished)
    assert finished == ["Calc[2]", "Source: src_bounded[1]"]
    assert all(not op.subtasks for op in md.operators if op.fully_finished)


def test_handles_round_trip_through_plain_data() -> None:
    for name in (
        "datastream-rocksdb-incremental-checkpoint",
        "datastream-hashmap-inline",
        "datastream-hashmap-native",
    ):
        md = _md(name)
        for op in md.operators:
            for st in op.subtasks:
                for h in (st.managed_keyed, st.managed_operator):
                    if h is not None:
                        assert handle_from_dict(handle_to_dict(h)) == h


def test_moved_checkpoint_maps_absolute_paths_onto_its_own_tree(tmp_path: Path) -> None:
    record = fixture_record("datastream-rocksdb-incremental-checkpoint")
    src = fixture_dir(record["name"])  # <fixture>/<job-id>/chk-1
    job = src.parent
    moved = tmp_path / "elsewhere" / job.name
    shutil.copytree(job, moved)
    io = FileIO()
    md = load_metadata(io, str(moved / src.name / "_metadata"))
    resolver = HandleResolver(io, md.directory)
    shared = [
        s
        for op in md.operators
        for st in op.subtasks
        if isinstance(st.managed_keyed, IncrementalHandle)
        for _, s in st.managed_keyed.shared
    ]
    assert shared
    for h in shared:
        assert isinstance(h, FileHandle) and "/shared/" in h.path
        assert not h.path.startswith(str(moved))
        loc = resolver.location(h)
        assert loc == str(moved / "shared" / Path(h.path).name)
        assert len(resolver.read(h, 0, 16)) == 16
    # a file missing from both places is a StorageError naming it
    gone = shared[0]
    Path(resolver.location(gone)).unlink()
    fresh = HandleResolver(io, md.directory)
    with pytest.raises(StorageError, match=Path(gone.path).name):
        fresh.read(gone)


def test_relative_handle_escaping_the_directory_is_refused(tmp_path: Path) -> None:
    resolver = HandleResolver(FileIO(), str(tmp_path))
    with pytest.raises(StorageError, match="escapes"):
        resolver.read(RelativeFileHandle(relative_path="../../etc/passwd", file_size=10))


def _metadata_bytes(name: str) -> bytes:
    return (fixture_dir(name) / "_metadata").read_bytes()


def test_wrong_magic_and_unknown_version() -> None:
    data = _metadata_bytes("datastream-hashmap-canonical")
    with pytest.raises(CorruptStateError, match="magic") as e:
        parse_metadata(b"\x00" + data[1:], "/x/_metadata")
    assert e.value.source == "/x/_metadata" and e.value.offset == 0
    for version in (1, 2, 7, 99):
        bad = data[:4] + struct.pack(">i", version) + data[8:]
        with pytest.raises(UnsupportedFormatError, match=f"version {version}"):
            parse_metadata(bad, "/x/_metadata")


def test_unknown_handle_type_names_it_and_the_offset() -> None:
    data = bytearray(_metadata_bytes("datastream-hashmap-canonical"))
    md = parse_metadata(bytes(data))
    # the first keyed handle's type byte: find 0x07 right after a subtask's two operator flags
    pos = data.find(b"\x00\x00\x00\x00\x00\x00\x00\x00\x07")  # no op handles, then type 7
    assert pos > 0 and md.operators
    data[pos + 8] = 42
    with pytest.raises(UnsupportedFormatError, match=r"unknown keyed state handle type 42") as e:
        parse_metadata(bytes(data), "/sp/_metadata")
    assert "/sp/_metadata at byte" in str(e.value)


def test_missing_metadata_file(tmp_path: Path) -> None:
    from statequery.exceptions import SavepointNotFoundError

    with pytest.raises(SavepointNotFoundError):
        load_metadata(FileIO(), str(tmp_path / "_metadata"))
