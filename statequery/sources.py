"""Where a job will resume reading: the splits of FLIP-27 sources, decoded into typed rows.

A FLIP-27 source operator keeps its readers' splits in the operator list state
``SourceReaderState``: one element per split, written by
``SimpleVersionedSerialization.writeVersionAndSerialize`` (``int32 version``, ``int32 length``,
then the bytes of the source's split serializer). The split serializer's class is not recorded
anywhere in the snapshot, so the source kind is given (``source=``) or recognised: a kind matches
when its layout decodes every split exactly, to the last byte, and only one kind does.

Kinds (Flink 2.3 split serializers):

* ``number_sequence``: ``NumberSequenceSource.SplitSerializer`` v1 (also DataGeneratorSource):
  ``writeUTF(splitId)``, ``long from`` (the next number: the position), ``long to``. Verified on
  real bytes.
* ``file``: ``FileSourceSplitSerializer`` v1: ``writeUTF(splitId)``, ``Path`` (bool, nullable
  scheme / user info / host, ``int port``, nullable path / query / fragment), ``long offset``,
  ``long length``, ``long fileModificationTime``, ``long fileSize``, hostnames (``int n`` +
  ``writeUTF``), ``bool`` + reader position (``long offset``, ``long recordsAfterOffset``).
  Verified on bytes written by the serializer itself (tests/fixtures/splits/golden.jsonl).
* ``fixture``: ``statequery.fixtures.FixtureSplitSerializer`` v1, the FLIP-27 source of the
  example job that wrote the shipped catalog (``examples/flink-jobs``, operator
  ``fixture-source``): ``writeUTF(splitId)``, ``long next`` (the next event number to emit:
  the position). Verified on the real bytes of the catalog's savepoints.
* ``kafka``: ``KafkaPartitionSplitSerializer`` v0 (flink-connector-kafka, not in the Flink
  runtime): ``writeUTF(topic)``, ``int partition``, ``long startingOffset``, ``long
  stoppingOffset``. Documented layout only.

See docs/sources.md for what was verified how.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from statequery.decoder import Decoder
from statequery.exceptions import CorruptStateError, InvalidOptionError, NoSuchStateError
from statequery.scan import read_table

if TYPE_CHECKING:
    from statequery.scan import StateSource

__all__ = [
    "SOURCE_KINDS",
    "SPLIT_STATE",
    "decode_enumerator",
    "decode_split",
    "source_enumerator",
    "source_splits",
]

SPLIT_STATE = "SourceReaderState"


@dataclass(frozen=True)
class _SplitKind:
    name: str
    serializer: str
    versions: tuple[int, ...]
    fields: tuple[tuple[str, pa.DataType], ...]
    decode: Callable[[Decoder], dict[str, Any]]


def _number_sequence(d: Decoder) -> dict[str, Any]:
    return {"split_id": d.read_utf(), "from": d.read_long(), "to": d.read_long()}


def _nullable_string(d: Decoder) -> str | None:
    return d.read_string_value() if d.read_bool() else None


def _file(d: Decoder) -> dict[str, Any]:
    split_id = d.read_utf()
    path = None
    if d.read_bool():
        scheme = _nullable_string(d)
        user = _nullable_string(d)
        host = _nullable_string(d)
        port = d.read_int()
        p = _nullable_string(d)
        query = _nullable_string(d)
        fragment = _nullable_string(d)
        path = ""
        if scheme:
            path += f"{scheme}:"
        if host is not None:
            path += "//" + (f"{user}@" if user else "") + host + (f":{port}" if port >= 0 else "")
        path += p or ""
        if query:
            path += f"?{query}"
        if fragment:
            path += f"#{fragment}"
    offset = d.read_long()
    length = d.read_long()
    mtime = d.read_long()
    size = d.read_long()
    n = d.check_length(d.read_int(), "hostnames", 2)
    hosts = [d.read_utf() for _ in range(n)]
    reader_offset = records_after = None
    if d.read_bool():
        reader_offset = d.read_long()
        records_after = d.read_long()
    return {
        "split_id": split_id, "path": path, "offset": offset, "length": length,
        "file_modification_time": mtime, "file_size": size, "hostnames": hosts,
        "reader_offset": reader_offset, "records_after_offset": records_after,
    }


def _fixture(d: Decoder) -> dict[str, Any]:
    return {"split_id": d.read_utf(), "next": d.read_long()}


def _kafka(d: Decoder) -> dict[str, Any]:
    return {"topic": d.read_utf(), "partition": d.read_int(),
            "starting_offset": d.read_long(), "stopping_offset": d.read_long()}


SOURCE_KINDS: dict[str, _SplitKind] = {
    k.name: k
    for k in (
        _SplitKind(
            "number_sequence",
            "org.apache.flink.api.connector.source.lib.NumberSequenceSource$SplitSerializer",
            (1,),
            (("split_id", pa.string()), ("from", pa.int64()), ("to", pa.int64())),
            _number_sequence,
        ),
        _SplitKind(
            "file",
            "org.apache.flink.connector.file.src.FileSourceSplitSerializer",
            (1,),
            (
                ("split_id", pa.string()), ("path", pa.string()), ("offset", pa.int64()),
                ("length", pa.int64()), ("file_modification_time", pa.int64()),
                ("file_size", pa.int64()), ("hostnames", pa.list_(pa.string())),
                ("reader_offset", pa.int64()), ("records_after_offset", pa.int64()),
            ),
            _file,
        ),
        _SplitKind(
            "fixture",
            "statequery.fixtures.FixtureSplitSerializer",
            (1,),
            (("split_id", pa.string()), ("next", pa.int64())),
            _fixture,
        ),
        _SplitKind(
            "kafka",
            "org.apache.flink.connector.kafka.source.split.KafkaPartitionSplitSerializer",
            (0,),
            (
                ("topic", pa.string()), ("partition", pa.int32()),
                ("starting_offset", pa.int64()), ("stopping_offset", pa.int64()),
            ),
            _kafka,
        ),
    )
}


def decode_split(data: bytes, kind: str, source: str = "split") -> tuple[int, dict[str, Any]]:
    """``(serializer version, fields)`` of one ``SourceReaderState`` element of source ``kind``.

    Raises :class:`CorruptStateError` (naming ``source``) when the bytes do not decode exactly.
    """
    sk = SOURCE_KINDS[kind]
    d = Decoder(data, source=source)
    version = d.read_int()
    length = d.read_int()
    if version not in sk.versions:
        raise d.error(f"{kind} split serializer version {version} (supported: {sk.versions})", 0)
    if length != d.remaining:
        raise d.error(f"split length {length}, {d.remaining} bytes follow", 4)
    fields = sk.decode(d)
    if not d.at_end():
        raise d.error(f"{d.remaining} bytes after the {kind} split", d.pos)
    return version, fields


def _recognise(values: list[bytes], where: str) -> str:
    fits = []
    for name in SOURCE_KINDS:
        try:
            for v in values:
                decode_split(v, name, where)
        except (CorruptStateError, ValueError, UnicodeDecodeError):
            continue
        fits.append(name)
    if len(fits) != 1:
        raise InvalidOptionError(
            f"{where}: cannot tell the source's split serializer from the bytes "
            f"({'several layouts fit: ' + ', '.join(fits) if fits else 'no known layout fits'}); "
            f"name it (statequery splits --source, or source=): one of {', '.join(SOURCE_KINDS)}"
        )
    return fits[0]


def source_splits(sp: StateSource, operator: str, source: str | None = None) -> pa.Table:
    """The splits of the FLIP-27 source ``operator`` (uid, name or id) as typed rows:
    ``subtask``, ``index``, ``source``, ``serializer_version``, then the source's fields (see the
    module table). ``source`` names the kind (``number_sequence``, ``file``, ``fixture``,
    ``kafka``); by default it is recognised from the bytes."""
    if source is not None and source not in SOURCE_KINDS:
        raise InvalidOptionError(
            f"unknown source kind {source!r}; known: {', '.join(SOURCE_KINDS)}"
        )
    op = sp.model.operator(operator)
    if op.state(SPLIT_STATE) is None:
        raise NoSuchStateError(
            f"operator {op.display_name!r} has no {SPLIT_STATE} state: not a FLIP-27 source"
        )
    raw = read_table(sp.model, sp.context, sp.model.state(op.operator_id, SPLIT_STATE))
    subtasks = raw.column("subtask").to_pylist()
    indexes = raw.column("index").to_pylist()
    values = [bytes(v) for v in raw.column("value").to_pylist()]
    where = f"{sp.model.location}: {op.display_name}/{SPLIT_STATE}"
    kind = source or (_recognise(values, where) if values else "number_sequence")
    sk = SOURCE_KINDS[kind]
    cols: dict[str, list[Any]] = {"subtask": [], "index": [], "source": [],
                                  "serializer_version": []}
    for name, _ in sk.fields:
        cols[name] = []
    for s, i, v in zip(subtasks, indexes, values, strict=True):
        version, fields = decode_split(v, kind, f"{where} (subtask {s}, element {i})")
        cols["subtask"].append(s)
        cols["index"].append(i)
        cols["source"].append(kind)
        cols["serializer_version"].append(version)
        for name, _ in sk.fields:
            cols[name].append(fields[name])
    schema = pa.schema(
        [("subtask", pa.int32()), ("index", pa.int32()), ("source", pa.string()),
         ("serializer_version", pa.int32()), *sk.fields]
    )
    return pa.Table.from_pydict(cols, schema=schema)


def decode_enumerator(data: bytes, source: str = "coordinator state") -> list[dict[str, Any]]:
    """The unassigned splits of a ``NumberSequenceSource`` (and ``DataGeneratorSource``)
    enumerator from its operator coordinator state: ``SourceCoordinator``'s ``int32`` serde
    version (1), ``int32`` serializer version (1), ``int32`` length, then
    ``NumberSequenceSource.CheckpointSerializer``: ``int32`` count and that many splits."""
    d = Decoder(data, source=source)
    serde = d.read_int()
    if serde != 1:
        raise d.error(f"source coordinator serde version {serde} (supported: 1)", 0)
    version = d.read_int()
    if version != 1:
        raise d.error(f"number sequence enumerator serializer version {version} (supported: 1)", 4)
    length = d.read_int()
    if length != d.remaining:
        raise d.error(f"enumerator state length {length}, {d.remaining} bytes follow", 8)
    n = d.check_length(d.read_int(), "splits", 18)
    splits = [_number_sequence(d) for _ in range(n)]
    if not d.at_end():
        raise d.error(f"{d.remaining} bytes after the enumerator state", d.pos)
    return splits


def source_enumerator(sp: StateSource, operator: str) -> pa.Table:
    """The splits a number sequence / data generator source's enumerator has not assigned yet
    (from the operator coordinator state in ``_metadata``): ``split_id``, ``from``, ``to``."""
    op = sp.model.operator(operator)
    handle = op.coordinator_state
    schema = pa.schema([("split_id", pa.string()), ("from", pa.int64()), ("to", pa.int64())])
    if handle is None:
        raise NoSuchStateError(f"operator {op.display_name!r} has no coordinator state")
    data = bytes(sp.context.resolver.read(handle, 0, None))
    splits = decode_enumerator(data, f"{sp.model.location}: {op.display_name} coordinator state")
    return pa.Table.from_pylist(splits, schema=schema)
