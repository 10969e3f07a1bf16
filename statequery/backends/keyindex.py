"""Warm lookups that do not depend on the size of the key group (issue 33 item 4).

A lookup on a canonical savepoint reads the key group that can hold the key and walks every
entry of it, comparing each entry's key bytes (``_read.KeyFilter``): at 3M keys a key group is
~5 MB and ~140k entries, at 10M ~17 MB and ~470k, for the few entries of one key.

The first lookup in a key group still does exactly that, unchanged (a first lookup in a new
process stays as cheap as it was: building the index costs about as much as the walk). The
second lookup in that key group walks it whole the same way (the same read, walk, checks and
run index recording) and then, from the same bytes, the compiled :func:`_keyindex.build` keeps
a compact index of the key group: per entry its offsets and state id, and the hash of the bytes
where a key of the wanted key's serialized length would start. Later lookups in that key group
(any key of that length) read only the candidate entries (a few ranged reads), rebuild them
into a small key group of their own (each state's run of entries, the state switches and the
end mark, the last-entry flags set as the format wants) and walk it with the same walk and
handlers: every length, prefix and state id is checked as on a full walk, and the key filter
drops hash collisions, so rows are identical.

Only uncompressed streams (a compressed key group must be decompressed whole anyway) and only
with the compiled module; otherwise :func:`indexed_scan` returns None and the caller walks the
usual way. The indexes live in a process-wide LRU bounded by bytes (:data:`MAX_BYTES`), keyed
by the open savepoint (its handle resolver: a savepoint opened anew starts afresh), the stream
(file, segment and size), key group (and its extent) and the key length. Savepoint files are
immutable (Flink never rewrites one): a file rewritten in place with the same size while one
savepoint stays open would be read at stale offsets, whose bytes the walk's checks reject (typed)
or the key filter drops (rows missing); :func:`clear` forgets the indexes.
"""

from __future__ import annotations

import itertools
import struct
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from statequery.backends.fastpath import compiled

if TYPE_CHECKING:
    from statequery.backends.keygroups import KeyGroupStream

__all__ = ["MAX_BYTES", "clear", "indexed_scan"]

#: the bytes all kept indexes may take (an index is ~18 bytes per entry of its key group:
#: ~8.5 MB for a key group of a 10M-key savepoint of the benchmark job)
MAX_BYTES = 96 << 20

_U16 = struct.Struct(">H")
_END = _U16.pack(0xFFFF)
_FLAG = 0x80

try:  # built by setup.py with the compiled decode path
    from statequery.backends import _keyindex
except ImportError:  # pragma: no cover - not built: lookups walk the whole key group
    _keyindex = None  # type: ignore[assignment]

_lock = threading.Lock()
#: the scope of a savepoint's indexes: one number per handle resolver (one per open savepoint),
#: so a savepoint opened anew (or another FileIO's copy of the same files) starts afresh
_scopes: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_next_scope = itertools.count()
_cache: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
_cache_bytes = 0
#: key groups looked up once (not indexed yet), most recent last
_seen: OrderedDict[tuple[Any, ...], None] = OrderedDict()
_MAX_SEEN = 4096


def _scope(stream: KeyGroupStream) -> int | None:
    """The scope number of the savepoint ``stream`` reads (None: no resolver to scope by)."""
    resolver = getattr(stream.stream, "_resolver", None)
    if resolver is None:
        return None
    with _lock:
        try:
            scope = _scopes.get(resolver)
            if scope is None:
                scope = _scopes[resolver] = next(_next_scope)
        except TypeError:  # not weakly referenceable or not hashable: nothing kept
            return None
    return scope


def clear() -> None:
    """Forget every kept index."""
    global _cache_bytes
    with _lock:
        _cache.clear()
        _seen.clear()
        _cache_bytes = 0


def _get(key: tuple[Any, ...]) -> Any:
    with _lock:
        idx = _cache.get(key)
        if idx is not None:
            _cache.move_to_end(key)
        return idx


def _put(key: tuple[Any, ...], kept: tuple[tuple[int, int], Any]) -> None:
    """Keep ``(extent, index)`` under ``key``, dropping the least recently used beyond
    :data:`MAX_BYTES`."""
    global _cache_bytes
    if kept[1].nbytes > MAX_BYTES:
        return
    with _lock:
        if key in _cache:
            _cache_bytes -= _cache.pop(key)[1].nbytes
        _cache[key] = kept
        _cache_bytes += kept[1].nbytes
        while _cache_bytes > MAX_BYTES and _cache:
            _, old = _cache.popitem(last=False)
            _cache_bytes -= old[1].nbytes


def indexed_scan(
    stream: KeyGroupStream,
    handlers: Sequence[Callable[..., None] | None],
    finishers: Sequence[Callable[[], None]],
    key_groups: set[int] | None,
    key_bytes: Sequence[bytes],
    skips: Sequence[int],
    record: Callable[[int, list[int]], None] | None = None,
) -> Iterator[int] | None:
    """A lookup's scan of ``key_groups`` through the kept indexes (see the module), or None
    when they do not apply (compressed stream, no compiled module, no key group named, every
    state wanted has a handler that is not a key filter...). Yields each key group after its
    entries were handled, as :meth:`KeyGroupStream.scan` does."""
    if (
        _keyindex is None
        or compiled() is None
        or stream.compressed
        or key_groups is None
        or not key_bytes
    ):
        return None
    scope = _scope(stream)
    if scope is None:
        return None
    skips = tuple(skips)
    lengths = sorted({len(k) for k in key_bytes})
    # the stream: its file (or inline name), the handle's own description (a file-merging
    # segment's offsets within its file) and size
    handle = getattr(stream.stream, "_handle", None)
    where = handle.describe() if handle is not None else None
    ident = (scope, stream.stream.name, where, stream.stream.size(), stream.prefix_len, skips)
    first = False
    with _lock:
        for kg in key_groups:
            for n in lengths:
                key = (ident, kg, n)
                if key not in _cache and key not in _seen:
                    first = True
                    _seen[key] = None
                    while len(_seen) > _MAX_SEEN:
                        _seen.popitem(last=False)
    if first:  # a first lookup here: the usual read (nothing kept but the mark)
        return None
    return _scan(stream, handlers, finishers, key_groups, key_bytes, ident, lengths, record)


def _scan(
    stream: KeyGroupStream,
    handlers: Sequence[Callable[..., None] | None],
    finishers: Sequence[Callable[[], None]],
    key_groups: set[int],
    key_bytes: Sequence[bytes],
    ident: tuple[Any, ...],
    lengths: list[int],
    record: Callable[[int, list[int]], None] | None,
) -> Iterator[int]:
    from statequery.backends.keygroups import key_group_scanner, read_key_group_bytes

    scan = key_group_scanner()
    prefix_len, skips = ident[4], ident[5]
    for kg, start, end in stream.iter_extents(key_groups):
        keys = [(ident, kg, n) for n in lengths]
        indexes = [_get(k) for k in keys]
        if any(i is None or i[0] != (start, end) for i in indexes):
            # the second lookup here: the usual whole walk, then the index from the same bytes
            data = read_key_group_bytes(stream.stream, kg, start, end)
            stream._walk_whole(scan, kg, start, data, handlers, finishers, record, True)
            for k, n in zip(keys, lengths, strict=True):
                try:
                    idx = _keyindex.build(data, prefix_len, skips, n)
                except ValueError:  # not a key group the walk accepted: nothing kept
                    continue
                _put(k, ((start, end), idx))
            yield kg
            continue
        indexes = [i[1] for i in indexes]
        entries = sorted(
            {e for idx in indexes for k in key_bytes if len(k) == idx.key_len
             for e in idx.find(k)},
            key=lambda e: e[1],
        )
        entries = [e for e in entries if handlers[e[0]] is not None]
        if entries:
            buf = _rebuild(stream, start, entries)
            stream._walk(scan, kg, start, 0, buf, handlers, finishers)
        yield kg


def _rebuild(stream: KeyGroupStream, start: int, entries: list[tuple[int, int, int]]) -> bytes:
    """A key group of only ``entries`` (state id, start, end; in key-group order): read with as
    few ranged reads as adjacent entries allow, each state's run ending with a flagged entry."""
    raw: list[bytes] = []
    i = 0
    while i < len(entries):  # adjacent entries: one read
        j = i
        while j + 1 < len(entries) and entries[j + 1][1] == entries[j][2]:
            j += 1
        a, b = entries[i][1], entries[j][2]
        chunk = stream.stream.read_range(start + a, b - a)
        if len(chunk) != b - a:
            from statequery.exceptions import CorruptStateError

            raise CorruptStateError(
                f"read {len(chunk)} of {b - a} bytes of a lookup's entries", stream.stream.name,
                start + a,
            )
        for _sid, s, e in entries[i : j + 1]:
            raw.append(chunk[s - a : e - a])
        i = j + 1
    out = bytearray()
    for n, (sid, _s, _e) in enumerate(entries):
        if n == 0 or entries[n - 1][0] != sid:
            out += _U16.pack(sid)
        entry = bytearray(raw[n])
        last = n + 1 == len(entries) or entries[n + 1][0] != sid
        if last:
            entry[4] |= _FLAG
        else:
            entry[4] &= 0x7F
        out += entry
    out += _END
    return bytes(out)
