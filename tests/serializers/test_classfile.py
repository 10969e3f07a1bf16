"""statequery.serializers.classfile: the job's classes read from its jar, no JVM (issue 32)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from statequery.exceptions import CorruptStateError, InvalidOptionError
from statequery.serializers.classfile import (
    ACC_FINAL,
    ClassPath,
    JType,
    parse_class,
    parse_signature,
)
from statequery.serializers.kryo import KryoRegistration

JAR = Path(__file__).resolve().parents[1] / "fixtures" / "types-kryo-hashmap-canonical" / "job.jar"
PKG = "statequery.kryotypes"


@pytest.fixture(scope="module")
def cp() -> ClassPath:
    path = ClassPath([JAR])
    yield path
    path.close()


def test_fields_in_declaration_order_with_flags_and_generic_types(cp: ClassPath) -> None:
    order = cp.find(f"{PKG}.Order")
    assert order is not None and order.super_name == f"{PKG}.Entity"
    names = [f.name for f in order.fields]
    assert names[:4] == ["NAMES", "customer", "alias", "quantity"]
    assert names[-3:] == ["created", "due", "seen"]
    by = {f.name: f for f in order.fields}
    assert by["NAMES"].static and not by["customer"].static
    assert by["customer"].access & ACC_FINAL and by["customer"].descriptor == "Ljava/lang/String;"
    assert by["items"].type == JType("java.util.List", (JType("java.lang.String"),))
    assert by["counts"].type == JType(
        "java.util.Map", (JType("java.lang.String"), JType("java.lang.Integer")))
    assert by["lines"].type == JType("java.util.List", (JType(f"{PKG}.Order$Line"),))
    assert by["scores"].type == JType("int", dims=1) and by["scores"].type.element().primitive
    assert by["tags"].type == JType("java.lang.String", dims=1)
    assert by["count"].type.primitive and by["letter"].type.name == "char"
    assert by["shape"].type == JType(f"{PKG}.Shape")


def test_superclass_static_transient_enum_interface_nested(cp: ClassPath) -> None:
    entity = cp.find(f"{PKG}.Entity")
    assert entity is not None and entity.abstract and not entity.interface
    flags = {f.name: (f.static, f.transient) for f in entity.fields}
    assert flags == {"created": (True, False), "id": (False, False), "cached": (False, True)}
    assert entity.super_name == "java.lang.Object"
    color = cp.find(f"{PKG}.Color")
    assert color is not None and color.enum and color.final
    assert color.enum_constants() == ("RED", "GREEN", "BLUE")
    shape = cp.find(f"{PKG}.Shape")
    assert shape is not None and shape.interface and shape.abstract and shape.fields == ()
    circle = cp.find(f"{PKG}.Circle")
    assert circle is not None and circle.final and circle.interfaces == (f"{PKG}.Shape",)
    line = cp.find(f"{PKG}.Order$Line")
    assert line is not None and not line.final and [f.name for f in line.fields] == ["sku", "qty"]
    assert cp.find(f"{PKG}.Missing") is None
    assert f"{PKG}.Order$Line" in cp.class_names()


def test_signatures() -> None:
    t = parse_signature("Ljava/util/Map<+Ljava/lang/Number;*>;")
    assert t == JType("java.util.Map", (JType("java.lang.Number"), None))
    t = parse_signature("[[Ljava/util/List<[I>;")
    assert t.dims == 2 and t.args == (JType("int", dims=1),)
    assert parse_signature("TT;") == JType("T", var=True)
    inner = parse_signature("La/Outer<TK;>.Inner<Ljava/lang/String;>;")
    assert inner == JType("a.Outer$Inner", (JType("java.lang.String"),))
    with pytest.raises(InvalidOptionError, match="bad Java type signature"):
        parse_signature("Ljava/util/List<")
    with pytest.raises(InvalidOptionError, match="trailing"):
        parse_signature("II")


def test_truncated_and_foreign_bytes_are_typed_errors(cp: ClassPath, tmp_path: Path) -> None:
    with zipfile.ZipFile(JAR) as z:
        data = z.read("statequery/kryotypes/Order.class")
    for cut in (12, 30, len(data) // 2, len(data) - 1):
        with pytest.raises(CorruptStateError, match=r"Order.class: bad class file at offset \d+"):
            parse_class(data[:cut], "Order.class")
    with pytest.raises(CorruptStateError, match="not a class file"):
        parse_class(b"PK\x03\x04" + data[4:], "x.class")
    bad = bytearray(data)
    bad[10] = 99  # the first constant's tag
    with pytest.raises(CorruptStateError, match="unknown constant pool tag 99"):
        parse_class(bytes(bad), "Order.class")
    with pytest.raises(InvalidOptionError, match="does not exist"):
        ClassPath([tmp_path / "nope.jar"])
    (tmp_path / "notajar.jar").write_bytes(b"hello")
    with pytest.raises(InvalidOptionError, match="is not a jar"):
        ClassPath([tmp_path / "notajar.jar"])


def test_directory_entries_and_modified_utf8(tmp_path: Path) -> None:
    with zipfile.ZipFile(JAR) as z:
        z.extract("statequery/kryotypes/Order.class", tmp_path)
    cp = ClassPath([tmp_path])
    order = cp.find(f"{PKG}.Order")
    assert order is not None and order.source.endswith("Order.class")
    assert cp.class_names() == [f"{PKG}.Order"]
    # a field named with NUL and a non-BMP character in modified UTF-8 (C0 80, surrogate pair)
    name = "n\x00\U0001f600"
    surrogates = b"\xed\xa0\xbd\xed\xb8\x80"  # U+D83D U+DE00, each as three bytes
    data = _class_with_field(b"n\xc0\x80" + surrogates)
    info = parse_class(data, "synthetic.class")
    assert [f.name for f in info.fields] == [name]


def _class_with_field(field_name: bytes) -> bytes:
    import struct

    pool = [
        b"\x01" + struct.pack(">H", 1) + b"A",          # 1 Utf8 "A"
        b"\x07" + struct.pack(">H", 1),                  # 2 Class A
        b"\x01" + struct.pack(">H", len(field_name)) + field_name,  # 3 field name
        b"\x01" + struct.pack(">H", 1) + b"I",          # 4 descriptor
    ]
    out = struct.pack(">IHHH", 0xCAFEBABE, 0, 61, len(pool) + 1) + b"".join(pool)
    out += struct.pack(">HHHH", 0x21, 2, 0, 0)          # access, this, super, interfaces
    out += struct.pack(">H", 1) + struct.pack(">HHHH", 0x2, 3, 4, 0)  # one field
    out += struct.pack(">HH", 0, 0)                       # methods, attributes
    return out


def synthetic_class(name: str, super_name: str | None, interfaces: tuple[str, ...] = (),
                    fields: tuple[tuple[str, str, int], ...] = (), access: int = 0x21) -> bytes:
    """A minimal class file: ``fields`` as (name, descriptor, access)."""
    import struct

    pool: list[bytes] = []

    def utf8(text: str) -> int:
        raw = text.encode()
        pool.append(b"\x01" + struct.pack(">H", len(raw)) + raw)
        return len(pool)

    def cls(binary: str) -> int:
        index = utf8(binary.replace(".", "/"))
        pool.append(b"\x07" + struct.pack(">H", index))
        return len(pool)

    this = cls(name)
    sup = cls(super_name) if super_name else 0
    ifaces = [cls(i) for i in interfaces]
    field_refs = [(utf8(n), utf8(d), a) for n, d, a in fields]
    out = struct.pack(">IHHH", 0xCAFEBABE, 0, 61, len(pool) + 1) + b"".join(pool)
    out += struct.pack(">HHHH", access, this, sup, len(ifaces))
    out += b"".join(struct.pack(">H", i) for i in ifaces)
    out += struct.pack(">H", len(field_refs))
    out += b"".join(struct.pack(">HHHH", a, n, d, 0) for n, d, a in field_refs)
    out += struct.pack(">HH", 0, 0)
    return out


def test_classes_kryo_does_not_write_with_field_serializer_are_refused(tmp_path: Path) -> None:
    """A class implementing Map (directly or through an interface of the jar), KryoSerializable,
    a record (a JDK superclass), or a class with a default serializer of the job's: Kryo writes
    them otherwise, so they are not typed as FieldSerializer structs."""
    from statequery.serializers.kryo import KryoCodec, KryoUndecodable

    classes = {
        "a.MyMap": synthetic_class("a.MyMap", "java.lang.Object", ("a.Lookup",)),
        "a.Lookup": synthetic_class("a.Lookup", "java.lang.Object", ("java.util.Map",),
                                    access=0x601),
        "a.Self": synthetic_class("a.Self", "java.lang.Object",
                                  ("com.esotericsoftware.kryo.KryoSerializable",)),
        "a.Rec": synthetic_class("a.Rec", "java.lang.Record", (), (("x", "I", 0x12),)),
        "a.Plain": synthetic_class("a.Plain", "java.lang.Object", (), (("x", "I", 0x2),)),
    }
    for name, data in classes.items():
        (tmp_path / "a").mkdir(exist_ok=True)
        (tmp_path / "a" / f"{name[2:]}.class").write_bytes(data)
    cp = ClassPath([tmp_path])
    for name, why in (("a.MyMap", "implements java.util.Map"),
                      ("a.Self", "implements com.esotericsoftware.kryo.KryoSerializable"),
                      ("a.Rec", "java.lang.Record is not in the classpath")):
        with pytest.raises(KryoUndecodable, match=why):
            KryoCodec(cp, name, (KryoRegistration(name),)).arrow_type()
    assert str(KryoCodec(cp, "a.Plain").arrow_type()) == "struct<x: int32>"
    with pytest.raises(KryoUndecodable, match="a.Plain has its own Kryo serializer"):
        KryoCodec(cp, "a.Plain", (), ("a.Plain",)).arrow_type()
