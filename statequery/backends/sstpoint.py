"""Point reads inside RocksDB table files: the blocks a lookup needs, by ranged reads.

A lookup (one key of one key group, :meth:`TableReadState.items
<statequery.backends.rocksdb.TableReadState.items>`) needs, of each table whose key range can
hold the key: the footer, the metaindex and properties blocks, the index block (of a
partitioned index: its top level and the one partition that can hold the key) and the data
block(s) whose key range holds the key's prefix. :class:`RangedSstFile` is an
:class:`~statequery.backends.sst.SstFile` that reads exactly those blocks through the storage
seam (:meth:`statequery.io.InputFile.read`, one ranged request per block) instead of fetching
the whole table into the file cache first. Every block is verified against its checksum before
use, as for a local table, and the merge rules across tables and levels are
:func:`~statequery.backends.sst.merged_entries`' (newest sequence number first, deletions, range
tombstones, merge operands).

Incremental checkpoints share table files between versions, so remote tables and the blocks
read of them are kept in a per-:class:`~statequery.io.FileIO` cache (:func:`open_point_table`),
keyed by the file's location, segment, size, the store's version token (``FileIO.version``: a
rewritten object is never served stale) and the MANIFEST's largest sequence number: the next
version's lookup of the same table reads only what it has not read before. A local table is
read as it is now by each open (a stream of its own; its blocks kept while it is open), as the
file cache never serves local files either: a rewrite within one mtime tick keeps the token.

Filter blocks are not read. Flink writes none by default (``state.backend.rocksdb.use-bloom-
filter``); where one exists (ForSt) it is a whole-key filter over the full user key (key
group, key, namespace, user key), which a lookup by key does not know, so it cannot rule a
table out, and Flink sets no prefix extractor for a prefix filter to use.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from statequery.backends.sst import BlockHandle, SstFile, _Block
from statequery.exceptions import CorruptStateError
from statequery.io import FileIO, is_local


class TableFile(Protocol):
    """What :func:`open_point_table` needs of a file of a RocksDB handle
    (:class:`statequery.backends.rocksdb.DbFile`)."""

    @property
    def location(self) -> str | None: ...
    @property
    def size(self) -> int: ...
    @property
    def data(self) -> bytes | None: ...
    @property
    def checksum(self) -> str | None: ...
    @property
    def offset(self) -> int | None: ...
    @property
    def source(self) -> str: ...

__all__ = ["BlockCache", "RangedSstFile", "open_point_table", "point_cache"]

#: bytes of blocks kept per FileIO (footers, index blocks, data blocks read by lookups)
BLOCK_CACHE_BYTES = int(os.environ.get("STATEQUERY_POINT_CACHE_BYTES", 64 << 20))
#: opened tables kept per FileIO
MAX_TABLES = 1024

_TableKey = tuple[str, int, int, str, str, int]


class BlockCache:
    """Least-recently-used raw blocks (as read, trailer included) and opened tables of one
    FileIO, bounded by :data:`BLOCK_CACHE_BYTES` and :data:`MAX_TABLES`."""

    def __init__(self, max_bytes: int = BLOCK_CACHE_BYTES, max_tables: int = MAX_TABLES) -> None:
        self.max_bytes = max_bytes
        self.max_tables = max_tables
        self._lock = threading.Lock()
        self._blocks: OrderedDict[tuple[_TableKey, int, int], bytes] = OrderedDict()
        self._bytes = 0
        self._tables: OrderedDict[_TableKey, RangedSstFile] = OrderedDict()

    @property
    def size(self) -> int:
        """Bytes of blocks held."""
        return self._bytes

    def block(self, key: tuple[_TableKey, int, int]) -> bytes | None:
        with self._lock:
            data = self._blocks.get(key)
            if data is not None:
                self._blocks.move_to_end(key)
            return data

    def put_block(self, key: tuple[_TableKey, int, int], data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        with self._lock:
            old = self._blocks.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            self._blocks[key] = data
            self._bytes += len(data)
            while self._bytes > self.max_bytes:
                _, dropped = self._blocks.popitem(last=False)
                self._bytes -= len(dropped)

    def table(self, key: _TableKey) -> RangedSstFile | None:
        with self._lock:
            table = self._tables.get(key)
            if table is not None:
                self._tables.move_to_end(key)
            return table

    def put_table(self, key: _TableKey, table: RangedSstFile) -> RangedSstFile:
        """Keep ``table`` (or return the one another thread kept meanwhile)."""
        with self._lock:
            held = self._tables.get(key)
            if held is not None:
                return held
            self._tables[key] = table
            while len(self._tables) > self.max_tables:
                self._tables.popitem(last=False)
            return table

    def clear(self) -> None:
        with self._lock:
            self._blocks.clear()
            self._tables.clear()
            self._bytes = 0


_CACHES: weakref.WeakKeyDictionary[FileIO, BlockCache] = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


def point_cache(io: FileIO) -> BlockCache:
    """The block cache of ``io`` (made on first use, dropped with ``io``)."""
    with _CACHES_LOCK:
        cache = _CACHES.get(io)
        if cache is None:
            cache = _CACHES[io] = BlockCache()
        return cache


class RangedSstFile(SstFile):
    """An :class:`~statequery.backends.sst.SstFile` whose bytes are read on demand by
    ``read(offset, n)`` (a ranged read of the storage seam), each read kept in ``cache``.

    Opening it reads the footer, the metaindex and the properties block; a seek
    (:meth:`tuples`, :meth:`blocks` with a start key) then reads the index block (a partitioned
    index: its top level and the partitions from the one that can hold the start key, lazily)
    and the data blocks from the one that can hold the start key, as long as the walk goes on.
    :meth:`close` closes nothing: the table holds no open file, and may be shared by the
    lookups of several versions.
    """

    def __init__(self, read: Callable[[int, int], bytes], size: int, source: str,
                 cache: BlockCache | None = None, key: _TableKey | None = None,
                 on_close: Callable[[], None] | None = None) -> None:
        self.path = source
        self.source = source
        self.size = size
        self._read = read
        self._cache = cache
        self._key = key
        self._on_close = on_close
        self._partitions: dict[int, _Block] = {}
        try:
            self._read_footer()
            self._read_meta()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the table's own stream (a local file's); a shared remote table has none."""
        if self._on_close is not None:
            self._on_close()

    def __repr__(self) -> str:
        return f"RangedSstFile({self.source!r})"

    def _pread(self, offset: int, n: int) -> bytes:
        if offset < 0 or n < 0 or offset + n > self.size:
            raise CorruptStateError(
                f"block [{offset}, {offset + n}) lies outside the {self.size}-byte file "
                "(truncated?)", self.source, offset)
        ck = None if self._cache is None or self._key is None else (self._key, offset, n)
        if ck is not None:
            assert self._cache is not None
            data = self._cache.block(ck)
            if data is not None:
                return data
        data = self._read(offset, n)
        if len(data) != n:
            raise CorruptStateError(f"short read of {n} bytes (truncated?)", self.source, offset)
        if ck is not None:
            assert self._cache is not None
            self._cache.put_block(ck, data)
        return data

    def check_blocks(self) -> None:
        """Every data block read and checked, one ranged read each (the local table's check)."""
        for _, h in self.data_block_handles():
            self.read_block(h)
        self.range_deletions()

    def _index_from(self, start: bytes | None) -> Iterable[tuple[bytes, BlockHandle]]:
        if self._index is None and start is not None and self.properties.index_type == 2:
            return self._seek_partitions(start)
        return super()._index_from(start)

    def _seek_partitions(self, start: bytes) -> Iterator[tuple[bytes, BlockHandle]]:
        """A two-level index searched like a single-level one: the top level's restart points,
        then only the partitions from the first whose separator is >= ``start`` (read as the
        walk reaches them)."""
        delta = self.properties.index_value_is_delta_encoded
        top = self._top_index
        if top is None:
            top = self._top_index = self.read_block(self.index_handle, delta, what="index")
        user_key = self.properties.index_key_is_user_key

        def key_of(k: bytes) -> bytes:
            return k if user_key else k[:-8]

        restart = top.seek_restart(start, key_of=None if user_key else key_of)
        for top_key, top_handle in top.handles(restart):
            if key_of(top_key) < start:
                continue
            part = self._partitions.get(top_handle.offset)
            if part is None:
                part = self.read_block(top_handle, delta, what="index partition")
                self._partitions[top_handle.offset] = part
            at = part.seek_restart(start, key_of=None if user_key else key_of)
            for key, h in part.handles(at):
                separator = key_of(key)
                if separator < start:
                    continue
                self._check_block(h)
                yield separator, h


def open_point_table(io: FileIO, f: TableFile, largest_seqno: int = 0) -> RangedSstFile | None:
    """The table file ``f`` opened for point reads through ``io`` (cached per ``io``), or None
    when it must be fetched whole instead: inline bytes, a handle without a size, or a
    whole-file checksum to verify (it needs every byte)."""
    if f.location is None or f.data is not None or f.size < 0 or f.checksum:
        return None
    location = f.location
    actual, version = io.version(location)
    base = f.offset or 0
    if f.offset is None and actual != f.size:
        raise CorruptStateError(
            f"file is {actual} bytes but its state handle says {f.size} (truncated or "
            "replaced?)", location)
    if base + f.size > actual:
        raise CorruptStateError(
            f"segment [{base}, {base + f.size}) lies outside the {actual}-byte file", location)
    key: _TableKey = (location, base, f.size, version, io.endpoint(location), largest_seqno)
    inp = io.new_input(location)
    if is_local(location):
        # as the file cache: a local file is read as it is now (a stream of its own, opened
        # here), never from blocks kept for an earlier open (a rewrite within one mtime tick
        # keeps the version token) nor through a pooled handle's buffer
        stream = inp.open()
        lock = threading.Lock()

        def read_local(offset: int, n: int) -> bytes:
            with lock:
                stream.seek(base + offset)
                return stream.read(n)

        return RangedSstFile(read_local, f.size, f.source, BlockCache(), key, stream.close)

    def read(offset: int, n: int) -> bytes:
        return inp.read(base + offset, n)

    cache = point_cache(io)
    table = cache.table(key)
    if table is not None:
        return table
    return cache.put_table(key, RangedSstFile(read, f.size, f.source, cache, key))
