"""RocksDB's checksums: block trailers and footers of table files, records of log files.

RocksDB (``table/format.cc``, ``table/block_based/reader_common.cc``, ``util/crc32c.h``,
``db/log_writer.cc``) stores a 32-bit checksum of one of four kinds, named by the table footer's
checksum type:

* ``kCRC32c`` (1): CRC-32C, *masked* (``crc32c::Mask``: rotated right by 15 bits plus
  ``0xa282ead8``), the only kind of log records and of legacy-footer tables;
* ``kxxHash`` (2): XXH32, seed 0;
* ``kxxHash64`` (3): the low 32 bits of XXH64, seed 0;
* ``kXXH3`` (4): the low 32 bits of XXH3-64 of all bytes but the last, xor the last byte times
  ``0x6b9083d9`` (``ModifyChecksumForLastByte``; 0 for empty input).

A block's checksum covers the block bytes as stored (compressed) and the compression-type byte
after them; from format_version 6 the stored value also has a *context* added: the footer's
``base_context_checksum`` xor (low + high 32 bits of the block's file offset)
(``ChecksumModifierForContext``), so a block copied to another offset fails too.

The hashes come from ``google-crc32c`` (or ``crc32c``) and ``xxhash``, both in the ``rocksdb``
extra: a missing one is a :class:`~statequery.exceptions.MissingExtraError`.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from statequery.exceptions import MissingExtraError

__all__ = [
    "CRC32C",
    "NAMES",
    "NO_CHECKSUM",
    "XXH3",
    "XXHASH",
    "XXHASH64",
    "block_checksum",
    "checksum_function",
    "context_modifier",
    "crc32c",
    "mask",
    "masked_crc32c",
    "require",
]

NO_CHECKSUM, CRC32C, XXHASH, XXHASH64, XXH3 = 0, 1, 2, 3, 4
NAMES = {NO_CHECKSUM: "none", CRC32C: "crc32c", XXHASH: "xxHash", XXHASH64: "xxHash64",
         XXH3: "XXH3"}

_M32 = 0xFFFFFFFF
_MASK_DELTA = 0xA282EAD8
_LAST_BYTE_PRIME = 0x6B9083D9
_FEATURE = "verifying RocksDB checksums (RocksDB native state)"

_crc: Callable[[bytes], int] | None = None
_xxhash: ModuleType | None = None


def _load_crc() -> Callable[[bytes], int]:
    """google-crc32c's CRC-32C (Apache-2.0, in the ``rocksdb`` extra); the ``crc32c`` package
    when google-crc32c is absent or runs without its C extension (pure Python, much slower)."""
    global _crc
    if _crc is None:
        found: Callable[[bytes], int] | None = None
        try:
            import google_crc32c

            found = google_crc32c.value
            if getattr(google_crc32c, "implementation", "c") == "c":
                _crc = found
                return found
        except ImportError:
            pass
        try:
            import crc32c as _mod

            found = _mod.crc32c
        except ImportError:
            if found is None:
                raise MissingExtraError(_FEATURE, "google-crc32c", "rocksdb") from None
        _crc = found
    return _crc


def _load_xxhash() -> ModuleType:
    global _xxhash
    if _xxhash is None:
        try:
            import xxhash
        except ImportError:
            raise MissingExtraError(_FEATURE, "xxhash", "rocksdb") from None
        _xxhash = xxhash
    return _xxhash


def require() -> None:
    """Raise :class:`MissingExtraError` unless both hash packages can be imported."""
    _load_crc()
    _load_xxhash()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``."""
    return _load_crc()(data)


def mask(crc: int) -> int:
    """``crc32c::Mask``: how RocksDB stores a CRC-32C."""
    return ((((crc >> 15) | (crc << 17)) & _M32) + _MASK_DELTA) & _M32


def masked_crc32c(data: bytes) -> int:
    return mask(_load_crc()(data))


def checksum_function(kind: int) -> Callable[[bytes, int], int] | None:
    """``ComputeBuiltinChecksum`` of checksum type ``kind`` as a function of ``(buf, n)``: the
    checksum of ``buf[:n]`` (``buf`` bytes or any byte buffer, e.g. a memoryview). None for
    ``kNoChecksum`` and unknown types (the caller names them)."""
    if kind == CRC32C:
        crc = _load_crc()
        # any buffer (the compiled table scan hands a view of its read buffer); google-crc32c
        # takes bytes only: bytes(b) of bytes is b itself, no copy
        return lambda buf, n: mask(crc(bytes(buf[:n])))
    if kind in (XXHASH, XXHASH64, XXH3):
        xx = _load_xxhash()
        if kind == XXHASH:
            h32 = xx.xxh32_intdigest
            return lambda buf, n: h32(memoryview(buf)[:n])
        if kind == XXHASH64:
            h64 = xx.xxh64_intdigest
            return lambda buf, n: h64(memoryview(buf)[:n]) & _M32
        h3 = xx.xxh3_64_intdigest

        def xxh3(buf: bytes, n: int) -> int:
            if n <= 0:
                return 0  # RocksDB's special case: no last byte
            v: int = h3(memoryview(buf)[: n - 1]) & _M32
            return v ^ ((buf[n - 1] * _LAST_BYTE_PRIME) & _M32)

        # the compiled table scan computes the same from the digest itself (no call of this
        # function, no view made per block): _sst._TableCursor._load
        xxh3.xxh3_64 = h3  # type: ignore[attr-defined]
        return xxh3
    return None


def block_checksum(kind: int, data: bytes) -> int:
    """``ComputeBuiltinChecksum(kind, data)`` (a block's: its bytes and the compression byte)."""
    fn = checksum_function(kind)
    return 0 if fn is None else fn(data, len(data))


def context_modifier(base_context_checksum: int, offset: int) -> int:
    """``ChecksumModifierForContext``: what format_version 6+ adds to the checksum of the block
    at ``offset`` (0 when the table has no base context checksum)."""
    if not base_context_checksum:
        return 0
    return (base_context_checksum ^ (((offset & _M32) + (offset >> 32)) & _M32)) & _M32
