"""A pure-Python reader of RocksDB block-based table files (``*.sst``).

Why: Flink's ``ListState.add`` is a RocksDB *merge* (operator ``stringappendtest``, delimiter
``,``). Until a compaction runs, a list column family holds one merge operand per ``add()``, and
rocksdict (no merge operator) cannot read those keys. This module reads the operands
straight from the table files, and :func:`merged_entries` applies RocksDB's merge semantics across
every table of a column family. See ``docs/rocksdb.md``.

Format (RocksDB ``table/block_based/``, ``table/format.cc``, ``db/dbformat.h``):

* **Footer** at the end of the file. Legacy (``kLegacyBlockBasedTableMagicNumber``): 48 bytes =
  metaindex handle + index handle (varints, padded to 40 bytes) + 8-byte magic. Versioned
  (``kBlockBasedTableMagicNumber``, format_version 1..5): 53 bytes = checksum type, the two
  handles padded to 40 bytes, ``uint32 format_version``, magic. format_version 6+: checksum type,
  extended magic ``3E 00 7A 00``, footer checksum, base context checksum, ``uint32`` metaindex
  size (the metaindex block ends where the footer begins; the index handle is in the metaindex
  under ``rocksdb.index``), padding, ``uint32 format_version``, magic.
* **Block handle**: varint64 offset, varint64 size; every block is followed by a 5-byte trailer
  (compression type, 32-bit checksum).
* **Block**: entries ``varint32 shared, varint32 non_shared, varint32 value_len, key delta,
  value``, then ``uint32`` restart offsets and ``uint32 num_restarts`` (whose top bit flags a data
  block hash index placed between the restarts and that word). Index blocks written with
  ``index_value_is_delta_encoded`` omit ``value_len`` and encode the value as a full block handle
  at restart points (``shared == 0``) and as a zig-zag size delta otherwise.
* **Compression** (trailer byte): 0 none, 1 snappy (raw), 2 zlib (raw deflate), 3 bzip2, 4 lz4,
  5 lz4hc, 7 zstd; all but snappy carry a varint32 uncompressed-size prefix (format_version >= 2).
* **Internal key** = user key + little-endian ``uint64 (seq << 8 | type)``; type 0 deletion,
  1 value, 2 merge, 7 single deletion, 0x0F range deletion (in the ``rocksdb.range_del`` meta block,
  value = exclusive end key).
* **Index**: binary-search (0), hash-search (1, same index block plus prefix meta blocks),
  two-level/partitioned (2: a top-level index of index partitions), binary search with first key
  (3: each value followed by a length-prefixed first key).

* **Checksums** (:mod:`statequery.backends.checksums`): every block read is verified against its
  trailer before any of its bytes is used (the checksum type of the footer: crc32c, xxHash,
  xxHash64 or XXH3; format_version 6+ adds the block offset's context), and so is the footer of
  format_version 6+. Blocks the reader never needs (filters) are not read, as with RocksDB.

A mismatch, a truncated file or a bad length raises
:class:`~statequery.exceptions.CorruptStateError` naming the file and the block's offset; every
length and offset is also bounds-checked.
"""

from __future__ import annotations

import heapq
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import IO, Any

from statequery.backends.checksums import CRC32C, NAMES, checksum_function, context_modifier
from statequery.exceptions import CorruptStateError, UnsupportedFormatError

__all__ = [
    "TYPE_DELETION",
    "TYPE_MERGE",
    "TYPE_RANGE_DELETION",
    "TYPE_SINGLE_DELETION",
    "TYPE_VALUE",
    "InternalEntry",
    "SstFile",
    "TableProperties",
    "merge_entries",
    "merged_entries",
    "scanned_pairs",
    "table_scan",
]

LEGACY_MAGIC = 0xDB4775248B80FB57
BLOCK_BASED_MAGIC = 0x88E241B785F4CFF7
# Other table formats (named in errors only).
_OTHER_MAGICS = {
    0x4F3418EB7A8F13B8: "legacy plain table",
    0x8242229663BF9564: "plain table",
    0x926789D0C5F17873: "cuckoo table",
}
_EXTENDED_MAGIC = b"\x3e\x00\x7a\x00"
_LEGACY_FOOTER = 48
_NEW_FOOTER = 53
_BLOCK_TRAILER = 5

TYPE_DELETION = 0x0
TYPE_VALUE = 0x1
TYPE_MERGE = 0x2
TYPE_SINGLE_DELETION = 0x7
TYPE_RANGE_DELETION = 0xF
TYPE_DELETION_WITH_TIMESTAMP = 0x14
_KNOWN_TYPES = {TYPE_DELETION, TYPE_VALUE, TYPE_MERGE, TYPE_SINGLE_DELETION}
_TYPE_NAMES = {0x11: "blob index (BlobDB)", 0x16: "wide-column entity",
               0x18: "value with preferred seqno"}

_COMPRESSION_NAMES = {0: "none", 1: "snappy", 2: "zlib", 3: "bzip2", 4: "lz4", 5: "lz4hc",
                      6: "xpress", 7: "zstd"}

_INT_PROPERTIES = {
    "rocksdb.data.size", "rocksdb.index.size", "rocksdb.index.partitions",
    "rocksdb.top-level.index.size", "rocksdb.index.key.is.user.key",
    "rocksdb.index.value.is.delta.encoded", "rocksdb.filter.size", "rocksdb.raw.key.size",
    "rocksdb.raw.value.size", "rocksdb.num.data.blocks", "rocksdb.num.entries",
    "rocksdb.num.filter_entries", "rocksdb.deleted.keys", "rocksdb.merge.operands",
    "rocksdb.num.range-deletions", "rocksdb.format.version", "rocksdb.fixed.key.length",
    "rocksdb.column.family.id", "rocksdb.creation.time", "rocksdb.oldest.key.time",
    "rocksdb.file.creation.time", "rocksdb.newest.key.time", "rocksdb.key.largest.seqno",
    "rocksdb.key.smallest.seqno", "rocksdb.original.file.number", "rocksdb.tail.start.offset",
    "rocksdb.user.defined.timestamps.persisted", "rocksdb.slow.compression.estimated.data.size",
    "rocksdb.fast.compression.estimated.data.size",
}

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

_compiled: ModuleType | None
try:  # the compiled block walk (statequery/backends/_sst.pyx), built by setup.py when possible
    from statequery.backends import _sst as _compiled
except ImportError:  # pragma: no cover - not built: the pure-Python walk below
    _compiled = None


def has_compiled_walk() -> bool:
    """True when the compiled block walk is built and not turned off."""
    return _block_walk() is not None


def compiled_module() -> Any:
    """The compiled module ``_sst`` unless not built or ``STATEQUERY_PURE_PYTHON`` is set."""
    from statequery.backends.fastpath import pure_forced

    if _compiled is None or pure_forced():
        return None
    return _compiled


def _block_walk() -> Any:
    """``_sst.block_tuples`` unless not built or ``STATEQUERY_PURE_PYTHON`` is set."""
    compiled = compiled_module()
    return None if compiled is None else compiled.block_tuples


def _varint(buf: bytes, pos: int, source: str = "<sst>") -> tuple[int, int]:
    """Decode a little-endian base-128 varint at ``pos``: (value, next position)."""
    try:
        b = buf[pos]
    except IndexError:
        raise CorruptStateError("varint runs past the end of its block", source, pos) from None
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= len(buf) or shift > 63:
            raise CorruptStateError("malformed varint", source, pos)
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


@dataclass(frozen=True)
class BlockHandle:
    offset: int
    size: int


def _read_handle(buf: bytes, pos: int, source: str) -> tuple[BlockHandle, int]:
    offset, pos = _varint(buf, pos, source)
    size, pos = _varint(buf, pos, source)
    return BlockHandle(offset, size), pos


@dataclass(frozen=True)
class TableProperties:
    """The ``rocksdb.properties`` meta block of one table file (``TableProperties``)."""

    values: dict[str, int | bytes] = field(default_factory=dict)

    def get_int(self, name: str, default: int = 0) -> int:
        v = self.values.get(name, default)
        return v if isinstance(v, int) else default

    def get_text(self, name: str, default: str = "") -> str:
        v = self.values.get(name)
        return v.decode("utf-8", "replace") if isinstance(v, bytes) else default

    @property
    def column_family_name(self) -> str:
        return self.get_text("rocksdb.column.family.name")

    @property
    def column_family_id(self) -> int:
        return self.get_int("rocksdb.column.family.id", -1)

    @property
    def comparator(self) -> str:
        return self.get_text("rocksdb.comparator")

    @property
    def merge_operator(self) -> str:
        return self.get_text("rocksdb.merge.operator")

    @property
    def compression(self) -> str:
        return self.get_text("rocksdb.compression")

    @property
    def num_entries(self) -> int:
        return self.get_int("rocksdb.num.entries")

    @property
    def merge_operands(self) -> int:
        return self.get_int("rocksdb.merge.operands")

    @property
    def deletions(self) -> int:
        return self.get_int("rocksdb.deleted.keys")

    @property
    def range_deletions(self) -> int:
        return self.get_int("rocksdb.num.range-deletions")

    @property
    def index_type(self) -> int:
        v = self.values.get("rocksdb.block.based.table.index.type")
        if isinstance(v, bytes) and len(v) == 4:
            return int(_U32.unpack(v)[0])
        return 0

    @property
    def index_key_is_user_key(self) -> bool:
        return bool(self.get_int("rocksdb.index.key.is.user.key"))

    @property
    def index_value_is_delta_encoded(self) -> bool:
        return bool(self.get_int("rocksdb.index.value.is.delta.encoded"))

    @property
    def global_seqno(self) -> int | None:
        """The global sequence number of an ingested file written with ``write_global_seqno``."""
        if self.get_int("rocksdb.external_sst_file.version") < 2 and \
                "rocksdb.external_sst_file.version" not in self.values:
            return None
        v = self.values.get("rocksdb.external_sst_file.global_seqno")
        if isinstance(v, bytes) and len(v) == 8:
            seq = int(_U64.unpack(v)[0])
            return seq or None
        return None


@dataclass(frozen=True, slots=True)
class InternalEntry:
    """One internal key of a table: user key, sequence number, value type, value."""

    user_key: bytes
    seq: int
    type: int
    value: bytes


class _Block:
    """A decoded (uncompressed) block: its entry area and restart points."""

    __slots__ = ("base", "data", "delta_values", "first_keys", "limit", "restarts", "source")

    def __init__(self, data: bytes, source: str, base: int, delta_values: bool = False,
                 first_keys: bool = False) -> None:
        self.data = data
        self.source = source
        self.base = base  # file offset of the block (for errors)
        self.delta_values = delta_values
        self.first_keys = first_keys  # index values carry the block's first key (index type 3)
        n = len(data)
        if n < 4:
            raise CorruptStateError(f"block of {n} bytes is too short", source, base)
        word = _U32.unpack_from(data, n - 4)[0]
        num_restarts = word & 0x7FFFFFFF
        end = n - 4
        if word & 0x80000000:  # kDataBlockBinaryAndHash: hash index (uint8 buckets + uint16 count)
            if end < 2:
                raise CorruptStateError("truncated data block hash index", source, base)
            num_buckets = struct.unpack_from("<H", data, end - 2)[0]
            end -= 2 + num_buckets
        restarts_at = end - 4 * num_restarts
        if num_restarts == 0 or restarts_at < 0:
            raise CorruptStateError(f"block restart count {num_restarts} does not fit", source,
                                    base)
        self.limit = restarts_at
        self.restarts = struct.unpack_from(f"<{num_restarts}I", data, restarts_at)
        if restarts_at and max(self.restarts) >= restarts_at:
            raise CorruptStateError("restart offset out of range", source, base)

    def _key_at_restart(self, index: int) -> bytes:
        data = self.data
        pos = self.restarts[index]
        shared, pos = _varint(data, pos, self.source)
        non_shared, pos = _varint(data, pos, self.source)
        if not self.delta_values:
            _, pos = _varint(data, pos, self.source)
        if shared:
            raise CorruptStateError("restart entry with a shared prefix", self.source,
                                    self.base + pos)
        return data[pos : pos + non_shared]

    def entries(self, start: int = 0) -> Iterator[tuple[bytes, bytes]]:
        """(key, raw value) from the restart point ``start`` to the end of the block."""
        data = self.data
        limit = self.limit
        source = self.source
        pos = self.restarts[start] if self.restarts else limit
        key = b""
        if self.delta_values:
            yield from self._index_entries(pos)
            return
        while pos < limit:
            # fast path: all three varints below 128
            shared = data[pos]
            non_shared = data[pos + 1] if pos + 1 < limit else 0x80
            value_len = data[pos + 2] if pos + 2 < limit else 0x80
            if shared | non_shared | value_len < 0x80:
                pos += 3
            else:
                shared, pos = _varint(data, pos, source)
                non_shared, pos = _varint(data, pos, source)
                value_len, pos = _varint(data, pos, source)
            end_key = pos + non_shared
            end = end_key + value_len
            if end > limit or shared > len(key):
                raise CorruptStateError("block entry runs past the block", source, self.base + pos)
            key = key[:shared] + data[pos:end_key] if shared else data[pos:end_key]
            yield key, data[end_key:end]
            pos = end

    def value_offset(self, wanted: bytes) -> int | None:
        """Position in the block of the value of key ``wanted`` (None: no such key)."""
        data, limit, source = self.data, self.limit, self.source
        pos = self.restarts[0] if self.restarts else limit
        key = b""
        while pos < limit:
            shared, pos = _varint(data, pos, source)
            non_shared, pos = _varint(data, pos, source)
            value_len, pos = _varint(data, pos, source)
            end_key = pos + non_shared
            if end_key + value_len > limit or shared > len(key):
                raise CorruptStateError("block entry runs past the block", source, self.base + pos)
            key = key[:shared] + data[pos:end_key]
            if key == wanted:
                return end_key
            pos = end_key + value_len
        return None

    def handles(self, start: int = 0) -> Iterator[tuple[bytes, BlockHandle]]:
        """The entries of an index block as (key, block handle), from restart point ``start``."""
        if self.delta_values:
            yield from self._index_handles(self.restarts[start] if self.restarts else self.limit)
            return
        source = self.source
        for key, value in self.entries(start):
            handle, _ = _read_handle(value, 0, source)
            yield key, handle

    def all_handles(self) -> list[tuple[bytes, BlockHandle]]:
        """:meth:`handles` of the whole block as a list; a delta-encoded index is read by one
        compiled call (``_sst.index_handles``) when built, which hands any block it would not
        read exactly as the pure walk does back to it (the pure walk raises the typed error)."""
        compiled = compiled_module() if self.delta_values else None
        if compiled is not None:
            out: list[tuple[bytes, BlockHandle]] | None = compiled.index_handles(
                self.data, self.restarts[0] if self.restarts else self.limit, self.limit,
                self.first_keys, BlockHandle)
            if out is not None:
                return out
        return list(self.handles())

    def _index_entries(self, pos: int) -> Iterator[tuple[bytes, bytes]]:
        """Index entries with delta-encoded values: yields (key, encoded full handle)."""
        for key, handle in self._index_handles(pos):
            yield key, _encode_handle(handle)

    def _index_handles(self, pos: int) -> Iterator[tuple[bytes, BlockHandle]]:
        """Index entries with delta-encoded values: yields (key, full handle)."""
        data = self.data
        limit = self.limit
        source = self.source
        key = b""
        prev: BlockHandle | None = None
        while pos < limit:
            shared, pos = _varint(data, pos, source)
            non_shared, pos = _varint(data, pos, source)
            end_key = pos + non_shared
            if end_key > limit or shared > len(key):
                raise CorruptStateError("index entry runs past the block", source, self.base + pos)
            key = key[:shared] + data[pos:end_key]
            pos = end_key
            if shared == 0:
                handle, pos = _read_handle(data, pos, source)
            else:
                if prev is None:
                    raise CorruptStateError("delta-encoded index entry without a base", source,
                                            self.base + pos)
                zz, pos = _varint(data, pos, source)
                delta = (zz >> 1) ^ -(zz & 1)
                handle = BlockHandle(prev.offset + prev.size + _BLOCK_TRAILER, prev.size + delta)
            if self.first_keys:  # length-prefixed first internal key of the block: skip it
                n, pos = _varint(data, pos, source)
                pos += n
                if pos > limit:
                    raise CorruptStateError("index entry runs past the block", source,
                                            self.base + pos)
            prev = handle
            yield key, handle

    def seek_restart(self, target: bytes, key_of: Any = None) -> int:
        """Index of the last restart point whose key is < ``target`` (0 if none)."""
        lo, hi = 0, len(self.restarts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            k = self._key_at_restart(mid)
            if key_of is not None:
                k = key_of(k)
            if k < target:
                lo = mid
            else:
                hi = mid - 1
        return lo


def _encode_handle(h: BlockHandle) -> bytes:
    out = bytearray()
    for v in (h.offset, h.size):
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out)


#: the largest uncompressed block statequery inflates (a block holds at least one whole entry, so
#: a state value of this size still reads); larger declared sizes are corruption or a bomb
MAX_BLOCK_BYTES = int(os.environ.get("STATEQUERY_MAX_BLOCK_BYTES", 256 << 20))

#: how many times its compressed size a block of each codec can expand to at most (snappy: a
#: 3-byte copy yields 64 bytes; LZ4: a 255-run byte adds 255; deflate: 1032); bzip2 and zstd
#: have no useful bound and are held to MAX_BLOCK_BYTES only
_MAX_RATIO = {1: 22, 2: 1032, 4: 256, 5: 256}


def _check_declared(kind: int, size: int, compressed: int, source: str, offset: int) -> None:
    """Refuse a declared uncompressed size the codec cannot reach, before allocating it."""
    ratio = _MAX_RATIO.get(kind)
    limit = MAX_BLOCK_BYTES if ratio is None else min(MAX_BLOCK_BYTES, ratio * compressed + 64)
    if size > limit:
        raise CorruptStateError(
            f"{_COMPRESSION_NAMES[kind]} block of {compressed} bytes declares {size} uncompressed "
            f"bytes, more than it can hold ({limit}; STATEQUERY_MAX_BLOCK_BYTES={MAX_BLOCK_BYTES})",
            source, offset)


def _decompress(kind: int, data: bytes, source: str, offset: int) -> bytes:
    """Inflate one block into a buffer of exactly its declared size: a block that would inflate
    to more is refused when the buffer is full, never after allocating what it claims."""
    import cramjam

    try:
        if kind in (1, 2, 3, 4, 5, 7):
            size, pos = _varint(data, 0, source)  # snappy: its own length varint, kept in data
            payload = data if kind == 1 else data[pos:]
            _check_declared(kind, size, len(payload), source, offset)
            out = bytearray(size + (kind != 1))  # one spare byte: an overlong stream fills it
            if kind == 1:
                n = cramjam.snappy.decompress_raw_into(payload, out)
            elif kind in (4, 5):
                n = cramjam.lz4.decompress_block_into(payload, out)
            elif kind == 7:
                n = cramjam.zstd.decompress_into(payload, out)
            elif kind == 2:
                n = _inflate_raw_into(payload, out)
            else:
                n = cramjam.bzip2.decompress_into(payload, out)
            if n != size:
                raise CorruptStateError(
                    f"{_COMPRESSION_NAMES[kind]} block inflated to {n} bytes, "
                    f"expected {size}", source, offset)
            del out[size:]
            return bytes(out)
    except CorruptStateError:
        raise
    except Exception as e:  # cramjam raises its own DecompressionError
        raise CorruptStateError(
            f"cannot decompress {_COMPRESSION_NAMES.get(kind, kind)} block: {e}", source, offset
        ) from e
    raise UnsupportedFormatError(
        f"{source}: block compression {_COMPRESSION_NAMES.get(kind, kind)!s} (type {kind}) is not "
        "supported; supported: none, snappy, zlib, bzip2, lz4, lz4hc, zstd")


def _inflate_raw_into(payload: bytes, out: bytearray) -> int:
    """Raw deflate into ``out``, never producing more than ``len(out)`` bytes."""
    import zlib

    d = zlib.decompressobj(-15)
    data = d.decompress(payload, len(out))
    out[: len(data)] = data
    return len(data)


class SstFile:
    """One block-based table file, opened lazily: footer, meta blocks and index on first use.

    ``source`` names the file in errors (the remote location it came from, when known).
    Reads go through a seekable binary stream (a local file here: tables are fetched into the
    cache before they are read).
    """

    def __init__(self, path: str, source: str | None = None) -> None:
        self.path = path
        self.source = source or path
        try:
            self._f: IO[bytes] = open(path, "rb")
            self.size = os.fstat(self._f.fileno()).st_size
        except OSError as e:
            raise CorruptStateError(f"cannot open table file: {e}", self.source) from e
        try:
            self._read_footer()
            self._read_meta()
        except BaseException:
            self._f.close()
            raise

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> SstFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SstFile({self.source!r})"

    # -- raw access ----------------------------------------------------------------------------

    def _pread(self, offset: int, n: int) -> bytes:
        if offset < 0 or n < 0 or offset + n > self.size:
            raise CorruptStateError(
                f"block [{offset}, {offset + n}) lies outside the {self.size}-byte file "
                "(truncated?)", self.source, offset)
        data = os.pread(self._f.fileno(), n, offset)  # positioned: safe across threads
        if len(data) != n:
            raise CorruptStateError(f"short read of {n} bytes (truncated?)", self.source, offset)
        return data

    def read_block(self, handle: BlockHandle, delta_values: bool = False,
                   first_keys: bool = False, what: str = "data") -> _Block:
        """The block at ``handle``, its checksum verified before any byte of it is used;
        ``what`` names the kind of block in errors."""
        raw = self._pread(handle.offset, handle.size + _BLOCK_TRAILER)
        if self._checksum is not None:
            stored, computed = self._checksums(raw, handle)
            if stored != computed:
                raise self._mismatch(what, handle, stored, computed)
        return self._decode_block(raw, handle, delta_values, first_keys)

    def _decode_block(self, raw: bytes, handle: BlockHandle, delta_values: bool = False,
                      first_keys: bool = False) -> _Block:
        kind = raw[handle.size]
        data = raw[: handle.size]
        if kind:
            data = _decompress(kind, data, self.source, handle.offset)
        return _Block(data, self.source, handle.offset, delta_values, first_keys)

    def _checksums(self, raw: bytes, handle: BlockHandle) -> tuple[int, int]:
        """(stored checksum without its context, computed checksum) of a block read with its
        trailer: RocksDB's ``VerifyBlockChecksum``."""
        assert self._checksum is not None
        n = handle.size + 1  # the block and its compression-type byte
        stored = _U32.unpack_from(raw, n)[0]
        if self._base_context:
            stored = (stored - context_modifier(self._base_context, handle.offset)) & 0xFFFFFFFF
        return stored, self._checksum(raw, n)

    def _mismatch(self, what: str, handle: BlockHandle, stored: int,
                  computed: int) -> CorruptStateError:
        return CorruptStateError(
            f"{what} block checksum mismatch ({NAMES[self.checksum_type]}: stored "
            f"{stored:#010x}, computed {computed:#010x}; block [{handle.offset}, "
            f"{handle.offset + handle.size}) and its trailer)", self.source, handle.offset)

    # -- footer and meta blocks ----------------------------------------------------------------

    def _read_footer(self) -> None:
        if self.size < _LEGACY_FOOTER:
            raise CorruptStateError(
                f"{self.size} bytes is too short for a table file (truncated?)", self.source, 0)
        tail = self._pread(self.size - _NEW_FOOTER, _NEW_FOOTER) if self.size >= _NEW_FOOTER \
            else b"\x00" * (_NEW_FOOTER - self.size) + self._pread(0, self.size)
        magic = _U64.unpack_from(tail, _NEW_FOOTER - 8)[0]
        self.checksum_type = CRC32C
        self._base_context = 0
        if magic == LEGACY_MAGIC:
            self.format_version = 0
            footer = tail[_NEW_FOOTER - _LEGACY_FOOTER :]
            self.metaindex_handle, pos = _read_handle(footer, 0, self.source)
            self.index_handle, _ = _read_handle(footer, pos, self.source)
            self._footer_start = self.size - _LEGACY_FOOTER
            self._checksum = checksum_function(CRC32C)
            return
        if magic != BLOCK_BASED_MAGIC:
            other = _OTHER_MAGICS.get(magic)
            if other:
                raise UnsupportedFormatError(f"{self.source}: {other} files are not supported; "
                                             "only block-based tables")
            raise CorruptStateError(
                f"bad table magic {magic:#018x} (not a RocksDB block-based table, or truncated)",
                self.source, self.size - 8)
        self.format_version = _U32.unpack_from(tail, _NEW_FOOTER - 12)[0]
        self.checksum_type = tail[0]
        self._footer_start = self.size - _NEW_FOOTER
        if self.format_version > 7:
            raise UnsupportedFormatError(
                f"{self.source}: table format_version {self.format_version} is not supported "
                "(supported: 0..7)")
        if self.checksum_type not in NAMES:
            raise CorruptStateError(
                f"corrupt or unsupported checksum type {self.checksum_type} in the footer "
                "(RocksDB writes 0..4)", self.source, self._footer_start)
        self._checksum = checksum_function(self.checksum_type)
        if self.format_version >= 6:
            if tail[1:5] != _EXTENDED_MAGIC:
                raise CorruptStateError("bad extended footer magic", self.source,
                                        self._footer_start + 1)
            self._check_footer(tail)
            metaindex_size = _U32.unpack_from(tail, 13)[0]
            self.metaindex_handle = BlockHandle(
                self._footer_start - metaindex_size - _BLOCK_TRAILER, metaindex_size)
            self.index_handle = BlockHandle(0, 0)  # from the metaindex
        else:
            self.metaindex_handle, pos = _read_handle(tail, 1, self.source)
            self.index_handle, _ = _read_handle(tail, pos, self.source)

    def _check_footer(self, tail: bytes) -> None:
        """The footer checksum of format_version 6+ (``Footer::DecodeFrom``): the checksum of
        the 53 footer bytes with the checksum field zeroed, plus the context of the footer's
        offset."""
        stored, base = struct.unpack_from("<II", tail, 5)
        self._base_context = base
        if base == 0:
            raise CorruptStateError("invalid base context checksum 0 in the footer", self.source,
                                    self._footer_start + 9)
        zeroed = tail[:5] + b"\0\0\0\0" + tail[9:]
        computed = self._checksum(zeroed, len(zeroed)) if self._checksum is not None else 0
        computed = (computed + context_modifier(base, self._footer_start)) & 0xFFFFFFFF
        if computed != stored:
            raise CorruptStateError(
                f"footer checksum mismatch ({NAMES[self.checksum_type]}: stored {stored:#010x}, "
                f"computed {computed:#010x})", self.source, self._footer_start)
        if _U64.unpack_from(tail, 33)[0]:
            raise UnsupportedFormatError(
                f"{self.source}: the table footer uses a RocksDB feature newer than format_version"
                f" {self.format_version} (reserved footer bytes are set)")

    def _read_properties(self, handle: BlockHandle) -> _Block:
        """The properties block, verified as RocksDB does (``ReadTablePropertiesHelper``): a
        table ingested with ``write_global_seqno`` had its global sequence number written into
        the block after its checksum was computed over zeros, so a mismatch is checked again
        with those 8 bytes zeroed."""
        raw = self._pread(handle.offset, handle.size + _BLOCK_TRAILER)
        if self._checksum is not None:
            stored, computed = self._checksums(raw, handle)
            if stored != computed and not self._global_seqno_written(raw, handle):
                raise self._mismatch("properties", handle, stored, computed)
        return self._decode_block(raw, handle)

    def _global_seqno_written(self, raw: bytes, handle: BlockHandle) -> bool:
        """True when the (uncompressed) properties block ``raw`` matches its checksum once the
        value of ``rocksdb.external_sst_file.global_seqno`` is zeroed."""
        if raw[handle.size] != 0:
            return False
        try:
            at = self._decode_block(raw, handle).value_offset(
                b"rocksdb.external_sst_file.global_seqno")
        except CorruptStateError:
            return False
        if at is None or at + 8 > handle.size:
            return False
        stored, computed = self._checksums(raw[:at] + bytes(8) + raw[at + 8 :], handle)
        return stored == computed

    def _read_meta(self) -> None:
        meta = self.read_block(self.metaindex_handle, what="metaindex")
        self.meta_blocks: dict[str, BlockHandle] = {}
        for key, value in meta.entries():
            handle, _ = _read_handle(value, 0, self.source)
            self.meta_blocks[key.decode("utf-8", "replace")] = handle
        if self.format_version >= 6:
            if "rocksdb.index" not in self.meta_blocks:
                raise CorruptStateError("format_version 6 table without an index handle",
                                        self.source, self.metaindex_handle.offset)
            self.index_handle = self.meta_blocks["rocksdb.index"]
        values: dict[str, int | bytes] = {}
        props = self.meta_blocks.get("rocksdb.properties")
        if props is not None:
            for key, value in self._read_properties(props).entries():
                name = key.decode("utf-8", "replace")
                if name in _INT_PROPERTIES:
                    values[name], _ = _varint(value, 0, self.source)
                else:
                    values[name] = value
        self.properties = TableProperties(values)
        comparator = self.properties.comparator
        if comparator and comparator not in ("leveldb.BytewiseComparator",
                                             "rocksdb.BytewiseComparator"):
            raise UnsupportedFormatError(
                f"{self.source}: comparator {comparator} is not supported "
                "(Flink uses leveldb.BytewiseComparator)")
        self._global_seqno = self.properties.global_seqno
        self._index: list[tuple[bytes, BlockHandle]] | None = None
        self._top_index: _Block | None = None

    @property
    def external(self) -> bool:
        """True for a table written by ``SstFileWriter`` and ingested (external file version
        >= 2): its entries carry sequence number 0 and take a global one."""
        v = self.properties.values.get("rocksdb.external_sst_file.version")
        return isinstance(v, bytes) and len(v) == 4 and _U32.unpack(v)[0] >= 2

    def apply_manifest_seqno(self, largest_seqno: int) -> None:
        """RocksDB's ``GetGlobalSequenceNumber`` given the MANIFEST's ``largest_seqno`` of this
        table: an ingested table whose file does not record its global sequence number (RocksDB
        writes it only with ``write_global_seqno``) takes the MANIFEST's; one that records a
        different one is corrupt."""
        if not self.external or largest_seqno <= 0:
            return
        if self._global_seqno is None:
            self._global_seqno = largest_seqno
        elif self._global_seqno != largest_seqno:
            raise CorruptStateError(
                f"ingested table has global sequence number {self._global_seqno}, its MANIFEST "
                f"says {largest_seqno}", self.source)

    # -- index ---------------------------------------------------------------------------------

    def _index_user_key(self, key: bytes) -> bytes:
        return key if self.properties.index_key_is_user_key else key[:-8]

    def _decode_index_value(self, value: bytes) -> BlockHandle:
        handle, _ = _read_handle(value, 0, self.source)
        return handle

    def data_block_handles(self) -> list[tuple[bytes, BlockHandle]]:
        """(separator user key, data block handle) for every data block, in order."""
        if self._index is None:
            delta = self.properties.index_value_is_delta_encoded
            index_type = self.properties.index_type
            if index_type not in (0, 1, 2, 3):
                raise UnsupportedFormatError(
                    f"{self.source}: index type {index_type} is not supported (supported: binary "
                    "search, hash search, two-level, binary search with first key)")
            top = self.read_block(self.index_handle, delta, first_keys=index_type == 3,
                                  what="index")
            out: list[tuple[bytes, BlockHandle]] = []
            user_key = self.properties.index_key_is_user_key
            if self.properties.index_type == 2:  # two-level: partitions of index entries
                for _, top_handle in top.handles():
                    part = self.read_block(top_handle, delta, what="index partition")
                    out += [(key if user_key else key[:-8], h) for key, h in part.all_handles()]
            else:
                # one compiled call: keys stripped and handles checked against the data's end
                compiled = compiled_module() if top.delta_values else None
                walked: list[tuple[bytes, BlockHandle]] | None = (
                    None if compiled is None else compiled.index_handles(
                    top.data, top.restarts[0] if top.restarts else top.limit, top.limit,
                    top.first_keys, BlockHandle, not user_key, self._footer_start))
                if walked is not None:
                    self._index = walked
                    return walked
                out = top.all_handles()
                if not user_key:
                    out = [(key[:-8], h) for key, h in out]
            for _, h in out:
                self._check_block(h)
            self._index = out
        return self._index

    def check_blocks(self) -> None:
        """The check a table passes before RocksDB opens it (``RocksDBState._restore``):
        RocksDB trusts a block whose checksum matches and can crash the process on a malformed
        one. Every index block is read and walked (each data block handle must lie inside the
        data, :meth:`data_block_handles`); every data block is read, its checksum verified,
        decompressed and its restart array checked (restart count, offsets inside the entry
        area), and the range-deletion block's entries are walked and typed. The metaindex and
        properties blocks are read, checked and walked when the table is opened.

        One compiled call per table (``_sst.check_data_blocks``) when the extension is built;
        the pure-Python loop over :meth:`read_block` otherwise (the reference: same verdicts,
        same errors, tests/backends/test_differential.py)."""
        self.check_index_blocks()
        self.check_data_blocks()

    def check_index_blocks(self) -> None:
        """The part of :meth:`check_blocks` RocksDB needs before it opens the table (it reads
        the index and the range-deletion block when it opens it): the index walked
        (:meth:`data_block_handles`) and the range tombstones read."""
        self.data_block_handles()
        self.range_deletions()

    def check_data_blocks(self) -> None:
        """The part of :meth:`check_blocks` RocksDB needs before it reads the table's data:
        every data block read, verified, inflated and its restart array checked."""
        handles = self.data_block_handles()
        compiled = compiled_module()
        if compiled is None:
            for _, h in handles:
                self.read_block(h)
        else:
            compiled.check_data_blocks(self._f.fileno(), handles, self.size, self._checksum,
                                       self._base_context, _decompress, self._mismatch,
                                       self.source, MAX_BLOCK_BYTES)

    def scan_args(self) -> tuple[Any, ...]:
        """What the compiled scan (``_sst.TableScan``) needs of this table: its descriptor,
        data block handles (:meth:`data_block_handles`), size, checksum, base context, the
        pure path's decompressor and mismatch error, name, block limit and global seqno."""
        return (self._f.fileno(), self.data_block_handles(), self.size, self._checksum,
                self._base_context, _decompress, self._mismatch, self.source, MAX_BLOCK_BYTES,
                self._global_seqno)

    def _check_block(self, h: BlockHandle) -> None:
        if h.offset + h.size + _BLOCK_TRAILER > self._footer_start:
            raise CorruptStateError(
                f"index points at block [{h.offset}, {h.offset + h.size}) past the data "
                "(truncated?)", self.source, h.offset)

    def _index_from(self, start: bytes | None) -> Iterable[tuple[bytes, BlockHandle]]:
        """(separator user key, handle) of the data blocks, from the first whose separator is
        >= ``start``. A single-level index not read yet is searched by its restart points and
        read lazily from there (a lookup reads a few index entries, not the whole index)."""
        if self._index is None and start is not None and self.properties.index_type in (0, 1, 3):
            return self._seek_index(start)
        index = self.data_block_handles()
        first = 0
        if start is not None:
            lo, hi = 0, len(index)
            while lo < hi:  # first block whose separator >= start
                mid = (lo + hi) // 2
                if index[mid][0] < start:
                    lo = mid + 1
                else:
                    hi = mid
            first = lo
        return index[first:]

    def _seek_index(self, start: bytes) -> Iterator[tuple[bytes, BlockHandle]]:
        top = self._top_index
        if top is None:
            top = self._top_index = self.read_block(
                self.index_handle, self.properties.index_value_is_delta_encoded,
                first_keys=self.properties.index_type == 3, what="index")
        user_key = self.properties.index_key_is_user_key
        restart = top.seek_restart(start, key_of=None if user_key else lambda k: k[:-8])
        for key, h in top.handles(restart):
            separator = key if user_key else key[:-8]
            if separator < start:
                continue
            self._check_block(h)
            yield separator, h

    # -- entries -------------------------------------------------------------------------------

    def _parse(self, key: bytes, value: bytes, offset: int) -> InternalEntry:
        if len(key) < 8:
            raise CorruptStateError(f"internal key of {len(key)} bytes", self.source, offset)
        trailer = _U64.unpack_from(key, len(key) - 8)[0]
        kind = trailer & 0xFF
        if kind not in _KNOWN_TYPES:
            what = _TYPE_NAMES.get(kind, f"value type {kind:#x}")
            raise UnsupportedFormatError(f"{self.source}: entries of kind {what} are not supported")
        seq = trailer >> 8
        if seq == 0 and self._global_seqno is not None:
            seq = self._global_seqno
        return InternalEntry(key[:-8], seq, kind, value)

    def entries(self, start: bytes | None = None, stop: bytes | None = None) -> Iterator[
            InternalEntry]:
        """Internal entries in key order whose user key is in ``[start, stop)`` (None: unbounded).

        Seeks with the index to the first data block that can hold ``start``.
        """
        for user_key, neg_seq, kind, value in self.tuples(start, stop):
            yield InternalEntry(user_key, -neg_seq, kind, value)

    def tuples(self, start: bytes | None = None, stop: bytes | None = None) -> Iterator[
            tuple[bytes, int, int, bytes]]:
        """:meth:`entries` as ``(user key, -seq, type, value)`` tuples: they sort like RocksDB's
        internal keys and cost less than :class:`InternalEntry` objects (the merge reader's hot
        path)."""
        global_seqno = self._global_seqno
        if _block_walk() is not None:
            for rows in self.blocks(start, stop):
                yield from rows
            return
        unpack = _U64.unpack_from
        known = _KNOWN_TYPES
        for _, handle in self._index_from(start):
            block = self.read_block(handle)
            restart = 0
            if start is not None and len(block.restarts) > 1:
                restart = block.seek_restart(start, key_of=lambda k: k[:-8])
            for key, value in block.entries(restart):
                n = len(key) - 8
                if n < 0:
                    raise CorruptStateError(f"internal key of {len(key)} bytes", self.source,
                                            handle.offset)
                trailer = unpack(key, n)[0]
                kind = trailer & 0xFF
                if kind not in known:
                    what = _TYPE_NAMES.get(kind, f"value type {kind:#x}")
                    raise UnsupportedFormatError(
                        f"{self.source}: entries of kind {what} are not supported")
                user_key = key[:n]
                if start is not None and user_key < start:
                    continue
                if stop is not None and user_key >= stop:
                    return
                seq = trailer >> 8
                if seq == 0 and global_seqno is not None:
                    seq = global_seqno
                yield user_key, -seq, kind, value

    def blocks(self, start: bytes | None = None, stop: bytes | None = None,
               match: tuple[bytes, int] | None = None) -> Iterator[
            list[tuple[bytes, int, int, bytes]]]:
        """:meth:`tuples`, one list per data block (the compiled block walk; needs it);
        ``match = (bytes, offset)`` keeps only user keys holding those bytes at that offset."""
        walk = _block_walk()
        if walk is None:
            raise RuntimeError("the compiled SST block walk is not available")
        global_seqno = self._global_seqno
        for _, handle in self._index_from(start):
            block = self.read_block(handle)
            restart = 0
            if start is not None and len(block.restarts) > 1:
                restart = block.seek_restart(start, key_of=lambda k: k[:-8])
            rows, done = walk(block.data, block.restarts[restart], block.limit, start, stop,
                              global_seqno, self.source, block.base,
                              *(match if match is not None else ()))
            yield rows
            if done:
                return

    def range_deletions(self) -> list[tuple[bytes, bytes, int]]:
        """Range tombstones ``(start, end_exclusive, seq)`` of the ``rocksdb.range_del`` block."""
        handle = self.meta_blocks.get("rocksdb.range_del")
        if handle is None:
            return []
        out = []
        for key, value in self.read_block(handle, what="range deletion").entries():
            if len(key) < 8:
                raise CorruptStateError("short range tombstone key", self.source, handle.offset)
            trailer = _U64.unpack_from(key, len(key) - 8)[0]
            if trailer & 0xFF != TYPE_RANGE_DELETION:
                raise CorruptStateError("range_del block entry is not a range deletion",
                                        self.source, handle.offset)
            seq = trailer >> 8
            if seq == 0 and self._global_seqno is not None:
                seq = self._global_seqno
            out.append((key[:-8], value, seq))
        return out


# -- merge semantics ---------------------------------------------------------------------------


def merge_entries(
    entries: Iterable[InternalEntry], delimiter: bytes = b","
) -> bytes | None:
    """Resolve one user key's internal entries (any order) the way RocksDB reads it.

    Newest first: merge operands are collected until a Put (base value) or a deletion (no base);
    the result is ``base, op1, op2, ...`` joined by ``delimiter`` in sequence order
    (``StringAppendTESTOperator``). Returns None when the key is deleted or absent.
    """
    ordered = sorted(entries, key=lambda e: e.seq, reverse=True)
    operands: list[bytes] = []
    base: bytes | None = None
    for e in ordered:
        if e.type == TYPE_MERGE:
            operands.append(e.value)
            continue
        if e.type == TYPE_VALUE:
            base = e.value
        break  # a Put or a (single) deletion ends the chain
    if not operands:
        return base
    operands.reverse()
    if base is not None:
        operands.insert(0, base)
    return delimiter.join(operands)


def _covered(tombstones: list[tuple[bytes, bytes, int]], key: bytes) -> int:
    """The highest sequence number of a range tombstone covering ``key`` (-1 if none)."""
    best = -1
    for start, end, seq in tombstones:
        if start <= key < end and seq > best:
            best = seq
    return best


def _tuples_of(table: Any, start: bytes | None, stop: bytes | None) -> Iterator[
        tuple[bytes, int, int, bytes]]:
    fast = getattr(table, "tuples", None)
    if fast is not None:
        return fast(start, stop)  # type: ignore[no-any-return]
    return ((e.user_key, -e.seq, e.type, e.value) for e in table.entries(start, stop))


def merged_entries(
    tables: Iterable[SstFile],
    start: bytes | None = None,
    stop: bytes | None = None,
    delimiter: bytes = b",",
    match: tuple[bytes, int] | None = None,
) -> Iterator[tuple[bytes, bytes]]:
    """Live (user key, value) pairs of one column family given all its table files.

    Entries of every table in ``[start, stop)`` are merged in key order; for each user key the
    internal entries of all tables are resolved by sequence number (as :func:`merge_entries`
    does), after dropping those covered by a newer range tombstone. Deleted keys are skipped.
    ``match = (bytes, offset)`` keeps only user keys holding those bytes at that offset (a
    lookup's timers: the key after the timestamp), filtered before merging: every version of a
    user key shares it, so the merge rules are unchanged.
    """
    tables = list(tables)
    tombstones = [t for table in tables for t in table.range_deletions()]
    if not tombstones and _block_walk() is not None and all(
            isinstance(t, SstFile) for t in tables):
        assert _compiled is not None  # the compiled merge: no generator frame per pair
        return iter(_compiled.MergedPairs([t.blocks(start, stop, match) for t in tables],
                                          delimiter))
    return _merged(tables, tombstones, start, stop, delimiter, match)


CHUNK_BYTES = 1 << 20  # about how many bytes of entries one compiled scan chunk holds


def table_scan(tables: Iterable[SstFile], start: bytes, stop: bytes, prefix_len: int,
               delimiter: bytes = b",", chunk_bytes: int = CHUNK_BYTES) -> Any:
    """The compiled scan of one column family's tables (``_sst.TableScan``: the live pairs of
    ``[start, stop)`` packed per key group for ``_read.feed_packed``, as :func:`merged_entries`
    reads them), or None when it does not apply: the extension is not built or turned off, or
    a table holds range tombstones (:func:`merged_entries` and RocksDB read those)."""
    compiled = compiled_module()
    if compiled is None or not hasattr(compiled, "TableScan"):
        return None
    tables = list(tables)
    if any(t.range_deletions() for t in tables):
        return None
    return compiled.TableScan([t.scan_args() for t in tables], start, stop, prefix_len,
                              delimiter, chunk_bytes)


def scanned_pairs(scan: Any) -> Iterator[tuple[bytes, bytes]]:
    """The ``(key, value)`` pairs of a :func:`table_scan`, chunk after chunk."""
    assert _compiled is not None
    while True:
        kg, _n, buf, _ends = scan.next_chunk()
        if kg < 0:
            return
        yield from _compiled.unpack_chunk(buf)


def _merged(
    tables: list[Any],
    tombstones: list[tuple[bytes, bytes, int]],
    start: bytes | None,
    stop: bytes | None,
    delimiter: bytes,
    match: tuple[bytes, int] | None = None,
) -> Iterator[tuple[bytes, bytes]]:
    """The pure-Python :func:`merged_entries`."""
    iters = [_tuples_of(table, start, stop) for table in tables]
    if match is not None:
        sub, at = match
        iters = [(t for t in it if t[0].startswith(sub, at)) for it in iters]
    # (user key, -seq, ...) tuples order like RocksDB's internal key comparator
    merged: Iterator[tuple[bytes, int, int, bytes]] = (
        iters[0] if len(iters) == 1 else heapq.merge(*iters))

    def resolve(group: list[tuple[bytes, int, int, bytes]]) -> bytes | None:
        """One user key's entries, newest first -> its value (None: deleted)."""
        if tombstones:
            cut = _covered(tombstones, group[0][0])
            if cut >= 0:
                group = [e for e in group if -e[1] > cut]
        operands: list[bytes] = []
        base: bytes | None = None
        for _, _, kind, value in group:
            if kind == TYPE_MERGE:
                operands.append(value)
                continue
            if kind == TYPE_VALUE:
                base = value
            break  # a Put or a (single) deletion ends the chain
        if not operands:
            return base
        operands.reverse()
        if base is not None:
            operands.insert(0, base)
        return delimiter.join(operands)

    current = b""
    group: list[tuple[bytes, int, int, bytes]] = []
    simple = not tombstones
    for entry in merged:
        if group and entry[0] == current:
            group.append(entry)
            continue
        if group:
            if simple and len(group) == 1:  # the common case: a lone Put or merge operand
                kind = group[0][2]
                if kind == TYPE_VALUE or kind == TYPE_MERGE:
                    yield current, group[0][3]
            else:
                value = resolve(group)
                if value is not None:
                    yield current, value
        current = entry[0]
        group = [entry]
    if group:
        value = resolve(group)
        if value is not None:
            yield current, value
