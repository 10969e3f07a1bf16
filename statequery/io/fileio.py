"""The seam: :class:`FileIO`, :class:`InputFile` and :class:`ReadStats`.

Every byte statequery reads from a file goes through :class:`FileIO`: local paths are read by
:class:`~statequery.io.local.LocalFileSystem`, every other scheme by
:class:`~statequery.io.fsspec.FsspecFileSystem` (or what :meth:`FileIO.register_scheme` names),
each behind the :class:`FileSystem` protocol. :class:`FileIO` is picklable (Spark ships readers
to executors) and keeps per-instance read statistics, so tests and benchmarks can assert exactly
which bytes and requests a query cost.

A file is opened once and kept open for the ranged reads that follow (a small, bounded pool of
:class:`~statequery.io.ranges.RangeReader` per :class:`FileIO`): reading many key groups of one
file costs one open, as a good remote client would do it. Each ranged read is one request;
:class:`ReadStats` counts both. What a file may resolve to is checked by its
:class:`~statequery.io.confine.Confinement` before and after it is opened.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, Protocol, TypedDict, TypeVar, cast
from urllib.parse import urlsplit

from statequery.exceptions import (
    InvalidOptionError,
    MissingExtraError,
    RedirectRefusedError,
    StatequeryError,
    StorageError,
)
from statequery.io.confine import (
    Confinement,
    filesystem_of,
    is_local_normalized,
    normalize_location,
    refusal_in,
)
from statequery.io.fsspec import FS_PACKAGES, FsspecFileSystem, construct, environment_hint
from statequery.io.local import LocalFileSystem, file_kind
from statequery.io.ranges import CountingStream, RangeReader

__all__ = [
    "RETRY_ATTEMPTS",
    "RETRY_BACKOFF",
    "FileIO",
    "FileSystem",
    "FileSystemFactory",
    "InputFile",
    "ReadStats",
    "StorageOptions",
]

T = TypeVar("T")

#: keyword arguments of a filesystem: credentials, endpoints ... (JSON values, passed to fsspec)
StorageOptions = dict[str, Any]

#: remote requests: attempts for transient failures (connection resets, timeouts, HTTP 5xx and
#: throttling), with exponential backoff from RETRY_BACKOFF seconds
RETRY_ATTEMPTS = int(os.environ.get("STATEQUERY_RETRIES", "5"))
RETRY_BACKOFF = 0.1
_TRANSIENT_ERRNOS = {errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE, errno.ETIMEDOUT,
                     errno.ECONNREFUSED, errno.EAGAIN}
_TRANSIENT_TEXT = ("503", "500 ", "502", "504", "SlowDown", "ServiceUnavailable", "InternalError",
                   "RequestTimeout", "Connection reset", "connection reset", "timed out",
                   "Server disconnected", "Connection was closed", "IncompleteRead")
_TRANSIENT_TYPES = ("ClientConnectionError", "ServerDisconnectedError", "ClientPayloadError",
                    "ClientOSError", "EndpointConnectionError", "ConnectionClosedError",
                    "ReadTimeoutError", "ConnectTimeoutError", "IncompleteReadError")


def _transient(e: BaseException) -> bool:
    """Whether a remote failure is worth retrying (never: missing, forbidden, invalid)."""
    if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
                      ValueError)):
        return False
    if isinstance(e, (ConnectionError, TimeoutError)):
        return True
    if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS:
        return True
    chain: BaseException | None = e
    while chain is not None:
        if type(chain).__name__ in _TRANSIENT_TYPES:
            return True
        if any(t in str(chain) for t in _TRANSIENT_TEXT):
            return True
        chain = chain.__cause__ or chain.__context__
    return False


def _env_storage_options() -> StorageOptions:
    """``$STATEQUERY_STORAGE_OPTIONS`` (a JSON object): the default storage options, e.g. for
    Spark executors (``spark.executorEnv.STATEQUERY_STORAGE_OPTIONS``) and the CLI."""
    import json

    text = os.environ.get("STATEQUERY_STORAGE_OPTIONS", "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as e:
        raise InvalidOptionError(f"STATEQUERY_STORAGE_OPTIONS is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise InvalidOptionError("STATEQUERY_STORAGE_OPTIONS must be a JSON object")
    return value


@dataclass
class ReadStats:
    """What a :class:`FileIO` read, per location: bytes, opens and requests.

    ``requests`` counts what a remote store would bill as requests: every open, every ranged
    read and every size/existence check.
    """

    bytes_read: Counter[str] = field(default_factory=Counter)
    opens: Counter[str] = field(default_factory=Counter)
    requests: Counter[str] = field(default_factory=Counter)

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_read.values())

    @property
    def total_opens(self) -> int:
        return sum(self.opens.values())

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    def reset(self) -> None:
        self.bytes_read.clear()
        self.opens.clear()
        self.requests.clear()


class InputFile:
    """One readable file, addressed by location (see :meth:`FileIO.new_input`)."""

    def __init__(self, io: FileIO, location: str) -> None:
        self._io = io
        self.location = location

    def __repr__(self) -> str:
        return f"InputFile({self.location!r})"

    def exists(self) -> bool:
        return self._io._exists(self.location)

    def __len__(self) -> int:
        return self._io._size(self.location)

    def read(self, start: int = 0, length: int | None = None) -> bytes:
        """Read ``length`` bytes from ``start`` (to the end when ``length`` is None).

        Fewer bytes than asked come back only at the end of the file; callers that need an exact
        count check it (the decoder reports truncation with file and offset).
        """
        if start < 0 or (length is not None and length < 0):
            raise StorageError(f"{self.location}: invalid range start={start} length={length}")
        return self._io._reader(self.location).read_range(start, length)

    def open(self) -> IO[bytes]:
        """A new seekable binary stream, closed by the caller (for streaming copies); reads
        through it are counted in :attr:`FileIO.stats`. Ranged reads use :meth:`read`, which
        reuses one open handle per file."""
        stream = CountingStream(self._io._open(self.location), self.location, self._io._count)
        return cast(IO[bytes], stream)  # duck-typed: the binary-stream methods readers use


class FileSystem(Protocol):
    """What :class:`FileIO` needs of one URI scheme's storage."""

    def open(self, location: str) -> IO[bytes]: ...

    def size(self, location: str) -> int: ...

    def exists(self, location: str) -> bool: ...

    def is_dir(self, location: str) -> bool: ...

    def list_dir(self, location: str) -> list[str]: ...

    def write_atomic(self, location: str, data: bytes) -> None: ...


#: ``factory(scheme, storage_options)``: the :class:`FileSystem` of one scheme
FileSystemFactory = Callable[[str, StorageOptions], FileSystem]


class _PickledFileIO(TypedDict, total=False):
    """What a :class:`FileIO` pickles to (no pool, caches or statistics)."""

    storage_options: StorageOptions
    allowed_roots: tuple[str, ...]
    confined_roots: tuple[str, ...]


class FileIO:
    """The storage seam: local files are read directly, every other scheme through fsspec
    (filesystems cached per thread; see :meth:`register_scheme` for another implementation).

    ``storage_options`` are passed to fsspec (credentials, endpoints; default:
    ``$STATEQUERY_STORAGE_OPTIONS``). ``allowed_roots`` (default: ``$STATEQUERY_ALLOWED_ROOTS``,
    comma-separated; unset: no restriction) limits where absolute state handles of a savepoint
    may point (docs/security.md). Remote calls are retried on transient failures. Open handles
    are pooled (at most ``max_open_files``, least recently used closed first) so a file is
    opened once for all the ranged reads of a task; :meth:`close` closes them. The instance
    pickles without its pool, caches and statistics.
    """

    #: open handles kept per instance
    max_open_files = 32

    def __init__(
        self,
        storage_options: StorageOptions | None = None,
        allowed_roots: list[str] | tuple[str, ...] | None = None,
    ) -> None:
        if storage_options is None:
            storage_options = _env_storage_options()
        self.storage_options = dict(storage_options)
        if allowed_roots is None:
            env = os.environ.get("STATEQUERY_ALLOWED_ROOTS", "")
            allowed_roots = [r.strip() for r in env.split(",") if r.strip()]
        self._confinement = Confinement(tuple(normalize_location(r) for r in allowed_roots))
        self.stats = ReadStats()
        self._lock = threading.Lock()
        self._local = threading.local()
        self._pool: OrderedDict[str, RangeReader] = OrderedDict()

    @property
    def allowed_roots(self) -> tuple[str, ...]:
        """Where absolute state handles may point (normalised; empty: anywhere)."""
        return self._confinement.allowed_roots

    @property
    def confined_roots(self) -> tuple[str, ...]:
        """The savepoint trees registered by :meth:`confine`."""
        return self._confinement.confined_roots

    def __getstate__(self) -> _PickledFileIO:
        return {"storage_options": self.storage_options, "allowed_roots": self.allowed_roots,
                "confined_roots": self.confined_roots}

    def __setstate__(self, state: _PickledFileIO) -> None:
        self.__init__(  # type: ignore[misc]
            state["storage_options"], list(state.get("allowed_roots", ()))
        )
        for root in state.get("confined_roots", ()):
            self.confine(root)

    def confine(self, root: str) -> None:
        """Register a savepoint's own tree: every file read whose location lies in ``root`` must
        also *resolve* into it (or into an allowed root), symbolic links followed: a state file
        replaced by a link to a file elsewhere is refused (:class:`StorageError`) before that
        file is opened. Allowed roots are confined the same way."""
        self._confinement.confine(root)

    def _check_links(self, fs: FileSystem, location: str) -> None:
        """Remote filesystems with symbolic links (HDFS, SFTP ...): a link in a confined root
        must point inside its bounds; object stores and HTTP have no links."""
        bounds = self._confinement.link_bounds(location)
        raw = getattr(fs, "fs", None)
        if bounds is None or raw is None:
            return
        self._request(location)
        info = self._call("stat", location, lambda: raw.info(location))
        self._confinement.check_link(location, info, bounds)

    def __enter__(self) -> FileIO:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  (interpreter shutdown)
            pass

    def new_input(self, location: str) -> InputFile:
        return InputFile(self, normalize_location(location))

    def close(self) -> None:
        """Close the pooled open handles (later reads open files again)."""
        with self._lock:
            readers = list(self._pool.values())
            self._pool.clear()
        for r in readers:
            r.close()

    # -- internals -----------------------------------------------------------------------------

    def _reader(self, location: str) -> RangeReader:
        with self._lock:
            reader = self._pool.get(location)
            if reader is not None:
                self._pool.move_to_end(location)
                return reader
        reader = RangeReader(location, self._open(location), self._count)
        evicted: list[RangeReader] = []
        with self._lock:
            existing = self._pool.get(location)
            if existing is not None:  # another thread opened it meanwhile
                evicted.append(reader)
                reader = existing
            else:
                self._pool[location] = reader
                while len(self._pool) > self.max_open_files:
                    evicted.append(self._pool.popitem(last=False)[1])
        for r in evicted:
            r.close()
        return reader

    def _count(self, location: str, n: int, requests: int = 0) -> None:
        with self._lock:
            self.stats.bytes_read[location] += n
            if requests:
                self.stats.requests[location] += requests

    def _request(self, location: str) -> None:
        with self._lock:
            self.stats.requests[location] += 1

    def _filesystem(self, location: str) -> FileSystem:
        """The implementation for ``location``'s scheme (one per scheme, per thread)."""
        scheme = "" if is_local_normalized(location) else urlsplit(location).scheme.lower()
        cache: dict[str, FileSystem] = getattr(self._local, "fs", None) or {}
        self._local.fs = cache
        fs = cache.get(scheme)
        if fs is None:
            factory = _SCHEMES.get(scheme, FsspecFileSystem)
            try:
                fs = cache[scheme] = construct(factory, scheme, self.storage_options)
            except ImportError as e:
                package, extra = FS_PACKAGES.get(scheme, (str(e.name or scheme), "all"))
                raise MissingExtraError(f"reading {scheme}:// locations", package, extra) from e
            except (ValueError, TypeError) as e:  # unknown protocol, bad storage options
                raise StorageError(f"cannot read {location}: {scheme}:// is not usable: {e}") from e
            except StatequeryError:
                raise
            except Exception as e:  # noqa: BLE001 - a client library that cannot start
                first = (str(e).strip().splitlines() or [""])[0]  # not a loader's search log
                raise StorageError(
                    f"cannot read {location}: {scheme}:// is not usable here: "
                    f"{type(e).__name__}: {first}{environment_hint(scheme, e)}") from e
        return fs

    @staticmethod
    def register_scheme(scheme: str, factory: FileSystemFactory) -> None:
        """Serve ``scheme://`` locations with ``factory(scheme, storage_options)`` instead of
        fsspec (for example a native object-store client)."""
        _SCHEMES[scheme.lower()] = factory

    def _call(self, what: str, location: str, call: Callable[[], T]) -> T:
        """``call()``; remote calls are retried (with backoff) on transient failures. Failures
        become :class:`StorageError` naming ``location``."""
        attempts = 1 if is_local_normalized(location) else max(1, RETRY_ATTEMPTS)
        delay = RETRY_BACKOFF
        for attempt in range(attempts):
            try:
                return call()
            except StatequeryError:
                raise
            except Exception as e:  # fsspec implementations raise their own types
                refused = refusal_in(e)
                if refused is not None:  # raised by the HTTP client, wrapped by fsspec
                    raise RedirectRefusedError(str(refused)) from e
                if attempt + 1 < attempts and _transient(e):
                    time.sleep(delay)
                    delay *= 2
                    continue
                if isinstance(e, FileNotFoundError) and not is_local_normalized(location):
                    raise StorageError(f"cannot {what} {location}: no such object") from e
                raise StorageError(f"cannot {what} {location}: {e}") from e
        raise AssertionError("unreachable")  # pragma: no cover

    def _exists(self, location: str) -> bool:
        self._request(location)
        fs = self._filesystem(location)
        return bool(self._call("stat", location, lambda: fs.exists(location)))

    def _size(self, location: str) -> int:
        self._request(location)
        fs = self._filesystem(location)
        if is_local_normalized(location):
            self._confinement.check_resolved(location)
        return int(self._call("stat", location, lambda: fs.size(location)))

    def _open(self, location: str) -> IO[bytes]:
        fs = self._filesystem(location)
        local = is_local_normalized(location)
        if local:
            self._confinement.check_resolved(location)
        else:
            self._check_links(fs, location)
        with self._lock:
            self.stats.opens[location] += 1
            self.stats.requests[location] += 1
        raw: IO[bytes] = self._call("open", location, lambda: fs.open(location))
        if local:
            try:
                self._confinement.check_descriptor(location, raw)
            except BaseException:
                raw.close()
                raise
        return raw

    def endpoint(self, location: str) -> str:
        """Which service a location lives on beyond its URI: the storage options' endpoint (an
        S3-compatible server, an Azure account) or ``""``. Two objects are the same only if
        their scheme, endpoint, bucket and path all agree (the cache keys on this)."""
        location = normalize_location(location)
        if is_local_normalized(location):
            return ""
        opts = self.storage_options
        client = opts.get("client_kwargs") or {}
        for value in (opts.get("endpoint_url"), client.get("endpoint_url"), opts.get("endpoint"),
                      opts.get("account_name"), opts.get("project")):
            if value:
                return str(value)
        if filesystem_of(location) == "s3":
            return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL", "")
        return ""

    def version(self, location: str) -> tuple[int, str]:
        """``(size, version token)`` of a file, fresh from the store (never from a listing
        cache): local files give their mtime (ns) and inode, object stores their ETag, version
        id or modification time. A file rewritten in place gets a new token."""
        location = normalize_location(location)
        self._request(location)
        if is_local_normalized(location):
            try:
                st = os.stat(location)
            except (OSError, ValueError) as e:
                raise StorageError(f"cannot stat {location}: {e}") from e
            if not stat.S_ISREG(st.st_mode):
                raise StorageError(f"{location} is not a regular file ({file_kind(st.st_mode)})")
            return st.st_size, f"mtime_ns={st.st_mtime_ns};ino={st.st_ino}"
        fs = self._filesystem(location)
        raw = getattr(fs, "fs", None)
        if raw is None:  # a registered implementation without fsspec's info(): size only
            return self._size(location), ""

        def fresh_info() -> Any:
            raw.invalidate_cache(location)
            return raw.info(location)

        info = self._call("stat", location, fresh_info)
        token = ""
        for name in ("VersionId", "ETag", "etag", "generation", "md5Hash", "LastModified",
                     "last_modified", "mtime", "updated", "modified"):
            if info.get(name):
                token = f"{name}={info[name]}"
                break
        return int(info.get("size") or 0), token

    def write_atomic(self, location: str, data: bytes) -> None:
        """Write ``data`` to ``location`` so readers never see a partial file (see
        :meth:`FileSystem.write_atomic`)."""
        location = normalize_location(location)
        fs = self._filesystem(location)
        try:
            fs.write_atomic(location, data)
        except StatequeryError:
            raise
        except Exception as e:  # fsspec implementations raise their own types
            raise StorageError(f"cannot write {location}: {type(e).__name__}: {e}") from e

    def list_dir(self, location: str) -> list[str]:
        """Names of the entries of a directory (used by the catalog to find savepoints)."""
        location = normalize_location(location)
        fs = self._filesystem(location)
        return sorted(self._call("list", location, lambda: fs.list_dir(location)))

    def is_dir(self, location: str) -> bool:
        location = normalize_location(location)
        fs = self._filesystem(location)
        return bool(self._call("stat", location, lambda: fs.is_dir(location)))


_SCHEMES: dict[str, FileSystemFactory] = {"": LocalFileSystem}
