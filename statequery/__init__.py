"""statequery: read the state inside Apache Flink savepoints and checkpoints, with no JVM.

>>> import statequery
>>> sp = statequery.open("catalog/wordcount")        # a savepoint directory, _metadata or URI
>>> sp.state_meta()                                    # pyarrow.Table, one row per state
"""

from __future__ import annotations

from statequery.exceptions import (
    CorruptStateError,
    NoSuchOperatorError,
    NoSuchStateError,
    NoSuchTableError,
    SavepointNotFoundError,
    StatequeryError,
    StorageError,
    UnknownSerializerError,
    UnsupportedFormatError,
)

__version__ = "0.1.0"

__all__ = [
    "CorruptStateError",
    "NoSuchOperatorError",
    "NoSuchStateError",
    "NoSuchTableError",
    "SavepointNotFoundError",
    "StatequeryError",
    "StorageError",
    "UnknownSerializerError",
    "UnsupportedFormatError",
    "__version__",
    "open",
]


def open(location: str, **options: object):  # type: ignore[no-untyped-def]  # noqa: A001
    """Open a savepoint or checkpoint: its directory, its ``_metadata`` file, or any fsspec URI."""
    from statequery.savepoint import Savepoint

    return Savepoint.open(location, **options)
