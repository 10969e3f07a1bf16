# cython: language_level=3, cdivision=True
# (boundscheck, wraparound: set by setup.py, off unless STATEQUERY_BOUNDSCHECK=1)
"""Compiled decode path (the optional fast twin of the pure-Python handlers; see
:mod:`statequery.backends.fastpath` and docs/decoding.md).

:func:`scan_key_group` walks a decompressed canonical key group exactly like the pure-Python
:func:`statequery.backends.keygroups.scan_key_group` (same checks, same error messages).
Entries of a state whose handler is an :class:`EntrySink` are decoded in C straight into column
buffers (no Python object per value); :meth:`EntrySink.arrays` turns them into Arrow arrays.
Other handlers are called as Python callables, so every state still decodes. The same sinks take
RocksDB entries in bulk (:func:`feed_key_group`) and walk state blocks of the hashmap checkpoint
format (:meth:`EntrySink.walk`).

Columns (:class:`Col`): :class:`Column` (primitives, strings, StringData, byte arrays, enums,
SQL decimals and timestamps), :class:`StructCol` (Tuple, TimeWindow, POJO, Row, BinaryRowData),
:class:`ListCol` and :class:`SqlArrayCol` (lists inside values), :class:`NullCol`,
:class:`VarCol` (RAW fields of a BinaryRowData).
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcmp, memcpy

from cpython.buffer cimport PyBuffer_FillInfo
from cpython.bytes cimport PyBytes_FromStringAndSize

import pyarrow as pa

cdef extern from *:
    """
    typedef __int128 sq_i128;
    """
    ctypedef long long sq_i128  # a 128-bit integer in C (never converted to Python)

from statequery.decoder import DecodeError
from statequery.serializers.readers import DECODE_ERRORS

cdef enum:
    _T_LONG = 1
    _T_INT = 2
    _T_SHORT = 3
    _T_BYTE = 4
    _T_DOUBLE = 5
    _T_FLOAT = 6
    _T_BOOL = 7
    _T_STRING = 8
    _T_BYTES = 9
    _T_STRING_DATA = 10
    _T_ENUM = 11
    _T_DECIMAL = 12
    _T_TIMESTAMP = 13
    _S_TUPLE = 1
    _S_POJO = 2
    _S_ROW = 3
    _S_ROWDATA = 4
    _K_VALUE = 0
    _K_TIMER = 1
    _K_MAP = 2
    _K_LIST = 3
    _K_LIST_FLAT = 4
    _K_MAP_NESTED = 5
K_MAP_NESTED = 5  # one map<user_key, value> per key and namespace

T_LONG = 1
T_INT = 2
T_SHORT = 3
T_BYTE = 4
T_DOUBLE = 5
T_FLOAT = 6
T_BOOL = 7
T_STRING = 8
T_BYTES = 9
T_STRING_DATA = 10  # StringDataSerializer: int32 length + UTF-8
T_ENUM = 11  # EnumSerializer: int32 index -> the constant's name
T_DECIMAL = 12  # SQL DECIMAL(p <= 38) in a BinaryRowData: decimal128
T_TIMESTAMP = 13  # SQL TIMESTAMP(p > 3) in a BinaryRowData (millis + nanos of milli)

S_TUPLE = 1  # fields concatenated (Tuple, TimeWindow)
S_POJO = 2  # flags byte, per field a null flag
S_ROW = 3  # RowSerializer: null mask (+ 2 RowKind bits)
S_ROWDATA = 4  # int32 size + BinaryRowData

K_VALUE = 0
K_TIMER = 1
K_MAP = 2
K_LIST = 3
K_LIST_FLAT = 4

cdef int64_t LONG_MIN = <int64_t>(<unsigned long long>1 << 63)
cdef int64_t TS_LO = -62135596800000
cdef int64_t TS_HI = 253402300799999


# -- the arena: where a pool worker's Arrow buffers are built (statequery/parallel.py) -----------
#
# A worker's result slot is shared memory the calling process maps. With the slot's mapping set
# as the arena, every buffer a column hands to Arrow is copied there instead of into a new bytes
# object (the same one copy), so the worker sends the caller the buffers' places, not their bytes.
# Buffers that do not fit go to bytes objects as without an arena. ``_arena_live`` counts the
# slices alive: the worker reuses a slot's memory only when none is (parallel._run_piece).

cdef char* _arena = NULL
cdef Py_ssize_t _arena_cap = 0
cdef Py_ssize_t _arena_pos = 0
cdef object _arena_owner = None
cdef Py_ssize_t _arena_live = 0


cdef class _Slice:
    """A read-only piece of the arena (its owner keeps the memory mapped)."""
    cdef char* p
    cdef Py_ssize_t n
    cdef object owner

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, self.p, self.n, 1, flags)

    def __releasebuffer__(self, Py_buffer* view):
        pass

    def __dealloc__(self):
        global _arena_live
        if self.owner is not None:
            _arena_live -= 1

    def __len__(self):
        return self.n


def arena_set(object view, Py_ssize_t pos=0):
    """Build buffers into ``view`` (a writable, C-contiguous buffer: a worker's mapping of its
    result slot) from byte ``pos`` on; ``None``: into bytes objects again."""
    global _arena, _arena_cap, _arena_pos, _arena_owner
    cdef unsigned char[::1] mem
    _arena = NULL
    _arena_cap = 0
    _arena_pos = 0
    _arena_owner = None
    if view is None:
        return
    mem = view
    if mem.shape[0] == 0:
        return
    if pos < 0 or pos > mem.shape[0]:
        raise ValueError(f"arena position {pos} outside its {mem.shape[0]} bytes")
    _arena_owner = view
    _arena = <char*>&mem[0]
    _arena_cap = mem.shape[0]
    _arena_pos = pos


def arena_pos():
    """Where the arena's next buffer goes (after the last one built into it)."""
    return _arena_pos


def arena_seek(Py_ssize_t pos):
    """The arena's next buffer goes at ``pos`` or after (bytes up to it were written by others)."""
    global _arena_pos
    if _arena != NULL:
        if pos < 0 or pos > _arena_cap:
            raise ValueError(f"arena position {pos} outside its {_arena_cap} bytes")
        _arena_pos = pos


def arena_live():
    """How many slices of an arena are alive."""
    return _arena_live


cdef class _Buf:
    """A growable byte buffer."""
    cdef char* data
    cdef Py_ssize_t size
    cdef Py_ssize_t cap

    def __dealloc__(self):
        free(self.data)

    cdef inline char* grow(self, Py_ssize_t n) except NULL:
        cdef Py_ssize_t need = self.size + n
        cdef Py_ssize_t cap
        cdef char* p
        if n < 0:
            raise ValueError(f"negative buffer growth {n}")
        # allocate even for n == 0: a NULL return is this function's error signal, so an empty
        # value (``''``, ``x''``) appended to a buffer that holds no bytes yet must not get one
        if need > self.cap or self.data == NULL:
            cap = self.cap * 2 if self.cap else 4096
            while cap < need:
                cap *= 2
            p = <char*>realloc(self.data, cap)
            if p == NULL:
                raise MemoryError()
            self.data = p
            self.cap = cap
        p = self.data + self.size
        self.size = need
        return p

    cdef object take(self):
        """The bytes appended, as an object with the buffer protocol (a ``bytes``, or a slice of
        the arena when one is set), and the buffer empty again (its memory kept)."""
        global _arena_pos, _arena_live
        cdef Py_ssize_t start, n = self.size
        cdef _Slice piece
        if _arena != NULL and n > 0:
            start = (_arena_pos + 63) & ~(<Py_ssize_t>63)
            if start <= _arena_cap and n <= _arena_cap - start:
                memcpy(_arena + start, self.data, n)
                _arena_pos = start + n
                self.size = 0
                piece = _Slice.__new__(_Slice)
                piece.p = _arena + start
                piece.n = n
                piece.owner = _arena_owner
                _arena_live += 1
                return piece
        out = PyBytes_FromStringAndSize(self.data, n)
        self.size = 0
        return out


cdef inline int32_t be_i32(const uint8_t* b, Py_ssize_t p) noexcept:
    return <int32_t>((<uint32_t>b[p] << 24) | (<uint32_t>b[p + 1] << 16)
                     | (<uint32_t>b[p + 2] << 8) | <uint32_t>b[p + 3])


cdef inline int64_t be_i64(const uint8_t* b, Py_ssize_t p) noexcept:
    cdef uint32_t hi = ((<uint32_t>b[p] << 24) | (<uint32_t>b[p + 1] << 16)
                        | (<uint32_t>b[p + 2] << 8) | <uint32_t>b[p + 3])
    cdef uint32_t lo = ((<uint32_t>b[p + 4] << 24) | (<uint32_t>b[p + 5] << 16)
                        | (<uint32_t>b[p + 6] << 8) | <uint32_t>b[p + 7])
    return <int64_t>((<unsigned long long>hi << 32) | lo)


cdef inline void put_utf8(_Buf out, uint32_t cp) except *:
    cdef char* d
    if cp < 0x80:
        d = out.grow(1)
        d[0] = <char>cp
    elif cp < 0x800:
        d = out.grow(2)
        d[0] = <char>(0xC0 | (cp >> 6))
        d[1] = <char>(0x80 | (cp & 0x3F))
    elif cp < 0x10000:
        d = out.grow(3)
        d[0] = <char>(0xE0 | (cp >> 12))
        d[1] = <char>(0x80 | ((cp >> 6) & 0x3F))
        d[2] = <char>(0x80 | (cp & 0x3F))
    else:
        d = out.grow(4)
        d[0] = <char>(0xF0 | (cp >> 18))
        d[1] = <char>(0x80 | ((cp >> 12) & 0x3F))
        d[2] = <char>(0x80 | ((cp >> 6) & 0x3F))
        d[3] = <char>(0x80 | (cp & 0x3F))


cdef bint utf8_valid(const uint8_t* s, Py_ssize_t n) noexcept:
    """Strict UTF-8 (as Python's ``bytes.decode("utf-8")``: no overlong forms, no surrogates,
    nothing above U+10FFFF)."""
    cdef Py_ssize_t i = 0
    cdef uint8_t c, c1
    while i < n:
        c = s[i]
        if c < 0x80:
            i += 1
            continue
        if c < 0xC2:
            return False
        if c < 0xE0:
            if i + 1 >= n or (s[i + 1] & 0xC0) != 0x80:
                return False
            i += 2
        elif c < 0xF0:
            if i + 2 >= n:
                return False
            c1 = s[i + 1]
            if c == 0xE0:
                if c1 < 0xA0 or c1 > 0xBF:
                    return False
            elif c == 0xED:
                if c1 < 0x80 or c1 > 0x9F:
                    return False
            elif (c1 & 0xC0) != 0x80:
                return False
            if (s[i + 2] & 0xC0) != 0x80:
                return False
            i += 3
        elif c < 0xF5:
            if i + 3 >= n:
                return False
            c1 = s[i + 1]
            if c == 0xF0:
                if c1 < 0x90 or c1 > 0xBF:
                    return False
            elif c == 0xF4:
                if c1 < 0x80 or c1 > 0x8F:
                    return False
            elif (c1 & 0xC0) != 0x80:
                return False
            if (s[i + 2] & 0xC0) != 0x80 or (s[i + 3] & 0xC0) != 0x80:
                return False
            i += 4
        else:
            return False
    return True


cdef object _bitmap(_Buf valid, Py_ssize_t n, Py_ssize_t nulls):
    """A validity bitmap from one byte per row (None without nulls)."""
    cdef Py_ssize_t i
    cdef bytearray bits
    cdef unsigned char* bp
    if nulls == 0:
        return None
    bits = bytearray((n + 7) // 8)
    bp = bits
    for i in range(n):
        if valid.data[i]:
            bp[i >> 3] |= 1 << (i & 7)
    return pa.py_buffer(bits)


cdef int var_region(const uint8_t* buf, Py_ssize_t slot, Py_ssize_t size, Py_ssize_t* off,
                    Py_ssize_t* n) except -1:
    """A variable-length field of a BinaryRowData: its slot holds ``offset << 32 | length``."""
    cdef uint64_t v
    memcpy(&v, buf + slot, 8)
    cdef uint64_t o = v >> 32, k = v & 0xFFFFFFFF
    if o + k > <uint64_t>size:
        raise DecodeError(
            f"variable-length field [{o}, {o + k}) outside its {size}-byte binary section", slot)
    off[0] = <Py_ssize_t>o
    n[0] = <Py_ssize_t>k
    return 0


cdef sq_i128 pow10(int p) noexcept:
    cdef sq_i128 r = 1
    cdef int i
    for i in range(p):
        r *= 10
    return r


cdef class Col:
    """A column being decoded: values are appended in C, :meth:`array` turns them into an Arrow
    array of the schema's type. Subclasses: :class:`Column` (scalars), :class:`StructCol`."""
    cdef Py_ssize_t n
    cdef Py_ssize_t nulls
    cdef _Buf valid
    cdef str what

    cdef Py_ssize_t read(self, const uint8_t* buf, Py_ssize_t pos, Py_ssize_t end) except -1:
        raise NotImplementedError

    cdef int sql_get(self, const uint8_t* buf, Py_ssize_t base, Py_ssize_t slot,
                     Py_ssize_t size) except -1:
        """Decodes the field in the 8-byte slot ``slot`` of a ``BinaryRowData`` of ``size``
        bytes at ``base``."""
        raise NotImplementedError

    cdef void null(self) except *:
        raise NotImplementedError

    cdef void dup_last(self) except *:
        raise NotImplementedError

    cdef void drop_last(self) except *:
        raise NotImplementedError

    cdef object array(self, object type):
        raise NotImplementedError

    cdef void reset(self) except *:
        """Drops the buffered values."""
        raise NotImplementedError

    cdef int slot(self, const uint8_t* buf, Py_ssize_t start, Py_ssize_t end) except -1:
        """Decodes a value that must fill ``[start, end)`` exactly."""
        cdef Py_ssize_t p = self.read(buf, start, end)
        if p != end:
            raise DecodeError(f"{self.what} used {p - start} of its {end - start} bytes", start)
        return 0


cdef class Column(Col):
    """One column of values of one primitive type: data, int32 offsets (variable width) and a
    validity byte per row."""
    cdef int typ
    cdef int width
    cdef _Buf data
    cdef _Buf offsets
    cdef tuple constants  # T_ENUM: the constant names, UTF-8
    cdef int precision  # T_DECIMAL, T_TIMESTAMP
    cdef sq_i128 limit  # T_DECIMAL: 10 ** precision

    def __cinit__(self, int typ, constants=(), what=None, int precision=0):
        self.typ = typ
        self.width = {_T_LONG: 8, _T_INT: 4, _T_SHORT: 2, _T_BYTE: 1, _T_DOUBLE: 8, _T_FLOAT: 4,
                      _T_BOOL: 1, _T_DECIMAL: 16, _T_TIMESTAMP: 8}.get(typ, 0)
        self.precision = precision
        self.limit = pow10(precision)
        self.what = what or _NAMES.get(typ, "value")
        self.constants = tuple(c.encode("utf-8") for c in constants)
        self.data = _Buf()
        self.offsets = _Buf()
        self.valid = _Buf()
        self._start()

    cdef void _start(self) except *:
        self.n = 0
        self.nulls = 0
        self.data.size = 0
        self.valid.size = 0
        self.offsets.size = 0
        if self.width == 0:
            (<int32_t*>self.offsets.grow(4))[0] = 0

    cdef void reset(self) except *:
        self._start()

    cdef inline void _end_row(self, bint ok) except *:
        self.valid.grow(1)[0] = ok
        if not ok:
            self.nulls += 1
        if self.width == 0:
            if self.data.size > 0x7FFFFFFF:
                raise OverflowError("more than 2 GiB of string data in one batch")
            (<int32_t*>self.offsets.grow(4))[0] = <int32_t>self.data.size
        self.n += 1

    cdef inline void _put(self, const uint8_t* src, Py_ssize_t n) except *:
        cdef char* d = self.data.grow(n)
        memcpy(d, src, n)
        self._end_row(True)

    cdef void drop_last(self) except *:
        if self.n <= 0:
            raise ValueError(f"{self.what}: no row to drop")
        self.n -= 1
        self.valid.size -= 1
        if not self.valid.data[self.n]:
            self.nulls -= 1
        if self.width:
            self.data.size -= self.width
        else:
            self.offsets.size -= 4
            self.data.size = (<int32_t*>self.offsets.data)[self.n]

    cdef void null(self) except *:
        if self.width:
            self.data.grow(self.width)
        self._end_row(False)

    cdef void dup_last(self) except *:
        """Appends a copy of the last row (flat lists repeat the key)."""
        cdef Py_ssize_t start, size
        cdef bint ok
        cdef char* d
        if self.n <= 0:
            raise ValueError(f"{self.what}: no row to repeat")
        ok = self.valid.data[self.n - 1]
        if self.width:
            d = self.data.grow(self.width)
            memcpy(d, d - self.width, self.width)
        else:
            start = (<int32_t*>self.offsets.data)[self.n - 1]
            size = self.data.size - start
            d = self.data.grow(size)
            memcpy(d, self.data.data + start, size)
        self._end_row(ok)

    cdef Py_ssize_t read(self, const uint8_t* buf, Py_ssize_t pos, Py_ssize_t end) except -1:
        """Decodes one value at ``pos`` (reading at most to ``end``); returns where it ends."""
        cdef int w = self.width
        cdef int i
        cdef char* d
        cdef int32_t n
        cdef bytes name
        if w:
            if pos + w > end:
                raise DecodeError("value runs past the end of the data", pos)
            d = self.data.grow(w)
            if self.typ == _T_BOOL:
                d[0] = buf[pos] != 0
            else:
                for i in range(w):
                    d[i] = buf[pos + w - 1 - i]
            self._end_row(True)
            return pos + w
        if self.typ == _T_BYTES or self.typ == _T_STRING_DATA:
            if pos + 4 > end:
                raise DecodeError(f"{self.what} length runs past the end of the data", pos)
            n = be_i32(buf, pos)
            pos += 4
            if n < 0 or pos + n > end:
                raise DecodeError(
                    f"{self.what} of {n} bytes exceeds the {end - pos} bytes left", pos - 4)
            if self.typ == _T_STRING_DATA and not utf8_valid(buf + pos, n):
                raise DecodeError("string is not valid UTF-8", pos)
            self._put(buf + pos, n)
            return pos + n
        if self.typ == _T_ENUM:
            if pos + 4 > end:
                raise DecodeError("enum index runs past the end of the data", pos)
            n = be_i32(buf, pos)
            if n < 0 or n >= len(self.constants):
                raise DecodeError(
                    f"enum index {n} outside the {len(self.constants)} constants of {self.what}",
                    pos)
            name = <bytes>self.constants[n]
            self._put(<const uint8_t*><char*>name, len(name))
            return pos + 4
        return self._read_string(buf, pos, end)

    cdef int sql_get(self, const uint8_t* buf, Py_ssize_t base, Py_ssize_t slot,
                     Py_ssize_t size) except -1:
        cdef uint8_t b7
        cdef uint64_t n
        cdef Py_ssize_t voff, vn
        cdef const uint8_t* src
        if self.typ == _T_DECIMAL:
            return self._sql_decimal(buf, base, slot, size)
        if self.typ == _T_TIMESTAMP:
            return self._sql_timestamp(buf, base, slot, size)
        if self.width:
            if self.typ == _T_BOOL:
                self.data.grow(1)[0] = buf[slot] != 0
            else:  # little-endian inside BinaryRowData, as this host
                memcpy(self.data.grow(self.width), buf + slot, self.width)
            self._end_row(True)
            return 0
        b7 = buf[slot + 7]
        if b7 & 0x80:
            n = b7 & 0x7F
            if n > 7:
                raise DecodeError(f"inline binary length {n} > 7", slot)
            src = buf + slot
        else:
            var_region(buf, slot, size, &voff, &vn)
            n = <uint64_t>vn
            src = buf + base + voff
        if self.typ == _T_STRING and not utf8_valid(src, <Py_ssize_t>n):
            raise DecodeError("string field is not valid UTF-8", slot)
        self._put(src, <Py_ssize_t>n)
        return 0

    cdef int _sql_decimal(self, const uint8_t* buf, Py_ssize_t base, Py_ssize_t slot,
                          Py_ssize_t size) except -1:
        """DECIMAL(p, s): p <= 18 the unscaled long in the slot, else up to 16 big-endian bytes
        in the variable part; more than p digits is corrupt data (as on the pure path)."""
        cdef int64_t compact
        cdef sq_i128 v
        cdef Py_ssize_t off, n, i
        if self.precision <= 18:
            memcpy(&compact, buf + slot, 8)
            v = compact
        else:
            var_region(buf, slot, size, &off, &n)
            if n > 16:
                raise DecodeError(f"decimal of {n} bytes (at most 16)", slot)
            v = 0
            if n:
                v = -1 if buf[base + off] & 0x80 else 0
            for i in range(n):
                v = (v << 8) | buf[base + off + i]
        if not (-self.limit < v < self.limit):
            raise DecodeError(
                f"decimal unscaled value exceeds DECIMAL({self.precision}, ...)", slot)
        memcpy(self.data.grow(16), &v, 16)
        self._end_row(True)
        return 0

    cdef int _sql_timestamp(self, const uint8_t* buf, Py_ssize_t base, Py_ssize_t slot,
                            Py_ssize_t size) except -1:
        """TIMESTAMP(p > 3): the slot holds ``offset << 32 | nanos of the milli``, the millis
        are at the offset; microseconds (p <= 6) or nanoseconds."""
        cdef uint64_t v
        cdef uint64_t off, nanos
        cdef int64_t millis
        cdef sq_i128 t
        memcpy(&v, buf + slot, 8)
        off = v >> 32
        nanos = v & 0xFFFFFFFF
        if off + 8 > <uint64_t>size or nanos >= 1000000:
            raise DecodeError("invalid non-compact timestamp slot", slot)
        memcpy(&millis, buf + base + off, 8)
        if self.precision > 6:
            t = <sq_i128>millis * 1000000 + <sq_i128>nanos
        else:
            t = <sq_i128>millis * 1000 + <sq_i128>(nanos // 1000)
        if t < <sq_i128>LONG_MIN or t > -(<sq_i128>LONG_MIN) - 1:
            raise DecodeError("TIMESTAMP is out of the 64-bit range of its Arrow type", slot)
        (<int64_t*>self.data.grow(8))[0] = <int64_t>t
        self._end_row(True)
        return 0

    cdef Py_ssize_t _read_string(self, const uint8_t* buf, Py_ssize_t pos,
                                 Py_ssize_t end) except -1:
        """``StringValue.writeString``: varint (length+1, 0 = null), one varint per UTF-16 unit;
        written as UTF-8 (lone surrogates become U+FFFD, as in the pure path)."""
        cdef uint32_t b, c, shift
        cdef uint64_t n  # up to 35 bits: never truncated to a smaller, plausible length
        cdef Py_ssize_t i, e, k
        cdef char* d
        cdef bint ascii
        cdef uint32_t pending = 0  # a high surrogate waiting for its low half
        if pos >= end:
            raise DecodeError("string runs past the end of the data", pos)
        b = buf[pos]
        pos += 1
        n = b & 0x7F
        if b >= 0x80:
            shift = 7
            while True:
                if pos >= end:
                    raise DecodeError("string length runs past the end of the data", pos)
                b = buf[pos]
                pos += 1
                n |= <uint64_t>(b & 0x7F) << shift
                if b < 0x80:
                    break
                shift += 7
                if shift > 28:
                    raise DecodeError("string length varint longer than 5 bytes", pos)
        if n == 0:
            self.null()
            return pos
        n -= 1
        if n > <uint64_t>(end - pos):
            raise DecodeError(f"string of {n} chars exceeds the {end - pos} bytes left", pos)
        e = pos + <Py_ssize_t>n
        if e <= end:
            ascii = True
            for i in range(pos, e):
                if buf[i] >= 0x80:
                    ascii = False
                    break
            if ascii:
                d = self.data.grow(n)
                memcpy(d, buf + pos, n)
                self._end_row(True)
                return e
        for k in range(<Py_ssize_t>n):
            if pos >= end:
                raise DecodeError("string runs past the end of the data", pos)
            c = buf[pos]
            pos += 1
            if c >= 0x80:
                c &= 0x7F
                shift = 7
                while True:
                    if pos >= end:
                        raise DecodeError("string runs past the end of the data", pos)
                    b = buf[pos]
                    pos += 1
                    c |= (b & 0x7F) << shift
                    if b < 0x80:
                        break
                    shift += 7
                    if shift > 14:
                        raise DecodeError("string code unit longer than 3 bytes", pos)
                if c > 0xFFFF:
                    raise DecodeError(f"string code unit {c:#x} out of range", pos)
            if pending:
                if 0xDC00 <= c <= 0xDFFF:
                    put_utf8(self.data, 0x10000 + ((pending - 0xD800) << 10) + (c - 0xDC00))
                    pending = 0
                    continue
                put_utf8(self.data, 0xFFFD)
                pending = 0
            if 0xD800 <= c <= 0xDBFF:
                pending = c
            elif 0xDC00 <= c <= 0xDFFF:
                put_utf8(self.data, 0xFFFD)
            else:
                put_utf8(self.data, c)
        if pending:
            put_utf8(self.data, 0xFFFD)
        self._end_row(True)
        return pos

    cdef int slot(self, const uint8_t* buf, Py_ssize_t start, Py_ssize_t end) except -1:
        """Decodes a value that must fill ``[start, end)`` exactly."""
        cdef Py_ssize_t p
        if self.width and self.typ != _T_BOOL and end - start != self.width:
            raise DecodeError(
                f"{self.what} value of {end - start} bytes ({self.width} expected)", start)
        p = self.read(buf, start, end)
        if p != end:
            raise DecodeError(f"{self.what} used {p - start} of its {end - start} bytes", start)
        return 0

    cdef object array(self, object type):
        """The column as an Arrow array of ``type``; the buffers start over."""
        cdef Py_ssize_t i, n = self.n
        cdef bytearray bits
        cdef unsigned char* bp
        validity = _bitmap(self.valid, n, self.nulls)
        if self.typ == _T_BOOL:
            bits = bytearray((n + 7) // 8)
            bp = bits
            for i in range(n):
                if self.data.data[i]:
                    bp[i >> 3] |= 1 << (i & 7)
            out = pa.Array.from_buffers(type, n, [validity, pa.py_buffer(bits)], self.nulls)
        elif self.width:
            out = pa.Array.from_buffers(
                type, n, [validity, pa.py_buffer(self.data.take())], self.nulls)
        else:
            out = pa.Array.from_buffers(
                type, n,
                [validity, pa.py_buffer(self.offsets.take()), pa.py_buffer(self.data.take())],
                self.nulls)
        self._start()
        return out


_NAMES = {_T_LONG: "long", _T_INT: "int", _T_SHORT: "short", _T_BYTE: "byte", _T_DOUBLE: "double",
          _T_FLOAT: "float", _T_BOOL: "boolean", _T_STRING: "string", _T_BYTES: "byte array",
          _T_STRING_DATA: "string", _T_ENUM: "enum"}


cdef const char* _ROW_KIND_TEXT = b"+I-U+U-D"  # RowKind short strings by byte value


cdef class StructCol(Col):
    """A struct column: Tuple and TimeWindow (fields concatenated), POJO (flags byte, a null
    flag per field; nested POJOs are struct children), Row (null mask, RowKind bits) and
    ``BinaryRowData`` (int32 size, null bits, 8-byte little-endian slots)."""
    cdef int skind
    cdef list children
    cdef Py_ssize_t arity
    cdef int mask_offset
    cdef Py_ssize_t mask_bytes
    cdef Py_ssize_t null_bytes
    cdef Py_ssize_t fixed_end
    cdef bint row_kind  # BinaryRowData: children[0] is a string column of the RowKind
    cdef object derive  # None, or children arrays -> the arrays of values computed from them

    def __cinit__(self, int skind, list children, str what="value", int mask_offset=0,
                  bint row_kind=False, object derive=None):
        cdef Py_ssize_t fields
        self.skind = skind
        self.children = children
        self.arity = len(children)
        self.what = what
        self.mask_offset = mask_offset
        self.row_kind = row_kind
        self.derive = derive
        if row_kind and (skind != _S_ROWDATA or not children
                         or not isinstance(children[0], Column)):
            raise ValueError("a row kind column needs a BinaryRowData struct")
        fields = self.arity - (1 if row_kind else 0)
        self.mask_bytes = (mask_offset + self.arity + 7) // 8
        self.null_bytes = ((fields + 63 + 8) // 64) * 8
        self.fixed_end = self.null_bytes + 8 * fields
        self.valid = _Buf()
        self.n = 0
        self.nulls = 0

    cdef inline void _row(self) except *:
        self.valid.grow(1)[0] = 1
        self.n += 1

    cdef void reset(self) except *:
        cdef Col c
        for c in self.children:
            c.reset()
        self.n = 0
        self.nulls = 0
        self.valid.size = 0

    cdef void null(self) except *:
        cdef Col c
        for c in self.children:
            c.null()
        self.valid.grow(1)[0] = 0
        self.nulls += 1
        self.n += 1

    cdef void dup_last(self) except *:
        cdef Col c
        cdef bint ok
        if self.n <= 0:
            raise ValueError(f"{self.what}: no row to repeat")
        ok = self.valid.data[self.n - 1]
        for c in self.children:
            c.dup_last()
        self.valid.grow(1)[0] = ok
        if not ok:
            self.nulls += 1
        self.n += 1

    cdef void drop_last(self) except *:
        cdef Col c
        if self.n <= 0:
            raise ValueError(f"{self.what}: no row to drop")
        for c in self.children:
            c.drop_last()
        self.n -= 1
        self.valid.size -= 1
        if not self.valid.data[self.n]:
            self.nulls -= 1

    cdef Py_ssize_t read(self, const uint8_t* buf, Py_ssize_t pos, Py_ssize_t end) except -1:
        cdef Col c
        cdef int flags, bit
        cdef Py_ssize_t m, i
        cdef int32_t size
        if self.skind == _S_TUPLE:
            for c in self.children:
                pos = c.read(buf, pos, end)
        elif self.skind == _S_POJO:
            if pos >= end:
                raise DecodeError(f"POJO {self.what} runs past the end of the data", pos)
            flags = buf[pos]
            pos += 1
            if flags == 2:
                for c in self.children:
                    if pos >= end:
                        raise DecodeError(f"POJO {self.what} runs past the end of the data", pos)
                    if buf[pos]:
                        c.null()
                        pos += 1
                    else:
                        pos = c.read(buf, pos + 1, end)
            elif flags & 1:
                self.null()
                return pos
            elif flags & 12:
                raise DecodeError(
                    f"POJO {self.what} value written as a subclass (flags {flags}); subclass "
                    "values are not decodable", pos - 1)
            else:
                raise DecodeError(f"POJO {self.what}: invalid flags byte {flags}", pos - 1)
        elif self.skind == _S_ROW:
            if pos + self.mask_bytes > end:
                raise DecodeError("row null mask runs past the end of the data", pos)
            m = pos
            pos += self.mask_bytes
            i = 0
            for c in self.children:
                bit = self.mask_offset + i
                if buf[m + (bit >> 3)] & (0x80 >> (bit & 7)):
                    c.null()
                else:
                    pos = c.read(buf, pos, end)
                i += 1
        else:
            if pos + 4 > end:
                raise DecodeError("binary row size runs past the end of the data", pos)
            size = be_i32(buf, pos)
            pos += 4
            if size < 0 or pos + size > end:
                raise DecodeError(
                    f"binary data of {size} bytes exceeds the {end - pos} bytes left", pos - 4)
            self._row_data(buf, pos, size)
            return pos + size
        self._row()
        return pos

    cdef int _row_data(self, const uint8_t* buf, Py_ssize_t base, Py_ssize_t size) except -1:
        cdef Col c
        cdef Py_ssize_t i = 0
        cdef uint8_t kind
        cdef bint first = self.row_kind
        if size < self.fixed_end:
            raise DecodeError(
                f"binary row of {size} bytes is shorter than its {self.fixed_end}-byte fixed part "
                f"({self.arity - (1 if self.row_kind else 0)} fields)", base)
        for c in self.children:
            if first:  # the RowKind: byte 0 of the header
                first = False
                kind = buf[base]
                if kind > 3:
                    raise DecodeError(f"binary row with an invalid row kind byte {kind}", base)
                (<Column>c)._put(<const uint8_t*>_ROW_KIND_TEXT + 2 * kind, 2)
                continue
            if buf[base + ((i + 8) >> 3)] & (1 << ((i + 8) & 7)):
                c.null()
            else:
                c.sql_get(buf, base, base + self.null_bytes + 8 * i, size)
            i += 1
        self._row()
        return 0

    cdef int sql_get(self, const uint8_t* buf, Py_ssize_t base, Py_ssize_t slot,
                     Py_ssize_t size) except -1:
        """A nested ROW field: a BinaryRowData in the variable part."""
        cdef Py_ssize_t off, n
        if self.skind != _S_ROWDATA:
            raise NotImplementedError
        var_region(buf, slot, size, &off, &n)
        return self._row_data(buf, base + off, n)

    cdef int slot(self, const uint8_t* buf, Py_ssize_t start, Py_ssize_t end) except -1:
        if self.skind == _S_ROWDATA:
            # SQL keys: int32 size, then exactly that many BinaryRowData bytes
            if end - start < 4 or be_i32(buf, start) != end - start - 4:
                raise DecodeError(
                    f"RowData size prefix does not match its {end - start}-byte slot", start)
            return self._row_data(buf, start + 4, end - start - 4)
        return Col.slot(self, buf, start, end)

    cdef object array(self, object type):
        cdef Col c
        cdef Py_ssize_t i
        children = [(<Col>self.children[i]).array(type.field(i).type) for i in range(self.arity)]
        if self.derive is not None:
            children.extend(self.derive(children))
        out = pa.Array.from_buffers(
            type, self.n, [_bitmap(self.valid, self.n, self.nulls)], self.nulls, 0, children)
        self.n = 0
        self.nulls = 0
        self.valid.size = 0
        return out


cdef class NullCol(Col):
    """Values that are always null: ``NullValue`` (no bytes) and Flink SQL's ``NullSerializer``
    placeholders of state-backed data views (one byte, as VoidSerializer)."""
    cdef Py_ssize_t size

    def __cinit__(self, Py_ssize_t size, str what="null"):
        self.size = size
        self.what = what
        self.n = 0

    cdef Py_ssize_t read(self, const uint8_t* buf, Py_ssize_t pos, Py_ssize_t end) except -1:
        if pos + self.size > end:
            raise DecodeError(f"{self.what} runs past the end of the data", pos)
        self.n += 1
        return pos + self.size

    cdef void null(self) except *:
        self.n += 1

    cdef void dup_last(self) except *:
        if self.n <= 0:
            raise ValueError(f"{self.what}: no row to repeat")
        self.n += 1

    cdef void drop_last(self) except *:
        if self.n <= 0:
            raise ValueError(f"{self.what}: no row to drop")
        self.n -= 1

    cdef void reset(self) except *:
        self.n = 0

    cdef object array(self, object type):
        out = pa.nulls(self.n, type)
        self.n = 0
        return out


cdef class VarCol(Col):
    """A BinaryRowData field stored in the variable part and written by another serializer
    (``RAW``: ``RawValueDataSerializer``): the inner column decodes exactly those bytes."""
    cdef Col inner

    def __cinit__(self, Col inner):
        self.inner = inner
        self.what = inner.what

    cdef int sql_get(self, const uint8_t* buf, Py_ssize_t base, Py_ssize_t slot,
                     Py_ssize_t size) except -1:
        cdef Py_ssize_t off, n
        var_region(buf, slot, size, &off, &n)
        return self.inner.slot(buf, base + off, base + off + n)

    cdef void null(self) except *:
        self.inner.null()

    cdef void dup_last(self) except *:
        self.inner.dup_last()

    cdef void drop_last(self) except *:
        self.inner.drop_last()

    cdef void reset(self) except *:
        self.inner.reset()

    cdef object array(self, object type):
        return self.inner.array(type)


cdef class ListCol(Col):
    """``ListSerializer``/``ArrayListSerializer`` values: int32 size, then the elements (an
    Arrow list over the element column). Only for values (not keys or namespaces, which flat
    lists repeat)."""
    cdef Col inner
    cdef _Buf offsets
    cdef Py_ssize_t elements
    cdef Py_ssize_t min_size

    def __cinit__(self, Col inner, Py_ssize_t min_size, str what="list"):
        self.inner = inner
        self.min_size = min_size
        self.what = what
        self.offsets = _Buf()
        self.valid = _Buf()
        self.reset()

    cdef void reset(self) except *:
        self.inner.reset()
        self.n = 0
        self.nulls = 0
        self.elements = 0
        self.valid.size = 0
        self.offsets.size = 0
        (<int32_t*>self.offsets.grow(4))[0] = 0

    cdef inline void _end_row(self, bint ok) except *:
        self.valid.grow(1)[0] = ok
        if not ok:
            self.nulls += 1
        if self.elements > 0x7FFFFFFF:
            raise OverflowError("more than 2**31 list elements in one batch")
        (<int32_t*>self.offsets.grow(4))[0] = <int32_t>self.elements
        self.n += 1

    cdef Py_ssize_t read(self, const uint8_t* buf, Py_ssize_t pos, Py_ssize_t end) except -1:
        cdef int32_t count, i
        if pos + 4 > end:
            raise DecodeError("list size runs past the end of the data", pos)
        count = be_i32(buf, pos)
        pos += 4
        if count < 0:
            raise DecodeError(f"negative list size {count}", pos)
        if self.min_size > 0:
            if <int64_t>count * self.min_size > end - pos:
                raise DecodeError(f"list size {count} exceeds the {end - pos} bytes left", pos)
        elif count > (1 << 20):
            raise DecodeError(f"list size {count} is implausibly large", pos)
        for i in range(count):
            pos = self.inner.read(buf, pos, end)
        self.elements += count
        self._end_row(True)
        return pos

    cdef void null(self) except *:
        self._end_row(False)

    cdef void dup_last(self) except *:
        raise NotImplementedError("list keys are not compiled")

    cdef void drop_last(self) except *:
        raise NotImplementedError("list keys are not compiled")

    cdef object array(self, object type):
        cdef Py_ssize_t n = self.n
        values = self.inner.array(type.value_type)
        out = pa.Array.from_buffers(
            type, n, [_bitmap(self.valid, n, self.nulls), pa.py_buffer(self.offsets.take())],
            self.nulls, 0, [values])
        self.n = 0
        self.nulls = 0
        self.elements = 0
        self.valid.size = 0
        (<int32_t*>self.offsets.grow(4))[0] = 0
        return out


cdef class SqlArrayCol(ListCol):
    """SQL ``ARRAY``: a ``BinaryArrayData`` (int32 n little-endian, null bits, ``min_size``-byte
    element slots) as a RowData field (in the variable part) or as a serializer's value (int32
    size first, ``ArrayDataSerializer``)."""

    cdef Py_ssize_t read(self, const uint8_t* buf, Py_ssize_t pos, Py_ssize_t end) except -1:
        cdef int32_t size
        if pos + 4 > end:
            raise DecodeError("binary data size runs past the end of the data", pos)
        size = be_i32(buf, pos)
        pos += 4
        if size < 0 or pos + size > end:
            raise DecodeError(
                f"binary data of {size} bytes exceeds the {end - pos} bytes left", pos - 4)
        self._array(buf, pos, size)
        return pos + size

    cdef int sql_get(self, const uint8_t* buf, Py_ssize_t base, Py_ssize_t slot,
                     Py_ssize_t size) except -1:
        cdef Py_ssize_t off, n
        var_region(buf, slot, size, &off, &n)
        return self._array(buf, base + off, n)

    cdef int _array(self, const uint8_t* buf, Py_ssize_t start, Py_ssize_t size) except -1:
        cdef int32_t n, i
        cdef int64_t null_len
        cdef Py_ssize_t slot
        if size < 4:
            raise DecodeError(f"binary array of {size} bytes", start)
        memcpy(&n, buf + start, 4)
        null_len = ((<int64_t>n + 31) // 32) * 4
        if n < 0 or 4 + null_len + <int64_t>n * self.min_size > size:
            raise DecodeError(f"binary array of {n} elements does not fit its {size} bytes",
                              start)
        slot = start + 4 + null_len
        for i in range(n):
            if buf[start + 4 + (i >> 3)] & (1 << (i & 7)):
                self.inner.null()
            else:
                self.inner.sql_get(buf, start, slot, size)
            slot += self.min_size
        self.elements += n
        self._end_row(True)
        return 0


cdef inline Py_ssize_t _length_suffix(const uint8_t* buf, Py_ssize_t pos, Py_ssize_t end,
                                      Py_ssize_t expected, str what) except -1:
    """Skips the "variable int bytes" (little-endian, as few bytes as ``expected`` needs, at
    least one) Flink writes after a key or namespace when both have variable length, checking
    that they say ``expected`` (statequery.backends.keygroups._length_suffix)."""
    cdef uint64_t value = 0
    cdef int shift = 0
    cdef Py_ssize_t n = 0
    while True:
        if pos + n >= end:
            raise DecodeError(f"{what} length suffix runs past the end of the composite key", pos)
        value |= (<uint64_t>buf[pos + n]) << shift
        n += 1
        shift += 8
        if shift >= 64 or (<uint64_t>expected >> shift) == 0:
            break
    if value != <uint64_t>expected:
        raise DecodeError(
            f"{what} length suffix says {value}, the {what} took {expected} bytes", pos)
    return pos + n


cdef class EntrySink:
    """Decodes one state's composite-key entries (``kpos`` after the key-group prefix) into
    column buffers. Callable like a pure-Python entry handler.

    ``key``, ``value``, ``user_key`` and ``ns`` are :class:`Col` instances (or type codes of
    scalar columns); ``ns`` None is the VoidNamespace (one 0 byte). ``ttl``: values are
    ``TtlValue``s (int64 last access, then the value), ``last_access`` is a column of its own.
    ``suffixed``: key and namespace both have variable length, so each is followed by its
    length (RocksDB's composite keys, ``SerializedCompositeKeyBuilder``; not timers).
    """
    cdef int kind
    cdef Col key
    cdef Col user_key
    cdef Col value
    cdef Col ns
    cdef Column last
    cdef _Buf kgs
    cdef _Buf ints  # timestamps (timers), list offsets (rows) or element indexes (flat)
    cdef Py_ssize_t rows
    cdef Py_ssize_t elements
    cdef bint skip
    cdef bint suffixed
    cdef _Buf cur  # K_MAP_NESTED: the composite key prefix (key and namespace) of the open row
    cdef int cur_kg
    cdef bint open_row

    def __cinit__(self, int kind, key, value, user_key=None, ns=None, bint ttl=False,
                  bint skip=False, bint suffixed=False):
        self.kind = kind
        self.skip = skip
        self.suffixed = suffixed
        self.key = _as_col(key)
        self.value = _as_col(value)
        self.user_key = _as_col(user_key)
        self.ns = _as_col(ns)
        self.last = Column(_T_LONG) if ttl else None
        if self.key is None or (kind != _K_TIMER and self.value is None) or (
                (kind == _K_MAP or kind == _K_MAP_NESTED) and self.user_key is None):
            raise ValueError("an entry sink needs key, value (and user key) columns")
        if suffixed and (self.ns is None or kind == _K_TIMER):
            raise ValueError("length suffixes need a namespace column, and timers have none")
        self.kgs = _Buf()
        self.ints = _Buf()
        self.cur = _Buf()
        self._start()

    cdef void _start(self) except *:
        self.rows = 0
        self.elements = 0
        self.kgs.size = 0
        self.ints.size = 0
        self.open_row = False
        if self.kind == _K_LIST or self.kind == _K_MAP_NESTED:
            (<int32_t*>self.ints.grow(4))[0] = 0

    cdef inline void _offset(self) except *:
        """Appends the end offset of a row's list or map (int32, as Arrow's offsets)."""
        if self.elements > 0x7FFFFFFF:
            raise OverflowError("more than 2**31 list elements or map entries in one batch")
        (<int32_t*>self.ints.grow(4))[0] = <int32_t>self.elements

    def finish(self):
        """Completes the open row of a nested map (at the end of every key group)."""
        self._finish_open()

    cdef inline void _finish_open(self) except *:
        if self.open_row:
            self.open_row = False
            self._offset()
            (<int32_t*>self.kgs.grow(4))[0] = self.cur_kg
            self.rows += 1

    def __len__(self):
        return self.rows

    def __call__(self, buf, Py_ssize_t kpos, Py_ssize_t kend, Py_ssize_t vpos, Py_ssize_t vend,
                 int kg):
        cdef const uint8_t[::1] view = buf
        if not (0 <= kpos <= kend <= view.shape[0] and 0 <= vpos <= vend <= view.shape[0]):
            raise DecodeError("entry outside its buffer", kpos)
        cdef const uint8_t* b = &view[0] if view.shape[0] else NULL
        self.add(b, kpos, kend, b, vpos, vend, kg)

    cdef int _key_ns(self, const uint8_t* buf, Py_ssize_t kpos, Py_ssize_t kend,
                     str left) except -1:
        """Key and namespace filling ``[kpos, kend)`` (value, list and timer entries)."""
        cdef Py_ssize_t e, p
        if self.ns is None:
            e = kend - 1
            if e < kpos:
                raise DecodeError("key shorter than its namespace", kpos)
            if buf[e] != 0:
                raise DecodeError(f"VoidNamespace byte is {buf[e]}, expected 0", e)
            self.key.slot(buf, kpos, e)
            return 0
        p = self._key_then_ns(buf, kpos, kend)
        if p != kend:
            raise DecodeError(left, p)
        return 0

    cdef inline Py_ssize_t _key_then_ns(self, const uint8_t* buf, Py_ssize_t kpos,
                                        Py_ssize_t kend) except -1:
        """Key and (non-void) namespace from ``kpos``, with their length suffixes when
        ``suffixed``; returns the position after them."""
        cdef Py_ssize_t p, start
        p = self.key.read(buf, kpos, kend)
        if not self.suffixed:
            return self.ns.read(buf, p, kend)
        p = _length_suffix(buf, p, kend, p - kpos, "key")
        start = p
        p = self.ns.read(buf, p, kend)
        return _length_suffix(buf, p, kend, p - start, "namespace")

    cdef inline Py_ssize_t _element(self, const uint8_t* vb, Py_ssize_t p,
                                    Py_ssize_t vend) except -1:
        if self.last is not None:
            p = self.last.read(vb, p, vend)
        return self.value.read(vb, p, vend)

    cdef int add(self, const uint8_t* buf, Py_ssize_t kpos, Py_ssize_t kend, const uint8_t* vb,
                 Py_ssize_t vpos, Py_ssize_t vend, int kg) except -1:
        """One entry: its composite key in ``buf[kpos:kend]`` (after the key-group prefix), its
        value in ``vb[vpos:vend]`` (the same buffer for canonical streams, not for RocksDB)."""
        cdef int kind = self.kind
        cdef Py_ssize_t p
        cdef int64_t ts
        cdef int32_t i
        if kind == _K_VALUE:
            self._key_ns(buf, kpos, kend, "key bytes left after the namespace")
            if self.last is not None:
                vpos = self.last.read(vb, vpos, vend)
            self.value.slot(vb, vpos, vend)
        elif kind == _K_TIMER:
            if vend != vpos:
                raise DecodeError(
                    f"timer entry with a {vend - vpos}-byte value (expected empty)", vpos)
            if kpos + 8 > kend:
                raise DecodeError("timer key shorter than its timestamp", kpos)
            ts = be_i64(buf, kpos) ^ LONG_MIN
            if self.ns is None and kend - 1 < kpos + 8:
                raise DecodeError("timer key shorter than its namespace", kpos)
            self._key_ns(buf, kpos + 8, kend, "timer key bytes left after the namespace")
            (<int64_t*>self.ints.grow(8))[0] = ts
        elif kind == _K_MAP_NESTED:
            self._nested_entry(buf, kpos, kend, vb, vpos, vend, kg)
            return 0
        elif kind == _K_MAP:
            if self.ns is None:
                p = self.key.read(buf, kpos, kend)
                if p >= kend:
                    raise DecodeError("key runs into the end of the composite key", p)
                if buf[p] != 0:
                    raise DecodeError(f"VoidNamespace byte is {buf[p]}, expected 0", p)
                p += 1
            else:
                p = self._key_then_ns(buf, kpos, kend)
            self.user_key.slot(buf, p, kend)
            if vpos >= vend:
                raise DecodeError("map value without its null flag", vpos)
            if vb[vpos]:
                self.value.null()
                if self.last is not None:
                    self.last.null()
            else:
                vpos += 1
                if self.last is not None:
                    vpos = self.last.read(vb, vpos, vend)
                self.value.slot(vb, vpos, vend)
        else:
            self._key_ns(buf, kpos, kend, "key bytes left after the namespace")
            i = 0
            p = vpos
            if p < vend:
                while True:
                    if kind == _K_LIST_FLAT:
                        if i:
                            self.key.dup_last()
                            if self.ns is not None:
                                self.ns.dup_last()
                            (<int32_t*>self.kgs.grow(4))[0] = kg
                            self.rows += 1
                        (<int32_t*>self.ints.grow(4))[0] = i
                    p = self._element(vb, p, vend)
                    i += 1
                    if p >= vend:
                        if p > vend:
                            raise DecodeError("list element runs past the end of the value", p)
                        break
                    if vb[p] != 0x2C:
                        raise DecodeError(f"list delimiter expected, found byte {vb[p]:#x}", p)
                    p += 1
                    if p == vend:
                        raise DecodeError("list value ends with a delimiter", p)
            if kind == _K_LIST_FLAT:
                if i == 0:
                    # no elements: no row (the key decoded above is dropped)
                    self.key.drop_last()
                    if self.ns is not None:
                        self.ns.drop_last()
                    return 0
            else:
                self.elements += i
                self._offset()
        (<int32_t*>self.kgs.grow(4))[0] = kg
        self.rows += 1
        return 0

    cdef int _nested_entry(self, const uint8_t* buf, Py_ssize_t kpos, Py_ssize_t kend,
                           const uint8_t* vb, Py_ssize_t vpos, Py_ssize_t vend,
                           int kg) except -1:
        """A map entry of a nested map: consecutive entries with the same key and namespace
        bytes (and key group) form one row."""
        cdef Py_ssize_t p, size
        if self.ns is None:
            p = self.key.read(buf, kpos, kend)
            if p >= kend:
                raise DecodeError("key runs into the end of the composite key", p)
            if buf[p] != 0:
                raise DecodeError(f"VoidNamespace byte is {buf[p]}, expected 0", p)
            p += 1
        else:
            p = self._key_then_ns(buf, kpos, kend)
        size = p - kpos
        if (self.open_row and kg == self.cur_kg and size == self.cur.size
                and memcmp(self.cur.data, buf + kpos, size) == 0):
            self._heap_drop()  # the row's key and namespace are there already
        else:
            self._finish_open()
            self.cur.size = 0
            memcpy(self.cur.grow(size), buf + kpos, size)
            self.cur_kg = kg
            self.open_row = True
        self.user_key.slot(buf, p, kend)
        if vpos >= vend:
            raise DecodeError("map value without its null flag", vpos)
        if vb[vpos]:
            self.value.null()
        else:
            self.value.slot(vb, vpos + 1, vend)
        self.elements += 1
        return 0

    # -- the hashmap checkpoint format (statequery.backends.heap) ------------------------------

    def walk(self, buf, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t n, int kg):
        """Decodes one state block of a heap key group: ``n`` entries from ``pos`` (namespace,
        key and the state's full value, or timers), reading at most to ``end``; returns where
        the block ends. A skipping sink (``skip``) drops what it decoded."""
        cdef const uint8_t[::1] view = buf
        cdef Py_ssize_t i
        if not (0 <= pos <= end <= view.shape[0]):
            raise DecodeError("state block outside its buffer", pos)
        cdef const uint8_t* b = &view[0] if view.shape[0] else NULL
        for i in range(n):
            pos = self._heap_entry(b, pos, end, kg)
        if self.skip:
            self.reset()
        return pos

    cdef void reset(self) except *:
        self.key.reset()
        if self.value is not None:
            self.value.reset()
        if self.user_key is not None:
            self.user_key.reset()
        if self.ns is not None:
            self.ns.reset()
        if self.last is not None:
            self.last.reset()
        self._start()

    cdef inline Py_ssize_t _heap_ns(self, const uint8_t* b, Py_ssize_t pos,
                                    Py_ssize_t end) except -1:
        if self.ns is not None:
            return self.ns.read(b, pos, end)
        if pos >= end:
            raise DecodeError("VoidNamespace runs past the end of the data", pos)
        if b[pos] != 0:
            raise DecodeError(f"VoidNamespace byte is {b[pos]}, expected 0", pos)
        return pos + 1

    cdef inline void _heap_drop(self) except *:
        self.key.drop_last()
        if self.ns is not None:
            self.ns.drop_last()

    cdef inline void _heap_dup(self) except *:
        self.key.dup_last()
        if self.ns is not None:
            self.ns.dup_last()

    cdef inline void _heap_row(self, int kg) except *:
        (<int32_t*>self.kgs.grow(4))[0] = kg
        self.rows += 1

    cdef Py_ssize_t _heap_entry(self, const uint8_t* b, Py_ssize_t pos, Py_ssize_t end,
                                int kg) except -1:
        cdef int kind = self.kind
        cdef int64_t ts
        cdef int32_t count, j
        if kind == _K_TIMER:
            # TimerSerializer: timestamp (sign bit flipped), key, namespace
            if pos + 8 > end:
                raise DecodeError("timer runs past the end of the data", pos)
            ts = be_i64(b, pos) ^ LONG_MIN
            pos = self.key.read(b, pos + 8, end)
            pos = self._heap_ns(b, pos, end)
            (<int64_t*>self.ints.grow(8))[0] = ts
            self._heap_row(kg)
            return pos
        pos = self._heap_ns(b, pos, end)
        pos = self.key.read(b, pos, end)
        if kind == _K_VALUE:
            if self.last is not None:
                pos = self.last.read(b, pos, end)
            pos = self.value.read(b, pos, end)
            self._heap_row(kg)
            return pos
        # ListSerializer / MapSerializer: int32 size, then the elements or entries
        if pos + 4 > end:
            raise DecodeError("collection size runs past the end of the data", pos)
        count = be_i32(b, pos)
        pos += 4
        if count < 0 or count > end - pos:
            raise DecodeError(f"collection size {count} exceeds the {end - pos} bytes left",
                              pos - 4)
        if count == 0:
            self._heap_drop()  # no rows (Flink keeps no empty lists or maps)
            return pos
        if kind == _K_MAP_NESTED:
            for j in range(count):
                pos = self.user_key.read(b, pos, end)
                if pos >= end:
                    raise DecodeError("map entry null flag runs past the end of the data", pos)
                if b[pos]:
                    pos += 1
                    self.value.null()
                else:
                    pos = self.value.read(b, pos + 1, end)
            self.elements += count
            self._offset()
            self._heap_row(kg)
            return pos
        if kind == _K_MAP:
            for j in range(count):
                if j:
                    self._heap_dup()
                pos = self.user_key.read(b, pos, end)
                if pos >= end:
                    raise DecodeError("map entry null flag runs past the end of the data", pos)
                if b[pos]:
                    pos += 1
                    self.value.null()
                    if self.last is not None:
                        self.last.null()
                else:
                    pos += 1
                    if self.last is not None:
                        pos = self.last.read(b, pos, end)
                    pos = self.value.read(b, pos, end)
                self._heap_row(kg)
            return pos
        for j in range(count):
            if kind == _K_LIST_FLAT:
                if j:
                    self._heap_dup()
                (<int32_t*>self.ints.grow(4))[0] = j
            pos = self._element(b, pos, end)
            if kind == _K_LIST_FLAT:
                self._heap_row(kg)
        if kind == _K_LIST:
            self.elements += count
            self._offset()
            self._heap_row(kg)
        return pos

    def arrays(self, schema):
        """``{column: pa.Array}`` for the columns of ``schema`` this sink fills; starts over."""
        cdef Py_ssize_t n = self.rows, i
        cdef int64_t v
        cdef bytearray bits
        cdef unsigned char* bp
        cdef int64_t* tsp
        cdef Py_ssize_t nulls = 0
        out = {}
        out["key_group"] = pa.Array.from_buffers(
            pa.int32(), n, [None, pa.py_buffer(self.kgs.take())])
        out["key"] = self.key.array(schema.field("key").type)
        if self.ns is None:
            out["namespace"] = pa.nulls(n, schema.field("namespace").type)
        else:
            out["namespace"] = self.ns.array(schema.field("namespace").type)
        if self.kind == _K_TIMER:
            bits = bytearray((n + 7) // 8)
            bp = bits
            tsp = <int64_t*>self.ints.data
            for i in range(n):
                v = tsp[i]
                if TS_LO <= v <= TS_HI:
                    bp[i >> 3] |= 1 << (i & 7)
                else:
                    nulls += 1
            data = pa.py_buffer(self.ints.take())
            out["timestamp_ms"] = pa.Array.from_buffers(pa.int64(), n, [None, data])
            out["timestamp"] = pa.Array.from_buffers(
                schema.field("timestamp").type, n, [pa.py_buffer(bits) if nulls else None, data],
                nulls)
        elif self.kind == _K_MAP_NESTED:
            t = schema.field("map").type
            offsets = pa.Array.from_buffers(
                pa.int32(), n + 1, [None, pa.py_buffer(self.ints.take())])
            out["map"] = pa.MapArray.from_arrays(
                offsets, self.user_key.array(t.key_type), self.value.array(t.item_type), type=t)
        elif self.kind == _K_MAP:
            out["user_key"] = self.user_key.array(schema.field("user_key").type)
            out["value"] = self.value.array(schema.field("value").type)
        elif self.kind == _K_LIST:
            t = schema.field("value").type
            offsets = pa.py_buffer(self.ints.take())
            out["value"] = pa.Array.from_buffers(
                t, n, [None, offsets], 0, 0, [self.value.array(t.value_type)])
            if self.last is not None:
                t = schema.field("last_access").type
                out["last_access"] = pa.Array.from_buffers(
                    t, n, [None, offsets], 0, 0, [self.last.array(t.value_type)])
        elif self.kind == _K_LIST_FLAT:
            out["index"] = pa.Array.from_buffers(
                pa.int32(), n, [None, pa.py_buffer(self.ints.take())])
            out["value"] = self.value.array(schema.field("value").type)
        else:
            out["value"] = self.value.array(schema.field("value").type)
        if self.last is not None and self.kind != _K_LIST:
            out["last_access"] = self.last.array(schema.field("last_access").type)
        self._start()
        for a in out.values():
            # the buffers' sizes against the lengths and types (constant time per array): an
            # inconsistency is an ArrowInvalid (a typed error at flush), never a read of memory
            # the buffers do not have
            a.validate()
        return out


cdef Col _as_col(c):
    """A column from a :class:`Col` or a scalar type code (0 or None: no column)."""
    if c is None or isinstance(c, Col):
        return c
    if c == 0:
        return None
    return Column(c)


def scan_key_group(buf, int kg, int prefix_len, handlers, finishers=(), list runs=None,
                   Py_ssize_t base=0, Py_ssize_t avail=-1, tuple state=None):
    """The compiled twin of :func:`statequery.backends.keygroups.scan_key_group` (``runs``:
    ``state id, start, length`` appended per run, the run index; ``base``, ``avail``,
    ``state``: a walk in pieces, as there)."""
    cdef const uint8_t[::1] view = buf
    cdef Py_ssize_t n = view.shape[0]
    cdef const uint8_t* b = &view[0] if n else NULL
    cdef Py_ssize_t end = n if avail < 0 else avail
    cdef Py_ssize_t n_states = len(handlers)
    cdef Py_ssize_t pos, entry, kpos, kend, vpos, vend, entries = 0, run_start
    cdef int32_t klen, vlen
    cdef int sid, nxt, first, hi, lo, prefix, phase
    cdef object handler
    cdef EntrySink sink
    cdef KeyFilter filt
    cdef bint is_sink
    if end < n:
        raise ValueError(f"{end} bytes of the key group available, the buffer holds {n}")
    if state is None:
        if n < 2:
            if end >= 2:
                raise ValueError("a piece of a key group shorter than its state id")
            raise DecodeError("key group shorter than its state id", 0)
        sid = (b[0] << 8) | b[1]
        if sid >= n_states:
            raise DecodeError(f"state id {sid} but the header lists {n_states} states", 0)
        pos = run_start = 2
        phase = 0
    else:
        sid, phase, run_start = state
        if not 0 <= sid < n_states:
            raise ValueError(f"resumed at state id {sid} of {n_states}")
        run_start -= base
        pos = 0
    handler = handlers[sid]
    if prefix_len == 1:
        hi, lo = kg, -1
    else:
        hi, lo = kg >> 8, kg & 0xFF
    while True:
        if phase == 0 and handler is None:
            while True:
                entry = pos
                if pos + 4 > n:
                    if pos + 4 > end:
                        raise DecodeError("key group ends inside an entry (truncated?)", entry)
                    return entries, entry, sid, 0, base + run_start
                klen = be_i32(b, pos)
                kend = pos + 4 + klen
                if kend < 0 or kend + 4 > n:
                    if kend < 0 or kend + 4 > end:
                        raise DecodeError("key group ends inside an entry (truncated?)", entry)
                    return entries, entry, sid, 0, base + run_start
                vlen = be_i32(b, kend)
                if klen < prefix_len or vlen < 0:
                    raise DecodeError(f"impossible key/value length {klen}/{vlen}", entry)
                first = b[pos + 4]
                pos = kend + 4 + vlen
                if pos > n:
                    if pos > end:
                        raise DecodeError(f"impossible value length {vlen}", kend)
                    return entries, entry, sid, 0, base + run_start
                entries += 1
                if first & 0x80:
                    break
            if (first & 0x7F) != hi:
                raise DecodeError(f"entry of another key group inside key group {kg}", entry + 4)
        elif phase == 0:
            filt = handler if isinstance(handler, KeyFilter) else None
            if filt is not None:
                handler = filt.inner
            is_sink = isinstance(handler, EntrySink)
            sink = handler if is_sink else None
            while True:
                entry = pos
                if pos + 4 > n:
                    if pos + 4 > end:
                        raise DecodeError("key group ends before its end mark", pos)
                    return entries, entry, sid, 0, base + run_start
                klen = be_i32(b, pos)
                kpos = pos + 4
                kend = kpos + klen
                if klen < prefix_len or kend + 4 > n:
                    if klen < prefix_len or kend + 4 > end:
                        raise DecodeError(f"impossible key length {klen}", entry)
                    return entries, entry, sid, 0, base + run_start
                vlen = be_i32(b, kend)
                vpos = kend + 4
                vend = vpos + vlen
                if vlen < 0 or vend > n:
                    if vlen < 0 or vend > end:
                        raise DecodeError(f"impossible value length {vlen}", kend)
                    return entries, entry, sid, 0, base + run_start
                first = b[kpos]
                if (first & 0x7F) != hi or (lo >= 0 and b[kpos + 1] != lo):
                    prefix = (first & 0x7F) if lo < 0 else ((first & 0x7F) << 8) | b[kpos + 1]
                    raise DecodeError(f"entry of key group {prefix} inside key group {kg}", kpos)
                if filt is not None and not filt.matches(b, kpos + prefix_len, kend):
                    pass
                elif is_sink:
                    try:
                        sink.add(b, kpos + prefix_len, kend, b, vpos, vend, kg)
                    except DecodeError:
                        raise
                    except (OverflowError, ValueError) as e:
                        raise DecodeError(f"{type(e).__name__}: {e}", entry) from e
                else:
                    _call(handler, buf, kpos + prefix_len, kend, vpos, vend, kg, entry)
                entries += 1
                pos = vend
                if first & 0x80:
                    break
        if phase == 0:
            if runs is not None:
                runs.append(sid)
                runs.append(base + run_start)
                runs.append(pos - run_start)
            phase = 1
        # the last entry of a run carried the flag: a state switch or the end of the key group
        if pos + 2 > n:
            if pos + 2 > end:
                raise DecodeError("key group ends inside its state-switch mark", pos)
            return entries, pos, sid, 1, base + run_start
        nxt = (b[pos] << 8) | b[pos + 1]
        pos += 2
        if nxt == 0xFFFF:
            if pos != end:
                raise DecodeError(f"{end - pos} bytes after the end-of-key-group mark", pos)
            for f in finishers:
                f()
            return entries
        if nxt >= n_states:
            raise DecodeError(f"state id {nxt} but the header lists {n_states} states", pos - 2)
        for f in finishers:
            f()
        sid = nxt
        handler = handlers[sid]
        run_start = pos
        phase = 0


cdef class KeyFilter:
    """An entry handler passing on only the entries whose composite key (after the key-group
    prefix, and ``skip`` bytes: a timer's timestamp) starts with one of ``wanted`` (serialized
    keys: prefix-free, so a prefix match is a whole-key match) to ``inner``: the lookups' filter,
    compared in C by :func:`scan_key_group` (no Python call per skipped entry). Callable like a
    pure-Python entry handler (the other walkers call it)."""
    cdef object inner
    cdef EntrySink sink
    cdef tuple wanted
    cdef Py_ssize_t skip

    def __cinit__(self, inner, wanted, Py_ssize_t skip=0):
        self.inner = inner
        self.sink = inner if isinstance(inner, EntrySink) else None
        self.wanted = tuple(bytes(k) for k in wanted)
        self.skip = skip

    cdef inline bint matches(self, const uint8_t* b, Py_ssize_t kpos, Py_ssize_t kend):
        cdef bytes k
        cdef Py_ssize_t m
        cdef Py_ssize_t start = kpos + self.skip
        for k in self.wanted:
            m = len(k)
            if start + m <= kend and memcmp(b + start, <const char*>k, m) == 0:
                return True
        return False

    def __call__(self, buf, Py_ssize_t kpos, Py_ssize_t kend, Py_ssize_t vpos, Py_ssize_t vend,
                 int kg):
        cdef const uint8_t[::1] view = buf
        if view.shape[0] and self.matches(&view[0], kpos, kend):
            self.inner(buf, kpos, kend, vpos, vend, kg)


cdef _call(handler, buf, Py_ssize_t kpos, Py_ssize_t kend, Py_ssize_t vpos, Py_ssize_t vend,
           int kg, Py_ssize_t entry):
    try:
        handler(buf, kpos, kend, vpos, vend, kg)
    except DecodeError:
        raise
    except DECODE_ERRORS as e:
        raise DecodeError(f"{type(e).__name__}: {e}", entry) from e


def feed_key_group(EntrySink sink, it, int prefix_len, pending, bytes stop, wanted):
    """RocksDB bulk feed: the ``(key, value)`` pairs of ``it`` (sorted; ``pending`` is a pair
    already taken from it, or None) into ``sink`` until the key group changes, with no Python
    object per entry beyond the iterator's own pair.

    Returns ``(key group, entries, next pair or None)``; key group -1 when ``it`` is exhausted.
    Keys of key groups not in ``wanted`` (a set, or None for all) are skipped. ``it`` is bounded
    by ``stop``: a key >= ``stop`` (a table whose keys are out of order) is a
    :class:`DecodeError`, as is a decoding error (naming the key group and the entry key).
    """
    cdef int kg = -1, k2, i
    cdef Py_ssize_t entries = 0, klen, vlen
    cdef bytes key, value
    cdef const uint8_t* kb
    item = pending
    while True:
        if item is None:
            item = next(it, None)
            if item is None:
                sink._finish_open()
                return kg, entries, None
        key = <bytes>item[0]
        value = <bytes>item[1]
        if stop is not None and key >= stop:
            # the iterator is bounded by ``stop`` (RocksDB's iterate_upper_bound, the SST
            # reader's stop): a key past it comes from a table whose keys are out of order
            raise DecodeError(f"entry key {key.hex()} lies at or after the end of its range "
                              f"({stop.hex()}): the table's keys are out of order", 0)
        klen = len(key)
        kb = <const uint8_t*><char*>key
        if klen < prefix_len:
            raise DecodeError(f"entry key {key.hex()} shorter than its key-group prefix", 0)
        k2 = 0
        for i in range(prefix_len):
            k2 = (k2 << 8) | kb[i]
        if kg >= 0 and k2 != kg:
            sink._finish_open()
            return kg, entries, item
        item = None
        if wanted is not None and k2 not in wanted:
            continue
        kg = k2
        vlen = len(value)
        try:
            sink.add(kb, prefix_len, klen, <const uint8_t*><char*>value, 0, vlen, kg)
        except DecodeError as e:
            raise DecodeError(f"key group {kg}: {e.args[0]} (entry key {key.hex()})", e.pos) from e
        entries += 1


def feed_packed(EntrySink sink, const uint8_t[::1] buf, int prefix_len, bint finish):
    """RocksDB bulk feed from the compiled table scan (``_sst.TableScan.next_view`` or
    ``next_chunk``): the packed ``(key, value)`` entries of ``buf`` (bytes or a buffer; each an
    ``int64`` key length, an ``int64`` value length, native order, then the key and the value),
    all of one key group, into ``sink`` with no Python object per entry; ``finish``: the key
    group ends with them (its open row is completed, as :func:`feed_key_group` does when the key
    group changes). A decoding error is a :class:`DecodeError` naming the key group and the
    entry key. Returns the entries fed."""
    cdef Py_ssize_t n = buf.shape[0], pos = 0, entries = 0
    cdef const uint8_t* p = &buf[0] if n > 0 else NULL
    cdef int64_t klen, vlen
    cdef const uint8_t* kb
    cdef int kg, i
    while pos < n:
        if n - pos < 16:
            raise ValueError("malformed packed entries")
        memcpy(&klen, p + pos, 8)
        memcpy(&vlen, p + pos + 8, 8)
        pos += 16
        if klen < 0 or vlen < 0 or klen > n - pos or vlen > n - pos - klen:
            raise ValueError("malformed packed entries")
        kb = p + pos
        pos += <Py_ssize_t>(klen + vlen)
        if klen < prefix_len:
            raise DecodeError(f"entry key {(<char*>kb)[:klen].hex()} shorter than its key-group "
                              "prefix", 0)
        kg = 0
        for i in range(prefix_len):
            kg = (kg << 8) | kb[i]
        try:
            sink.add(kb, prefix_len, <Py_ssize_t>klen, kb + klen, 0, <Py_ssize_t>vlen, kg)
        except DecodeError as e:
            raise DecodeError(f"key group {kg}: {e.args[0]} (entry key "
                              f"{(<char*>kb)[:klen].hex()})", e.pos) from e
        entries += 1
    if finish:
        sink._finish_open()
    return entries
