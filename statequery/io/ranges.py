"""Range reading: one open handle per file serves the ranged reads that follow.

:class:`RangeReader` seeks and reads under a lock (threads share it); a read longer than
``READ_CHUNK`` goes in chunks, so a false length in a handle costs no memory. Every read is
counted (bytes and one request) through the :data:`Counting` callback of its
:class:`~statequery.io.FileIO`; :class:`CountingStream` counts the reads of a whole stream.
"""

from __future__ import annotations

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

    __slots__ = ("_count", "_lock", "_raw", "location")

    def __init__(self, location: str, raw: IO[bytes], count: Counting) -> None:
        self.location = location
        self._raw = raw
        self._count = count
        self._lock = threading.Lock()

    def read_range(self, start: int, length: int | None) -> bytes:
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

    def close(self) -> None:
        with self._lock:
            try:
                self._raw.close()
            except OSError:
                pass
