"""A small, bounded reader of Java object serialization streams (``ObjectOutputStream``).

Flink writes a few Java-serialized objects into its snapshots; the changelog state backend's
metadata records carry a key-value state's ``StateTtlConfig`` this way. This module parses the
stream's *structure* (the grammar of the Java Object Serialization Specification, chapter 6:
class descriptors, objects with their field values, enums, strings, arrays, block data and
handles) into plain Python values. Nothing is ever executed or instantiated: an object is its
class name and its field values; a class with a ``writeObject`` method or an externalizable one
also keeps its annotations (block-data bytes and objects, in order).

Bounds: the nesting depth, the number of handles and every length are checked against the
buffer. The parser recurses only through :meth:`_Reader.content` and class descriptors, both
depth-counted: a run of ``TC_RESET`` is a loop (and a reset is refused inside an object, as
``ObjectInputStream`` does), an enum constant's name is read as a string or a reference to
one, never as another object; an array's element type is checked against its class name.
Anything else (an exception record, the old externalizable protocol, an unknown tag) is
a :class:`~statequery.exceptions.CorruptStateError` or
:class:`~statequery.exceptions.UnsupportedFormatError` naming the source.

:func:`read_ttl_config` turns a ``StateTtlConfig`` object into :class:`TtlConfig`. The facts
are in docs/format-notes.md ("Java serialization: StateTtlConfig").
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from statequery.decoder import Decoder, decode_modified_utf8
from statequery.exceptions import CorruptStateError, UnsupportedFormatError

__all__ = ["JavaClassDesc", "JavaEnum", "JavaObject", "TtlConfig", "read_object",
           "read_ttl_config"]

MAGIC, VERSION = 0xACED, 5
TC_NULL, TC_REFERENCE, TC_CLASSDESC, TC_OBJECT, TC_STRING, TC_ARRAY = range(0x70, 0x76)
TC_CLASS, TC_BLOCKDATA, TC_ENDBLOCKDATA, TC_RESET, TC_BLOCKDATALONG = range(0x76, 0x7B)
TC_EXCEPTION, TC_LONGSTRING, TC_PROXYCLASSDESC, TC_ENUM = range(0x7B, 0x7F)
BASE_HANDLE = 0x7E0000
SC_WRITE_METHOD, SC_SERIALIZABLE, SC_EXTERNALIZABLE, SC_BLOCK_DATA = 0x01, 0x02, 0x04, 0x08

#: bounds of what a metadata record's objects need (a StateTtlConfig: ~20 handles, nesting 5)
MAX_DEPTH = 64
MAX_HANDLES = 4096

#: primitive field type code -> its struct format (big-endian)
_PRIMITIVE = {"B": ">b", "C": ">H", "D": ">d", "F": ">f", "I": ">i", "J": ">q", "S": ">h",
              "Z": ">?"}


@dataclass
class JavaClassDesc:
    """A class descriptor: name, serialVersionUID, flags, fields ``(type code, name)``, its
    super class's descriptor."""

    name: str
    uid: int = 0
    flags: int = 0
    fields: list[tuple[str, str]] = field(default_factory=list)
    super: JavaClassDesc | None = None
    enum_constant: bool = False


@dataclass
class JavaObject:
    """An object: its class name, the field values of every class of its hierarchy (a
    subclass's field shadows a super class's of the same name), and the annotations that
    ``writeObject`` methods and externalizable classes wrote (bytes and objects, in order)."""

    class_name: str
    fields: dict[str, Any] = field(default_factory=dict)
    annotations: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class JavaEnum:
    class_name: str
    name: str


@dataclass(frozen=True)
class JavaArray:
    class_name: str
    values: tuple[Any, ...]


class _Reader:
    def __init__(self, d: Decoder) -> None:
        self.d = d
        self.handles: list[Any] = []
        self.depth = 0

    # -- helpers -------------------------------------------------------------------------------

    def _new_handle(self, value: Any) -> int:
        if len(self.handles) >= MAX_HANDLES:
            raise self.d.error(f"more than {MAX_HANDLES} objects in a Java-serialized object")
        self.handles.append(value)
        return len(self.handles) - 1

    def _utf(self) -> str:
        return self.d.read_utf()

    def _ref(self) -> Any:
        at = self.d.pos
        h = self.d.read_int() - BASE_HANDLE
        if not 0 <= h < len(self.handles):
            raise self.d.error(f"Java serialization: reference to unknown handle {h:#x}", at)
        return self.handles[h]

    # -- the grammar -----------------------------------------------------------------------------

    def content(self) -> Any:
        """One ``content``: an object, or the bytes of a block-data record."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.d.error(f"Java-serialized object nested deeper than {MAX_DEPTH}")
        try:
            at = self.d.pos
            tc = self.d.read_ubyte()
            if tc == TC_BLOCKDATA:
                return self.d.read_bytes(self.d.read_ubyte())
            if tc == TC_BLOCKDATALONG:
                n = self.d.read_int()
                if n < 0:
                    raise self.d.error(f"Java serialization: block of {n} bytes", at)
                return self.d.read_bytes(n)
            return self._object(tc, at)
        finally:
            self.depth -= 1

    def _object(self, tc: int, at: int) -> Any:
        d = self.d
        if tc == TC_NULL:
            return None
        if tc == TC_REFERENCE:
            return self._ref()
        if tc == TC_STRING:
            s = self._utf()
            self._new_handle(s)
            return s
        if tc == TC_LONGSTRING:
            n = d.read_long()
            if not 0 <= n <= d.remaining:
                raise d.error(f"Java serialization: string of {n} bytes", at)
            try:
                s = decode_modified_utf8(d.read_bytes(n))
            except UnicodeDecodeError as e:
                raise d.error(f"invalid modified UTF-8 string: {e}", at) from e
            self._new_handle(s)
            return s
        if tc in (TC_CLASSDESC, TC_PROXYCLASSDESC):
            return self._class_desc(tc)
        if tc == TC_CLASS:
            desc = self._desc()
            self._new_handle(desc)
            return desc
        if tc == TC_ENUM:
            desc = self._desc()
            h = self._new_handle(None)
            name = self._enum_constant_name(at)
            value = JavaEnum(desc.name if desc else "?", name)
            self.handles[h] = value
            return value
        if tc == TC_ARRAY:
            return self._array()
        if tc == TC_OBJECT:
            return self._new_object()
        if tc == TC_RESET:
            # ObjectInputStream accepts a reset only between top-level objects (its handleReset
            # refuses one at a recursion depth above 0): inside an array, an object or an enum
            # it would drop the handle being filled
            if self.depth > 1:
                raise d.error("Java serialization: a reset (TC_RESET) inside an object", at)
            while tc == TC_RESET:  # a run of resets: a loop, never a recursion
                self.handles.clear()
                at = d.pos
                tc = d.read_ubyte()
            if tc in (TC_BLOCKDATA, TC_BLOCKDATALONG):
                raise d.error("Java serialization: block data after a reset", at)
            return self._object(tc, at)
        if tc == TC_EXCEPTION:
            raise UnsupportedFormatError(
                f"{d.source}: a Java-serialized object holds an exception record (the writer "
                "failed while writing it)")
        raise d.error(f"Java serialization: unknown tag {tc:#04x}", at)

    def _enum_constant_name(self, at: int) -> str:
        """An enum constant's name: a string or a reference to one (read here, not through
        :meth:`_object`: a name that is another enum would recurse once per link)."""
        d = self.d
        tc = d.read_ubyte()
        name: Any = None
        if tc in (TC_STRING, TC_LONGSTRING):
            name = self._object(tc, d.pos - 1)
        elif tc == TC_REFERENCE:
            name = self._ref()
        if not isinstance(name, str):
            raise d.error("Java serialization: an enum constant's name is not a string", at)
        return name

    def _desc(self) -> JavaClassDesc | None:
        """``classDesc``: a new descriptor, a reference to one, or null."""
        tc = self.d.read_ubyte()
        if tc == TC_NULL:
            return None
        if tc == TC_REFERENCE:
            got = self._ref()
            if not isinstance(got, JavaClassDesc):
                raise self.d.error("Java serialization: a class reference to a non-class")
            return got
        if tc in (TC_CLASSDESC, TC_PROXYCLASSDESC):
            return self._class_desc(tc)
        raise self.d.error(f"Java serialization: tag {tc:#04x} where a class was expected")

    def _class_desc(self, tc: int) -> JavaClassDesc:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.d.error(f"Java-serialized class descriptors nested deeper than {MAX_DEPTH}")
        try:
            return self._class_desc_body(tc)
        finally:
            self.depth -= 1

    def _class_desc_body(self, tc: int) -> JavaClassDesc:
        d = self.d
        if tc == TC_PROXYCLASSDESC:
            desc = JavaClassDesc("<proxy>", flags=SC_SERIALIZABLE)
            self._new_handle(desc)
            n = d.check_length(d.read_int(), "proxy interface count", 3)
            desc.name = "<proxy " + ",".join(self._utf() for _ in range(n)) + ">"
        else:
            desc = JavaClassDesc(self._utf(), d.read_long())
            self._new_handle(desc)
            desc.flags = d.read_ubyte()
            n = d.check_length(d.read_ushort(), "field count", 3)
            for _ in range(n):
                code = chr(d.read_ubyte())
                name = self._utf()
                if code in "[L":
                    tname = self.content()
                    if not isinstance(tname, str):
                        raise d.error(f"Java serialization: field {name!r} has no type name")
                elif code not in _PRIMITIVE:
                    raise d.error(f"Java serialization: field type code {code!r}")
                desc.fields.append((code, name))
        self._annotation(None)  # classAnnotation
        desc.super = self._desc()
        return desc

    def _annotation(self, into: list[Any] | None) -> None:
        """Contents up to ``TC_ENDBLOCKDATA``."""
        while True:
            if self.d.remaining < 1:
                raise self.d.error("Java serialization: annotation without its end marker")
            if self.d.buf[self.d.pos] == TC_ENDBLOCKDATA:
                self.d.pos += 1
                return
            got = self.content()
            if into is not None:
                into.append(got)

    def _hierarchy(self, desc: JavaClassDesc) -> list[JavaClassDesc]:
        out: list[JavaClassDesc] = []
        c: JavaClassDesc | None = desc
        while c is not None:
            if len(out) >= MAX_DEPTH:
                raise self.d.error("Java serialization: class hierarchy too deep")
            out.append(c)
            c = c.super
        return out[::-1]

    def _new_object(self) -> JavaObject:
        d = self.d
        desc = self._desc()
        if desc is None:
            raise d.error("Java serialization: an object without a class")
        obj = JavaObject(desc.name)
        self._new_handle(obj)
        for c in self._hierarchy(desc):
            if c.flags & SC_EXTERNALIZABLE:
                if not c.flags & SC_BLOCK_DATA:
                    raise UnsupportedFormatError(
                        f"{d.source}: Java-serialized {c.name} in the old externalizable "
                        "protocol (no block data) cannot be delimited")
                self._annotation(obj.annotations)
            elif c.flags & SC_SERIALIZABLE:
                for code, name in c.fields:
                    obj.fields[name] = self._value(code)
                if c.flags & SC_WRITE_METHOD:
                    self._annotation(obj.annotations)
        return obj

    def _value(self, code: str) -> Any:
        if code in "[L":
            return self.content()
        fmt = _PRIMITIVE[code]
        value = struct.unpack(fmt, self.d.read_bytes(struct.calcsize(fmt)))[0]
        return chr(value) if code == "C" else value

    def _array(self) -> JavaArray:
        d = self.d
        desc = self._desc()
        if desc is None or not desc.name.startswith("["):
            raise d.error("Java serialization: an array without an array class")
        code = desc.name[1:2]
        if code not in _PRIMITIVE and code not in ("[", "L"):
            raise d.error(f"Java serialization: an array of class {desc.name!r} (element type "
                          f"code {code!r})")
        h = self._new_handle(None)
        n = d.check_length(d.read_int(), "array length",
                           struct.calcsize(_PRIMITIVE[code]) if code in _PRIMITIVE else 1)
        values = tuple(self._value(code) for _ in range(n))
        arr = JavaArray(desc.name, values)
        self.handles[h] = arr
        return arr


def read_object(d: Decoder) -> Any:
    """The Java-serialized object at ``d.pos`` (stream header, then one object); ``d.pos`` ends
    after it."""
    at = d.pos
    if d.read_ushort() != MAGIC or d.read_ushort() != VERSION:
        raise d.error("not a Java serialization stream (no 0xACED 0005 header)", at)
    r = _Reader(d)
    got = r.content()
    if isinstance(got, bytes):
        raise d.error("Java serialization: block data where an object was expected", at)
    return got


@dataclass(frozen=True)
class TtlConfig:
    """A ``StateTtlConfig``: the time-to-live in milliseconds, the update type, the state
    visibility, the time characteristic and the cleanup strategies (their names)."""

    ttl_ms: int
    update_type: str
    visibility: str
    time_characteristic: str
    cleanup: tuple[str, ...] = ()
    cleanup_in_background: bool = False

    @property
    def display(self) -> str:
        return (f"ttl={self.ttl_ms} ms, {self.update_type}, {self.visibility}, "
                f"{self.time_characteristic}"
                + (f", cleanup={'+'.join(self.cleanup)}" if self.cleanup else ""))


def _enum_name(obj: Any, what: str, source: str) -> str:
    if not isinstance(obj, JavaEnum):
        raise CorruptStateError(f"StateTtlConfig.{what} is not an enum constant", source, 0)
    return obj.name


def _duration_ms(obj: Any, source: str) -> int:
    """``java.time.Duration`` writes itself through ``java.time.Ser`` (externalizable): the
    block data byte 1 (DURATION_TYPE), long seconds, int nanos."""
    if isinstance(obj, JavaObject) and obj.class_name == "java.time.Ser":
        data = b"".join(a for a in obj.annotations if isinstance(a, bytes))
        if len(data) == 13 and data[0] == 1:
            seconds, nanos = struct.unpack_from(">qi", data, 1)
            return int(seconds) * 1000 + int(nanos) // 1_000_000
    name = obj.class_name if isinstance(obj, JavaObject) else type(obj).__name__
    raise UnsupportedFormatError(
        f"{source}: StateTtlConfig.ttl is a {name}, not a java.time.Duration (Flink 2.x)")


def read_ttl_config(d: Decoder) -> TtlConfig:
    """The Java-serialized ``StateTtlConfig`` at ``d.pos``."""
    obj = read_object(d)
    src = d.source
    if not isinstance(obj, JavaObject) or obj.class_name != (
            "org.apache.flink.api.common.state.StateTtlConfig"):
        name = obj.class_name if isinstance(obj, JavaObject) else type(obj).__name__
        raise CorruptStateError(f"a StateTtlConfig expected, found {name}", src, 0)
    f = obj.fields
    cleanup: list[str] = []
    background = False
    strategies = f.get("cleanupStrategies")
    if isinstance(strategies, JavaObject):
        background = bool(strategies.fields.get("isCleanupInBackground"))
        emap = strategies.fields.get("strategies")
        if isinstance(emap, JavaObject):
            # EnumMap.writeObject: int size (block data), then key, value objects
            cleanup = [a.name for a in emap.annotations if isinstance(a, JavaEnum)]
    return TtlConfig(
        ttl_ms=_duration_ms(f.get("ttl"), src),
        update_type=_enum_name(f.get("updateType"), "updateType", src),
        visibility=_enum_name(f.get("stateVisibility"), "stateVisibility", src),
        time_characteristic=_enum_name(
            f.get("ttlTimeCharacteristic"), "ttlTimeCharacteristic", src),
        cleanup=tuple(cleanup),
        cleanup_in_background=background,
    )
