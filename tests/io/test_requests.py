"""The storage seam reads like a good remote client: one open per file, ranged reads of what a
read needs (adjacent key groups in one request), and ``ReadStats`` counting requests as well as
bytes. Measured on the real fixtures with ``FileIO.stats``."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import fixture_dir

import statequery
from statequery.io import FileIO

# (fixture, operator, state): keyed states of fixtures whose files hold many key groups
FULL_READS = [
    ("datastream-hashmap-native", "user-state", "profile"),
    ("datastream-hashmap-canonical", "user-state", "profile"),
    ("datastream-rocksdb-canonical-snappy", "user-state", "count"),
    ("datastream-hashmap-checkpoint-snappy", "user-state", "profile"),
]


def _data_files(sp: statequery.savepoint.Savepoint, operator: str) -> set[str]:
    op = sp.operator(operator)
    out = set()
    for st in op.subtasks:
        if st.keyed_handle is not None:
            for h in st.keyed_handle.stream_handles():
                loc = sp.resolver.location(h)
                if loc is not None:
                    out.add(loc)
    return out


@pytest.mark.parametrize(("name", "operator", "state"), FULL_READS)
def test_full_read_opens_each_file_once_with_few_requests(
    name: str, operator: str, state: str
) -> None:
    io = FileIO()
    sp = statequery.open(str(fixture_dir(name)), io=io, use_snapshot=False)
    table = sp.read(operator, state)
    assert table.num_rows > 0
    files = _data_files(sp, operator)
    assert files and set(io.stats.opens) >= files
    for loc in files:
        assert io.stats.opens[loc] == 1, (loc, io.stats.opens[loc])
    # key groups with data in the read: each one used to cost an open and a read
    key_groups = set(table.column("key_group").to_pylist())
    assert len(key_groups) > 8
    for loc in files:
        # open + header read(s) + coalesced data read(s), not one per key group
        assert io.stats.requests[loc] <= 6, (loc, io.stats.requests[loc], len(key_groups))


def test_requests_count_opens_reads_and_stats(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 4)
    io = FileIO()
    f = io.new_input(str(path))
    assert f.read(10, 5) == bytes(range(10, 15))
    assert f.read(1000) == bytes(range(1000 - 768, 256))
    assert len(f) == 1024
    assert io.stats.opens[str(path)] == 1
    # one open, two ranged reads, one size check
    assert io.stats.requests[str(path)] == 4
    assert io.stats.total_bytes == 5 + 24
    io.close()
    assert f.read(0, 1) == b"\x00"
    assert io.stats.opens[str(path)] == 2


def test_open_handles_are_bounded(tmp_path: Path) -> None:
    io = FileIO()
    io.max_open_files = 2
    paths = []
    for i in range(4):
        p = tmp_path / f"f{i}"
        p.write_bytes(bytes([i]) * 8)
        paths.append(str(p))
    for p in paths:
        assert io.new_input(p).read(0, 1)
    assert len(io._pool) == 2
    # the least recently used were closed; reading them again opens them again
    assert io.new_input(paths[0]).read(0, 1) == b"\x00"
    assert io.stats.opens[paths[0]] == 2 and io.stats.opens[paths[3]] == 1


def test_pickled_fileio_has_no_open_handles(tmp_path: Path) -> None:
    import pickle

    p = tmp_path / "f"
    p.write_bytes(b"abc")
    io = FileIO({"anon": True})
    io.new_input(str(p)).read()
    copy = pickle.loads(pickle.dumps(io))
    assert copy.storage_options == {"anon": True} and not copy._pool
    assert copy.stats.total_requests == 0
