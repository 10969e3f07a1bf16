"""Point reads inside table files (statequery/backends/sstpoint.py): a table read by ranged reads
of the blocks a seek needs gives exactly the entries of the table read whole, in every index
layout, for present and absent keys and for prefixes whose entries span many data blocks, and
reads only a fraction of the file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

import pytest

from statequery.backends.rocksdb import DbFile
from statequery.backends.sst import SstFile, merged_entries
from statequery.backends.sstpoint import RangedSstFile, open_point_table, point_cache
from statequery.exceptions import CorruptStateError
from statequery.io import FileIO, fileio
from tests.backends.test_sst import _build_db, _table_paths

POINT_LAYOUTS = [
    ("none", 5, "binary_search", False),
    ("snappy", 6, "binary_search", False),
    ("lz4", 5, "two_level_index_search", False),
    ("lz4", 6, "two_level_index_search", False),
    ("zstd", 4, "binary_search", True),
    ("snappy", 5, "hash_search", False),
]


def _db_file(path: str) -> DbFile:
    return DbFile(os.path.basename(path), location=path, size=os.path.getsize(path))


def _probes(model: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """[start, stop) ranges: present keys, absent keys between them, and whole first bytes (a
    "key group" whose entries span many 256-byte data blocks)."""
    keys = [k for k, _ in model]
    out = [(k, k + b"\x00") for k in keys[::17]]  # one present key
    out += [(k + b"\x00", k + b"\x00\x00") for k in keys[::23]]  # absent, inside the range
    out += [(bytes([g]), bytes([g + 1])) for g in range(5)]  # 4 spans many blocks; 4: none
    out += [(bytes([g, 0x80]), bytes([g, 0x80, 0xFF])) for g in range(4)]  # a prefix
    out += [(b"", b"\x00"), (b"\xff\xff", b"\xff\xff\xff")]
    return out


@pytest.mark.parametrize(("comp", "fv", "index", "hash_index"), POINT_LAYOUTS)
def test_point_reads_equal_the_whole_table(tmp_path: Path, comp: str, fv: int, index: str,
                                           hash_index: bool, decode_path: str) -> None:
    model = _build_db(tmp_path / "db", comp, fv, index, hash_index)
    paths = _table_paths(tmp_path / "db")
    assert len(paths) == 4
    local = [SstFile(p) for p in paths]
    assert {t.properties.index_type for t in local} == {
        {"binary_search": 0, "hash_search": 1, "two_level_index_search": 2}[index]}
    spanning = 0
    for start, stop in _probes(model):
        want = [kv for kv in model if start <= kv[0] < stop]
        assert list(merged_entries(local, start, stop)) == want
        io = FileIO()  # a new cache: each probe reads its blocks afresh
        ranged = [open_point_table(io, _db_file(p)) for p in paths]
        assert all(isinstance(t, RangedSstFile) for t in ranged)
        got = list(merged_entries(ranged, start, stop))  # type: ignore[arg-type]
        assert got == want, (start, stop)
        read = io.stats.total_bytes
        assert 0 < read < sum(os.path.getsize(p) for p in paths)
        if len(start) == 1 and stop == bytes([start[0] + 1]) and want:
            spanning += 1  # a whole first byte: its entries span many data blocks of each table
            assert sum(len([h for k, h in t.data_block_handles() if start <= k < stop])
                       for t in local) > 8
    assert spanning == 4
    for t in local:
        t.close()


def test_a_seek_reads_a_few_blocks_of_a_large_table(tmp_path: Path) -> None:
    """One present key of a table of hundreds of data blocks: footer, metaindex, properties,
    the index (a partitioned index: its top level and one partition), one data block."""
    for index in ("binary_search", "two_level_index_search"):
        model = _build_db(tmp_path / index, "none", 5, index, seed=7, range_delete=False)
        paths = _table_paths(tmp_path / index)
        biggest = max(paths, key=os.path.getsize)
        local = SstFile(biggest)
        handles = local.data_block_handles()
        assert len(handles) > 20
        key = next(k for k, _ in model if handles[len(handles) // 2][0] <= k)
        io = FileIO()
        table = open_point_table(io, _db_file(biggest))
        assert table is not None
        entries = list(table.tuples(key, key + b"\x00"))
        assert [e[0] for e in entries] == [k for k, _ in local.tuples(key, key + b"\x00")]
        size = os.path.getsize(biggest)
        requests = io.stats.total_requests
        # opening: a stat, footer, metaindex, properties; then index (+ partition) + data block(s)
        assert requests <= (8 if index == "two_level_index_search" else 7)
        assert io.stats.total_bytes < size / 2
        if index == "two_level_index_search":
            assert local.properties.get_int("rocksdb.index.partitions") > 2
            assert len(table._partitions) == 1
        local.close()


class _ObjectStore:
    """``objects://local/abs/path``: local files served as a remote scheme (not local to
    statequery.io), as an object store's client would, with its own version token."""

    def __init__(self, scheme: str, storage_options: dict[str, Any]) -> None:
        pass

    @staticmethod
    def _path(location: str) -> str:
        return location.removeprefix("objects://local")

    def open(self, location: str) -> IO[bytes]:
        return open(self._path(location), "rb")

    def size(self, location: str) -> int:
        return os.path.getsize(self._path(location))

    def exists(self, location: str) -> bool:
        return os.path.isfile(self._path(location))

    def is_dir(self, location: str) -> bool:
        return os.path.isdir(self._path(location))

    def list_dir(self, location: str) -> list[str]:
        return os.listdir(self._path(location))

    def write_atomic(self, location: str, data: bytes) -> None:
        raise NotImplementedError


@pytest.fixture
def objects(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(fileio._SCHEMES, "objects", _ObjectStore)
    return "objects://local"


def test_remote_tables_and_blocks_are_cached_per_fileio(tmp_path: Path, objects: str) -> None:
    """The versions of an incremental job share table files: the second lookup of the same
    remote table through the same FileIO reads nothing."""
    model = _build_db(tmp_path / "db", "snappy", 5, "binary_search")
    paths = _table_paths(tmp_path / "db")
    files = [DbFile(os.path.basename(p), location=objects + p, size=os.path.getsize(p))
             for p in paths]
    io = FileIO()
    key = model[len(model) // 2][0]
    first = [open_point_table(io, f) for f in files]
    got = list(merged_entries(first, key, key + b"\x00"))  # type: ignore[arg-type]
    assert got == [model[len(model) // 2]]
    io.stats.reset()
    again = [open_point_table(io, f) for f in files]
    assert all(a is b for a, b in zip(again, first, strict=True))
    assert list(merged_entries(again, key, key + b"\x00")) == got  # type: ignore[arg-type]
    assert io.stats.total_bytes == 0
    assert point_cache(io).size > 0
    other = FileIO()  # another FileIO has its own cache and counts its own reads
    tables = [open_point_table(other, f) for f in files]
    assert list(merged_entries(tables, key, key + b"\x00")) == got  # type: ignore[arg-type]
    assert other.stats.total_bytes > 0


def test_local_tables_are_read_as_they_are_now(tmp_path: Path) -> None:
    """As the file cache: a local table is never served from blocks read by an earlier open,
    even when rewritten in place with the same size within one mtime tick."""
    _build_db(tmp_path / "db", "none", 5, "binary_search")
    path = _table_paths(tmp_path / "db")[0]
    io = FileIO()
    first = open_point_table(io, _db_file(path))
    assert first is not None
    intact = list(first.tuples())
    stat = os.stat(path)
    data = bytearray(Path(path).read_bytes())
    h = first.data_block_handles()[0][1]
    data[h.offset + 3] ^= 0x10  # inside the first data block
    Path(path).write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same version token
    again = open_point_table(io, _db_file(path))
    assert again is not None and again is not first
    with pytest.raises(CorruptStateError, match="data block checksum mismatch"):
        list(again.tuples())
    assert list(first.tuples()) == intact  # blocks it read before stay its own


def test_a_replaced_or_truncated_table_is_not_served_from_the_cache(tmp_path: Path) -> None:
    _build_db(tmp_path / "db", "none", 5, "binary_search")
    path = _table_paths(tmp_path / "db")[0]
    io = FileIO()
    table = open_point_table(io, _db_file(path))
    assert table is not None
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[:-10])
    with pytest.raises(CorruptStateError, match="state handle says"):
        open_point_table(io, DbFile(os.path.basename(path), location=path, size=len(data)))
    # handles that need every byte are fetched whole
    assert open_point_table(io, DbFile("x.sst", location=path, size=len(data) - 10,
                                       checksum="sha256:00")) is None
    assert open_point_table(io, DbFile("x.sst", data=b"abc", size=3)) is None
