"""The StateMeta snapshot: everything statequery knows about a savepoint's states, in one file.

Deriving it reads ``_metadata`` and the header of every state file; the snapshot (a small,
versioned msgpack file, layout in ``docs/statemeta.md``) lets later opens skip the headers. It
records the ``_metadata`` file's size and SHA-256 and is used only when they still match.

The model:

* :class:`StateMeta` — one savepoint/checkpoint: id, metadata version, snapshot type, format,
  backend, ``_metadata`` fingerprint, operators;
* :class:`OperatorInfo` — one operator: ids, uid, name, parallelism, key serializer, subtasks,
  states;
* :class:`SubtaskInfo` — one subtask's handles (key-group range, keyed/operator handles) and what
  its headers said (compression, header end, state ids);
* :class:`~statequery.metadata.state.StateInfo` — one state: kind, key/namespace/value specs,
  TTL, decodability, size, the SQL-safe ``table_name`` (the one class describing a state, also
  what the header parsers and the decoders use).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack

from statequery.exceptions import CorruptStateError, StatequeryError
from statequery.hashing import KeyGroupRange
from statequery.io import FileIO
from statequery.metadata.handles import (
    KeyedHandle,
    OperatorStreamHandle,
    StreamHandle,
    handle_from_dict,
    handle_to_dict,
)
from statequery.metadata.runindex import RunIndex
from statequery.metadata.state import StateInfo, type_string
from statequery.serializers.spec import (
    SerializerSpec,
    from_dict,
    to_dict,
)

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "SNAPSHOT_FILE_NAME",
    "HeaderInfo",
    "JobInfo",
    "JobVertex",
    "KeptParts",
    "OperatorInfo",
    "StateInfo",
    "StateMeta",
    "dumps",
    "fingerprint",
    "kept_parts",
    "loads",
    "operator_label",
    "read_snapshot",
    "sql_identifier",
    "sql_name",
    "type_string",
    "write_snapshot",
]

MAGIC = "statequery-statemeta"
#: 2: RowData specs keep their stored field serializers; 3: checksummed body; 4: the optional
#: ``run_index`` section (statequery.metadata.runindex); 5: raw keyed state (heap timers of
#: RocksDB checkpoints, ``raw_keyed_header``, ``StateInfo.stream``) and raw state listed as such;
#: 6: ``HeaderInfo.layout`` (a type-12 stream's layout, from its bytes); 7: the rows SQL
#: operators keep show their RowKind (``RowDataSpec.row_kind``) and accumulators named from a
#: plan their current value (``RowDataSpec.derived``); 8: Avro values decoded from the writer
#: schema (``AvroSpec``, where 7 kept an opaque spec)
FORMAT_VERSION = 8
SNAPSHOT_FILE_NAME = "_statequery_meta.msgpack"
MAX_SNAPSHOT_BYTES = 256 << 20


@dataclass(frozen=True)
class HeaderInfo:
    """What one subtask's state-file header said (enough to read data without re-parsing it).

    ``state_ids`` maps state name → id in that header (the ``kvStateId`` of keyed data; operator
    and broadcast states are numbered in header order); ``header_end`` is where key-group data may
    start (None when unknown); ``error`` names the part of the header that could not be read.
    """

    version: int
    compressed: bool
    header_end: int | None
    state_ids: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    #: of a keyed key-groups stream whose handle cannot tell (type 12, every key group with an
    #: offset): "heap" or "canonical", as its bytes said when the header was read
    layout: str | None = None


@dataclass(frozen=True)
class SubtaskInfo:
    """One subtask: its handles and header facts. ``key_groups`` is None for non-keyed subtasks."""

    index: int
    key_groups: KeyGroupRange | None = None
    keyed_handle: KeyedHandle | None = None
    operator_handle: OperatorStreamHandle | None = None
    raw_keyed_handle: KeyedHandle | None = None
    raw_operator_handle: OperatorStreamHandle | None = None
    keyed_header: HeaderInfo | None = None
    operator_header: HeaderInfo | None = None
    keyed_bytes: int = 0
    operator_bytes: int = 0
    #: what the first key group of the raw keyed stream said (timer services' states)
    raw_keyed_header: HeaderInfo | None = None
    raw_keyed_bytes: int = 0
    raw_operator_bytes: int = 0


def operator_label(op: Any) -> str:
    """The one label of an operator (``OperatorInfo`` or ``_metadata``'s ``OperatorState``): its
    uid, else its name, else its OperatorID (hex)."""
    return str(op.uid or op.name or op.operator_id)


@dataclass(frozen=True)
class OperatorInfo:
    """One operator: identity, parallelism, its subtasks' handles and its states."""

    operator_id: str
    uid: str
    name: str
    parallelism: int
    max_parallelism: int
    key_spec: SerializerSpec | None = None
    backend: str | None = None
    coordinator_state: StreamHandle | None = None
    fully_finished: bool = False
    finished_subtasks: tuple[int, ...] = ()
    subtasks: tuple[SubtaskInfo, ...] = ()
    states: tuple[StateInfo, ...] = ()

    @property
    def display_name(self) -> str:
        return operator_label(self)

    def state(self, name: str) -> StateInfo | None:
        for s in self.states:
            if s.name == name:
                return s
        return None


@dataclass(frozen=True)
class JobVertex:
    """One vertex of the job graph (a chain of operators) as Flink's REST API described it.

    ``id`` is the JobVertexID, which is the OperatorID of the chain's head operator;
    ``description`` is the chain's description (``/jobs/:jobid/plan``): for SQL operators the
    planner's digest of each operator, e.g. ``[4]:GroupAggregate(groupBy=[category], ...)``,
    one per line (``<br/>``-separated).
    """

    id: str
    name: str
    parallelism: int = 0
    max_parallelism: int = 0
    description: str = ""
    inputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobInfo:
    """The job a snapshot was captured from (``statequery capture``, :mod:`statequery.capture`):
    the optional ``job`` section of the StateMeta snapshot."""

    job_id: str
    job_name: str
    captured_at: str  # ISO 8601, UTC
    rest_url: str = ""
    flink_version: str = ""
    max_parallelism: int = 0
    #: ``savepoint`` (taken by capture) or ``checkpoint`` (the latest completed one)
    trigger: str = "savepoint"
    #: where Flink reported the snapshot (``file:`` URIs as local paths)
    location: str = ""
    vertices: tuple[JobVertex, ...] = ()
    #: the cluster's state and checkpointing options (``/jobmanager/config``, a safe subset)
    config: dict[str, str] = field(default_factory=dict)
    #: ``/jobs/:jobid/config``'s execution config, ``/jobs/:jobid/checkpoints/config``
    execution_config: dict[str, str] = field(default_factory=dict)
    checkpoint_config: dict[str, str] = field(default_factory=dict)

    def vertex(self, vertex_id: str) -> JobVertex | None:
        for v in self.vertices:
            if v.id == vertex_id:
                return v
        return None

    def to_doc(self) -> dict[str, Any]:
        return {
            "version": 1,
            "job_id": self.job_id,
            "job_name": self.job_name,
            "captured_at": self.captured_at,
            "rest_url": self.rest_url,
            "flink_version": self.flink_version,
            "max_parallelism": self.max_parallelism,
            "trigger": self.trigger,
            "location": self.location,
            "vertices": [
                {"id": v.id, "name": v.name, "parallelism": v.parallelism,
                 "max_parallelism": v.max_parallelism, "description": v.description,
                 "inputs": list(v.inputs)}
                for v in self.vertices
            ],
            "config": dict(self.config),
            "execution_config": dict(self.execution_config),
            "checkpoint_config": dict(self.checkpoint_config),
        }

    @classmethod
    def from_doc(cls, d: Mapping[str, Any]) -> JobInfo:
        return cls(
            job_id=str(d["job_id"]),
            job_name=str(d["job_name"]),
            captured_at=str(d["captured_at"]),
            rest_url=str(d.get("rest_url", "")),
            flink_version=str(d.get("flink_version", "")),
            max_parallelism=int(d.get("max_parallelism", 0)),
            trigger=str(d.get("trigger", "savepoint")),
            location=str(d.get("location", "")),
            vertices=tuple(
                JobVertex(str(v["id"]), str(v["name"]), int(v.get("parallelism", 0)),
                          int(v.get("max_parallelism", 0)), str(v.get("description", "")),
                          tuple(str(i) for i in v.get("inputs", ())))
                for v in d.get("vertices", ())
            ),
            config={str(k): str(v) for k, v in d.get("config", {}).items()},
            execution_config={str(k): str(v) for k, v in d.get("execution_config", {}).items()},
            checkpoint_config={str(k): str(v)
                               for k, v in d.get("checkpoint_config", {}).items()},
        )


@dataclass(frozen=True)
class StateMeta:
    """The StateMeta snapshot of one savepoint or checkpoint."""

    checkpoint_id: int
    metadata_version: int
    snapshot_type: str  # savepoint | checkpoint
    format: str | None  # canonical | native (checkpoints: native); None when unknown
    backend: str | None  # hashmap | rocksdb | changelog | None (canonical: backend-independent)
    metadata_size: int
    metadata_sha256: str
    operators: tuple[OperatorInfo, ...] = ()
    statequery_version: str = ""
    #: A Flink SQL compiled plan (JSON text) attached with ``statequery snapshot --plan``: it names
    #: the RowData columns of the job's state (statequery.metadata.plan). The specs above stay as
    #: the headers say (``f0, f1, ...``); names are applied when the savepoint is opened.
    plan: str | None = None
    #: Where each state's run of entries lies in each key group of the canonical streams
    #: (``statequery snapshot --index``); None when the snapshot has no index.
    run_index: RunIndex | None = None
    #: The job this snapshot was captured from (``statequery capture``); None otherwise.
    job: JobInfo | None = None

    @property
    def states(self) -> tuple[StateInfo, ...]:
        return tuple(s for op in self.operators for s in op.states)

    def matches(self, metadata_bytes: bytes) -> bool:
        """Was this snapshot derived from exactly these ``_metadata`` bytes?"""
        size, digest = fingerprint(metadata_bytes)
        return size == self.metadata_size and digest == self.metadata_sha256


def fingerprint(metadata_bytes: bytes) -> tuple[int, str]:
    return len(metadata_bytes), hashlib.sha256(metadata_bytes).hexdigest()


_SQL_UNSAFE = re.compile(r"[^0-9a-zA-Z_]+")


def sql_name(text: str) -> str:
    """A lowercase SQL identifier: runs of other characters become one ``_``."""
    s = _SQL_UNSAFE.sub("_", text).strip("_").lower()
    return s or "unnamed"


def sql_identifier(text: str) -> str:
    """A lower-case SQL-safe identifier (database names, spellings of table names): runs of
    other characters become one ``_``."""
    ident = re.sub(r"[^0-9a-zA-Z]+", "_", text).strip("_").lower()
    if not ident:
        ident = "_"
    if ident[0].isdigit():
        ident = "_" + ident
    return ident


def assign_table_names(
    operators: Iterable[OperatorInfo], stems: dict[str, str] | None = None
) -> tuple[OperatorInfo, ...]:
    """Give each state a unique ``<operator uid|name|id>__<state>`` table name (``stems`` by
    operator id replace the operator part, e.g. ``10_group_aggregate`` from a compiled plan)."""
    ops = list(operators)
    taken: set[str] = set()
    out = []
    for op in ops:
        base = sql_name((stems or {}).get(op.operator_id) or operator_label(op))
        states = []
        for s in op.states:
            name = f"{base}__{sql_name(s.name)}"
            if name in taken:
                name = f"{name}__{op.operator_id[:8]}"
            n = 2
            candidate = name
            while candidate in taken:
                candidate = f"{name}_{n}"
                n += 1
            taken.add(candidate)
            states.append(replace(s, table_name=candidate))
        out.append(replace(op, states=tuple(states)))
    return tuple(out)


# -- msgpack -----------------------------------------------------------------------------------


def _spec(s: SerializerSpec | None) -> Any:
    return None if s is None else to_dict(s)


def _unspec(d: Any) -> SerializerSpec | None:
    return None if d is None else from_dict(d)


def _header_to(h: HeaderInfo | None) -> Any:
    if h is None:
        return None
    return {
        "version": h.version,
        "compressed": h.compressed,
        "header_end": h.header_end,
        "state_ids": dict(h.state_ids),
        "error": h.error,
        "layout": h.layout,
    }


def _header_from(d: Any) -> HeaderInfo | None:
    if d is None:
        return None
    return HeaderInfo(
        d["version"],
        d["compressed"],
        d["header_end"],
        dict(d["state_ids"]),
        d["error"],
        d.get("layout"),
    )


def _kg_to(r: KeyGroupRange | None) -> Any:
    return None if r is None else [r.start, r.end]


def _state_to(s: StateInfo) -> dict[str, Any]:
    return {
        "name": s.name,
        "kind": s.kind,
        "backend_type": s.backend_type,
        "key": _spec(s.key_spec),
        "namespace": _spec(s.namespace_spec),
        "value": _spec(s.value_spec),
        "user_key": _spec(s.user_key_spec),
        "serializers": {k: to_dict(v) for k, v in s.serializers.items()},
        "options": dict(s.options),
        "ttl": s.ttl,
        "decodable": s.decodable,
        "reason": s.reason,
        "size_bytes": s.size_bytes,
        "backend": s.backend,
        "format": s.format,
        "table_name": s.table_name,
        "stream": s.stream,
        **({"changes": s.changes} if s.changes is not None else {}),
    }


def _state_from(d: Mapping[str, Any], op: Mapping[str, Any]) -> StateInfo:
    return StateInfo(
        operator_id=op["operator_id"],
        operator_uid=op["uid"],
        operator_name=op["name"],
        parallelism=op["parallelism"],
        max_parallelism=op["max_parallelism"],
        name=d["name"],
        kind=d["kind"],
        backend_type=d["backend_type"],
        key_spec=_unspec(d["key"]),
        namespace_spec=_unspec(d["namespace"]),
        value_spec=_unspec(d["value"]),
        user_key_spec=_unspec(d["user_key"]),
        serializers={k: from_dict(v) for k, v in d["serializers"].items()},
        options=dict(d["options"]),
        decodable=d["decodable"],
        reason=d["reason"],
        size_bytes=d["size_bytes"],
        backend=d["backend"],
        format=d["format"],
        table_name=d["table_name"],
        stream=d["stream"],
        changes=d.get("changes"),
    )


def _subtask_to(s: SubtaskInfo) -> dict[str, Any]:
    return {
        "index": s.index,
        "key_groups": _kg_to(s.key_groups),
        "keyed": handle_to_dict(s.keyed_handle),
        "operator": handle_to_dict(s.operator_handle),
        "raw_keyed": handle_to_dict(s.raw_keyed_handle),
        "raw_operator": handle_to_dict(s.raw_operator_handle),
        "keyed_header": _header_to(s.keyed_header),
        "operator_header": _header_to(s.operator_header),
        "keyed_bytes": s.keyed_bytes,
        "operator_bytes": s.operator_bytes,
        "raw_keyed_header": _header_to(s.raw_keyed_header),
        "raw_keyed_bytes": s.raw_keyed_bytes,
        "raw_operator_bytes": s.raw_operator_bytes,
    }


def _subtask_from(d: Mapping[str, Any]) -> SubtaskInfo:
    kg = d["key_groups"]
    return SubtaskInfo(
        index=d["index"],
        key_groups=None if kg is None else KeyGroupRange(kg[0], kg[1]),
        keyed_handle=handle_from_dict(d["keyed"]),
        operator_handle=handle_from_dict(d["operator"]),
        raw_keyed_handle=handle_from_dict(d["raw_keyed"]),
        raw_operator_handle=handle_from_dict(d["raw_operator"]),
        keyed_header=_header_from(d["keyed_header"]),
        operator_header=_header_from(d["operator_header"]),
        keyed_bytes=d["keyed_bytes"],
        operator_bytes=d["operator_bytes"],
        raw_keyed_header=_header_from(d["raw_keyed_header"]),
        raw_keyed_bytes=d["raw_keyed_bytes"],
        raw_operator_bytes=d["raw_operator_bytes"],
    )


def _operator_to(op: OperatorInfo) -> dict[str, Any]:
    return {
        "operator_id": op.operator_id,
        "uid": op.uid,
        "name": op.name,
        "parallelism": op.parallelism,
        "max_parallelism": op.max_parallelism,
        "key": _spec(op.key_spec),
        "backend": op.backend,
        "coordinator_state": handle_to_dict(op.coordinator_state),
        "fully_finished": op.fully_finished,
        "finished_subtasks": list(op.finished_subtasks),
        "subtasks": [_subtask_to(s) for s in op.subtasks],
        "states": [_state_to(s) for s in op.states],
    }


def _operator_from(d: Mapping[str, Any]) -> OperatorInfo:
    return OperatorInfo(
        operator_id=d["operator_id"],
        uid=d["uid"],
        name=d["name"],
        parallelism=d["parallelism"],
        max_parallelism=d["max_parallelism"],
        key_spec=_unspec(d["key"]),
        backend=d["backend"],
        coordinator_state=handle_from_dict(d["coordinator_state"]),
        fully_finished=d["fully_finished"],
        finished_subtasks=tuple(d["finished_subtasks"]),
        subtasks=tuple(_subtask_from(s) for s in d["subtasks"]),
        states=tuple(_state_from(s, d) for s in d["states"]),
    )


def dumps(meta: StateMeta) -> bytes:
    """The snapshot bytes: a msgpack envelope ``{magic, format_version, sha256, body}`` whose
    ``body`` is the msgpack document and ``sha256`` its digest (see docs/statemeta.md)."""
    doc = {
        "statequery_version": meta.statequery_version,
        "metadata": {"size": meta.metadata_size, "sha256": meta.metadata_sha256},
        "checkpoint_id": meta.checkpoint_id,
        "metadata_version": meta.metadata_version,
        "snapshot_type": meta.snapshot_type,
        "format": meta.format,
        "backend": meta.backend,
        "operators": [_operator_to(op) for op in meta.operators],
        "plan": meta.plan,
    }
    if meta.run_index is not None:
        doc["run_index"] = meta.run_index.to_doc()
    if meta.job is not None:
        doc["job"] = meta.job.to_doc()
    body = msgpack.packb(doc, use_bin_type=True)
    envelope = {
        "magic": MAGIC,
        "format_version": FORMAT_VERSION,
        "sha256": hashlib.sha256(body).hexdigest(),
        "body": body,
    }
    return msgpack.packb(envelope, use_bin_type=True)  # type: ignore[no-any-return]


class SnapshotVersionError(StatequeryError):
    """A StateMeta snapshot written by an incompatible statequery (it is ignored, not an error
    for :meth:`Savepoint.open`)."""


def _envelope(data: bytes, source: str) -> dict[Any, Any]:
    if len(data) > MAX_SNAPSHOT_BYTES:
        raise CorruptStateError(f"{len(data)} bytes is too large for a StateMeta snapshot", source)
    try:
        envelope = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several unrelated types
        raise CorruptStateError(f"not a StateMeta snapshot: {e}", source) from e
    if not isinstance(envelope, dict) or envelope.get("magic") != MAGIC:
        raise CorruptStateError("not a StateMeta snapshot (no magic)", source)
    return envelope


def _body(envelope: Mapping[Any, Any], source: str) -> dict[Any, Any]:
    """The checksummed document of an envelope (format 3 and later)."""
    body, digest = envelope.get("body"), envelope.get("sha256")
    if not isinstance(body, bytes) or not isinstance(digest, str):
        raise CorruptStateError("StateMeta snapshot without a checksummed body", source)
    if hashlib.sha256(body).hexdigest() != digest.lower():
        raise CorruptStateError(
            "StateMeta snapshot checksum mismatch: its bytes changed after it was written", source
        )
    try:
        doc = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as e:
        raise CorruptStateError(f"StateMeta snapshot body is not msgpack: {e}", source) from e
    if not isinstance(doc, dict):
        raise CorruptStateError("StateMeta snapshot body is not a map", source)
    return doc


def loads(data: bytes, source: str = "StateMeta snapshot") -> StateMeta:
    """Parse snapshot bytes. Raises :class:`CorruptStateError` or :class:`SnapshotVersionError`."""
    envelope = _envelope(data, source)
    version = envelope.get("format_version")
    if version != FORMAT_VERSION:
        raise SnapshotVersionError(
            f"{source}: StateMeta snapshot format {version}, this statequery reads {FORMAT_VERSION}"
        )
    doc = _body(envelope, source)
    try:
        return StateMeta(
            checkpoint_id=doc["checkpoint_id"],
            metadata_version=doc["metadata_version"],
            snapshot_type=doc["snapshot_type"],
            format=doc["format"],
            backend=doc["backend"],
            metadata_size=doc["metadata"]["size"],
            metadata_sha256=doc["metadata"]["sha256"],
            operators=tuple(_operator_from(op) for op in doc["operators"]),
            statequery_version=doc.get("statequery_version", ""),
            plan=doc.get("plan"),
            run_index=(
                None
                if doc.get("run_index") is None
                else RunIndex.from_doc(doc["run_index"], source)
            ),
            job=_job_from(doc.get("job")),
        )
    except CorruptStateError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, RecursionError) as e:
        # RecursionError: the document's nesting (msgpack allows 1024 levels) drives the
        # recursion of serializers.spec.from_dict, one Python frame or two per level
        raise CorruptStateError(
            f"malformed StateMeta snapshot: {type(e).__name__}: {e}", source
        ) from e


def _job_from(d: Any) -> JobInfo | None:
    """The optional ``job`` section; a section of another ``version`` is dropped (the rest of
    the snapshot is used), a malformed one makes the snapshot malformed."""
    if d is None or (isinstance(d, dict) and d.get("version") != 1):
        return None
    if not isinstance(d, dict):
        raise TypeError("the job section is not a map")
    return JobInfo.from_doc(d)


@dataclass(frozen=True)
class KeptParts:
    """What a StateMeta snapshot holds that ``_metadata`` and the state-file headers cannot give
    back, kept when the model is derived again (a snapshot of an older format, or
    ``statequery snapshot`` rewriting one): the SQL plan attached with ``--plan`` and the job it
    was captured from (``statequery capture``). The run index is derivable (``--index``)."""

    format_version: int
    plan: str | None = None
    job: JobInfo | None = None


def kept_parts(
    data: bytes, metadata_bytes: bytes, source: str = "StateMeta snapshot"
) -> KeptParts | None:
    """The :class:`KeptParts` of snapshot bytes of this format or an older one (formats 1 and 2
    are the document itself, unchecksummed; 3 and later a checksummed body), when the snapshot
    was derived from exactly ``metadata_bytes``; None for a snapshot of another ``_metadata``
    or of a newer format (its layout is unknown). A damaged snapshot is a
    :class:`CorruptStateError`."""
    envelope = _envelope(data, source)
    version = envelope.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version > FORMAT_VERSION:
        return None
    doc = envelope if version <= 2 and "body" not in envelope else _body(envelope, source)
    try:
        recorded = doc["metadata"]
        if (recorded["size"], recorded["sha256"]) != fingerprint(metadata_bytes):
            return None
        plan = doc.get("plan")
        if plan is not None and not isinstance(plan, str):
            raise TypeError(f"the plan is a {type(plan).__name__}, not JSON text")
        return KeptParts(version, plan or None, _job_from(doc.get("job")))
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise CorruptStateError(
            f"malformed StateMeta snapshot (format {version}): {type(e).__name__}: {e}", source
        ) from e


def read_snapshot(io: FileIO, location: str) -> StateMeta:
    f = io.new_input(location)
    return loads(f.read(), f.location)


def write_snapshot(io: FileIO, location: str, meta: StateMeta) -> str:
    """Write the snapshot atomically (temporary file + rename); returns the location."""
    io.write_atomic(location, dumps(meta))
    return location
