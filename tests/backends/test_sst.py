"""The pure-Python RocksDB table reader: real Flink tables, rocksdict-written tables in every
compression / format_version / index layout, merge semantics, and damaged files."""

from __future__ import annotations

import glob
import os
import random
import shutil
import struct
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statequery.backends.sst import (
    BLOCK_BASED_MAGIC,
    TYPE_DELETION,
    TYPE_MERGE,
    TYPE_SINGLE_DELETION,
    TYPE_VALUE,
    InternalEntry,
    SstFile,
    merge_entries,
    merged_entries,
)
from statequery.exceptions import CorruptStateError, UnsupportedFormatError
from tests.conftest import expected_entries, fixture_dir, fixture_record

ROCKSDB_FIXTURES = [
    "datastream-rocksdb-native",
    "sql-rocksdb-native",
    "datastream-rocksdb-incremental-checkpoint",
]


def _table_paths(root: Path) -> list[str]:
    """Every file under ``root`` that ends with the block-based table magic (no metadata needed)."""
    out = []
    for p in sorted(glob.glob(str(root / "**" / "*"), recursive=True)):
        if not os.path.isfile(p) or os.path.getsize(p) < 53:
            continue
        with open(p, "rb") as f:
            f.seek(-8, os.SEEK_END)
            if struct.unpack("<Q", f.read(8))[0] == BLOCK_BASED_MAGIC:
                out.append(p)
    return out


def _fixture_tables(name: str) -> list[SstFile]:
    d = fixture_dir(name)
    root = d.parent if "checkpoint" in name else d  # checkpoints: <job>/{chk-N,shared}
    return [SstFile(p) for p in _table_paths(root)]


def _java_string(buf: bytes, pos: int) -> tuple[str, int]:
    """``StringValue.writeString`` for ASCII strings under 127 chars (enough for the fixtures)."""
    n = buf[pos] - 1
    assert 0 <= n < 127
    return buf[pos + 1 : pos + 1 + n].decode("ascii"), pos + 1 + n


@pytest.mark.parametrize("name", ROCKSDB_FIXTURES)
def test_flink_tables_open(name: str) -> None:
    tables = _fixture_tables(name)
    assert tables
    states = {s["name"] for op in fixture_record(name)["operators"] for s in op["states"]}
    for t in tables:
        p = t.properties
        assert t.format_version == 5  # FRocksDB 8.10 default
        assert p.comparator == "leveldb.BytewiseComparator"
        assert p.merge_operator == "StringAppendTESTOperator"
        assert p.column_family_name in states, p.column_family_name
        entries = list(t.entries())
        assert len(entries) == p.num_entries
        assert sum(e.type == TYPE_MERGE for e in entries) == p.merge_operands
        assert [(e.user_key, -e.seq) for e in entries] == sorted((e.user_key, -e.seq)
                                                                 for e in entries)
        t.close()


@pytest.mark.parametrize("name", ["datastream-rocksdb-native",
                                  "datastream-rocksdb-incremental-checkpoint"])
def test_list_state_merge_operands_complete_and_in_order(name: str) -> None:
    """``recent-categories`` (ListState.add per event) holds only merge operands; merged per DB
    they equal the expected lists element by element."""
    by_db: dict[bytes, list[SstFile]] = defaultdict(list)
    for t in _fixture_tables(name):
        if t.properties.column_family_name == "recent-categories":
            assert t.properties.merge_operands == t.properties.num_entries > 0
            by_db[t.properties.values["rocksdb.creating.db.identity"]].append(t)  # type: ignore[index]
    assert len(by_db) == 2  # two subtasks
    got: dict[str, list[str]] = {}
    for tables in by_db.values():
        for key, value in merged_entries(tables):
            user, pos = _java_string(key, 1)
            assert key[pos:] == b"\x00"  # VoidNamespace
            elements, p = [], 0
            while p < len(value):
                s, p = _java_string(value, p)
                elements.append(s)
                if p < len(value):
                    assert value[p : p + 1] == b","
                    p += 1
            assert user not in got
            got[user] = elements
    want = {e["key"]: e["value"] for e in expected_entries(name)
            if e["state"] == "recent-categories"}
    assert got == want


# -- rocksdb-written tables in every layout ------------------------------------------------------


def _build_db(path: Path, comp: str = "snappy", fv: int = 5, index: str = "binary_search",
              hash_index: bool = False, restart: int = 4, seed: int = 0,
              range_delete: bool = True) -> list[tuple[bytes, bytes]]:
    import rocksdict as r

    shutil.rmtree(path, ignore_errors=True)
    o = r.Options(raw_mode=True)
    o.create_if_missing(True)
    o.set_disable_auto_compactions(True)
    o.set_compression_type(getattr(r.DBCompressionType, comp)())
    b = r.BlockBasedOptions()
    b.set_format_version(fv)
    b.set_block_size(256)
    b.set_block_restart_interval(restart)
    b.set_index_type(getattr(r.BlockBasedIndexType, index)())
    if index == "two_level_index_search":
        b.set_metadata_block_size(128)
    if hash_index:
        b.set_data_block_index_type(r.DataBlockIndexType.binary_and_hash())
    if index == "hash_search":
        o.set_prefix_extractor(r.SliceTransform.create_fixed_prefix(1))
    o.set_block_based_table_factory(b)
    db = r.Rdict(str(path), o)
    rnd = random.Random(seed)
    model: dict[bytes, bytes] = {}
    for batch in range(4):  # four flushes: four overlapping L0 tables
        for _ in range(250):
            k = bytes([rnd.randrange(4)]) + rnd.randbytes(rnd.randrange(0, 12))
            v = rnd.randbytes(rnd.randrange(0, 40)) * rnd.choice([1, 1, 20])
            db[k] = v
            model[k] = v
        for k in rnd.sample(sorted(model), 30):
            del db[k]
            del model[k]
        if batch == 2 and range_delete:
            lo, hi = bytes([1]) + rnd.randbytes(2), bytes([2]) + rnd.randbytes(2)
            db.delete_range(lo, hi)
            for k in [k for k in model if lo <= k < hi]:
                del model[k]
        db.flush()
    assert list(db.items()) == sorted(model.items())
    db.close()
    return sorted(model.items())


LAYOUTS = (
    [(comp, 5, "binary_search", False) for comp in
     ("none", "snappy", "lz4", "lz4hc", "zstd", "zlib", "bz2")]
    + [("snappy", fv, "binary_search", False) for fv in (2, 3, 4, 6)]
    + [("lz4", fv, "two_level_index_search", False) for fv in (3, 5, 6)]
    + [("zstd", fv, "binary_search", True) for fv in (4, 6)]
    + [("snappy", 5, "hash_search", False)]
)


@pytest.mark.parametrize(("comp", "fv", "index", "hash_index"), LAYOUTS)
def test_tables_written_by_rocksdb(tmp_path: Path, comp: str, fv: int, index: str,
                                   hash_index: bool, decode_path: str) -> None:
    model = _build_db(tmp_path / "db", comp, fv, index, hash_index)
    tables = [SstFile(p) for p in _table_paths(tmp_path / "db")]
    assert len(tables) == 4
    assert {t.format_version for t in tables} == {fv}
    assert tables[0].properties.index_type == {"binary_search": 0, "hash_search": 1,
                                               "two_level_index_search": 2}[index]
    assert sum(t.properties.range_deletions for t in tables) == 1
    assert list(merged_entries(tables)) == model
    lo, hi = b"\x01\x80", b"\x02\x40"
    assert list(merged_entries(tables, lo, hi)) == [kv for kv in model if lo <= kv[0] < hi]
    assert list(merged_entries(tables, b"\x03")) == [kv for kv in model if kv[0] >= b"\x03"]
    for t in tables:
        t.close()


def test_seek_inside_blocks(tmp_path: Path) -> None:
    """Every start key, present or not, seeks to exactly the entries >= it (restart interval 1)."""
    model = _build_db(tmp_path / "db", "none", 5, "binary_search", restart=1, seed=3)
    tables = [SstFile(p) for p in _table_paths(tmp_path / "db")]
    keys = [k for k, _ in model]
    for probe in keys[::37] + [k + b"\x00" for k in keys[::53]] + [b"", b"\x00", b"\xff"]:
        got = [k for k, _ in merged_entries(tables, probe)]
        assert got == [k for k in keys if k >= probe]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_overwrites_and_deletes_without_tombstones(tmp_path: Path, seed: int,
                                                   decode_path: str) -> None:
    """Four overlapping tables of puts, overwrites and deletes, no range tombstone: the
    compiled merge (``_sst.MergedPairs``) when built, else the pure one, equal RocksDB."""
    model = _build_db(tmp_path / "db", "lz4", 5, restart=3, seed=seed, range_delete=False)
    tables = [SstFile(p) for p in _table_paths(tmp_path / "db")]
    assert sum(t.properties.deletions for t in tables) > 0
    assert list(merged_entries(tables)) == model
    keys = [k for k, _ in model]
    for lo in keys[::41] + [b"\x02"]:
        assert list(merged_entries(tables, lo, b"\x03")) == [
            kv for kv in model if lo <= kv[0] < b"\x03"]
    for t in tables:
        t.close()


def test_compiled_walk_equals_pure_on_flink_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every table of every RocksDB fixture: the compiled block walk yields the pure walk's
    entries (merge operands included), whole and from a seek."""
    from statequery.backends import sst

    if sst._compiled is None:
        assert os.environ.get("STATEQUERY_NO_EXTENSIONS"), "statequery.backends._sst not built"
        return
    paths = sorted(p for name in ("datastream-rocksdb-native", "sql-ops-rocksdb-native",
                                  "ttl-kryo-rocksdb-native")
                   for p in _table_paths(fixture_dir(name)))
    assert paths
    for path in paths:
        with SstFile(path) as t:
            monkeypatch.delenv("STATEQUERY_PURE_PYTHON", raising=False)
            fast = list(t.tuples())
            mid = fast[len(fast) // 2][0] if fast else b""
            fast_seek = list(t.tuples(mid, mid + b"\xff"))
            fast_merged = list(merged_entries([t]))
            # the keys holding some bytes at an offset (a lookup's timers: the key after the
            # key-group prefix and timestamp), filtered inside the walk
            probe = (mid[1:4], 1) if len(mid) > 3 else (b"", 0)
            fast_match = list(merged_entries([t], match=probe))
            assert fast_match == [kv for kv in fast_merged if kv[0].startswith(*probe)]
            monkeypatch.setenv("STATEQUERY_PURE_PYTHON", "1")
            assert list(t.tuples()) == fast
            assert list(t.tuples(mid, mid + b"\xff")) == fast_seek
            assert list(merged_entries([t])) == fast_merged
            assert list(merged_entries([t], match=probe)) == fast_match


# -- merge semantics -----------------------------------------------------------------------------


def _e(seq: int, kind: int, value: bytes = b"") -> InternalEntry:
    return InternalEntry(b"k", seq, kind, value)


def test_merge_entries() -> None:
    assert merge_entries([_e(3, TYPE_MERGE, b"c"), _e(2, TYPE_MERGE, b"b"),
                          _e(1, TYPE_MERGE, b"a")]) == b"a,b,c"
    assert merge_entries([_e(1, TYPE_VALUE, b"x"), _e(2, TYPE_MERGE, b"y")]) == b"x,y"
    assert merge_entries([_e(2, TYPE_DELETION), _e(1, TYPE_VALUE, b"x")]) is None
    assert merge_entries([_e(3, TYPE_MERGE, b"z"), _e(2, TYPE_DELETION),
                          _e(1, TYPE_VALUE, b"x")]) == b"z"
    assert merge_entries([_e(3, TYPE_MERGE, b"z"), _e(2, TYPE_SINGLE_DELETION),
                          _e(1, TYPE_MERGE, b"x")]) == b"z"
    assert merge_entries([_e(4, TYPE_VALUE, b"new"), _e(3, TYPE_MERGE, b"old")]) == b"new"
    assert merge_entries([]) is None


class _FakeTable:
    def __init__(self, entries: list[InternalEntry],
                 tombstones: list[tuple[bytes, bytes, int]]) -> None:
        self._entries = sorted(entries, key=lambda e: (e.user_key, -e.seq))
        self._tombstones = tombstones

    def entries(self, start: bytes | None = None, stop: bytes | None = None) -> Any:
        return iter([e for e in self._entries if (start is None or e.user_key >= start)
                     and (stop is None or e.user_key < stop)])

    def range_deletions(self) -> list[tuple[bytes, bytes, int]]:
        return self._tombstones


_OPS = st.lists(
    st.tuples(st.sampled_from(["put", "merge", "merge", "delete", "range"]),
              st.integers(0, 5), st.integers(0, 5), st.binary(max_size=3), st.integers(0, 3)),
    max_size=40)


@settings(max_examples=150, deadline=None)
@given(_OPS)
def test_merged_entries_matches_a_model(ops: list[tuple[str, int, int, bytes, int]]) -> None:
    """Random put/merge/delete/delete-range histories spread over four tables read like a dict
    with StringAppend merges."""
    model: dict[bytes, bytes] = {}
    tables: list[list[InternalEntry]] = [[], [], [], []]
    tombs: list[list[tuple[bytes, bytes, int]]] = [[], [], [], []]
    for seq, (op, a, b, value, table) in enumerate(ops, start=1):
        key = bytes([a])
        if op == "put":
            model[key] = value
            tables[table].append(InternalEntry(key, seq, TYPE_VALUE, value))
        elif op == "merge":
            model[key] = model[key] + b"," + value if key in model else value
            tables[table].append(InternalEntry(key, seq, TYPE_MERGE, value))
        elif op == "delete":
            model.pop(key, None)
            tables[table].append(InternalEntry(key, seq, TYPE_DELETION, b""))
        else:
            lo, hi = sorted((bytes([a]), bytes([b])))
            for k in [k for k in model if lo <= k < hi]:
                del model[k]
            tombs[table].append((lo, hi, seq))
    fakes = [_FakeTable(t, r) for t, r in zip(tables, tombs, strict=True)]
    assert list(merged_entries(fakes)) == sorted(model.items())  # type: ignore[arg-type]
    if not any(tombs):
        _check_compiled_merge(tables, sorted(model.items()))
    assert list(merged_entries(fakes, b"\x02", b"\x04")) == sorted(  # type: ignore[arg-type]
        (k, v) for k, v in model.items() if b"\x02" <= k < b"\x04")


def _check_compiled_merge(tables: list[list[InternalEntry]],
                          model: list[tuple[bytes, bytes]]) -> None:
    """``_sst.MergedPairs`` over the same histories, each table cut into blocks of 2 entries."""
    from statequery.backends import sst

    if sst._compiled is None:
        return
    sources = []
    for t in tables:
        rows = [(e.user_key, -e.seq, e.type, e.value)
                for e in sorted(t, key=lambda e: (e.user_key, -e.seq))]
        sources.append([rows[i : i + 2] for i in range(0, len(rows), 2)] + [[]])
    assert list(sst._compiled.MergedPairs(sources)) == model


@settings(max_examples=150, deadline=None)
@given(st.lists(
    st.tuples(st.sampled_from(["put", "merge", "merge", "delete"]), st.integers(0, 5),
              st.integers(0, 5), st.binary(max_size=3), st.integers(0, 3)), max_size=40))
def test_compiled_merge_matches_a_model(ops: list[tuple[str, int, int, bytes, int]]) -> None:
    """Histories without range tombstones (the compiled merge's domain), as above."""
    test_merged_entries_matches_a_model.hypothesis.inner_test(ops)  # type: ignore[attr-defined]


# -- damaged files -------------------------------------------------------------------------------


def _a_flink_table() -> str:
    return _table_paths(fixture_dir("datastream-rocksdb-native"))[0]


def test_truncated_table_names_the_file(tmp_path: Path) -> None:
    data = Path(_a_flink_table()).read_bytes()
    for cut in (1, 30, len(data) // 2, len(data) - 20):
        p = tmp_path / f"cut{cut}.sst"
        p.write_bytes(data[:-cut])
        with pytest.raises(CorruptStateError) as info:
            with SstFile(str(p), source="s3://bucket/sp/cut.sst") as t:
                list(t.entries())
        assert "s3://bucket/sp/cut.sst" in str(info.value)


def test_corrupt_block_is_detected(tmp_path: Path) -> None:
    data = bytearray(Path(_a_flink_table()).read_bytes())
    data[0:40] = b"\xff" * 40  # the first data block (snappy)
    p = tmp_path / "bad.sst"
    p.write_bytes(bytes(data))
    with pytest.raises(CorruptStateError, match="bad.sst"):
        with SstFile(str(p)) as t:
            list(t.entries())
    with pytest.raises(CorruptStateError, match="bad.sst"):  # through the (compiled) merge too
        with SstFile(str(p)) as t:
            list(merged_entries([t]))


def test_not_a_table(tmp_path: Path) -> None:
    p = tmp_path / "empty.sst"
    p.write_bytes(b"")
    with pytest.raises(CorruptStateError, match="too short"):
        SstFile(str(p))
    p.write_bytes(b"\0" * 100 + struct.pack("<Q", 0x8242229663BF9564))
    with pytest.raises(UnsupportedFormatError, match="plain table"):
        SstFile(str(p))
    with pytest.raises(CorruptStateError, match="cannot open"):
        SstFile(str(tmp_path / "missing.sst"))
