"""A reader of RocksDB ``MANIFEST`` files: the live table files of every column family.

Why: a cold single-key lookup should fetch only the tables that can hold the key. The MANIFEST
says, per column family, which table files are live and each one's size, level, smallest and
largest internal key and sequence-number range; :func:`read_manifest` replays it into a
:class:`Manifest` (RocksDB ``VersionSet::Recover`` without the files).

Format (RocksDB ``db/log_format.h``, ``db/log_reader.cc``, ``db/version_edit.{h,cc}``):

* **Log**: 32 KiB blocks of records; header ``uint32 masked crc32c, uint16 length, uint8 type``
  (recyclable types 5..8 add a ``uint32`` log number); types FULL 1, FIRST 2, MIDDLE 3, LAST 4
  (a record split across blocks); a block tail shorter than a header is zero padding; type 0 is
  preallocated space (the end).
* **VersionEdit** (one per record): ``varint32 tag`` fields. Comparator 1, log number 2, next
  file number 3, last sequence 4, compact cursor 5 (level, internal key), deleted file 6 (level,
  number), new file 7 / 100 / 102 / 103 (level, number, [path id,] size, smallest and largest
  internal keys, [smallest and largest seqno,] [custom fields until tag 1]), prev log number 9,
  min log number to keep 10, column family 200 (id), column family add 201 (name), drop 202, max
  column family 203, atomic group 300; tags with bit ``1 << 13`` are length-prefixed and
  ignorable.

Every physical record's checksum is verified before its payload is used: the masked CRC-32C of
the type byte, the log number of a recyclable record, and the payload
(``log::Writer::EmitPhysicalRecord``). Lengths and fields are bounds-checked, and
:class:`~statequery.backends.rocksdb.RocksDBState` checks the result against the state handle
(every live table named, with its size). Bad input raises
:class:`~statequery.exceptions.CorruptStateError` naming the file and the record's offset.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from statequery.backends.checksums import masked_crc32c
from statequery.exceptions import CorruptStateError, UnsupportedFormatError

__all__ = ["Manifest", "TableMeta", "read_manifest", "table_file_name"]

_BLOCK = 32768
_HEADER = 7
_RECYCLABLE_HEADER = 11
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4

_TAG_COMPARATOR = 1
_TAG_LOG_NUMBER = 2
_TAG_NEXT_FILE = 3
_TAG_LAST_SEQUENCE = 4
_TAG_COMPACT_CURSOR = 5
_TAG_DELETED_FILE = 6
_TAG_NEW_FILE = 7
_TAG_PREV_LOG_NUMBER = 9
_TAG_MIN_LOG_TO_KEEP = 10
_TAG_NEW_FILE2 = 100
_TAG_NEW_FILE3 = 102
_TAG_NEW_FILE4 = 103
_TAG_COLUMN_FAMILY = 200
_TAG_CF_ADD = 201
_TAG_CF_DROP = 202
_TAG_MAX_CF = 203
_TAG_ATOMIC_GROUP = 300
_TAG_BLOB_ADD = 400
_TAG_BLOB_GARBAGE = 401
_TAG_SAFE_IGNORE = 1 << 13

_CUSTOM_TERMINATE = 1
_CUSTOM_NON_SAFE_IGNORE = 1 << 6
_CUSTOM_PATH_ID = _CUSTOM_NON_SAFE_IGNORE + 1

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class TableMeta:
    """One live table file as the MANIFEST describes it (``FileMetaData``)."""

    number: int
    column_family: str
    level: int
    size: int
    smallest: bytes  # internal keys: user key + 8-byte (seq << 8 | type)
    largest: bytes
    smallest_seqno: int = 0
    largest_seqno: int = 0

    @property
    def name(self) -> str:
        return table_file_name(self.number)

    @property
    def smallest_user_key(self) -> bytes:
        return self.smallest[:-8]

    @property
    def largest_user_key(self) -> bytes:
        return self.largest[:-8]

    def overlaps(self, start: bytes, stop: bytes | None) -> bool:
        """True when user keys in ``[start, stop)`` can lie in this table (its smallest and
        largest user keys are inclusive bounds; range tombstones are within them)."""
        return self.largest_user_key >= start and (stop is None or self.smallest_user_key < stop)


def table_file_name(number: int) -> str:
    """RocksDB's name of table file ``number`` (``MakeTableFileName``: ``%06llu.sst``)."""
    return f"{number:06d}.sst"


@dataclass
class Manifest:
    """The state a MANIFEST replays to: column families and their live tables."""

    column_families: dict[int, str] = field(default_factory=lambda: {0: "default"})
    tables: dict[int, TableMeta] = field(default_factory=dict)  # by file number
    comparator: str = ""
    last_sequence: int = 0

    def tables_of(self, column_family: str) -> list[TableMeta]:
        return [t for t in self.tables.values() if t.column_family == column_family]


class _Input:
    __slots__ = ("buf", "end", "pos", "source", "base")

    def __init__(self, buf: bytes, source: str, base: int) -> None:
        self.buf = buf
        self.pos = 0
        self.end = len(buf)
        self.source = source
        self.base = base  # file offset of the record (for errors)

    def fail(self, what: str) -> CorruptStateError:
        return CorruptStateError(f"MANIFEST record: bad {what}", self.source, self.base)

    def varint(self, what: str) -> int:
        buf, pos, end = self.buf, self.pos, self.end
        result = shift = 0
        while True:
            if pos >= end or shift > 63:
                raise self.fail(what)
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                self.pos = pos
                return result
            shift += 7

    def slice(self, what: str) -> bytes:
        n = self.varint(what)
        if self.pos + n > self.end:
            raise self.fail(what)
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def internal_key(self, what: str) -> bytes:
        key = self.slice(what)
        if len(key) < 8:
            raise self.fail(what)
        return key


def _records(data: bytes, source: str) -> list[tuple[int, bytes]]:
    """The logical records of a log file: (file offset, payload)."""
    out: list[tuple[int, bytes]] = []
    pending: list[bytes] | None = None
    start = 0
    pos = 0
    n = len(data)
    while pos < n:
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:
            pos += left  # trailer: zero padding
            continue
        if pos + _HEADER > n:
            raise CorruptStateError("MANIFEST ends inside a record header (truncated?)", source,
                                    pos)
        length = _U16.unpack_from(data, pos + 4)[0]
        kind = data[pos + 6]
        header = _HEADER
        if kind == 0 and length == 0:
            break  # preallocated, never written
        if 5 <= kind <= 8:
            header = _RECYCLABLE_HEADER
            kind -= 4
        elif kind > 8:
            raise UnsupportedFormatError(f"{source}: MANIFEST record type {kind} at offset {pos} "
                                         "is not supported (compressed log?)")
        body = pos + header
        if header > left or body + length > pos + left or body + length > n:
            raise CorruptStateError(
                f"MANIFEST record of {length} bytes runs past its block or the file "
                "(truncated?)", source, pos)
        stored = _U32.unpack_from(data, pos)[0]
        computed = masked_crc32c(data[pos + 6 : body + length])  # type, [log number,] payload
        if computed != stored:
            raise CorruptStateError(
                f"MANIFEST record checksum mismatch (crc32c: stored {stored:#010x}, computed "
                f"{computed:#010x}; record of {length} bytes)", source, pos)
        payload = data[body : body + length]
        if kind == _FULL:
            if pending is not None:
                raise CorruptStateError("MANIFEST record starts inside a fragmented record",
                                        source, pos)
            out.append((pos, payload))
        elif kind == _FIRST:
            if pending is not None:
                raise CorruptStateError("MANIFEST record starts inside a fragmented record",
                                        source, pos)
            pending, start = [payload], pos
        elif kind in (_MIDDLE, _LAST):
            if pending is None:
                raise CorruptStateError("MANIFEST record fragment without its first part",
                                        source, pos)
            pending.append(payload)
            if kind == _LAST:
                out.append((start, b"".join(pending)))
                pending = None
        else:
            raise CorruptStateError(f"MANIFEST record type {kind}", source, pos)
        pos = body + length
    if pending is not None:
        raise CorruptStateError("MANIFEST ends inside a fragmented record (truncated?)", source,
                                start)
    return out


def _new_file(inp: _Input, tag: int, cf: str) -> TableMeta:
    level = inp.varint("level")
    number = inp.varint("file number")
    if tag == _TAG_NEW_FILE3:
        inp.varint("path id")
    size = inp.varint("file size")
    smallest = inp.internal_key("smallest key")
    largest = inp.internal_key("largest key")
    smallest_seqno = largest_seqno = 0
    if tag != _TAG_NEW_FILE:
        smallest_seqno = inp.varint("smallest seqno")
        largest_seqno = inp.varint("largest seqno")
    if tag == _TAG_NEW_FILE4:
        while True:
            custom = inp.varint("custom field tag")
            if custom == _CUSTOM_TERMINATE:
                break
            value = inp.slice("custom field")
            if custom == _CUSTOM_PATH_ID:
                if value not in (b"\x00", b""):
                    raise UnsupportedFormatError(
                        f"{inp.source}: table {number} lives in db_paths[{value[0]}]; only one "
                        "data path is supported")
            elif custom & _CUSTOM_NON_SAFE_IGNORE:
                raise UnsupportedFormatError(
                    f"{inp.source}: MANIFEST new-file field {custom} is not supported")
    return TableMeta(number, cf, level, size, smallest, largest, smallest_seqno, largest_seqno)


def read_manifest(data: bytes, source: str = "<MANIFEST>") -> Manifest:
    """Replay the VersionEdits of a MANIFEST's bytes into its live column families and tables."""
    m = Manifest()
    cf_of_id = m.column_families
    for offset, record in _records(data, source):
        inp = _Input(record, source, offset)
        cf_id = 0
        added: str | None = None
        dropped = False
        deleted: list[int] = []
        new: list[tuple[int, _Input, int]] = []  # parsed after the column family is known
        while inp.pos < inp.end:
            tag = inp.varint("tag")
            if tag in (_TAG_COMPARATOR,):
                m.comparator = inp.slice("comparator").decode("utf-8", "replace")
            elif tag in (_TAG_LOG_NUMBER, _TAG_NEXT_FILE, _TAG_PREV_LOG_NUMBER,
                         _TAG_MIN_LOG_TO_KEEP):
                inp.varint("log/file number")
            elif tag == _TAG_LAST_SEQUENCE:
                m.last_sequence = inp.varint("last sequence")
            elif tag == _TAG_COMPACT_CURSOR:
                inp.varint("level")
                inp.internal_key("compact cursor")
            elif tag == _TAG_DELETED_FILE:
                inp.varint("level")
                deleted.append(inp.varint("deleted file number"))
            elif tag in (_TAG_NEW_FILE, _TAG_NEW_FILE2, _TAG_NEW_FILE3, _TAG_NEW_FILE4):
                new.append((tag, inp, inp.pos))
                _new_file(inp, tag, "")  # skip it now (validates the fields)
            elif tag == _TAG_COLUMN_FAMILY:
                cf_id = inp.varint("column family id")
            elif tag == _TAG_CF_ADD:
                added = inp.slice("column family name").decode("utf-8", "replace")
            elif tag == _TAG_CF_DROP:
                dropped = True
            elif tag in (_TAG_MAX_CF, _TAG_ATOMIC_GROUP):
                inp.varint("column family count / atomic group size")
            elif tag in (_TAG_BLOB_ADD, _TAG_BLOB_GARBAGE):
                raise UnsupportedFormatError(f"{source}: blob files (BlobDB) are not supported")
            elif tag & _TAG_SAFE_IGNORE:
                inp.slice(f"ignorable field {tag}")
            else:
                raise CorruptStateError(f"MANIFEST record: unknown tag {tag}", source, offset)
        if added is not None:
            cf_of_id[cf_id] = added
        if cf_id not in cf_of_id:
            raise CorruptStateError(f"MANIFEST names column family id {cf_id} before adding it",
                                    source, offset)
        cf = cf_of_id[cf_id]
        if dropped:
            del cf_of_id[cf_id]
            m.tables = {k: t for k, t in m.tables.items() if t.column_family != cf}
            continue
        for number in deleted:
            m.tables.pop(number, None)
        for tag, _, pos in new:
            inp.pos = pos
            t = _new_file(inp, tag, cf)
            m.tables[t.number] = t
    return m
