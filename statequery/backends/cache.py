"""A local, content-addressed cache of remote state files (RocksDB SSTs, MANIFESTs, ...).

RocksDB opens files by local path, so every remote file a RocksDB handle names is fetched once
through the storage seam (:class:`~statequery.io.FileIO`) into this cache, then hard-linked (or
copied) into a private per-handle DB directory (:meth:`FileCache.new_db_dir`). Local files are
never cached: they are read in place (:meth:`FileCache.link`), so a file rewritten with the same
size and a kept mtime is never served from an old copy.

* **Location**: ``root`` argument, else ``$STATEQUERY_CACHE_DIR``, else
  ``$XDG_CACHE_HOME/statequery``, else ``~/.cache/statequery``. It must not lie inside the
  savepoint directory being read (:meth:`FileCache.check_outside`).
* **Key**: SHA-256 of the object's full identity and version: location (scheme, bucket, path),
  the endpoint it was read from (``FileIO.endpoint``: an S3-compatible server's URL), the size and
  checksum its handle gives, and the version the store reports right before use
  (``FileIO.version``: mtime and inode locally, ETag/version id remotely). The same name on two
  endpoints, or a file rewritten in place with the same size, is a different entry; an entry
  lives at ``objects/<2 hex>/<digest>``.
* **Writes**: to a unique file under ``tmp/``, flushed and fsynced, size (and checksum) verified,
  then atomically renamed into place; a half-written file is never visible under its entry name.
  Two processes fetching the same file both succeed: the last rename wins with identical bytes.
* **Verification before use**: an entry whose size (or checksum, when the handle gives one) does
  not match is deleted and fetched again.
* **Bounded**: ``max_bytes`` (``$STATEQUERY_CACHE_MAX_BYTES``, default 10 GiB); least recently used
  entries (mtime is touched on every use) are evicted under an exclusive ``fcntl`` lock, skipping
  entries that are hard-linked into an open DB directory. Fetching and linking an entry hold the
  same lock shared, so no eviction (of any thread or process) runs between an entry's
  verification and its link: an entry in use is never deleted from under a reader.
* **DB directories** live under ``db/``; each is guarded by an ``flock``-ed lock file so a later
  eviction pass removes the directories of crashed processes, never those still in use.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

from statequery.exceptions import CorruptStateError, InvalidOptionError, StorageError
from statequery.io import FileIO, is_local

try:  # POSIX only; on other platforms the cache works without cross-process locks
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

__all__ = ["DEFAULT_MAX_BYTES", "CacheKey", "DbDir", "FileCache", "default_cache_dir"]

DEFAULT_MAX_BYTES = 10 * 1024**3
_CHUNK = 4 * 1024 * 1024
_STALE_TMP_SECONDS = 3600


def default_cache_dir() -> str:
    """``$STATEQUERY_CACHE_DIR``, else ``$XDG_CACHE_HOME/statequery``, else
    ``~/.cache/statequery``."""
    env = os.environ.get("STATEQUERY_CACHE_DIR")
    if env:
        return os.path.abspath(os.path.expanduser(env))
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.abspath(os.path.join(base, "statequery"))


def _default_max_bytes() -> int:
    env = os.environ.get("STATEQUERY_CACHE_MAX_BYTES")
    if not env:
        return DEFAULT_MAX_BYTES
    try:
        return int(env)
    except ValueError as e:
        raise InvalidOptionError(f"STATEQUERY_CACHE_MAX_BYTES={env!r} is not an integer") from e


@dataclass(frozen=True)
class CacheKey:
    """What identifies a cached file: its location, its size and, when known, a checksum.

    ``checksum`` is ``"<hashlib algorithm>:<hex digest>"`` (e.g. ``"sha256:..."``).
    """

    location: str
    size: int
    checksum: str | None = None
    offset: int | None = None  # a segment [offset, offset+size) of a larger file (file merging)
    endpoint: str = ""  # the service the location was read from (FileIO.endpoint)
    version: str = ""  # the store's version of the whole file (FileIO.version), checked at use

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        if self.endpoint or self.version:
            h.update(b"endpoint\0" + self.endpoint.encode("utf-8") + b"\0")
            h.update(b"version\0" + self.version.encode("utf-8") + b"\0")
        h.update(self.location.encode("utf-8"))
        h.update(b"\0")
        h.update(str(self.size).encode())
        h.update(b"\0")
        h.update((self.checksum or "").encode())
        if self.offset is not None:
            h.update(b"\0@")
            h.update(str(self.offset).encode())
        return h.hexdigest()


def _checksum_of(path: str, checksum: str) -> bool:
    algo, _, expected = checksum.partition(":")
    try:
        h = hashlib.new(algo)
    except ValueError as e:
        raise InvalidOptionError(f"unknown checksum algorithm {algo!r} in {checksum!r}") from e
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest() == expected.lower()


@contextlib.contextmanager
def _flock(path: str, exclusive: bool = True) -> Iterator[None]:
    """An ``flock`` on ``path``: a fresh descriptor each time, so threads of one process exclude
    each other as processes do."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:  # the cache directory was removed by hand: recreate it
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # releases the lock


class DbDir:
    """A private directory for one opened RocksDB handle; removed by :meth:`close`.

    While open it holds an exclusive ``flock`` on ``<dir>.lock`` so eviction passes of other
    processes can tell a live directory from one left behind by a crash.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock_path = path + ".lock"
        self._fd: int | None = None
        while True:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.stat(self._lock_path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # a cleanup pass removed the lock file before we locked it: retry
        self._fd = fd
        os.makedirs(path, exist_ok=True)

    def close(self) -> None:
        if self._fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._lock_path)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> DbDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # a last resort; callers close explicitly
        with contextlib.suppress(Exception):
            self.close()


class FileCache:
    """The local file cache (see the module docstring). Thread- and process-safe; picklable."""

    def __init__(self, root: str | os.PathLike[str] | None = None,
                 max_bytes: int | None = None) -> None:
        self.root = os.path.abspath(os.fspath(root)) if root is not None else default_cache_dir()
        self.max_bytes = _default_max_bytes() if max_bytes is None else int(max_bytes)
        if self.max_bytes <= 0:
            raise InvalidOptionError(f"cache max_bytes must be positive, got {self.max_bytes}")
        self._objects = os.path.join(self.root, "objects")
        self._tmp = os.path.join(self.root, "tmp")
        self._dbs = os.path.join(self.root, "db")
        self._lockfile = os.path.join(self.root, ".lock")
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        for d in (self._objects, self._tmp, self._dbs):
            try:
                os.makedirs(d, exist_ok=True)
            except OSError as e:
                raise StorageError(f"cannot create cache directory {d}: {e}") from e

    def __repr__(self) -> str:
        return f"FileCache({self.root!r}, max_bytes={self.max_bytes})"

    def __getstate__(self) -> dict[str, object]:
        return {"root": self.root, "max_bytes": self.max_bytes}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["root"], state["max_bytes"])  # type: ignore[misc]

    # -- entries -------------------------------------------------------------------------------

    def entry_path(self, key: CacheKey) -> str:
        digest = key.digest
        return os.path.join(self._objects, digest[:2], digest)

    def check_outside(self, location: str) -> None:
        """Refuse a cache root inside the directory ``location`` (a local savepoint directory)."""
        if "://" in location:
            return
        try:
            loc = os.path.realpath(location)
            root = os.path.realpath(self.root)
        except (OSError, ValueError) as e:  # a link swapped for a file while it was resolved
            raise StorageError(f"cannot check where {location} or the cache directory "
                               f"{self.root} resolves to (did a symbolic link change while it "
                               f"was read?): {e}") from e
        if root == loc or root.startswith(loc.rstrip(os.sep) + os.sep):
            raise InvalidOptionError(
                f"the cache directory {self.root} lies inside the savepoint directory {location}; "
                "choose another cache location (STATEQUERY_CACHE_DIR)")

    def _thread_lock(self, digest: str) -> threading.Lock:
        with self._locks_guard:
            lock = self._locks.get(digest)
            if lock is None:
                lock = self._locks[digest] = threading.Lock()
            return lock

    def _valid(self, path: str, key: CacheKey) -> bool:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return False
        if st.st_size != key.size or (key.checksum and not _checksum_of(path, key.checksum)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # a damaged entry is never used: fetch it again
            return False
        with contextlib.suppress(OSError):
            os.utime(path)  # LRU: the mtime is the last use
        return True

    def identify(self, io: FileIO, key: CacheKey) -> CacheKey:
        """``key`` with the endpoint and the store's current version of its file: one stat (a
        HEAD on object stores) before every use, so a rewritten file is never served stale."""
        from dataclasses import replace

        actual, version = io.version(key.location)
        if key.offset is None and actual != key.size:
            raise CorruptStateError(
                f"file is {actual} bytes but its state handle says {key.size} "
                "(truncated or replaced?)", key.location)
        return replace(key, endpoint=io.endpoint(key.location), version=version)

    def fetch(self, io: FileIO, key: CacheKey) -> str:
        """The local path of a verified copy of ``key.location``, fetching it if needed.

        Raises :class:`CorruptStateError` naming the location when its size differs from the
        handle's (``key.size``) or its checksum does not match, and :class:`StorageError` when it
        cannot be read. Nothing half-written is left under the entry's name.
        """
        path = self.entry_path(key)
        if self._valid(path, key):
            return path
        with self._thread_lock(key.digest):
            if self._valid(path, key):
                return path
            self._download(io, key, path)
            if key.version and io.version(key.location)[1] != key.version:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                raise StorageError(f"{key.location} changed while it was being read; try again")
            return path

    def _download(self, io: FileIO, key: CacheKey, path: str) -> None:
        source = io.new_input(key.location)
        try:
            actual = len(source)
        except StorageError as e:
            raise StorageError(f"state file {key.location} is missing or unreadable: {e}") from e
        _check_size(key, actual)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=key.digest[:16] + ".", suffix=".part", dir=self._tmp)
        try:
            written = 0
            with os.fdopen(fd, "wb") as out, source.open() as src:
                if key.offset:
                    src.seek(key.offset)
                written = _copy(src, out, key.size if key.offset is not None else None)
                out.flush()
                os.fsync(out.fileno())
            if written != key.size:
                raise CorruptStateError(
                    f"read {written} bytes but its state handle says {key.size} (truncated?)",
                    key.location)
            if key.checksum and not _checksum_of(tmp, key.checksum):
                raise CorruptStateError(f"checksum mismatch (expected {key.checksum})",
                                        key.location)
            os.replace(tmp, path)  # atomic: readers see the whole file or none
            _fsync_dir(os.path.dirname(path))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def link(self, io: FileIO, key: CacheKey, dest: str) -> None:
        """Place a verified copy of ``key`` at ``dest`` (hard link, or copy across devices).

        Local files are never served from the cache: they are read in place (:func:`_place_local`:
        the file itself, opened through the storage seam, hard-linked or copied to ``dest``), so
        a file rewritten with the same size and kept mtime (``cp -p``, ``touch -r``) is read as
        it is now. Remote files: the key is completed with the endpoint and current version of
        its file (:meth:`identify`: size plus ETag/version id); fetch and link run under the
        cache lock held shared, so no eviction can remove the entry in between.
        """
        if is_local(key.location):
            _place_local(io, key, dest)
            return
        key = self.identify(io, key)
        for _ in range(3):
            with _flock(self._lockfile, exclusive=False):
                src = self.fetch(io, key)
                try:
                    os.link(src, dest)
                except FileNotFoundError:
                    continue  # removed by hand between fetch and link: fetch again
                except OSError as e:
                    if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                        raise StorageError(f"cannot link {src} to {dest}: {e}") from e
                    try:
                        shutil.copyfile(src, dest)
                    except FileNotFoundError:
                        continue
            if os.path.getsize(dest) == key.size:
                return
            os.unlink(dest)
        raise StorageError(f"{key.location}: the cached copy kept disappearing (cache too small?)")

    def forget_if_damaged(self, io: FileIO, key: CacheKey) -> bool:
        """Compare the cached copy of ``key`` with the file it was fetched from; when they differ
        (the copy was damaged after it was verified, e.g. on disk), remove the entry so the next
        read fetches the file again, and return True. Called when a checksum inside a copy
        fails, to tell a damaged cache entry from a damaged savepoint."""
        key = self.identify(io, key)
        path = self.entry_path(key)
        differ = False
        try:
            with open(path, "rb") as cached, io.new_input(key.location).open() as src:
                if key.offset:
                    src.seek(key.offset)
                left = key.size
                while left > 0 and not differ:
                    n = min(_CHUNK, left)
                    a, b = _read_up_to(cached, n), _read_up_to(src, n)
                    differ = a != b
                    if not a:
                        break
                    left -= len(a)
        except FileNotFoundError:
            return False
        if differ:
            with _flock(self._lockfile), contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # open DB directories keep their links; new reads fetch again
        return differ

    # -- DB directories and eviction -----------------------------------------------------------

    def new_db_dir(self) -> DbDir:
        try:
            os.makedirs(self._dbs, exist_ok=True)  # the cache may have been emptied by hand
        except OSError as e:
            raise StorageError(f"cannot create cache directory {self._dbs}: {e}") from e
        return DbDir(os.path.join(self._dbs, uuid.uuid4().hex))

    def entries(self) -> list[tuple[str, os.stat_result]]:
        out = []
        for sub in _listdir(self._objects):
            d = os.path.join(self._objects, sub)
            for name in _listdir(d):
                p = os.path.join(d, name)
                with contextlib.suppress(FileNotFoundError):
                    out.append((p, os.stat(p)))
        return out

    def size(self) -> int:
        return sum(st.st_size for _, st in self.entries())

    def evict(self, max_bytes: int | None = None) -> int:
        """Evict least recently used entries until the cache holds at most ``max_bytes``.

        Also removes stale temporary files and DB directories of dead processes. Entries
        hard-linked into an open DB directory are kept. Returns the bytes freed.
        """
        limit = self.max_bytes if max_bytes is None else max_bytes
        freed = 0
        with _flock(self._lockfile):
            self._remove_stale()
            entries = self.entries()
            total = sum(st.st_size for _, st in entries)
            if total <= limit:
                return 0
            for path, st in sorted(entries, key=lambda e: e[1].st_mtime):
                if total <= limit:
                    break
                if st.st_nlink > 1:
                    continue  # in use by an open DB directory
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    total -= st.st_size
                    freed += st.st_size
        return freed

    def _remove_stale(self) -> None:
        now = time.time()
        for name in _listdir(self._tmp):
            p = os.path.join(self._tmp, name)
            with contextlib.suppress(FileNotFoundError):
                if now - os.stat(p).st_mtime > _STALE_TMP_SECONDS:
                    os.unlink(p)
        for name in _listdir(self._dbs):
            if not name.endswith(".lock"):
                lock = os.path.join(self._dbs, name + ".lock")
                if not os.path.exists(lock):
                    # a directory without a lock file: its owner died between steps
                    p = os.path.join(self._dbs, name)
                    with contextlib.suppress(FileNotFoundError):
                        if now - os.stat(p).st_mtime > _STALE_TMP_SECONDS:
                            shutil.rmtree(p, ignore_errors=True)
                continue
            if fcntl is None:
                continue
            lock = os.path.join(self._dbs, name)
            try:
                fd = os.open(lock, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue  # still in use
            try:
                shutil.rmtree(lock[: -len(".lock")], ignore_errors=True)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(lock)
            finally:
                os.close(fd)

    def clear(self) -> None:
        """Remove every entry (and stale DB directories)."""
        self.evict(0)


def _read_up_to(f: IO[bytes], n: int) -> bytes:
    """``n`` bytes of ``f`` (fewer only at its end), whatever its reads return."""
    parts = []
    while n > 0:
        b = f.read(n)
        if not b:
            break
        parts.append(b)
        n -= len(b)
    return b"".join(parts)


def _check_size(key: CacheKey, actual: int) -> None:
    """The file of ``key`` is ``actual`` bytes: what its handle says (a whole file), or long
    enough for the segment it names."""
    if key.offset is None and actual != key.size:
        raise CorruptStateError(
            f"file is {actual} bytes but its state handle says {key.size} "
            "(truncated or replaced?)", key.location)
    if key.offset is not None and actual < key.offset + key.size:
        raise CorruptStateError(
            f"file is {actual} bytes, too short for the segment [{key.offset}, "
            f"{key.offset + key.size}) its state handle names (truncated?)", key.location)


def _place_local(io: FileIO, key: CacheKey, dest: str) -> None:
    """Put the current bytes of the local file ``key.location`` at ``dest``: opened once through
    ``io`` (so its confinement holds), then that very file hard-linked (``/proc/self/fd``, else
    the path it was opened by when that names the same inode: :func:`_link_open_file`) or, for
    segments, across devices or with a checksum to verify, copied. No cache entry: a linked
    file costs an open through ``io`` and no byte read."""
    with io.new_input(key.location).open() as src:
        try:
            fd = src.fileno()
            actual = os.fstat(fd).st_size
        except OSError as e:
            raise StorageError(f"cannot read {key.location}: {e}") from e
        _check_size(key, actual)
        if key.offset is None and not key.checksum:
            try:
                os.link(f"/proc/self/fd/{fd}", dest, follow_symlinks=True)
                return
            except OSError:
                pass  # no /proc, another device, not permitted: the path, else copy
            if _link_open_file(fd, dest):
                return
        try:
            with open(dest, "wb") as out:
                if key.offset:
                    src.seek(key.offset)
                written = _copy(src, out, key.size)
        except OSError as e:
            raise StorageError(f"cannot copy {key.location} to {dest}: {e}") from e
    if written != key.size:
        raise CorruptStateError(
            f"read {written} bytes but its state handle says {key.size} (truncated?)",
            key.location)
    if key.checksum and not _checksum_of(dest, key.checksum):
        raise CorruptStateError(f"checksum mismatch (expected {key.checksum})", key.location)


def _link_open_file(fd: int, dest: str) -> bool:
    """Hard-link the file open as ``fd`` to ``dest`` through the path it was opened by (where
    linking ``/proc/self/fd`` itself fails: EXDEV in some containers), keeping the link only
    when it is that very file (same device and inode: the path may name another file by now,
    or a symbolic link, which is linked as itself and refused). False (nothing left at
    ``dest``) when it cannot: the caller copies. Nothing is written to the file or its
    directory (a link adds a name in the DB directory; RocksDB opens the DB read-only)."""
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if not os.path.isabs(path):
            return False
        os.link(path, dest, follow_symlinks=False)
    except OSError:
        return False
    try:
        want, got = os.fstat(fd), os.lstat(dest)
        if (want.st_dev, want.st_ino) == (got.st_dev, got.st_ino):
            return True
        os.unlink(dest)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(dest)
    return False


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def _copy(src: IO[bytes], out: IO[bytes], limit: int | None = None) -> int:
    n = 0
    while limit is None or n < limit:
        chunk = src.read(_CHUNK if limit is None else min(_CHUNK, limit - n))
        if not chunk:
            break
        out.write(chunk)
        n += len(chunk)
    return n


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
