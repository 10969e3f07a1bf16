# cython: language_level=3
"""Where each key's entries are in one canonical key group (statequery/backends/keyindex.py).

:func:`build` walks a decompressed canonical key group once (the lengths only, nothing decoded)
and hashes, per entry, the ``key_len`` bytes where a serialized key of that length would start
(after the key-group prefix, and after the 8-byte timestamp for timer states). :meth:`KeyIndex.find`
returns the entries whose window hashes as a wanted key's bytes: a superset of the entries of that
key (hash collisions included), which the caller re-reads and walks with the usual checks and the
exact key filter. Memory: 18 bytes per entry (offsets, state ids, an open-addressing table).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc

cdef enum:
    FLAG = 0x80
    END = 0xFFFF


cdef inline uint32_t _hash(const uint8_t* p, Py_ssize_t n) noexcept nogil:
    # FNV-1a 64, folded to 32 bits (0 is reserved for an empty slot)
    cdef uint64_t h = 14695981039346656037ULL
    cdef Py_ssize_t i
    for i in range(n):
        h = (h ^ p[i]) * 1099511628211ULL
    cdef uint32_t r = <uint32_t>(h ^ (h >> 32))
    return r if r != 0 else 1


cdef inline uint32_t _be32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef class KeyIndex:
    """The entries of one key group by the hash of their key window (``key_len`` bytes)."""

    cdef uint32_t* starts
    cdef uint32_t* ends
    cdef uint16_t* sids
    cdef uint32_t* table  # entry number + 1, 0: empty
    cdef uint32_t* hashes  # the hash of the entry in the same slot
    cdef uint32_t mask
    cdef readonly Py_ssize_t entries
    cdef readonly Py_ssize_t key_len
    cdef readonly Py_ssize_t nbytes

    def __cinit__(self) -> None:
        self.starts = self.ends = self.table = self.hashes = NULL
        self.sids = NULL

    def __dealloc__(self) -> None:
        free(self.starts)
        free(self.ends)
        free(self.sids)
        free(self.table)
        free(self.hashes)

    def find(self, bytes key) -> list:
        """``[(state id, start, end), ...]`` in key-group order: the entries (``start``: its
        int32 key length; ``end``: past its value) whose key window hashes as ``key``."""
        cdef Py_ssize_t n = PyBytes_GET_SIZE(key)
        if n != self.key_len or self.entries == 0:
            return []
        cdef uint32_t h = _hash(<const uint8_t*>PyBytes_AS_STRING(key), n)
        cdef uint32_t i = h & self.mask
        cdef uint32_t e
        found = []
        while self.table[i] != 0:
            if self.hashes[i] == h:
                e = self.table[i] - 1
                found.append((self.sids[e], self.starts[e], self.ends[e]))
            i = (i + 1) & self.mask
        found.sort(key=_by_start)
        return found


def _by_start(t: tuple) -> int:
    return t[1]


def build(bytes buf, Py_ssize_t prefix_len, skips, Py_ssize_t key_len) -> KeyIndex:
    """The index of one decompressed canonical key group (``buf``), for keys of ``key_len``
    serialized bytes; ``skips[state id]``: bytes between the key-group prefix and the key (8 for
    timers). Raises ValueError on bytes that are not a canonical key group (the caller then
    reads the usual way, whose walk names the problem)."""
    cdef const uint8_t* b = <const uint8_t*>PyBytes_AS_STRING(buf)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(buf)
    cdef Py_ssize_t n_states = len(skips)
    if n > 0xFFFFFFFF:
        raise ValueError("key group larger than 4 GiB")
    if n < 2 or n_states == 0 or n_states > 0xFFFF:
        raise ValueError("not a canonical key group")
    cdef Py_ssize_t* skip = <Py_ssize_t*>malloc(n_states * sizeof(Py_ssize_t))
    if skip == NULL:
        raise MemoryError()
    cdef Py_ssize_t s
    for s in range(n_states):
        skip[s] = skips[s]
    # pass 1: count the entries (and check the framing)
    cdef Py_ssize_t pos, kpos, kend, vend, count = 0
    cdef uint32_t klen, vlen
    cdef uint16_t sid
    cdef int pass_no
    cdef KeyIndex idx = KeyIndex()
    cdef Py_ssize_t size = 0, w
    cdef uint32_t h, slot
    try:
        for pass_no in range(2):
            pos = 2
            sid = (b[0] << 8) | b[1]
            if sid >= n_states:
                raise ValueError("state id out of range")
            while True:
                if pos + 4 > n:
                    raise ValueError("truncated entry")
                klen = _be32(b + pos)
                kpos = pos + 4
                if klen > <uint32_t>(n - kpos) or <Py_ssize_t>klen < prefix_len \
                        or kpos + <Py_ssize_t>klen + 4 > n:
                    raise ValueError("impossible key length")
                kend = kpos + klen
                vlen = _be32(b + kend)
                if vlen > <uint32_t>(n - kend - 4):
                    raise ValueError("impossible value length")
                vend = kend + 4 + vlen
                if pass_no == 1:
                    w = kpos + prefix_len + skip[sid]
                    if w + key_len <= kend:
                        h = _hash(b + w, key_len)
                        slot = h & idx.mask
                        while idx.table[slot] != 0:
                            slot = (slot + 1) & idx.mask
                        idx.table[slot] = <uint32_t>(count + 1)
                        idx.hashes[slot] = h
                    idx.starts[count] = <uint32_t>pos
                    idx.ends[count] = <uint32_t>vend
                    idx.sids[count] = sid
                count += 1
                pos = vend
                if b[kpos] & FLAG:
                    if pos + 2 > n:
                        raise ValueError("truncated state switch")
                    sid = (b[pos] << 8) | b[pos + 1]
                    pos += 2
                    if sid == END:
                        if pos != n:
                            raise ValueError("bytes after the end mark")
                        break
                    if sid >= n_states:
                        raise ValueError("state id out of range")
            if pass_no == 0:
                idx.entries = count
                idx.key_len = key_len
                size = 16
                while size < 2 * count:
                    size <<= 1
                idx.mask = <uint32_t>(size - 1)
                idx.starts = <uint32_t*>malloc((count + 1) * sizeof(uint32_t))
                idx.ends = <uint32_t*>malloc((count + 1) * sizeof(uint32_t))
                idx.sids = <uint16_t*>malloc((count + 1) * sizeof(uint16_t))
                idx.table = <uint32_t*>malloc(size * sizeof(uint32_t))
                idx.hashes = <uint32_t*>malloc(size * sizeof(uint32_t))
                if idx.starts == NULL or idx.ends == NULL or idx.sids == NULL \
                        or idx.table == NULL or idx.hashes == NULL:
                    raise MemoryError()
                for w in range(size):
                    idx.table[w] = 0
                idx.nbytes = (count + 1) * 10 + size * 8
                count = 0
    finally:
        free(skip)
    return idx
