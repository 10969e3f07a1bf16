"""Java-serialized Flink ``LogicalType`` objects -> :class:`~statequery.serializers.spec.SqlType`.

Flink SQL's serializer snapshots (``RowDataSerializer$RowDataSerializerSnapshot``,
``ArrayDataSerializer$…``, ``MapDataSerializer$…``, ``ExternalSerializer$…``) embed
``LogicalType``s written with ``InstantiationUtil.serializeObject``: one complete Java
serialization stream (``AC ED 00 05``) per object, with no length prefix. They are read here one
stream at a time with the ``javaobj`` v1 unmarshaller, which consumes exactly one stream, so the
decoder continues right after it.

``LogicalType`` is a plain ``Serializable``: the ``typeRoot`` field (``LogicalTypeRoot``) names the
type and fields such as ``length``, ``precision``, ``scale`` and ``isNullable`` its parameters;
``RowType`` holds ``RowField(name, type, description)`` records.
"""

from __future__ import annotations

import io
import logging
from typing import Any

from statequery.decoder import Decoder
from statequery.exceptions import CorruptStateError
from statequery.serializers.spec import SqlField, SqlType

__all__ = [
    "JAVA_STREAM_MAGIC",
    "logical_type_from_java",
    "read_java_object",
    "read_logical_type",
    "skip_java_object",
]

JAVA_STREAM_MAGIC = b"\xac\xed\x00\x05"

# LogicalTypeRoot names whose classes carry a ``length`` field
_LENGTH_ROOTS = frozenset({"CHAR", "VARCHAR", "BINARY", "VARBINARY"})
_PRECISION_ROOTS = frozenset(
    {
        "TIME_WITHOUT_TIME_ZONE",
        "TIMESTAMP_WITHOUT_TIME_ZONE",
        "TIMESTAMP_WITH_LOCAL_TIME_ZONE",
        "TIMESTAMP_WITH_TIME_ZONE",
    }
)
# class simple name -> root, for the (rare) objects whose typeRoot cannot be read
_CLASS_ROOTS = {
    "BooleanType": "BOOLEAN",
    "TinyIntType": "TINYINT",
    "SmallIntType": "SMALLINT",
    "IntType": "INTEGER",
    "BigIntType": "BIGINT",
    "FloatType": "FLOAT",
    "DoubleType": "DOUBLE",
    "DecimalType": "DECIMAL",
    "CharType": "CHAR",
    "VarCharType": "VARCHAR",
    "BinaryType": "BINARY",
    "VarBinaryType": "VARBINARY",
    "DateType": "DATE",
    "TimeType": "TIME_WITHOUT_TIME_ZONE",
    "TimestampType": "TIMESTAMP_WITHOUT_TIME_ZONE",
    "LocalZonedTimestampType": "TIMESTAMP_WITH_LOCAL_TIME_ZONE",
    "ZonedTimestampType": "TIMESTAMP_WITH_TIME_ZONE",
    "YearMonthIntervalType": "INTERVAL_YEAR_MONTH",
    "DayTimeIntervalType": "INTERVAL_DAY_TIME",
    "ArrayType": "ARRAY",
    "MultisetType": "MULTISET",
    "MapType": "MAP",
    "RowType": "ROW",
    "StructuredType": "STRUCTURED_TYPE",
    "DistinctType": "DISTINCT_TYPE",
    "RawType": "RAW",
    "NullType": "NULL",
    "SymbolType": "SYMBOL",
    "VariantType": "VARIANT",
    "DescriptorType": "DESCRIPTOR",
    "BitmapType": "BITMAP",
}


# javaobj logs a state dump at ERROR level before it raises; its failures become typed errors here
# (or a state listed as not decodable), so its own log output would only be noise on stderr.
_javaobj_log = logging.getLogger("javaobj")
_javaobj_log.addHandler(logging.NullHandler())
_javaobj_log.propagate = False


def read_java_object(decoder: Decoder, what: str = "Java-serialized object") -> Any:
    """Read one Java serialization stream at the decoder's position (javaobj v1 bean tree)."""
    from javaobj.v1.transformers import DefaultObjectTransformer
    from javaobj.v1.unmarshaller import JavaObjectUnmarshaller

    start = decoder.pos
    if decoder.remaining < 4 or bytes(decoder.buf[start : start + 4]) != JAVA_STREAM_MAGIC:
        raise decoder.error(f"expected a {what} (AC ED 00 05)")
    stream = io.BytesIO(bytes(decoder.buf[start : decoder.end]))
    try:
        unmarshaller = JavaObjectUnmarshaller(stream)  # type: ignore[no-untyped-call]
        unmarshaller.add_transformer(DefaultObjectTransformer())  # type: ignore[no-untyped-call]
        # bytes after the stream are our normal case: the snapshot continues there
        obj = unmarshaller.readObject(ignore_remaining_data=True)  # type: ignore[no-untyped-call]
    except CorruptStateError:
        raise
    except (Exception, RecursionError) as e:  # javaobj raises plain IOError/ValueError/KeyError...
        raise CorruptStateError(
            f"cannot read the {what}: {type(e).__name__}: {e}",
            decoder.source,
            decoder.base_offset + start,
        ) from e
    consumed = stream.tell()
    decoder.skip(consumed)
    return obj


def skip_java_object(decoder: Decoder, what: str = "Java-serialized object") -> None:
    read_java_object(decoder, what)


def read_logical_type(decoder: Decoder) -> SqlType:
    """Read one Java-serialized ``LogicalType`` and convert it."""
    start = decoder.offset
    obj = read_java_object(decoder, "Java-serialized LogicalType")
    try:
        return logical_type_from_java(obj)
    except CorruptStateError:
        raise
    except Exception as e:
        raise CorruptStateError(
            f"not a Flink LogicalType: {type(e).__name__}: {e}", decoder.source, start
        ) from e


def _class_name(obj: Any) -> str:
    cd = getattr(obj, "classdesc", None)
    return str(getattr(cd, "name", "") or "")


def _field(obj: Any, name: str, default: Any = None) -> Any:
    return getattr(obj, name, default)


def _list(obj: Any) -> list[Any]:
    """Elements of a Java List as javaobj decodes it (ArrayList, unmodifiable wrappers...)."""
    if obj is None:
        return []
    if isinstance(obj, list):
        return list(obj)
    for inner in ("c", "list", "elementData"):
        v = getattr(obj, inner, None)
        if v is not None and v is not obj:
            return _list(v)
    anns = getattr(obj, "annotations", None) or []
    return [a for a in anns if hasattr(a, "classdesc")]


def _str(v: Any) -> str | None:
    return None if v is None else str(v)


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def _java_class_name(v: Any) -> str | None:
    if v is None:
        return None
    name = getattr(v, "name", None)
    return str(name) if name else None


def logical_type_from_java(obj: Any) -> SqlType:
    """Convert a javaobj bean of ``org.apache.flink.table.types.logical.*Type`` to a SqlType."""
    cls = _class_name(obj)
    root_obj = _field(obj, "typeRoot")
    root = str(getattr(root_obj, "constant", "") or "") or _CLASS_ROOTS.get(
        cls.rsplit(".", 1)[-1], ""
    )
    if not root:
        raise ValueError(f"{cls or type(obj).__name__} has no typeRoot")
    nullable = bool(_field(obj, "isNullable", True))
    kw: dict[str, Any] = {}
    if root in _LENGTH_ROOTS:
        kw["length"] = _int(_field(obj, "length"))
    elif root == "DECIMAL":
        kw["precision"] = _int(_field(obj, "precision"))
        kw["scale"] = _int(_field(obj, "scale"))
    elif root in _PRECISION_ROOTS:
        kw["precision"] = _int(_field(obj, "precision"))
    elif root == "INTERVAL_YEAR_MONTH":
        kw["precision"] = _int(_field(obj, "yearPrecision"))
        res = _field(obj, "resolution")
        kw["class_name"] = _str(getattr(res, "constant", None))
    elif root == "INTERVAL_DAY_TIME":
        kw["precision"] = _int(_field(obj, "dayPrecision"))
        kw["scale"] = _int(_field(obj, "fractionalPrecision"))
        res = _field(obj, "resolution")
        kw["class_name"] = _str(getattr(res, "constant", None))
    elif root in ("ARRAY", "MULTISET"):
        kw["element"] = logical_type_from_java(_field(obj, "elementType"))
    elif root == "MAP":
        kw["key"] = logical_type_from_java(_field(obj, "keyType"))
        kw["value"] = logical_type_from_java(_field(obj, "valueType"))
    elif root == "ROW":
        kw["fields"] = tuple(
            SqlField(
                str(_field(f, "name")),
                logical_type_from_java(_field(f, "type")),
                _str(_field(f, "description")),
            )
            for f in _list(_field(obj, "fields"))
        )
    elif root == "STRUCTURED_TYPE":
        kw["fields"] = tuple(
            SqlField(
                str(_field(a, "name")),
                logical_type_from_java(_field(a, "type")),
                _str(_field(a, "description")),
            )
            for a in _list(_field(obj, "attributes"))
        )
        kw["class_name"] = _java_class_name(_field(obj, "implementationClass")) or _str(
            _field(obj, "className")
        )
    elif root == "DISTINCT_TYPE":
        source = logical_type_from_java(_field(obj, "sourceType"))
        return SqlType(**{**source.__dict__, "nullable": nullable})
    elif root == "RAW":
        kw["class_name"] = _java_class_name(_field(obj, "clazz"))
    return SqlType(root, nullable, **kw)
