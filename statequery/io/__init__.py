"""The storage seam: every byte statequery reads from a file goes through :class:`FileIO`.

Locations are local paths or URIs (``file:``, ``s3://``, ``hdfs://``, ``gs://``, ``abfs://`` ...,
anything fsspec knows). Flink writes local paths as ``file:/tmp/x`` (one slash); those are
normalised here. Nothing outside this package imports fsspec.

:class:`FileIO` is picklable (Spark ships readers to executors) and keeps per-instance read
statistics, so tests and benchmarks can assert exactly which bytes and requests a query cost.

A file is opened once and kept open for the ranged reads that follow (a small, bounded pool per
:class:`FileIO`): reading many key groups of one file costs one open, as a good remote client
would do it. Each ranged read is one request; :class:`ReadStats` counts both.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
import sys
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Protocol, cast
from urllib.parse import quote, unquote, urlsplit

from statequery.exceptions import (
    InvalidOptionError,
    MissingExtraError,
    RedirectRefusedError,
    StatequeryError,
    StorageError,
)

__all__ = [
    "FileIO",
    "FileSystem",
    "FsspecFileSystem",
    "InputFile",
    "LocalFileSystem",
    "ReadStats",
    "filesystem_of",
    "is_local",
    "is_under",
    "join_location",
    "location_parent",
    "normalize_location",
    "same_store",
    "store_of",
]

_LOCAL_SCHEMES = ("", "file", "local")
#: schemes whose paths are URL paths: percent-encoded, dot segments removed by servers and clients
_URL_SCHEMES = ("http", "https")
#: what stays unescaped in a canonical URL path (RFC 3986 pchar and "/"; the rest is %XX)
_URL_PATH_SAFE = "/!$&'()*+,;=:@~"
_READ_CHUNK = 8 << 20  # reads longer than this go in chunks, so a false length costs no memory

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


def _env_storage_options() -> dict[str, Any]:
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


def normalize_location(location: str) -> str:
    """Normalise a path or URI; local paths become absolute.

    Flink's ``file:/x`` and ``file:///x`` become the local path ``/x``.
    """
    if not location:
        raise StorageError("empty location")
    if "\x00" in location:  # no file system names one; os.* would raise a bare ValueError
        raise StorageError(f"location {location!r} holds a NUL character")
    parts = urlsplit(location)
    scheme = parts.scheme.lower()
    if len(scheme) == 1:  # a Windows drive letter, not a scheme
        return location
    if scheme in _LOCAL_SCHEMES:
        path = parts.path if scheme else location
        if scheme and parts.netloc and parts.netloc != "localhost":
            path = "//" + parts.netloc + path
        # relative paths are resolved against the working directory first: every later join
        # and parent lookup then works on an absolute path ("." and "_metadata" included)
        return os.path.abspath(path) if path else path
    if scheme in _URL_SCHEMES:
        # the query is only made sendable (its %XX kept: decoding "%26" would split a value)
        query = quote(parts.query, safe="/?:@!$&'()*+,;=%~")
        return parts._replace(path=_canonical_url_path(parts.path, location),
                              query=query).geturl()
    return location


def _decoded_url_path(path: str, what: str) -> str:
    """A URL path percent-decoded once (NUL refused: no server or file names one)."""
    decoded = unquote(path)
    if "\x00" in decoded:
        raise StorageError(f"{what!r} holds an encoded NUL character")
    return decoded


def _encoded_url_path(decoded: str) -> str:
    return quote(decoded, safe=_URL_PATH_SAFE)


def _canonical_url_path(path: str, location: str) -> str:
    """The one form of an http(s) path that is both checked and requested.

    The path is percent-decoded once, its dot segments removed (``%2e%2e`` is ``..``), then
    encoded again; the HTTP client sends it as is (no second decoding or normalisation), so
    confinement and the request see the same path. Idempotent.
    """
    if not path:
        return path
    decoded = _decoded_url_path(path, location)
    normal = "/" + posixpath.normpath(decoded).lstrip("/")
    if decoded.endswith("/") and not normal.endswith("/"):
        normal += "/"
    return _encoded_url_path(normal)


def is_local(location: str) -> bool:
    """Whether ``location`` is a local path (or a ``file:`` URI)."""
    return _is_local(normalize_location(location))


def _is_local(location: str) -> bool:
    scheme = urlsplit(location).scheme.lower()
    return scheme in _LOCAL_SCHEMES or len(scheme) == 1


def filesystem_of(location: str) -> str:
    """The filesystem a location lives on, as its scheme: ``file`` for local paths, ``s3`` for
    ``s3://``/``s3a://``/``s3n://`` ... (what must match for a handle to be trusted)."""
    location = normalize_location(location)
    if _is_local(location):
        return "file"
    scheme = urlsplit(location).scheme.lower()
    return {"s3a": "s3", "s3n": "s3", "gcs": "gs", "abfss": "abfs"}.get(scheme, scheme)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def store_of(location: str) -> tuple[str, str, int | None]:
    """The store a location lives in: ``(filesystem, host or bucket, port)``.

    ``("file", "", None)`` for local paths, ``("s3", "bucket", None)`` for ``s3://bucket/k``,
    ``("http", "127.0.0.1", 8080)`` for ``http://127.0.0.1:8080/x`` (default ports filled in). Two
    locations are on the same store only if all three agree: what a state handle must share with
    its savepoint (the endpoint itself comes from the FileIO's storage options, the same for both).
    """
    location = normalize_location(location)
    fs = filesystem_of(location)
    if fs == "file":
        return fs, "", None
    parts = urlsplit(location)
    try:
        port = parts.port
    except ValueError as e:
        raise StorageError(f"invalid location {location!r}: {e}") from None
    host = (parts.hostname or "").lower()
    if not host and parts.path.strip("/"):  # memory:///bucket/x is memory://bucket/x
        host = parts.path.strip("/").split("/", 1)[0]
    return fs, host, port if port is not None else _DEFAULT_PORTS.get(fs)


def same_store(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` are on the same store (:func:`store_of`)."""
    return store_of(a) == store_of(b)


def is_under(location: str, root: str) -> bool:
    """Whether ``location`` is ``root`` or inside it (same filesystem, bucket and path prefix)."""
    location, root = normalize_location(location), normalize_location(root)
    if filesystem_of(location) != filesystem_of(root):
        return False
    if _is_local(location):
        loc = os.path.normpath(os.path.abspath(location))
        base = os.path.normpath(os.path.abspath(root))
        return loc == base or loc.startswith(base.rstrip(os.sep) + os.sep)
    if store_of(location) != store_of(root):
        return False
    path, base = _store_path(location), _store_path(root)
    return path == base or path.startswith(base.rstrip("/") + "/")


def _store_path(location: str) -> str:
    """The path of a remote location inside its store (bucket or host excluded)."""
    parts = urlsplit(location)
    path = parts.path or "/"
    if not parts.hostname and path.strip("/"):  # memory:///bucket/x: the bucket is in the path
        path = "/" + path.strip("/").split("/", 1)[1] if "/" in path.strip("/") else "/"
    return posixpath.normpath(path)


def location_parent(location: str) -> str:
    """The directory that holds ``location``."""
    location = normalize_location(location)
    if _is_local(location):
        return os.path.dirname(location.rstrip("/")) or "/"
    parts = urlsplit(location)
    return parts._replace(path=posixpath.dirname(parts.path.rstrip("/"))).geturl()


def join_location(base: str, relative: str) -> str:
    """Resolve ``relative`` against the directory ``base``.

    Raises :class:`StorageError` when the result would escape ``base`` (a relative state handle
    must stay inside its savepoint directory).
    """
    if not relative or relative.startswith("/") or "\x00" in relative or urlsplit(relative).scheme:
        raise StorageError(f"not a relative path: {relative!r}")
    base = normalize_location(base)
    if _is_local(base):
        joined = os.path.normpath(os.path.join(base, relative))
        root = os.path.normpath(base)
        if joined != root and not joined.startswith(root.rstrip(os.sep) + os.sep):
            raise StorageError(f"relative path {relative!r} escapes {base}")
        return joined
    parts = urlsplit(base)
    root = parts.path.rstrip("/")
    if parts.scheme.lower() in _URL_SCHEMES:
        # a URL path: decoded once, here, before the check (``%2e%2e`` is ``..``); the joined
        # path is requested exactly as checked (normalize_location keeps it as it is)
        root = _decoded_url_path(root, base)
        decoded = _decoded_url_path(relative, relative)
        joined_path = posixpath.normpath(posixpath.join(root or "/", decoded))
        if not joined_path.startswith(root + "/"):
            raise StorageError(f"relative path {relative!r} escapes {base} (percent-decoded: "
                               f"{decoded!r})")
        return parts._replace(path=_encoded_url_path(joined_path)).geturl()
    joined_path = posixpath.normpath(posixpath.join(root or "/", relative))
    if not joined_path.startswith(root + "/"):
        raise StorageError(f"relative path {relative!r} escapes {base}")
    return parts._replace(path=joined_path).geturl()


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
        stream = _CountingStream(self._io._open(self.location), self._io, self.location)
        return cast(IO[bytes], stream)  # duck-typed: the binary-stream methods readers use


class _CountingStream:
    """Wraps a binary stream to count the bytes read (the seam's measurement point)."""

    def __init__(self, raw: IO[bytes], io: FileIO, location: str) -> None:
        self._raw = raw
        self._io = io
        self._location = location

    def read(self, n: int = -1) -> bytes:
        data = self._raw.read(n)
        self._io._count(self._location, len(data), requests=1)
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def seek(self, pos: int, whence: int = 0) -> int:
        return self._raw.seek(pos, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        """The descriptor of a local file (``OSError`` for remote streams)."""
        try:
            return int(self._raw.fileno())
        except (AttributeError, ValueError) as e:
            raise OSError(f"{self._location} has no file descriptor") from e

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> _CountingStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _RangeReader:
    """One open handle of one file, shared by the ranged reads that follow (seek + read under a
    lock, so threads may share it)."""

    __slots__ = ("_io", "_lock", "_raw", "location")

    def __init__(self, io: FileIO, location: str) -> None:
        self._io = io
        self.location = location
        self._raw = io._open(location)
        self._lock = threading.Lock()

    def read_range(self, start: int, length: int | None) -> bytes:
        with self._lock:
            try:
                self._raw.seek(start)
                if length is None or length <= _READ_CHUNK:
                    data = self._raw.read() if length is None else self._raw.read(length)
                else:  # a length from a handle is a claim: allocate only what the file has
                    parts, left = [], length
                    while left > 0:
                        part = self._raw.read(min(left, _READ_CHUNK))
                        if not part:
                            break
                        parts.append(part)
                        left -= len(part)
                    data = b"".join(parts)
            except StatequeryError:
                raise
            except Exception as e:  # fsspec implementations raise their own types
                refused = _refusal_in(e)
                if refused is not None:
                    raise RedirectRefusedError(str(refused)) from e
                raise StorageError(f"cannot read {self.location} at byte {start}: "
                                   f"{type(e).__name__}: {e}") from e
        self._io._count(self.location, len(data), requests=1)
        return bytes(data)

    def close(self) -> None:
        with self._lock:
            try:
                self._raw.close()
            except OSError:
                pass


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
        storage_options: dict[str, Any] | None = None,
        allowed_roots: list[str] | tuple[str, ...] | None = None,
    ) -> None:
        if storage_options is None:
            storage_options = _env_storage_options()
        self.storage_options = dict(storage_options)
        if allowed_roots is None:
            env = os.environ.get("STATEQUERY_ALLOWED_ROOTS", "")
            allowed_roots = [r.strip() for r in env.split(",") if r.strip()]
        self.allowed_roots = tuple(normalize_location(r) for r in allowed_roots)
        #: savepoint trees registered by :meth:`confine`: what lies in one must resolve into it
        self.confined_roots: tuple[str, ...] = ()
        self._real_roots: dict[str, str] = {}
        self.stats = ReadStats()
        self._lock = threading.Lock()
        self._local = threading.local()
        self._pool: OrderedDict[str, _RangeReader] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        return {"storage_options": self.storage_options, "allowed_roots": self.allowed_roots,
                "confined_roots": self.confined_roots}

    def __setstate__(self, state: dict[str, Any]) -> None:
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
        root = normalize_location(root)
        with self._lock:
            if root not in self.confined_roots:
                self.confined_roots = (*self.confined_roots, root)

    def _bounds(self, location: str) -> tuple[str, ...] | None:
        """Where ``location`` may resolve to: None when it lies in no confined or allowed root
        (an absolute path the user named), else the roots it may resolve into."""
        inside = [r for r in (*self.confined_roots, *self.allowed_roots) if is_under(location, r)]
        if not inside:
            return None
        return tuple(dict.fromkeys((*inside, *self.allowed_roots)))

    def _real_root(self, root: str) -> str:
        real = self._real_roots.get(root)
        if real is None:
            real = self._real_roots[root] = os.path.realpath(root)
        return real

    def _inside_real(self, real: str, bounds: tuple[str, ...]) -> bool:
        for root in bounds:
            if not _is_local(root):
                continue
            base = self._real_root(root)
            if real == base or real.startswith(base.rstrip(os.sep) + os.sep):
                return True
        return False

    def _escape(self, location: str, target: str, bounds: tuple[str, ...]) -> StorageError:
        return StorageError(
            f"{location} resolves to {target}, outside {' or '.join(bounds)} (a symbolic link "
            "out of the savepoint or allowed root); statequery refuses to read it"
        )

    def _check_resolved(self, location: str) -> None:
        """Before a local file is opened or stat'ed: its resolved path stays in its bounds."""
        bounds = self._bounds(location)
        if bounds is None:
            return
        try:
            real = os.path.realpath(location)
            inside = self._inside_real(real, bounds)
        except (OSError, ValueError) as e:  # a link swapped for a file while it was resolved
            raise StorageError(f"cannot check where {location} resolves to (did a symbolic "
                               f"link change while it was read?): {e}") from e
        if not inside:
            raise self._escape(location, real, bounds)

    def _check_descriptor(self, location: str, raw: IO[bytes]) -> None:
        """After a local file is opened: the file actually opened is inside the bounds (a link
        swapped in between the check and the open is caught here)."""
        bounds = self._bounds(location)
        if bounds is None:
            return
        try:
            fd = raw.fileno()
            proc = f"/proc/self/fd/{fd}"
            if os.path.islink(proc):
                real = os.readlink(proc)
            else:  # no /proc: the resolved name must still be the file that was opened
                real = os.path.realpath(location)
                st, fst = os.stat(real), os.fstat(fd)
                if (st.st_dev, st.st_ino) != (fst.st_dev, fst.st_ino):
                    real = "<a file swapped in while it was opened>"
        except (OSError, ValueError) as e:
            raise StorageError(f"cannot check where {location} resolves to: {e}") from e
        if not self._inside_real(real, bounds):
            raise self._escape(location, real, bounds)

    def _check_links(self, fs: FileSystem, location: str) -> None:
        """Remote filesystems with symbolic links (HDFS, SFTP ...): a link in a confined root
        must point inside its bounds; object stores and HTTP have no links."""
        if urlsplit(location).scheme.lower() in _LINKLESS:
            return
        bounds = self._bounds(location)
        raw = getattr(fs, "fs", None)
        if bounds is None or raw is None:
            return
        self._request(location)
        info = self._call("stat", location, lambda: raw.info(location))
        if not (info.get("islink") or info.get("type") in ("link", "symlink")):
            return
        dest = info.get("destination") or info.get("symlink_target") or info.get("target")
        if not dest:
            raise self._escape(location, "an unknown link target", bounds)
        dest = str(dest)
        if not urlsplit(dest).scheme:  # a path on the same filesystem, maybe relative
            parts = urlsplit(location)
            base = posixpath.dirname(parts.path)
            dest = parts._replace(path=posixpath.normpath(posixpath.join(base, dest))).geturl()
        if not any(is_under(dest, r) for r in bounds):
            raise self._escape(location, dest, bounds)

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

    def _reader(self, location: str) -> _RangeReader:
        with self._lock:
            reader = self._pool.get(location)
            if reader is not None:
                self._pool.move_to_end(location)
                return reader
        reader = _RangeReader(self, location)
        evicted: list[_RangeReader] = []
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
        scheme = "" if _is_local(location) else urlsplit(location).scheme.lower()
        cache: dict[str, FileSystem] = getattr(self._local, "fs", None) or {}
        self._local.fs = cache
        fs = cache.get(scheme)
        if fs is None:
            factory = _SCHEMES.get(scheme, FsspecFileSystem)
            try:
                fs = cache[scheme] = _construct(factory, scheme, self.storage_options)
            except ImportError as e:
                package, extra = _FS_PACKAGES.get(scheme, (str(e.name or scheme), "all"))
                raise MissingExtraError(f"reading {scheme}:// locations", package, extra) from e
            except (ValueError, TypeError) as e:  # unknown protocol, bad storage options
                raise StorageError(f"cannot read {location}: {scheme}:// is not usable: {e}") from e
            except StatequeryError:
                raise
            except Exception as e:  # noqa: BLE001 - a client library that cannot start
                first = (str(e).strip().splitlines() or [""])[0]  # not a loader's search log
                raise StorageError(
                    f"cannot read {location}: {scheme}:// is not usable here: "
                    f"{type(e).__name__}: {first}{_environment_hint(scheme, e)}") from e
        return fs

    @staticmethod
    def register_scheme(scheme: str, factory: Callable[[str, dict[str, Any]], FileSystem]) -> None:
        """Serve ``scheme://`` locations with ``factory(scheme, storage_options)`` instead of
        fsspec (for example a native object-store client)."""
        _SCHEMES[scheme.lower()] = factory

    def _call(self, what: str, location: str, call: Callable[[], Any]) -> Any:
        """``call()``; remote calls are retried (with backoff) on transient failures. Failures
        become :class:`StorageError` naming ``location``."""
        attempts = 1 if _is_local(location) else max(1, RETRY_ATTEMPTS)
        delay = RETRY_BACKOFF
        for attempt in range(attempts):
            try:
                return call()
            except StatequeryError:
                raise
            except Exception as e:  # fsspec implementations raise their own types
                refused = _refusal_in(e)
                if refused is not None:  # raised by the HTTP client, wrapped by fsspec
                    raise RedirectRefusedError(str(refused)) from e
                if attempt + 1 < attempts and _transient(e):
                    time.sleep(delay)
                    delay *= 2
                    continue
                if isinstance(e, FileNotFoundError) and not _is_local(location):
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
        if _is_local(location):
            self._check_resolved(location)
        return int(self._call("stat", location, lambda: fs.size(location)))

    def _open(self, location: str) -> IO[bytes]:
        fs = self._filesystem(location)
        local = _is_local(location)
        if local:
            self._check_resolved(location)
        else:
            self._check_links(fs, location)
        with self._lock:
            self.stats.opens[location] += 1
            self.stats.requests[location] += 1
        raw: IO[bytes] = self._call("open", location, lambda: fs.open(location))
        if local:
            try:
                self._check_descriptor(location, raw)
            except BaseException:
                raw.close()
                raise
        return raw

    def endpoint(self, location: str) -> str:
        """Which service a location lives on beyond its URI: the storage options' endpoint (an
        S3-compatible server, an Azure account) or ``""``. Two objects are the same only if
        their scheme, endpoint, bucket and path all agree (the cache keys on this)."""
        location = normalize_location(location)
        if _is_local(location):
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
        if _is_local(location):
            try:
                st = os.stat(location)
            except (OSError, ValueError) as e:
                raise StorageError(f"cannot stat {location}: {e}") from e
            if not stat.S_ISREG(st.st_mode):
                raise StorageError(f"{location} is not a regular file ({_kind(st.st_mode)})")
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


class FileSystem(Protocol):
    """What :class:`FileIO` needs of one URI scheme's storage."""

    def open(self, location: str) -> IO[bytes]: ...

    def size(self, location: str) -> int: ...

    def exists(self, location: str) -> bool: ...

    def is_dir(self, location: str) -> bool: ...

    def list_dir(self, location: str) -> list[str]: ...

    def write_atomic(self, location: str, data: bytes) -> None: ...


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def _open_regular(location: str) -> IO[bytes]:
    """Open a local file for reading, refusing anything but a regular file before reading.

    The open itself never blocks (``O_NONBLOCK``: a FIFO without a writer would hang a plain
    ``open``); the descriptor is checked with ``fstat``, so a name swapped after a check cannot
    slip a FIFO or a device in.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(location, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StorageError(f"{location} is not a regular file ({_kind(st.st_mode)})")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class LocalFileSystem:
    """Local paths (``file:`` URIs are normalised to paths first)."""

    def __init__(self, scheme: str = "", storage_options: dict[str, Any] | None = None) -> None:
        pass

    def open(self, location: str) -> IO[bytes]:
        return _open_regular(location)

    def size(self, location: str) -> int:
        st = os.stat(location)
        if not stat.S_ISREG(st.st_mode):
            raise StorageError(f"{location} is not a regular file ({_kind(st.st_mode)})")
        return st.st_size

    def exists(self, location: str) -> bool:
        return os.path.isfile(location)

    def is_dir(self, location: str) -> bool:
        return os.path.isdir(location)

    def list_dir(self, location: str) -> list[str]:
        return os.listdir(location)

    def write_atomic(self, location: str, data: bytes) -> None:
        """A temporary file in the same directory, fsynced, then renamed over the target."""
        import tempfile

        directory = os.path.dirname(os.path.abspath(location))
        fd, tmp = tempfile.mkstemp(prefix=".statequery-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, location)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


#: fsspec implementations that are separate packages: (package, statequery extra)
_FS_PACKAGES = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "abfs": ("adlfs", "azure"),
    "abfss": ("adlfs", "azure"),
    "az": ("adlfs", "azure"),
}

_OBJECT_STORES = ("s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "oss")
#: schemes without symbolic links (nothing to resolve before a read)
_LINKLESS = (*_OBJECT_STORES, "s3n", "http", "https", "memory")


def _environment_hint(scheme: str, e: BaseException) -> str:
    """What a client library that failed to start is missing, when it can be told."""
    text = str(e)
    if scheme in ("hdfs", "viewfs") or "libjvm" in text or "libhdfs" in text:
        import shutil

        java = shutil.which("java")
        home = os.path.dirname(os.path.dirname(os.path.realpath(java))) if java else None
        jvm = ("a Java runtime was not found (install a JDK)" if not home
               else f"set JAVA_HOME to the Java runtime (e.g. JAVA_HOME={home})")
        return (f" (hdfs:// is read through pyarrow's libhdfs, which needs a JVM and Hadoop: "
                f"{jvm}, and HADOOP_HOME or ARROW_LIBHDFS_DIR to Hadoop's native libhdfs; "
                "CLASSPATH must hold Hadoop's jars)")
    return ""


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence native libraries that print to file descriptor 2 while they start (pyarrow's
    libhdfs loader prints a line per place it looked for libjvm): the error they raise says it."""
    try:
        saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:  # no descriptor 2: nothing to silence
        yield
        return
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _refusal_in(e: BaseException) -> RedirectRefusedError | None:
    """A redirect refusal raised inside a client library and wrapped by it (fsspec turns every
    failed HTTP ``info`` into ``FileNotFoundError``), or None."""
    chain: BaseException | None = e
    seen: set[int] = set()
    while chain is not None and id(chain) not in seen:
        if isinstance(chain, RedirectRefusedError):
            return chain
        seen.add(id(chain))
        chain = chain.__cause__ or chain.__context__
    return None


def _redirect_error(url: str, status: int, target: str | None) -> RedirectRefusedError:
    """The refusal of one redirect: names the file and where the server pointed (a header, shown
    shortened and escaped; nothing of a response body)."""
    where = "no Location" if not target else repr(target[:300] + ("..." if len(target) > 300
                                                                   else ""))
    return RedirectRefusedError(
        f"{url}: the server answered {status} (a redirect to {where}); statequery follows no "
        "redirect for a savepoint's files (its target could lie outside the savepoint: another "
        "host, port or path) and refuses to read it; give the location the files are served at"
    )


async def _refuse_redirect(response: Any) -> None:
    """aiohttp's ``raise_for_status`` hook: every 3xx answer (redirects are not followed, see
    :class:`FsspecFileSystem`) is refused before its body is read."""
    if 300 <= int(response.status) < 400:
        raise _redirect_error(str(response.url), int(response.status),
                              response.headers.get("Location"))


async def _on_redirect(session: Any, context: Any, params: Any) -> None:
    """aiohttp's redirect trace: a request that asked to follow redirects anyway is stopped
    before the next request is sent."""
    response = params.response
    raise _redirect_error(str(params.url), int(response.status), response.headers.get("Location"))


async def _http_client(**kwargs: Any) -> Any:
    """fsspec's ``get_client`` for http(s): an aiohttp session that refuses every redirect."""
    import aiohttp

    trace = aiohttp.TraceConfig()
    trace.on_request_redirect.append(_on_redirect)
    kwargs["raise_for_status"] = _refuse_redirect
    kwargs["trace_configs"] = [*kwargs.get("trace_configs", ()), trace]
    return aiohttp.ClientSession(**kwargs)


_hook_lock = threading.Lock()
_hook_users = 0
_saved_hook: Callable[[Any], object] | None = None


def _quiet_fsspec_finalizer(unraisable: Any) -> None:
    """``sys.unraisablehook`` while a filesystem is built: a half-built fsspec instance whose
    ``__del__`` fails (FTP's, when the constructor raised before connecting) says nothing; the
    constructor's own error is reported. Anything else goes to the saved hook."""
    obj = unraisable.object
    if getattr(obj, "__name__", "") == "__del__" and \
            str(getattr(obj, "__module__", "")).startswith("fsspec"):
        return
    (_saved_hook or sys.__unraisablehook__)(unraisable)


@contextlib.contextmanager
def _quiet_half_built() -> Iterator[None]:
    global _hook_users, _saved_hook
    with _hook_lock:
        if _hook_users == 0:
            _saved_hook = sys.unraisablehook
            sys.unraisablehook = _quiet_fsspec_finalizer
        _hook_users += 1
    try:
        yield
    finally:
        with _hook_lock:
            _hook_users -= 1
            if _hook_users == 0:
                sys.unraisablehook = _saved_hook or sys.__unraisablehook__
                _saved_hook = None


def _construct(factory: Callable[[str, dict[str, Any]], FileSystem], scheme: str,
               options: dict[str, Any]) -> FileSystem:
    """``factory(scheme, options)``; when it fails, the half-built instance its frames hold is
    released at once (its finalizer silenced), not at exit where it would print a traceback."""
    import gc
    import traceback

    with _quiet_half_built():
        try:
            return factory(scheme, options)
        except BaseException as e:
            traceback.clear_frames(e.__traceback__)
            gc.collect()
            raise


class FsspecFileSystem:
    """Any scheme fsspec knows (``s3``, ``hdfs``, ``gs``, ``abfs``, ``memory`` ...)."""

    def __init__(self, scheme: str, storage_options: dict[str, Any]) -> None:
        import fsspec  # the only fsspec import in statequery

        self.scheme = scheme
        if scheme in ("hdfs", "viewfs", "arrow_hdfs"):
            with _quiet_stderr():
                self.fs = fsspec.filesystem(scheme, **storage_options)
        elif scheme in _URL_SCHEMES:
            # no redirect is followed (3xx is RedirectRefusedError, see _refuse_redirect), and
            # URLs are sent as given: normalize_location made them canonical, the client must
            # not decode or normalise them again (what was confined is what is requested)
            options = {**storage_options, "allow_redirects": False, "encoded": True,
                       "get_client": _http_client}
            self.fs = fsspec.filesystem(scheme, **options)
        else:
            self.fs = fsspec.filesystem(scheme, **storage_options)

    def open(self, location: str) -> IO[bytes]:
        # no read-ahead cache: statequery plans its ranged reads (adjacent key groups coalesced),
        # so each read is one request of exactly the bytes asked for (a lookup in a large file
        # must not fetch a 50 MB block)
        try:
            return self.fs.open(location, "rb", cache_type="none")  # type: ignore[no-any-return]
        except TypeError:  # an implementation without fsspec's buffered-file options
            return self.fs.open(location, "rb")  # type: ignore[no-any-return]

    def size(self, location: str) -> int:
        return int(self.fs.size(location))

    def exists(self, location: str) -> bool:
        if self.scheme in _URL_SCHEMES:  # fsspec's isfile would answer False for a redirect
            try:
                self.fs.info(location)
            except FileNotFoundError as e:
                refused = _refusal_in(e)
                if refused is not None:
                    raise RedirectRefusedError(str(refused)) from e
                return False
            return True
        return bool(self.fs.isfile(location))

    def is_dir(self, location: str) -> bool:
        return bool(self.fs.isdir(location))

    def list_dir(self, location: str) -> list[str]:
        return [posixpath.basename(p.rstrip("/")) for p in self.fs.ls(location, detail=False)]

    def write_atomic(self, location: str, data: bytes) -> None:
        """Object stores (one PUT is atomic): written directly; other filesystems: a temporary
        name, then a move."""
        if self.scheme in _OBJECT_STORES:
            with self.fs.open(location, "wb") as f:
                f.write(data)
            return
        tmp = location + ".statequery-tmp"
        with self.fs.open(tmp, "wb") as f:
            f.write(data)
        self.fs.mv(tmp, location)


_SCHEMES: dict[str, Callable[[str, dict[str, Any]], FileSystem]] = {"": LocalFileSystem}
