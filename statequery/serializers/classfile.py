"""Java class files read without a JVM: what Kryo's ``FieldSerializer`` needs of a class.

A job's jar holds the classes Flink serialized with Kryo. This module reads them: the constant
pool, the access flags, the superclass and interfaces, and every field with its descriptor and
generic ``Signature`` attribute (JVMS chapter 4). Methods and code are skipped. :class:`ClassPath`
looks classes up by their binary name (``pkg.Outer$Inner``) in jars and class directories, in
order, reading each class file once.

Everything is bounds-checked: a truncated or malformed class file raises
:class:`~statequery.exceptions.CorruptStateError` naming the file and the offset.
"""

from __future__ import annotations

import os
import struct
import threading
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from statequery.exceptions import CorruptStateError, InvalidOptionError

__all__ = [
    "ACC_ABSTRACT",
    "ACC_ENUM",
    "ACC_FINAL",
    "ACC_INTERFACE",
    "ACC_STATIC",
    "ACC_SYNTHETIC",
    "ACC_TRANSIENT",
    "ClassInfo",
    "ClassPath",
    "FieldInfo",
    "JType",
    "parse_class",
    "parse_descriptor",
    "parse_signature",
]

ACC_PUBLIC = 0x0001
ACC_STATIC = 0x0008
ACC_FINAL = 0x0010
ACC_TRANSIENT = 0x0080
ACC_INTERFACE = 0x0200
ACC_ABSTRACT = 0x0400
ACC_SYNTHETIC = 0x1000
ACC_ENUM = 0x4000

_MAGIC = 0xCAFEBABE
#: a class file larger than this is not a class Kryo would serialize (and not read)
MAX_CLASS_BYTES = 16 * 1024 * 1024

#: descriptor letter -> Java primitive name
PRIMITIVES = {
    "B": "byte", "C": "char", "D": "double", "F": "float", "I": "int", "J": "long",
    "S": "short", "Z": "boolean", "V": "void",
}


@dataclass(frozen=True)
class JType:
    """A Java type from a descriptor or generic signature.

    ``name`` is a primitive name (``int``), a binary class name (``java.util.List``) or, for a
    type variable, its name with ``var`` set; ``args`` the type arguments (``None`` for ``*``,
    bounded wildcards by their bound); ``dims`` the array dimensions.
    """

    name: str
    args: tuple[JType | None, ...] = ()
    dims: int = 0
    var: bool = False

    @property
    def primitive(self) -> bool:
        return self.dims == 0 and not self.var and self.name in PRIMITIVES.values()

    def element(self) -> JType:
        """The component type of an array type."""
        return JType(self.name, self.args, self.dims - 1, self.var)

    def __str__(self) -> str:
        base = self.name
        if self.args:
            base += "<" + ", ".join("?" if a is None else str(a) for a in self.args) + ">"
        return base + "[]" * self.dims


@dataclass(frozen=True)
class FieldInfo:
    name: str
    access: int
    descriptor: str
    signature: str | None = None

    @property
    def static(self) -> bool:
        return bool(self.access & ACC_STATIC)

    @property
    def transient(self) -> bool:
        return bool(self.access & ACC_TRANSIENT)

    @property
    def synthetic(self) -> bool:
        return bool(self.access & ACC_SYNTHETIC)

    @property
    def enum_constant(self) -> bool:
        return bool(self.access & ACC_ENUM)

    @property
    def type(self) -> JType:
        """The field's type: from its generic signature when it has one, else its descriptor."""
        if self.signature is not None:
            return parse_signature(self.signature)
        return parse_descriptor(self.descriptor)


@dataclass(frozen=True)
class ClassInfo:
    """One class file: binary names (dots, ``$`` for nested classes), flags, fields in
    declaration order."""

    name: str
    access: int
    super_name: str | None
    interfaces: tuple[str, ...]
    fields: tuple[FieldInfo, ...]
    signature: str | None = None
    version: tuple[int, int] = (0, 0)
    source: str = field(default="", compare=False)

    @property
    def interface(self) -> bool:
        return bool(self.access & ACC_INTERFACE)

    @property
    def abstract(self) -> bool:
        return bool(self.access & (ACC_ABSTRACT | ACC_INTERFACE))

    @property
    def final(self) -> bool:
        return bool(self.access & ACC_FINAL)

    @property
    def enum(self) -> bool:
        return bool(self.access & ACC_ENUM) and self.super_name == "java.lang.Enum"

    def enum_constants(self) -> tuple[str, ...]:
        """An enum's constants in ordinal order (javac emits them first, in declaration order)."""
        own = "L" + self.name.replace(".", "/") + ";"
        return tuple(f.name for f in self.fields
                     if f.enum_constant and f.static and f.descriptor == own)


class _Reader:
    __slots__ = ("data", "pos", "source")

    def __init__(self, data: bytes, source: str) -> None:
        self.data = data
        self.pos = 0
        self.source = source

    def error(self, what: str) -> CorruptStateError:
        return CorruptStateError(f"{self.source}: bad class file at offset {self.pos}: {what}")

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.data):
            raise self.error(f"{n} bytes wanted, {len(self.data) - self.pos} left")
        out = self.data[self.pos:end]
        self.pos = end
        return out

    def u1(self) -> int:
        return self.take(1)[0]

    def u2(self) -> int:
        v: int = struct.unpack(">H", self.take(2))[0]
        return v

    def u4(self) -> int:
        v: int = struct.unpack(">I", self.take(4))[0]
        return v


def _modified_utf8(raw: bytes) -> str:
    """Java's modified UTF-8 (NUL as C0 80, supplementary characters as surrogate pairs)."""
    text = raw.replace(b"\xc0\x80", b"\x00").decode("utf-8", "surrogatepass")
    if any("\ud800" <= c <= "\udfff" for c in text):
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def parse_class(data: bytes, source: str = "<class>") -> ClassInfo:
    """A class file's bytes -> :class:`ClassInfo` (fields only; methods are skipped)."""
    r = _Reader(data, source)
    if len(data) < 10 or r.u4() != _MAGIC:
        raise CorruptStateError(f"{source}: not a class file (no 0xCAFEBABE magic)")
    minor, major = r.u2(), r.u2()
    count = r.u2()
    utf8: dict[int, str] = {}
    classes: dict[int, int] = {}
    i = 1
    while i < count:
        tag = r.u1()
        if tag == 1:
            try:
                utf8[i] = _modified_utf8(r.take(r.u2()))
            except UnicodeDecodeError as e:
                raise r.error(f"constant {i}: bad modified UTF-8 ({e.reason})") from None
        elif tag == 7:
            classes[i] = r.u2()
        elif tag in (3, 4):
            r.take(4)
        elif tag in (5, 6):
            r.take(8)
            i += 1  # takes two constant pool slots
        elif tag in (9, 10, 11, 12, 17, 18):
            r.take(4)
        elif tag == 15:
            r.take(3)
        elif tag in (8, 16, 19, 20):
            r.take(2)
        else:
            raise r.error(f"unknown constant pool tag {tag} at index {i}")
        i += 1

    def text(index: int, what: str) -> str:
        try:
            return utf8[index]
        except KeyError:
            raise r.error(f"{what}: constant {index} is not a UTF-8 entry") from None

    def class_name(index: int, what: str) -> str:
        try:
            return text(classes[index], what).replace("/", ".")
        except KeyError:
            raise r.error(f"{what}: constant {index} is not a class entry") from None

    def signature_of(attributes: list[tuple[str, bytes]]) -> str | None:
        for name, body in attributes:
            if name == "Signature" and len(body) == 2:
                return text(struct.unpack(">H", body)[0], "Signature")
        return None

    def attributes() -> list[tuple[str, bytes]]:
        out = []
        for _ in range(r.u2()):
            name = text(r.u2(), "attribute name")
            body = r.take(r.u4())
            if name == "Signature":
                out.append((name, body))
        return out

    access = r.u2()
    this_name = class_name(r.u2(), "this_class")
    super_index = r.u2()
    super_name = class_name(super_index, "super_class") if super_index else None
    interfaces = tuple(class_name(r.u2(), "interface") for _ in range(r.u2()))
    fields = []
    for _ in range(r.u2()):
        f_access = r.u2()
        f_name = text(r.u2(), "field name")
        f_desc = text(r.u2(), "field descriptor")
        fields.append(FieldInfo(f_name, f_access, f_desc, signature_of(attributes())))
    for _ in range(r.u2()):  # methods: skipped
        r.take(6)
        attributes()
    signature = signature_of(attributes())
    return ClassInfo(this_name, access, super_name, interfaces, tuple(fields), signature,
                     (major, minor), source)


class _SigReader:
    __slots__ = ("pos", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def error(self, what: str) -> InvalidOptionError:
        return InvalidOptionError(f"bad Java type signature {self.text!r} at {self.pos}: {what}")

    def peek(self) -> str:
        if self.pos >= len(self.text):
            raise self.error("unexpected end")
        return self.text[self.pos]

    def next(self) -> str:
        c = self.peek()
        self.pos += 1
        return c

    def type(self, depth: int = 0) -> JType:
        if depth > 64:
            raise self.error("nested deeper than 64")
        dims = 0
        while self.peek() == "[":
            self.pos += 1
            dims += 1
        c = self.next()
        if c in PRIMITIVES:
            return JType(PRIMITIVES[c], dims=dims)
        if c == "T":
            end = self.text.find(";", self.pos)
            if end < 0:
                raise self.error("unterminated type variable")
            name = self.text[self.pos:end]
            self.pos = end + 1
            return JType(name, dims=dims, var=True)
        if c != "L":
            raise self.error(f"unexpected {c!r}")
        name = ""
        args: tuple[JType | None, ...] = ()
        while True:
            start = self.pos
            while self.peek() not in "<;.":
                self.pos += 1
            name += self.text[start:self.pos]
            c = self.next()
            if c == "<":
                collected: list[JType | None] = []
                while self.peek() != ">":
                    w = self.peek()
                    if w == "*":
                        self.pos += 1
                        collected.append(None)
                    else:
                        if w in "+-":
                            self.pos += 1
                        collected.append(self.type(depth + 1))
                self.pos += 1
                args = tuple(collected)
                c = self.next()
            if c == ";":
                break
            if c == ".":  # an inner class of a parameterized outer: Outer<T>.Inner
                name += "$"
                args = ()
                continue
            raise self.error(f"unexpected {c!r}")
        return JType(name.replace("/", "."), args, dims)


def parse_descriptor(descriptor: str) -> JType:
    """A field descriptor (``[Ljava/lang/String;``) -> :class:`JType`."""
    return parse_signature(descriptor)


def parse_signature(signature: str) -> JType:
    """A field's generic signature (``Ljava/util/Map<Ljava/lang/String;Ljava/lang/Integer;>;``)
    -> :class:`JType`."""
    r = _SigReader(signature)
    t = r.type()
    if r.pos != len(signature):
        raise r.error("trailing characters")
    return t


class ClassPath:
    """Classes looked up by binary name in jars (or directories of class files), first match wins.

    Thread-safe; each class is parsed once. A class absent from every entry is ``None``.
    """

    def __init__(self, entries: Sequence[str | os.PathLike[str]]) -> None:
        self.entries = tuple(os.fspath(e) for e in entries)
        self._lock = threading.Lock()
        self._zips: dict[str, zipfile.ZipFile] = {}
        self._cache: dict[str, ClassInfo | None] = {}
        for entry in self.entries:
            if not os.path.exists(entry):
                raise InvalidOptionError(f"classpath entry {entry!r} does not exist")
            if not os.path.isdir(entry):
                try:
                    self._zips[entry] = zipfile.ZipFile(entry)
                except (zipfile.BadZipFile, OSError) as e:
                    raise InvalidOptionError(
                        f"classpath entry {entry!r} is not a jar: {e}") from None

    def __repr__(self) -> str:
        return f"ClassPath({list(self.entries)!r})"

    def close(self) -> None:
        with self._lock:
            for z in self._zips.values():
                z.close()
            self._zips.clear()

    def _read(self, name: str) -> tuple[bytes, str] | None:
        member = name.replace(".", "/") + ".class"
        for entry in self.entries:
            z = self._zips.get(entry)
            if z is not None:
                try:
                    info = z.getinfo(member)
                except KeyError:
                    continue
                if info.file_size > MAX_CLASS_BYTES:
                    raise CorruptStateError(f"{entry}!{member}: larger than {MAX_CLASS_BYTES}")
                return z.read(info), f"{entry}!{member}"
            path = os.path.join(entry, *member.split("/"))
            if os.path.isfile(path):
                if os.path.getsize(path) > MAX_CLASS_BYTES:
                    raise CorruptStateError(f"{path}: larger than {MAX_CLASS_BYTES}")
                with open(path, "rb") as f:
                    return f.read(), path
        return None

    def find(self, name: str) -> ClassInfo | None:
        """The class ``name`` (binary name), or None when no entry has it."""
        with self._lock:
            if name in self._cache:
                return self._cache[name]
            found = self._read(name)
            info = parse_class(*found) if found is not None else None
            self._cache[name] = info
            return info

    def class_names(self) -> list[str]:
        """Every class the entries hold (binary names), in entry order."""
        names: list[str] = []
        seen: set[str] = set()
        for entry in self.entries:
            members: Iterable[str]
            z = self._zips.get(entry)
            if z is not None:
                members = z.namelist()
            else:
                members = (os.path.relpath(os.path.join(d, f), entry).replace(os.sep, "/")
                           for d, _, files in os.walk(entry) for f in files)
            for m in members:
                if m.endswith(".class") and not m.endswith(("module-info.class",
                                                            "package-info.class")):
                    n = m[:-6].replace("/", ".")
                    if n not in seen:
                        seen.add(n)
                        names.append(n)
        return names
