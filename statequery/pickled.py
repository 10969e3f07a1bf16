"""Python values pickled by PyFlink, decoded without running code from the savepoint.

PyFlink stores ``Types.PICKLED_BYTE_ARRAY()`` values, undeclared ``key_by`` keys (and, in thread
mode, ``Types.ROW``/``Types.TUPLE`` state values) as Python pickles inside Java ``byte[]``
(``BytePrimitiveArraySerializer``): Flink records only "bytes" (docs/format-notes.md). A pickle is
a program: ``pickle.loads`` would import and call whatever it names. :func:`loads` unpickles with
a restricted ``find_class`` that allows only plain data: ``None``, ``bool``, ``int``, ``float``,
``complex``, ``str``, ``bytes``, ``bytearray``, ``tuple``, ``list``, ``dict``, ``set``,
``frozenset``, ``datetime`` (``date``, ``time``, ``datetime``, ``timedelta``, ``timezone``),
``decimal.Decimal``, ``collections.OrderedDict`` and PyFlink's ``Row`` (rebuilt here as
:class:`PyRow`; PyFlink is never imported). A pickle naming anything else (a user class, a
function) is not decoded: :class:`Refused` keeps its reason (the raw bytes stay where they were).

:func:`render` turns a decoded value into JSON text (the ``*_py`` columns of
:func:`add_python_columns`, docs/decoding.md).
"""

from __future__ import annotations

import base64
import collections
import datetime as dt
import decimal
import io
import json
import math
import pickle
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = [
    "PyRow",
    "Refused",
    "PYTHON_COLUMNS",
    "add_python_columns",
    "holds_bytes",
    "is_pickle",
    "loads",
    "pickled_columns",
    "python_schema",
    "render",
]

#: the columns of a state's rows whose bytes may be a PyFlink pickle (when their type is bytes)
PYTHON_COLUMNS = ("key", "user_key", "value")

# Rendering bounds: a pickle can share one list many times (memo references), so a few hundred
# bytes can describe a value of 2**30 nodes; the renderer stops at these.
MAX_NODES = 100_000
MAX_DEPTH = 100

ROW_KINDS = ("+I", "-U", "+U", "-D")


@dataclass(frozen=True)
class PyRow:
    """A PyFlink ``Row``: its field names (None when built positionally), values, row kind."""

    fields: tuple[str, ...] | None
    values: tuple[Any, ...]
    row_kind: str = "+I"


@dataclass(frozen=True)
class Refused:
    """Bytes that :func:`loads` did not decode, and why."""

    reason: str


class _Refusal(Exception):
    pass


class _RowKind(int):
    """Stand-in for ``pyflink.common.types.RowKind`` (an Enum of 0..3)."""


def _row_kind(value: Any) -> _RowKind:
    if not isinstance(value, int) or not 0 <= value < len(ROW_KINDS):
        raise _Refusal(f"RowKind({value!r}) is not a row kind")
    return _RowKind(value)


def _create_row(fields: Any, values: Any, row_kind: Any = None) -> PyRow:
    if fields is not None and not (
        isinstance(fields, (list, tuple)) and all(isinstance(f, str) for f in fields)
    ):
        raise _Refusal("Row field names that are not strings")
    if not isinstance(values, (list, tuple)):
        raise _Refusal("Row values that are not a tuple")
    kind = ROW_KINDS[row_kind] if isinstance(row_kind, _RowKind) else "+I"
    return PyRow(None if fields is None else tuple(fields), tuple(values), kind)


def _codecs_encode(obj: Any, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    """Protocols 0-2 pickle ``bytes`` as ``_codecs.encode(text, 'latin1')``: only that."""
    if not isinstance(obj, str) or encoding not in ("latin1", "latin-1"):
        raise _Refusal("_codecs.encode other than text to latin1")
    return obj.encode("latin1")


def _bytearray(*args: Any) -> bytearray:
    """``bytearray`` of bytes or text (protocols 2 to 4 pickle one so), never of a size (a pickle
    of ``bytearray(10**12)`` is 20 bytes)."""
    if args and not isinstance(args[0], (bytes, str)):
        raise _Refusal("bytearray of other than bytes or text")
    return bytearray(*args)


def _plain_type(t: type) -> Any:
    def make(*args: Any) -> Any:
        if args and isinstance(args[0], int) and t is not complex:
            raise _Refusal(f"{t.__name__} of a number")
        return t(*args)

    return make


_BUILTINS: dict[str, Any] = {
    "set": _plain_type(set),
    "frozenset": _plain_type(frozenset),
    "complex": complex,
    "bytearray": _bytearray,
}

_ALLOWED: dict[tuple[str, str], Any] = {
    **{("builtins", n): f for n, f in _BUILTINS.items()},
    **{("__builtin__", n): f for n, f in _BUILTINS.items()},
    ("_codecs", "encode"): _codecs_encode,
    **{("datetime", t.__name__): t
       for t in (dt.date, dt.time, dt.datetime, dt.timedelta, dt.timezone)},
    ("decimal", "Decimal"): decimal.Decimal,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("pyflink.common.types", "_create_row"): _create_row,
    ("pyflink.common.types", "RowKind"): _row_kind,
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise _Refusal(
                f"the pickle refers to {module}.{name}: only plain data is decoded "
                "(no code from a savepoint runs)"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise _Refusal("the pickle has a persistent id")


def is_pickle(data: bytes) -> bool:
    """Whether ``data`` starts like a pickle of protocol 2 to 5 (the PROTO opcode) and ends with
    STOP: what ``pickle.dumps`` and ``cloudpickle.dumps`` write."""
    return len(data) >= 3 and data[0] == 0x80 and 2 <= data[1] <= 5 and data[-1:] == b"."


def loads(data: bytes) -> Any:
    """The Python value pickled in ``data`` (a pickle, or as PyFlink's process mode stores one:
    int32 length + pickle), or a :class:`Refused` saying why not (not a pickle, a class or
    function other than the plain data types above, bytes after the end)."""
    if not is_pickle(data) and len(data) > 4 and int.from_bytes(data[:4], "big") == len(data) - 4:
        data = data[4:]  # process mode's pickled coder: int32 length + the pickle
    if not is_pickle(data):
        return Refused("not a pickle (protocol 2 to 5)")
    stream = io.BytesIO(data)
    try:
        value = _Unpickler(stream).load()
    except _Refusal as e:
        return Refused(str(e))
    except RecursionError:
        return Refused("the pickle nests too deep")
    except Exception as e:  # a damaged pickle: any error of the unpickler (never code of ours)
        return Refused(f"not a valid pickle: {type(e).__name__}: {e}")
    if stream.tell() != len(data):
        return Refused(f"{len(data) - stream.tell()} bytes after the pickle's end")
    return value


class _TooLarge(Exception):
    pass


def _json(value: Any, budget: list[int], depth: int) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise _TooLarge(f"more than {MAX_NODES} values")
    if depth > MAX_DEPTH:
        raise _TooLarge(f"nested deeper than {MAX_DEPTH}")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        if value.bit_length() > 10_000:  # JSON text of over 3000 digits (Python caps int str)
            raise _TooLarge(f"an integer of {value.bit_length()} bits")
        return int(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, complex):
        return {"$complex": [_json(value.real, budget, depth + 1),
                             _json(value.imag, budget, depth + 1)]}
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (dt.date, dt.time, dt.datetime)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return {"$timedelta": [value.days, value.seconds, value.microseconds]}
    if isinstance(value, dt.timezone):
        return str(value)
    if isinstance(value, PyRow):
        items = [_json(v, budget, depth + 1) for v in value.values]
        if value.fields is not None and len(value.fields) == len(items):
            out: Any = dict(zip(value.fields, items, strict=True))
        else:
            out = items
        return out if value.row_kind == "+I" else {"$row_kind": value.row_kind, "row": out}
    if isinstance(value, (list, tuple)):
        return [_json(v, budget, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [_json(v, budget, depth + 1) for v in value]
        return sorted(items, key=lambda x: json.dumps(x, sort_keys=True, ensure_ascii=False))
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: _json(v, budget, depth + 1) for k, v in value.items()}
        return [{"key": _json(k, budget, depth + 1), "value": _json(v, budget, depth + 1)}
                for k, v in value.items()]
    raise _TooLarge(f"a {type(value).__name__}")  # not reached: loads returns only the above


def render(value: Any) -> tuple[str | None, str | None]:
    """``(json, reason)``: a decoded value as JSON text (tuples and sets as arrays, sets sorted,
    dicts with other than string keys as ``[{"key", "value"}]``, bytes ``{"$bytes": base64}``,
    decimals strings, dates/times ISO 8601, a Row an object of its fields, or an array when it
    has no field names), or ``(None, reason)`` for a :class:`Refused` or a value too large."""
    if isinstance(value, Refused):
        return None, value.reason
    try:
        out = _json(value, [MAX_NODES], 0)
    except _TooLarge as e:
        return None, f"too large to render: {e}"
    return json.dumps(out, ensure_ascii=False, separators=(",", ":")), None


def _render_bytes(data: bytes | None) -> tuple[str | None, str | None]:
    if data is None:
        return None, None
    return render(loads(data))


def _is_binary(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t))


def holds_bytes(t: pa.DataType) -> bool:
    """Whether a column of type ``t`` holds bytes a PyFlink job may have pickled into: binary, a
    list of binaries, or a one-field struct of a binary (PyFlink's key ``ROW<f0 BYTES>``)."""
    if _is_binary(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _is_binary(t.value_type)
    return pa.types.is_struct(t) and t.num_fields == 1 and _is_binary(t.field(0).type)


def pickled_columns(schema: pa.Schema) -> list[str]:
    """The columns of :data:`PYTHON_COLUMNS` in ``schema`` that hold bytes (:func:`holds_bytes`):
    those ``pickled`` renders. From the types alone: whether the bytes are pickles is known only
    by reading them."""
    return [n for n in PYTHON_COLUMNS if n in schema.names and holds_bytes(schema.field(n).type)]


def python_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with ``<column>_py`` and ``<column>_py_reason`` (strings) after each column of
    :func:`pickled_columns`: the schema of a ``pickled`` read (it depends on the types only)."""
    for name in pickled_columns(schema):
        at = schema.get_field_index(name) + 1
        schema = schema.insert(at, pa.field(f"{name}_py", pa.string()))
        schema = schema.insert(at + 1, pa.field(f"{name}_py_reason", pa.string()))
    return schema


def _python_column(col: pa.ChunkedArray | pa.Array) -> tuple[pa.Array, pa.Array]:
    """The JSON and reason columns of a column of :func:`holds_bytes`: binary, a list of binaries
    (each element decoded, the JSON an array), or a one-field struct of a binary."""
    t = col.type
    values = col.to_pylist()
    pairs: list[tuple[str | None, str | None]]
    if _is_binary(t):
        pairs = [_render_bytes(v) for v in values]
    elif pa.types.is_struct(t):
        name = t.field(0).name
        pairs = [(None, None) if v is None else _render_bytes(v[name]) for v in values]
    else:
        pairs = []
        for elements in values:
            if elements is None:
                pairs.append((None, None))
                continue
            rendered = [_render_bytes(e) for e in elements]
            reasons = [f"element {i}: {r}" for i, (_, r) in enumerate(rendered) if r]
            texts = ["null" if j is None else j for j, _ in rendered]
            pairs.append(("[" + ",".join(texts) + "]", "; ".join(reasons) or None))
    return (pa.array([p[0] for p in pairs], pa.string()),
            pa.array([p[1] for p in pairs], pa.string()))


def add_python_columns(table: pa.Table | pa.RecordBatch) -> pa.Table | pa.RecordBatch:
    """``table`` (a Table or a RecordBatch) with, after each column of :func:`pickled_columns`
    (key, user_key, value of a bytes type: binary, a list of binaries, PyFlink's one-field key
    row of bytes), ``<column>_py``: the pickled Python value as JSON text (:func:`render`), and
    ``<column>_py_reason``: why it is null where the bytes are not null (not a pickle, a class
    outside plain data, too large). The raw bytes stay in ``<column>``; the schema is
    :func:`python_schema` of ``table``'s."""
    for name in pickled_columns(table.schema):
        json_col, reason_col = _python_column(table.column(name))
        at = table.schema.get_field_index(name) + 1
        table = table.add_column(at, pa.field(f"{name}_py", pa.string()), json_col)
        table = table.add_column(at + 1, pa.field(f"{name}_py_reason", pa.string()), reason_col)
    return table
