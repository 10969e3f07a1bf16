"""Arrow columns -> JSON-ready Python values in the fixture entry format (docs/fixtures.md).

Used where rows of different states must share one column (the diff table): structs become
objects, maps lists of ``{"key", "value"}`` sorted by key, binary ``{"$bytes": base64}``, decimals
plain strings, non-finite floats ``"NaN"``/``"Infinity"``; the event-time columns (``timestamp``,
``last_access``, ``namespace``) stay epoch milliseconds, other timestamps become epoch
nanoseconds.
"""

from __future__ import annotations

import base64
import json
import math
from decimal import Decimal
from typing import Any

import pyarrow as pa

__all__ = ["EPOCH_MS_COLUMNS", "canonical_json", "freeze", "jsonify_column"]

EPOCH_MS_COLUMNS = ("timestamp", "last_access", "namespace")


def canonical_json(value: Any) -> str:
    """Compact JSON with sorted object keys (equal values give equal strings)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class _NaN:
    """The frozen form of every float NaN: equal to itself (a NaN float is not), so a NaN value
    that did not change compares equal, as its serialized bytes do."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NaN"

    def __hash__(self) -> int:
        return 0x7FF8


NAN = _NaN()


def freeze(v: Any) -> Any:
    """A hashable form of a decoded value (dicts for structs, lists for arrays, lists of pairs
    for maps, :data:`NAN` for a float NaN), equal exactly when the values are: to compare and
    count without JSON."""
    if isinstance(v, dict):
        return tuple(sorted((k, freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(freeze(x) for x in v)
    if isinstance(v, float) and v != v:
        return NAN
    return v


def _float(v: float) -> Any:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def jsonify_column(array: pa.Array | pa.ChunkedArray, epoch_ms: bool = False) -> list[Any]:
    """The JSON-normalised values of an Arrow column."""
    if isinstance(array, pa.ChunkedArray):
        out: list[Any] = []
        for chunk in array.chunks:
            out.extend(jsonify_column(chunk, epoch_ms))
        return out
    t = array.type
    if pa.types.is_dictionary(t):
        return jsonify_column(array.cast(t.value_type), epoch_ms)
    if pa.types.is_struct(t):
        children = {
            t.field(i).name: jsonify_column(array.field(i), epoch_ms) for i in range(t.num_fields)
        }
        valid = array.is_valid().to_pylist()
        return [
            {name: values[i] for name, values in children.items()} if valid[i] else None
            for i in range(len(array))
        ]
    if pa.types.is_map(t):
        keys = jsonify_column(array.keys, epoch_ms)
        items = jsonify_column(array.items, epoch_ms)
        offsets = array.offsets.to_pylist()
        valid = array.is_valid().to_pylist()
        res: list[Any] = []
        for i in range(len(array)):
            if not valid[i]:
                res.append(None)
                continue
            entries = [
                {"key": keys[j], "value": items[j]} for j in range(offsets[i], offsets[i + 1])
            ]
            entries.sort(key=lambda e: canonical_json(e["key"]))
            res.append(entries)
        return res
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        values = jsonify_column(array.values, epoch_ms)
        offsets = array.offsets.to_pylist()
        valid = array.is_valid().to_pylist()
        return [
            values[offsets[i] : offsets[i + 1]] if valid[i] else None for i in range(len(array))
        ]
    if pa.types.is_timestamp(t):
        ints = array.cast(pa.int64()).to_pylist()
        if epoch_ms:
            factor = {"s": 1000, "ms": 1, "us": 1, "ns": 1}[t.unit]
            div = {"s": 1, "ms": 1, "us": 1000, "ns": 1_000_000}[t.unit]
            return [None if v is None else v * factor // div for v in ints]
        factor = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}[t.unit]
        return [None if v is None else v * factor for v in ints]
    if pa.types.is_date32(t) or pa.types.is_time32(t) or pa.types.is_time64(t):
        days_or_times: list[Any] = array.cast(
            pa.int32() if not pa.types.is_time64(t) else pa.int64()
        ).to_pylist()
        return days_or_times
    if pa.types.is_decimal(t):
        return [None if v is None else format(v, "f") for v in array.to_pylist()]
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return [
            None if v is None else {"$bytes": base64.b64encode(v).decode("ascii")}
            for v in array.to_pylist()
        ]
    if pa.types.is_floating(t):
        return [None if v is None else _float(v) for v in array.to_pylist()]
    plain: list[Any] = array.to_pylist()
    return [format(v, "f") if isinstance(v, Decimal) else v for v in plain]
