"""RocksDB native savepoints and RocksDB checkpoints (incremental and full), per key-group range.

Flink snapshots a RocksDB instance as an ``IncrementalRemoteKeyedStateHandle`` (type 11, see
``RocksNativeFullSnapshotStrategy`` and ``RocksIncrementalSnapshotStrategy``): the DB's files
(``*.sst``, ``MANIFEST-*``, ``CURRENT``, ``OPTIONS-*``) as ``(local name, stream handle)`` pairs,
shared (incremental checkpoints: SSTs under ``<job>/shared/``) or private (native savepoints: every
file), plus a stream holding the ``KeyedBackendSerializationProxy`` (state names and serializers;
column family name = state name).

Reading one handle (:class:`RocksDBState`):

1. every named file is fetched through the storage seam into the local :class:`FileCache`
   (size checked against the handle) and hard-linked into a private DB directory; inline files
   (``CURRENT``) are written there;
2. every table file's footer and properties are read with :mod:`statequery.backends.sst`: its
   column family, and whether it holds un-compacted merge operands;
3. the directory is opened read-only with rocksdict, every column family; the MANIFEST's live
   files must be exactly the handle's table files;
4. a column family whose tables hold merge operands (Flink's ``ListState.add``) is read with the
   SST reader, applying ``StringAppendTESTOperator`` semantics (rocksdict has no merge operator and
   cannot read such keys); every other column family is read with rocksdict, whose pairs are
   checked at their end (its ``items()`` hides an iterator error, such as a block checksum
   mismatch: see ``RocksDBState._pairs``);
5. both seek to the first key of the requested key-group range (1-byte prefix when max parallelism
   <= 128, else 2 bytes, big-endian) and stop at the end of it, intersected with the handle's own
   range: keys left over from rescaling are dropped, as Flink's ``clipDBWithKeyGroupRange`` does.

A scan into a compiled sink reads neither way: :meth:`RocksDBState.table_scan` (the compiled
``_sst.TableScan``) reads the column family's table files itself with the same rules, one key
group packed per call for ``_read.feed_packed`` (see ``docs/rocksdb.md``).

:func:`read_entries` walks the handles of an operator and opens only those whose key-group range
overlaps the request, so a single-key lookup fetches one subtask's files.

A single-key lookup through :class:`RocksDBKeyedBackend` fetches less still, unless a restored DB
of the handle is already open: :class:`TableReadState` fetches ``CURRENT`` and the MANIFEST
(:mod:`statequery.backends.manifest`: every live table's column family and key range), then only
the tables whose key range can hold the key, read with the SST reader (no RocksDB instance).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, TypeVar

from statequery.backends import checksums
from statequery.backends.cache import CacheKey, DbDir, FileCache
from statequery.backends.pool import OpenDatabases
from statequery.backends.sst import (
    SstFile,
    compiled_module,
    has_compiled_walk,
    merged_entries,
    table_scan,
)
from statequery.backends.sstpoint import open_point_table
from statequery.exceptions import (
    CorruptStateError,
    InvalidOptionError,
    StatequeryError,
    UnsupportedFormatError,
    require_extra,
)
from statequery.io import FileIO

__all__ = [
    "DbFile",
    "KeyValue",
    "RocksDBHandle",
    "RocksDBKeyedBackend",
    "RocksDBState",
    "TableReadState",
    "default_cache",
    "feed",
    "from_incremental_handle",
    "key_group_prefix_bytes",
    "read_entries",
    "register",
]

DEFAULT_CF = "default"
#: single-key lookups read only the tables that can hold the key (:class:`TableReadState`)
#: unless a restored DB of the handle is already open; False: always restore the whole DB
SELECTIVE_LOOKUPS = True
#: lookups read only the blocks they need of each table, by ranged reads (backends/sstpoint.py)
POINT_READS = True
_MERGE_OPERATORS = ("StringAppendTESTOperator", "stringappendtest", "nullptr", "")


def key_group_prefix_bytes(max_parallelism: int) -> int:
    """``CompositeKeySerializationUtils.computeRequiredBytesInKeyGroupPrefix``: 1 or 2."""
    if max_parallelism <= 0 or max_parallelism > 32768:
        raise InvalidOptionError(f"max parallelism {max_parallelism} is outside 1..32768")
    return 1 if max_parallelism <= 128 else 2


@dataclass(frozen=True)
class DbFile:
    """One file of a RocksDB snapshot: its RocksDB name and where its bytes are.

    Either ``data`` (an inline ``ByteStreamStateHandle``) or ``location`` (an absolute, resolved
    path or URI; relative and remapped handles are resolved by the metadata layer) with ``size``.
    ``checksum`` (``"sha256:<hex>"``) is verified when given.
    """

    local_path: str
    location: str | None = None
    size: int = -1
    data: bytes | None = field(default=None, repr=False)
    checksum: str | None = None
    offset: int | None = None  # file-merging segment: bytes [offset, offset+size) of location
    description: str | None = None  # how errors name an inline file

    def __post_init__(self) -> None:
        name = self.local_path
        if not name or "/" in name or "\\" in name or "\x00" in name or name in (".", ".."):
            raise CorruptStateError(f"invalid RocksDB file name {name!r} in a state handle",
                                    self.location)
        if self.data is None and self.location is None:
            raise CorruptStateError(f"state handle of {name} has neither bytes nor a location")

    @property
    def source(self) -> str:
        """The name used in errors: the location, or ``<inline CURRENT>``."""
        if self.location is not None:
            return self.location
        return self.description or f"<inline {self.local_path}>"


@dataclass(frozen=True)
class RocksDBHandle:
    """What :class:`RocksDBState` needs from an ``IncrementalRemoteKeyedStateHandle``.

    ``end_key_group`` is inclusive (Flink's ``KeyGroupRange``).
    """

    start_key_group: int
    end_key_group: int
    files: tuple[DbFile, ...]
    name: str = ""  # backend identifier / state handle id, for errors

    def overlaps(self, start: int, end: int) -> bool:
        return self.start_key_group <= end and start <= self.end_key_group

    @property
    def sst_files(self) -> tuple[DbFile, ...]:
        return tuple(f for f in self.files if f.local_path.endswith(".sst"))


class KeyValue(NamedTuple):
    """One raw entry of a keyed state: key group, key bytes (with the prefix), value bytes."""

    key_group: int
    key: bytes
    value: bytes


@dataclass
class _ColumnFamily:
    name: str
    tables: list[tuple[DbFile, str]] = field(default_factory=list)  # (file, local path)
    merge_operands: int = 0


_Reader = TypeVar("_Reader", bound="_HandleReader")


class _HandleReader:
    """What both readers of one RocksDB handle hold (:class:`RocksDBState`,
    :class:`TableReadState`): the handle, its key-group prefix, the cache and the private
    directory the handle's files are linked into, and the tables opened by our SST reader."""

    def __init__(
        self,
        handle: RocksDBHandle,
        io: FileIO,
        *,
        max_parallelism: int,
        cache: FileCache | None = None,
        state_names: Collection[str] | None = None,
    ) -> None:
        self.handle = handle
        self.io = io
        self.max_parallelism = max_parallelism
        self.prefix_bytes = key_group_prefix_bytes(max_parallelism)
        self.cache = cache if cache is not None else default_cache()
        self.state_names = None if state_names is None else frozenset(state_names)
        self._tables: dict[str, SstFile] = {}
        self._dir: DbDir | None = None

    def key_group_bounds(self, key_groups: tuple[int, int] | None) -> tuple[int, int] | None:
        """The request intersected with the handle's range (inclusive), None if empty."""
        start, end = self.handle.start_key_group, self.handle.end_key_group
        if key_groups is not None:
            start, end = max(start, key_groups[0]), min(end, key_groups[1])
        return (start, end) if start <= end else None

    def _close_files(self) -> None:
        """Close the opened tables and release the directory (its cache entries are evictable
        again)."""
        for t in self._tables.values():
            t.close()
        self._tables.clear()
        if self._dir is not None:
            self._dir.close()
            self._dir = None
            self.cache.evict()

    def close(self) -> None:
        self._close_files()

    def __enter__(self: _Reader) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RocksDBState(_HandleReader):
    """One RocksDB handle restored into a private local directory and opened read-only.

    ``state_names`` (from the handle's ``KeyedBackendSerializationProxy``) are checked against the
    column families: a column family that is not a state is an error naming the file that holds
    it. Use as a context manager, or call :meth:`close`.

    The restore checks the MANIFEST (replayed by ``manifest.py``: column families, live tables
    and their sizes against the handle) and every table's index; RocksDB itself (rocksdict) is
    opened on first use only (:attr:`_db`: rocksdict's reads, which the compiled table scan
    does not need), and checks the same again from its own view.
    """

    def __init__(
        self,
        handle: RocksDBHandle,
        io: FileIO,
        *,
        max_parallelism: int,
        cache: FileCache | None = None,
        state_names: Collection[str] | None = None,
    ) -> None:
        super().__init__(handle, io, max_parallelism=max_parallelism, cache=cache,
                         state_names=state_names)
        self._rdict: Any = None  # rocksdict's DB, opened on first use (_db)
        self._closed = False
        self._cf_names: list[str] = []
        self._replayed = False  # the MANIFEST replayed and checked at the restore
        self._cfs: dict[str, _ColumnFamily] = {}
        self._data_checked: set[str] = set()  # tables whose data blocks RocksDB may read
        try:
            self._restore()
        except BaseException:
            self.close()
            raise

    # -- restore -------------------------------------------------------------------------------

    def _restore(self) -> None:
        self._by_name = by_name = _files_by_name(self.handle)
        current = _current_of(self.handle, by_name)
        self._dir = self.cache.new_db_dir()
        root = self._dir.path
        for f in self.handle.files:
            _place(self.cache, self.io, f, os.path.join(root, f.local_path))
        manifest = _check_current(root, current, by_name)
        self._manifest = manifest
        opened = [(f, self._load_table(f, os.path.join(root, f.local_path)))
                  for f in self.handle.sst_files]
        from statequery.backends.manifest import read_manifest

        meta: Any = None
        try:
            with open(os.path.join(root, manifest.local_path), "rb") as fh:
                meta = read_manifest(fh.read(), manifest.source)
        except StatequeryError:
            if any(t.external for _, t in opened):
                raise
            # a MANIFEST the replay does not read (a feature it does not support): RocksDB's
            # own open decides, now, as it always did
        ingested: dict[str, Any] = {}
        if any(t.external for _, t in opened):
            # ingested tables (SstFileWriter): their column family and global sequence number
            # may be recorded in the MANIFEST only (RocksDB itself reads them from there)
            ingested = {t.name: t for t in meta.tables.values()}
        for f, table in opened:
            m = ingested.get(f.local_path) if table.external else None
            if m is not None:
                table.apply_manifest_seqno(m.largest_seqno)
            self._open_table(f, os.path.join(root, f.local_path), table,
                             m.column_family if m is not None else None)
            # every index and data block read (checksum verified, decompressed) and its entry
            # area and restart array checked by the SST reader before RocksDB reads it: RocksDB
            # trusts a block whose checksum matches and can crash the process on a malformed
            # one (SIGSEGV in IndexValue::DecodeFrom, or on a restart offset outside the block,
            # which it also reads nondeterministically: rows on one read, "bad entry in block"
            # on the next). Index and range-deletion blocks now (RocksDB reads them when it
            # opens the table); data blocks before RocksDB first iterates the column family
            # (``_check_data``): the compiled table scan reads them itself, checked the same way
            table.check_index_blocks()
        if meta is not None:
            self._check_manifest(meta, manifest)  # RocksDB opened on first use (_db)
        else:
            self._open_db(root, manifest)
        self.cache.evict()

    @property
    def is_open(self) -> bool:
        return not self._closed

    @property
    def _db(self) -> Any:
        """rocksdict's read-only DB over the restored directory, opened on first use (the
        compiled table scan reads the tables itself); None once closed."""
        if self._rdict is None and not self._closed and self._dir is not None:
            self._open_db(self._dir.path, self._manifest)
        return self._rdict

    def _check_manifest(self, m: Any, manifest: DbFile) -> None:
        """What RocksDB's open of the DB checks against the handle and the metadata (and
        :meth:`_open_db` checks again from RocksDB's own view), from the replayed MANIFEST
        ``m``: a bytewise comparator, every column family a state and every state a column
        family, the live tables exactly the handle's SSTs with the handle's sizes, every
        table's column family known to the MANIFEST. Same errors as :meth:`_open_db`."""
        if m.comparator and m.comparator not in ("leveldb.BytewiseComparator",
                                                 "rocksdb.BytewiseComparator"):
            raise UnsupportedFormatError(f"{manifest.source}: comparator {m.comparator} is not "
                                         "supported (Flink uses leveldb.BytewiseComparator)")
        self._cf_names = [n for _, n in sorted(m.column_families.items()) if n != DEFAULT_CF]
        self._replayed = True
        self._check_names(manifest)
        self._check_live({t.name: t.size for t in m.tables.values()}, manifest)
    def _load_table(self, f: DbFile, path: str) -> SstFile:
        try:
            table = SstFile(path, source=f.source)
        except StatequeryError as e:
            if isinstance(e, CorruptStateError) and e.source != f.source:
                raise CorruptStateError(str(e), f.source) from e
            raise
        self._tables[f.local_path] = table
        return table

    def _open_table(self, f: DbFile, path: str, table: SstFile,
                    manifest_cf: str | None = None) -> None:
        props = table.properties
        cf = props.column_family_name or (manifest_cf if table.external else None)
        if not cf:
            raise CorruptStateError("table file has no column family name in its properties",
                                    f.source)
        if self.state_names is not None and cf != DEFAULT_CF and cf not in self.state_names:
            raise CorruptStateError(
                f"table {f.local_path} belongs to column family {cf!r}, which is not a state of "
                f"this operator's metadata ({', '.join(sorted(self.state_names))})", f.source)
        if props.merge_operands and props.merge_operator not in _MERGE_OPERATORS:
            raise UnsupportedFormatError(
                f"{f.source}: merge operator {props.merge_operator} is not supported "
                "(Flink uses StringAppendTESTOperator)")
        entry = self._cfs.setdefault(cf, _ColumnFamily(cf))
        entry.tables.append((f, path))
        entry.merge_operands += props.merge_operands

    def _open_db(self, root: str, manifest: DbFile) -> None:
        from rocksdict import AccessType, Options, Rdict

        def options() -> Any:
            o = Options(raw_mode=True)
            o.set_paranoid_checks(True)  # RocksDB's default, made explicit: checksums verified
            return o

        opts = options()
        opts.create_if_missing(False)
        db = None
        try:
            names = Rdict.list_cf(root, opts)
            db = Rdict(
                root, opts,
                column_families={n: options() for n in names},
                access_type=AccessType.read_only())
            live = db.live_files()
        except Exception as e:  # rocksdict raises plain Exception with RocksDB's status text
            if db is not None:
                db.close()
            raise self._rocksdb_error("RocksDB cannot open the restored DB", e) from e
        try:
            opened = [n for n in names if n != DEFAULT_CF]
            if not self._replayed:  # the MANIFEST was not replayed: RocksDB's view only
                self._cf_names = opened
                self._check_names(manifest)
            elif sorted(opened) != sorted(self._cf_names):
                raise CorruptStateError(
                    f"RocksDB opens column families {sorted(opened)}, the replayed MANIFEST "
                    f"names {sorted(self._cf_names)}", manifest.source)
            self._check_live({os.path.basename(lf["name"]): lf["size"] for lf in live},
                             manifest)
        except BaseException:
            db.close()
            raise
        self._rdict = db

    def _check_names(self, manifest: DbFile) -> None:
        for n in self._cf_names:
            if self.state_names is not None and n not in self.state_names:
                raise CorruptStateError(
                    f"column family {n!r} is not a state of this operator's metadata "
                    f"({', '.join(sorted(self.state_names))})", manifest.source)
        if self.state_names is not None:
            missing = sorted(self.state_names - set(self._cf_names))
            if missing:
                raise CorruptStateError(
                    f"the MANIFEST has no column family for state(s) {', '.join(missing)} "
                    "(truncated MANIFEST?)", manifest.source)

    def _check_live(self, live_names: dict[str, int], manifest: DbFile) -> None:
        """The live tables (name: size) are exactly the handle's SSTs, with its sizes."""
        for f in self.handle.sst_files:
            if f.local_path not in live_names:
                raise CorruptStateError(
                    f"table {f.local_path} is not live in {manifest.local_path} "
                    "(truncated or mismatched MANIFEST)", manifest.source)
        for name, size in live_names.items():
            if name not in self._by_name:
                raise CorruptStateError(
                    f"{manifest.local_path} names table {name}, which the state handle does not "
                    "include (missing SST)", manifest.source)
            if size != self._by_name[name].size and self._by_name[name].size >= 0:
                raise CorruptStateError(
                    f"{manifest.local_path} says {name} has {size} bytes, its handle says "
                    f"{self._by_name[name].size}", self._by_name[name].source)
        for cf in self._cfs:
            if cf != DEFAULT_CF and cf not in self._cf_names:
                f = self._cfs[cf].tables[0][0]
                raise CorruptStateError(
                    f"table belongs to column family {cf!r}, unknown to {manifest.local_path}",
                    f.source)

    # -- reading -------------------------------------------------------------------------------

    @property
    def column_families(self) -> list[str]:
        """The column families (= state names) of the DB, ``default`` excluded."""
        return list(self._cf_names)

    def uses_merge_reader(self, state: str) -> bool:
        """True when ``state``'s tables hold merge operands (read with the SST reader)."""
        cf = self._cfs.get(state)
        return cf is not None and cf.merge_operands > 0

    def entries(
        self, state: str, key_groups: tuple[int, int] | None = None, *, reader: str = "auto",
        key_prefix: bytes | None = None,
    ) -> Iterator[KeyValue]:
        """Raw entries of ``state`` in key order within ``key_groups`` (inclusive) and the handle.

        ``reader`` is ``auto`` (SST reader for column families with merge operands, rocksdict
        otherwise), ``sst`` or ``rocksdb`` (the latter misses un-merged list entries).
        ``key_prefix`` (bytes after the key-group prefix; ``key_groups`` must then name one key
        group) restricts the entries to keys starting with it: a seek, not a filter.
        """
        if self._closed:
            raise StatequeryError("the RocksDB state is closed")
        if state == DEFAULT_CF or state not in self._cf_names:
            if self.state_names is not None and state in self.state_names:
                return iter(())
            raise InvalidOptionError(
                f"no column family {state!r} in this RocksDB snapshot; it has: "
                f"{', '.join(self._cf_names) or 'none'}")
        rng = self._range(state, key_groups, reader, key_prefix)
        if rng is None:
            return iter(())
        start, stop, sst = rng
        if sst:
            return self._sst_entries(state, start, stop)
        return self._rocksdb_entries(state, start, stop)

    def items(
        self, state: str, key_groups: tuple[int, int] | None = None, *,
        key_prefix: bytes | None = None, match: tuple[bytes, int] | None = None,
    ) -> tuple[Iterator[tuple[bytes, bytes]], bytes]:
        """Bulk form of :meth:`entries`: plain ``(key, value)`` pairs (no :class:`KeyValue` per
        entry) and the exclusive upper bound the consumer stops at. Errors of the underlying
        iterator surface while iterating; the caller wraps them (see :meth:`wrap_error`).
        ``match = (bytes, offset)``: only keys holding those bytes at that offset."""
        if self._closed:
            raise StatequeryError("the RocksDB state is closed")
        if state == DEFAULT_CF or state not in self._cf_names or state not in self._cfs:
            # (a column family no table holds is empty: RocksDB reads nothing but the tables)
            return iter(()), b""
        rng = self._range(state, key_groups, "auto", key_prefix)
        if rng is None:
            return iter(()), b""
        start, stop, sst = rng
        if sst or (match is not None and has_compiled_walk()):
            # merge operands; or a filtered walk (a lookup's timers), which the compiled table
            # walk does without making a pair for the keys it skips
            cf = self._cfs.get(state)
            if cf is None:
                return iter(()), b""
            tables = [self._tables[f.local_path] for f, _ in cf.tables]
            return iter(merged_entries(tables, start, stop, match=match)), stop
        pairs = self._pairs(state, start, stop)
        if match is not None:
            sub, at = match
            return iter([(k, v) for k, v in pairs if k.startswith(sub, at)]), stop
        return iter(pairs), stop

    def table_scan(
        self, state: str, key_groups: tuple[int, int] | None = None, *,
        key_prefix: bytes | None = None,
    ) -> Any:
        """The compiled scan of ``state``'s tables (:func:`statequery.backends.sst.table_scan`:
        every live entry of the range packed per key group, read from the table files with
        RocksDB's read rules, no rocksdict iterator and no Python object per entry), or None
        when it does not apply (not built, range tombstones, nothing to read): then
        :meth:`items`."""
        if self._closed:
            raise StatequeryError("the RocksDB state is closed")
        cf = self._cfs.get(state)
        if state == DEFAULT_CF or state not in self._cf_names or cf is None:
            return None
        rng = self._range(state, key_groups, "auto", key_prefix)
        if rng is None:
            return None
        start, stop, _ = rng
        return table_scan([self._tables[f.local_path] for f, _ in cf.tables], start, stop,
                          self.prefix_bytes)

    def wrap_error(self, state: str, e: Exception) -> CorruptStateError:
        return self._rocksdb_error(f"RocksDB failed reading column family {state!r}", e)

    def _rocksdb_error(self, what: str, e: BaseException) -> CorruptStateError:
        """RocksDB's error ``e`` as a :class:`CorruptStateError` naming the file it cites (a
        table's block checksum mismatch names the table and the block offset), else the
        MANIFEST."""
        message = _local_names(e)
        cited = _CITED_TABLE.search(message)
        f = self._by_name.get(cited.group(1)) if cited else None
        if f is not None and cited is not None:
            return CorruptStateError(f"{what}: {message}", f.source, int(cited.group(2)))
        return CorruptStateError(f"{what}: {message}", self._manifest.source)

    def _read_options(self, stop: bytes) -> Any:
        from rocksdict import ReadOptions

        ro = ReadOptions()  # bounds are raw bytes: the DB is opened in raw mode
        ro.set_verify_checksums(True)  # RocksDB's default, made explicit
        ro.set_iterate_upper_bound(stop)
        # a scan reads each block once: keeping them in the block cache only grew the process
        # by the data read (every column family its own default cache; docs/performance.md,
        # "Scale")
        ro.fill_cache(False)  # type: ignore[call-arg]  # the stub omits its bool argument
        return ro

    def _pairs(self, state: str, start: bytes, stop: bytes) -> Iterator[tuple[bytes, bytes]]:
        """rocksdict's ``(key, value)`` pairs of ``state`` in ``[start, stop)``, checked at their
        end: rocksdict's ``items()`` ends quietly when RocksDB's iterator fails (a block
        checksum mismatch, an unreadable block) because it does not ask the iterator's status, so
        the pairs would just be fewer. When they end, a fresh iterator is placed after the last
        pair: it must be at the end with an OK status, else the read raises."""
        self._check_data(state)
        cf = self._db.get_column_family(state)
        pairs = cf.items(from_key=start, read_opt=self._read_options(stop))

        def on_end(last: tuple[bytes, bytes] | None) -> None:
            self._check_end(state, cf, start, stop, last)

        return _checked_pairs(pairs, on_end)

    def _check_data(self, state: str) -> None:
        """Every data block of ``state``'s tables checked (``SstFile.check_data_blocks``, once
        per table) before RocksDB reads any of them."""
        cf = self._cfs.get(state)
        for f, _ in cf.tables if cf is not None else ():
            if f.local_path not in self._data_checked:
                self._tables[f.local_path].check_data_blocks()
                self._data_checked.add(f.local_path)

    def _check_end(self, state: str, cf: Any, start: bytes, stop: bytes,
                   last: tuple[bytes, bytes] | None) -> None:
        what = f"RocksDB failed reading column family {state!r}"
        try:
            it = cf.iter(self._read_options(stop))
            if last is None:
                it.seek(start)
            else:
                it.seek(last[0])
                if it.valid():
                    it.next()
            ended = not it.valid()
            it.status()  # raises RocksDB's error, if any
        except Exception as e:  # rocksdict raises plain Exception with RocksDB's status text
            if "merge_operator" in str(e):  # a merge operand, and no merge operator
                raise UnsupportedFormatError(
                    f"{self.describe(state)}: column family {state!r} holds merge operands, "
                    "which RocksDB reads only with a merge operator (rocksdict has none): read "
                    "it with reader='auto' or 'sst'") from e
            raise self._rocksdb_error(what, e) from e
        if not ended:
            after = "its start" if last is None else f"key {last[0].hex()}"
            raise CorruptStateError(f"{what}: iteration stopped after {after} before the end of "
                                    "the range", self.describe(state))

    def _range(
        self, state: str, key_groups: tuple[int, int] | None, reader: str,
        key_prefix: bytes | None,
    ) -> tuple[bytes, bytes, bool] | None:
        bounds = self.key_group_bounds(key_groups)
        if bounds is None:
            return None
        start, stop = _key_range(self.prefix_bytes, bounds, key_prefix)
        if reader not in ("auto", "sst", "rocksdb"):
            raise InvalidOptionError(f"reader must be auto, sst or rocksdb, not {reader!r}")
        return start, stop, reader == "sst" or (reader == "auto" and self.uses_merge_reader(state))

    def _sst_entries(self, state: str, start: bytes, stop: bytes) -> Iterator[KeyValue]:
        cf = self._cfs.get(state)
        if cf is None:
            return
        n = self.prefix_bytes
        tables = [self._tables[f.local_path] for f, _ in cf.tables]
        for key, value in merged_entries(tables, start, stop):
            yield KeyValue(int.from_bytes(key[:n], "big"), key, value)

    def _rocksdb_entries(self, state: str, start: bytes, stop: bytes) -> Iterator[KeyValue]:
        n = self.prefix_bytes
        try:
            for key, value in self._pairs(state, start, stop):
                if key >= stop:
                    break
                yield KeyValue(int.from_bytes(key[:n], "big"), key, value)
        except StatequeryError:
            raise
        except Exception as e:
            raise self.wrap_error(state, e) from e

    def describe(self, state: str) -> str:
        """The files holding ``state`` (for errors): its tables, or the MANIFEST."""
        cf = self._cfs.get(state)
        if cf is not None and cf.tables:
            return ", ".join(f.source for f, _ in cf.tables)
        return self._manifest.source

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        self._closed = True
        try:
            if self._rdict is not None:
                try:
                    self._rdict.close()
                finally:
                    self._rdict = None
        finally:
            self._close_files()


class TableReadState(_HandleReader):
    """One RocksDB handle read straight from its table files, fetching only those a read needs.

    ``CURRENT`` and the MANIFEST it names are fetched first; the MANIFEST
    (:func:`~statequery.backends.manifest.read_manifest`) gives every live table's column family
    and user-key range. A read of a key range (:meth:`items`, :meth:`entries`) then fetches, links
    and opens only the tables of the column family whose range intersects it and merges them with
    :func:`~statequery.backends.sst.merged_entries` (RocksDB's read rules: newest sequence number
    first, deletions, range tombstones, merge operands), so no RocksDB instance is opened and the
    ``OPTIONS`` file and all other tables are never fetched. Checked as for a restore: the
    MANIFEST's live tables must be exactly the handle's, with the handle's sizes, its column
    families exactly the metadata's states, and every table opened must belong to the column
    family the MANIFEST says. Same reading interface as :class:`RocksDBState`.
    """

    def __init__(
        self,
        handle: RocksDBHandle,
        io: FileIO,
        *,
        max_parallelism: int,
        cache: FileCache | None = None,
        state_names: Collection[str] | None = None,
    ) -> None:
        from statequery.backends.manifest import read_manifest

        super().__init__(handle, io, max_parallelism=max_parallelism, cache=cache,
                         state_names=state_names)
        self._lock = threading.Lock()
        #: RocksDB names of the files placed so far (fetched into the cache unless cached)
        self.placed: list[str] = []
        try:
            self._by_name = by_name = _files_by_name(handle)
            current = _current_of(handle, by_name)
            self._dir = self.cache.new_db_dir()
            self._place(current)
            manifest = _check_current(self._dir.path, current, by_name)
            self._manifest = manifest
            self._place(manifest)
            with open(os.path.join(self._dir.path, manifest.local_path), "rb") as fh:
                data = fh.read()
            self.meta = read_manifest(data, manifest.source)
            self._check()
        except BaseException:
            self.close()
            raise

    def _place(self, f: DbFile) -> str:
        assert self._dir is not None
        dest = os.path.join(self._dir.path, f.local_path)
        _place(self.cache, self.io, f, dest)
        self.placed.append(f.local_path)
        return dest

    def _check(self) -> None:
        m, manifest = self.meta, self._manifest
        if m.comparator and m.comparator not in ("leveldb.BytewiseComparator",
                                                 "rocksdb.BytewiseComparator"):
            raise UnsupportedFormatError(f"{manifest.source}: comparator {m.comparator} is not "
                                         "supported (Flink uses leveldb.BytewiseComparator)")
        live = {t.name: t for t in m.tables.values()}
        for f in self.handle.sst_files:
            if f.local_path not in live:
                raise CorruptStateError(
                    f"table {f.local_path} is not live in {manifest.local_path} "
                    "(truncated or mismatched MANIFEST)", manifest.source)
        for name, t in live.items():
            held = self._by_name.get(name)
            if held is None:
                raise CorruptStateError(
                    f"{manifest.local_path} names table {name}, which the state handle does not "
                    "include (missing SST)", manifest.source)
            if held.size >= 0 and t.size != held.size:
                raise CorruptStateError(
                    f"{manifest.local_path} says {name} has {t.size} bytes, its handle says "
                    f"{held.size}", held.source)
        self._cf_names = [n for _, n in sorted(m.column_families.items()) if n != DEFAULT_CF]
        if self.state_names is not None:
            for n in self._cf_names:
                if n not in self.state_names:
                    raise CorruptStateError(
                        f"column family {n!r} is not a state of this operator's metadata "
                        f"({', '.join(sorted(self.state_names))})", manifest.source)
            missing = sorted(self.state_names - set(self._cf_names))
            if missing:
                raise CorruptStateError(
                    f"the MANIFEST has no column family for state(s) {', '.join(missing)} "
                    "(truncated MANIFEST?)", manifest.source)
        self._by_cf: dict[str, list[Any]] = {}
        for t in sorted(live.values(), key=lambda t: t.number):
            self._by_cf.setdefault(t.column_family, []).append(t)

    def _table(self, meta: Any) -> SstFile:
        with self._lock:
            table = self._tables.get(meta.name)
            if table is not None:
                return table
            if self._dir is None:
                raise StatequeryError("the RocksDB state is closed")
            f = self._by_name[meta.name]
            try:
                table = open_point_table(self.io, f, meta.largest_seqno) if POINT_READS else None
                if table is None:
                    table = SstFile(self._place(f), source=f.source)
            except StatequeryError as e:
                if isinstance(e, CorruptStateError) and e.source != f.source:
                    raise CorruptStateError(str(e), f.source) from e
                raise
            props = table.properties
            named = props.column_family_name or (meta.column_family if table.external else "")
            if named != meta.column_family:
                table.close()
                raise CorruptStateError(
                    f"table {f.local_path} belongs to column family "
                    f"{props.column_family_name!r}, its MANIFEST says {meta.column_family!r}",
                    f.source)
            if props.merge_operands and props.merge_operator not in _MERGE_OPERATORS:
                table.close()
                raise UnsupportedFormatError(
                    f"{f.source}: merge operator {props.merge_operator} is not supported "
                    "(Flink uses StringAppendTESTOperator)")
            try:
                table.apply_manifest_seqno(meta.largest_seqno)
            except BaseException:
                table.close()
                raise
            self._tables[meta.name] = table
            return table

    # -- reading -------------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._dir is not None

    @property
    def column_families(self) -> list[str]:
        return list(self._cf_names)

    def uses_merge_reader(self, state: str) -> bool:
        return state in self._cf_names

    def tables_for(self, state: str, start: bytes, stop: bytes) -> list[Any]:
        """The MANIFEST's tables of ``state`` whose user-key range meets ``[start, stop)``."""
        return [t for t in self._by_cf.get(state, ()) if t.overlaps(start, stop)]

    def items(
        self, state: str, key_groups: tuple[int, int] | None = None, *,
        key_prefix: bytes | None = None, match: tuple[bytes, int] | None = None,
    ) -> tuple[Iterator[tuple[bytes, bytes]], bytes]:
        """``(key, value)`` pairs of ``state`` and the exclusive stop key (see
        :meth:`RocksDBState.items`); fetches the tables the range needs."""
        if self._dir is None:
            raise StatequeryError("the RocksDB state is closed")
        bounds = self.key_group_bounds(key_groups)
        if state == DEFAULT_CF or state not in self._cf_names or bounds is None:
            return iter(()), b""
        start, stop = _key_range(self.prefix_bytes, bounds, key_prefix)
        tables = [self._table(t) for t in self.tables_for(state, start, stop)]
        if not tables:
            return iter(()), stop
        return iter(merged_entries(tables, start, stop, match=match)), stop

    def entries(
        self, state: str, key_groups: tuple[int, int] | None = None, *, reader: str = "auto",
        key_prefix: bytes | None = None,
    ) -> Iterator[KeyValue]:
        """Raw entries of ``state`` (see :meth:`RocksDBState.entries`; always the SST reader)."""
        if reader not in ("auto", "sst"):
            raise InvalidOptionError(f"reader must be auto or sst here, not {reader!r}")
        if state == DEFAULT_CF or state not in self._cf_names:
            if self.state_names is not None and state in self.state_names:
                return iter(())
            raise InvalidOptionError(
                f"no column family {state!r} in this RocksDB snapshot; it has: "
                f"{', '.join(self._cf_names) or 'none'}")
        items, _ = self.items(state, key_groups, key_prefix=key_prefix)
        n = self.prefix_bytes
        return (KeyValue(int.from_bytes(k[:n], "big"), k, v) for k, v in items)

    def describe(self, state: str) -> str:
        names = [t.name for t in self._by_cf.get(state, ())]
        if names:
            return ", ".join(self._by_name[n].source for n in names)
        return self._manifest.source

    def wrap_error(self, state: str, e: Exception) -> CorruptStateError:
        return CorruptStateError(f"reading column family {state!r} failed: {e}",
                                 self.describe(state))



def _files_by_name(handle: RocksDBHandle) -> dict[str, DbFile]:
    by_name: dict[str, DbFile] = {}
    for f in handle.files:
        if f.local_path in by_name:
            raise CorruptStateError(f"RocksDB file {f.local_path} appears twice in the handle",
                                    f.source)
        by_name[f.local_path] = f
    return by_name


def _current_of(handle: RocksDBHandle, by_name: dict[str, DbFile]) -> DbFile:
    current = by_name.get("CURRENT")
    if current is None:
        first = next((f.location for f in handle.files if f.location), None)
        raise CorruptStateError(
            f"the RocksDB handle {handle.name or ''} names no CURRENT file "
            f"(files: {', '.join(sorted(by_name)) or 'none'})", first)
    return current


def _place(cache: FileCache, io: FileIO, f: DbFile, dest: str) -> None:
    """Put file ``f`` at ``dest``: inline bytes written, others linked from the cache (fetched
    into it first when needed, size checked against the handle)."""
    if f.data is not None:
        if f.size >= 0 and f.size != len(f.data):
            raise CorruptStateError(
                f"inline file has {len(f.data)} bytes, its handle says {f.size}", f.source)
        with open(dest, "wb") as out:
            out.write(f.data)
        return
    assert f.location is not None
    if f.size < 0:
        raise CorruptStateError("state handle without a size", f.source)
    cache.link(io, CacheKey(f.location, f.size, f.checksum, f.offset), dest)


def _check_current(root: str, current: DbFile, by_name: dict[str, DbFile]) -> DbFile:
    """The MANIFEST that ``CURRENT`` (already placed in ``root``) names."""
    with open(os.path.join(root, "CURRENT"), "rb") as fh:
        text = fh.read()
    name = text.decode("utf-8", "replace").strip()
    if not text.endswith(b"\n") or not re.fullmatch(r"MANIFEST-\d+", name):
        raise CorruptStateError(f"CURRENT does not name a MANIFEST file: {text[:64]!r}",
                                current.source)
    manifest = by_name.get(name)
    if manifest is None:
        raise CorruptStateError(f"CURRENT names {name}, which the state handle does not "
                                "include (missing MANIFEST)", current.source)
    return manifest


def _key_range(
    prefix_bytes: int, bounds: tuple[int, int], key_prefix: bytes | None,
) -> tuple[bytes, bytes]:
    """``[start, stop)`` of the keys of key groups ``bounds`` (inclusive), or of the keys
    starting with ``key_prefix`` in the single key group ``bounds`` names."""
    start = bounds[0].to_bytes(prefix_bytes, "big")
    stop = (bounds[1] + 1).to_bytes(prefix_bytes, "big")
    if key_prefix:
        if bounds[0] != bounds[1]:
            raise InvalidOptionError("key_prefix needs a single key group")
        start += key_prefix
        stop = _prefix_successor(start) or stop
    return start, stop


def _prefix_successor(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string starting with ``prefix`` (None: none)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _local_names(e: BaseException) -> str:
    """RocksDB's message with our private directory stripped from the file names it cites."""
    return re.sub(r"(/[^\s:]*)?/db/[0-9a-f]{32}/", "", str(e)).strip()


#: a table file and offset cited by a RocksDB error ("... in <dir>/000009.sst offset 474 size 232")
_CITED_TABLE = re.compile(r"(?:^|[\s/])(\d+\.sst) offset (\d+)")


def _checked_pairs(pairs: Iterable[tuple[bytes, bytes]],
                   on_end: Callable[[tuple[bytes, bytes] | None], None]) -> Iterator[
        tuple[bytes, bytes]]:
    """The items of ``pairs``, then ``on_end(last item or None)`` once they are exhausted
    (compiled: ``_sst.CheckedPairs``)."""
    compiled = compiled_module()
    if compiled is not None:
        return compiled.CheckedPairs(pairs, on_end)  # type: ignore[no-any-return]
    return _checked_pairs_py(pairs, on_end)


def _checked_pairs_py(pairs: Iterable[tuple[bytes, bytes]],
                      on_end: Callable[[tuple[bytes, bytes] | None], None]) -> Iterator[
        tuple[bytes, bytes]]:
    last = None
    for last in pairs:
        yield last
    on_end(last)


def from_incremental_handle(handle: Any, resolver: Any) -> RocksDBHandle:
    """A :class:`RocksDBHandle` from the metadata layer's ``IncrementalHandle``.

    ``resolver`` is the ``metadata.handles.HandleResolver`` of the snapshot: it resolves relative
    files against the ``_metadata`` directory and remaps absolute paths of a moved checkpoint.
    """
    from statequery.metadata.handles import ByteStreamHandle, EmptySegmentHandle, SegmentHandle

    files = []
    for name, sh in (*handle.shared, *handle.private):
        if isinstance(sh, ByteStreamHandle):
            files.append(DbFile(name, data=sh.data, size=len(sh.data),
                                description=resolver.source_name(sh)))
        elif isinstance(sh, EmptySegmentHandle):
            files.append(DbFile(name, data=b"", size=0, description=f"<empty segment {name}>"))
        elif isinstance(sh, SegmentHandle):
            files.append(DbFile(name, location=resolver.resolve_path(sh.physical_path),
                                size=sh.segment_size, offset=sh.start))
        else:
            location = resolver.location(sh)
            if location is None:
                raise UnsupportedFormatError(
                    f"RocksDB file {name} is stored in a {type(sh).__name__}, which statequery "
                    "cannot fetch")
            size = sh.size
            if size is None:
                size = len(resolver.io.new_input(location))
            files.append(DbFile(name, location=location, size=size))
    kgr = handle.key_group_range
    return RocksDBHandle(kgr.start, kgr.end, tuple(files),
                         name=handle.handle_id or handle.backend_id or "")


def _bounds(key_groups: Any) -> tuple[int, int] | None:
    if key_groups is None:
        return None
    if isinstance(key_groups, tuple):
        return int(key_groups[0]), int(key_groups[1])
    return int(key_groups.start), int(key_groups.end)  # hashing.KeyGroupRange


def _handle_range(h: Any) -> tuple[int, int]:
    if isinstance(h, RocksDBHandle):
        return h.start_key_group, h.end_key_group
    kgr = h.key_group_range
    return kgr.start, kgr.end


def read_entries(
    handles: Iterable[Any],
    io: FileIO,
    state: str,
    *,
    max_parallelism: int,
    key_groups: Any = None,
    cache: FileCache | None = None,
    state_names: Collection[str] | None = None,
    resolver: Any = None,
) -> Iterator[KeyValue]:
    """Raw entries of ``state`` over every handle whose key-group range overlaps ``key_groups``.

    ``handles`` are :class:`RocksDBHandle` or the metadata layer's ``IncrementalHandle`` (then
    ``resolver``, a ``HandleResolver``, is required); ``key_groups`` is an inclusive
    ``(start, end)`` or a ``KeyGroupRange``. Handles are opened one at a time in key-group order
    and closed before the next; handles that do not overlap are never resolved nor fetched.
    """
    cache = cache if cache is not None else default_cache()
    if resolver is not None:
        for d in (resolver.metadata_dir, resolver.job_dir):
            if d:
                cache.check_outside(d)
    bounds = _bounds(key_groups)
    selected: Sequence[Any] = sorted(
        (h for h in handles
         if bounds is None or (_handle_range(h)[0] <= bounds[1]
                               and bounds[0] <= _handle_range(h)[1])),
        key=lambda h: _handle_range(h)[0])
    for h in selected:
        if not isinstance(h, RocksDBHandle):
            if resolver is None:
                raise InvalidOptionError("read_entries needs a HandleResolver for "
                                         f"{type(h).__name__} handles")
            h = from_incremental_handle(h, resolver)
        with RocksDBState(h, io, max_parallelism=max_parallelism, cache=cache,
                          state_names=state_names) as db:
            yield from db.entries(state, bounds)


def feed(
    entries: Iterable[KeyValue],
    prefix_len: int,
    on_entry: Callable[[bytes, int, int, int, int, int], None],
    finish: Callable[[], None] | None = None,
) -> int:
    """Drive a ``keygroups.CompositeEntryDecoder``-style handler with RocksDB entries.

    Calls ``on_entry(buf, kpos, kend, vpos, vend, key_group)`` with ``buf = key + value`` and
    ``kpos`` just after the key-group prefix (the canonical scan's convention), and ``finish()``
    at the end of every key group. Returns the number of entries.
    """
    current = -1
    n = 0
    for kg, key, value in entries:
        if kg != current:
            if current >= 0 and finish is not None:
                finish()
            current = kg
        buf = key + value
        k = len(key)
        on_entry(buf, prefix_len, k, k, len(buf), kg)
        n += 1
    if current >= 0 and finish is not None:
        finish()
    return n


# -- restored databases kept open per Savepoint ----------------------------------------------------


class _Unpooled:
    """``with``-able wrapper of a DB opened for one scan (no pool): closed at the end."""

    def __init__(self, db: Any) -> None:
        self.db = db

    def __enter__(self) -> Any:
        return self.db

    def __exit__(self, *exc: object) -> None:
        self.db.close()


class _Pooled:
    """``with``-able use of a pooled DB: released (not closed) at the end."""

    def __init__(self, db: Any, pool: OpenDatabases) -> None:
        self.db = db
        self.pool = pool

    def __enter__(self) -> Any:
        return self.db

    def __exit__(self, *exc: object) -> None:
        self.pool.release(self.db)


# -- the KeyedBackend for reader.py --------------------------------------------------------------

_DEFAULT_CACHE: FileCache | None = None


def default_cache() -> FileCache:
    """The process-wide cache (``STATEQUERY_CACHE_DIR`` / ``~/.cache/statequery``), made lazily."""
    global _DEFAULT_CACHE
    if _DEFAULT_CACHE is None:
        _DEFAULT_CACHE = FileCache()
    return _DEFAULT_CACHE


class RocksDBKeyedBackend:
    """A ``statequery.backends.KeyedBackend`` over one subtask's ``IncrementalHandle``.

    Nothing is fetched when it is made. ``layouts`` reads the handle's small meta-data stream
    (the ``KeyedBackendSerializationProxy``) on first use; :meth:`scan` restores the DB (through
    the cache) only when the requested key groups overlap the handle, decodes the state's entries
    with :class:`~statequery.backends.keygroups.CompositeEntryDecoder`, and closes the DB when
    the scan ends.
    """

    compressed = False

    def __init__(
        self, handle: Any, context: Any, cache: FileCache | None = None,
        order: list[Any] | None = None,
    ) -> None:
        self.handle = handle
        self.context = context
        self.resolver = context.resolver
        self.max_parallelism = int(context.max_parallelism)
        self.cache = cache or getattr(context, "cache", None) or default_cache()
        kgr = handle.key_group_range
        self.key_groups: Sequence[int] = range(kgr.start, kgr.end + 1)
        self.name = self.resolver.source_name(handle.meta)
        self._proxy: Any = None
        self._layouts: dict[str, Any] | None = None
        self.errors: dict[str, str] = {}
        # the header's states in id order, from the StateMeta model: no meta stream is read
        self._state_names: list[str] | None = None
        if order is not None:
            self._layouts = {layout.name: layout for layout in order}
            self._state_names = [layout.name for layout in order]

    @property
    def proxy(self) -> Any:
        if self._proxy is None:
            from statequery.backends.base import HandleStream, read_proxy

            self._proxy = read_proxy(HandleStream(self.resolver, self.handle.meta), 0)
        return self._proxy

    @property
    def key_serializer(self) -> Any:
        return getattr(self.proxy, "key_serializer", None)

    @property
    def layouts(self) -> dict[str, Any]:
        if self._layouts is None:
            layouts: dict[str, Any] = {}
            for meta in self.proxy.states:
                key = None if not meta.keyed else self.key_serializer
                layouts[meta.name] = state = replace(meta, key_spec=key)
                if state.unsupported is not None:
                    self.errors[meta.name] = state.unsupported
            self._layouts = layouts
        return self._layouts

    def open(self) -> RocksDBState:
        """Restore and open the DB (the caller closes it)."""
        require_extra("rocksdict", "rocksdb", "reading RocksDB native state")
        checksums.require()
        for d in (self.resolver.metadata_dir, self.resolver.job_dir):
            if d:
                self.cache.check_outside(d)
        return RocksDBState(
            from_incremental_handle(self.handle, self.resolver), self.resolver.io,
            max_parallelism=self.max_parallelism, cache=self.cache,
            state_names=self._state_names or [s.name for s in self.proxy.states])

    def open_tables(self) -> TableReadState:
        """Fetch the handle's CURRENT and MANIFEST only (tables are fetched per read; the
        caller closes it). Needs no RocksDB, but RocksDB state needs the ``rocksdb`` extra
        whatever the query, so that a query does not fail later on another path."""
        require_extra("rocksdict", "rocksdb", "reading RocksDB native state")
        checksums.require()
        for d in (self.resolver.metadata_dir, self.resolver.job_dir):
            if d:
                self.cache.check_outside(d)
        return TableReadState(
            from_incremental_handle(self.handle, self.resolver), self.resolver.io,
            max_parallelism=self.max_parallelism, cache=self.cache,
            state_names=self._state_names or [s.name for s in self.proxy.states])

    def _database(self, lookup: bool = False) -> _Pooled | _Unpooled:
        """The restored DB: from the savepoint's pool of open databases when its resolver has
        one (kept open), else opened for this scan and closed after it.

        A lookup (``lookup``: one key of one key group) uses a DB already restored for this
        handle if the pool holds one, else a :class:`TableReadState` (kept in the pool too),
        which fetches only the MANIFEST and the tables whose key range can hold the key.
        """
        pool = self.context.open_databases
        key = (self.name, self.max_parallelism, id(self.cache))
        if lookup and SELECTIVE_LOOKUPS:
            if pool is None:
                return _Unpooled(self._open_selective())
            db = pool.peek(key, use=True)
            if db is not None:
                return _Pooled(db, pool)
            return _Pooled(pool.get((*key, "tables"), self._open_selective, use=True), pool)
        if pool is None:
            return _Unpooled(self.open())
        return _Pooled(pool.get(key, self.open, use=True), pool)

    def _open_selective(self) -> TableReadState | RocksDBState:
        """A :class:`TableReadState`, or the full restore when the MANIFEST uses a feature the
        table reader does not support (RocksDB then reads it)."""
        try:
            return self.open_tables()
        except UnsupportedFormatError:
            return self.open()

    def scan(
        self, layout: Any, mode: str | None, builder: Any,
        key_groups: Iterable[int] | None = None,
    ) -> Iterator[int]:
        """Append ``layout``'s rows for ``key_groups`` to ``builder``; yield per key group."""
        yield from self.scan_states([(layout, builder)], mode, key_groups)

    def scan_states(
        self, requests: Sequence[tuple[Any, Any]], mode: str | None,
        key_groups: Iterable[int] | None = None, key_bytes: Sequence[bytes] | None = None,
    ) -> Iterator[int]:
        """Several states with one restore of the DB (state after state); yield per key group.

        ``key_bytes`` (serialized keys, :func:`statequery.keys.resolve_key`): only their
        entries. One key (a lookup) seeks straight to its entries in its key group (keys are
        sorted by key-group prefix, then serialized key) instead of walking the key group;
        timers, whose keys start with the timestamp, are filtered by key bytes while walking.
        """
        own = self.key_groups
        wanted = None if key_groups is None else {kg for kg in key_groups if kg in own}
        if wanted is not None and not wanted:
            return
        single = key_bytes is not None and len(key_bytes) == 1
        lookup = single and wanted is not None and len(wanted) == 1
        raw = key_bytes[0] if key_bytes is not None and single else None
        try:
            with self._database(lookup) as db:
                for layout, builder in requests:
                    yield from self._scan_db(db, layout, mode, builder, wanted, key_bytes, raw)
        except CorruptStateError as e:
            cached = self._damaged_in_cache(e)
            if cached is None:
                raise
            raise cached from e

    def _damaged_in_cache(self, e: CorruptStateError) -> CorruptStateError | None:
        """When ``e`` (a checksum mismatch, say) names one of the handle's files whose cached copy
        differs from the file itself, that copy was damaged after it was fetched: it is removed
        from the cache (the next read fetches the file again) and the error says so."""
        if e.source is None:
            return None
        try:
            files = from_incremental_handle(self.handle, self.resolver).files
            for f in files:
                if f.location is None or f.source != e.source or f.size < 0:
                    continue
                key = CacheKey(f.location, f.size, f.checksum, f.offset)
                if self.cache.forget_if_damaged(self.resolver.io, key):
                    return CorruptStateError(
                        f"{e.reason}; in the local cache's copy only, not in the file itself: "
                        f"the damaged copy was removed from the cache ({self.cache.root}); the "
                        "next read fetches the file again", e.source, e.offset)
        except StatequeryError:
            return None  # the file itself cannot be read: report the original error
        return None

    def _scan_db(
        self, db: RocksDBState, layout: Any, mode: str | None, builder: Any,
        wanted: set[int] | None, key_bytes: Sequence[bytes] | None, raw: bytes | None,
    ) -> Iterator[int]:
        from statequery.backends.keygroups import CompositeEntryDecoder

        if layout.name not in db.column_families:
            return
        decoder = CompositeEntryDecoder(layout, mode, builder, key_bytes)
        current = -1
        # one seek per run of consecutive wanted key groups: key groups between them are never
        # iterated (several keys' key groups, or a sparse selection)
        for run in _runs(wanted):
            for kg in self._scan_run(db, layout, decoder, run, raw):
                if kg != current:
                    if current >= 0:
                        decoder.finish()
                        yield current
                    current = kg
        if current >= 0:
            decoder.finish()
            yield current

    def _scan_run(
        self, db: RocksDBState, layout: Any, decoder: Any, bounds: tuple[int, int] | None,
        raw: bytes | None,
    ) -> Iterator[int]:
        """Feed the entries of key groups ``bounds`` (inclusive; None: the handle's) to
        ``decoder``; yields each key group after its last entry (``decoder.finish`` is the
        caller's)."""
        from statequery.backends.fastpath import bulk_feeder
        from statequery.backends.fastpath import compiled as compiled_module_read
        from statequery.serializers.readers import DECODE_ERRORS, DecodeError

        single = bounds is not None and bounds[0] == bounds[1]
        seek = raw if raw and not layout.is_timer and single else None
        on_entry, prefix = decoder.on_entry, key_group_prefix_bytes(self.max_parallelism)
        feed = bulk_feeder(on_entry)
        # (a restored DB offers it; the table reader of lookups does not)
        table_scan = getattr(db, "table_scan", None) if feed is not None else None
        scan = None if table_scan is None else table_scan(layout.name, bounds, key_prefix=seek)
        if scan is not None:
            # the compiled table scan: one key group's entries packed per call, fed to the
            # compiled sink in one call (no pair, no Python object per entry), as a view of
            # the scan's own buffer (released before the next call reuses it)
            read_module = compiled_module_read()
            assert read_module is not None  # a compiled sink: the module is there
            packed = read_module.feed_packed
            chunk = getattr(scan, "next_view", None) or scan.next_chunk
            while True:
                try:
                    kg, _n, buf, ends = chunk()
                    if kg < 0:
                        return
                    packed(on_entry, buf, prefix, ends)
                except DecodeError as e:
                    raise CorruptStateError(f"state {layout.name!r}, {e.message}",
                                            db.describe(layout.name)) from e
                if isinstance(buf, memoryview):
                    buf.release()
                if ends:
                    yield kg
        if feed is not None:
            # compiled sink: (key, value) pairs straight from the iterator, one key group a call
            pairs, stop = db.items(layout.name, bounds, key_prefix=seek)
            pending = None
            while True:
                try:
                    kg, _n, pending = feed(on_entry, pairs, prefix, pending, stop, None)
                except DecodeError as e:
                    raise CorruptStateError(f"state {layout.name!r}, {e.message}",
                                            db.describe(layout.name)) from e
                except (StatequeryError, MemoryError):
                    raise
                except Exception as e:  # rocksdict raises plain Exception
                    raise db.wrap_error(layout.name, e) from e
                if kg < 0:
                    return
                yield kg
        # the Python handlers: plain (key, value) pairs, the key group read from the prefix
        items: Iterable[tuple[bytes, bytes]]
        if raw and layout.is_timer and single:
            # a lookup's timers: keys start with the timestamp, so the key group is walked,
            # but filtered by the key's bytes (after prefix and timestamp) by the reader (the
            # table walk in C, a comprehension over RocksDB's pairs), not by a decoder call
            # per timer
            try:
                items, stop = db.items(layout.name, bounds, match=(raw, prefix + 8))
            except (StatequeryError, MemoryError):
                raise
            except Exception as e:  # rocksdict raises plain Exception
                raise db.wrap_error(layout.name, e) from e
        else:
            items, stop = db.items(layout.name, bounds, key_prefix=seek)
        one = prefix == 1
        current = -1
        try:
            for key, value in items:
                if stop and key >= stop:  # as the compiled feed (``_read.feed_key_group``)
                    raise CorruptStateError(
                        f"state {layout.name!r}, entry key {key.hex()} lies at or after the end "
                        f"of its range ({stop.hex()}): the table's keys are out of order",
                        db.describe(layout.name))
                kg = key[0] if one else int.from_bytes(key[:prefix], "big")
                if kg != current:
                    if current >= 0:
                        yield current
                    current = kg
                buf = key + value
                try:
                    on_entry(buf, prefix, len(key), len(key), len(buf), kg)
                except DecodeError as e:
                    raise CorruptStateError(
                        f"state {layout.name!r}, key group {kg}: {e.message} (entry key "
                        f"{key.hex()})", db.describe(layout.name)) from e
                except DECODE_ERRORS as e:
                    raise CorruptStateError(
                        f"state {layout.name!r}, key group {kg}: {type(e).__name__}: {e} "
                        f"(entry key {key.hex()})", db.describe(layout.name)) from e
        except (StatequeryError, MemoryError):
            raise
        except Exception as e:  # rocksdict raises plain Exception while iterating
            raise db.wrap_error(layout.name, e) from e
        if current >= 0:
            yield current


def _runs(wanted: Collection[int] | None) -> list[tuple[int, int] | None]:
    """Runs of consecutive key groups (inclusive bounds), ascending; ``[None]`` for all."""
    if wanted is None:
        return [None]
    out: list[tuple[int, int] | None] = []
    start = prev = -2
    for kg in sorted(wanted):
        if kg != prev + 1:
            if prev >= 0:
                out.append((start, prev))
            start = kg
        prev = kg
    if prev >= 0:
        out.append((start, prev))
    return out


def _incremental_factory(handle: Any, context: Any) -> RocksDBKeyedBackend | None:
    from statequery.metadata.handles import IncrementalHandle

    if not isinstance(handle, IncrementalHandle):
        return None
    order = context.order
    return RocksDBKeyedBackend(handle, context, order=None if order is None else list(order))


_REGISTERED = False


def register() -> None:
    """Register the RocksDB backend with :func:`statequery.backends.register_keyed_backend`
    (done on import; idempotent)."""
    global _REGISTERED
    if not _REGISTERED:
        from statequery.backends import register_keyed_backend

        register_keyed_backend(_incremental_factory)  # type: ignore[arg-type]
        _REGISTERED = True


register()
