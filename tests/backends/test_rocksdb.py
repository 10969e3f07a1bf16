"""The RocksDB backend on the real fixtures: restore per key-group range, raw bytes equal to the
canonical savepoint of the same job state, decoded rows equal to Flink's own dump, the storage
seam touched only for the subtask a lookup needs, damaged inputs, and the shared file cache."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import pickle
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import statequery
import statequery.backends.rocksdb as rocks
from statequery.backends import (
    KeyedContext,
    keyed_backend_for,
    keyed_backend_kind,
    open_keyed_backend,
)
from statequery.backends.cache import CacheKey, FileCache, default_cache_dir
from statequery.backends.keygroups import KeyGroupStream
from statequery.backends.rocksdb import (
    DbFile,
    KeyValue,
    RocksDBHandle,
    RocksDBState,
    from_incremental_handle,
    read_entries,
)
from statequery.exceptions import (
    CorruptStateError,
    InvalidOptionError,
    StatequeryError,
    UnsupportedFormatError,
)
from statequery.io import FileIO
from statequery.metadata.handles import IncrementalHandle
from statequery.savepoint import Savepoint
from statequery.scan import _header_order
from tests.conftest import FIXTURES, expected_entries, fixture_dir, read_jsonl

NATIVE = "datastream-rocksdb-native"
INCREMENTAL = "datastream-rocksdb-incremental-checkpoint"
SQL_NATIVE = "sql-rocksdb-native"
ROCKSDB_FIXTURES = [NATIVE, INCREMENTAL, SQL_NATIVE]
CANONICAL_OF = {NATIVE: "datastream-rocksdb-canonical", INCREMENTAL: "datastream-rocksdb-canonical",
                SQL_NATIVE: "sql-rocksdb-canonical"}


# -- helpers ---------------------------------------------------------------------------------------


class _Snapshot(Savepoint):
    """A savepoint opened without its StateMeta snapshot, with helpers for these tests."""

    def __init__(self, metadata_dir: Path | str, io: FileIO | None = None) -> None:
        io = io or FileIO()
        location = os.path.join(str(metadata_dir), "_metadata")
        super().__init__(io, location, io.new_input(location).read())

    def keyed_operators(self) -> Iterator[tuple[Any, list[Any]]]:
        for op in self.metadata.operators:
            handles = [s.managed_keyed for s in op.subtasks if s.managed_keyed is not None]
            if handles:
                yield op, handles

    def keyed(self, uid: str) -> tuple[Any, list[Any]]:
        for op, handles in self.keyed_operators():
            if op.uid == uid:
                return op, handles
        raise KeyError(uid)


def _remote_copy(name: str) -> str:
    """The fixture ``name`` copied to ``memory://`` (idempotent): the cache holds remote files
    only (local files are read in place, never from a cached copy); returns the directory of its
    ``_metadata``."""
    src = fixture_dir(name)
    top = src.parent if src.name.startswith("chk-") else src
    base = f"memory://sq-cache-test/{name}"
    io = FileIO({})
    for path in sorted(top.rglob("*")):
        if path.is_file():
            loc = f"{base}/{path.relative_to(top)}"
            if not io.new_input(loc).exists():
                io.write_atomic(loc, path.read_bytes())
    return f"{base}/{src.name}" if src.name.startswith("chk-") else base


def _state_names(snap: _Snapshot, handle: Any) -> list[str]:
    backend: Any = keyed_backend_for(handle, KeyedContext(snap.resolver, 128))
    return [s.name for s in backend.proxy.states]


def _raw_rocksdb(snap: _Snapshot, cache: FileCache) -> dict[tuple[str, str, bytes], bytes]:
    out: dict[tuple[str, str, bytes], bytes] = {}
    for op, handles in snap.keyed_operators():
        names = _state_names(snap, handles[0])
        for state in names:
            for kv in read_entries(handles, snap.io, state, max_parallelism=op.max_parallelism,
                                   cache=cache, state_names=names, resolver=snap.resolver):
                out[(op.operator_id, state, kv.key)] = kv.value
    return out


def _raw_canonical(snap: _Snapshot) -> dict[tuple[str, str, bytes], bytes]:
    """Raw (key, value) of a canonical savepoint, read with the key-group backend's scanner."""
    out: dict[tuple[str, str, bytes], bytes] = {}
    for op, handles in snap.keyed_operators():
        prefix = 1 if op.max_parallelism <= 128 else 2
        for h in handles:
            modelled = snap.model.operator(op.operator_id)
            header = next(s.keyed_header for s in modelled.subtasks if s.keyed_handle == h)
            assert header is not None
            context = KeyedContext(snap.resolver, op.max_parallelism)
            order = _header_order(modelled, header.state_ids)
            kind = keyed_backend_kind(h, header.layout, context, header.compressed, len(order))
            backend: Any = open_keyed_backend(
                kind, h, context, header.compressed, modelled.key_spec, order)
            names = [layout.name for layout in backend.order]

            def handler(sid: int, op_id: str = op.operator_id, names: list[str] = names,
                        prefix: int = prefix) -> Any:
                def on(buf: bytes, kpos: int, kend: int, vpos: int, vend: int, kg: int) -> None:
                    key = kg.to_bytes(prefix, "big") + buf[kpos:kend]  # the 0x80 flag cleared
                    out[(op_id, names[sid], key)] = buf[vpos:vend]
                return on

            stream = KeyGroupStream(
                backend.stream, {backend.start_key_group + i: o
                                 for i, o in enumerate(backend.offsets)},
                backend.compressed, prefix)
            list(stream.scan([handler(i) for i in range(len(names))]))
    return out


@pytest.fixture
def cache(tmp_path: Path) -> FileCache:
    return FileCache(tmp_path / "cache")


def _assert_cache_clean(cache: FileCache, snap: _Snapshot | None = None) -> None:
    """No temporary file, no DB directory left behind; every entry complete and exact."""
    assert os.listdir(os.path.join(cache.root, "tmp")) == []
    assert os.listdir(os.path.join(cache.root, "db")) == []
    snap = snap or _Snapshot(fixture_dir(NATIVE))
    sources = _entry_sources(cache, snap)
    for path, _ in cache.entries():
        if path in sources:  # entries of other snapshots are checked by their own tests
            assert Path(path).read_bytes() == snap.io.new_input(sources[path]).read()


def _entry_sources(cache: FileCache, snap: _Snapshot) -> dict[str, str]:
    """cache entry path -> source location, for every file the snapshot's handles name."""
    out = {}
    for _, handles in snap.keyed_operators():
        for h in handles:
            for f in from_incremental_handle(h, snap.resolver).files:
                if f.location is not None:
                    try:  # the entry of the file as it is now
                        key = cache.identify(snap.io, CacheKey(f.location, f.size))
                    except StatequeryError:
                        continue  # truncated or removed on purpose: it has no entry
                    out[cache.entry_path(key)] = f.location
    return out


# -- same bytes as the canonical savepoint -------------------------------------------------------


@pytest.mark.parametrize("name", ROCKSDB_FIXTURES)
def test_raw_entries_equal_canonical_savepoint(name: str, cache: FileCache) -> None:
    got = _raw_rocksdb(_Snapshot(fixture_dir(name)), cache)
    want = _raw_canonical(_Snapshot(fixture_dir(CANONICAL_OF[name])))
    assert got.keys() == want.keys()
    assert got == want
    _assert_cache_clean(cache, _Snapshot(fixture_dir(name)))


def test_list_state_merge_operands(cache: FileCache) -> None:
    """``recent-categories`` holds only merge operands: RocksDB without a merge operator cannot
    read them (rocksdict's iterator ends at the first one, which is reported, not taken for the
    end), the merge reader returns every list complete and in order."""
    snap = _Snapshot(fixture_dir(NATIVE))
    op, handles = snap.keyed("user-state")
    names = _state_names(snap, handles[0])
    lists: dict[bytes, bytes] = {}
    for h in handles:
        with RocksDBState(from_incremental_handle(h, snap.resolver), snap.io,
                          max_parallelism=op.max_parallelism, cache=cache,
                          state_names=names) as db:
            assert db.uses_merge_reader("recent-categories")
            assert not db.uses_merge_reader("count")
            with pytest.raises(UnsupportedFormatError, match="holds merge operands"):
                list(db.entries("recent-categories", reader="rocksdb"))
            for kv in db.entries("recent-categories"):
                lists[kv.key] = kv.value
            # value CFs: both readers agree
            assert list(db.entries("count", reader="sst")) == list(db.entries("count"))
    want = {e["key"]: e["value"] for e in expected_entries(NATIVE)
            if e["state"] == "recent-categories"}
    got = {}
    for key, value in lists.items():
        user = key[2 : 2 + key[1] - 1].decode()
        got[user] = [e[1:].decode() for e in value.split(b",")]
        assert all(e[0] == len(e) for e in value.split(b","))  # StringValue length + 1
    assert got == want


# -- decoded rows through reader.py ----------------------------------------------------------------


@pytest.mark.parametrize("name", ROCKSDB_FIXTURES)
def test_every_state_equals_flink_dump(name: str, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch, decode_path: str) -> None:
    from support.entries import canonical, savepoint_entries

    monkeypatch.setattr(rocks, "_DEFAULT_CACHE", FileCache(tmp_path / "cache"))
    snap = _Snapshot(fixture_dir(name))
    got = savepoint_entries(snap, key_group=True)
    want = sorted(canonical(e) for e in read_jsonl(FIXTURES / "dump" / f"{name}.jsonl"))
    assert got == want
    expected = sorted(canonical(e) for e in expected_entries(name))
    assert savepoint_entries(snap, key_group=False) == expected


# -- key-group ranges and the storage seam -------------------------------------------------------


def test_key_group_range(cache: FileCache) -> None:
    snap = _Snapshot(fixture_dir(NATIVE))
    op, handles = snap.keyed("user-state")
    every = list(read_entries(handles, snap.io, "amount-by-category", max_parallelism=128,
                              cache=cache, resolver=snap.resolver))
    assert {kv.key_group for kv in every} & set(range(64)) and \
        {kv.key_group for kv in every} & set(range(64, 128))
    for lo, hi in [(0, 127), (10, 70), (64, 64), (63, 64), (100, 127), (0, 0)]:
        part = list(read_entries(handles, snap.io, "amount-by-category", max_parallelism=128,
                                 key_groups=(lo, hi), cache=cache, resolver=snap.resolver))
        assert part == [kv for kv in every if lo <= kv.key_group <= hi]
        assert all(kv.key[0] == kv.key_group for kv in part)


def test_keys_outside_the_handle_range_are_dropped(cache: FileCache) -> None:
    """A DB restored across rescaling still holds keys of other key groups: they are dropped."""
    snap = _Snapshot(fixture_dir(NATIVE))
    _, handles = snap.keyed("user-state")
    full = from_incremental_handle(handles[1], snap.resolver)  # key groups 64..127
    every = list(read_entries([full], snap.io, "count", max_parallelism=128, cache=cache))
    narrowed = RocksDBHandle(64, 90, full.files)
    with RocksDBState(narrowed, snap.io, max_parallelism=128, cache=cache) as db:
        got = list(db.entries("count"))
        assert got == [kv for kv in every if kv.key_group <= 90]
        assert list(db.entries("count", (91, 127))) == []
        assert list(db.entries("count", (0, 63))) == []
    assert len(got) < len(every)


def test_single_key_lookup_fetches_one_subtask(cache: FileCache) -> None:
    from statequery.hashing import key_group_of

    snap = _Snapshot(fixture_dir(NATIVE))
    op, handles = snap.keyed("user-state")
    kg = key_group_of("user-7", 128)
    owner = [h for h in handles if h.key_group_range.start <= kg <= h.key_group_range.end]
    assert len(owner) == 1
    snap.io.stats.reset()
    hits = [kv for kv in read_entries(handles, snap.io, "count", max_parallelism=128,
                                      key_groups=(kg, kg), cache=cache, resolver=snap.resolver)
            if kv.key[1:] == b"\x07user-7\x00"]
    assert len(hits) == 1
    touched = set(snap.io.stats.bytes_read) | set(snap.io.stats.opens)
    own = {f.location for f in from_incremental_handle(owner[0], snap.resolver).files}
    others = {f.location for h in handles if h is not owner[0]
              for f in from_incremental_handle(h, snap.resolver).files}
    assert touched and touched <= own
    assert not touched & others
    # a second lookup reads the local files in place again (never a cached copy, issue 23),
    # still only the owning subtask's
    snap.io.stats.reset()
    assert list(read_entries(handles, snap.io, "count", max_parallelism=128, key_groups=(kg, kg),
                             cache=cache, resolver=snap.resolver))
    assert set(snap.io.stats.opens) <= own
    assert cache.entries() == []  # nothing of a local savepoint is copied into the cache


def test_lookup_through_reader_reads_only_the_owning_subtask(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    from statequery.reader import lookup

    monkeypatch.setattr(rocks, "_DEFAULT_CACHE", FileCache(tmp_path / "cache"))
    snap = _Snapshot(fixture_dir(NATIVE))
    _, handles = snap.keyed("user-state")
    snap.io.stats.reset()
    tables = lookup(snap, "user-7", "user-state")
    assert tables[("user-state", "count")].to_pylist()[0]["key"] == "user-7"
    assert tables[("user-state", "recent-categories")].num_rows == 1
    from statequery.hashing import key_group_of

    kg = key_group_of("user-7", 128)
    other = [h for h in handles if not h.key_group_range.start <= kg <= h.key_group_range.end]
    db_files = {f.location for h in other for f in from_incremental_handle(h, snap.resolver).files}
    assert not set(snap.io.stats.bytes_read) & db_files


# -- damaged inputs ------------------------------------------------------------------------------


def _copy_fixture(tmp_path: Path, name: str = NATIVE) -> Path:
    src = fixture_dir(name)
    dst = tmp_path / "sp"
    shutil.copytree(src, dst)
    return dst


def _user_state(snap: _Snapshot) -> tuple[Any, list[str], RocksDBHandle]:
    _, handles = snap.keyed("user-state")
    return handles[0], _state_names(snap, handles[0]), from_incremental_handle(
        handles[0], snap.resolver)


def _file(handle: RocksDBHandle, prefix: str) -> DbFile:
    return next(f for f in handle.files if f.local_path.startswith(prefix)
                and (not prefix[0].isdigit() or f.local_path.endswith(".sst")))


def _read_all(handle: RocksDBHandle, snap: _Snapshot, cache: FileCache,
              names: list[str] | None) -> list[KeyValue]:
    with RocksDBState(handle, snap.io, max_parallelism=128, cache=cache,
                      state_names=names) as db:
        return [kv for s in db.column_families for kv in db.entries(s)]


def test_the_compiled_scan_restores_without_opening_rocksdb(cache: FileCache) -> None:
    """The compiled table scan reads the tables itself: the restore checks the replayed
    MANIFEST against the handle and the tables' indexes, and RocksDB is opened only when
    rocksdict reads (here ``reader='rocksdb'``), which gives the scan's pairs."""
    from statequery.backends import sst as sst_module
    from tests.backends.test_differential import _check_built

    _check_built()
    snap = _Snapshot(fixture_dir(NATIVE))
    _, names, handle = _user_state(snap)
    with RocksDBState(handle, snap.io, max_parallelism=128, cache=cache,
                      state_names=names) as db:
        assert db.is_open and db._rdict is None
        scanned = {}
        for state in db.column_families:
            scan = db.table_scan(state)
            if scan is not None:
                scanned[state] = list(sst_module.scanned_pairs(scan))
        assert any(scanned.values()) and db._rdict is None
        for state, pairs in scanned.items():
            if not db.uses_merge_reader(state):
                assert [(kv.key, kv.value) for kv in db.entries(state, reader="rocksdb")] == pairs
        assert db._rdict is not None
    assert not db.is_open and db._rdict is None
    _assert_cache_clean(cache)


@pytest.mark.parametrize("victim", ["sst", "MANIFEST"])
def test_truncated_file_is_named_and_never_cached(tmp_path: Path, cache: FileCache,
                                                  victim: str) -> None:
    snap = _Snapshot(_copy_fixture(tmp_path))
    _, names, handle = _user_state(snap)
    f = next(f for f in handle.files if (f.local_path.endswith(".sst") if victim == "sst"
                                         else f.local_path.startswith("MANIFEST")))
    assert f.location is not None
    data = Path(f.location).read_bytes()
    Path(f.location).write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptStateError) as info:
        _read_all(handle, snap, cache, names)
    assert f.location in str(info.value)
    assert "handle says" in str(info.value)
    half = data[: len(data) // 2]
    assert not any(Path(p).read_bytes() == half for p, _ in cache.entries())
    _assert_cache_clean(cache, snap)
    Path(f.location).write_bytes(data)  # repaired: the same cache now works
    assert _read_all(handle, snap, cache, names)
    _assert_cache_clean(cache, snap)


def test_missing_sst_file(tmp_path: Path, cache: FileCache) -> None:
    snap = _Snapshot(_copy_fixture(tmp_path))
    _, names, handle = _user_state(snap)
    f = _file(handle, "0")
    assert f.location is not None
    os.unlink(f.location)
    with pytest.raises(StatequeryError) as info:
        _read_all(handle, snap, cache, names)
    assert f.location in str(info.value)
    _assert_cache_clean(cache, snap)


def test_handle_without_an_sst_the_manifest_names(tmp_path: Path, cache: FileCache) -> None:
    snap = _Snapshot(fixture_dir(NATIVE))
    _, names, handle = _user_state(snap)
    sst = _file(handle, "0")
    manifest = _file(handle, "MANIFEST")
    short = RocksDBHandle(handle.start_key_group, handle.end_key_group,
                          tuple(f for f in handle.files if f is not sst))
    with pytest.raises(CorruptStateError) as info:
        _read_all(short, snap, cache, names)
    assert sst.local_path in str(info.value) and str(manifest.location) in str(info.value)
    _assert_cache_clean(cache)


def test_handle_size_mismatch(cache: FileCache) -> None:
    snap = _Snapshot(fixture_dir(NATIVE))
    _, names, handle = _user_state(snap)
    sst = _file(handle, "0")
    wrong = RocksDBHandle(handle.start_key_group, handle.end_key_group, tuple(
        DbFile(f.local_path, f.location, f.size + 1) if f is sst else f for f in handle.files))
    with pytest.raises(CorruptStateError, match="handle says") as info:
        _read_all(wrong, snap, cache, names)
    assert str(sst.location) in str(info.value)
    _assert_cache_clean(cache)


def test_manifest_truncated_consistently_with_its_handle(tmp_path: Path,
                                                        cache: FileCache) -> None:
    """A MANIFEST cut at a record boundary opens in RocksDB with fewer files: the live-file
    check against the handle catches it."""
    snap = _Snapshot(_copy_fixture(tmp_path))
    _, names, handle = _user_state(snap)
    m = _file(handle, "MANIFEST")
    assert m.location is not None
    data = Path(m.location).read_bytes()
    for cut in (100, len(data) - 100):
        Path(m.location).write_bytes(data[:cut])
        short = RocksDBHandle(handle.start_key_group, handle.end_key_group, tuple(
            DbFile(f.local_path, f.location, cut) if f is m else f for f in handle.files))
        with pytest.raises(CorruptStateError) as info:
            _read_all(short, snap, cache, names)
        assert m.location in str(info.value)
    _assert_cache_clean(cache, snap)


def test_corrupt_sst_of_the_right_size(tmp_path: Path, cache: FileCache) -> None:
    snap = _Snapshot(_copy_fixture(tmp_path))
    _, names, handle = _user_state(snap)
    f = _file(handle, "0")
    assert f.location is not None
    data = bytearray(Path(f.location).read_bytes())
    data[-8:] = b"\0" * 8  # the footer magic
    Path(f.location).write_bytes(bytes(data))
    with pytest.raises(CorruptStateError, match="magic") as info:
        _read_all(handle, snap, cache, names)
    assert f.location in str(info.value)
    _assert_cache_clean(cache, snap)


def test_column_family_the_metadata_does_not_name(cache: FileCache) -> None:
    snap = _Snapshot(fixture_dir(NATIVE))
    _, names, handle = _user_state(snap)
    fewer = [n for n in names if n != "profile"]
    with pytest.raises(CorruptStateError, match="'profile'") as info:
        _read_all(handle, snap, cache, fewer)
    with RocksDBState(handle, snap.io, max_parallelism=128, cache=cache) as db:
        profile = db.describe("profile")
    assert profile in str(info.value)
    with pytest.raises(CorruptStateError, match="no column family for state"):
        _read_all(handle, snap, cache, [*names, "not-in-the-db"])
    _assert_cache_clean(cache)


def test_missing_current_and_manifest(cache: FileCache) -> None:
    snap = _Snapshot(fixture_dir(NATIVE))
    _, names, handle = _user_state(snap)
    for drop in ("CURRENT", "MANIFEST"):
        short = RocksDBHandle(handle.start_key_group, handle.end_key_group,
                              tuple(f for f in handle.files if not f.local_path.startswith(drop)))
        with pytest.raises(CorruptStateError, match=drop):
            _read_all(short, snap, cache, names)
    _assert_cache_clean(cache)


def test_unknown_state(cache: FileCache) -> None:
    snap = _Snapshot(fixture_dir(NATIVE))
    _, _, handle = _user_state(snap)
    with RocksDBState(handle, snap.io, max_parallelism=128, cache=cache) as db:
        with pytest.raises(InvalidOptionError, match="count"):
            list(db.entries("nope"))
        with pytest.raises(InvalidOptionError):
            list(db.entries("count", reader="magic"))


# -- the cache -------------------------------------------------------------------------------------


def test_cache_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATEQUERY_CACHE_DIR", str(tmp_path / "c"))
    assert default_cache_dir() == str(tmp_path / "c")
    assert FileCache().root == str(tmp_path / "c")
    monkeypatch.delenv("STATEQUERY_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == str(tmp_path / "xdg" / "statequery")
    sp = tmp_path / "sp"
    sp.mkdir()
    with pytest.raises(InvalidOptionError, match="inside the savepoint"):
        FileCache(sp / ".cache").check_outside(str(sp))
    FileCache(tmp_path / "elsewhere").check_outside(str(sp))
    c = FileCache(tmp_path / "p", max_bytes=123)
    c2 = pickle.loads(pickle.dumps(c))
    assert (c2.root, c2.max_bytes) == (c.root, 123)


def test_damaged_cache_entry_is_fetched_again(cache: FileCache) -> None:
    snap = _Snapshot(_remote_copy(NATIVE))
    _, names, handle = _user_state(snap)
    want = _read_all(handle, snap, cache, names)
    sst = _file(handle, "0")
    assert sst.location is not None
    entry = cache.entry_path(cache.identify(snap.io, CacheKey(sst.location, sst.size)))
    with open(entry, "r+b") as f:
        f.truncate(10)
    snap.io.stats.reset()
    assert _read_all(handle, snap, cache, names) == want
    assert snap.io.stats.bytes_read[sst.location] == sst.size
    assert os.path.getsize(entry) == sst.size


def test_eviction_keeps_the_cache_bounded(tmp_path: Path) -> None:
    snap = _Snapshot(_remote_copy(NATIVE))
    _, names, handle = _user_state(snap)
    total = sum(f.size for f in handle.files if f.location)
    small = FileCache(tmp_path / "small", max_bytes=total // 3)
    want = _read_all(handle, snap, FileCache(tmp_path / "big"), names)
    assert _read_all(handle, snap, small, names) == want  # evicted only after use
    assert small.size() <= total // 3
    assert _read_all(handle, snap, small, names) == want
    small.clear()
    assert small.size() == 0
    _assert_cache_clean(small, snap)


def test_stale_db_directories_are_removed(tmp_path: Path) -> None:
    cache = FileCache(tmp_path / "c")
    live = cache.new_db_dir()
    dead = os.path.join(cache.root, "db", "0" * 32)
    os.makedirs(dead)
    Path(dead + ".lock").touch()  # its owner died: nobody holds the lock
    cache.evict()
    assert not os.path.exists(dead) and os.path.isdir(live.path)
    live.close()
    _assert_cache_clean(cache)


def _read_in_process(args: tuple[str, str]) -> list[tuple[str, str, bytes, bytes]]:
    name, cache_root = args
    snap = _Snapshot(_remote_copy(name))  # memory:// is per process: each makes its copy
    cache = FileCache(cache_root)
    out = []
    for op, handles in snap.keyed_operators():
        names = _state_names(snap, handles[0])
        for state in names:
            out += [(op.operator_id, state, kv.key, kv.value)
                    for kv in read_entries(handles, snap.io, state, max_parallelism=128,
                                           cache=cache, state_names=names,
                                           resolver=snap.resolver)]
    return out


@pytest.mark.parametrize("name", [NATIVE, INCREMENTAL])
def test_two_processes_share_one_cache(name: str, tmp_path: Path) -> None:
    root = str(tmp_path / "shared-cache")
    args = (name, root)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        a, b = pool.map(_read_in_process, [args, args])
    assert a == b and a
    cache = FileCache(root)
    snap = _Snapshot(_remote_copy(name))
    _assert_cache_clean(cache, snap)
    sources = _entry_sources(cache, snap)
    entries = cache.entries()
    assert len(entries) == len(sources)  # one entry per file, no duplicates
    for path, _ in entries:
        assert Path(path).read_bytes() == snap.io.new_input(sources[path]).read()


def test_threads_share_one_cache(tmp_path: Path) -> None:
    root = str(tmp_path / "c")
    args = (NATIVE, root)
    _remote_copy(NATIVE)  # before the threads start
    results: list[Any] = [None] * 4
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = _read_in_process(args)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(r == results[0] for r in results) and results[0]
    _assert_cache_clean(FileCache(root), _Snapshot(_remote_copy(NATIVE)))
    assert FileCache(root).entries()


def test_inline_and_segment_files(tmp_path: Path, cache: FileCache) -> None:
    """Inline (``ByteStreamStateHandle``) files and file-merging segments restore too."""
    snap = _Snapshot(fixture_dir(NATIVE))
    _, names, handle = _user_state(snap)
    want = _read_all(handle, snap, cache, names)
    packed = tmp_path / "packed.bin"
    files = []
    with open(packed, "wb") as out:
        out.write(b"junk" * 10)
        for f in handle.files:
            assert f.location is not None
            data = Path(f.location).read_bytes()
            if f.local_path in ("CURRENT",) or f.local_path.startswith("OPTIONS"):
                files.append(DbFile(f.local_path, data=data, size=len(data)))
            else:
                files.append(DbFile(f.local_path, location=str(packed), size=len(data),
                                    offset=out.tell()))
                out.write(data)
    other = RocksDBHandle(handle.start_key_group, handle.end_key_group, tuple(files))
    assert _read_all(other, snap, cache, names) == want
    assert isinstance(snap.metadata.operators[0].subtasks, tuple)
    assert any(isinstance(h, IncrementalHandle) for _, hs in snap.keyed_operators() for h in hs)


def test_with_the_snapshot_a_lookup_reads_no_header_byte(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The StateMeta snapshot holds what the meta-data stream (the keyed header) says: a lookup
    restores the owning subtask's DB without reading that stream again."""
    import statequery

    monkeypatch.setattr(rocks, "_DEFAULT_CACHE", FileCache(tmp_path / "cache"))
    first = statequery.open(str(fixture_dir(NATIVE)), use_snapshot=False)
    snapshot = first.write_snapshot(str(tmp_path / "meta.msgpack"))
    io = FileIO()
    sp = statequery.open(str(fixture_dir(NATIVE)), io=io, snapshot=snapshot)
    assert sp.from_snapshot
    headers = {sp.resolver.location(st.keyed_handle.meta)
               for op in sp.keyed_operators() for st in op.subtasks
               if st.keyed_handle is not None}
    io.stats.reset()
    tables = sp.lookup("user-7", "user-state")
    assert tables[("user-state", "count")].column("key").to_pylist() == ["user-7"]
    touched = set(io.stats.bytes_read) | set(io.stats.opens)
    assert touched and not touched & headers


def test_restored_databases_stay_open_per_savepoint_until_close() -> None:
    """Warm lookups reuse the restored DB (a seek, no restore); close() closes every DB; the
    rows equal those of a savepoint that restores per read."""
    path = str(fixture_dir("datastream-rocksdb-native"))
    with statequery.open(path) as sp:
        pool = sp.context.open_databases
        first = sp.lookup("user-3")
        restores = pool.restores
        assert restores == len(pool) == 2  # the two keyed RocksDB operators
        for _ in range(3):
            again = sp.lookup("user-3")
            assert {k: t.to_pylist() for k, t in again.items()} == {
                k: t.to_pylist() for k, t in first.items()
            }
        assert pool.restores == restores
        dbs = list(pool._dbs.values())
    assert len(pool) == 0 and not any(db.is_open for db in dbs)
    fresh = statequery.open(path)
    fresh.context = dataclasses.replace(fresh.context, open_databases=None)  # restore per read
    want = {k: t.to_pylist() for k, t in fresh.lookup("user-3").items()}
    assert want == {k: t.to_pylist() for k, t in first.items()}
    assert sum(t.num_rows for t in first.values()) > 0


class _FakeDb:
    """A pooled database that notes when it is closed (the pool's bookkeeping only)."""

    def __init__(self, i: int, closed: list[int]) -> None:
        self.i, self.is_open, self.closed = i, True, closed

    def close(self) -> None:
        self.closed.append(self.i)
        self.is_open = False


def test_database_pool_is_bounded() -> None:
    from statequery.backends.rocksdb import OpenDatabases

    closed: list[int] = []
    pool = OpenDatabases(limit=2)
    for i in (1, 2, 1, 3):
        pool.get(i, lambda i=i: _FakeDb(i, closed))  # type: ignore[misc]
    assert len(pool) == 2 and closed == [2] and pool.restores == 3
    pool.close()
    assert sorted(closed) == [1, 2, 3]


def test_a_database_in_use_is_closed_after_its_last_use() -> None:
    """Evicting a DB another thread's scan still reads defers its close to that scan's end."""
    from statequery.backends.rocksdb import OpenDatabases

    closed: list[int] = []
    pool = OpenDatabases(limit=1)
    busy = pool.get(1, lambda: _FakeDb(1, closed), use=True)
    again = pool.peek(1, use=True)
    assert again is busy
    pool.get(2, lambda: _FakeDb(2, closed))  # evicts 1, which is in use twice
    assert closed == [] and len(pool) == 1
    pool.release(busy)
    assert closed == []
    pool.release(busy)
    assert closed == [1]
    pool.close()
    assert closed == [1, 2]
