"""The compiled scan of a RocksDB column family (issue 33, item 3): ``_sst.TableScan`` reads the
table files itself (blocks verified and inflated, entries parsed, tables merged with RocksDB's
read rules) and packs each key group's live entries for ``_read.feed_packed``, which feeds the
compiled sink in one call.

In the differential harness: generated tables (puts, overwrites, merge operands, deletions,
single deletions over several overlapping tables, blocks of any restart interval, snappy or
uncompressed, seeks), truncated and mutated (a byte changed before or after the block's
checksum was computed, a file cut short) read by the compiled scan and by the pure path
(:func:`~statequery.backends.sst.merged_entries` with ``STATEQUERY_PURE_PYTHON=1``) give the same
pairs or the same typed error; generated states of every shape fed as packed chunks give the
pure path's table; and tables RocksDB wrote read like RocksDB.
"""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from statequery.backends import fastpath, sst
from statequery.exceptions import CorruptStateError, StatequeryError
from tests.backends.test_differential import (
    SETTINGS,
    _both,
    _check_built,
    _compiled,
    _delimitable,
    _mutate_pairs,
    _Pairs,
    assert_same,
    case,
    read_rocksdb,
    rocksdb_pairs,
)
from tests.backends.test_sst import _build_db, _table_paths

EXAMPLES = int(os.environ.get("STATEQUERY_FUZZ_EXAMPLES", "60"))


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _data_block(entries: list[tuple[bytes, bytes]], interval: int) -> bytes:
    """A data block of internal keys and values (prefix-compressed between restart points)."""
    body = bytearray()
    restarts: list[int] = []
    prev = b""
    for i, (key, value) in enumerate(entries):
        shared = 0
        if i % interval:
            while shared < min(len(key), len(prev)) and key[shared] == prev[shared]:
                shared += 1
        else:
            restarts.append(len(body))
        body += _varint(shared) + _varint(len(key) - shared) + _varint(len(value))
        body += key[shared:] + value
        prev = key
    restarts = restarts or [0]
    return bytes(body) + struct.pack(f"<{len(restarts)}I", *restarts) + struct.pack(
        "<I", len(restarts))


def _ops(draw: Any) -> list[tuple[int, bytes, int, int, bytes]]:
    """Table number, user key, sequence number (unique), kind, value of a generated history."""
    keys = draw(st.lists(st.binary(min_size=1, max_size=4), min_size=1, max_size=6,
                         unique=True), label="user keys")
    out = []
    for seq in range(1, draw(st.integers(1, 40), label="entries") + 1):
        kind = draw(st.sampled_from([sst.TYPE_VALUE, sst.TYPE_VALUE, sst.TYPE_MERGE,
                                     sst.TYPE_MERGE, sst.TYPE_DELETION,
                                     sst.TYPE_SINGLE_DELETION]), label="kind")
        value = draw(st.binary(max_size=6), label="value") if kind in (1, 2) else b""
        out.append((draw(st.integers(0, 2), label="table"), draw(st.sampled_from(keys)), seq,
                    kind, value))
    if draw(st.booleans(), label="levels"):
        # tables 1 and 2 split the key range (one level: a run of disjoint tables), table 0
        # overlaps them (another level)
        cut = draw(st.sampled_from(sorted(keys)), label="cut")
        out = [(t if t == 0 else (1 if k < cut else 2), k, seq, kind, v)
               for t, k, seq, kind, v in out]
    return out


def _model(ops: list[tuple[int, bytes, int, int, bytes]]) -> dict[bytes, bytes]:
    """A dict with StringAppend merges, written in sequence order."""
    model: dict[bytes, bytes] = {}
    for _, key, _, kind, value in ops:
        if kind == sst.TYPE_VALUE:
            model[key] = value
        elif kind == sst.TYPE_MERGE:
            model[key] = model[key] + b"," + value if key in model else value
        else:
            model.pop(key, None)
    return model


def _table(draw: Any, path: str, entries: list[tuple[bytes, int, int, bytes]],
           ) -> tuple[Any, bool]:
    """A file of data blocks holding ``entries`` (user key, seq, kind, value) in internal-key
    order, each block with its trailer (crc32c, a base context sometimes), some mutated or cut
    after their checksum was computed; an :class:`~statequery.backends.sst.SstFile` over it
    (built without a footer: a scan needs the data blocks and their index only), and whether
    a block was mutated."""
    import cramjam

    from statequery.backends import checksums

    fn = checksums.checksum_function(checksums.CRC32C)
    assert fn is not None
    base = draw(st.sampled_from([0, 0, 0x5A5A1234]), label="base context")
    entries = sorted(entries, key=lambda e: (e[0], -e[1]))
    per = draw(st.integers(1, 4), label="entries per block")
    interval = draw(st.sampled_from([1, 2, 3, 16]), label="restart interval")
    out = bytearray()
    handles = []
    mutated = False
    for i in range(0, len(entries), per):
        chunk = entries[i : i + per]
        data = _data_block([(k + struct.pack("<Q", seq << 8 | kind), v)
                            for k, seq, kind, v in chunk], interval)
        compression = draw(st.sampled_from([0, 0, 1]), label="compression")
        if compression:
            data = bytes(cramjam.snappy.compress_raw(data))
        offset = len(out)
        body = data + bytes([compression])
        stored = (fn(body, len(body)) + checksums.context_modifier(base, offset)) & 0xFFFFFFFF
        block = bytearray(body + struct.pack("<I", stored))
        how = draw(st.sampled_from(["none"] * 8 + ["xor", "xor-resum", "xor-resum", "cut"]),
                   label="mutation")
        mutated = mutated or how != "none"
        if how in ("xor", "xor-resum"):
            pos = draw(st.integers(0, len(block) - 1), label="position")
            block[pos] ^= draw(st.integers(1, 255), label="xor")
            if how == "xor-resum" and pos < len(body):
                n = len(body)
                block[n:] = struct.pack("<I", (fn(bytes(block), n) + checksums.context_modifier(
                    base, offset)) & 0xFFFFFFFF)
        elif how == "cut":
            block = block[: draw(st.integers(0, len(block)), label="cut")]
        out += block
        handles.append((chunk[-1][0], sst.BlockHandle(offset, len(data))))
    with open(path, "wb") as f:
        f.write(out)
    table = object.__new__(sst.SstFile)
    table.path = table.source = path
    table._f = open(path, "rb")
    table.size = len(out)
    table.checksum_type = checksums.CRC32C
    table._checksum = fn
    table._base_context = base
    table._footer_start = len(out)
    table._index = handles
    table._top_index = None
    table.meta_blocks = {}
    table._global_seqno = None
    return table, mutated


def _outcome(read: Callable[[], list[tuple[bytes, bytes]]]) -> Any:
    try:
        return read()
    except StatequeryError as e:
        if "past its index separator" in str(e):
            return ("error", "separator")
        return ("error", type(e).__name__)


def _lying_separator(tables: list[Any]) -> bool:
    """Whether a block of ``tables`` holds a user key past its index separator (read by the
    pure walk): the compiled scan, which chains tables of disjoint ranges by their separators,
    refuses such a table; the pure merge reads what is there."""
    for t in tables:
        for sep, h in t.data_block_handles():
            try:
                keys = [k[:-8] for k, _ in t.read_block(h).entries()]
            except StatequeryError:
                continue
            if keys and max(keys) > sep:
                return True
    return False


def _scan(tables: list[Any], start: bytes, stop: bytes | None, chunk: int) -> list[Any]:
    scan = sst.table_scan(tables, start, stop, 1, chunk_bytes=chunk)  # type: ignore[arg-type]
    assert scan is not None
    return list(sst.scanned_pairs(scan))


def _pure_and_compiled(read_pure: Callable[[], Any], read_fast: Callable[[], Any]) -> Any:
    saved = os.environ.get(fastpath.PURE_ENV)
    try:
        os.environ[fastpath.PURE_ENV] = "1"
        pure = _outcome(read_pure)
        os.environ.pop(fastpath.PURE_ENV)
        fast = _outcome(read_fast)
    finally:
        if saved is None:
            os.environ.pop(fastpath.PURE_ENV, None)
        else:
            os.environ[fastpath.PURE_ENV] = saved
    return pure, fast


@settings(max_examples=EXAMPLES, deadline=None,
          phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_scans_agree(data: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Generated, mutated and truncated tables: the compiled scan and the pure merge of the
    same tables return the same pairs or raise the same typed error; unmutated, they equal a
    model of the history."""
    _check_built()
    ops = _ops(data.draw)
    n = max(t for t, *_ in ops) + 1
    root = tmp_path_factory.mktemp("scan")
    made = [_table(data.draw, str(root / f"{i}.sst"),
                   [(k, seq, kind, v) for t, k, seq, kind, v in ops if t == i])
            for i in range(n)]
    tables = [t for t, _ in made]
    keys = sorted({k for _, k, *_ in ops})
    start = data.draw(st.sampled_from([b"\x00", *keys, keys[0] + b"\x00"]), label="start")
    stop = data.draw(st.sampled_from([None, b"\xff", *keys]), label="stop")
    chunk = data.draw(st.sampled_from([1, 8, 1 << 20]), label="chunk bytes")
    try:
        pure, fast = _pure_and_compiled(
            lambda: list(sst.merged_entries(tables, start, stop)),
            lambda: _scan(tables, start, stop, chunk))
        if fast == ("error", "separator"):  # a mutated key now lies past its separator
            assert _lying_separator(tables), pure
            return
    finally:
        for t in tables:
            t.close()
    assert pure == fast, (pure, fast)
    if not any(m for _, m in made):
        assert pure == sorted((k, v) for k, v in _model(ops).items()
                              if k >= start and (stop is None or k < stop))


def test_scans_equal_a_model_of_the_history() -> None:
    """Unmutated generated histories (fixed seeds): the compiled scan equals the model."""
    _check_built()
    rnd = random.Random(33)
    import tempfile

    for _ in range(200):
        ops = []
        keys = [bytes([rnd.randrange(3)]) + rnd.randbytes(rnd.randrange(0, 3)) for _ in range(6)]
        for seq in range(1, rnd.randrange(1, 50)):
            kind = rnd.choice([1, 1, 2, 2, 0, 7])
            ops.append((rnd.randrange(3), rnd.choice(keys), seq, kind,
                        rnd.randbytes(rnd.randrange(0, 5)) if kind in (1, 2) else b""))
        with tempfile.TemporaryDirectory() as d:
            tables = []
            for i in range(3):
                entries = sorted([(k, s, kind, v) for t, k, s, kind, v in ops if t == i],
                                 key=lambda e: (e[0], -e[1]))
                tables.append(_plain_table(os.path.join(d, f"{i}.sst"), entries,
                                           rnd.choice([1, 2, 16]), rnd.randrange(1, 5)))
            try:
                model = sorted(_model(ops).items())
                for chunk in (1, 1 << 20):
                    assert _scan(tables, b"\x00", None, chunk) == model
                lo = rnd.choice(keys)
                assert _scan(tables, lo, b"\x02", 64) == [
                    kv for kv in model if lo <= kv[0] < b"\x02"]
            finally:
                for t in tables:
                    t.close()


def _plain_table(path: str, entries: list[tuple[bytes, int, int, bytes]], interval: int,
                 per: int) -> Any:
    """An unmutated, uncompressed table of ``entries`` (no checksum: the type 'none')."""
    out = bytearray()
    handles = []
    for i in range(0, len(entries), per):
        chunk = entries[i : i + per]
        data = _data_block([(k + struct.pack("<Q", seq << 8 | kind), v)
                            for k, seq, kind, v in chunk], interval)
        handles.append((chunk[-1][0], sst.BlockHandle(len(out), len(data))))
        out += data + b"\x00\x00\x00\x00\x00"
    with open(path, "wb") as f:
        f.write(out)
    table = object.__new__(sst.SstFile)
    table.path = table.source = path
    table._f = open(path, "rb")
    table.size = len(out)
    table.checksum_type = 0
    table._checksum = None
    table._base_context = 0
    table._footer_start = len(out)
    table._index = handles
    table._top_index = None
    table.meta_blocks = {}
    table._global_seqno = None
    return table


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("comp", "fv", "index"), [
    ("snappy", 5, "binary_search"), ("none", 6, "binary_search"),
    ("lz4", 5, "two_level_index_search"), ("zstd", 4, "binary_search")])
def test_tables_rocksdb_wrote_read_like_rocksdb(tmp_path: Path, seed: int, comp: str, fv: int,
                                                index: str) -> None:
    """Four overlapping tables of puts, overwrites and deletes written by RocksDB (every
    compression, format_version 4-6 with their checksum contexts, two-level index): the
    compiled scan equals RocksDB's own reading, whole, from a seek and chunk by chunk."""
    _check_built()
    model = _build_db(tmp_path / "db", comp, fv, index, restart=3, seed=seed,
                      range_delete=False)
    tables = [sst.SstFile(p) for p in _table_paths(tmp_path / "db")]
    try:
        assert len(tables) == 4 and sum(t.properties.deletions for t in tables) > 0
        keys = [k for k, _ in model]
        assert _scan(tables, b"\x00", None, 1 << 20) == [kv for kv in model if kv[0]]
        assert _scan(tables, b"\x00", None, 100) == [kv for kv in model if kv[0]]
        for lo in keys[1::29]:
            assert _scan(tables, lo, b"\x03", 1 << 20) == [
                kv for kv in model if lo <= kv[0] < b"\x03"]
        scan = sst.table_scan(tables, b"\x01", b"\x03", 1, chunk_bytes=64)
        groups = []
        while True:
            kg, n, buf, ends = scan.next_chunk()
            if kg < 0:
                break
            pairs = fastpath_unpack(buf)
            assert len(pairs) == n and all(k[0] == kg for k, _ in pairs)
            groups.append((kg, ends))
        assert [kg for kg, ends in groups if ends] == [1, 2]
    finally:
        for t in tables:
            t.close()


def fastpath_unpack(buf: bytes) -> list[tuple[bytes, bytes]]:
    from statequery.backends import _sst

    return _sst.unpack_chunk(buf)


def test_range_tombstones_are_left_to_the_merge_reader(tmp_path: Path) -> None:
    _check_built()
    _build_db(tmp_path / "db", "snappy", 5, range_delete=True)
    tables = [sst.SstFile(p) for p in _table_paths(tmp_path / "db")]
    try:
        assert sst.table_scan(tables, b"\x00", b"\x04", 1) is None
    finally:
        for t in tables:
            t.close()


# -- packed chunks through the compiled sink, every generated shape ---------------------------


class _PackedPairs(_Pairs):  # type: ignore[misc]
    """The harness's RocksDB pairs, also offered as packed chunks of one key group each (cut
    every ``per`` entries), as ``RocksDBState.table_scan`` offers them."""

    def __init__(self, name: str, pairs: list[tuple[bytes, bytes]], prefix: int,
                 per: int) -> None:
        super().__init__(name, pairs)
        self._prefix = prefix
        self._per = per

    def table_scan(self, state: str, bounds: Any, key_prefix: bytes | None = None) -> Any:
        return _Chunks(self.pairs, self._prefix, self._per)


class _Chunks:
    def __init__(self, pairs: list[tuple[bytes, bytes]], prefix: int, per: int) -> None:
        self.out: list[tuple[int, int, bytes, bool]] = []
        groups: list[tuple[int, list[tuple[bytes, bytes]]]] = []
        for k, v in pairs:
            kg = int.from_bytes(k[:prefix], "big")
            if groups and groups[-1][0] == kg:
                groups[-1][1].append((k, v))
            else:
                groups.append((kg, [(k, v)]))
        for kg, items in groups:
            for i in range(0, len(items), per):
                part = items[i : i + per]
                self.out.append((kg, len(part), b"".join(
                    struct.pack("=qq", len(k), len(v)) + k + v for k, v in part),
                    i + per >= len(items)))
        self.out.reverse()

    def next_chunk(self) -> tuple[int, int, bytes, bool]:
        return self.out.pop() if self.out else (-1, 0, b"", True)


@SETTINGS
@given(data=st.data())
def test_packed_feeds_read_the_same(data: Any) -> None:
    """Generated states of every shape the compiled sink decodes, their RocksDB pairs fed as
    packed chunks (``_read.feed_packed``, the compiled scan's feed) and by the pure path's
    handlers, clean and with one entry mutated: the same table or the same typed error."""
    from tests.backends import test_differential as d

    _check_built()
    c = case(data.draw)
    _compiled(c)
    if not _delimitable(c):
        return
    pairs = rocksdb_pairs(c)
    per = data.draw(st.sampled_from([1, 2, 1000]), label="entries per chunk")
    prefix = c.enc.prefix_len
    saved = d._Pairs
    try:
        d._Pairs = lambda name, p: _PackedPairs(name, p, prefix, per)  # type: ignore[misc]
        pure, fast = _both(lambda: read_rocksdb(c, pairs))
        assert not isinstance(pure, d.Corrupt), pure
        assert_same(pure, fast, "packed")
        mutated = _mutate_pairs(data.draw, c, pairs)
        if mutated is not None:
            bad, what = mutated
            pure, fast = _both(lambda: read_rocksdb(c, bad))
            assert_same(pure, fast, f"packed, {what}")
    finally:
        d._Pairs = saved


def test_runs_of_disjoint_tables_equal_the_model() -> None:
    """Tables splitting the key range (one LSM level) chained into a run, over another level
    that overlaps them, from seeks and chunk by chunk: the model's pairs."""
    _check_built()
    import tempfile

    rnd = random.Random(7)
    for _ in range(100):
        keys = sorted({bytes([rnd.randrange(3)]) + rnd.randbytes(rnd.randrange(0, 3))
                       for _ in range(12)})
        cuts = sorted(rnd.sample(range(1, len(keys)), min(3, len(keys) - 1)))
        ops = []
        for seq in range(1, rnd.randrange(2, 60)):
            kind = rnd.choice([1, 1, 2, 2, 0, 7])
            k = rnd.choice(keys)
            level = rnd.random() < 0.5
            table = 0 if not level else 1 + sum(keys.index(k) >= c for c in cuts)
            ops.append((table, k, seq, kind,
                        rnd.randbytes(rnd.randrange(0, 5)) if kind in (1, 2) else b""))
        with tempfile.TemporaryDirectory() as d:
            tables = []
            for i in range(1 + len(cuts) + 1):
                entries = sorted([(k, s, kind, v) for t, k, s, kind, v in ops if t == i],
                                 key=lambda e: (e[0], -e[1]))
                if entries:
                    tables.append(_plain_table(os.path.join(d, f"{i}.sst"), entries,
                                               rnd.choice([1, 3, 16]), rnd.randrange(1, 4)))
            try:
                model = sorted(_model(ops).items())
                for chunk in (1, 1 << 20):
                    assert _scan(tables, b"\x00", None, chunk) == model
                lo = rnd.choice(keys)
                assert _scan(tables, lo, b"\x02", 16) == [
                    kv for kv in model if lo <= kv[0] < b"\x02"]
            finally:
                for t in tables:
                    t.close()


def test_a_block_past_its_separator_is_refused_in_a_run(tmp_path: Path) -> None:
    """Two tables of disjoint ranges whose first table's index separator is smaller than its
    block's keys (a lying index): the run's order would put the second table's key 0x0105
    after the first's 0x0109, an old version could survive; the scan raises instead."""
    _check_built()
    a = _plain_table(str(tmp_path / "a.sst"), [(b"\x01\x01", 9, 1, b"old"),
                                               (b"\x01\x09", 8, 1, b"x")], 16, 2)
    b = _plain_table(str(tmp_path / "b.sst"), [(b"\x01\x05", 10, 1, b"new")], 16, 1)
    try:
        # honest separators: both keys, in order
        assert _scan([a, b], b"\x00", None, 1 << 20) == [
            (b"\x01\x01", b"old"), (b"\x01\x05", b"new"), (b"\x01\x09", b"x")]
        a._index = [(b"\x01\x02", a._index[0][1])]  # the separator now lies: 0x0102 < 0x0109
        with pytest.raises(CorruptStateError, match="past its index separator"):
            _scan([a, b], b"\x00", None, 1 << 20)
    finally:
        a.close()
        b.close()


# -- blocks read in runs (one read per run of back-to-back blocks) -----------------------------


def _run_table(path: str, rnd: random.Random, kind: int) -> tuple[Any, list[Any], int]:
    """A checksummed table (``kind``: crc32c or XXH3, a base context) of many blocks back to
    back, snappy and uncompressed, a few larger than a whole run (256 KiB) among small ones;
    the table, its entries and where its blocks' bytes end."""
    import cramjam

    from statequery.backends import checksums

    fn = checksums.checksum_function(kind)
    assert fn is not None
    base = 0x13572468
    entries = []
    out = bytearray()
    handles = []
    n = 0
    for b in range(60):
        big = b in (5, 6, 31)
        count = 700 if big else rnd.randrange(1, 30)
        size = 600 if big else rnd.randrange(0, 200)
        chunk = []
        for _ in range(count):
            key = b"\x01" + n.to_bytes(4, "big")
            chunk.append((key, n + 1, 1, rnd.randbytes(size)))
            n += 1
        entries += chunk
        data = _data_block([(k + struct.pack("<Q", seq << 8 | t), v)
                            for k, seq, t, v in chunk], rnd.choice([1, 16]))
        compression = rnd.choice([0, 1])
        if compression:
            data = bytes(cramjam.snappy.compress_raw(data))
        offset = len(out)
        body = data + bytes([compression])
        stored = (fn(body, len(body)) + checksums.context_modifier(base, offset)) & 0xFFFFFFFF
        out += body + struct.pack("<I", stored)
        handles.append((chunk[-1][0], sst.BlockHandle(offset, len(data))))
    with open(path, "wb") as f:
        f.write(out)
    table = object.__new__(sst.SstFile)
    table.path = table.source = path
    table._f = open(path, "rb")
    table.size = len(out)
    table.checksum_type = kind
    table._checksum = fn
    table._base_context = base
    table._footer_start = len(out)
    table._index = handles
    table._top_index = None
    table.meta_blocks = {}
    table._global_seqno = None
    return table, entries, len(out)


def _message(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except StatequeryError as e:
        return ("error", type(e).__name__, str(e))


@pytest.mark.parametrize("kind", [1, 4])  # crc32c, XXH3
def test_blocks_read_in_runs_equal_the_pure_reads(tmp_path: Path, kind: int) -> None:
    """A table of small and large blocks back to back (runs of growing size, blocks larger
    than a run, snappy and plain) read whole and from seeks: the entries written; the file
    cut short after it was opened (at block boundaries and inside blocks, inside and at the
    end of a run) or a byte changed: the pure path's error, message and all, never a partial
    read."""
    _check_built()
    rnd = random.Random(kind)
    path = str(tmp_path / "runs.sst")
    table, entries, end = _run_table(path, rnd, kind)
    want = [(k, v) for k, _, _, v in entries]
    try:
        assert _scan([table], b"\x00", None, 1 << 20) == want
        assert _scan([table], b"\x00", None, 100) == want
        for lo in [entries[i][0] for i in (0, 1, 700, 2000, len(entries) - 1)]:
            assert _scan([table], lo, b"\x02", 1 << 20) == [kv for kv in want if kv[0] >= lo]
        data = open(path, "rb").read()
        offsets = [h.offset for _, h in table._index]
        cuts = sorted({0, 1, end - 1, *offsets[1::7], *(o + 3 for o in offsets[::5]),
                       *rnd.sample(range(end), 20)})
        for cut in cuts:
            with open(path, "r+b") as f:
                f.truncate(cut)
            pure, fast = _pure_and_compiled(
                lambda: _message(lambda: list(sst.merged_entries([table], b"\x00", None))),
                lambda: _message(lambda: _scan([table], b"\x00", None, 1 << 20)))
            assert pure == fast, cut
            assert pure[:2] == ("error", "CorruptStateError") and "short read" in pure[2], cut
            with open(path, "wb") as f:
                f.write(data)
        for at in sorted({0, end - 1, *(o + 1 for o in offsets[::6]), *rnd.sample(range(end), 8)}):
            changed = bytearray(data)  # a byte changed after the checksum was computed
            changed[at] ^= 0x5A
            with open(path, "wb") as f:
                f.write(changed)
            pure, fast = _pure_and_compiled(
                lambda: _message(lambda: list(sst.merged_entries([table], b"\x00", None))),
                lambda: _message(lambda: _scan([table], b"\x00", None, 1 << 20)))
            assert pure == fast, at
            assert pure[:2] == ("error", "CorruptStateError") and "checksum" in pure[2], at
        with open(path, "wb") as f:
            f.write(data)
    finally:
        table.close()


def test_a_view_of_the_chunk_equals_its_copy_and_holds_the_buffer(tmp_path: Path) -> None:
    """``next_view`` gives the bytes ``next_chunk`` copies; while a view is held the scan's
    buffer cannot grow under it (a BufferError, never a write to freed memory)."""
    _check_built()
    rnd = random.Random(3)
    table, entries, _ = _run_table(str(tmp_path / "t.sst"), rnd, 4)
    try:
        copies = sst.table_scan([table], b"\x00", None, 1, chunk_bytes=4096)
        views = sst.table_scan([table], b"\x00", None, 1, chunk_bytes=4096)
        assert copies is not None and views is not None
        while True:
            kg, n, buf, ends = copies.next_chunk()
            kg2, n2, view, ends2 = views.next_view()
            assert (kg, n, ends) == (kg2, n2, ends2)
            assert bytes(view) == buf and view.readonly
            view.release()
            if kg < 0:
                break
        held = sst.table_scan([table], b"\x00", None, 1, chunk_bytes=64)
        assert held is not None
        _, _, first, _ = held.next_view()
        small = bytes(first)
        with pytest.raises(BufferError):  # the next chunk needs more room than the first
            while True:
                kg, _, _, _ = held.next_view()
                assert kg >= 0
        assert bytes(first) != b"" and len(first) == len(small)
    finally:
        table.close()


def test_overlapping_tables_of_long_keys_merge_in_key_order(tmp_path: Path) -> None:
    """Overlapping tables whose keys share long prefixes and differ at any byte (the merge
    compares 8 bytes at a time), some keys prefixes of others, overwritten across tables: the
    compiled scan gives the pure merge's pairs, which are the newest value of each key."""
    _check_built()
    rnd = random.Random(11)
    common = rnd.randbytes(40)
    keys = sorted({b"\x01" + common[: rnd.randrange(0, 40)] + rnd.randbytes(rnd.randrange(0, 3))
                   for _ in range(300)})
    newest: dict[bytes, tuple[int, bytes]] = {}
    per_table: list[list[tuple[bytes, int, int, bytes]]] = [[], [], []]
    seq = 0
    for key in keys:
        for t in rnd.sample(range(3), rnd.randrange(1, 4)):
            seq += 1
            value = rnd.randbytes(rnd.randrange(0, 6))
            per_table[t].append((key, seq, 1, value))
            newest[key] = (seq, value)
    tables = [_plain_table(str(tmp_path / f"{i}.sst"),
                           sorted(e, key=lambda x: (x[0], -x[1])), 16, 7)
              for i, e in enumerate(per_table)]
    try:
        want = [(k, newest[k][1]) for k in keys]
        assert _scan(tables, b"\x00", None, 1 << 20) == want
        assert list(sst.merged_entries(tables, b"\x00", None)) == want
        for lo in keys[::37]:
            assert _scan(tables, lo, b"\x02", 64) == [kv for kv in want if kv[0] >= lo]
    finally:
        for t in tables:
            t.close()
