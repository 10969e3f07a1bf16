"""Range reading: one open handle per file serves the ranged reads that follow.

:class:`RangeReader` reads a local regular file with ``pread`` straight into the bytes it
returns (one copy out of the page cache; the length clamped to the file's size first, so a
false length in a handle costs no memory), and any other file by seek and read under a lock
(threads share it), a read longer than ``READ_CHUNK`` in chunks. Every read is
counted (bytes and one request) through the :data:`Counting` callback of its
:class:`~statequery.io.FileIO`; :class:`CountingStream` counts the reads of a whole stream.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from typing import IO

from statequery.exceptions import RedirectRefusedError, StatequeryError, StorageError
from statequery.io.confine import refusal_in

__all__ = ["READ_CHUNK", "Counting", "CountingStream", "RangeReader"]

READ_CHUNK = 8 << 20  # reads longer than this go in chunks, so a false length costs no memory

#: ``count(location, bytes, requests)``: where a read is counted (``FileIO._count``)
Counting = Callable[[str, int, int], None]


class CountingStream:
    """Wraps a binary stream to count the bytes read (the seam's measurement point)."""

    def __init__(self, raw: IO[bytes], location: str, count: Counting) -> None:
        self._raw = raw
        self._location = location
        self._count = count

    def read(self, n: int = -1) -> bytes:
        data = self._raw.read(n)
        self._count(self._location, len(data), 1)
        return data

    def readinto(self, b: bytearray | memoryview) -> int:
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

    def __enter__(self) -> CountingStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RangeReader:
    """One open handle of one file, shared by the ranged reads that follow (seek + read under a
    lock, so threads may share it)."""

    __slots__ = ("_count", "_fd", "_lock", "_raw", "location")

    def __init__(self, location: str, raw: IO[bytes], count: Counting) -> None:
        self.location = location
        self._raw = raw
        self._count = count
        self._lock = threading.Lock()
        self._fd = _regular_fd(raw)

    def read_range(self, start: int, length: int | None) -> bytes:
        if self._fd is not None and length is not None and start >= 0:
            data = self._pread(start, length)
            self._count(self.location, len(data), 1)
            return data
        with self._lock:
            try:
                self._raw.seek(start)
                if length is None or length <= READ_CHUNK:
                    data = self._raw.read() if length is None else self._raw.read(length)
                else:  # a length from a handle is a claim: allocate only what the file has
                    parts, left = [], length
                    while left > 0:
                        part = self._raw.read(min(left, READ_CHUNK))
                        if not part:
                            break
                        parts.append(part)
                        left -= len(part)
                    data = b"".join(parts)
            except StatequeryError:
                raise
            except Exception as e:  # fsspec implementations raise their own types
                refused = refusal_in(e)
                if refused is not None:
                    raise RedirectRefusedError(str(refused)) from e
                raise StorageError(f"cannot read {self.location} at byte {start}: "
                                   f"{type(e).__name__}: {e}") from e
        self._count(self.location, len(data), 1)
        return bytes(data)

    def _pread(self, start: int, length: int) -> bytes:
        """``length`` bytes at ``start`` (fewer at the end of the file) with ``pread``: no file
        position, so no lock; each call allocates only what the file still has."""
        assert self._fd is not None
        try:
            size = os.fstat(self._fd).st_size
            want = max(0, min(length, size - start))
            data = os.pread(self._fd, want, start)
            while len(data) < want:  # a short read before the end (over 2 GB at once)
                more = os.pread(self._fd, want - len(data), start + len(data))
                if not more:
                    break
                data += more
        except OSError as e:
            raise StorageError(f"cannot read {self.location} at byte {start}: "
                               f"{type(e).__name__}: {e}") from e
        return data

    def close(self) -> None:
        with self._lock:
            try:
                self._raw.close()
            except OSError:
                pass


def _regular_fd(raw: IO[bytes]) -> int | None:
    """The descriptor of ``raw`` when it is a local regular file (read with ``pread``)."""
    try:
        fd = raw.fileno()
        return fd if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except (AttributeError, OSError, ValueError):
        return None
