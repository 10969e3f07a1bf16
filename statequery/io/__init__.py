"""The storage seam: every byte statequery reads from a file goes through :class:`FileIO`.

Locations are local paths or URIs (``file:``, ``s3://``, ``hdfs://``, ``gs://``, ``abfs://`` ...,
anything fsspec knows). Flink writes local paths as ``file:/tmp/x`` (one slash); those are
normalised here. Nothing outside this package imports fsspec.

:class:`FileIO` is picklable (Spark ships readers to executors) and keeps per-instance read
statistics, so tests and benchmarks can assert exactly which bytes a query touched.
"""

from __future__ import annotations

import os
import posixpath
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import IO, Any, cast
from urllib.parse import urlsplit

from statequery.exceptions import MissingExtraError, StorageError

__all__ = [
    "FileIO",
    "InputFile",
    "ReadStats",
    "join_location",
    "location_parent",
    "normalize_location",
]

_LOCAL_SCHEMES = ("", "file", "local")

#: fsspec implementations of the object stores, by scheme: (package, statequery extra)
_FS_PACKAGES = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "abfs": ("adlfs", "azure"),
    "abfss": ("adlfs", "azure"),
    "az": ("adlfs", "azure"),
}


def normalize_location(location: str) -> str:
    """Normalise a path or URI; local paths become absolute.

    Flink's ``file:/x`` and ``file:///x`` become the local path ``/x``.
    """
    if not location:
        raise StorageError("empty location")
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
    return location


def _is_local(location: str) -> bool:
    scheme = urlsplit(location).scheme.lower()
    return scheme in _LOCAL_SCHEMES or len(scheme) == 1


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
    if not relative or relative.startswith("/") or urlsplit(relative).scheme:
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
    joined_path = posixpath.normpath(posixpath.join(root or "/", relative))
    if not joined_path.startswith(root + "/"):
        raise StorageError(f"relative path {relative!r} escapes {base}")
    return parts._replace(path=joined_path).geturl()


@dataclass
class ReadStats:
    """What a :class:`FileIO` read: bytes and open calls per location."""

    bytes_read: Counter[str] = field(default_factory=Counter)
    opens: Counter[str] = field(default_factory=Counter)

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_read.values())

    def reset(self) -> None:
        self.bytes_read.clear()
        self.opens.clear()


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
        with self.open() as f:
            try:
                if start:
                    f.seek(start)
                data = f.read() if length is None else f.read(length)
            except OSError as e:
                raise StorageError(f"cannot read {self.location} at byte {start}: {e}") from e
        return bytes(data)

    def open(self) -> IO[bytes]:
        """A seekable binary stream; reads through it are counted in :attr:`FileIO.stats`."""
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
        self._io._count(self._location, len(data))
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

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> _CountingStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FileIO:
    """Reads local files directly, everything else through fsspec (filesystems cached per thread).

    ``storage_options`` are passed to fsspec (credentials, endpoints). The instance pickles without
    its caches and statistics.
    """

    def __init__(self, storage_options: dict[str, Any] | None = None) -> None:
        self.storage_options = dict(storage_options or {})
        self.stats = ReadStats()
        self._lock = threading.Lock()
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        return {"storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["storage_options"])  # type: ignore[misc]

    def new_input(self, location: str) -> InputFile:
        return InputFile(self, normalize_location(location))

    # -- internals -----------------------------------------------------------------------------

    def _count(self, location: str, n: int) -> None:
        with self._lock:
            self.stats.bytes_read[location] += n

    def _fs(self, location: str) -> Any:
        import fsspec  # the only fsspec import in statequery

        scheme = urlsplit(location).scheme.lower()
        cache: dict[str, Any] = getattr(self._local, "fs", None) or {}
        self._local.fs = cache
        if scheme not in cache:
            try:
                cache[scheme] = fsspec.filesystem(scheme, **self.storage_options)
            except ImportError as e:
                package, extra = _FS_PACKAGES.get(scheme, (str(e.name or scheme), "all"))
                raise MissingExtraError(f"reading {scheme}:// locations", package, extra) from e
            except (ValueError, TypeError) as e:  # unknown protocol, bad storage options
                raise StorageError(f"cannot read {location}: {scheme}:// is not usable: {e}") from e
        return cache[scheme]

    def _exists(self, location: str) -> bool:
        try:
            if _is_local(location):
                return os.path.isfile(location)
            return bool(self._fs(location).isfile(location))
        except (OSError, ValueError) as e:
            raise StorageError(f"cannot stat {location}: {e}") from e

    def _size(self, location: str) -> int:
        try:
            if _is_local(location):
                return os.path.getsize(location)
            return int(self._fs(location).size(location))
        except (OSError, ValueError) as e:  # ValueError: e.g. a NUL byte in the name
            raise StorageError(f"cannot stat {location}: {e}") from e

    def _open(self, location: str) -> IO[bytes]:
        with self._lock:
            self.stats.opens[location] += 1
        try:
            if _is_local(location):
                return open(location, "rb")
            return self._fs(location).open(location, "rb")  # type: ignore[no-any-return]
        except (OSError, ValueError) as e:
            raise StorageError(f"cannot open {location}: {e}") from e

    def write_atomic(self, location: str, data: bytes) -> None:
        """Write ``data`` to ``location`` so readers never see a partial file.

        Local files: a temporary file in the same directory, fsynced, then renamed over the
        target. Object stores (one PUT is atomic): written directly. Other filesystems: a
        temporary name, then a move.
        """
        location = normalize_location(location)
        try:
            if _is_local(location):
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
                return
            fs = self._fs(location)
            scheme = urlsplit(location).scheme.lower()
            if scheme in ("s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "oss"):
                with fs.open(location, "wb") as f:
                    f.write(data)
                return
            tmp = location + ".statequery-tmp"
            with fs.open(tmp, "wb") as f:
                f.write(data)
            fs.mv(tmp, location)
        except (OSError, FileNotFoundError) as e:
            raise StorageError(f"cannot write {location}: {e}") from e

    def list_dir(self, location: str) -> list[str]:
        """Names of the entries of a directory (used by the catalog to find savepoints)."""
        location = normalize_location(location)
        try:
            if _is_local(location):
                return sorted(os.listdir(location))
            fs = self._fs(location)
            return sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(location, detail=False))
        except (OSError, ValueError) as e:
            raise StorageError(f"cannot list {location}: {e}") from e

    def is_dir(self, location: str) -> bool:
        location = normalize_location(location)
        try:
            if _is_local(location):
                return os.path.isdir(location)
            return bool(self._fs(location).isdir(location))
        except (OSError, ValueError) as e:
            raise StorageError(f"cannot stat {location}: {e}") from e
