"""Protobuf messages in Kryo state decoded with the job's descriptor set, without a JVM.

A job keeps Protobuf messages in state through Kryo with chill-protobuf's ``ProtobufSerializer``
(or a serializer of the same form) registered for the message class: the message's length
(Kryo's ``writeInt(length, true)``, a varint) then the message's bytes (``toByteArray()``).

:class:`ProtobufDescriptors` reads a ``FileDescriptorSet`` (``protoc --include_imports
--descriptor_set_out=descriptors.pb``) and maps Java class names to messages: the class protoc
generates for a message is ``java_package`` (else the proto package) + ``.`` + the message name
with ``java_multiple_files``, else ``java_package.Outer$Name`` (``Outer``: ``java_outer_classname``,
else the file name in CamelCase); nested messages are ``Parent$Child``. Explicit
``CLASS=proto.full.Name`` pairs take precedence. :class:`ProtobufCodec` gives a message's Arrow
type (a struct with the proto field names, every field nullable) and decodes its bytes with
Python's ``protobuf`` (dynamic message classes from the descriptor pool): scalars, strings,
bytes, enums as their names, nested messages, repeated fields as lists, maps as Arrow maps
(sorted by key), oneofs as their members (the unset ones null), ``google.protobuf.Timestamp`` as a
UTC timestamp. Fields the descriptor does not know (another message's bytes, or a newer
writer's) leave the value raw. Fields without presence (proto3 scalars) hold their value, the
default when unset; fields with presence (messages, oneof members, ``optional``) are null when
unset. Bytes that do not parse, a length prefix that does not match, an enum number the
descriptor does not name: :class:`ProtobufUndecodable` with the reason (the value stays raw).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from statequery.exceptions import InvalidOptionError

if TYPE_CHECKING:
    from google.protobuf.descriptor import Descriptor, FieldDescriptor
    from google.protobuf.message import Message

__all__ = ["ProtobufCodec", "ProtobufDescriptors", "ProtobufUndecodable"]

#: deepest nesting of messages decoded
MAX_DEPTH = 64
_TIMESTAMP = "google.protobuf.Timestamp"
_NAME = re.compile(r"[A-Za-z_][\w$]*(\.[A-Za-z_][\w$]*)*")


def _repeated(f: FieldDescriptor) -> bool:
    """Whether field ``f`` is repeated (``is_repeated`` since protobuf 5.29; ``label`` before)."""
    flag = getattr(f, "is_repeated", None)
    if flag is not None:
        return bool(flag)
    return bool(f.label == f.LABEL_REPEATED)


class ProtobufUndecodable(Exception):
    """A message the descriptors do not explain; ``str(e)`` is the reason."""


def _camel(file_name: str) -> str:
    """protoc's default outer class name of a ``.proto`` file."""
    base = os.path.basename(file_name)
    if base.endswith(".proto"):
        base = base[: -len(".proto")]
    out, upper = [], True
    for ch in base:
        if ch.isalnum():
            out.append(ch.upper() if upper else ch)
            upper = ch.isdigit()
        else:
            upper = True
    return "".join(out)


class ProtobufDescriptors:
    """A descriptor set's messages by the Java class names protoc gives them."""

    def __init__(self, path: str, messages: Mapping[str, str] | None = None) -> None:
        try:
            from google.protobuf import descriptor_pb2, descriptor_pool
        except ImportError:
            raise InvalidOptionError(
                "protobuf_descriptors needs Python's protobuf package (pip install "
                "'statequery[protobuf]')") from None
        from google.protobuf.message import DecodeError

        self.path = path
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise InvalidOptionError(f"protobuf descriptors {path!r}: {e}") from None
        fds = descriptor_pb2.FileDescriptorSet()
        try:
            fds.ParseFromString(data)
        except DecodeError as e:
            raise InvalidOptionError(
                f"protobuf descriptors {path!r} is not a FileDescriptorSet: {e}") from None
        if not fds.file:
            raise InvalidOptionError(f"protobuf descriptors {path!r} holds no file")
        self.pool = descriptor_pool.DescriptorPool()
        for fdp in fds.file:
            try:
                self.pool.Add(fdp)
            except (TypeError, ValueError) as e:
                raise InvalidOptionError(
                    f"protobuf descriptors {path!r}: file {fdp.name}: {e}") from None
        #: Java class name -> message full name
        self.classes: dict[str, str] = {}
        for fdp in fds.file:
            pkg = fdp.options.java_package or fdp.package
            prefix = f"{pkg}." if pkg else ""
            if not fdp.options.java_multiple_files:
                outer = fdp.options.java_outer_classname or _camel(fdp.name)
                prefix = f"{prefix}{outer}$"
            proto_prefix = f"{fdp.package}." if fdp.package else ""
            stack = [(m, prefix + m.name, proto_prefix + m.name) for m in fdp.message_type]
            while stack:
                m, java, full = stack.pop()
                self.classes.setdefault(java, full)
                stack.extend((n, f"{java}${n.name}", f"{full}.{n.name}") for n in m.nested_type)
        for cls, full in (messages or {}).items():
            try:
                self.pool.FindMessageTypeByName(full)
            except KeyError:
                raise InvalidOptionError(
                    f"protobuf message {cls}={full}: no message {full} in {path!r}") from None
            self.classes[cls] = full
        self._codecs: dict[str, ProtobufCodec] = {}
        self._lock = threading.Lock()

    def codec(self, class_name: str) -> ProtobufCodec | None:
        """The codec of the message of Java class ``class_name``, None when not mapped."""
        full = self.classes.get(class_name)
        if full is None:
            return None
        with self._lock:
            codec = self._codecs.get(full)
            if codec is None:
                codec = self._codecs[full] = ProtobufCodec(self.pool.FindMessageTypeByName(full))
            return codec


def parse_messages(pairs: Any) -> dict[str, str]:
    """``CLASS=proto.full.Name`` pairs (a mapping, a string of comma-separated pairs, or a
    sequence of pairs) as a dict; an :class:`InvalidOptionError` names a malformed one."""
    if pairs is None:
        return {}
    if isinstance(pairs, Mapping):
        items = [(str(k), str(v)) for k, v in pairs.items()]
    else:
        texts = pairs.split(",") if isinstance(pairs, str) else list(pairs)
        items = []
        for text in texts:
            cls, sep, full = str(text).strip().partition("=")
            if not sep:
                raise InvalidOptionError(
                    f"protobuf message {text!r}: expected CLASS=proto.full.Name")
            items.append((cls.strip(), full.strip()))
    for cls, full in items:
        if not _NAME.fullmatch(cls) or not _NAME.fullmatch(full):
            raise InvalidOptionError(
                f"protobuf message {cls}={full}: expected CLASS=proto.full.Name")
    return dict(items)


class ProtobufCodec:
    """One message type: its Arrow type and its values."""

    def __init__(self, descriptor: Descriptor) -> None:
        from google.protobuf import message_factory

        self.descriptor = descriptor
        self.message_class = message_factory.GetMessageClass(descriptor)
        self._type: pa.DataType | None = None
        self._error: str | None = None

    # -- types -------------------------------------------------------------------------------

    def arrow_type(self) -> pa.DataType:
        """The struct of the message's fields; :class:`ProtobufUndecodable` for a recursive
        message (Arrow types are finite)."""
        if self._type is None and self._error is None:
            try:
                self._type = self._struct(self.descriptor, ())
            except ProtobufUndecodable as e:
                self._error = str(e)
        if self._error is not None:
            raise ProtobufUndecodable(self._error)
        assert self._type is not None
        return self._type

    def _struct(self, d: Descriptor, stack: tuple[str, ...]) -> pa.DataType:
        if d.full_name in stack:
            raise ProtobufUndecodable(f"message {d.full_name} contains itself (a recursive type)")
        if len(stack) > MAX_DEPTH:
            raise ProtobufUndecodable(f"message {d.full_name} nested deeper than {MAX_DEPTH}")
        return pa.struct([pa.field(f.name, self._field_type(f, (*stack, d.full_name)))
                          for f in d.fields])

    def _field_type(self, f: FieldDescriptor, stack: tuple[str, ...]) -> pa.DataType:

        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            k, v = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            return pa.map_(self._single_type(k, stack), self._single_type(v, stack))
        single = self._single_type(f, stack)
        return pa.list_(single) if _repeated(f) else single

    def _single_type(self, f: FieldDescriptor, stack: tuple[str, ...]) -> pa.DataType:
        from google.protobuf.descriptor import FieldDescriptor as FD

        t = f.type
        if t in (FD.TYPE_MESSAGE, FD.TYPE_GROUP):
            if f.message_type.full_name == _TIMESTAMP:
                return pa.timestamp("ns", tz="UTC")
            return self._struct(f.message_type, stack)
        if t == FD.TYPE_ENUM or t == FD.TYPE_STRING:
            return pa.string()
        if t == FD.TYPE_BYTES:
            return pa.binary()
        if t == FD.TYPE_BOOL:
            return pa.bool_()
        if t == FD.TYPE_FLOAT:
            return pa.float32()
        if t == FD.TYPE_DOUBLE:
            return pa.float64()
        if t in (FD.TYPE_INT32, FD.TYPE_SINT32, FD.TYPE_SFIXED32):
            return pa.int32()
        if t in (FD.TYPE_UINT32, FD.TYPE_FIXED32):
            return pa.uint32()
        if t in (FD.TYPE_INT64, FD.TYPE_SINT64, FD.TYPE_SFIXED64):
            return pa.int64()
        if t in (FD.TYPE_UINT64, FD.TYPE_FIXED64):
            return pa.uint64()
        raise ProtobufUndecodable(f"field {f.full_name}: no Arrow type for protobuf type {t}")

    # -- values ------------------------------------------------------------------------------

    def parse(self, data: bytes) -> Any:
        """The message of ``data`` as Python data shaped like :meth:`arrow_type`."""
        from google.protobuf.message import DecodeError

        self.arrow_type()
        msg = self.message_class()
        try:
            msg.ParseFromString(data)
        except (DecodeError, RuntimeError, ValueError) as e:
            raise ProtobufUndecodable(
                f"{len(data)} bytes are no {self.descriptor.full_name} message: {e}") from None
        size = msg.ByteSize()
        msg.DiscardUnknownFields()
        if msg.ByteSize() != size:  # another message's bytes, or a newer writer's
            raise ProtobufUndecodable(
                f"the bytes hold fields {self.descriptor.full_name} does not know (another "
                f"message, or a newer version of it)")
        return self._message(msg, 0)

    def _message(self, msg: Message, depth: int) -> dict[str, Any]:

        if depth > MAX_DEPTH:
            raise ProtobufUndecodable(f"message nested deeper than {MAX_DEPTH}")
        out: dict[str, Any] = {}
        for f in msg.DESCRIPTOR.fields:
            value = getattr(msg, f.name)
            if f.message_type is not None and f.message_type.GetOptions().map_entry:
                vf = f.message_type.fields_by_name["value"]
                out[f.name] = [(k, self._single(vf, value[k], depth))
                               for k in sorted(value.keys())]
            elif _repeated(f):
                out[f.name] = [self._single(f, v, depth) for v in value]
            elif f.has_presence and not msg.HasField(f.name):
                out[f.name] = None
            else:
                out[f.name] = self._single(f, value, depth)
        return out

    def _single(self, f: FieldDescriptor, value: Any, depth: int) -> Any:
        from google.protobuf.descriptor import FieldDescriptor as FD

        if f.type in (FD.TYPE_MESSAGE, FD.TYPE_GROUP):
            if f.message_type.full_name == _TIMESTAMP:
                return value.seconds * 1_000_000_000 + value.nanos
            return self._message(value, depth + 1)
        if f.type == FD.TYPE_ENUM:
            named = f.enum_type.values_by_number.get(value)
            if named is None:
                raise ProtobufUndecodable(
                    f"field {f.full_name}: enum {f.enum_type.full_name} has no value {value}")
            return named.name
        return value

    def decode_body(self, data: bytes, pos: int, end: int) -> tuple[Any, int]:
        """chill-protobuf's form at ``pos``: a varint length then the message's bytes; returns
        the message and the offset after it."""
        length = 0
        shift = 0
        while True:
            if pos >= end:
                raise ProtobufUndecodable("the message's length prefix runs past the bytes")
            b = data[pos]
            pos += 1
            length |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift > 28:
                raise ProtobufUndecodable("the message's length prefix is no varint")
        length &= 0xFFFFFFFF
        if length >= 1 << 31:
            raise ProtobufUndecodable(f"negative message length {length - (1 << 32)}")
        if length > end - pos:
            raise ProtobufUndecodable(
                f"message length {length} exceeds the {end - pos} bytes left")
        return self.parse(bytes(data[pos:pos + length])), pos + length
