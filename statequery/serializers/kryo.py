"""Kryo values decoded with the job's classes, without a JVM (Flink 2.x: Kryo 5; Flink 1.x:
Kryo 2.24).

Flink's ``KryoSerializer`` writes a value with ``kryo.writeClassAndObject`` on a Kryo with
reference tracking on, registration not required, and these registrations: Java's primitives and
``String`` (ids 0..8, the boxed types share their primitive's id), Flink's chill registrations
(73..84) and the ``KryoSerializerSnapshot``'s registrations from 85 on, in order. A class that is
not registered is written by name (``1``, a name id, the name the first time). A user class is
written by ``FieldSerializer``: every non-static, non-transient field of the class and its
superclasses, sorted by name; a field whose declared class is final (primitives, ``String``,
boxed types, final classes, enums without bodies, arrays of those) has no class written, the
others have theirs. Reference markers (``0`` null, ``1`` a new object, ``id + 2`` an object seen
before) precede every object whose class is tracked (all but boxed types and enums).

:class:`KryoCodec` holds the job's :class:`~statequery.serializers.classfile.ClassPath` and one
snapshot's registrations; :meth:`KryoCodec.arrow_type` derives the Arrow type of the values from
the classes (a struct per class with Java's field names; a field of an interface or abstract
type is ``struct<class, Impl1, Impl2...>`` over the implementations the classpath holds);
:meth:`KryoCodec.decode` reads one value. Anything the classes do not explain (a class missing
from the classpath, a custom Kryo serializer, a JDK class without a decoder here, a cyclic
reference, bytes left over or missing) raises :class:`KryoUndecodable` with the reason: the value
then stays raw bytes. Reading is bounded: nesting depth, and every length checked against the
bytes left.

Flink 1.x's ``KryoSerializer`` is Kryo 2.24.0 (``KryoCodec(..., kryo_version=2)``), configured
alike (references on, the type class registered first at id 85: Flink 1.x's chill Scala
registrations fill 10..72 and its chill registrations 73..84). FieldSerializer's layout is the
same (fields sorted by name, class written unless the declared class is final, ``int``/``long``
zig-zag varints, ``writeString``'s encoding). What differs from Kryo 5:

* fixed widths (``short``, ``char``, ``float``, ``double``, their arrays and boxed forms) are
  big-endian;
* references track enums too (``MapReferenceResolver.useReferences``: all but the eight
  wrappers), so an enum constant has a reference marker and may be a back reference;
* ``CollectionSerializer`` and ``MapSerializer`` write the plain size (``writeVarInt(size,
  true)``, no ``size + 1`` / null form); their elements, as in Kryo 5, without a class when the
  declared type argument is final (``writeObjectOrNull``), else ``writeClassAndObject``;
* ``java.time`` has no serializer: FieldSerializer writes the JDK class's own fields (``Instant``
  and ``Duration``: ``nanos``, ``seconds``; ``LocalDate``: ``day``, ``month`` shorts, ``year``;
  ``LocalTime``: ``hour``, ``minute``, ``nano``, ``second``; ``LocalDateTime``: ``date``,
  ``time`` with their reference markers), the same from JDK 8 to 21.
"""

from __future__ import annotations

import re
import struct
import threading
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from statequery.exceptions import StatequeryError
from statequery.serializers.classfile import ClassInfo, ClassPath, JType, parse_descriptor
from statequery.serializers.protobuf import ProtobufCodec, ProtobufDescriptors, ProtobufUndecodable
from statequery.serializers.spec import PROTOBUF_HINT

__all__ = [
    "KryoCodec",
    "KryoRegistration",
    "KryoUndecodable",
    "KRYO_VERSIONS",
    "MAX_DEPTH",
]

#: the Kryo generations Flink wrote with: 5 (Flink 2.x), 2 (Kryo 2.24.0, Flink 1.x)
KRYO_VERSIONS = (5, 2)

#: deepest nesting of objects, collections and arrays decoded
MAX_DEPTH = 64

_BOXED = {
    "java.lang.Integer": "int", "java.lang.Long": "long", "java.lang.Short": "short",
    "java.lang.Byte": "byte", "java.lang.Boolean": "boolean", "java.lang.Character": "char",
    "java.lang.Float": "float", "java.lang.Double": "double",
}
_PRIMITIVE_ARROW = {
    "int": pa.int32(), "long": pa.int64(), "short": pa.int16(), "byte": pa.int8(),
    "boolean": pa.bool_(), "char": pa.string(), "float": pa.float32(), "double": pa.float64(),
}
_TIME_ARROW = {
    "java.time.Instant": pa.timestamp("ns", tz="UTC"),
    "java.time.LocalDate": pa.date32(),
    "java.time.LocalDateTime": pa.timestamp("ns"),
    "java.time.LocalTime": pa.time64("ns"),
    "java.time.Duration": pa.duration("ns"),
}
_COLLECTIONS = frozenset({
    "java.util.ArrayList", "java.util.LinkedList", "java.util.HashSet", "java.util.LinkedHashSet",
    "java.util.ArrayDeque", "java.util.Vector", "java.util.concurrent.CopyOnWriteArrayList",
})
_COLLECTION_TYPES = _COLLECTIONS | {
    "java.util.List", "java.util.Collection", "java.util.Set", "java.lang.Iterable",
    "java.util.Queue", "java.util.Deque",
}
_MAPS = frozenset({
    "java.util.HashMap", "java.util.LinkedHashMap", "java.util.concurrent.ConcurrentHashMap",
    "java.util.Hashtable",
})
_MAP_TYPES = _MAPS | {"java.util.Map", "java.util.concurrent.ConcurrentMap"}
#: JDK classes whose finality decides whether Kryo writes their class (Kryo.isFinal)
_JDK_FINAL = frozenset({"java.lang.String", *_BOXED, *_TIME_ARROW, "java.util.UUID"})

#: Kryo 5's default registrations (Kryo's constructor) and Flink's chill registrations
#: (FlinkChillPackageRegistrar, ids 73..84); the job's registrations follow from 85
_BUILTIN_IDS: dict[int, str] = {
    0: "int", 1: "java.lang.String", 2: "float", 3: "boolean", 4: "byte", 5: "char",
    6: "short", 7: "long", 8: "double",
    73: "java.util.Arrays$ArrayList", 74: "java.util.BitSet", 75: "java.util.PriorityQueue",
    76: "java.util.regex.Pattern", 77: "java.sql.Date", 78: "java.sql.Time",
    79: "java.sql.Timestamp", 80: "java.net.URI", 81: "java.net.InetSocketAddress",
    82: "java.util.UUID", 83: "java.util.Locale", 84: "java.text.SimpleDateFormat",
}
_PRIMITIVE_WRAPPER = {v: k for k, v in _BOXED.items()}

_FIRST_USER_ID = 85
#: interfaces whose classes Kryo writes with a default serializer of its own, not FieldSerializer
#: (``addDefaultSerializer`` matches subclasses and implementations)
_DEFAULT_SERIALIZED = frozenset({
    "java.util.Collection", "java.util.List", "java.util.Set", "java.util.SortedSet",
    "java.util.NavigableSet", "java.util.Queue", "java.util.Deque", "java.util.Map",
    "java.util.SortedMap", "java.util.NavigableMap", "java.util.concurrent.ConcurrentMap",
    "com.esotericsoftware.kryo.KryoSerializable",
    "com.esotericsoftware.kryo.kryo5.KryoSerializable",
})
#: a Java binary class name as Kryo writes it (anything else read from the bytes is refused
#: before it names a class file)
#: Protobuf's message base classes: a default Kryo serializer registered for one of them (as
#: chill-protobuf's documentation says) writes every message class
_PROTOBUF_BASES = frozenset({
    "com.google.protobuf.Message", "com.google.protobuf.MessageLite",
    "com.google.protobuf.AbstractMessage", "com.google.protobuf.GeneratedMessage",
    "com.google.protobuf.GeneratedMessageV3", "com.google.protobuf.GeneratedMessageLite",
})
_CLASS_NAME = re.compile(r"[^\W\d][\w$]*(\.[^\W\d][\w$]*)*")
_ARRAY_NAME = re.compile(r"\[+([BCDFIJSZ]|L[^\W\d][\w$]*(\.[^\W\d][\w$]*)*;)")


#: what a class with its own Kryo serializer may need
_PROTOBUF_HINT = f" (if a Protobuf message (chill-protobuf), pass {PROTOBUF_HINT})"


class KryoUndecodable(Exception):
    """A value (or a type) the job's classes do not explain; ``str(e)`` is the reason."""


@dataclass(frozen=True)
class KryoRegistration:
    """One registration of a ``KryoSerializerSnapshot``: the class and whether it has its own
    Kryo serializer (``CLASS`` or ``INSTANCE`` definition: its bytes are that serializer's)."""

    name: str
    custom: bool = False


def _fmt(jt: JType) -> str:
    return str(jt)


class _In:
    """Kryo 5 ``Input`` over one value's bytes (little-endian fixed widths, varints)."""

    __slots__ = ("data", "end", "order", "pos")

    def __init__(self, data: bytes, order: str = "<") -> None:
        self.data = data
        self.pos = 0
        self.end = len(data)
        #: byte order of the fixed widths: "<" (Kryo 5) or ">" (Kryo 2.24)
        self.order = order

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.end:
            raise KryoUndecodable(
                f"{what}: {n} bytes wanted at offset {self.pos}, {self.end - self.pos} left")

    def byte(self) -> int:
        self.need(1, "byte")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def fixed(self, fmt: str, n: int) -> Any:
        self.need(n, fmt)
        v = struct.unpack_from(self.order + fmt, self.data, self.pos)[0]
        self.pos += n
        return v

    def varint(self, optimize_positive: bool = True) -> int:
        result = 0
        for i in range(5):
            b = self.byte()
            result |= (b & 0x7F) << (7 * i)
            if not b & 0x80:
                break
        result &= 0xFFFFFFFF
        if not optimize_positive:
            result = (result >> 1) ^ -(result & 1)
        elif result >= 1 << 31:
            result -= 1 << 32
        return result

    def varlong(self, optimize_positive: bool = True) -> int:
        result = 0
        for i in range(9):
            b = self.byte()
            if i == 8:
                result |= b << 56
                break
            result |= (b & 0x7F) << (7 * i)
            if not b & 0x80:
                break
        result &= 0xFFFFFFFFFFFFFFFF
        if not optimize_positive:
            return (result >> 1) ^ -(result & 1)
        return result - (1 << 64) if result >= 1 << 63 else result

    def varint_flag(self) -> tuple[bool, int]:
        """``readVarIntFlag``: bit 8 of the first byte a flag, 6 bits of value, then varint."""
        b = self.byte()
        flag = bool(b & 0x80)
        result = b & 0x3F
        if b & 0x40:
            shift = 6
            for _ in range(4):
                b = self.byte()
                result |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
        return flag, result & 0xFFFFFFFF

    def length(self, what: str, unit: int = 1) -> int | None:
        """A ``length + 1`` varint (0: null), checked against the bytes left."""
        n = self.varint()
        if n == 0:
            return None
        n -= 1
        if n < 0 or n * unit > self.end - self.pos:
            raise KryoUndecodable(f"{what}: length {n} at offset {self.pos} exceeds the bytes left")
        return n

    def string(self) -> str | None:
        """``Output.writeString``: ASCII with the last byte's bit 8 set, or a flagged UTF-8
        char count (0 null, 1 empty) then Kryo's UTF-8 of UTF-16 units."""
        self.need(1, "string")
        b = self.data[self.pos]
        if not b & 0x80:
            start = self.pos
            while True:
                c = self.byte()
                if c & 0x80:
                    break
            raw = bytearray(self.data[start:self.pos])
            raw[-1] &= 0x7F
            return raw.decode("ascii")
        _, count = self.varint_flag()
        if count == 0:
            return None
        count -= 1
        if count > self.end - self.pos:
            raise KryoUndecodable(f"string of {count} chars exceeds the bytes left")
        units = []
        data = self.data
        for _ in range(count):
            c = self.byte()
            kind = c >> 4
            if kind < 8:
                units.append(c)
            elif kind in (12, 13):
                c2 = self.byte()
                units.append((c & 0x1F) << 6 | (c2 & 0x3F))
            elif kind == 14:
                self.need(2, "string char")
                c2, c3 = data[self.pos], data[self.pos + 1]
                self.pos += 2
                units.append((c & 0x0F) << 12 | (c2 & 0x3F) << 6 | (c3 & 0x3F))
            else:
                raise KryoUndecodable(f"bad UTF-8 lead byte {c:#x} at offset {self.pos - 1}")
        return struct.pack(f"<{len(units)}H", *units).decode("utf-16-le", "surrogatepass")


_UNSET = object()


@dataclass(frozen=True)
class _Field:
    name: str
    type: JType
    owner: str


class KryoCodec:
    """Decodes the values of one ``KryoSerializerSnapshot`` with the job's classes."""

    def __init__(
        self,
        classpath: ClassPath,
        type_class: str,
        registrations: tuple[KryoRegistration, ...] = (),
        default_serializers: tuple[str, ...] = (),
        kryo_version: int = 5,
        protobuf: ProtobufDescriptors | None = None,
    ) -> None:
        if kryo_version not in KRYO_VERSIONS:
            raise ValueError(f"Kryo version {kryo_version}: one of {KRYO_VERSIONS}")
        #: 5 (Flink 2.x) or 2 (Kryo 2.24, Flink 1.x): see the module's docstring
        self.kryo_version = kryo_version
        self.classpath = classpath
        #: the job's Protobuf descriptors: a message class with its own Kryo serializer (or a
        #: default one for Protobuf's base classes) is read in chill-protobuf's form
        self.protobuf = protobuf
        self._protobuf_default = bool(_PROTOBUF_BASES.intersection(default_serializers))
        self.type_class = type_class
        self.custom: set[str] = set(default_serializers)
        self.ids: dict[int, str] = dict(_BUILTIN_IDS)
        by_name = {v: k for k, v in self.ids.items()}
        next_id = _FIRST_USER_ID
        for reg in registrations:  # KryoUtils.applyRegistrations
            if reg.custom:
                self.custom.add(reg.name)
            existing = by_name.get(reg.name)
            if existing is None:
                existing = next_id
                self.ids[existing] = reg.name
                by_name[reg.name] = existing
            next_id = existing + 1
        self._layouts: dict[str, tuple[_Field, ...]] = {}
        self._impls: dict[str, tuple[str, ...]] = {}
        self._lock = threading.Lock()
        self._type: pa.DataType | None = None
        self._type_error: str | None = None

    # -- classes -----------------------------------------------------------------------------

    def protobuf_codec(self, name: str) -> ProtobufCodec | None:
        """The Protobuf codec of class ``name``: mapped by the descriptors and written by a
        serializer of its own (chill-protobuf's form); else None."""
        if self.protobuf is None or (name not in self.custom and not self._protobuf_default):
            return None
        return self.protobuf.codec(name)

    def _class(self, name: str) -> ClassInfo:
        if not _CLASS_NAME.fullmatch(name):
            raise KryoUndecodable(f"{name!r} is not a class name")
        try:
            info = self.classpath.find(name)
        except StatequeryError as e:
            raise KryoUndecodable(f"class {name}: {e}") from None
        if info is None:
            raise KryoUndecodable(f"class {name} is not in the classpath")
        return info

    def fields(self, name: str) -> tuple[_Field, ...]:
        """FieldSerializer's fields of class ``name``: non-static, non-synthetic, non-transient
        fields of the class and its superclasses (up to ``java.lang.Object``), sorted by name
        (a stable sort of subclass-first declaration order)."""
        with self._lock:
            cached = self._layouts.get(name)
        if cached is not None:
            return cached
        out: list[_Field] = []
        cls: str | None = name
        hops = 0
        while cls is not None and cls != "java.lang.Object":
            hops += 1
            if hops > MAX_DEPTH:
                raise KryoUndecodable(f"class {name}: superclass chain deeper than {MAX_DEPTH}")
            if cls in self.custom:
                raise KryoUndecodable(f"{name}: {cls} has a Kryo default serializer of the job's")
            info = self._class(cls)  # a JDK superclass (Record, HashMap, ...): not in the jar
            self._check_interfaces(name, info)
            for f in info.fields:
                if f.static or f.synthetic or f.transient:
                    continue
                try:
                    out.append(_Field(f.name, f.type, cls))
                except StatequeryError as e:
                    raise KryoUndecodable(f"field {f.name} of {cls}: {e}") from None
            cls = info.super_name
        fields = tuple(sorted(out, key=lambda f: f.name.encode("utf-16-be")))
        with self._lock:
            self._layouts[name] = fields
        return fields

    def _check_interfaces(self, name: str, info: ClassInfo) -> None:
        """Refuse a class Kryo would not write with FieldSerializer: one implementing
        ``Collection``, ``Map`` or ``KryoSerializable`` (directly or through an interface of
        the jar), or an interface with a default serializer of the job's."""
        stack = list(info.interfaces)
        seen = 0
        while stack and seen < 256:
            seen += 1
            iface = stack.pop()
            if iface in _DEFAULT_SERIALIZED or iface in self.custom:
                raise KryoUndecodable(
                    f"{name} implements {iface}: Kryo writes it with its own serializer")
            if not iface.startswith(("java.", "javax.")):
                try:
                    stack.extend(self._class(iface).interfaces)
                except KryoUndecodable:
                    continue

    def _is_final(self, jt: JType) -> bool:
        """``Kryo.isFinal`` of a declared type: arrays by their element class."""
        if jt.var:
            return False
        if jt.name in _PRIMITIVE_ARROW:
            return True
        if jt.name in _JDK_FINAL:
            return True
        if jt.name.startswith("java."):
            return False
        try:
            info = self._class(jt.name)
        except KryoUndecodable:
            return False
        return info.final

    def _implementations(self, name: str) -> tuple[str, ...]:
        """The concrete classes of the classpath assignable to ``name`` (sorted)."""
        with self._lock:
            cached = self._impls.get(name)
        if cached is not None:
            return cached
        out = []
        for cand in self.classpath.class_names():
            seen = 0
            stack = [cand]
            hit = False
            concrete = False
            while stack and seen < 256:
                seen += 1
                c = stack.pop()
                try:
                    info = self._class(c)
                except KryoUndecodable:
                    continue
                if c == cand:
                    concrete = not info.abstract
                if c == name:
                    hit = True
                    break
                if info.super_name:
                    stack.append(info.super_name)
                stack.extend(info.interfaces)
            if hit and concrete:
                out.append(cand)
        result = tuple(sorted(out))
        with self._lock:
            self._impls[name] = result
        return result

    @staticmethod
    def branch_name(cls: str) -> str:
        return cls.rsplit(".", 1)[-1]

    # -- Arrow types -----------------------------------------------------------------------

    def arrow_type(self) -> pa.DataType:
        """The Arrow type of the values (the snapshot's type class); raises
        :class:`KryoUndecodable` when the classes cannot type them."""
        if self._type is None and self._type_error is None:
            try:
                self._type = self._arrow(JType(self.type_class), (), 0)
            except KryoUndecodable as e:
                self._type_error = str(e)
        if self._type_error is not None:
            raise KryoUndecodable(self._type_error)
        assert self._type is not None
        return self._type

    def _arrow(self, jt: JType, stack: tuple[str, ...], depth: int) -> pa.DataType:
        if depth > MAX_DEPTH:
            raise KryoUndecodable(f"type {_fmt(jt)} nested deeper than {MAX_DEPTH}")
        if jt.var or jt.name == "java.lang.Object":
            raise KryoUndecodable(f"a value of type {_fmt(jt)} cannot be typed from the classes")
        if jt.dims:
            if jt.dims == 1 and jt.name == "byte":
                return pa.binary()
            return pa.list_(self._arrow(jt.element(), stack, depth + 1))
        name = jt.name
        if name in _PRIMITIVE_ARROW:
            return _PRIMITIVE_ARROW[name]
        if name in _BOXED:
            return _PRIMITIVE_ARROW[_BOXED[name]]
        if name == "java.lang.String":
            return pa.string()
        if name in _TIME_ARROW:
            return _TIME_ARROW[name]
        if name in _COLLECTION_TYPES:
            if len(jt.args) != 1 or jt.args[0] is None:
                raise KryoUndecodable(f"{_fmt(jt)}: a collection without its element type")
            return pa.list_(self._arrow(jt.args[0], stack, depth + 1))
        if name in _MAP_TYPES:
            if len(jt.args) != 2 or jt.args[0] is None or jt.args[1] is None:
                raise KryoUndecodable(f"{_fmt(jt)}: a map without its key and value types")
            return pa.map_(self._arrow(jt.args[0], stack, depth + 1),
                           self._arrow(jt.args[1], stack, depth + 1))
        if name.startswith(("java.", "javax.", "sun.", "jdk.")):
            raise KryoUndecodable(f"no Kryo decoder for JDK class {name}")
        pb = self.protobuf_codec(name)
        if pb is not None:
            try:
                return pb.arrow_type()
            except ProtobufUndecodable as e:
                raise KryoUndecodable(f"Protobuf message class {name}: {e}") from None
        if name in self.custom:
            raise KryoUndecodable(f"{name} has its own Kryo serializer{_PROTOBUF_HINT}")
        info = self._class(name)
        if info.enum:
            return pa.string()
        if name in stack:
            raise KryoUndecodable(f"class {name} contains itself (a recursive type)")
        if info.abstract:
            impls = self._implementations(name)
            if not impls:
                raise KryoUndecodable(f"no implementation of {name} in the classpath")
            # the "class" field's metadata marks the struct as one of several classes
            branches = [pa.field("class", pa.string(), metadata={b"statequery.kryo": b"union"})]
            used: set[str] = {"class"}
            for impl in impls:
                label = self.branch_name(impl)
                if label in used:
                    label = impl
                used.add(label)
                branches.append(pa.field(label, self._struct(impl, stack, depth)))
            return pa.struct(branches)
        return self._struct(name, stack, depth)

    def _struct(self, name: str, stack: tuple[str, ...], depth: int) -> pa.DataType:
        return pa.struct([
            pa.field(f.name, self._arrow(f.type, (*stack, name), depth + 1))
            for f in self.fields(name)
        ])

    # -- values --------------------------------------------------------------------------------

    def decode(self, data: bytes) -> Any:
        """One value (``writeClassAndObject``) as Python data shaped like :meth:`arrow_type`;
        the value must use exactly ``data``."""
        r = _Read(self, data)
        value = r.class_and_object(JType(self.type_class), 0)
        if r.inp.pos != r.inp.end:
            raise KryoUndecodable(
                f"{r.inp.end - r.inp.pos} bytes left after the value (at offset {r.inp.pos})")
        return value

    def decode_delimited(self, data: bytes, delimiter: int = 0x2C) -> list[Any]:
        """A list state's elements as Flink's RocksDB layout (and the canonical savepoint
        format) joins them: each element its own ``writeClassAndObject``, a ``,`` byte between
        two; every byte must be used."""
        out: list[Any] = []
        pos = 0
        while True:
            r = _Read(self, data, pos)
            out.append(r.class_and_object(JType(self.type_class), 0))
            pos = r.inp.pos
            if pos == len(data):
                return out
            if data[pos] != delimiter or pos + 1 == len(data):
                raise KryoUndecodable(
                    f"no element delimiter {delimiter:#x} between list elements at offset {pos}")
            pos += 1


class _Read:
    """The state of one value's read: name ids and references are per top-level object."""

    __slots__ = ("codec", "inp", "names", "refs")

    def __init__(self, codec: KryoCodec, data: bytes, start: int = 0) -> None:
        self.codec = codec
        self.inp = _In(data, ">" if codec.kryo_version == 2 else "<")
        self.inp.pos = start
        self.names: dict[int, str] = {}
        self.refs: list[Any] = []

    # class of a value ------------------------------------------------------------------------

    def read_class(self) -> JType | None:
        inp = self.inp
        cid = inp.varint()
        if cid == 0:
            return None
        if cid == 1:
            name_id = inp.varint()
            name = self.names.get(name_id)
            if name is None:
                text = inp.string()
                if not text:
                    raise KryoUndecodable(f"empty class name at offset {inp.pos}")
                name = text
                self.names[name_id] = name
            if name.startswith("["):
                if not _ARRAY_NAME.fullmatch(name):
                    raise KryoUndecodable(f"{name!r} is not an array class name")
                return parse_descriptor(name.replace(".", "/"))
            if not _CLASS_NAME.fullmatch(name):
                raise KryoUndecodable(f"{name!r} is not a class name")
            return JType(name)
        name = self.codec.ids.get(cid - 2)
        if name is None:
            raise KryoUndecodable(f"class id {cid - 2} is not registered")
        if name in _PRIMITIVE_WRAPPER:
            name = _PRIMITIVE_WRAPPER[name]
        return JType(name)

    @staticmethod
    def _tracked(jt: JType) -> bool:
        """``MapReferenceResolver.useReferences``: all but boxed types and enums."""
        return jt.dims > 0 or not (jt.name in _BOXED or jt.name in _PRIMITIVE_ARROW)

    def _enum(self, jt: JType) -> ClassInfo | None:
        if jt.dims or jt.name.startswith("java.") or jt.name in _PRIMITIVE_ARROW:
            return None
        try:
            info = self.codec._class(jt.name)
        except KryoUndecodable:
            return None
        return info if info.enum else None

    def _reference(self, jt: JType, may_be_null: bool, generics: JType, depth: int) -> Any:
        """``readObject``/``readObjectOrNull`` with references on (Kryo 2.24 tracks enums too:
        a constant seen before in the value is a back reference)."""
        tracked = self._tracked(jt) and (self.codec.kryo_version == 2 or self._enum(jt) is None)
        inp = self.inp
        if may_be_null:
            marker = inp.varint()
            if marker == 0:
                return None
            if not tracked:
                if marker != 1:
                    raise KryoUndecodable(f"bad not-null marker {marker} at offset {inp.pos}")
                return self.body(jt, generics, depth)
        elif not tracked:
            return self.body(jt, generics, depth)
        else:
            marker = inp.varint()
        if marker == 1:
            slot = len(self.refs)
            self.refs.append(_UNSET)
            value = self.body(jt, generics, depth)
            self.refs[slot] = value
            return value
        if marker == 0:
            raise KryoUndecodable(f"null where a value must be (offset {inp.pos})")
        ref = marker - 2
        if ref < 0 or ref >= len(self.refs):
            raise KryoUndecodable(f"reference {ref} to an object not read yet")
        value = self.refs[ref]
        if value is _UNSET:
            raise KryoUndecodable("a cyclic reference (an object containing itself)")
        return value

    def class_and_object(self, declared: JType, depth: int) -> Any:
        """``readClassAndObject``, shaped for a value declared as ``declared``."""
        jt = self.read_class()
        if jt is None:
            return None
        value = self._reference(jt, False, jt, depth)
        return self._shape(declared, jt, value)

    def _shape(self, declared: JType, actual: JType, value: Any) -> Any:
        """A value of class ``actual`` where ``declared`` is expected: abstract declared types
        are ``{"class": ..., Branch: value}``; a concrete class must be itself."""
        if declared.dims or declared.var or declared.name.startswith("java.") or (
                declared.name in _PRIMITIVE_ARROW):
            return value
        try:
            info = self.codec._class(declared.name)
        except KryoUndecodable:
            return value
        if info.enum:
            return value
        if info.abstract:
            impls = self.codec._implementations(declared.name)
            if actual.name not in impls or actual.dims:
                raise KryoUndecodable(
                    f"a {_fmt(actual)} where {declared.name} is declared, not among its "
                    f"implementations in the classpath")
            label = KryoCodec.branch_name(actual.name)
            if sum(KryoCodec.branch_name(i) == label for i in impls) > 1:
                label = actual.name
            return {"class": actual.name, label: value}
        if actual.name != declared.name or actual.dims:
            raise KryoUndecodable(f"a {_fmt(actual)} where {declared.name} is declared")
        return value

    # bodies -----------------------------------------------------------------------------

    def body(self, jt: JType, generics: JType, depth: int) -> Any:
        """The bytes of the serializer of class ``jt`` (``generics``: the declared type, whose
        type arguments a collection or map uses)."""
        if depth > MAX_DEPTH:
            raise KryoUndecodable(f"value nested deeper than {MAX_DEPTH}")
        inp = self.inp
        if jt.dims:
            return self._array(jt, depth)
        name = jt.name
        pb = self.codec.protobuf_codec(name)
        if pb is not None:
            try:
                value, inp.pos = pb.decode_body(inp.data, inp.pos, inp.end)
            except ProtobufUndecodable as e:
                raise KryoUndecodable(f"Protobuf message class {name}: {e}") from None
            return value
        if name in self.codec.custom:
            raise KryoUndecodable(f"{name} has its own Kryo serializer{_PROTOBUF_HINT}")
        prim = _BOXED.get(name, name)
        if prim in _PRIMITIVE_ARROW:
            return self._primitive(prim)
        if name == "java.lang.String":
            return inp.string()
        if name in _TIME_ARROW and self.codec.kryo_version == 2:
            return self._time_24(name, depth)
        if name == "java.time.Instant":
            seconds = inp.varlong()
            nanos = inp.varint()
            return seconds * 1_000_000_000 + nanos
        if name == "java.time.LocalDate":
            return self._local_date()
        if name == "java.time.LocalTime":
            return self._local_time()
        if name == "java.time.LocalDateTime":
            days = self._local_date()
            return days * 86_400_000_000_000 + self._local_time()
        if name == "java.time.Duration":
            seconds = inp.fixed("q", 8)
            return seconds * 1_000_000_000 + inp.varint()
        if name in _COLLECTIONS:
            return self._collection(generics, depth)
        if name in _MAPS:
            return self._map(generics, depth)
        if name.startswith(("java.", "javax.", "sun.", "jdk.", "scala.")):
            raise KryoUndecodable(f"no Kryo decoder for JDK class {name}")
        info = self.codec._class(name)
        if info.enum:
            ordinal = inp.varint()
            if ordinal == 0:
                return None
            constants = info.enum_constants()
            if not 0 <= ordinal - 1 < len(constants):
                raise KryoUndecodable(f"enum {name}: ordinal {ordinal - 1} out of range")
            return constants[ordinal - 1]
        if info.abstract:
            raise KryoUndecodable(f"an instance of abstract {name}")
        return self._object(name, depth)

    def _time_24(self, name: str, depth: int) -> int:
        """Kryo 2.24 has no java.time serializers: FieldSerializer writes the JDK class's
        instance fields (the same from JDK 8 to 21), sorted by name."""
        if name == "java.time.LocalDateTime":
            dt_, tm_ = JType("java.time.LocalDate"), JType("java.time.LocalTime")
            date = self._reference(dt_, True, dt_, depth + 1)
            time = self._reference(tm_, True, tm_, depth + 1)
            if date is None or time is None:
                raise KryoUndecodable("a LocalDateTime without its date or time")
            return int(date) * 86_400_000_000_000 + int(time)
        if name == "java.time.LocalDate":  # day, month (shorts), year
            import datetime as dt

            day = self.inp.fixed("h", 2)
            month = self.inp.fixed("h", 2)
            year = self._primitive("int")
            try:
                return (dt.date(year, month, day) - dt.date(1970, 1, 1)).days
            except (ValueError, OverflowError) as e:
                raise KryoUndecodable(f"LocalDate {year}-{month}-{day}: {e}") from None
        if name == "java.time.LocalTime":  # hour, minute, nano, second
            hour = int(self._primitive("byte"))
            minute = int(self._primitive("byte"))
            nano = int(self._primitive("int"))
            second = int(self._primitive("byte"))
            if not (0 <= hour < 24 and 0 <= minute < 60 and 0 <= second < 60
                    and 0 <= nano < 1_000_000_000):
                raise KryoUndecodable(f"bad LocalTime {hour}:{minute}:{second}.{nano}")
            return ((hour * 60 + minute) * 60 + second) * 1_000_000_000 + nano
        # Instant, Duration: nanos (int), seconds (long)
        nanos = self._primitive("int")
        seconds = self._primitive("long")
        if not 0 <= nanos < 1_000_000_000:
            raise KryoUndecodable(f"bad {name} nanos {nanos}")
        return int(seconds) * 1_000_000_000 + int(nanos)

    def _primitive(self, prim: str) -> Any:
        inp = self.inp
        if prim == "int":
            return inp.varint(False)
        if prim == "long":
            return inp.varlong(False)
        if prim == "boolean":
            return inp.byte() != 0
        if prim == "byte":
            b = inp.byte()
            return b - 256 if b >= 128 else b
        if prim == "short":
            return inp.fixed("h", 2)
        if prim == "char":
            return chr(inp.fixed("H", 2))
        if prim == "float":
            return inp.fixed("f", 4)
        return inp.fixed("d", 8)

    def _local_date(self) -> int:
        import datetime as dt

        inp = self.inp
        year = inp.varint()
        month = inp.byte()
        day = inp.byte()
        try:
            return (dt.date(year, month, day) - dt.date(1970, 1, 1)).days
        except (ValueError, OverflowError) as e:
            raise KryoUndecodable(f"LocalDate {year}-{month}-{day}: {e}") from None

    def _local_time(self) -> int:
        inp = self.inp

        def signed(b: int) -> int:
            return b - 256 if b >= 128 else b

        hour = signed(inp.byte())
        minute = second = nano = 0
        if hour < 0:
            hour = ~hour
        else:
            minute = signed(inp.byte())
            if minute < 0:
                minute = ~minute
            else:
                second = signed(inp.byte())
                if second < 0:
                    second = ~second
                else:
                    nano = inp.varint()
        if not (0 <= hour < 24 and 0 <= minute < 60 and 0 <= second < 60
                and 0 <= nano < 1_000_000_000):
            raise KryoUndecodable(f"bad LocalTime {hour}:{minute}:{second}.{nano}")
        return ((hour * 60 + minute) * 60 + second) * 1_000_000_000 + nano

    def _object(self, name: str, depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in self.codec.fields(name):
            out[f.name] = self.field(f.type, depth + 1)
        return out

    def field(self, declared: JType, depth: int) -> Any:
        """A field (or element) declared as ``declared`` (ReflectField.read)."""
        if declared.dims == 0 and declared.name in _PRIMITIVE_ARROW:
            return self._primitive(declared.name)
        if self.codec._is_final(declared):
            return self._reference(declared, True, declared, depth)
        jt = self.read_class()
        if jt is None:
            return None
        value = self._reference(jt, False, declared, depth)
        return self._shape(declared, jt, value)

    def _array(self, jt: JType, depth: int) -> Any:
        inp = self.inp
        el = jt.element()
        if el.dims == 0 and el.name in _PRIMITIVE_ARROW:
            sizes = {"byte": 1, "boolean": 1, "short": 2, "char": 2, "float": 4, "double": 8,
                     "int": 1, "long": 1}
            n = inp.length(f"{el.name}[]", sizes[el.name])
            if n is None:
                return None
            if el.name == "byte":
                inp.need(n, "byte[]")
                out = bytes(inp.data[inp.pos:inp.pos + n])
                inp.pos += n
                return out
            return [self._primitive(el.name) for _ in range(n)]
        n = inp.length(f"{_fmt(el)}[]")
        if n is None:
            return None
        if el.name == "java.lang.String" and el.dims == 0:
            return [self._reference(el, True, el, depth + 1) for _ in range(n)]
        if self.codec._is_final(el):  # ObjectArraySerializer: elements of one known class
            return [self._reference(el, True, el, depth + 1) for _ in range(n)]
        return [self.class_and_object(el, depth + 1) for _ in range(n)]

    def _element_type(self, generics: JType, index: int) -> JType | None:
        if index < len(generics.args):
            return generics.args[index]
        return None

    def _collection(self, generics: JType, depth: int) -> list[Any] | None:
        inp = self.inp
        el = self._element_type(generics, 0)
        if self.codec.kryo_version == 2:  # CollectionSerializer 2.24: a plain varint size
            n = inp.varint()
            if not 0 <= n <= inp.end - inp.pos:
                raise KryoUndecodable(f"collection of {n} elements exceeds the bytes left")
            return [self._map_part(el, depth) for _ in range(n)]
        if el is not None and not el.var and self.codec._is_final(el):
            can_be_null, n = inp.varint_flag()
            if n == 0:
                return None
            n -= 1
            if n > inp.end - inp.pos:
                raise KryoUndecodable(f"collection of {n} elements exceeds the bytes left")
            return [self._reference(el, can_be_null, el, depth + 1) for _ in range(n)]
        same_type, n = inp.varint_flag()
        if n == 0:
            return None
        n -= 1
        if n > inp.end - inp.pos:
            raise KryoUndecodable(f"collection of {n} elements exceeds the bytes left")
        if n == 0:
            return []
        declared = el if el is not None else JType("java.lang.Object")
        if same_type:
            cls = self.read_class()
            if cls is None:
                return [None] * n
            can_be_null = inp.byte() != 0
            return [self._shape(declared, cls,
                                self._reference(cls, can_be_null, el or cls, depth + 1))
                    for _ in range(n)]
        return [self.class_and_object(declared, depth + 1) for _ in range(n)]

    def _map(self, generics: JType, depth: int) -> list[tuple[Any, Any]] | None:
        inp = self.inp
        n = inp.varint()
        if self.codec.kryo_version == 5:  # Kryo 5: size + 1, 0 null; 2.24: the size
            if n == 0:
                return None
            n -= 1
        if not 0 <= n <= inp.end - inp.pos:
            raise KryoUndecodable(f"map of {n} entries at offset {inp.pos}: beyond the bytes left")
        kt = self._element_type(generics, 0)
        vt = self._element_type(generics, 1)
        out = []
        for _ in range(n):
            k = self._map_part(kt, depth)
            v = self._map_part(vt, depth)
            out.append((k, v))
        return out

    def _map_part(self, jt: JType | None, depth: int) -> Any:
        if jt is not None and not jt.var and self.codec._is_final(jt):
            return self._reference(jt, True, jt, depth + 1)
        return self.class_and_object(jt or JType("java.lang.Object"), depth + 1)
