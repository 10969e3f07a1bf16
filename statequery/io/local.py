"""Local files: read directly (``file:`` URIs are normalised to paths first).

Only regular files are read: a FIFO, a device or a directory is refused before a byte is read
(:func:`file_kind` names what it is). Writes are atomic (a temporary file, then a rename).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from typing import IO

from statequery.exceptions import StorageError

__all__ = ["LocalFileSystem", "file_kind"]


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, for an error message."""
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
            raise StorageError(f"{location} is not a regular file ({file_kind(st.st_mode)})")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class LocalFileSystem:
    """Local paths (``file:`` URIs are normalised to paths first)."""

    def __init__(self, scheme: str = "",
                 storage_options: Mapping[str, object] | None = None) -> None:
        pass

    def open(self, location: str) -> IO[bytes]:
        return _open_regular(location)

    def size(self, location: str) -> int:
        st = os.stat(location)
        if not stat.S_ISREG(st.st_mode):
            raise StorageError(f"{location} is not a regular file ({file_kind(st.st_mode)})")
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
