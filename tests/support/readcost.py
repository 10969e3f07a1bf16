"""What a read cost in bytes, for tests comparing two ways of reading the same state."""

from __future__ import annotations

import os

from statequery.io import FileIO


def bytes_read(io: FileIO) -> int:
    """The bytes read through ``io``, plus every local file opened through it and read in
    place instead (a RocksDB file hard-linked into a DB directory, which the restore then reads
    whole without the seam): counted whole."""
    in_place = sum(os.path.getsize(loc) for loc, n in io.stats.opens.items()
                   if n and not io.stats.bytes_read.get(loc) and "://" not in loc)
    return io.stats.total_bytes + in_place
