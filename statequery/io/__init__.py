"""The storage seam: every byte statequery reads from a file goes through :class:`FileIO`.

Locations are local paths or URIs (``file:``, ``s3://``, ``hdfs://``, ``gs://``, ``abfs://`` ...,
anything fsspec knows). Flink writes local paths as ``file:/tmp/x`` (one slash); those are
normalised here. Nothing outside this package imports fsspec.

The package, one module per concern (after pyiceberg's ``io/``):

- :mod:`statequery.io.fileio`: the seam, :class:`FileIO` (picklable, pooled open handles,
  retries), :class:`InputFile`, :class:`ReadStats` and the :class:`FileSystem` protocol;
- :mod:`statequery.io.confine`: locations (normalise, join, parent, store) and confinement
  (allowed roots, resolved paths, ``%2e%2e``, refused redirects);
- :mod:`statequery.io.local`: :class:`LocalFileSystem`, regular files only;
- :mod:`statequery.io.fsspec`: :class:`FsspecFileSystem`, every other scheme (the only module
  that imports fsspec);
- :mod:`statequery.io.ranges`: one open handle per file serving counted ranged reads.
"""

from __future__ import annotations

from statequery.io.confine import (
    filesystem_of,
    is_local,
    is_under,
    join_location,
    location_parent,
    normalize_location,
    same_store,
    store_of,
)
from statequery.io.fileio import FileIO, FileSystem, InputFile, ReadStats
from statequery.io.fsspec import FsspecFileSystem
from statequery.io.local import LocalFileSystem

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
