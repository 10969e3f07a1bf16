"""Keys typed by a user as text (the CLI, the Spark ``key`` option), turned into key values.

The key's serializer decides: ``42`` is the number 42 for a ``Long`` key and the string "42" for a
``String`` key. Composite keys (Tuple, Row, SQL ``RowData``) take a JSON array or object; a
one-field row also takes its single value as plain text.
"""

from __future__ import annotations

import json
from typing import Any

from statequery.exceptions import InvalidOptionError
from statequery.serializers.spec import (
    PrimitiveSpec,
    RowDataSpec,
    RowSpec,
    SerializerSpec,
    SqlType,
    TupleSpec,
)

__all__ = ["parse_key_text"]

_INT_PRIMITIVES = ("long", "int", "short", "byte")
_FLOAT_PRIMITIVES = ("float", "double")
_INT_SQL = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "DATE", "TIME_WITHOUT_TIME_ZONE",
            "INTERVAL_YEAR_MONTH", "INTERVAL_DAY_TIME")


def _scalar(text: str, kind: str) -> Any:
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        if kind == "bool":
            if text.strip().lower() not in ("true", "false"):
                raise ValueError(text)
            return text.strip().lower() == "true"
    except ValueError:
        raise InvalidOptionError(f"key {text!r} is not a valid {kind} for this key type") from None
    return text


def _kind_of(spec: SerializerSpec | SqlType | None) -> str:
    if isinstance(spec, PrimitiveSpec):
        name = spec.name.removesuffix("_value")
        if name in _INT_PRIMITIVES:
            return "int"
        if name in _FLOAT_PRIMITIVES:
            return "float"
        if name == "boolean":
            return "bool"
    if isinstance(spec, SqlType):
        if spec.root in _INT_SQL:
            return "int"
        if spec.root in ("FLOAT", "DOUBLE"):
            return "float"
        if spec.root == "BOOLEAN":
            return "bool"
    return "str"


def _fields(spec: SerializerSpec | None) -> list[SerializerSpec | SqlType] | None:
    if isinstance(spec, RowDataSpec):
        return [f.type for f in spec.type.fields]
    if isinstance(spec, (RowSpec, TupleSpec)):
        return list(spec.fields)
    return None


def parse_key_text(text: str, spec: SerializerSpec | None) -> Any:
    """The key value ``text`` stands for, given the key's serializer ``spec``."""
    fields = _fields(spec)
    if fields is None:
        return _scalar(text, _kind_of(spec))
    stripped = text.strip()
    if stripped[:1] in ("[", "{"):
        try:
            return json.loads(stripped)
        except ValueError as e:
            raise InvalidOptionError(f"key {text!r} is not valid JSON: {e}") from None
    if len(fields) == 1:
        return [_scalar(text, _kind_of(fields[0]))]
    raise InvalidOptionError(
        f"the key has {len(fields)} fields: give it as a JSON array or object, e.g. "
        + json.dumps(["..."] * len(fields))
    )
