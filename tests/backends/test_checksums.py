"""RocksDB checksums: every checksum type RocksDB writes, verified on real RocksDB-written bytes,
and the acceptance test of issue 19 item 5 — one flipped byte anywhere in a block of a Flink
savepoint's table files gives a typed error naming the file, never fewer (or other) rows, on every
read path: the full read through RocksDB and through the SST reader (list state), on both decode
paths, and the table-selective lookup (the SST reader only)."""

from __future__ import annotations

import glob
import os
import shutil
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import statequery
import statequery.backends.rocksdb as rocks
from statequery.backends import checksums
from statequery.backends.cache import CacheKey, FileCache
from statequery.backends.manifest import read_manifest
from statequery.backends.rocksdb import from_incremental_handle
from statequery.backends.sst import SstFile, merged_entries
from statequery.exceptions import CorruptStateError, MissingExtraError, StatequeryError
from statequery.hashing import key_group_of
from statequery.io import FileIO
from tests.backends.test_rocksdb import _remote_copy
from tests.conftest import FIXTURES, fixture_dir

PURE = "STATEQUERY_PURE_PYTHON"

# -- the checksum functions on RocksDB-written tables ---------------------------------------------

CHECKSUM_TYPES = ["no_checksum", "crc32c", "xxhash", "xxhash64", "xxh3"]


def _write_table(path: Path, checksum: str, fv: int, compression: str = "snappy",
                 index: str = "binary_search") -> tuple[str, list[tuple[bytes, bytes]]]:
    """One table written by RocksDB (rocksdict) with this checksum type and format_version."""
    import rocksdict as r

    shutil.rmtree(path, ignore_errors=True)
    o = r.Options(raw_mode=True)
    o.create_if_missing(True)
    o.set_compression_type(getattr(r.DBCompressionType, compression)())
    b = r.BlockBasedOptions()
    b.set_format_version(fv)
    b.set_block_size(1024)
    b.set_checksum_type(getattr(r.ChecksumType, checksum)())
    b.set_index_type(getattr(r.BlockBasedIndexType, index)())
    if index == "two_level_index_search":
        b.set_metadata_block_size(128)
    b.set_bloom_filter(10, False)  # a filter block too (never read by the SST reader)
    o.set_block_based_table_factory(b)
    db = r.Rdict(str(path), o)
    rows = [(b"key-%05d" % i, b"value-%d-" % i * (1 + i % 7)) for i in range(400)]
    for k, v in rows:
        db[k] = v
    db.delete_range(b"key-00100", b"key-00110")  # a range deletion block
    db.flush()
    db.close()
    (table,) = glob.glob(str(path / "*.sst"))
    return table, [kv for kv in rows if not b"key-00100" <= kv[0] < b"key-00110"]


def _blocks(t: SstFile) -> list[tuple[str, int, int]]:
    """(kind, offset, size) of every block of a table: data, index (and its partitions),
    metaindex and every meta block (properties, filter, range deletions, ...)."""
    out = [("data", h.offset, h.size) for _, h in t.data_block_handles()]
    out.append(("index", t.index_handle.offset, t.index_handle.size))
    if t.properties.index_type == 2:
        out += [("index partition", h.offset, h.size)
                for _, h in t.read_block(t.index_handle).handles()]
    out.append(("metaindex", t.metaindex_handle.offset, t.metaindex_handle.size))
    out += [(name, h.offset, h.size) for name, h in t.meta_blocks.items()
            if name != "rocksdb.index"]
    return out


def _read_all(path: str) -> list[tuple[bytes, bytes]]:
    with SstFile(path, source="s3://bucket/t.sst") as t:
        t.range_deletions()
        return list(merged_entries([t]))


@pytest.mark.parametrize("fv", [2, 5, 6])
@pytest.mark.parametrize("checksum", CHECKSUM_TYPES)
def test_every_checksum_type_on_rocksdb_written_tables(tmp_path: Path, checksum: str,
                                                       fv: int) -> None:
    """Each checksum type RocksDB writes reads back exactly; a flipped byte in any block (its
    bytes, its compression type, its stored checksum) is a CorruptStateError naming the file and
    the block's offset; with no checksum a flip may go unnoticed (as in RocksDB)."""
    path, rows = _write_table(tmp_path / "db", checksum, fv)
    with SstFile(path) as t:
        assert t.checksum_type == CHECKSUM_TYPES.index(checksum)
        assert t.format_version == fv
        blocks = _blocks(t)
        assert {"data", "index", "metaindex", "rocksdb.properties", "rocksdb.range_del"} <= \
            {kind for kind, _, _ in blocks}
        assert any(kind.startswith(("filter.", "fullfilter.")) for kind, _, _ in blocks)
    assert _read_all(path) == rows
    original = Path(path).read_bytes()
    for kind, offset, size in blocks:
        for at in (offset + size // 2, offset + size, offset + size + 1 + offset % 4):
            mutated = bytearray(original)
            mutated[at] ^= 0x20
            Path(path).write_bytes(bytes(mutated))
            try:
                got = _read_all(path)
            except CorruptStateError as e:
                assert e.source == "s3://bucket/t.sst"
                if checksum != "no_checksum":
                    assert e.offset == offset and "checksum mismatch" in str(e), (kind, e)
                continue
            except StatequeryError as e:  # no checksum: an unknown compression type, say
                assert checksum == "no_checksum" and "s3://bucket/t.sst" in str(e), (kind, e)
                continue
            # only blocks the reader never reads (filters), or no checksum at all
            assert checksum == "no_checksum" or kind.startswith(("filter.", "fullfilter.")), \
                (kind, at)
            if kind.startswith(("filter.", "fullfilter.")):
                assert got == rows
    Path(path).write_bytes(original)


@pytest.mark.parametrize("checksum", CHECKSUM_TYPES[1:])
def test_footer_checksum_of_format_version_6(tmp_path: Path, checksum: str) -> None:
    """format_version 6+ footers carry their own checksum (with the footer offset's context):
    every byte of the footer but the unchecked padding is covered."""
    path, rows = _write_table(tmp_path / "db", checksum, 6)
    original = Path(path).read_bytes()
    footer = len(original) - 53
    for i in range(53):
        mutated = bytearray(original)
        mutated[footer + i] ^= 0x01
        Path(path).write_bytes(bytes(mutated))
        try:
            got = _read_all(path)
        except StatequeryError as e:  # a typed error: corrupt, or an unknown newer format
            assert "s3://bucket/t.sst" in str(e)
            continue
        assert 17 <= i < 33, i  # only the 16 bytes RocksDB leaves unchecked and ignores
        assert got == rows


def test_context_checksum_catches_a_block_at_another_offset(tmp_path: Path) -> None:
    """format_version 6 binds each block's checksum to its offset: a valid block (with its
    trailer) copied over another one of the same size is refused."""
    path, _ = _write_table(tmp_path / "db", "xxh3", 6, compression="none")
    data = bytearray(Path(path).read_bytes())
    with SstFile(path) as t:
        handles = [h for _, h in t.data_block_handles()]
    a, b = next((a, b) for a in handles for b in handles
                if a.offset < b.offset and a.size == b.size)
    data[b.offset : b.offset + b.size + 5] = data[a.offset : a.offset + a.size + 5]
    Path(path).write_bytes(bytes(data))
    with pytest.raises(CorruptStateError, match="checksum mismatch") as info:
        _read_all(path)
    assert info.value.offset == b.offset


def test_crc32c_mask_and_xxh3_last_byte() -> None:
    """The transforms RocksDB applies, on known values (CRC-32C of "123456789" is 0xe3069283;
    crc32c::Mask rotates right by 15 and adds 0xa282ead8; XXH3's last byte is folded in)."""
    assert checksums.crc32c(b"123456789") == 0xE3069283
    assert checksums.mask(0xE3069283) == (((0xE3069283 >> 15) | (0xE3069283 << 17))
                                          + 0xA282EAD8) & 0xFFFFFFFF
    assert checksums.block_checksum(checksums.XXH3, b"") == 0
    import xxhash

    v = xxhash.xxh3_64_intdigest(b"abc") & 0xFFFFFFFF
    assert checksums.block_checksum(checksums.XXH3, b"abc\x01") == v ^ 0x6B9083D9
    assert checksums.context_modifier(0, 12345) == 0
    assert checksums.context_modifier(7, (1 << 32) + 5) == 7 ^ 6


def test_ingested_table_with_a_written_global_seqno(tmp_path: Path) -> None:
    """``write_global_seqno``: RocksDB writes an ingested table's global sequence number into its
    properties block without updating the block's checksum (it was computed over zeros); the
    reader accepts exactly that change, as RocksDB does, and nothing else."""
    import rocksdict as r

    w = r.SstFileWriter(r.Options(raw_mode=True))
    path = str(tmp_path / "ingest.sst")
    w.open(path)
    for i in range(50):
        w[b"k%03d" % i] = b"v%d" % i
    w.finish()
    with SstFile(path) as t:
        props = t.meta_blocks["rocksdb.properties"]
        raw = t._pread(props.offset, props.size)
        block = t._decode_block(raw + b"\0\0\0\0\0", props)
        at = block.value_offset(b"rocksdb.external_sst_file.global_seqno")
        assert t.external and at is not None
    data = bytearray(Path(path).read_bytes())
    assert data[props.offset + at : props.offset + at + 8] == bytes(8)
    data[props.offset + at : props.offset + at + 8] = struct.pack("<Q", 77)
    Path(path).write_bytes(bytes(data))
    with SstFile(path) as t:
        assert [e.seq for e in t.entries()] == [77] * 50
    data[props.offset + at - 1] ^= 1  # any other byte of the block
    Path(path).write_bytes(bytes(data))
    with pytest.raises(CorruptStateError, match="properties block checksum mismatch"):
        SstFile(path)


# -- MANIFEST records ------------------------------------------------------------------------------


def _a_manifest() -> bytes:
    """The MANIFEST of one handle of a Flink fixture."""
    for p in sorted(glob.glob(str(FIXTURES / "datastream-rocksdb-native" / "*" / "*"))):
        data = Path(p).read_bytes()
        if data[4:7] and not _is_table(data):
            try:
                if read_manifest(data).tables:
                    return data
            except StatequeryError:
                continue
    raise AssertionError("no MANIFEST in the fixture")


def _is_table(data: bytes) -> bool:
    return len(data) >= 8 and data[-8:] == struct.pack("<Q", 0x88E241B785F4CFF7)


def test_manifest_record_checksums() -> None:
    """A flipped byte anywhere in a MANIFEST record (checksum, length, type or payload) is a
    CorruptStateError naming the file and the record's offset; the same bytes unflipped read."""
    data = _a_manifest()
    assert read_manifest(data, "m").tables
    pos, records = 0, []
    while pos + 7 <= len(data):  # the physical records of the first block (small MANIFESTs)
        length = struct.unpack_from("<H", data, pos + 4)[0]
        if data[pos + 6] == 0:
            break
        records.append((pos, length))
        pos += 7 + length
    assert len(records) >= 2
    for start, length in records:
        for at in (start, start + 4, start + 6, start + 7, start + 7 + length - 1):
            mutated = bytearray(data)
            mutated[at] ^= 0x04
            try:
                read_manifest(bytes(mutated), "s3://b/MANIFEST-000004")
            except CorruptStateError as e:
                assert e.source == "s3://b/MANIFEST-000004"
                assert e.offset is not None and e.offset <= at
                continue
            except StatequeryError as e:  # an unsupported record type, named
                assert "MANIFEST-000004" in str(e) and at == start + 6
                continue
            pytest.fail(f"flip at {at} read without an error")


# -- missing extras --------------------------------------------------------------------------------


@pytest.mark.parametrize("blocked", [("google_crc32c", "crc32c"), ("xxhash",)])
def test_missing_hash_package_is_a_clear_error(blocked: tuple[str, ...], tmp_path: Path) -> None:
    import subprocess

    table, _ = _write_table(tmp_path / "db", "crc32c" if "xxhash" not in blocked else "xxh3", 5)
    code = (
        "import sys\n"
        + "".join(f"sys.modules[{m!r}] = None\n" for m in blocked)
        + "import statequery\nfrom statequery.backends.sst import SstFile\n"
        "try:\n"
        f"    SstFile({table!r})\n"
        "except statequery.MissingExtraError as e:\n"
        "    print('MISSING', e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("MISSING") and "statequery[rocksdb]" in done.stdout
    assert ("google-crc32c" if "xxhash" not in blocked else "xxhash") in done.stdout
    assert issubclass(MissingExtraError, StatequeryError)


# -- the acceptance test: flips in every block of Flink's tables -----------------------------------


@dataclass
class _Sst:
    path: Path
    operator: str  # uid
    state: str
    key_groups: range  # of the table's handle: the full read of that subtask's state
    keys: list[Any]  # keys whose key group the table's handle owns (looked up)
    blocks: list[tuple[str, int, int]]
    size: int


class _Fixture:
    """A private copy of a RocksDB fixture: its tables, what every read of it returns intact."""

    def __init__(self, name: str, tmp: Path) -> None:
        shutil.copytree(FIXTURES / name, tmp / name)
        self.path = str(tmp / fixture_dir(name).relative_to(FIXTURES))
        self.cache = FileCache(tmp / "cache")
        sp = self.open()
        self.full: dict[tuple[str, str, range], Any] = {}
        self.lookups: dict[tuple[str, Any], dict[tuple[str, str], Any]] = {}
        self.tables: list[_Sst] = []
        for op in sp.keyed_operators():
            keys: list[Any] = []
            for s in op.states:
                table = sp.read(op.operator_id, s.name)
                if "key" in table.column_names:
                    keys += [k for k in table.column("key").to_pylist() if k not in keys]
            for st_ in op.subtasks:
                h = st_.keyed_handle
                if h is None:
                    continue
                kgs = range(h.key_group_range.start, h.key_group_range.end + 1)
                for s in op.states:
                    self.full[(op.uid, s.name, kgs)] = sp.read(op.operator_id, s.name,
                                                               key_groups=kgs)
                mine = [k for k in keys if key_group_of(k, op.max_parallelism) in kgs][:1]
                for k in mine:
                    self.lookups[(op.uid, k)] = self.lookup(sp, k, op.uid)
                for f in from_incremental_handle(h, sp.resolver).files:
                    if f.local_path.endswith(".sst") and f.location:
                        with SstFile(f.location) as t:
                            self.tables.append(_Sst(
                                Path(f.location), op.uid, t.properties.column_family_name,
                                kgs, mine, _blocks(t), t.size))
        sp.close()
        assert self.tables and self.lookups
        self.sp = self.open()

    def open(self) -> Any:
        rocks._DEFAULT_CACHE = self.cache
        return statequery.open(self.path, io=FileIO(), use_snapshot=False)

    @staticmethod
    def lookup(sp: Any, key: Any, uid: str) -> dict[tuple[str, str], Any]:
        return {k: t.to_pylist() for k, t in sp.lookup(key, uid).items()}

    def check(self, t: _Sst, at: int, monkeypatch: pytest.MonkeyPatch) -> None:
        """Flip the byte at ``at`` of table ``t``: every read of the table's state raises a
        CorruptStateError naming the table, or returns exactly the intact rows. One Savepoint
        serves every flip (its metadata parsed once); its restored databases are closed after
        each read, so each read restores (and fetches) the table as it is now."""
        original = t.path.read_bytes()
        mutated = bytearray(original)
        mutated[at] ^= 0x10
        t.path.write_bytes(bytes(mutated))
        sp = self.sp
        try:
            for pure in ("1", "0"):  # the full read and the lookups on both decode paths
                monkeypatch.setenv(PURE, pure)
                try:
                    got = sp.read(t.operator, t.state, key_groups=t.key_groups)
                except CorruptStateError as e:
                    assert e.source is not None and str(t.path) in e.source, (at, e)
                else:
                    want = self.full[(t.operator, t.state, t.key_groups)]
                    assert got.equals(want), f"{t.path.name} flip at {at}: rows changed " \
                        f"({got.num_rows} rows, intact {want.num_rows})"
                finally:
                    sp.context.open_databases.close()
                for key in t.keys:  # table-selective lookups: the SST reader only
                    try:
                        got_rows = self.lookup(sp, key, t.operator)
                    except CorruptStateError as e:
                        assert e.source is not None and str(t.path) in e.source, (at, e)
                    else:
                        assert got_rows == self.lookups[(t.operator, key)], (t.path.name, at)
                    finally:
                        assert not any(isinstance(db, rocks.RocksDBState)
                                       for db in sp.context.open_databases._dbs.values())
                        sp.context.open_databases.close()
        finally:
            t.path.write_bytes(original)


FIXTURE_CASES = ["datastream-rocksdb-native", "datastream-rocksdb-incremental-checkpoint"]
_FIXTURES: dict[str, _Fixture] = {}


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Any:
    saved = rocks._DEFAULT_CACHE
    try:
        yield lambda name: _FIXTURES.get(name) or _FIXTURES.setdefault(
            name, _Fixture(name, tmp_path_factory.mktemp("flips")))
    finally:
        for f in _FIXTURES.values():
            f.sp.close()
        _FIXTURES.clear()
        rocks._DEFAULT_CACHE = saved


def _fixed_positions(t: _Sst) -> list[int]:
    """One byte inside each block and one of its trailer (its compression-type byte or a byte of
    its stored checksum, in turn), and one byte of the footer."""
    out = []
    for i, (_, offset, size) in enumerate(t.blocks):
        out += [offset + size // 2, offset + size + i % 5]
    return out + [t.size - 53 + 1]


@pytest.mark.slow
@pytest.mark.parametrize("name", FIXTURE_CASES)
def test_a_flipped_byte_in_any_block_is_a_typed_error(name: str, fixtures: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    f: _Fixture = fixtures(name)
    flips = 0
    for t in f.tables:
        for at in _fixed_positions(t):
            f.check(t, at, monkeypatch)
            flips += 1
    assert flips >= 9 * len(f.tables)


@pytest.mark.slow
@pytest.mark.parametrize("name", FIXTURE_CASES)
@settings(max_examples=int(os.environ.get("STATEQUERY_FUZZ_EXAMPLES", "1")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_random_flip_in_every_block_is_a_typed_error(name: str, fixtures: Any,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       data: Any) -> None:
    """A drawn position in each block (its bytes and trailer) of every table."""
    f: _Fixture = fixtures(name)
    for t in f.tables:
        for kind, offset, size in t.blocks:
            at = data.draw(st.integers(offset, offset + size + 4), label=f"{t.path.name} {kind}")
            f.check(t, at, monkeypatch)


# -- a copy damaged in the cache -------------------------------------------------------------------


@pytest.mark.parametrize("lookup", [False, True])
def test_a_cached_copy_damaged_after_its_fetch(tmp_path: Path, lookup: bool,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A cached table changed in place (same size, so the cache's own check passes): the read
    raises a CorruptStateError naming the file that says the cache's copy, not the file, is
    damaged; the copy is dropped and the next read fetches the file again and returns the rows."""
    # a remote copy: local files are read in place, never from the cache (docs/security.md)
    path = _remote_copy("datastream-rocksdb-native")
    cache = FileCache(tmp_path / "cache")
    monkeypatch.setattr(rocks, "_DEFAULT_CACHE", cache)
    # lookups fetching whole tables into the cache (point reads read blocks, not the cache)
    monkeypatch.setattr(rocks, "POINT_READS", False)

    def read() -> Any:
        with statequery.open(path, io=FileIO(), use_snapshot=False) as sp:
            if lookup:
                return {k: t.to_pylist() for k, t in sp.lookup("user-3", "user-state").items()}
            return sp.read("user-state", "count")

    want = read()
    with statequery.open(path, io=FileIO(), use_snapshot=False) as sp:
        op = sp.operator("user-state")
        kg = key_group_of("user-3", op.max_parallelism)
        (h,) = [s.keyed_handle for s in op.subtasks
                if s.keyed_handle.key_group_range.start <= kg <= s.keyed_handle.key_group_range.end]
        tables = [f for f in from_incremental_handle(h, sp.resolver).files
                  if f.local_path.endswith(".sst") and f.location]
        def entry_of(f: Any) -> str:
            return str(cache.entry_path(cache.identify(sp.io, CacheKey(f.location, f.size))))

        f = next(f for f in tables
                 if SstFile(entry_of(f)).properties.column_family_name == "count")
        entry = entry_of(f)
        with SstFile(entry) as t:
            block = t.data_block_handles()[0][1]
    with open(entry, "r+b") as out:  # in place: the same inode, size and source version
        out.seek(block.offset + block.size // 2)
        byte = out.read(1)
        out.seek(-1, os.SEEK_CUR)
        out.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(CorruptStateError, match="cache's copy only") as info:
        read()
    assert info.value.source == f.location and info.value.offset == block.offset
    assert not os.path.exists(entry)
    got = read()
    assert got == want if lookup else got.equals(want)


@pytest.mark.parametrize("lookup", [False, True])
def test_a_flipped_manifest_byte_is_a_typed_error(tmp_path: Path, lookup: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The MANIFEST of a Flink savepoint with a byte flipped (spread over the file): the full
    restore (RocksDB reads it) and the table-selective lookup (``manifest.py`` reads it) both
    raise a CorruptStateError naming it."""
    name = "datastream-rocksdb-native"
    shutil.copytree(FIXTURES / name, tmp_path / name)
    path = str(tmp_path / fixture_dir(name).relative_to(FIXTURES))
    monkeypatch.setattr(rocks, "_DEFAULT_CACHE", FileCache(tmp_path / "cache"))
    with statequery.open(path, io=FileIO(), use_snapshot=False) as sp:
        op = sp.operator("user-state")
        kg = key_group_of("user-3", op.max_parallelism)
        (h,) = [s.keyed_handle for s in op.subtasks
                if s.keyed_handle.key_group_range.start <= kg <= s.keyed_handle.key_group_range.end]
        (m,) = [f for f in from_incremental_handle(h, sp.resolver).files
                if f.local_path.startswith("MANIFEST")]
    assert m.location is not None
    original = Path(m.location).read_bytes()
    for at in range(0, len(original), len(original) // 12):
        mutated = bytearray(original)
        mutated[at] ^= 0x08
        Path(m.location).write_bytes(bytes(mutated))
        with statequery.open(path, io=FileIO(), use_snapshot=False) as sp, \
                pytest.raises(CorruptStateError) as info:
            if lookup:
                sp.lookup("user-3", "user-state")
            else:
                sp.read("user-state", "count", key_groups=[kg])
        assert info.value.source == m.location, (at, info.value)
    Path(m.location).write_bytes(original)
