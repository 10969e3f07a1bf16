"""The ``_metadata`` file of a savepoint or checkpoint (metadata versions 3 to 6).

Sources: ``Checkpoints.java``, ``MetadataV2V3SerializerBase``, ``MetadataV3Serializer`` …
``MetadataV6Serializer``, ``ChannelStateHandleSerializerV1/V2``. Layout::

    int32 magic 0x4960672D, int32 version
    int64 checkpointId
    int32 n + n × MasterState            (magic 0xC96B1696, int32 len, bytes)
    int32 n + n × OperatorState
    [v >= 4] Java-serialized CheckpointProperties (to the end of the file)

Version 5 adds the operator name and uid, version 6 the typed (mergeable) channel-state handles.
Every error is a :class:`~statequery.exceptions.CorruptStateError` (naming the file and offset)
or an :class:`~statequery.exceptions.UnsupportedFormatError` (naming the version or handle type).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from statequery.decoder import Decoder
from statequery.exceptions import (
    CorruptStateError,
    SavepointNotFoundError,
    StorageError,
    UnsupportedFormatError,
)
from statequery.io import FileIO, location_parent
from statequery.metadata.handles import (
    DISTRIBUTION_MODES,
    ByteStreamHandle,
    ChangelogHandle,
    ChangelogStreamHandle,
    EmptySegmentHandle,
    FileHandle,
    IncrementalHandle,
    InMemoryChangelogHandle,
    KeyedHandle,
    KeyGroupsHandle,
    OperatorStatePartition,
    OperatorStreamHandle,
    RelativeFileHandle,
    SegmentHandle,
    StreamHandle,
)

__all__ = [
    "HEADER_MAGIC",
    "SUPPORTED_VERSIONS",
    "CheckpointMetadata",
    "CheckpointProperties",
    "MasterState",
    "OperatorState",
    "SubtaskState",
    "load_metadata",
    "parse_metadata",
]

HEADER_MAGIC = 0x4960672D
MASTER_STATE_MAGIC = 0xC96B1696 - (1 << 32)  # as a signed int32
SUPPORTED_VERSIONS = (3, 4, 5, 6)

# MetadataV2V3SerializerBase type bytes
NULL_HANDLE = 0
BYTE_STREAM_STATE_HANDLE = 1
FILE_STREAM_STATE_HANDLE = 2
KEY_GROUPS_HANDLE = 3
PARTITIONABLE_OPERATOR_STATE_HANDLE = 4
INCREMENTAL_KEY_GROUPS_HANDLE = 5
RELATIVE_STREAM_STATE_HANDLE = 6
SAVEPOINT_KEY_GROUPS_HANDLE = 7
CHANGELOG_HANDLE = 8
CHANGELOG_BYTE_INCREMENT_HANDLE = 9
CHANGELOG_FILE_INCREMENT_HANDLE = 10
INCREMENTAL_KEY_GROUPS_HANDLE_V2 = 11
KEY_GROUPS_HANDLE_V2 = 12
CHANGELOG_FILE_INCREMENT_HANDLE_V2 = 13
CHANGELOG_HANDLE_V2 = 14
SEGMENT_FILE_HANDLE = 15
EMPTY_SEGMENT_FILE_HANDLE = 16
SEGMENT_PARTITIONABLE_OPERATOR_STATE_HANDLE = 17

MAX_KEY_GROUPS = 1 << 15


@dataclass(frozen=True)
class MasterState:
    """A master hook's state (``MasterState``): name, version and opaque bytes."""

    name: str
    version: int
    data: bytes


@dataclass(frozen=True)
class SubtaskState:
    """``OperatorSubtaskState`` of one subtask: at most one handle of each kind."""

    index: int
    managed_operator: OperatorStreamHandle | None = None
    raw_operator: OperatorStreamHandle | None = None
    managed_keyed: KeyedHandle | None = None
    raw_keyed: KeyedHandle | None = None
    input_channel_handles: int = 0
    output_channel_handles: int = 0


@dataclass(frozen=True)
class OperatorState:
    """One operator of the job graph as ``_metadata`` records it.

    ``operator_id`` is the 32-hex OperatorID; ``name``/``uid`` exist from metadata v5 (else "").
    ``fully_finished`` marks an operator whose subtasks had all finished (no state follows);
    ``finished_subtasks`` lists the indexes of individually finished subtasks.
    """

    operator_id: str
    name: str
    uid: str
    parallelism: int
    max_parallelism: int
    coordinator_state: StreamHandle | None = None
    subtasks: tuple[SubtaskState, ...] = ()
    finished_subtasks: tuple[int, ...] = ()
    fully_finished: bool = False


@dataclass(frozen=True)
class CheckpointProperties:
    """What the trailing Java-serialized ``CheckpointProperties`` (v4+) says, when readable.

    ``snapshot_type`` is ``savepoint`` or ``checkpoint``; ``format`` is the savepoint format
    (``CANONICAL``/``NATIVE``) or None for checkpoints; ``name`` the ``SnapshotType`` name.
    """

    snapshot_type: str
    format: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class CheckpointMetadata:
    """A parsed ``_metadata`` file."""

    location: str
    version: int
    checkpoint_id: int
    master_states: tuple[MasterState, ...] = ()
    operators: tuple[OperatorState, ...] = ()
    properties: CheckpointProperties | None = None
    size: int = 0
    properties_offset: int | None = field(default=None, compare=False)

    @property
    def directory(self) -> str:
        return location_parent(self.location)


def load_metadata(io: FileIO, location: str) -> CheckpointMetadata:
    """Read and parse the ``_metadata`` file at ``location`` through the storage seam."""
    f = io.new_input(location)
    try:
        data = f.read()
    except StorageError as e:
        if not f.exists():
            raise SavepointNotFoundError(f"no _metadata at {location}") from e
        raise
    return parse_metadata(data, f.location)


def parse_metadata(data: bytes, location: str = "_metadata") -> CheckpointMetadata:
    """Parse ``_metadata`` bytes (``location`` names the file in errors)."""
    d = Decoder(data, source=location)
    if len(data) < 8:
        raise d.error(f"too short for a _metadata file ({len(data)} bytes)")
    magic = d.read_int()
    if magic & 0xFFFFFFFF != HEADER_MAGIC:
        raise d.error(
            f"not a Flink _metadata file: magic {magic & 0xFFFFFFFF:#010x}, "
            f"expected {HEADER_MAGIC:#010x}",
            0,
        )
    version = d.read_int()
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedFormatError(
            f"{location}: _metadata version {version} is not supported "
            f"(statequery reads versions {SUPPORTED_VERSIONS[0]}-{SUPPORTED_VERSIONS[-1]}, "
            "written by Flink 1.11-2.3)"
        )
    return _MetadataParser(d, version).parse(location, len(data))


class _MetadataParser:
    def __init__(self, d: Decoder, version: int) -> None:
        self.d = d
        self.version = version
        self._in_changelog_handle = False

    # -- top level -----------------------------------------------------------------------------

    def parse(self, location: str, size: int) -> CheckpointMetadata:
        d = self.d
        pos = d.pos
        checkpoint_id = d.read_long()
        if checkpoint_id < 0:
            raise d.error(f"negative checkpoint id {checkpoint_id}", pos)
        masters = tuple(self._master_state() for _ in range(self._count("master state", 8)))
        operators = tuple(self._operator_state() for _ in range(self._count("operator", 33)))
        props_offset = d.offset if self.version >= 4 and not d.at_end() else None
        props = _read_properties(d) if props_offset is not None else None
        return CheckpointMetadata(
            location=location,
            version=self.version,
            checkpoint_id=checkpoint_id,
            master_states=masters,
            operators=operators,
            properties=props,
            size=size,
            properties_offset=props_offset,
        )

    def _count(self, what: str, min_bytes_each: int) -> int:
        return self.d.check_length(self.d.read_int(), f"{what} count", min_bytes_each)

    def _master_state(self) -> MasterState:
        d = self.d
        pos = d.pos
        magic = d.read_int()
        if magic != MASTER_STATE_MAGIC:
            raise d.error(f"bad master state magic {magic & 0xFFFFFFFF:#010x}", pos)
        body = d.sub(d.check_length(d.read_int(), "master state length"))
        version = body.read_int()
        name = body.read_utf()
        data = body.read_bytes(body.check_length(body.read_int(), "master state data length"))
        return MasterState(name, version, data)

    def _operator_state(self) -> OperatorState:
        d = self.d
        name = uid = ""
        if self.version >= 5:
            name = d.read_utf()
            uid = d.read_utf()
        operator_id = d.read_bytes(16).hex()
        pos = d.pos
        parallelism = d.read_int()
        max_parallelism = d.read_int()
        if not (0 < max_parallelism <= MAX_KEY_GROUPS) or not (0 < parallelism <= max_parallelism):
            raise d.error(
                f"operator {uid or operator_id}: impossible parallelism {parallelism} / "
                f"max parallelism {max_parallelism}",
                pos,
            )
        coordinator = self._stream_handle()
        pos = d.pos
        n = d.read_int()
        if n == -1:
            return OperatorState(
                operator_id,
                name,
                uid,
                parallelism,
                max_parallelism,
                coordinator,
                fully_finished=True,
            )
        if n < 0 or n > parallelism:
            raise d.error(
                f"operator {uid or operator_id}: {n} subtask states at parallelism {parallelism}",
                pos,
            )
        subtasks: list[SubtaskState] = []
        finished: list[int] = []
        for _ in range(n):
            pos = d.pos
            enc = d.read_int()
            if enc < 0:
                index = -enc - 1
                if index >= parallelism:
                    raise d.error(
                        f"finished subtask index {index} >= parallelism {parallelism}", pos
                    )
                finished.append(index)
                continue
            if enc >= parallelism:
                raise d.error(f"subtask index {enc} >= parallelism {parallelism}", pos)
            subtasks.append(self._subtask_state(enc))
        return OperatorState(
            operator_id,
            name,
            uid,
            parallelism,
            max_parallelism,
            coordinator,
            tuple(sorted(subtasks, key=lambda s: s.index)),
            tuple(sorted(finished)),
        )

    def _subtask_state(self, index: int) -> SubtaskState:
        d = self.d
        managed_op = self._optional(self._operator_handle)
        raw_op = self._optional(self._operator_handle)
        managed_keyed = self._keyed_handle()
        raw_keyed = self._keyed_handle()
        n_in = self._channel_handles()
        n_out = self._channel_handles()
        del d
        return SubtaskState(index, managed_op, raw_op, managed_keyed, raw_keyed, n_in, n_out)

    def _optional(
        self, read: Callable[[], OperatorStreamHandle | None]
    ) -> OperatorStreamHandle | None:
        d = self.d
        pos = d.pos
        flag = d.read_int()
        if flag == 0:
            return None
        if flag != 1:
            raise d.error(f"expected a presence flag 0 or 1, got {flag}", pos)
        return read()

    # -- handles -------------------------------------------------------------------------------

    def _unknown(self, type_byte: int, where: str, pos: int) -> UnsupportedFormatError:
        return UnsupportedFormatError(
            f"{self.d.source} at byte {self.d.base_offset + pos}: unknown {where} handle type "
            f"{type_byte} (metadata version {self.version})"
        )

    def _stream_handle(self) -> StreamHandle | None:
        d = self.d
        pos = d.pos
        t = d.read_byte()
        if t == NULL_HANDLE:
            return None
        if t == BYTE_STREAM_STATE_HANDLE:
            name = d.read_utf()
            data = d.read_bytes(d.check_length(d.read_int(), "inline state length"))
            return ByteStreamHandle(name=name, data=data)
        if t == FILE_STREAM_STATE_HANDLE:
            size = d.read_long()
            path = d.read_utf()
            if size < 0:
                raise d.error(f"negative file size {size}", pos)
            return FileHandle(path=path, file_size=size)
        if t == RELATIVE_STREAM_STATE_HANDLE:
            path = d.read_utf()
            size = d.read_long()
            if size < 0:
                raise d.error(f"negative file size {size}", pos)
            return RelativeFileHandle(relative_path=path, file_size=size)
        if t == KEY_GROUPS_HANDLE:
            return self._key_groups_body(t, pos)
        if t == SEGMENT_FILE_HANDLE:
            start = d.read_long()
            size = d.read_long()
            scope = d.read_int()
            path = d.read_utf()
            logical = d.read_utf()
            if start < 0 or size < 0:
                raise d.error(f"negative segment bounds start={start} size={size}", pos)
            return SegmentHandle(
                physical_path=path,
                start=start,
                segment_size=size,
                scope=scope,
                logical_file_id=logical,
            )
        if t == EMPTY_SEGMENT_FILE_HANDLE:
            return EmptySegmentHandle()
        raise self._unknown(t, "stream state", pos)

    def _required_stream(self, what: str) -> StreamHandle:
        pos = self.d.pos
        h = self._stream_handle()
        if h is None:
            raise self.d.error(f"{what} has no stream handle", pos)
        return h

    def _key_group_range(self) -> tuple[int, int]:
        d = self.d
        pos = d.pos
        start = d.read_int()
        num = d.read_int()
        if start < 0 or num < 0 or start + num > MAX_KEY_GROUPS:
            raise d.error(f"impossible key-group range start={start} count={num}", pos)
        return start, num

    def _key_groups_body(self, t: int, pos: int) -> KeyGroupsHandle:
        d = self.d
        start, num = self._key_group_range()
        d.check_length(num, "key-group offset count", 8)
        offsets = tuple(d.read_long() for _ in range(num))
        delegate = self._required_stream("key-groups handle")
        handle_id = d.read_utf() if t == KEY_GROUPS_HANDLE_V2 else None
        return KeyGroupsHandle(
            start_key_group=start,
            num_key_groups=num,
            handle_type=t,
            offsets=offsets,
            delegate=delegate,
            handle_id=handle_id,
        )

    def _keyed_handle(self) -> KeyedHandle | None:
        d = self.d
        pos = d.pos
        t = d.read_byte()
        if t == NULL_HANDLE:
            return None
        if t in (KEY_GROUPS_HANDLE, KEY_GROUPS_HANDLE_V2, SAVEPOINT_KEY_GROUPS_HANDLE):
            return self._key_groups_body(t, pos)
        if t in (INCREMENTAL_KEY_GROUPS_HANDLE, INCREMENTAL_KEY_GROUPS_HANDLE_V2):
            checkpoint_id = d.read_long()
            backend_id = d.read_utf()
            start, num = self._key_group_range()
            checkpointed_size = d.read_long() if t == INCREMENTAL_KEY_GROUPS_HANDLE_V2 else 0
            meta = self._required_stream("incremental handle metadata")
            shared = self._named_streams("shared state")
            private = self._named_streams("private state")
            handle_id = d.read_utf() if t == INCREMENTAL_KEY_GROUPS_HANDLE_V2 else None
            return IncrementalHandle(
                start_key_group=start,
                num_key_groups=num,
                handle_type=t,
                checkpoint_id=checkpoint_id,
                backend_id=backend_id,
                checkpointed_size=checkpointed_size,
                meta=meta,
                shared=shared,
                private=private,
                handle_id=handle_id,
            )
        if t in (CHANGELOG_HANDLE, CHANGELOG_HANDLE_V2):
            # Flink nests a changelog handle's materialized and non-materialized parts one
            # level deep (key-groups, incremental and change-log stream handles), never another
            # changelog handle: the parser recursed once per level of such nesting
            if self._in_changelog_handle:
                raise d.error("a changelog state handle inside a changelog state handle", pos)
            start, num = self._key_group_range()
            checkpointed_size = d.read_long()
            self._in_changelog_handle = True
            try:
                materialized = self._keyed_list("materialized")
                non_materialized = self._keyed_list("non-materialized")
            finally:
                self._in_changelog_handle = False
            materialization_id = d.read_long()
            changelog_checkpoint_id = d.read_long() if t == CHANGELOG_HANDLE_V2 else None
            handle_id = d.read_utf()
            return ChangelogHandle(
                start_key_group=start,
                num_key_groups=num,
                handle_type=t,
                checkpointed_size=checkpointed_size,
                materialized=materialized,
                non_materialized=non_materialized,
                materialization_id=materialization_id,
                checkpoint_id=changelog_checkpoint_id,
                handle_id=handle_id,
            )
        if t in (CHANGELOG_FILE_INCREMENT_HANDLE, CHANGELOG_FILE_INCREMENT_HANDLE_V2):
            start, num = self._key_group_range()
            n = self._count("changelog stream", 9)
            streams = []
            for _ in range(n):
                offset = d.read_long()
                streams.append((self._required_stream("changelog stream"), offset))
            state_size = d.read_long()
            checkpointed_size = d.read_long()
            handle_id = d.read_utf()
            storage = d.read_utf() if t == CHANGELOG_FILE_INCREMENT_HANDLE_V2 else "filesystem"
            return ChangelogStreamHandle(
                start_key_group=start,
                num_key_groups=num,
                handle_type=t,
                streams=tuple(streams),
                state_size=state_size,
                checkpointed_size=checkpointed_size,
                handle_id=handle_id,
                storage_id=storage,
            )
        if t == CHANGELOG_BYTE_INCREMENT_HANDLE:
            start, num = self._key_group_range()
            seq_from = d.read_long()
            seq_to = d.read_long()
            n = self._count("inline state change", 8)
            changes = []
            for _ in range(n):
                kg = d.read_int()
                changes.append(
                    (kg, d.read_bytes(d.check_length(d.read_int(), "state change length")))
                )
            handle_id = d.read_utf()
            return InMemoryChangelogHandle(
                start_key_group=start,
                num_key_groups=num,
                sequence_from=seq_from,
                sequence_to=seq_to,
                changes=tuple(changes),
                handle_id=handle_id,
            )
        raise self._unknown(t, "keyed state", pos)

    def _keyed_list(self, what: str) -> tuple[KeyedHandle, ...]:
        out = []
        for _ in range(self._count(f"{what} handle", 1)):
            h = self._keyed_handle()
            if h is not None:
                out.append(h)
        return tuple(out)

    def _named_streams(self, what: str) -> tuple[tuple[str, StreamHandle], ...]:
        d = self.d
        out = []
        for _ in range(self._count(what, 3)):
            name = d.read_utf()
            out.append((name, self._required_stream(f"{what} {name}")))
        return tuple(out)

    def _operator_handle(self) -> OperatorStreamHandle | None:
        d = self.d
        pos = d.pos
        t = d.read_byte()
        if t == NULL_HANDLE:
            return None
        if t not in (
            PARTITIONABLE_OPERATOR_STATE_HANDLE,
            SEGMENT_PARTITIONABLE_OPERATOR_STATE_HANDLE,
        ):
            raise self._unknown(t, "operator state", pos)
        partitions = []
        for _ in range(self._count("operator state partition", 7)):
            name = d.read_utf()
            mpos = d.pos
            mode = d.read_byte()
            if not 0 <= mode < len(DISTRIBUTION_MODES):
                raise d.error(f"operator state {name!r}: unknown distribution mode {mode}", mpos)
            n = d.check_length(d.read_int(), "partition offset count", 8)
            offsets = tuple(d.read_long() for _ in range(n))
            partitions.append(OperatorStatePartition(name, DISTRIBUTION_MODES[mode], offsets))
        taskowned = shared = None
        is_empty = False
        if t == SEGMENT_PARTITIONABLE_OPERATOR_STATE_HANDLE:
            taskowned = d.read_utf()
            shared = d.read_utf()
            is_empty = d.read_bool()
        delegate = self._required_stream("operator state handle")
        return OperatorStreamHandle(
            handle_type=t,
            partitions=tuple(partitions),
            delegate=delegate,
            taskowned_dir=taskowned,
            shared_dir=shared,
            is_empty=is_empty,
        )

    # -- channel state (read past: in-flight buffers, not user state) ---------------------------

    def _channel_handles(self) -> int:
        d = self.d
        n = self._count("channel state handle", 5)
        for _ in range(n):
            if self.version >= 6:
                pos = d.pos
                t = d.read_byte()
                if t in (1, 2):
                    self._channel_handle_v1()
                elif t in (3, 4):
                    d.read_int()  # subtask index
                    d.read_long()  # state size
                    self._stream_handle()
                    d.skip(d.check_length(d.read_int(), "merged channel offsets length"))
                else:
                    raise self._unknown(t, "channel state", pos)
            else:
                self._channel_handle_v1()
        return n

    def _channel_handle_v1(self) -> None:
        d = self.d
        d.read_int()  # subtask index
        d.read_int()  # gate / partition index
        d.read_int()  # channel / subpartition index
        d.skip(8 * d.check_length(d.read_int(), "channel offset count", 8))
        d.read_long()  # state size
        self._stream_handle()


def _read_properties(d: Decoder) -> CheckpointProperties | None:
    """Best effort: the savepoint/checkpoint type and savepoint format from CheckpointProperties."""
    from statequery.serializers.logical_types import read_java_object

    try:
        obj = read_java_object(d, "Java-serialized CheckpointProperties")
    except CorruptStateError:
        return None  # trailing properties are informative only; the state is all read
    snapshot = getattr(obj, "checkpointType", None)
    cls = str(getattr(getattr(snapshot, "classdesc", None), "name", "") or "")
    name = getattr(snapshot, "name", None)
    if "SavepointType" in cls:
        fmt = getattr(getattr(snapshot, "formatType", None), "constant", None)
        return CheckpointProperties(
            "savepoint", str(fmt) if fmt else None, str(name) if name else None
        )
    if cls:
        return CheckpointProperties("checkpoint", None, str(name) if name else None)
    return None
