"""State handles: where the bytes of a savepoint's state live.

The records mirror Flink's handle classes as ``_metadata`` stores them (see
``MetadataV2V3SerializerBase``):

* stream handles (a byte source): :class:`ByteStreamHandle` (inline, type 1), :class:`FileHandle`
  (absolute path, type 2), :class:`RelativeFileHandle` (relative to the ``_metadata`` directory,
  type 6), :class:`SegmentHandle` (file-merging segment, type 15), :class:`EmptySegmentHandle`
  (type 16);
* keyed handles: :class:`KeyGroupsHandle` (types 3, 7, 12), :class:`IncrementalHandle`
  (RocksDB incremental/native, types 5 and 11), :class:`ChangelogHandle` (types 8 and 14),
  :class:`ChangelogStreamHandle` (types 10 and 13), :class:`InMemoryChangelogHandle` (type 9);
* :class:`OperatorStreamHandle` (types 4 and 17) with per-state partition offsets and mode.

:class:`HandleResolver` opens their bytes through the storage seam: inline bytes, absolute
files, files relative to the ``_metadata`` directory, and file-merging segments. Absolute paths of
a checkpoint that was moved (committed fixtures hold paths from the machine that wrote them) are
remapped onto the checkpoint's own tree: ``.../<job-id>/shared/<file>`` and ``taskowned/`` resolve
against the job directory above ``chk-N``, anything else against the ``_metadata`` directory.

Every record converts to plain data (:func:`handle_to_dict` / :func:`handle_from_dict`) so the
StateMeta snapshot can store them.
"""

from __future__ import annotations

import io
import posixpath
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, ClassVar, Union

from statequery.exceptions import CorruptStateError, StorageError
from statequery.hashing import KeyGroupRange
from statequery.io import (
    FileIO,
    filesystem_of,
    is_under,
    join_location,
    location_parent,
    normalize_location,
    same_store,
    store_of,
)

__all__ = [
    "ByteStreamHandle",
    "ChangelogHandle",
    "ChangelogStreamHandle",
    "EmptySegmentHandle",
    "FileHandle",
    "HandleResolver",
    "InMemoryChangelogHandle",
    "IncrementalHandle",
    "KeyGroupsHandle",
    "KeyedHandle",
    "OperatorStatePartition",
    "OperatorStreamHandle",
    "RelativeFileHandle",
    "SegmentHandle",
    "StreamHandle",
    "handle_from_dict",
    "handle_to_dict",
]

# OperatorStateHandle.Mode ordinals
DISTRIBUTION_MODES = ("SPLIT_DISTRIBUTE", "UNION", "BROADCAST")


# -- stream handles ----------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamHandle:
    """A readable byte stream (``StreamStateHandle``)."""

    type_code: ClassVar[int] = -1

    @property
    def size(self) -> int | None:
        """The stream's length in bytes when the handle records it."""
        return None

    def describe(self) -> str:
        return type(self).__name__


@dataclass(frozen=True)
class ByteStreamHandle(StreamHandle):
    """``ByteStreamStateHandle``: bytes inlined in ``_metadata`` (``name``: the would-be path)."""

    type_code: ClassVar[int] = 1
    name: str = ""
    data: bytes = b""

    @property
    def size(self) -> int:
        return len(self.data)

    def describe(self) -> str:
        return f"inline:{self.name}"


@dataclass(frozen=True)
class FileHandle(StreamHandle):
    """``FileStateHandle``: an absolute Flink path (``file:/…``, ``s3://…``)."""

    type_code: ClassVar[int] = 2
    path: str = ""
    file_size: int = 0

    @property
    def size(self) -> int:
        return self.file_size

    def describe(self) -> str:
        return self.path


@dataclass(frozen=True)
class RelativeFileHandle(StreamHandle):
    """``RelativeFileStateHandle``: a path relative to the directory holding ``_metadata``."""

    type_code: ClassVar[int] = 6
    relative_path: str = ""
    file_size: int = 0

    @property
    def size(self) -> int:
        return self.file_size

    def describe(self) -> str:
        return self.relative_path


@dataclass(frozen=True)
class SegmentHandle(StreamHandle):
    """``SegmentFileStateHandle`` (file merging): bytes ``[start, start+size)`` of a physical file.

    Offsets recorded inside the logical stream (key-group, partition offsets) are segment-relative.
    ``scope`` is ``CheckpointedStateScope``: 0 EXCLUSIVE, 1 SHARED.
    """

    type_code: ClassVar[int] = 15
    physical_path: str = ""
    start: int = 0
    segment_size: int = 0
    scope: int = 0
    logical_file_id: str = ""

    @property
    def size(self) -> int:
        return self.segment_size

    def describe(self) -> str:
        return f"{self.physical_path}[{self.start}:{self.start + self.segment_size}]"


@dataclass(frozen=True)
class EmptySegmentHandle(StreamHandle):
    """``EmptySegmentFileStateHandle``: a file-merging segment of zero bytes."""

    type_code: ClassVar[int] = 16

    @property
    def size(self) -> int:
        return 0

    def describe(self) -> str:
        return "empty-segment"


# -- keyed handles -----------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyedHandle:
    """Base of keyed-state handles; ``key_group_range`` is the inclusive range it covers."""

    type_code: ClassVar[int] = -1
    start_key_group: int = 0
    num_key_groups: int = 0

    @property
    def key_group_range(self) -> KeyGroupRange:
        return KeyGroupRange(self.start_key_group, self.start_key_group + self.num_key_groups - 1)

    def stream_handles(self) -> tuple[StreamHandle, ...]:
        """Every byte stream this handle references (for sizes and existence checks)."""
        return ()


@dataclass(frozen=True)
class KeyGroupsHandle(KeyedHandle, StreamHandle):
    """``KeyGroupsStateHandle`` (12, 3) / ``KeyGroupsSavepointStateHandle`` (7).

    ``offsets[i]`` is the position of key group ``start_key_group + i`` in ``delegate``; in a
    canonical savepoint 0 means the key group holds no data. ``type_code`` records which record
    it was read from (7 = savepoint, canonical layout; 12 = checkpoint: heap layout in 1.17+).
    """

    type_code: ClassVar[int] = 12
    handle_type: int = 12
    offsets: tuple[int, ...] = ()
    delegate: StreamHandle = field(default_factory=EmptySegmentHandle)
    handle_id: str | None = None

    @property
    def size(self) -> int | None:
        return self.delegate.size

    def offset_of(self, key_group: int) -> int:
        return self.offsets[key_group - self.start_key_group]

    def stream_handles(self) -> tuple[StreamHandle, ...]:
        return (self.delegate,)

    def describe(self) -> str:
        return self.delegate.describe()


def is_heap_layout(handle: Any) -> bool:
    """A type-12 key-groups handle whose every key group has an offset: the hashmap backend's
    checkpoint / native savepoint layout, as far as the handle alone can tell.

    A full (non-incremental) RocksDB checkpoint of Flink 1.15 is a type-12 handle too, in the
    canonical layout, and when every key group holds data every offset is set as well: readers
    decide with :func:`layout_by_first_bytes`, which looks at the bytes, and the model
    keeps its answer (``HeaderInfo.layout``)."""
    offsets = tuple(handle.offsets)
    return handle.handle_type == 12 and bool(offsets) and all(o > 0 for o in offsets)


def is_heap_stream(handle: Any, layout: str | None) -> bool:
    """The hashmap layout, as the handle and the header read (``HeaderInfo.layout``) say."""
    return is_heap_layout(handle) and layout != "canonical"


def layout_probe(handle: Any) -> tuple[int, int] | None:
    """``(offset, key group)`` of the 4 bytes :func:`layout_by_first_bytes` reads: the first key
    group other than 0 in file order; None when the handle holds key group 0 alone."""
    starts = sorted((o, handle.start_key_group + i) for i, o in enumerate(handle.offsets))
    return next(((offset, kg) for offset, kg in starts if kg != 0), None)


def layout_by_first_bytes(handle: Any, read: Callable[[int, int], bytes]) -> str | None:
    """"heap" or "canonical" for a key-groups stream whose handle cannot tell, from 4 bytes.

    A hashmap key group starts with its own id (int32, written before any compression); a
    canonical one with a u16 state id and the high half of an int32 key length, or a snappy
    frame (0xFF...). The first key group other than 0 in file order decides
    (:func:`layout_probe`); None when the handle holds key group 0 alone (both layouts may
    start with int32 0 there: ``statequery.backends.registry`` walks it)."""
    probe = layout_probe(handle)
    if probe is None:
        return None
    offset, kg = probe
    head = read(offset, 4)
    same = len(head) == 4 and int.from_bytes(head, "big", signed=True) == kg
    return "heap" if same else "canonical"


@dataclass(frozen=True)
class IncrementalHandle(KeyedHandle):
    """``IncrementalRemoteKeyedStateHandle`` (11; 5 without size and id): RocksDB files.

    ``shared``/``private`` map each RocksDB file name (``000012.sst``, ``MANIFEST-000005``…) to its
    stream; ``meta`` holds the ``KeyedBackendSerializationProxy`` (states and serializers).
    """

    type_code: ClassVar[int] = 11
    handle_type: int = 11
    checkpoint_id: int = 0
    backend_id: str = ""
    checkpointed_size: int = 0
    meta: StreamHandle = field(default_factory=EmptySegmentHandle)
    shared: tuple[tuple[str, StreamHandle], ...] = ()
    private: tuple[tuple[str, StreamHandle], ...] = ()
    handle_id: str | None = None

    def stream_handles(self) -> tuple[StreamHandle, ...]:
        return (self.meta, *(h for _, h in self.shared), *(h for _, h in self.private))


@dataclass(frozen=True)
class ChangelogHandle(KeyedHandle):
    """``ChangelogStateBackendHandle`` (14; 8 without checkpoint id): materialized + deltas."""

    type_code: ClassVar[int] = 14
    handle_type: int = 14
    checkpointed_size: int = 0
    materialized: tuple[KeyedHandle, ...] = ()
    non_materialized: tuple[KeyedHandle, ...] = ()
    materialization_id: int = 0
    checkpoint_id: int | None = None
    handle_id: str = ""

    def stream_handles(self) -> tuple[StreamHandle, ...]:
        out: list[StreamHandle] = []
        for h in (*self.materialized, *self.non_materialized):
            out.extend(h.stream_handles())
        return tuple(out)


@dataclass(frozen=True)
class ChangelogStreamHandle(KeyedHandle):
    """``ChangelogStateHandleStreamImpl`` (13; 10 without storage id): state-change log files."""

    type_code: ClassVar[int] = 13
    handle_type: int = 13
    streams: tuple[tuple[StreamHandle, int], ...] = ()
    state_size: int = 0
    checkpointed_size: int = 0
    handle_id: str = ""
    storage_id: str = "filesystem"

    def stream_handles(self) -> tuple[StreamHandle, ...]:
        return tuple(h for h, _ in self.streams)


@dataclass(frozen=True)
class InMemoryChangelogHandle(KeyedHandle):
    """``InMemoryChangelogStateHandle`` (9): state changes inlined in ``_metadata``."""

    type_code: ClassVar[int] = 9
    sequence_from: int = 0
    sequence_to: int = 0
    changes: tuple[tuple[int, bytes], ...] = ()
    handle_id: str = ""


# -- operator handles --------------------------------------------------------------------------


@dataclass(frozen=True)
class OperatorStatePartition:
    """One named state in an ``OperatorStateHandle``: distribution mode and element offsets."""

    name: str
    mode: str  # SPLIT_DISTRIBUTE | UNION | BROADCAST
    offsets: tuple[int, ...]


@dataclass(frozen=True)
class OperatorStreamHandle:
    """``OperatorStreamStateHandle`` (4) / ``FileMergingOperatorStreamStateHandle`` (17)."""

    handle_type: int = 4
    partitions: tuple[OperatorStatePartition, ...] = ()
    delegate: StreamHandle = field(default_factory=EmptySegmentHandle)
    taskowned_dir: str | None = None
    shared_dir: str | None = None
    is_empty: bool = False

    def partition(self, name: str) -> OperatorStatePartition | None:
        for p in self.partitions:
            if p.name == name:
                return p
        return None

    def stream_handles(self) -> tuple[StreamHandle, ...]:
        return (self.delegate,)


AnyHandle = Union[StreamHandle, KeyedHandle, OperatorStreamHandle]  # noqa: UP007


# -- resolving and reading ---------------------------------------------------------------------


class _SliceStream(io.RawIOBase):
    """A read-only view of ``[start, start+size)`` of an underlying stream (file-merging)."""

    def __init__(self, raw: IO[bytes], start: int, size: int) -> None:
        self._raw = raw
        self._start = start
        self._size = size
        self._pos = 0
        raw.seek(start)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        if whence == 1:
            pos += self._pos
        elif whence == 2:
            pos += self._size
        self._pos = max(0, min(pos, self._size))
        self._raw.seek(self._start + self._pos)
        return self._pos

    def read(self, n: int = -1) -> bytes:
        left = self._size - self._pos
        n = left if n is None or n < 0 else min(n, left)
        data = self._raw.read(n) if n > 0 else b""
        self._pos += len(data)
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._raw.close()
        super().close()


_TREE_DIRS = ("shared", "taskowned", "dstl")  # dstl: the changelog's file-system log


def _store_name(host: str, port: int | None) -> str:
    return f"{host}:{port}" if port is not None else (host or "no host")


class HandleResolver:
    """Turns handles into locations and bytes, relative to one ``_metadata`` directory.

    Resolution of absolute paths is cached per instance (one existence check per directory).
    """

    def __init__(self, io: FileIO, metadata_dir: str) -> None:
        self.io = io
        self.metadata_dir = normalize_location(metadata_dir)
        self._lock = threading.Lock()
        self._resolved: dict[str, str] = {}
        confine = getattr(io, "confine", None)
        if confine is not None:  # what lies in the savepoint's tree must resolve into it
            confine(self.job_dir or self.metadata_dir)

    @property
    def job_dir(self) -> str | None:
        """The ``<job-id>`` directory when ``_metadata`` sits in a ``chk-N`` directory."""
        base = posixpath.basename(self.metadata_dir.rstrip("/"))
        if base.startswith("chk-"):
            return location_parent(self.metadata_dir)
        return None

    def _candidates(self, path: str) -> list[str]:
        """Own-tree locations for an absolute path written elsewhere, most specific first."""
        parts = [p for p in normalize_location(path).replace("\\", "/").split("/") if p]
        out: list[str] = []
        job_dir = self.job_dir
        if job_dir is not None:
            for i in range(len(parts) - 1, -1, -1):
                if parts[i] in _TREE_DIRS and i + 1 < len(parts):
                    try:
                        out.append(join_location(job_dir, "/".join(parts[i:])))
                    except StorageError:
                        pass
                    break
                if parts[i].startswith("chk-") and i + 1 < len(parts):
                    try:
                        out.append(join_location(self.metadata_dir, "/".join(parts[i + 1 :])))
                    except StorageError:
                        pass
                    break
        if parts:
            try:
                out.append(join_location(self.metadata_dir, parts[-1]))
            except StorageError:
                pass
        return out

    def refusal(self, location: str) -> str | None:
        """Why an absolute handle's ``location`` may not be read, or None when it may.

        A savepoint chooses its handles, so they are not trusted: they may only name files
        under one of the FileIO's ``allowed_roots`` or on the savepoint's own store: same
        filesystem, same host and port, same bucket (a ``_metadata`` served over http cannot
        make statequery fetch ``http://169.254.169.254/...``, one in ``s3://a`` cannot read
        ``s3://b``); when the FileIO has ``allowed_roots``, only inside the savepoint's own
        directory tree. Where a location *resolves* (symbolic links) is checked by the FileIO
        at open (:meth:`FileIO.confine`).
        """
        roots = getattr(self.io, "allowed_roots", ())
        if any(is_under(location, r) for r in roots):
            return None
        own, theirs = filesystem_of(self.metadata_dir), filesystem_of(location)
        if theirs != own:
            return (f"it is on {theirs}://, not on the savepoint's own filesystem ({own}); "
                    "state handles may not point at other filesystems")
        if not same_store(location, self.metadata_dir):
            _, host, port = store_of(location)
            _, own_host, own_port = store_of(self.metadata_dir)
            return (f"it is on {_store_name(host, port)}, not on the savepoint's own store "
                    f"({_store_name(own_host, own_port)}); state handles may only name objects "
                    "of the savepoint's own host and bucket")
        if roots:
            own_tree = self.job_dir or self.metadata_dir
            if not is_under(location, own_tree):
                return f"it is outside the allowed roots ({', '.join(roots)})"
        return None

    def resolve_path(self, path: str) -> str:
        """The location to read for an absolute path (remapped onto the own tree if moved).

        Candidates inside the savepoint's own tree are tried first; the path as written is read
        only if :meth:`refusal` allows it, so a refused handle causes no request at all.
        """
        with self._lock:
            hit = self._resolved.get(path)
        if hit is not None:
            return hit
        try:
            original = normalize_location(path)
            refused = self.refusal(original)
        except StorageError:
            original, refused = path, "it is not a valid location"
        tried = []
        for cand in [*self._candidates(path), *([] if refused else [original])]:
            if cand in tried:
                continue
            tried.append(cand)
            if self.io.new_input(cand).exists():
                with self._lock:
                    self._resolved[path] = cand
                return cand
        if refused:
            raise StorageError(
                f"state handle names {path!r}, which statequery refuses to read: {refused} "
                f"(looked in the savepoint's own tree at {', '.join(tried) or 'nothing'})"
            )
        hint = ""
        if "/shared/" in path.replace("\\", "/"):
            hint = ("; an incremental checkpoint's files are in the job directory's shared/ "
                    "folder, beside chk-N: copy or point at the whole job directory")
        raise StorageError(
            f"state file {path} not found (also looked at {', '.join(tried[:-1]) or 'nothing'})"
            + hint
        )

    def location(self, handle: StreamHandle) -> str | None:
        """The file a stream handle reads from; None for inline bytes and empty segments."""
        if isinstance(handle, FileHandle):
            return self.resolve_path(handle.path)
        if isinstance(handle, RelativeFileHandle):
            return join_location(self.metadata_dir, handle.relative_path)
        if isinstance(handle, SegmentHandle):
            return self.resolve_path(handle.physical_path)
        if isinstance(handle, KeyGroupsHandle):
            return self.location(handle.delegate)
        return None

    def source_name(self, handle: StreamHandle) -> str:
        """A name for error messages: the file, or ``<_metadata dir>/_metadata:inline:<name>``."""
        if isinstance(handle, ByteStreamHandle):
            return f"{self.metadata_dir}/_metadata (inline {handle.name or 'bytes'})"
        try:
            return self.location(handle) or handle.describe()
        except StorageError:
            return handle.describe()

    def stream_size(self, handle: StreamHandle) -> int:
        """The length of the stream (from the handle; a file's length when it records none)."""
        size = handle.size
        if size is not None:
            return size
        loc = self.location(handle)
        return 0 if loc is None else len(self.io.new_input(loc))

    def read(self, handle: StreamHandle, start: int = 0, length: int | None = None) -> bytes:
        """Bytes ``[start, start+length)`` of the logical stream (to its end if length is None)."""
        if start < 0 or (length is not None and length < 0):
            raise StorageError(f"invalid range start={start} length={length}")
        if isinstance(handle, KeyGroupsHandle):
            return self.read(handle.delegate, start, length)
        if isinstance(handle, ByteStreamHandle):
            end = len(handle.data) if length is None else start + length
            return handle.data[start:end]
        if isinstance(handle, EmptySegmentHandle):
            return b""
        if isinstance(handle, SegmentHandle):
            if start >= handle.segment_size:
                return b""
            n = (
                handle.segment_size - start
                if length is None
                else min(length, handle.segment_size - start)
            )
            physical = self.resolve_path(handle.physical_path)
            return self.io.new_input(physical).read(handle.start + start, n)
        loc = self.location(handle)
        if loc is None:
            raise StorageError(f"cannot read {handle.describe()}")
        return self.io.new_input(loc).read(start, length)

    def open(self, handle: StreamHandle) -> IO[bytes]:
        """A seekable stream over the logical bytes (positions are stream-relative)."""
        if isinstance(handle, KeyGroupsHandle):
            return self.open(handle.delegate)
        if isinstance(handle, ByteStreamHandle):
            return io.BytesIO(handle.data)
        if isinstance(handle, EmptySegmentHandle):
            return io.BytesIO(b"")
        if isinstance(handle, SegmentHandle):
            raw = self.io.new_input(self.resolve_path(handle.physical_path)).open()
            return _SliceStream(raw, handle.start, handle.segment_size)  # type: ignore[return-value]
        loc = self.location(handle)
        if loc is None:
            raise StorageError(f"cannot open {handle.describe()}")
        return self.io.new_input(loc).open()


# -- plain data (StateMeta snapshot) -----------------------------------------------------------


def handle_to_dict(h: Any) -> Any:
    """Plain data for msgpack; :func:`handle_from_dict` inverts it. None stays None."""
    if h is None:
        return None
    if isinstance(h, ByteStreamHandle):
        return {"t": "bytes", "name": h.name, "data": h.data}
    if isinstance(h, FileHandle):
        return {"t": "file", "path": h.path, "size": h.file_size}
    if isinstance(h, RelativeFileHandle):
        return {"t": "relative", "path": h.relative_path, "size": h.file_size}
    if isinstance(h, SegmentHandle):
        return {
            "t": "segment",
            "path": h.physical_path,
            "start": h.start,
            "size": h.segment_size,
            "scope": h.scope,
            "id": h.logical_file_id,
        }
    if isinstance(h, EmptySegmentHandle):
        return {"t": "empty_segment"}
    if isinstance(h, KeyGroupsHandle):
        return {
            "t": "key_groups",
            "type": h.handle_type,
            "start": h.start_key_group,
            "offsets": list(h.offsets),
            "delegate": handle_to_dict(h.delegate),
            "id": h.handle_id,
        }
    if isinstance(h, IncrementalHandle):
        return {
            "t": "incremental",
            "type": h.handle_type,
            "start": h.start_key_group,
            "num": h.num_key_groups,
            "checkpoint_id": h.checkpoint_id,
            "backend_id": h.backend_id,
            "checkpointed_size": h.checkpointed_size,
            "meta": handle_to_dict(h.meta),
            "shared": [[p, handle_to_dict(s)] for p, s in h.shared],
            "private": [[p, handle_to_dict(s)] for p, s in h.private],
            "id": h.handle_id,
        }
    if isinstance(h, ChangelogHandle):
        return {
            "t": "changelog",
            "type": h.handle_type,
            "start": h.start_key_group,
            "num": h.num_key_groups,
            "checkpointed_size": h.checkpointed_size,
            "materialized": [handle_to_dict(x) for x in h.materialized],
            "non_materialized": [handle_to_dict(x) for x in h.non_materialized],
            "materialization_id": h.materialization_id,
            "checkpoint_id": h.checkpoint_id,
            "id": h.handle_id,
        }
    if isinstance(h, ChangelogStreamHandle):
        return {
            "t": "changelog_stream",
            "type": h.handle_type,
            "start": h.start_key_group,
            "num": h.num_key_groups,
            "streams": [[handle_to_dict(s), o] for s, o in h.streams],
            "state_size": h.state_size,
            "checkpointed_size": h.checkpointed_size,
            "id": h.handle_id,
            "storage_id": h.storage_id,
        }
    if isinstance(h, InMemoryChangelogHandle):
        return {
            "t": "changelog_inline",
            "start": h.start_key_group,
            "num": h.num_key_groups,
            "from": h.sequence_from,
            "to": h.sequence_to,
            "changes": [[kg, data] for kg, data in h.changes],
            "id": h.handle_id,
        }
    if isinstance(h, OperatorStreamHandle):
        return {
            "t": "operator",
            "type": h.handle_type,
            "partitions": [[p.name, p.mode, list(p.offsets)] for p in h.partitions],
            "delegate": handle_to_dict(h.delegate),
            "taskowned_dir": h.taskowned_dir,
            "shared_dir": h.shared_dir,
            "is_empty": h.is_empty,
        }
    raise TypeError(f"not a state handle: {h!r}")


def handle_from_dict(d: Any) -> Any:
    if d is None:
        return None
    try:
        t = d["t"]
        if t == "bytes":
            return ByteStreamHandle(name=d["name"], data=bytes(d["data"]))
        if t == "file":
            return FileHandle(path=d["path"], file_size=d["size"])
        if t == "relative":
            return RelativeFileHandle(relative_path=d["path"], file_size=d["size"])
        if t == "segment":
            return SegmentHandle(
                physical_path=d["path"],
                start=d["start"],
                segment_size=d["size"],
                scope=d["scope"],
                logical_file_id=d["id"],
            )
        if t == "empty_segment":
            return EmptySegmentHandle()
        if t == "key_groups":
            return KeyGroupsHandle(
                start_key_group=d["start"],
                num_key_groups=len(d["offsets"]),
                handle_type=d["type"],
                offsets=tuple(d["offsets"]),
                delegate=handle_from_dict(d["delegate"]),
                handle_id=d["id"],
            )
        if t == "incremental":
            return IncrementalHandle(
                start_key_group=d["start"],
                num_key_groups=d["num"],
                handle_type=d["type"],
                checkpoint_id=d["checkpoint_id"],
                backend_id=d["backend_id"],
                checkpointed_size=d["checkpointed_size"],
                meta=handle_from_dict(d["meta"]),
                shared=tuple((p, handle_from_dict(s)) for p, s in d["shared"]),
                private=tuple((p, handle_from_dict(s)) for p, s in d["private"]),
                handle_id=d["id"],
            )
        if t == "changelog":
            return ChangelogHandle(
                start_key_group=d["start"],
                num_key_groups=d["num"],
                handle_type=d["type"],
                checkpointed_size=d["checkpointed_size"],
                materialized=tuple(handle_from_dict(x) for x in d["materialized"]),
                non_materialized=tuple(handle_from_dict(x) for x in d["non_materialized"]),
                materialization_id=d["materialization_id"],
                checkpoint_id=d["checkpoint_id"],
                handle_id=d["id"],
            )
        if t == "changelog_stream":
            return ChangelogStreamHandle(
                start_key_group=d["start"],
                num_key_groups=d["num"],
                handle_type=d["type"],
                streams=tuple((handle_from_dict(s), o) for s, o in d["streams"]),
                state_size=d["state_size"],
                checkpointed_size=d["checkpointed_size"],
                handle_id=d["id"],
                storage_id=d["storage_id"],
            )
        if t == "changelog_inline":
            return InMemoryChangelogHandle(
                start_key_group=d["start"],
                num_key_groups=d["num"],
                sequence_from=d["from"],
                sequence_to=d["to"],
                changes=tuple((kg, bytes(b)) for kg, b in d["changes"]),
                handle_id=d["id"],
            )
        if t == "operator":
            return OperatorStreamHandle(
                handle_type=d["type"],
                partitions=tuple(
                    OperatorStatePartition(n, m, tuple(o)) for n, m, o in d["partitions"]
                ),
                delegate=handle_from_dict(d["delegate"]),
                taskowned_dir=d["taskowned_dir"],
                shared_dir=d["shared_dir"],
                is_empty=d["is_empty"],
            )
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptStateError(f"malformed handle record in the StateMeta snapshot: {e}") from e
    raise CorruptStateError(f"unknown handle record {d.get('t')!r} in the StateMeta snapshot")
