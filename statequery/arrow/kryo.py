"""Kryo columns decoded with the job's classes: the Arrow side of
:mod:`statequery.serializers.kryo`.

Both decode paths (compiled and pure) give a Kryo-serialized ``key``, ``user_key`` or ``value``
as raw bytes with ``<column>_reason``. With a classpath (``statequery.open(path,
classpath=[...])``) whose classes type the values, :func:`kryo_schema` makes that column a
struct and adds ``<column>_raw`` after the reason; :func:`decode_kryo_columns` fills them: a
decoded row has the struct and null ``_reason``/``_raw``; a row the classes cannot explain keeps
its bytes in ``_raw`` with the reason, and a null struct. Without a classpath, or when the
classes cannot type the values at all, the column stays bytes and the reason says why.

What the read options carry (every task too) is one :class:`UserTypes`: the job's jars, whether
Kryo 2.24 wrote the values (Flink 1.x), and the Protobuf options (a ``FileDescriptorSet`` and the
``CLASS=proto.full.Name`` pairs); a Kryo class they map is a Protobuf message in chill-protobuf's
form (:mod:`statequery.serializers.protobuf`). Every classpath entry is a path, whatever it reads.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from statequery.exceptions import InvalidOptionError
from statequery.serializers.classfile import ClassPath
from statequery.serializers.kryo import KryoCodec, KryoRegistration, KryoUndecodable
from statequery.serializers.protobuf import ProtobufDescriptors, parse_messages
from statequery.serializers.spec import (
    CLASSPATH_HINT,
    PROTOBUF_HINT,
    OpaqueSpec,
    SerializerSpec,
)
from statequery.serializers.usertypes import UserTypes

__all__ = [
    "KRYO_COLUMNS",
    "UserTypes",
    "checked_classpath",
    "classpath_of",
    "decode_kryo_columns",
    "is_kryo",
    "kryo_codec",
    "kryo_schema",
    "user_types",
    "value_decoding",
]

#: the columns a Kryo value can fill by itself
KRYO_COLUMNS = ("key", "user_key", "value")

_lock = threading.Lock()
_classpaths: dict[tuple[str, ...], ClassPath] = {}
_codecs: dict[tuple[UserTypes, OpaqueSpec], KryoCodec] = {}
_descriptors: dict[tuple[str, tuple[tuple[str, str], ...]], ProtobufDescriptors] = {}


def _protobuf(types: UserTypes) -> ProtobufDescriptors | None:
    if types.protobuf_descriptors is None:
        return None
    key = (types.protobuf_descriptors, types.protobuf_messages)
    with _lock:
        found = _descriptors.get(key)
    if found is None:
        found = ProtobufDescriptors(types.protobuf_descriptors, dict(types.protobuf_messages))
        with _lock:
            found = _descriptors.setdefault(key, found)
    return found


def classpath_of(entries: Sequence[str | os.PathLike[str]] | str | None) -> tuple[str, ...]:
    """The classpath option as a tuple of absolute paths (a string: ``os.pathsep``/comma
    separated)."""
    if entries is None:
        return ()
    if isinstance(entries, str):
        parts = [p.strip() for chunk in entries.split(",") for p in chunk.split(os.pathsep)]
        return tuple(os.path.abspath(p) for p in parts if p)
    return tuple(os.path.abspath(os.fspath(p)) for p in entries)


def checked_classpath(entries: Sequence[str | os.PathLike[str]] | str | None) -> tuple[str, ...]:
    """:func:`classpath_of`, every entry opened (an
    :class:`~statequery.exceptions.InvalidOptionError` names one that is missing or no jar)."""
    out = classpath_of(entries)
    if out:
        _classpath(out)
    return out


def user_types(
    classpath: UserTypes | Sequence[str | os.PathLike[str]] | str | None,
    descriptors: str | os.PathLike[str] | None = None,
    messages: Mapping[str, str] | Sequence[str] | str | None = None,
) -> UserTypes:
    """The :class:`UserTypes` of the public options (``classpath=``; ``protobuf_descriptors=``:
    a ``FileDescriptorSet``; ``protobuf_messages=``: ``{CLASS: proto.full.Name}`` or
    ``CLASS=Name`` pairs), checked: an :class:`~statequery.exceptions.InvalidOptionError` names
    a missing jar, a missing or malformed file or pair. A :class:`UserTypes` ``classpath``
    keeps its jars and Protobuf options (those given here replace its own); ``kryo_2_24`` is
    the savepoint's to set."""
    if isinstance(classpath, UserTypes):
        base = UserTypes(classpath.jars, False, classpath.protobuf_descriptors,
                         classpath.protobuf_messages)
    else:
        base = UserTypes(checked_classpath(classpath))
    if descriptors is None:
        if messages:
            raise InvalidOptionError("protobuf_messages needs protobuf_descriptors")
        return base
    pairs = parse_messages(messages)
    out = UserTypes(base.jars, False, os.path.abspath(os.fspath(descriptors)),
                    tuple(sorted(pairs.items())))
    _protobuf(out)
    return out


def _classpath(entries: tuple[str, ...]) -> ClassPath:
    with _lock:
        cp = _classpaths.get(entries)
        if cp is None:
            cp = _classpaths[entries] = ClassPath(entries)
        return cp


def is_kryo(spec: SerializerSpec | None) -> bool:
    """Whether ``spec`` is Flink's KryoSerializer (naming its value class)."""
    return isinstance(spec, OpaqueSpec) and spec.family == "kryo" and bool(spec.type_class)


def kryo_codec(spec: SerializerSpec | None, classpath: UserTypes) -> KryoCodec | None:
    """The codec of a Kryo serializer spec with ``classpath`` (None: not Kryo, or no classpath)."""
    if not classpath or not is_kryo(spec):
        return None
    assert isinstance(spec, OpaqueSpec) and spec.type_class
    key = (classpath, spec)
    with _lock:
        codec = _codecs.get(key)
    if codec is None:
        codec = KryoCodec(
            _classpath(classpath.jars), spec.type_class,
            tuple(KryoRegistration(n, bool(c)) for n, c in spec.kryo_registrations),
            spec.kryo_default_serializers, kryo_version=2 if classpath.kryo_2_24 else 5,
            protobuf=_protobuf(classpath),
        )
        with _lock:
            codec = _codecs.setdefault(key, codec)
    return codec


def _typed(
    spec: SerializerSpec | None, classpath: UserTypes
) -> tuple[KryoCodec, pa.DataType] | str | None:
    """``(codec, type)`` when the classes type the values, the reason when they do not, None
    when ``spec`` is not Kryo or there is no classpath."""
    codec = kryo_codec(spec, classpath)
    if codec is None:
        return None
    assert isinstance(spec, OpaqueSpec)
    if not spec.kryo_registrations:  # Flink always registers the type class first
        return ("the serializer's Kryo registrations are unknown (a StateMeta snapshot written "
                "before statequery decoded Kryo: write it again with `statequery snapshot`, or "
                "open with use_snapshot=False)")
    try:
        return codec, codec.arrow_type()
    except KryoUndecodable as e:
        return str(e)


def _specs(layout: Any) -> dict[str, SerializerSpec | None]:
    return {"key": layout.key, "user_key": layout.user_key, "value": layout.value}


def _is_list(layout: Any, name: str) -> bool:
    """A list state's ``value`` column: its elements joined (``,`` between two)."""
    return name == "value" and getattr(layout, "kind", None) == "list"


def kryo_schema(schema: pa.Schema, layout: Any, classpath: UserTypes) -> pa.Schema:
    """``schema`` with the Kryo columns the classes type as structs (and ``<column>_raw``)."""
    if not classpath:
        return schema
    for name, spec in _specs(layout).items():
        if name not in schema.names or f"{name}_reason" not in schema.names:
            continue
        typed = _typed(spec, classpath)
        if not isinstance(typed, tuple):
            continue
        i = schema.get_field_index(name)
        old = schema.field(i)
        if not pa.types.is_binary(old.type):
            continue
        meta = dict(old.metadata or {})
        meta[b"statequery.decoding"] = _decoding(typed[0]).encode()
        typ = pa.list_(typed[1]) if _is_list(layout, name) else typed[1]
        schema = schema.set(i, pa.field(name, typ, metadata=meta))
        j = schema.get_field_index(f"{name}_reason")
        schema = schema.insert(j + 1, pa.field(f"{name}_raw", pa.binary()))
    return schema


def _column(codec: KryoCodec, typ: pa.DataType, raw: list[bytes | None],
            reason: str, elements: bool | str = False) -> tuple[pa.Array, pa.Array, pa.Array]:
    """The decoded column, its reasons and raw bytes. ``elements``: each value is a list
    state's joined elements (True), or a reason why such values cannot be split here."""
    values: list[Any] = []
    reasons: list[str | None] = []
    for data in raw:
        if data is None:
            values.append(None)
            reasons.append(None)
            continue
        try:
            if isinstance(elements, str):
                raise KryoUndecodable(elements)
            values.append(codec.decode_delimited(data) if elements else codec.decode(data))
            reasons.append(None)
        except KryoUndecodable as e:
            values.append(None)
            reasons.append(f"{reason}; with the classpath: {e}")
        except RecursionError:
            values.append(None)
            reasons.append(f"{reason}; with the classpath: nested too deeply")
    try:
        arr = pa.array(values, type=typ)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        arr = None
    if arr is None:  # find the rows Arrow cannot hold (e.g. an Instant out of range)
        for i, v in enumerate(values):
            if v is None:
                continue
            try:
                pa.array([v], type=typ)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
                values[i] = None
                reasons[i] = f"{reason}; with the classpath: no {typ} for the value ({e})"
        arr = pa.array(values, type=typ)
    raw_out = [None if r is None else data for r, data in zip(reasons, raw, strict=True)]
    return arr, pa.array(reasons, pa.string()), pa.array(raw_out, pa.binary())


def decode_kryo_columns(
    batch: pa.RecordBatch, layout: Any, classpath: UserTypes, schema: pa.Schema,
    heap_lists: bool = False,
) -> pa.RecordBatch:
    """``batch`` (read with the bytes columns) in ``schema`` (:func:`kryo_schema`): its Kryo
    columns decoded. ``heap_lists``: the stream is the hashmap backend's own layout, whose list
    values are not joined by delimiters (they stay raw)."""
    if schema.names == batch.schema.names:
        return batch
    columns: dict[str, pa.Array] = {n: batch.column(n) for n in batch.schema.names}
    for name, spec in _specs(layout).items():
        if f"{name}_raw" not in schema.names or name not in columns:
            continue
        typed = _typed(spec, classpath)
        if not isinstance(typed, tuple):
            continue
        codec, typ = typed
        reasons = columns[f"{name}_reason"].to_pylist()
        reason = next((r for r in reasons if r), "Kryo")
        elements: bool | str = False
        if _is_list(layout, name):
            typ = pa.list_(typ)
            elements = ("a list state in the hashmap backend's own layout: its Kryo elements "
                        "are not split") if heap_lists else True
        arr, why, raw = _column(codec, typ, columns[name].to_pylist(), reason, elements)
        columns[name] = arr
        columns[f"{name}_reason"] = why
        columns[f"{name}_raw"] = raw
    return pa.RecordBatch.from_arrays([columns[f.name] for f in schema], schema=schema)


def value_decoding(
    spec: SerializerSpec | None, classpath: UserTypes
) -> tuple[str, str | None]:
    """``state_meta``'s ``value_decoding`` and ``value_decoding_hint`` of a Kryo value:
    ``kryo-classpath`` when the classes type it; else ``raw`` with what to supply."""
    typed = _typed(spec, classpath)
    if isinstance(typed, tuple):
        return _decoding(typed[0]), None
    assert isinstance(spec, OpaqueSpec)
    own = any(n == spec.type_class and c for n, c in spec.kryo_registrations)
    if own and classpath.protobuf_descriptors is None:
        return "raw", (f"it has its own Kryo serializer: if a Protobuf message (chill-protobuf), "
                       f"pass {PROTOBUF_HINT}")
    if typed is None:
        return "raw", f"pass {CLASSPATH_HINT}"
    return "raw", f"the classpath does not explain the values ({typed}): pass {CLASSPATH_HINT}"


def _decoding(codec: KryoCodec) -> str:
    """``protobuf`` when the type class is a Protobuf message, else ``kryo-classpath``."""
    return "protobuf" if codec.protobuf_codec(codec.type_class) is not None else "kryo-classpath"
