"""The entry points ``statequery.open`` and ``statequery.open_job`` (re-exported by the package):
thin wrappers that import the model only when called, so ``import statequery`` stays cheap."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from statequery.history import Job
    from statequery.io import FileIO
    from statequery.savepoint import Savepoint

__all__ = ["open", "open_job"]


def open(  # noqa: A001
    location: str,
    *,
    io: FileIO | None = None,
    storage_options: dict[str, Any] | None = None,
    use_snapshot: bool = True,
    snapshot: str | None = None,
    max_workers: int | None = None,
    plan: str | None = None,
    rederive: bool = False,
    classpath: Sequence[str] | str | None = None,
    protobuf_descriptors: str | os.PathLike[str] | None = None,
    protobuf_messages: Mapping[str, str] | Sequence[str] | str | None = None,
) -> Savepoint:
    """Open a savepoint or checkpoint: its directory, its ``_metadata`` file, or any fsspec URI.

    The options are those of :meth:`statequery.savepoint.Savepoint.open` (``max_workers``
    defaults to its ``DEFAULT_WORKERS``; ``classpath``: the job's jars, Kryo values decoded with
    their classes; ``protobuf_descriptors``: a descriptor set, Protobuf messages decoded with
    it).
    """
    from statequery.savepoint import DEFAULT_WORKERS, Savepoint

    return Savepoint.open(
        location,
        io=io,
        storage_options=storage_options,
        use_snapshot=use_snapshot,
        snapshot=snapshot,
        max_workers=DEFAULT_WORKERS if max_workers is None else max_workers,
        plan=plan,
        rederive=rederive,
        classpath=classpath,
        protobuf_descriptors=protobuf_descriptors,
        protobuf_messages=protobuf_messages,
    )


def open_job(
    location: str,
    *more: str,
    io: FileIO | None = None,
    storage_options: dict[str, Any] | None = None,
    max_workers: int | None = None,
    classpath: Sequence[str] | str | None = None,
    protobuf_descriptors: str | os.PathLike[str] | None = None,
    protobuf_messages: Mapping[str, str] | Sequence[str] | str | None = None,
) -> Job:
    """Open a job's retained checkpoints or savepoints as versions of one database: its
    checkpoint directory (``<job-id>/chk-N`` plus ``shared/``), a folder of its savepoints, or
    any fsspec URI of those; ``more`` directories merge into one history. ``classpath``,
    ``protobuf_descriptors``, ``protobuf_messages``: the job's jars and Protobuf options, for
    its Kryo values (as in :func:`open`). See :mod:`statequery.history`."""
    from statequery.history import open_job as _open_job

    return _open_job(
        location, *more, io=io, storage_options=storage_options, max_workers=max_workers,
        classpath=classpath, protobuf_descriptors=protobuf_descriptors,
        protobuf_messages=protobuf_messages,
    )
