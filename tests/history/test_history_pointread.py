"""``Job.history(key)`` with point reads inside the RocksDB table files (issue 34 item 3,
statequery/backends/sstpoint.py): the same rows as a full restore of every version for every key
of the history fixtures and for absent keys, on both decode paths, reading only some blocks of
each table (footers and indexes of files shared between versions once)."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.series import FIXTURES

import statequery
from statequery.backends import rocksdb as rocks
from statequery.backends.cache import FileCache
from statequery.backends.sst import BLOCK_BASED_MAGIC
from statequery.io import FileIO, fileio
from tests.backends.test_sstpoint import _ObjectStore

ROCKSDB_HISTORY = ("history-rocksdb-incremental", "history-rescaled")


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FileCache]:
    cache = FileCache(tmp_path / "cache")
    monkeypatch.setattr(rocks, "_DEFAULT_CACHE", cache)
    yield cache


def _keys(fixture: str) -> list[Any]:
    keys: list[Any] = []
    for path in sorted((FIXTURES / "dump").glob(f"{fixture}-chk-*.jsonl")):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    e = json.loads(line)
                    if "key" in e and e["key"] not in keys:
                        keys.append(e["key"])
    return keys


def _history(fixture: str, key: Any, io: FileIO | None = None) -> list[dict[str, Any]]:
    with statequery.open_job(str(FIXTURES / fixture), io=io) as job:
        return job.history(key).to_pylist()


def _is_table(location: str) -> bool:
    """A block-based table file (shared files have no .sst name): its magic number."""
    if os.path.getsize(location) < 53:
        return False
    with open(location, "rb") as f:
        f.seek(-8, os.SEEK_END)
        return struct.unpack("<Q", f.read(8))[0] == BLOCK_BASED_MAGIC


def _sst_bytes(io: FileIO) -> dict[str, int]:
    return {loc: n for loc, n in io.stats.bytes_read.items()
            if _is_table(loc.removeprefix("objects://local"))}


@pytest.mark.parametrize("fixture", ROCKSDB_HISTORY)
def test_point_read_history_equals_the_full_restore(
    fixture: str, decode_path: str, private_cache: FileCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = _keys(fixture)
    assert len(keys) >= 3
    probes = [*keys, "absent-key", "", "user-00"]
    monkeypatch.setattr(rocks, "SELECTIVE_LOOKUPS", False)
    full = {json.dumps(k): _history(fixture, k) for k in probes}
    monkeypatch.setattr(rocks, "SELECTIVE_LOOKUPS", True)
    monkeypatch.setattr(rocks, "POINT_READS", True)
    for k in probes:
        got = _history(fixture, k)
        assert got == full[json.dumps(k)], k
        if k in keys:
            assert got
    assert full[json.dumps("absent-key")] == []


def test_point_read_history_from_an_object_store(
    private_cache: FileCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From an object store (a scheme that is not local), the tables the versions share are
    cached per FileIO: over all six versions, no table is read for more than its size, and
    the rows are those of tables fetched whole. (The fixture's tables hold one data block
    each, so a point read needs every block of them: tests/backends/test_sstpoint.py measures
    the blocks left unread in larger tables.)"""
    monkeypatch.setitem(fileio._SCHEMES, "objects", _ObjectStore)
    fixture = "history-rocksdb-incremental"
    remote = "objects://local" + str(FIXTURES / fixture)
    monkeypatch.setattr(rocks, "POINT_READS", False)
    with statequery.open_job(remote, io=FileIO()) as job:
        want = job.history("user-0").to_pylist()
    monkeypatch.setattr(rocks, "POINT_READS", True)
    point_io = FileIO()
    with statequery.open_job(remote, io=point_io) as job:
        assert job.history("user-0").to_pylist() == want
        point = _sst_bytes(point_io)
        assert want and point
        for loc, n in point.items():
            assert n <= os.path.getsize(loc.removeprefix("objects://local")), loc
        point_io.stats.reset()
        assert job.history("user-0").to_pylist() == want
        assert point_io.stats.total_bytes == 0


def test_warm_point_read_history_reads_nothing(private_cache: FileCache) -> None:
    io = FileIO()
    with statequery.open_job(str(FIXTURES / "history-rocksdb-incremental"), io=io) as job:
        first = job.history("user-1").to_pylist()
        io.stats.reset()
        assert job.history("user-1").to_pylist() == first
        assert io.stats.total_bytes == 0
        assert first
