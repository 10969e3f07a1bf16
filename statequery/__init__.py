"""statequery: read the state inside Apache Flink savepoints and checkpoints, with no JVM.

>>> import statequery
>>> sp = statequery.open("catalog/wordcount")        # a savepoint directory, _metadata or URI
>>> sp.state_meta()                                    # pyarrow.Table, one row per state
"""

from __future__ import annotations

from statequery._version import __version__
from statequery.api import open, open_job  # noqa: A004 - statequery.open is the entry point

# the functions shadow their modules, ``statequery.capture`` and ``statequery.sql``, as the
# package attributes
from statequery.capture import capture
from statequery.exceptions import (
    CorruptStateError,
    MissingExtraError,
    NoSuchOperatorError,
    NoSuchStateError,
    NoSuchTableError,
    SavepointNotFoundError,
    StatequeryError,
    StorageError,
    UnknownSerializerError,
    UnsupportedFormatError,
)
from statequery.sql import sql

__all__ = [
    "CorruptStateError",
    "MissingExtraError",
    "NoSuchOperatorError",
    "NoSuchStateError",
    "NoSuchTableError",
    "SavepointNotFoundError",
    "StatequeryError",
    "StorageError",
    "UnknownSerializerError",
    "UnsupportedFormatError",
    "__version__",
    "capture",
    "open",
    "open_job",
    "sql",
]
