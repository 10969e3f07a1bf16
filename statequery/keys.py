"""Keys typed by a user as text (the CLI, the Spark ``key`` option, SQL literals), turned into key
values.

The key's serializer decides: ``42`` is the number 42 for a ``Long`` key and the string "42" for a
``String`` key. Composite keys (Tuple, Row, SQL ``RowData``) take a JSON array or object; a
one-field row also takes its single value as plain text.

JSON field values are converted to the field's type only when the conversion is exact: ``5`` or
``5.0`` or ``"5"`` for a BIGINT field, ``"true"`` for a BOOLEAN. A value that would need a guess
(``5`` for a STRING field, ``true`` for an INT, ``5.5`` for a BIGINT, ``300`` for a TINYINT) raises
:class:`~statequery.exceptions.InvalidKeyError` naming the field and the type it expects.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from statequery.exceptions import InvalidKeyError
from statequery.serializers.spec import (
    NullableSpec,
    PrimitiveSpec,
    RowDataSpec,
    RowSpec,
    SerializerSpec,
    SqlType,
    TupleSpec,
)

__all__ = ["convert_key", "key_type_name", "parse_key_text"]

# integer kinds and their two's complement width in bits
_INT_PRIMITIVES = {"long": 64, "int": 32, "short": 16, "byte": 8}
_FLOAT_PRIMITIVES = ("float", "double")
_STR_PRIMITIVES = ("string", "string_data", "char")
_INT_SQL = {
    "TINYINT": 8,
    "SMALLINT": 16,
    "INTEGER": 32,
    "BIGINT": 64,
    "DATE": 32,
    "TIME_WITHOUT_TIME_ZONE": 32,
    "INTERVAL_YEAR_MONTH": 32,
    "INTERVAL_DAY_TIME": 64,
}
_INT_TEXT = re.compile(r"[+-]?\d+")

FieldType = SerializerSpec | SqlType


def key_type_name(spec: FieldType | None) -> str:
    """The type name ``inspect`` shows for a key (or key field) type."""
    if spec is None:
        return "unknown"
    if isinstance(spec, SqlType):
        return str(spec)
    from statequery.metadata.statemeta import type_string

    return type_string(spec) or spec.display


def _unwrap(spec: FieldType | None) -> FieldType | None:
    while isinstance(spec, NullableSpec):
        spec = spec.inner
    return spec


def _kind_of(spec: FieldType | None) -> tuple[str, int]:
    """``(kind, bits)``: kind is int, float, bool, str or other (passed through unchanged)."""
    spec = _unwrap(spec)
    if isinstance(spec, PrimitiveSpec):
        name = spec.name.removesuffix("_value")
        if name in _INT_PRIMITIVES:
            return "int", _INT_PRIMITIVES[name]
        if name == "bigint":
            return "int", 0  # java.math.BigInteger: unbounded
        if name in _FLOAT_PRIMITIVES:
            return "float", 0
        if name == "boolean":
            return "bool", 0
        if name in _STR_PRIMITIVES:
            return "str", 0
    if isinstance(spec, SqlType):
        if spec.root in _INT_SQL:
            return "int", _INT_SQL[spec.root]
        if spec.root in ("FLOAT", "DOUBLE"):
            return "float", 0
        if spec.root == "BOOLEAN":
            return "bool", 0
        if spec.root in ("CHAR", "VARCHAR"):
            return "str", 0
    return "other", 0


def _fields(spec: FieldType | None) -> list[tuple[str, FieldType]] | None:
    """``(name, type)`` of each field of a composite key type; None for a scalar type."""
    spec = _unwrap(spec)
    if isinstance(spec, RowDataSpec):
        spec = spec.type
    if isinstance(spec, SqlType):
        if spec.root in ("ROW", "STRUCTURED_TYPE"):
            return [(f.name or f"f{i}", f.type) for i, f in enumerate(spec.fields)]
        return None
    if isinstance(spec, RowSpec):
        return list(zip(spec.field_names, spec.fields, strict=True))
    if isinstance(spec, TupleSpec):
        return [(f"f{i}", f) for i, f in enumerate(spec.fields)]
    return None


def _describe(value: Any) -> str:
    """How a JSON value was read, for error messages."""
    if isinstance(value, bool):
        return f"the boolean {json.dumps(value)}"
    if isinstance(value, (int, float)):
        return f"the number {json.dumps(value)}"
    if isinstance(value, str):
        return f"the string {json.dumps(value)}"
    if value is None:
        return "null"
    if isinstance(value, list):
        return f"the array {json.dumps(value)}"
    return f"the object {json.dumps(value)}"


def _fits(value: int, bits: int) -> bool:
    return not bits or -(1 << (bits - 1)) <= value < (1 << (bits - 1))


def _convert_scalar(value: Any, spec: FieldType | None) -> Any:
    """``value`` (a JSON value) as the Python value of type ``spec``; ValueError if not exact."""
    kind, bits = _kind_of(spec)
    if value is None or kind == "other":
        return value
    if kind == "str":
        if isinstance(value, str):
            return value
    elif kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
    elif kind == "int":
        out: int | None = None
        if isinstance(value, bool):
            out = None
        elif isinstance(value, int):
            out = value
        elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
            out = int(value)
        elif isinstance(value, str) and _INT_TEXT.fullmatch(value.strip()):
            out = int(value.strip())
        if out is not None:
            if not _fits(out, bits):
                raise ValueError(f"{out} is out of range")
            return out
    elif kind == "float":
        if isinstance(value, bool):
            pass
        elif isinstance(value, float):
            return value
        elif isinstance(value, int):
            if abs(value) <= 1 << 53:
                return float(value)
        elif isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    raise ValueError("no exact conversion")


def _convert(value: Any, spec: FieldType | None, path: str, original: str) -> Any:
    """``value`` converted to ``spec``; ``path`` names the field ("" for the whole key)."""
    where = f"field {path}" if path else "the key"
    fields = _fields(spec)
    if fields is None:
        try:
            return _convert_scalar(value, spec)
        except ValueError as e:
            detail = f" ({e})" if str(e) != "no exact conversion" else ""
            if _kind_of(spec)[0] == "str" and isinstance(value, (int, float)):
                detail = f" (for the text write {json.dumps(json.dumps(value))})"
            raise InvalidKeyError(
                f"key {original!r}: {where} is {key_type_name(spec)}, "
                f"got {_describe(value)}{detail}"
            ) from None
    names = [n for n, _ in fields]
    what = f"{where} ({key_type_name(spec)})"
    if isinstance(value, list):
        if len(value) != len(fields):
            raise InvalidKeyError(
                f"key {original!r}: {what} has {len(fields)} field(s) "
                f"({', '.join(names)}), got {len(value)} value(s)"
            )
        items = list(value)
    elif isinstance(value, dict):
        positional = {f"f{i}" for i in range(len(fields))}
        unknown = [k for k in value if k not in names and k not in positional]
        if unknown:
            raise InvalidKeyError(
                f"key {original!r}: {what} has no field {unknown[0]!r} "
                f"(fields: {', '.join(names)})"
            )
        items = []
        for i, name in enumerate(names):
            if name in value:
                items.append(value[name])
            elif f"f{i}" in value:
                items.append(value[f"f{i}"])
            else:
                raise InvalidKeyError(
                    f"key {original!r}: {what} needs field {name!r} "
                    f"(fields: {', '.join(names)})"
                )
    elif len(fields) == 1:
        items = [value]
    else:
        raise InvalidKeyError(
            f"key {original!r}: {what} needs a JSON array or object of {len(fields)} fields, "
            f"got {_describe(value)}"
        )
    return [
        _convert(v, t, f"{path}.{n}" if path else n, original)
        for (n, t), v in zip(fields, items, strict=True)
    ]


def convert_key(value: Any, spec: SerializerSpec | None, text: str | None = None) -> Any:
    """``value`` (Python/JSON values; lists or dicts for composite keys) converted exactly to the
    key type ``spec``. Composite keys come back as a list in field order.

    Raises :class:`InvalidKeyError` naming the field and the type it expects when a value has no
    exact conversion.
    """
    original = text if text is not None else json.dumps(value, default=str)
    return _convert(value, spec, "", original)


def _scalar_text(text: str, spec: FieldType | None, where: str) -> Any:
    kind, bits = _kind_of(spec)
    if kind in ("str", "other"):
        return text
    value: Any = text
    if kind == "float" or (kind == "int" and not _INT_TEXT.fullmatch(text.strip())):
        try:
            value = float(text)
        except ValueError:
            pass
    try:
        return _convert_scalar(value, spec)
    except ValueError as e:
        detail = "" if str(e) == "no exact conversion" else f": {e}"
        raise InvalidKeyError(
            f"key {text!r} was read as the text {text!r}, which is not a valid "
            f"{key_type_name(spec)} ({where}){detail}"
        ) from None


def parse_key_text(text: str, spec: SerializerSpec | None) -> Any:
    """The key value ``text`` stands for, given the key's serializer ``spec``."""
    fields = _fields(spec)
    if fields is None:
        return _scalar_text(text, spec, "the key type")
    stripped = text.strip()
    if stripped[:1] in ("[", "{"):
        try:
            value = json.loads(stripped)
        except ValueError as e:
            raise InvalidKeyError(f"key {text!r} is not valid JSON: {e}") from None
        return convert_key(value, spec, text)
    if len(fields) == 1:
        return [_scalar_text(text, fields[0][1], f"the type of field {fields[0][0]}")]
    raise InvalidKeyError(
        f"the key has {len(fields)} fields: give it as a JSON array or object, e.g. "
        + json.dumps(["..."] * len(fields))
    )
