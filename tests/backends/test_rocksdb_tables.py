"""Cold lookups that fetch only the tables that can hold the key (``TableReadState``): the
MANIFEST reader against RocksDB's own view of every fixture, rows equal to the full restore's on
every RocksDB fixture, the files fetched (asserted through the storage seam), damaged inputs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

import statequery
import statequery.backends.rocksdb as rocks
from statequery.backends.cache import FileCache
from statequery.backends.manifest import read_manifest
from statequery.backends.rocksdb import (
    DbFile,
    RocksDBHandle,
    RocksDBState,
    TableReadState,
    from_incremental_handle,
)
from statequery.exceptions import CorruptStateError
from statequery.hashing import key_group_of
from statequery.io import FileIO
from statequery.metadata.handles import IncrementalHandle
from tests.backends.test_rocksdb import NATIVE, _assert_cache_clean, _Snapshot, _state_names
from tests.conftest import FIXTURES, fixture_dir

NAMED = [
    "datastream-rocksdb-native",
    "datastream-rocksdb-incremental-checkpoint",
    "ttl-kryo-rocksdb-native",
    "sql-rocksdb-native",
    "sql-ops-rocksdb-native",
    "sql-minibatch-rocksdb-native",
    # ForSt: RocksDB's files, with partitioned (two-level) indexes and filters by default
    "datastream-forst-native",
    "datastream-forst-checkpoint",
    "async-datastream-forst-checkpoint",  # State V2: ForSt's database files in place
    # heap timers in raw keyed state: the RocksDB part of a full (non-incremental) checkpoint
    "datastream-rocksdb-checkpoint-heaptimers",
]
SEQUENCE = sorted(str(p.relative_to(FIXTURES))
                  for p in (FIXTURES / "sequence-rocksdb-incremental").glob("*/chk-*"))


def _path(name: str) -> Path:
    return fixture_dir(name) if name in NAMED else FIXTURES / name


def _handles(snap: _Snapshot) -> list[tuple[Any, Any]]:
    return [(op, h) for op, hs in snap.keyed_operators() for h in hs
            if isinstance(h, IncrementalHandle)]


@pytest.fixture
def cache(tmp_path: Path) -> FileCache:
    return FileCache(tmp_path / "cache")


# -- the MANIFEST ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMED + SEQUENCE)
def test_manifest_equals_what_rocksdb_opens(name: str, cache: FileCache) -> None:
    """Every live table with RocksDB's own level, size and key range; the column family each
    table's properties name."""
    snap = _Snapshot(_path(name))
    handles = _handles(snap)
    assert handles
    for op, h in handles:
        handle = from_incremental_handle(h, snap.resolver)
        with RocksDBState(handle, snap.io, max_parallelism=op.max_parallelism,
                          cache=cache) as db:
            manifest = next(f for f in handle.files if f.local_path.startswith("MANIFEST"))
            assert manifest.location is not None
            m = read_manifest(Path(manifest.location).read_bytes(), manifest.location)
            live = {os.path.basename(lf["name"]): lf for lf in db._db.live_files()}
            mine = {t.name: t for t in m.tables.values()}
            assert live.keys() == mine.keys() == {f.local_path for f in handle.sst_files}
            for name_, lf in live.items():
                t = mine[name_]
                assert (t.size, t.level, t.smallest_user_key, t.largest_user_key) == (
                    lf["size"], lf["level"], lf["start_key"], lf["end_key"])
                assert t.column_family == db._tables[name_].properties.column_family_name
            assert sorted(n for n in m.column_families.values() if n != "default") == sorted(
                db.column_families)
    _assert_cache_clean(cache, snap)


# -- same entries as the full restore ------------------------------------------------------------


@pytest.mark.parametrize("name", NAMED + SEQUENCE)
def test_entries_equal_the_full_restore(name: str, cache: FileCache) -> None:
    """Every state, every key group on its own and the handle's whole range: the table reader
    over the tables the MANIFEST selects equals RocksDB (and the merge reader) on the restored
    DB."""
    snap = _Snapshot(_path(name))
    for op, h in _handles(snap):
        handle = from_incremental_handle(h, snap.resolver)
        names = _state_names(snap, h)
        with RocksDBState(handle, snap.io, max_parallelism=op.max_parallelism, cache=cache,
                          state_names=names) as full, \
                TableReadState(handle, snap.io, max_parallelism=op.max_parallelism, cache=cache,
                               state_names=names) as tables:
            assert tables.column_families == full.column_families
            for state in full.column_families:
                every = list(full.entries(state))
                assert list(tables.entries(state)) == every
                for kg in range(handle.start_key_group, handle.end_key_group + 1):
                    want = [kv for kv in every if kv.key_group == kg]
                    assert list(tables.entries(state, (kg, kg))) == want
                    for kv in want[:2]:  # a seek to one key's entries
                        assert list(tables.entries(state, (kg, kg), key_prefix=kv.key[1:])) == \
                            list(full.entries(state, (kg, kg), key_prefix=kv.key[1:]))
    _assert_cache_clean(cache, snap)


@pytest.mark.parametrize("name", NAMED + SEQUENCE)
def test_lookup_rows_equal_the_full_restore(name: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``Savepoint.lookup`` of keys the savepoint holds: the same tables with and without
    table-selective lookups; the selective one opens no RocksDB instance."""
    monkeypatch.setattr(rocks, "_DEFAULT_CACHE", FileCache(tmp_path / "cache"))
    path = str(_path(name))
    full = statequery.open(path, use_snapshot=False)
    sel = statequery.open(path, use_snapshot=False)
    looked = 0
    for op in full.keyed_operators():
        keys: list[Any] = []
        rows: dict[str, list[dict[str, Any]]] = {}
        for st in op.states:
            table = full.read(op.operator_id, st.name)
            rows[st.name] = table.to_pylist()
            if "key" in table.column_names:
                keys += [k for k in table.column("key").to_pylist() if k not in keys]
        for key in keys[:4]:
            # each state read for the key (table reader) equals the full scan's rows of the key
            for st in op.states:
                if rows[st.name] and "key" in rows[st.name][0]:
                    assert sel.read(op.operator_id, st.name, key=key).to_pylist() == [
                        r for r in rows[st.name] if r["key"] == key]
            monkeypatch.setattr(rocks, "SELECTIVE_LOOKUPS", False)
            want = {k: t.to_pylist() for k, t in full.lookup(key, op.operator_id).items()}
            monkeypatch.setattr(rocks, "SELECTIVE_LOOKUPS", True)
            got = {k: t.to_pylist() for k, t in sel.lookup(key, op.operator_id).items()}
            assert got == want
            assert any(want.values())
            looked += 1
    assert looked
    dbs = list(sel.context.open_databases._dbs.values())
    assert dbs and all(isinstance(db, TableReadState) for db in dbs)
    sel.close()
    full.close()


# -- what a cold lookup fetches ------------------------------------------------------------------


def _needed(db: RocksDBState, state: str, start: bytes, stop: bytes) -> set[str]:
    """Tables of ``state`` RocksDB itself says can hold keys in ``[start, stop)``."""
    return {os.path.basename(lf["name"]) for lf in db._db.live_files()
            if db._tables[os.path.basename(lf["name"])].properties.column_family_name == state
            and lf["end_key"] >= start and lf["start_key"] < stop}


@pytest.mark.parametrize("key", ["user-7", "user-3"])
def test_cold_lookup_fetches_only_the_tables_that_can_hold_the_key(
        key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rocks, "_DEFAULT_CACHE", FileCache(tmp_path / "cache"))
    io = FileIO()
    sp = statequery.open(str(fixture_dir(NATIVE)), io=io, use_snapshot=False)
    op = sp.operator("user-state")
    kg = key_group_of(key, op.max_parallelism)
    subtask = next(st for st in op.subtasks
                   if st.keyed_handle.key_group_range.start <= kg
                   <= st.keyed_handle.key_group_range.end)
    handle = from_incremental_handle(subtask.keyed_handle, sp.resolver)
    states = [s.name for s in op.states]
    sp.state_meta()  # headers read before measuring
    io.stats.reset()
    got = sp.lookup(key, "user-state")
    assert got[("user-state", "count")].column("key").to_pylist() == [key]
    # a file the lookup needs is opened through the seam once, never one it does not need:
    # the tables read in ranges, CURRENT and the MANIFEST linked into the DB directory (no
    # byte read through the seam) or copied once where they cannot be linked (another device)
    fetched = {loc for loc, n in io.stats.opens.items() if n} | {
        loc for loc, n in io.stats.bytes_read.items() if n}
    assert all(n == 1 for n in io.stats.opens.values())
    # what RocksDB's own view of the restored DB says can hold the key
    from statequery.backends.keygroups import serialized_key

    with RocksDBState(handle, FileIO(), max_parallelism=op.max_parallelism,
                      cache=FileCache(tmp_path / "oracle"), state_names=states) as db:
        needed: set[str] = set()
        for st in op.states:
            start = kg.to_bytes(1, "big")
            stop = (kg + 1).to_bytes(1, "big")
            if not st.is_timer:
                start += serialized_key(key, st.key)
                stop = rocks._prefix_successor(start) or stop
            needed |= _needed(db, st.name, start, stop)
    by_name = {f.local_path: f.location for f in handle.files}
    current = by_name["CURRENT"]
    manifest = next(loc for n, loc in by_name.items() if n.startswith("MANIFEST"))
    assert needed
    assert fetched == {current, manifest} | {by_name[n] for n in needed}
    sizes = {f.location: f.size for f in handle.files}
    probe = tmp_path / "link-probe"
    try:  # whether a file of the fixture can be hard-linked next to the cache
        os.link(current, probe)
        linkable = True
        probe.unlink()
    except OSError:
        linkable = False
    for loc in (current, manifest):
        assert io.stats.bytes_read[loc] == (0 if linkable else sizes[loc])
    for n in needed:
        assert 0 < io.stats.bytes_read[by_name[n]] <= sizes[by_name[n]]  # its blocks, once
    assert not any(n.startswith("OPTIONS") and loc in fetched for n, loc in by_name.items())
    # warm: the same Savepoint serves the next lookup without fetching anything
    io.stats.reset()
    again = sp.lookup(key, "user-state")
    assert {k: t.to_pylist() for k, t in again.items()} == {k: t.to_pylist()
                                                             for k, t in got.items()}
    assert io.stats.total_bytes == 0
    sp.close()


def test_lookup_of_one_state_fetches_its_tables_only(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rocks, "_DEFAULT_CACHE", FileCache(tmp_path / "cache"))
    io = FileIO()
    sp = statequery.open(str(fixture_dir(NATIVE)), io=io, use_snapshot=False)
    sp.state_meta()
    io.stats.reset()
    table = sp.read("user-state", "count", key="user-7")
    assert table.column("key").to_pylist() == ["user-7"]
    snap = _Snapshot(fixture_dir(NATIVE))
    _, handles = snap.keyed("user-state")
    count_tables = set()
    for h in handles:
        for f in from_incremental_handle(h, snap.resolver).sst_files:
            with rocks.SstFile(str(f.location)) as t:
                if t.properties.column_family_name == "count":
                    count_tables.add(f.location)
    ssts = {loc for loc in io.stats.bytes_read if loc in {
        f.location for h in handles for f in from_incremental_handle(h, snap.resolver).sst_files}}
    assert len(ssts) == 1 and ssts <= count_tables
    sp.close()


def test_key_group_without_tables_fetches_the_manifest_only(cache: FileCache) -> None:
    """Subtask 0 holds keys of key groups 1..56 only: key group 0 meets no table."""
    snap = _Snapshot(fixture_dir(NATIVE))
    _, handles = snap.keyed("user-state")
    handle = from_incremental_handle(handles[0], snap.resolver)
    names = _state_names(snap, handles[0])
    snap.io.stats.reset()
    with TableReadState(handle, snap.io, max_parallelism=128, cache=cache,
                        state_names=names) as db:
        for state in names:
            assert db.tables_for(state, b"\x00", b"\x01") == []
            assert list(db.entries(state, (0, 0))) == []
        assert sorted(db.placed) == sorted(
            f.local_path for f in handle.files
            if f.local_path == "CURRENT" or f.local_path.startswith("MANIFEST"))
    assert set(snap.io.stats.bytes_read) <= {f.location for f in handle.files
                                             if not f.local_path.endswith(".sst")}
    _assert_cache_clean(cache, snap)


def test_a_restored_db_serves_lookups_when_open(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """After a full scan restored the DB, lookups seek in it (no table-by-table state)."""
    monkeypatch.setattr(rocks, "_DEFAULT_CACHE", FileCache(tmp_path / "cache"))
    with statequery.open(str(fixture_dir(NATIVE)), use_snapshot=False) as sp:
        sp.read("user-state", "count")
        pool = sp.context.open_databases
        restores = pool.restores
        sp.lookup("user-7", "user-state")
        assert pool.restores == restores
        assert all(isinstance(db, RocksDBState) for db in pool._dbs.values())


# -- damaged inputs ------------------------------------------------------------------------------


def _copy(tmp_path: Path) -> _Snapshot:
    dst = tmp_path / "sp"
    shutil.copytree(fixture_dir(NATIVE), dst)
    return _Snapshot(dst)


def _open(snap: _Snapshot, handle: RocksDBHandle, cache: FileCache,
          names: list[str] | None) -> list[Any]:
    with TableReadState(handle, snap.io, max_parallelism=128, cache=cache,
                        state_names=names) as db:
        return [kv for s in db.column_families for kv in db.entries(s)]


def _user_state(snap: _Snapshot) -> tuple[list[str], RocksDBHandle]:
    _, handles = snap.keyed("user-state")
    return _state_names(snap, handles[0]), from_incremental_handle(handles[0], snap.resolver)


def _manifest(handle: RocksDBHandle) -> DbFile:
    return next(f for f in handle.files if f.local_path.startswith("MANIFEST"))


@pytest.mark.parametrize("cut", [100, -100, -1])
def test_truncated_manifest_is_named(tmp_path: Path, cache: FileCache, cut: int) -> None:
    """Cut inside a record, or at a record boundary with a handle that agrees: a typed error
    naming the MANIFEST, and nothing half-written in the cache."""
    snap = _copy(tmp_path)
    names, handle = _user_state(snap)
    m = _manifest(handle)
    assert m.location is not None
    data = Path(m.location).read_bytes()
    size = cut if cut > 0 else len(data) + cut
    Path(m.location).write_bytes(data[:size])
    short = RocksDBHandle(handle.start_key_group, handle.end_key_group, tuple(
        DbFile(f.local_path, f.location, size) if f is m else f for f in handle.files))
    with pytest.raises(CorruptStateError) as info:
        _open(snap, short, cache, names)
    assert m.location in str(info.value)
    with pytest.raises(CorruptStateError, match="handle says"):  # the handle's own size
        _open(snap, handle, cache, names)
    _assert_cache_clean(cache, snap)


def test_manifest_naming_a_table_the_handle_lacks(cache: FileCache) -> None:
    snap = _Snapshot(fixture_dir(NATIVE))
    names, handle = _user_state(snap)
    sst = handle.sst_files[0]
    short = RocksDBHandle(handle.start_key_group, handle.end_key_group,
                          tuple(f for f in handle.files if f is not sst))
    with pytest.raises(CorruptStateError, match="missing SST") as info:
        _open(snap, short, cache, names)
    assert sst.local_path in str(info.value) and str(_manifest(handle).location) in str(
        info.value)
    _assert_cache_clean(cache)


def test_states_and_column_families_must_agree(cache: FileCache) -> None:
    snap = _Snapshot(fixture_dir(NATIVE))
    names, handle = _user_state(snap)
    with pytest.raises(CorruptStateError, match="'profile'"):
        _open(snap, handle, cache, [n for n in names if n != "profile"])
    with pytest.raises(CorruptStateError, match="no column family for state"):
        _open(snap, handle, cache, [*names, "not-in-the-db"])
    _assert_cache_clean(cache)


def test_table_of_another_column_family_is_named(tmp_path: Path, cache: FileCache) -> None:
    """A table whose properties name another column family than the MANIFEST says."""
    snap = _copy(tmp_path)
    names, handle = _user_state(snap)
    m = read_manifest(Path(str(_manifest(handle).location)).read_bytes())
    count = next(t for t in m.tables.values() if t.column_family == "count")
    other = next(t for t in m.tables.values() if t.column_family == "sum-amount")
    by_name = {f.local_path: f for f in handle.files}
    a, b = by_name[count.name], by_name[other.name]
    swapped = RocksDBHandle(handle.start_key_group, handle.end_key_group, tuple(
        DbFile(f.local_path, b.location, b.size) if f is a else
        DbFile(f.local_path, a.location, a.size) if f is b else f for f in handle.files))
    if a.size == b.size:
        with pytest.raises(CorruptStateError, match="its MANIFEST says") as info:
            _open(snap, swapped, cache, names)
    else:
        with pytest.raises(CorruptStateError, match="handle says") as info:
            _open(snap, swapped, cache, names)
    assert str(b.location) in str(info.value) or str(a.location) in str(info.value)
    _assert_cache_clean(cache, snap)


def test_corrupt_table_is_named(tmp_path: Path, cache: FileCache) -> None:
    snap = _copy(tmp_path)
    names, handle = _user_state(snap)
    f = handle.sst_files[0]
    assert f.location is not None
    data = bytearray(Path(f.location).read_bytes())
    data[-8:] = b"\0" * 8
    Path(f.location).write_bytes(bytes(data))
    with pytest.raises(CorruptStateError, match="magic") as info:
        _open(snap, handle, cache, names)
    assert f.location in str(info.value)
    _assert_cache_clean(cache, snap)


# -- ingested tables -------------------------------------------------------------------------------


def test_ingested_table_takes_its_sequence_number_from_the_manifest(tmp_path: Path,
                                                                   cache: FileCache) -> None:
    """A table written by ``SstFileWriter`` and ingested over older values carries sequence
    number 0 in the file; RocksDB orders it by the global one in the MANIFEST. Both SST-reader
    paths (the merge reader of a restored DB and the table-selective reader) must too."""
    import rocksdict as r

    path = tmp_path / "db"
    opts = r.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_disable_auto_compactions(True)
    db = r.Rdict(str(path), opts)
    cf = db.create_column_family("s", r.Options(raw_mode=True))
    for i in range(10):
        cf[bytes([1, i])] = b"old%d" % i
    db.flush()
    writer = r.SstFileWriter(r.Options(raw_mode=True))
    writer.open(str(tmp_path / "ext.sst"))
    for i in range(0, 10, 2):
        writer[bytes([1, i])] = b"new%d" % i
    writer.finish()
    cf.ingest_external_file([str(tmp_path / "ext.sst")], r.IngestExternalFileOptions())
    want = list(cf.items())
    db.close()
    assert want[0] == (b"\x01\x00", b"new0") and want[1] == (b"\x01\x01", b"old1")
    files = tuple(DbFile(n, location=str(path / n), size=os.path.getsize(path / n))
                  for n in sorted(os.listdir(path))
                  if n.endswith(".sst") or n == "CURRENT" or n.startswith(("MANIFEST",
                                                                            "OPTIONS")))
    handle = RocksDBHandle(0, 127, files)
    with TableReadState(handle, FileIO(), max_parallelism=128, cache=cache) as tables:
        assert [(kv.key, kv.value) for kv in tables.entries("s")] == want
    with RocksDBState(handle, FileIO(), max_parallelism=128, cache=cache) as full:
        assert [(kv.key, kv.value) for kv in full.entries("s", reader="sst")] == want
        assert [(kv.key, kv.value) for kv in full.entries("s", reader="rocksdb")] == want


# -- sparse key-group selections -------------------------------------------------------------------


def test_runs_of_key_groups() -> None:
    assert rocks._runs(None) == [None]
    assert rocks._runs(set()) == []
    assert rocks._runs({5}) == [(5, 5)]
    assert rocks._runs({0, 1, 2, 7, 9, 10, 64}) == [(0, 2), (7, 7), (9, 10), (64, 64)]


@pytest.mark.parametrize("mode", [None, "nested", "flat"])
def test_sparse_key_groups_read_only_those(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           decode_path: str, mode: str | None) -> None:
    """Key groups far apart are read run by run: the rows of exactly those key groups, on the
    compiled sinks and the Python handlers alike."""
    monkeypatch.setattr(rocks, "_DEFAULT_CACHE", FileCache(tmp_path / "cache"))
    with statequery.open(str(fixture_dir(NATIVE)), use_snapshot=False) as sp:
        for state in ("count", "amount-by-category", "recent-categories", "profile"):
            if mode == "nested" and state != "amount-by-category" or \
                    mode == "flat" and state != "recent-categories":
                continue
            every = sp.read("user-state", state, mode=mode).to_pylist()
            groups = sorted({r["key_group"] for r in every})
            assert len(groups) > 6
            pick = {groups[0], groups[1], groups[4], groups[-1]}
            got = sp.read("user-state", state, key_groups=pick, mode=mode).to_pylist()
            assert got == [r for r in every if r["key_group"] in pick]
            assert got


def test_a_manifest_the_reader_does_not_support_falls_back_to_the_restore(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A MANIFEST feature the table reader does not support (say BlobDB files) is never a failed
    lookup: the subtask's DB is restored and RocksDB reads it."""
    import statequery.backends.manifest as manifest
    from statequery.exceptions import UnsupportedFormatError

    monkeypatch.setattr(rocks, "_DEFAULT_CACHE", FileCache(tmp_path / "cache"))
    path = str(fixture_dir(NATIVE))
    with statequery.open(path, use_snapshot=False) as sp:
        want = {k: t.to_pylist() for k, t in sp.lookup("user-7", "user-state").items()}

    def unsupported(data: bytes, source: str = "") -> Any:
        raise UnsupportedFormatError(f"{source}: blob files (BlobDB) are not supported")

    monkeypatch.setattr(manifest, "read_manifest", unsupported)
    with statequery.open(path, use_snapshot=False) as sp:
        got = {k: t.to_pylist() for k, t in sp.lookup("user-7", "user-state").items()}
        dbs = list(sp.context.open_databases._dbs.values())
    assert got == want
    assert dbs and all(isinstance(db, RocksDBState) for db in dbs)
