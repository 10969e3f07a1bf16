# cython: language_level=3, cdivision=True
# (boundscheck, wraparound: set by setup.py, off unless STATEQUERY_BOUNDSCHECK=1)
"""Compiled twin of the hot loop of :mod:`statequery.backends.sst`: one data block's entries as
``(user key, -seq, type, value)`` tuples (:meth:`statequery.backends.sst.SstFile.tuples`), with
the pure-Python path's checks and error messages; the k-way merge of several tables
(``MergedPairs``); and ``CheckedPairs``, which checks rocksdict's pairs when they end (see
``RocksDBState._pairs``). Blocks reach the walk already verified against their checksums
(``SstFile.read_block``). And the check a table passes before RocksDB opens it
(``SstFile.check_blocks``): ``index_handles`` (an index block walked whole) and
``check_data_blocks`` (every data block read, verified, inflated and its restart array checked),
with the pure path's verdicts and errors. And ``TableScan``: a column family's tables read, merged
and resolved whole in C, one key group's live entries packed per call for ``_read.feed_packed``
(the RocksDB full scan; see docs/rocksdb.md). Optional: built by setup.py when a C compiler is
present;
``STATEQUERY_PURE_PYTHON=1`` turns it off (see :mod:`statequery.backends.fastpath`).
"""

from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcmp, memcpy

from libc.errno cimport EINTR, errno
from posix.unistd cimport pread

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.exc cimport PyErr_CheckSignals, PyErr_SetFromErrno
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE

from statequery.exceptions import CorruptStateError, UnsupportedFormatError


cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void* op)
    int _gc_is_tracked "PyObject_GC_IsTracked" (object op)

_TYPE_NAMES = {0x11: "blob index (BlobDB)", 0x16: "wide-column entity",
               0x18: "value with preferred seqno"}


cdef inline int _cmp(const uint8_t* a, Py_ssize_t na, bytes b) noexcept:
    """memcmp-order comparison of a[:na] with b: <0, 0, >0."""
    cdef Py_ssize_t nb = PyBytes_GET_SIZE(b)
    cdef Py_ssize_t n = na if na < nb else nb
    cdef int c = memcmp(a, PyBytes_AS_STRING(b), n)
    if c != 0:
        return c
    if na < nb:
        return -1
    return 1 if na > nb else 0


cdef inline Py_ssize_t _varint32(const uint8_t* p, Py_ssize_t pos, Py_ssize_t limit,
                                 uint64_t* out) noexcept:
    """Decode a varint at pos; returns the next position, or -1 when malformed."""
    cdef uint64_t result = 0
    cdef int shift = 0
    cdef uint8_t b
    while True:
        if pos >= limit or shift > 63:
            return -1
        b = p[pos]
        pos += 1
        result |= (<uint64_t>(b & 0x7F)) << shift
        if b < 0x80:
            out[0] = result
            return pos
        shift += 7


def block_tuples(bytes data, Py_ssize_t pos, Py_ssize_t limit, start, stop, global_seqno,
                 str source, Py_ssize_t base, bytes match=None, Py_ssize_t match_at=0):
    """Entries of a data block from ``pos`` (a restart offset) to ``limit`` (where the restart
    array begins) whose user key is in ``[start, stop)`` (None: unbounded), as a list of
    ``(user key, -seq, type, value)``, and whether an entry at or past ``stop`` ended the walk.
    ``match``: only user keys holding these bytes at offset ``match_at`` (no tuple is made for
    the others).
    """
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    cdef uint64_t shared, non_shared, value_len, trailer, seq
    cdef Py_ssize_t keylen = 0, cap = 0, end_key, end, ulen
    cdef uint8_t* key = NULL
    cdef uint8_t* grown
    cdef int kind
    cdef bint has_start = start is not None, has_stop = stop is not None
    cdef bint has_global = global_seqno is not None
    cdef bint has_match = match is not None
    cdef Py_ssize_t mlen = PyBytes_GET_SIZE(match) if has_match else 0
    cdef const char* mptr = PyBytes_AS_STRING(match) if has_match else NULL
    cdef uint64_t gseq = global_seqno if has_global else 0
    cdef list out = []
    if limit > n:
        raise CorruptStateError("block entry runs past the block", source, base + pos)
    try:
        while pos < limit:
            if pos + 3 <= limit and (p[pos] | p[pos + 1] | p[pos + 2]) < 0x80:
                shared = p[pos]
                non_shared = p[pos + 1]
                value_len = p[pos + 2]
                pos += 3
            else:
                pos = _varint32(p, pos, limit, &shared)
                if pos >= 0:
                    pos = _varint32(p, pos, limit, &non_shared)
                if pos >= 0:
                    pos = _varint32(p, pos, limit, &value_len)
                if pos < 0:
                    raise CorruptStateError("malformed varint", source, base)
            end_key = pos + <Py_ssize_t>non_shared
            end = end_key + <Py_ssize_t>value_len
            # all unsigned: a 10-byte varint can hold 2**64 - 1, which as a Py_ssize_t is -1
            if non_shared > <uint64_t>limit or value_len > <uint64_t>limit or end > limit \
                    or shared > <uint64_t>keylen:
                raise CorruptStateError("block entry runs past the block", source, base + pos)
            if <Py_ssize_t>(shared + non_shared) > cap:
                cap = <Py_ssize_t>(shared + non_shared) * 2 + 64
                grown = <uint8_t*>realloc(key, cap)
                if grown == NULL:
                    raise MemoryError()
                key = grown
            if non_shared:  # never memcpy to NULL (no key bytes yet), not even 0 bytes: UB
                memcpy(key + shared, p + pos, non_shared)
            keylen = <Py_ssize_t>(shared + non_shared)
            pos = end
            ulen = keylen - 8
            if ulen < 0:
                raise CorruptStateError(f"internal key of {keylen} bytes", source, base)
            trailer = 0
            for i in range(7, -1, -1):
                trailer = (trailer << 8) | key[ulen + i]
            kind = trailer & 0xFF
            if kind != 0 and kind != 1 and kind != 2 and kind != 7:
                what = _TYPE_NAMES.get(kind, f"value type {kind:#x}")
                raise UnsupportedFormatError(f"{source}: entries of kind {what} are not supported")
            if has_start and _cmp(key, ulen, start) < 0:
                continue
            if has_stop and _cmp(key, ulen, stop) >= 0:
                return out, True
            if has_match and (ulen < match_at + mlen
                              or memcmp(key + match_at, mptr, mlen) != 0):
                continue
            seq = trailer >> 8
            if seq == 0 and has_global:
                seq = gseq
            out.append((PyBytes_FromStringAndSize(<char*>key, ulen), -<long long>seq, kind,
                        PyBytes_FromStringAndSize(<char*>p + end_key, end - end_key)))
        return out, False
    finally:
        free(key)


cdef inline int _entry_cmp(tuple a, tuple b) except? -2:
    """Order of two ``(user key, -seq, ...)`` tuples: user key bytewise, then -seq."""
    cdef bytes ka = <bytes>a[0]
    cdef bytes kb = <bytes>b[0]
    cdef int c = _cmp(<const uint8_t*>PyBytes_AS_STRING(ka), PyBytes_GET_SIZE(ka), kb)
    if c != 0:
        return c
    cdef long long sa = a[1], sb = b[1]
    return -1 if sa < sb else (1 if sa > sb else 0)


cdef class MergedPairs:
    """Live ``(user key, value)`` pairs of several tables' entries (each source an iterator of
    lists of ``(user key, -seq, type, value)`` in internal-key order, e.g. one list per data
    block): merged in internal-key order, each user key resolved newest first (merge operands
    collected until a Put or a deletion, joined by ``delimiter`` oldest first; deleted keys
    skipped). The compiled twin of :func:`statequery.backends.sst.merged_entries` without range
    tombstones."""

    cdef list sources
    cdef list lists
    cdef list pos
    cdef bytes delimiter

    def __init__(self, sources, bytes delimiter=b","):
        self.sources = [iter(s) for s in sources]
        self.lists = []
        self.pos = []
        self.delimiter = delimiter
        for i in range(len(self.sources)):
            self.lists.append(None)
            self.pos.append(0)
            self._refill(i)

    cdef bint _refill(self, Py_ssize_t i) except -1:
        """Make source i's current list non-empty; False when it is exhausted."""
        cdef object lst
        while True:
            lst = next(self.sources[i], None)
            if lst is None:
                self.lists[i] = None
                return False
            if len(<list>lst):
                self.lists[i] = lst
                self.pos[i] = 0
                return True

    cdef tuple _head(self, Py_ssize_t i):
        cdef object lst = self.lists[i]
        if lst is None:
            return None
        return <tuple>(<list>lst)[<Py_ssize_t>self.pos[i]]

    cdef int _advance(self, Py_ssize_t i) except -1:
        cdef Py_ssize_t p = <Py_ssize_t>self.pos[i] + 1
        if p < len(<list>self.lists[i]):
            self.pos[i] = p
        else:
            self._refill(i)
        return 0

    cdef Py_ssize_t _smallest(self) except? -2:
        cdef Py_ssize_t best = -1, i, n = len(self.lists)
        cdef tuple h, bh = None
        for i in range(n):
            h = self._head(i)
            if h is None:
                continue
            if bh is None or _entry_cmp(h, bh) < 0:
                best, bh = i, h
        return best

    def __iter__(self):
        return self

    def __next__(self):
        cdef Py_ssize_t i
        cdef tuple e, first
        cdef bytes key
        cdef object base
        cdef list operands
        cdef int kind
        cdef bint done
        while True:
            i = self._smallest()
            if i < 0:
                raise StopIteration
            first = self._head(i)
            self._advance(i)
            key = <bytes>first[0]
            operands = None
            base = None
            done = False
            e = first
            while True:  # e is the newest unseen entry of `key`
                if not done:
                    kind = e[2]
                    if kind == 2:
                        if operands is None:
                            operands = []
                        operands.append(e[3])
                    else:
                        if kind == 1:
                            base = e[3]
                        done = True  # a Put or a (single) deletion ends the chain
                i = self._smallest()
                if i < 0:
                    break
                e = self._head(i)
                if <bytes>e[0] != key:
                    break
                self._advance(i)
            if operands is None:
                if base is None:
                    continue  # deleted
                return key, base
            operands.reverse()
            if base is not None:
                operands.insert(0, base)
            return key, self.delimiter.join(operands)


cdef object _END = object()


cdef class CheckedPairs:
    """The items of ``pairs``, then ``on_end(last item or None)`` once they are exhausted (which
    raises to report that they ended early): the compiled twin of
    :func:`statequery.backends.rocksdb._checked_pairs`, which keeps a RocksDB iterator that stops
    on an error from looking like the end of the data."""

    cdef object it
    cdef object last
    cdef object on_end
    cdef bint ended

    def __init__(self, pairs, on_end):
        self.it = iter(pairs)
        self.last = None
        self.on_end = on_end
        self.ended = False

    def __iter__(self):
        return self

    def __next__(self):
        if self.ended:
            raise StopIteration
        item = next(self.it, _END)
        if item is _END:
            self.ended = True
            self.on_end(self.last)
            raise StopIteration
        self.last = item
        return item


cdef inline uint64_t _u32(const uint8_t* p) noexcept:
    return <uint64_t>p[0] | (<uint64_t>p[1] << 8) | (<uint64_t>p[2] << 16) | (<uint64_t>p[3] << 24)


cdef inline uint64_t _u64(const uint8_t* p) noexcept:
    """A little-endian fixed64 (an internal key's trailer): one load where the compiler can."""
    return (<uint64_t>p[0] | (<uint64_t>p[1] << 8) | (<uint64_t>p[2] << 16)
            | (<uint64_t>p[3] << 24) | (<uint64_t>p[4] << 32) | (<uint64_t>p[5] << 40)
            | (<uint64_t>p[6] << 48) | (<uint64_t>p[7] << 56))


cdef Py_ssize_t _restarts_limit(const uint8_t* p, Py_ssize_t n, str source,
                                Py_ssize_t base) except -1:
    """The restart-array check of ``_Block.__init__`` (same verdicts, same messages) without
    building its tuple of restart offsets: returns where the restart array begins."""
    cdef uint64_t word, num_restarts, num_buckets, r, top = 0
    cdef Py_ssize_t end, restarts_at, i
    if n < 4:
        raise CorruptStateError(f"block of {n} bytes is too short", source, base)
    word = _u32(p + n - 4)
    num_restarts = word & 0x7FFFFFFF
    end = n - 4
    if word & 0x80000000:  # kDataBlockBinaryAndHash: hash index (uint8 buckets + uint16 count)
        if end < 2:
            raise CorruptStateError("truncated data block hash index", source, base)
        num_buckets = <uint64_t>p[end - 2] | (<uint64_t>p[end - 1] << 8)
        end -= 2 + <Py_ssize_t>num_buckets
    # num_restarts < 2**31: 4 * num_restarts fits a Py_ssize_t
    restarts_at = end - 4 * <Py_ssize_t>num_restarts
    if num_restarts == 0 or restarts_at < 0:
        raise CorruptStateError(f"block restart count {num_restarts} does not fit", source, base)
    if restarts_at:
        for i in range(<Py_ssize_t>num_restarts):
            r = _u32(p + restarts_at + 4 * i)
            if r > top:
                top = r
        if top >= <uint64_t>restarts_at:
            raise CorruptStateError("restart offset out of range", source, base)
    return restarts_at


def check_block(bytes data, str source, Py_ssize_t base):
    """The restart-array check of ``_Block(data, source, base)``; returns the entry area's
    end (``_Block.limit``)."""
    return _restarts_limit(<const uint8_t*>PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data),
                           source, base)


def check_data_blocks(int fd, list handles, Py_ssize_t file_size, checksum, uint64_t base_context,
                      decompress, mismatch, str source, Py_ssize_t max_block=0):
    """The pre-check of every data block of one table (``SstFile.check_blocks``), one call per
    file: for each ``(separator, handle)`` of ``handles``, the block and its trailer read
    (``SstFile._pread``), its checksum verified (``checksum(raw, n)``, the footer's function;
    format_version 6+ subtracts the context of the block's offset from the stored value), an
    uncompressed block checked in place and a compressed one inflated by ``decompress`` (the
    pure path's ``_decompress``), then its restart array checked as ``_Block`` does. A mismatch
    raises ``mismatch("data", handle, stored, computed)``. Same verdicts, same errors as
    ``SstFile.read_block`` for each handle in turn. A snappy block is inflated here when
    everything about it is in order (its declared size within ``max_block`` and what snappy can
    reach, cramjam filling exactly that); any other block goes to ``decompress``, which raises
    the typed error."""
    import os
    import cramjam
    cdef object snappy_into = cramjam.snappy.decompress_raw_into
    cdef Py_ssize_t off, size, i
    cdef bytes raw
    cdef object data
    cdef const uint8_t* p
    cdef int kind
    pread = os.pread
    for i in range(len(handles)):
        h = (<tuple>handles[i])[1]
        raw = _read_verified(fd, h, file_size, checksum, base_context, mismatch, source, pread)
        off = h.offset
        size = PyBytes_GET_SIZE(raw) - 5
        p = <const uint8_t*>PyBytes_AS_STRING(raw)
        kind = p[size]
        if kind == 1:
            data = _inflate_snappy(raw, size, max_block, snappy_into)
            if data is not None:
                _restarts_limit(<const uint8_t*>PyByteArray_AS_STRING(data),
                                len(<bytearray>data), source, off)
                continue
        if kind:
            data = decompress(kind, raw[:size], source, off)
            _restarts_limit(<const uint8_t*>PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data),
                            source, off)
        else:
            _restarts_limit(p, size, source, off)


cdef bytes _read_verified(int fd, object h, Py_ssize_t file_size, object checksum,
                          uint64_t base_context, object mismatch, str source, object pread):
    """Block ``h`` and its 5-byte trailer (compression type, checksum) read at its offset,
    inside the file and with its checksum verified (format_version 6+ subtracts the context of
    the block's offset from the stored value), as ``SstFile.read_block`` does: same errors."""
    cdef uint64_t stored, modifier, computed
    cdef Py_ssize_t off, size, n
    cdef bytes raw
    cdef const uint8_t* p
    ho, hs = h.offset, h.size  # Python ints first: a forged varint can exceed 2**63
    if ho < 0 or hs + 5 < 0 or ho + hs + 5 > file_size:
        raise CorruptStateError(
            f"block [{ho}, {ho + hs + 5}) lies outside the {file_size}-byte file "
            "(truncated?)", source, ho)
    off = ho
    size = hs
    n = size + 5
    raw = pread(fd, n, off)
    if PyBytes_GET_SIZE(raw) != n:
        raise CorruptStateError(f"short read of {n} bytes (truncated?)", source, off)
    if checksum is not None:
        p = <const uint8_t*>PyBytes_AS_STRING(raw)
        stored = _u32(p + size + 1)
        if base_context:
            modifier = (base_context ^ (((<uint64_t>off & 0xFFFFFFFF)
                                         + (<uint64_t>off >> 32)) & 0xFFFFFFFF)) & 0xFFFFFFFF
            stored = (stored - modifier) & 0xFFFFFFFF
        computed = checksum(raw, size + 1)
        if stored != computed:
            raise mismatch("data", h, stored, computed)
    return raw


cdef object _inflate_snappy(bytes raw, Py_ssize_t size, Py_ssize_t max_block,
                            object snappy_into):
    """The snappy block in ``raw[:size]`` inflated here when everything about it is in order
    (its declared size within ``max_block`` and what snappy can reach, cramjam filling exactly
    that): a bytearray of that size; else None (the caller's ``decompress`` then decides, with
    the typed error)."""
    cdef uint64_t declared
    cdef Py_ssize_t got
    cdef bytearray out
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(raw)
    if max_block > 0 and _small_varint(p, 0, size, &declared) > 0 \
            and declared <= <uint64_t>max_block and declared <= <uint64_t>(22 * size + 64):
        out = bytearray(<Py_ssize_t>declared + 1)  # the pure path's spare byte
        try:
            got = snappy_into(raw[:size], out)
        except Exception:
            got = -1
        if got == <Py_ssize_t>declared:
            del out[got:]
            return out
    return None


cdef inline Py_ssize_t _small_varint(const uint8_t* p, Py_ssize_t pos, Py_ssize_t n,
                                     uint64_t* out) noexcept:
    """A varint of at most 9 bytes (below 2**63) at pos; -1 for anything else (past ``n``,
    longer): the caller then leaves the block to the pure-Python walk."""
    cdef uint64_t result = 0
    cdef int shift = 0
    cdef uint8_t b
    while shift <= 56:
        if pos >= n:
            return -1
        b = p[pos]
        pos += 1
        result |= (<uint64_t>(b & 0x7F)) << shift
        if b < 0x80:
            out[0] = result
            return pos
        shift += 7
    return -1


cdef uint64_t _LIMIT = (<uint64_t>1) << 62  # offsets and sizes the compiled index walk reads


def index_handles(bytes data, Py_ssize_t pos, Py_ssize_t limit, bint first_keys, handle,
                  bint strip=False, Py_ssize_t data_end=-1):
    """The entries of an index block with delta-encoded values from ``pos`` (a restart offset)
    to ``limit``, as ``[(key, handle(offset, size))]``: ``_Block._index_handles`` read whole.
    Returns None for a block it does not read exactly as the pure walk would (a malformed or
    out-of-range entry, a varint longer than 9 bytes, an offset or size outside [0, 2**62)):
    the caller then walks it in Python, which raises the typed error or reads the odd values.
    ``strip``: each key without its last 8 bytes (``key[:-8]``, an internal key's user key);
    ``data_end`` >= 0: None as well when a handle's block and trailer end past it (the caller's
    walk then raises ``SstFile._check_block``'s error).
    """
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    cdef uint64_t shared, non_shared, off = 0, size = 0, zz, skip
    cdef long long delta, new_size
    cdef Py_ssize_t keylen = 0, cap = 0, end_key, ulen
    cdef uint8_t* key = NULL
    cdef uint8_t* grown
    cdef bint has_prev = False
    cdef list out = []
    cdef object h
    cdef tuple entry
    if limit > n or pos < 0:
        return None
    try:
        while pos < limit:
            pos = _small_varint(p, pos, n, &shared)
            if pos < 0:
                return None
            pos = _small_varint(p, pos, n, &non_shared)
            if pos < 0 or non_shared > <uint64_t>limit or shared > <uint64_t>keylen:
                return None
            end_key = pos + <Py_ssize_t>non_shared
            if end_key > limit:
                return None
            if <Py_ssize_t>(shared + non_shared) > cap:
                cap = <Py_ssize_t>(shared + non_shared) * 2 + 64
                grown = <uint8_t*>realloc(key, cap)
                if grown == NULL:
                    raise MemoryError()
                key = grown
            if non_shared:
                memcpy(key + shared, p + pos, non_shared)
            keylen = <Py_ssize_t>(shared + non_shared)
            pos = end_key
            if shared == 0:
                pos = _small_varint(p, pos, n, &off)
                if pos >= 0:
                    pos = _small_varint(p, pos, n, &size)
                if pos < 0 or off >= _LIMIT or size >= _LIMIT:
                    return None
            else:
                if not has_prev:
                    return None
                pos = _small_varint(p, pos, n, &zz)
                if pos < 0:
                    return None
                delta = <long long>(zz >> 1) ^ -<long long>(zz & 1)
                new_size = <long long>size + delta
                off = off + size + 5
                if new_size < 0 or new_size >= _LIMIT or off >= _LIMIT:
                    return None
                size = <uint64_t>new_size
            if first_keys:
                pos = _small_varint(p, pos, n, &skip)
                if pos < 0 or skip > <uint64_t>limit:
                    return None
                pos += <Py_ssize_t>skip
                if pos > limit:
                    return None
            has_prev = True
            if data_end >= 0 and off + size + 5 > <uint64_t>data_end:
                return None
            ulen = keylen
            if strip:
                ulen = keylen - 8 if keylen > 8 else 0
            h = handle(off, size)
            entry = (PyBytes_FromStringAndSize(<char*>key, ulen), h)
            # neither can be part of a reference cycle (bytes, and a frozen pair of ints): not
            # traversed by the cycle collector, whose full passes a large index (tens of
            # thousands of handles) would otherwise trigger and slow down
            if _gc_is_tracked(h):
                PyObject_GC_UnTrack(<void*>h)
            PyObject_GC_UnTrack(<void*>entry)
            out.append(entry)
        return out
    finally:
        free(key)


# -- the compiled scan of a column family (issue 33, item 3) ------------------------------------


# a table cursor reads consecutive data blocks in runs of one read each: the first run of a
# cursor holds about _FIRST_RUN bytes (a seek reads little), each next one twice as much, up to
# _RUN_BYTES
cdef Py_ssize_t _FIRST_RUN = 16384
cdef Py_ssize_t _RUN_BYTES = 262144


cdef inline Py_ssize_t _pyvarint(const uint8_t* p, Py_ssize_t pos, Py_ssize_t n, uint64_t* out,
                                 bint* huge, str source) except -1:
    """The pure path's ``_varint`` over the whole block (``n`` bytes): same errors; a value of
    2**64 or more sets ``huge`` (the pure path's Python int has no limit)."""
    cdef uint64_t result = 0
    cdef int shift = 0
    cdef uint8_t b
    huge[0] = False
    if pos >= n:
        raise CorruptStateError("varint runs past the end of its block", source, pos)
    while True:
        if pos >= n or shift > 63:
            raise CorruptStateError("malformed varint", source, pos)
        b = p[pos]
        pos += 1
        if shift == 63 and (b & 0x7F) > 1:
            huge[0] = True
        result |= (<uint64_t>(b & 0x7F)) << shift
        if b < 0x80:
            out[0] = result
            return pos
        shift += 7


cdef class _TableCursor:
    """One table of a :class:`TableScan`: its data blocks read in turn, checked as
    ``check_data_blocks`` checks them (same verdicts, same errors), and their entries parsed as
    ``block_tuples`` does (same checks, same errors), one at a time; the current entry's
    internal key is copied into ``key`` and its value is a span of the current block.

    Consecutive blocks are read in runs, one ``pread`` into a reused buffer (``runbuf``) per
    run; an uncompressed block is walked where it was read, a snappy block is inflated into a
    second reused buffer (``inflated``); a block of another codec, or one snappy refuses, goes
    to ``decompress`` (the pure path's, with its typed errors)."""

    cdef int fd
    cdef Py_ssize_t file_size, max_block
    cdef object checksum, decompress, mismatch, snappy_into
    cdef object xxh3  # the XXH3 digest when ``checksum`` is RocksDB's XXH3 (computed here)
    cdef uint64_t base_context, gseq
    cdef bint has_global
    cdef str source
    cdef list handles
    cdef Py_ssize_t next_block
    cdef object block  # the current block's bytes when ``decompress`` made them, kept alive
    cdef object runbuf  # bytearray: the raw bytes of a run of blocks, file bytes [run_off, +run_len)
    cdef object runview  # memoryview of runbuf (sliced per block for the checksum and snappy)
    cdef Py_ssize_t run_off, run_len, run_want
    cdef object inflated  # bytearray: the current snappy block inflated
    cdef const uint8_t* p
    cdef Py_ssize_t n, pos, limit, base
    cdef uint8_t* key
    cdef Py_ssize_t keylen, cap, ulen, vpos, vlen
    cdef uint64_t seq
    cdef int kind
    cdef bint valid
    cdef bytes start, stop
    cdef bint before_start  # no entry >= start seen yet (keys ascend: then no more checks)
    # bytes the current internal key shares with the previous entry of this cursor, when that
    # entry was in the same block (else -1): with ``ulen``, whether both have one user key
    cdef Py_ssize_t shared_prev
    cdef bint block_start  # the next entry parsed is the first of its block
    # in a run of tables (TableScan): every key checked against its block's index separator
    # (at the end of the block, and a key that ends the range), which the run's order relies on
    cdef bint check_seps
    cdef Py_ssize_t cur_block  # index in handles of the current block

    def __cinit__(self):
        self.key = NULL

    def __dealloc__(self):
        free(self.key)

    cdef int _load(self, Py_ssize_t i, bint seek) except -1:
        """Block ``i`` of ``handles`` becomes the current block; with ``seek``, positioned at
        the restart point ``SstFile.seek_restart`` picks for ``start``. Read (from the current
        run, else a new run from it), verified and inflated as ``check_data_blocks`` does:
        bounds, short read, checksum (with the format_version 6 context), snappy here when
        everything about it is in order, else ``decompress``; then the restart array."""
        cdef object h = (<tuple>self.handles[i])[1]
        cdef Py_ssize_t off, size, n, at
        cdef uint64_t stored, modifier, computed, declared
        cdef const uint8_t* raw
        cdef const uint8_t* p
        cdef int kind
        cdef object data
        cdef object got
        ho, hs = h.offset, h.size  # Python ints first: a forged varint can exceed 2**63
        if ho < 0 or hs + 5 < 0 or ho + hs + 5 > self.file_size:
            raise CorruptStateError(
                f"block [{ho}, {ho + hs + 5}) lies outside the {self.file_size}-byte file "
                "(truncated?)", self.source, ho)
        off = ho
        size = hs
        n = size + 5
        if self.runbuf is None or off < self.run_off or off - self.run_off > self.run_len - n:
            self._read_run(i, off, n)
            if self.run_len < n:
                raise CorruptStateError(f"short read of {n} bytes (truncated?)", self.source,
                                        off)
        at = off - self.run_off
        raw = <const uint8_t*>PyByteArray_AS_STRING(self.runbuf) + at
        if self.checksum is not None:
            stored = _u32(raw + size + 1)
            if self.base_context:
                modifier = (self.base_context ^ (((<uint64_t>off & 0xFFFFFFFF)
                                                  + (<uint64_t>off >> 32)) & 0xFFFFFFFF)) \
                    & 0xFFFFFFFF
                stored = (stored - modifier) & 0xFFFFFFFF
            if self.xxh3 is not None:  # ``checksums.checksum_function(XXH3)`` of raw[:size + 1]
                computed = ((<uint64_t>self.xxh3(self.runview[at:at + size]) & 0xFFFFFFFF)
                            ^ ((<uint64_t>raw[size] * 0x6B9083D9) & 0xFFFFFFFF))
            else:
                computed = self.checksum(self.runview[at:at + size + 1], size + 1)
            if stored != computed:
                raise self.mismatch("data", h, stored, computed)
        kind = raw[size]
        self.block = None
        p = NULL
        if kind == 1 and self.max_block > 0 and _small_varint(raw, 0, size, &declared) > 0 \
                and declared <= <uint64_t>self.max_block \
                and declared <= <uint64_t>(22 * size + 64):
            # snappy, inflated here (as ``_inflate_snappy``) into the reused buffer
            if self.inflated is None or PyByteArray_GET_SIZE(self.inflated) <= <Py_ssize_t>declared:
                self.inflated = bytearray(<Py_ssize_t>declared + 1 if declared >= 65536
                                          else 65536)
            try:
                got = self.snappy_into(self.runview[at:at + size], self.inflated)
            except Exception:
                got = None
            if got is not None and got == declared:
                p = <const uint8_t*>PyByteArray_AS_STRING(self.inflated)
                n = <Py_ssize_t>declared
        if p == NULL:
            if kind:
                data = self.decompress(kind, PyBytes_FromStringAndSize(<const char*>raw, size),
                                       self.source, off)
                self.block = data
                p = <const uint8_t*>PyBytes_AS_STRING(data)
                n = PyBytes_GET_SIZE(data)
            else:
                p = raw  # walked where it was read
                n = size
        self.base = off
        self.limit = _restarts_limit(p, n, self.source, self.base)
        self.p = p
        self.n = n
        self.keylen = 0
        self.block_start = True
        self.cur_block = i
        cdef Py_ssize_t restart = 0
        if seek and self.start is not None:
            restart = self._seek_restart(self._num_restarts())
        self.pos = <Py_ssize_t>_u32(p + self.limit + 4 * restart)
        return 0

    cdef int _read_run(self, Py_ssize_t i, Py_ssize_t off, Py_ssize_t n) except -1:
        """Read block ``i`` (``n`` bytes with its trailer at ``off``, inside the file) and the
        blocks that follow it back to back, up to ``run_want`` bytes, in one ``pread`` into
        ``runbuf``; ``run_len``: the bytes read (fewer at the end of a truncated file)."""
        cdef Py_ssize_t want = n, end = off + n, j = i + 1, nh = len(self.handles)
        cdef Py_ssize_t target = self.run_want if self.run_want > 0 else _FIRST_RUN
        cdef Py_ssize_t got = 0
        cdef Py_ssize_t r
        cdef object h
        cdef object o2
        cdef object s2
        while want < target and j < nh:
            h = (<tuple>self.handles[j])[1]
            o2, s2 = h.offset, h.size
            if o2 != end or s2 < 0 or s2 + 5 > target - want or end + s2 + 5 > self.file_size:
                break  # not back to back, or past the run or the file: read on its own
            want += <Py_ssize_t>s2 + 5
            end += <Py_ssize_t>s2 + 5
            j += 1
        self.run_want = target * 2 if target < _RUN_BYTES else _RUN_BYTES
        if self.runbuf is None or PyByteArray_GET_SIZE(self.runbuf) < want:
            self.runview = None
            self.runbuf = None
            self.runbuf = bytearray(want if want > _FIRST_RUN else _FIRST_RUN)
            self.runview = memoryview(self.runbuf)
        self.run_off = off
        self.run_len = 0
        cdef char* buf = PyByteArray_AS_STRING(self.runbuf)
        while got < want:
            r = pread(self.fd, buf + got, want - got, off + got)
            if r < 0:
                if errno == EINTR:
                    if PyErr_CheckSignals() < 0:
                        return -1
                    continue
                PyErr_SetFromErrno(OSError)
                return -1
            if r == 0:
                break  # the end of the file
            got += r
        self.run_len = got
        return 0

    cdef Py_ssize_t _num_restarts(self):
        return <Py_ssize_t>(_u32(self.p + self.n - 4) & 0x7FFFFFFF)

    cdef Py_ssize_t _seek_restart(self, Py_ssize_t num) except -1:
        """``_Block.seek_restart(start, key_of=lambda k: k[:-8])``: the last restart point
        whose user key is < ``start`` (0 if none), with the pure path's errors."""
        cdef Py_ssize_t lo = 0, hi = num - 1, mid, pos, kend, klen
        cdef uint64_t shared, non_shared, value_len
        cdef bint huge
        cdef const uint8_t* p = self.p
        while lo < hi:
            mid = (lo + hi + 1) // 2
            pos = <Py_ssize_t>_u32(p + self.limit + 4 * mid)
            pos = _pyvarint(p, pos, self.n, &shared, &huge, self.source)
            pos = _pyvarint(p, pos, self.n, &non_shared, &huge, self.source)
            if huge or non_shared > <uint64_t>self.n:
                non_shared = <uint64_t>self.n
            pos = _pyvarint(p, pos, self.n, &value_len, &huge, self.source)
            if shared:
                raise CorruptStateError("restart entry with a shared prefix", self.source,
                                        self.base + pos)
            kend = pos + <Py_ssize_t>non_shared
            if kend > self.n:
                kend = self.n
            klen = kend - pos - 8
            if klen < 0:
                klen = 0
            if _cmp(p + pos, klen, self.start) < 0:
                lo = mid
            else:
                hi = mid - 1
        return lo

    cdef int advance(self) except -1:
        """The next entry in ``[start, stop)`` becomes current; ``valid`` False at the end."""
        cdef const uint8_t* p
        cdef uint64_t shared, non_shared, value_len, trailer
        cdef Py_ssize_t pos, limit, end_key, end
        cdef uint8_t* grown
        cdef int kind, i
        while True:
            if self.pos >= self.limit:
                if self.check_seps and self.keylen >= 8:
                    self._check_sep()
                if self.next_block >= len(self.handles):
                    self._release()
                    return 0
                self.next_block += 1
                self._load(self.next_block - 1, False)
                continue
            p = self.p
            pos = self.pos
            limit = self.limit
            if pos + 3 <= limit and (p[pos] | p[pos + 1] | p[pos + 2]) < 0x80:
                shared = p[pos]
                non_shared = p[pos + 1]
                value_len = p[pos + 2]
                pos += 3
            else:
                pos = _varint32(p, pos, limit, &shared)
                if pos >= 0:
                    pos = _varint32(p, pos, limit, &non_shared)
                if pos >= 0:
                    pos = _varint32(p, pos, limit, &value_len)
                if pos < 0:
                    raise CorruptStateError("malformed varint", self.source, self.base)
            end_key = pos + <Py_ssize_t>non_shared
            end = end_key + <Py_ssize_t>value_len
            if non_shared > <uint64_t>limit or value_len > <uint64_t>limit or end > limit \
                    or shared > <uint64_t>self.keylen:
                raise CorruptStateError("block entry runs past the block", self.source,
                                        self.base + pos)
            if <Py_ssize_t>(shared + non_shared) > self.cap:
                self.cap = <Py_ssize_t>(shared + non_shared) * 2 + 64
                grown = <uint8_t*>realloc(self.key, self.cap)
                if grown == NULL:
                    raise MemoryError()
                self.key = grown
            if non_shared:
                memcpy(self.key + shared, p + pos, non_shared)
            self.keylen = <Py_ssize_t>(shared + non_shared)
            self.pos = end
            self.shared_prev = -1 if self.block_start else <Py_ssize_t>shared
            self.block_start = False
            self.ulen = self.keylen - 8
            if self.ulen < 0:
                raise CorruptStateError(f"internal key of {self.keylen} bytes", self.source,
                                        self.base)
            trailer = _u64(self.key + self.ulen)
            kind = trailer & 0xFF
            if kind != 0 and kind != 1 and kind != 2 and kind != 7:
                what = _TYPE_NAMES.get(kind, f"value type {kind:#x}")
                raise UnsupportedFormatError(
                    f"{self.source}: entries of kind {what} are not supported")
            if self.before_start:
                if _cmp(self.key, self.ulen, self.start) < 0:
                    continue
                self.before_start = False
            if self.stop is not None and _bcmp(self.key, self.ulen,
                                               <const uint8_t*>PyBytes_AS_STRING(self.stop),
                                               PyBytes_GET_SIZE(self.stop)) >= 0:
                # a key past the range must not pass its block's separator either: a key whose
                # bytes changed (checksum recomputed) would end the table early, dropping the
                # keys after it
                self._check_sep()
                self._release()
                return 0
            self.seq = trailer >> 8
            if self.seq == 0 and self.has_global:
                self.seq = self.gseq
            self.kind = kind
            self.vpos = end_key
            self.vlen = end - end_key
            self.valid = True
            return 0
        return 0

    cdef void _release(self) noexcept:
        """The end of the table's range: no current entry, its buffers freed."""
        self.valid = False
        self.block = None
        self.runview = None
        self.runbuf = None
        self.inflated = None
        self.run_len = 0

    cdef int _check_sep(self) except -1:
        """The current (last parsed) user key must not pass its block's index separator (which
        is at least the block's last key when it was written)."""
        cdef bytes sep = <bytes>(<tuple>self.handles[self.cur_block])[0]
        if _cmp(self.key, self.ulen, sep) > 0:
            raise CorruptStateError(
                f"data block holds key {PyBytes_FromStringAndSize(<char*>self.key, self.ulen).hex()}"
                f" past its index separator {sep.hex()}: the table's keys are out of order",
                self.source, self.base)
        return 0

    cdef bytes user_key(self):
        return PyBytes_FromStringAndSize(<char*>self.key, self.ulen)

    cdef inline bint same_user_key(self, const uint8_t* key, Py_ssize_t n) noexcept:
        """Whether the current entry's user key is ``key[:n]``, knowing that the previous
        entry of this cursor had that user key: from the shared-prefix length when both are in
        one block (no comparison), else compared."""
        cdef Py_ssize_t sh = self.shared_prev
        if self.ulen != n:
            return False
        if n == 0 or sh >= n:
            return True  # the whole user key kept from the previous entry
        if sh < 0:
            sh = 0
        # key[:sh] is the previous key's, which was key: compare from there (RocksDB shares
        # the longest common prefix, so byte sh differs, but a writer may share less)
        if self.key[sh] != key[sh]:
            return False
        return memcmp(self.key + sh, key + sh, n - sh) == 0


cdef inline int _bcmp(const uint8_t* a, Py_ssize_t na, const uint8_t* b,
                      Py_ssize_t nb) noexcept:
    """memcmp order of a[:na] and b[:nb]: <0, 0, >0; the first bytes compared inline (keys
    of one key group share their first bytes; a call to memcmp per entry cost more)."""
    cdef Py_ssize_t n = na if na < nb else nb
    cdef Py_ssize_t i = 0
    cdef int c
    while i < n and i < 16:
        if a[i] != b[i]:
            return -1 if a[i] < b[i] else 1
        i += 1
    if i < n:
        c = memcmp(a + i, b + i, n - i)
        if c != 0:
            return c
    if na != nb:
        return -1 if na < nb else 1
    return 0


cdef bytes _max_separator(list handles):
    cdef bytes best = b""
    for h in handles:
        if (<bytes>(<tuple>h)[0]) > best:
            best = <bytes>(<tuple>h)[0]
    return best


cdef inline uint64_t _be64(const uint8_t* p) noexcept:
    return ((<uint64_t>p[0] << 56) | (<uint64_t>p[1] << 48) | (<uint64_t>p[2] << 40)
            | (<uint64_t>p[3] << 32) | (<uint64_t>p[4] << 24) | (<uint64_t>p[5] << 16)
            | (<uint64_t>p[6] << 8) | <uint64_t>p[7])


cdef inline int _cursor_cmp(_TableCursor a, _TableCursor b) noexcept:
    """Internal-key order of two cursors' entries: user key bytewise (8 bytes at a time, as
    big-endian words: keys of one key group share long prefixes and a call to memcmp per
    comparison cost more), then newest first."""
    cdef Py_ssize_t n = a.ulen if a.ulen < b.ulen else b.ulen
    cdef Py_ssize_t i = 0
    cdef uint64_t x, y
    while i + 8 <= n:
        x = _be64(a.key + i)
        y = _be64(b.key + i)
        if x != y:
            return -1 if x < y else 1
        i += 8
    while i < n:
        if a.key[i] != b.key[i]:
            return -1 if a.key[i] < b.key[i] else 1
        i += 1
    if a.ulen != b.ulen:
        return -1 if a.ulen < b.ulen else 1
    if a.seq != b.seq:
        return -1 if a.seq > b.seq else 1
    return 0


cdef class TableScan:
    """The live ``(user key, value)`` pairs of a column family's tables in ``[start, stop)``,
    in key order, packed per key group for ``_read.feed_packed`` (no Python object per entry).

    Each table is a tuple ``(fd, [(separator, handle)], file size, checksum, base context,
    decompress, mismatch, source, max block, global seqno)`` (``SstFile.scan_args``). Blocks
    are read, verified and inflated as ``check_data_blocks`` does and their entries parsed as
    ``block_tuples`` does; the tables are merged in internal-key order and each user key is
    resolved as :class:`MergedPairs` does (RocksDB's read rules without range tombstones:
    newest first, merge operands joined by ``delimiter`` oldest first on top of a Put, a
    deletion ends the chain). The caller hands tables with range tombstones to the pure path.

    :meth:`next_chunk` returns ``(key group, entries, packed bytes, ends)``: the entries of one
    key group (at most about ``chunk_bytes`` of them; ``ends`` False when the key group goes
    on in the next chunk), each as an ``int64`` key length, ``int64`` value length (native order), key,
    value; key group -1 when the scan is over.
    """

    cdef list cursors
    cdef Py_ssize_t ncur
    cdef int prefix_len
    cdef bytes delimiter
    cdef object outbuf  # bytearray: the packed entries of the current chunk (reused)
    cdef uint8_t* out  # its storage
    cdef Py_ssize_t outlen, outcap, chunk_bytes
    cdef uint8_t* cur
    cdef Py_ssize_t curlen, curcap
    cdef int open_kg
    cdef Py_ssize_t best, second  # see _smallest (best -1: compare all)
    cdef _TableCursor bestc, secondc  # cursors[best], cursors[second]
    cdef Py_ssize_t peek  # the cursor _smallest last returned, not consumed yet (-1: none)
    cdef list rest  # per run (see _chain): its tables after the current one, last first

    def __cinit__(self):
        self.out = NULL
        self.cur = NULL
        self.best = -1
        self.second = -1
        self.peek = -1

    def __dealloc__(self):
        free(self.cur)

    def __init__(self, list tables, bytes start, bytes stop, int prefix_len,
                 bytes delimiter=b",", Py_ssize_t chunk_bytes=1 << 20):
        import os
        import cramjam
        cdef _TableCursor c
        cdef Py_ssize_t lo, hi, mid
        cdef list handles
        if prefix_len < 1 or prefix_len > 2:
            raise ValueError(f"key-group prefix of {prefix_len} bytes")
        self.prefix_len = prefix_len
        self.delimiter = delimiter
        self.chunk_bytes = chunk_bytes if chunk_bytes > 0 else 1
        self.open_kg = -1
        self.cursors = []
        for t in tables:
            c = _TableCursor()
            (fd, handles, c.file_size, c.checksum, c.base_context, c.decompress, c.mismatch,
             c.source, c.max_block, gseq) = t
            c.fd = fd
            c.handles = handles
            c.has_global = gseq is not None
            c.gseq = gseq if gseq is not None else 0
            c.snappy_into = cramjam.snappy.decompress_raw_into
            c.xxh3 = getattr(c.checksum, "xxh3_64", None)
            c.start = start
            c.stop = stop
            c.before_start = start is not None
            # the first block whose separator is >= start (``SstFile._index_from``)
            lo, hi = 0, len(handles)
            if start is not None:
                while lo < hi:
                    mid = (lo + hi) // 2
                    sep = (<tuple>handles[mid])[0]
                    if (<bytes>sep) < start:
                        lo = mid + 1
                    else:
                        hi = mid
            c.next_block = lo
            c.pos = c.limit = 0
            c.valid = False
            if lo < len(handles):
                c.next_block = lo + 1
                c._load(lo, True)
                c.advance()
            self.cursors.append(c)
        self._chain()
        self.ncur = len(self.cursors)

    def _chain(self):
        """Tables of disjoint key ranges (one LSM level's) chained into runs read one after
        the other: ``cursors`` keeps each run's current table, ``rest`` the others (last
        first), so the merge compares one entry per run, not per table. A table follows
        another only when its first entry lies past every index separator of the other
        (separators bound their blocks' keys: each block is checked against its separator when
        it ends or ends the range, so a lying index is an error before the run's order is
        used)."""
        cdef _TableCursor c, tail
        cdef list live = [c for c in self.cursors if c.valid]
        cdef list runs = []
        cdef list bounds = []
        cdef Py_ssize_t r
        live.sort(key=lambda c: (<_TableCursor>c).user_key())
        for c in live:
            first = c.user_key()
            for r in range(len(runs)):
                if (<bytes>bounds[r]) < first:
                    (<list>runs[r]).append(c)
                    bounds[r] = _max_separator(c.handles)
                    break
            else:
                runs.append([c])
                bounds.append(_max_separator(c.handles))
        self.cursors = []
        self.rest = []
        for run in runs:
            if len(<list>run) > 1:
                for c in run:
                    c.check_seps = True
            self.cursors.append((<list>run)[0])
            self.rest.append((<list>run)[:0:-1])

    cdef inline Py_ssize_t _smallest(self) except -2:
        """The cursor holding the smallest entry (-1: all done). The runner-up is kept: after
        the best one advances, one comparison with it decides whether the best one still
        leads (tables of one level hold disjoint ranges), else all are compared again
        (:meth:`_smallest_all`)."""
        if self.best >= 0 and self.bestc.valid and (
                self.second < 0 or _cursor_cmp(self.bestc, self.secondc) < 0):
            return self.best
        return self._smallest_all()

    cdef Py_ssize_t _smallest_all(self) except -2:
        cdef Py_ssize_t best = -1, second = -1, i
        cdef _TableCursor c, b = None, s2 = None
        for i in range(self.ncur):
            c = <_TableCursor>self.cursors[i]
            while not c.valid and len(<list>self.rest[i]):
                c = <_TableCursor>(<list>self.rest[i]).pop()  # the run's next table
                self.cursors[i] = c
            if not c.valid:
                continue
            if b is None or _cursor_cmp(c, b) < 0:
                second, s2 = best, b
                best, b = i, c
            elif s2 is None or _cursor_cmp(c, s2) < 0:
                second, s2 = i, c
        self.best = best
        self.second = second
        self.bestc = b
        self.secondc = s2
        return best

    cdef int _grow(self, Py_ssize_t more) except -1:
        cdef Py_ssize_t want
        if more > (<Py_ssize_t>1 << 60) - self.outlen:
            raise MemoryError()
        want = self.outlen + more
        if want <= self.outcap:
            return 0
        want = want * 2 if want < (<Py_ssize_t>1 << 59) else want
        if self.outbuf is None:
            self.outbuf = bytearray(want)
        else:
            # a BufferError while a view of the last chunk (next_view) is still held
            PyByteArray_Resize(self.outbuf, want)
        self.out = <uint8_t*>PyByteArray_AS_STRING(self.outbuf)
        self.outcap = want
        return 0

    cdef inline int _emit(self, const uint8_t* k, Py_ssize_t klen, const uint8_t* v,
                          Py_ssize_t vlen) except -1:
        """Append the key ``k[:klen]`` and the value ``v[:vlen]``."""
        cdef Py_ssize_t need = 16 + klen + vlen
        if need > self.outcap - self.outlen:
            self._grow(need)
        cdef uint8_t* o = self.out + self.outlen
        cdef int64_t kl = klen, vl = vlen
        memcpy(o, &kl, 8)
        memcpy(o + 8, &vl, 8)
        if klen:
            memcpy(o + 16, k, klen)
        if vlen:
            memcpy(o + 16 + klen, v, vlen)
        self.outlen += need
        return 0

    def next_chunk(self):
        """``(key group, entries, packed bytes, ends)``: see the class docstring."""
        cdef tuple r = self._next()
        return r[0], r[1], PyBytes_FromStringAndSize(<char*>self.out, self.outlen), r[2]

    def next_view(self):
        """:meth:`next_chunk` with the packed entries as a read-only view of the scan's own
        buffer instead of a copy: valid until the next call, which reuses the buffer (release
        the view first: while it is held the buffer cannot grow, a ``BufferError``)."""
        cdef tuple r = self._next()
        if self.outbuf is None:
            return r[0], r[1], memoryview(b""), r[2]
        return r[0], r[1], memoryview(self.outbuf)[:self.outlen].toreadonly(), r[2]

    cdef tuple _next(self):
        """The next chunk into ``out[:outlen]``: ``(key group, entries, ends)``."""
        cdef Py_ssize_t i, entries = 0, j
        cdef _TableCursor c
        cdef int kg = self.open_kg, k2
        cdef uint8_t* grown
        cdef list operands
        cdef object base
        cdef bint done, wrote
        cdef bytes joined
        cdef const uint8_t* ck  # the current user key (in ``cur``, or as emitted in ``out``)
        operands = None
        base = None
        self.outlen = 0
        while True:
            if self.peek >= 0:
                i = self.peek  # found by the last resolve (no cursor moved since)
                self.peek = -1
            else:
                i = self._smallest()
            if i < 0:
                self.open_kg = -1
                return kg, entries, True
            c = self.bestc  # cursors[i]: i is what _smallest returned last
            if c.ulen < self.prefix_len:
                raise CorruptStateError(
                    f"entry key {PyBytes_FromStringAndSize(<char*>c.key, c.ulen).hex()} "
                    "shorter than its key-group prefix", c.source, c.base)
            k2 = c.key[0]
            if self.prefix_len == 2:
                k2 = (k2 << 8) | c.key[1]
            if kg >= 0 and k2 != kg:
                self.open_kg = -1
                return kg, entries, True
            if kg >= 0 and self.outlen >= self.chunk_bytes:
                self.open_kg = kg
                return kg, entries, False
            # the current user key, resolved over every table's entries of it, newest first
            self.curlen = c.ulen
            if operands is not None:  # (no reference counted per key when unused)
                operands = None
            if base is not None:
                base = None
            if c.kind == 1:
                # a Put first (the common case): emitted now, its key straight from the cursor;
                # the key emitted (``out`` does not move before the next emit, after this user
                # key) is what the next entries are compared with
                self._emit(c.key, c.ulen, c.p + c.vpos, c.vlen)
                ck = self.out + self.outlen - c.vlen - c.ulen
                done = True
                wrote = True
            else:
                if c.ulen > self.curcap:
                    grown = <uint8_t*>realloc(self.cur, c.ulen * 2 + 64)
                    if grown == NULL:
                        raise MemoryError()
                    self.cur = grown
                    self.curcap = c.ulen * 2 + 64
                if c.ulen:
                    memcpy(self.cur, c.key, c.ulen)
                ck = self.cur
                done = False
                wrote = False
            while True:
                if not done:
                    if c.kind == 2:
                        if operands is None:
                            operands = []
                        operands.append(PyBytes_FromStringAndSize(<char*>c.p + c.vpos, c.vlen))
                    else:
                        if c.kind == 1:
                            if operands is None:
                                self._emit(self.cur, self.curlen, c.p + c.vpos, c.vlen)
                                wrote = True
                            else:
                                base = PyBytes_FromStringAndSize(<char*>c.p + c.vpos, c.vlen)
                        done = True  # a Put or a (single) deletion ends the chain
                c.advance()
                j = self._smallest()
                self.peek = j
                if j < 0:
                    break
                if self.bestc is c:  # the same table (j is best): its last entry had this key
                    if not c.same_user_key(ck, self.curlen):
                        break
                else:
                    i = j
                    c = self.bestc
                    if c.ulen != self.curlen or (self.curlen and
                                                 memcmp(c.key, ck, self.curlen) != 0):
                        break
                self.peek = -1
            if operands is not None:
                operands.reverse()
                if base is not None:
                    operands.insert(0, base)
                joined = self.delimiter.join(operands)
                self._emit(self.cur, self.curlen, <const uint8_t*>PyBytes_AS_STRING(joined),
                           PyBytes_GET_SIZE(joined))
                wrote = True
            if wrote:
                entries += 1
                kg = k2


def unpack_chunk(bytes buf):
    """The ``(key, value)`` pairs of a :meth:`TableScan.next_chunk` buffer (tests, and the
    pairs form of a scan)."""
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(buf)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(buf), pos = 0
    cdef int64_t klen, vlen
    cdef list out = []
    while pos < n:
        if n - pos < 16:
            raise ValueError("malformed packed entries")
        memcpy(&klen, p + pos, 8)
        memcpy(&vlen, p + pos + 8, 8)
        pos += 16
        if klen < 0 or vlen < 0 or klen > n - pos or vlen > n - pos - klen:
            raise ValueError("malformed packed entries")
        out.append((PyBytes_FromStringAndSize(<char*>p + pos, klen),
                    PyBytes_FromStringAndSize(<char*>p + pos + klen, vlen)))
        pos += klen + vlen
    return out
