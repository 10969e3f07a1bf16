"""statequery rows -> the fixture entry format of docs/fixtures.md (one JSON object per line).

Shared by every backend's tests: read each state with statequery, turn its Arrow rows into
entries with :func:`state_entries`, and compare the sorted lines with ``dump/<name>.jsonl`` (which
carries ``key_group``) and ``expected/<name>.jsonl`` (which does not).

Temporal values: the ``timestamp``, ``last_access`` and ``namespace`` columns hold event-time
instants and TimeWindows in epoch milliseconds; everywhere else (keys, values, user keys) Arrow
timestamps are SQL/Java timestamps and become epoch nanoseconds, as docs/fixtures.md asks.
"""

from __future__ import annotations

import base64
import json
import math
from decimal import Decimal
from typing import Any

import pyarrow as pa

__all__ = [
    "canonical",
    "same_table",
    "entry_lines",
    "jsonify_column",
    "savepoint_entries",
    "state_entries",
]

_MS_COLUMNS = ("timestamp", "last_access", "namespace")
_EPOCH_MS = pa.timestamp("ms", tz="UTC")


def canonical(entry: Any) -> str:
    return json.dumps(entry, sort_keys=True, separators=(",", ":"))


def _plain_decimal(d: Decimal) -> str:
    return format(d, "f")


def _float(v: float) -> Any:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def _timestamp_text_nanos(text: str) -> int:
    """Epoch nanoseconds of a TIMESTAMP(7..9) as statequery writes it (``YYYY-MM-DD
    HH:MM:SS.fffffffff``, ``Z`` after an LTZ): what the oracle dumps."""
    from statequery.serializers.readers import _days_from_civil

    date, time = text.rstrip("Z").split(" ")
    y, mo, d = (int(x) for x in date.split("-"))
    hms, frac = time.split(".")
    h, mi, sec = (int(x) for x in hms.split(":"))
    nanos = int(frac.ljust(9, "0"))
    return (_days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec) * 10**9 + nanos


def jsonify_column(
    array: pa.Array | pa.ChunkedArray, epoch_ms: bool = False, field: pa.Field | None = None
) -> list[Any]:
    """The JSON-normalised values of an Arrow column (``field``: its field, whose metadata may
    say the strings are TIMESTAMP(7..9) texts)."""
    if isinstance(array, pa.ChunkedArray):
        out: list[Any] = []
        for chunk in array.chunks:
            out.extend(jsonify_column(chunk, epoch_ms, field))
        return out
    t = array.type
    meta = (field.metadata or {}) if field is not None else {}
    if pa.types.is_string(t) and meta.get(b"statequery.sql_type", b"").startswith(b"TIMESTAMP"):
        return [None if v is None else _timestamp_text_nanos(v) for v in array.to_pylist()]
    if pa.types.is_dictionary(t):
        return jsonify_column(array.cast(t.value_type), epoch_ms)
    if pa.types.is_struct(t):
        # a TimeWindow ({start, end} as event-time instants) stays in epoch ms anywhere
        window = [t.field(i).name for i in range(t.num_fields)] == ["start", "end"] and all(
            t.field(i).type == _EPOCH_MS for i in range(2)
        )
        children = {
            t.field(i).name: jsonify_column(array.field(i), epoch_ms or window, t.field(i))
            for i in range(t.num_fields)
        }
        valid = array.is_valid().to_pylist()
        # a Kryo value of an interface/abstract type (statequery.serializers.kryo): the oracle
        # shows the one class's branch, not the others' nulls
        union = t.num_fields > 0 and (t.field(0).metadata or {}).get(b"statequery.kryo") == b"union"
        return [
            {name: values[i] for name, values in children.items()
             if not (union and values[i] is None)} if valid[i] else None
            for i in range(len(array))
        ]
    if pa.types.is_map(t):
        keys = jsonify_column(array.keys, epoch_ms, t.key_field)
        items = jsonify_column(array.items, epoch_ms, t.item_field)
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
            entries.sort(key=lambda e: canonical(e["key"]))
            res.append(entries)
        return res
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        values = jsonify_column(array.values, epoch_ms, t.value_field)
        offsets = array.offsets.to_pylist()
        valid = array.is_valid().to_pylist()
        return [
            values[offsets[i] : offsets[i + 1]] if valid[i] else None for i in range(len(array))
        ]
    if pa.types.is_timestamp(t):
        ints = array.cast(pa.int64()).to_pylist()
        factor = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}[t.unit]
        if epoch_ms:
            if t.unit != "ms":
                raise AssertionError(f"event-time column with unit {t.unit}")
            return ints
        return [None if v is None else v * factor for v in ints]
    if pa.types.is_date32(t) or pa.types.is_time32(t) or pa.types.is_time64(t):
        return array.cast(pa.int32() if not pa.types.is_time64(t) else pa.int64()).to_pylist()
    if pa.types.is_decimal(t):
        return [None if v is None else _plain_decimal(v) for v in array.to_pylist()]
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return [
            None if v is None else {"$bytes": base64.b64encode(v).decode()}
            for v in array.to_pylist()
        ]
    if pa.types.is_floating(t):
        return [None if v is None else _float(v) for v in array.to_pylist()]
    return array.to_pylist()


def _columns(table: pa.Table) -> dict[str, list[Any]]:
    return {
        name: jsonify_column(
            table.column(name), epoch_ms=name in _MS_COLUMNS, field=table.schema.field(name)
        )
        for name in table.column_names
    }


def state_entries(
    table: pa.Table,
    kind: str,
    state: str,
    operator_uid: str,
    operator_id: str,
    key_group: bool = True,
) -> list[dict[str, Any]]:
    """The entries of one state's Arrow rows (read in the default mode)."""
    cols = _columns(table)
    n = table.num_rows
    base: dict[str, Any] = {
        "operator_uid": operator_uid, "operator_id": operator_id, "state": state, "kind": kind
    }
    out = []
    for i in range(n):
        e = dict(base)
        if "key" in cols:
            if key_group:
                e["key_group"] = cols["key_group"][i]
            e["key"] = cols["key"][i]
            e["namespace"] = cols["namespace"][i]
        for name in ("user_key", "value", "timestamp", "subtask", "index"):
            if name in cols:
                e[name] = cols[name][i]
        if "timestamp_ms" in cols:
            # timers: Flink's long as stored (``timestamp`` is null outside years 1-9999)
            e["timestamp"] = cols["timestamp_ms"][i]
        if kind == "broadcast":
            e["subtask"] = 0
        for name in ("key", "user_key", "value"):
            if f"{name}_raw" in cols:  # Kryo decoded with the job's classes: raw where not
                raw = cols[f"{name}_raw"][i]
                if raw is not None:
                    meta = table.schema.field(name).metadata or {}
                    cls = meta.get(b"statequery.raw_class", b"").decode()
                    e[name] = {"$raw": raw["$bytes"], "$class": cls}
                continue
            if f"{name}_reason" in cols and e.get(name) is not None:
                meta = table.schema.field(name).metadata or {}
                cls = meta.get(b"statequery.raw_class", b"").decode()
                e[name] = {"$raw": e[name]["$bytes"], "$class": cls}
        if "last_access" in cols and (
            e.get("value") is not None or cols["last_access"][i] is not None
        ):
            # (a TTL map entry may hold null: its TtlValue still has last_access)
            # TTL state: {"value": v, "last_access": ms} per value, list element or map value
            la = cols["last_access"][i]
            if kind == "list" and "index" not in cols:
                e["value"] = [
                    {"value": v, "last_access": t} for v, t in zip(e["value"], la, strict=True)
                ]
            else:
                e["value"] = {"value": e["value"], "last_access": la}
        out.append(e)
    return out


def same_table(a: pa.Table, b: pa.Table) -> bool:
    """``a.equals(b)``, except that NaN equals NaN (Arrow's ``equals`` says NaN != NaN, so a table
    holding NaN never equals itself): otherwise the schemas must be equal and every column's
    values equal in their JSON normal form (NaN as ``"NaN"``, -0.0 apart from 0.0)."""
    if a.equals(b):
        return True
    if not a.schema.equals(b.schema) or a.num_rows != b.num_rows:
        return False
    return all(
        canonical(jsonify_column(a.column(n))) == canonical(jsonify_column(b.column(n)))
        for n in a.column_names
    )


def entry_lines(entries: list[dict[str, Any]]) -> list[str]:
    return sorted(canonical(e) for e in entries)


def savepoint_entries(sp: Any, key_group: bool = True) -> list[str]:
    """Every state of every operator of ``sp`` as sorted entry lines."""
    from statequery.reader import list_states, read_table

    lines: list[str] = []
    for op in sp.metadata.operators:
        for ref in list_states(sp, op):
            table = read_table(sp, op, ref.name)
            lines.extend(
                canonical(e)
                for e in state_entries(
                    table, ref.kind, ref.name, op.uid or "", op.operator_id, key_group
                )
            )
    return sorted(lines)


ANY = "$any"


def _mask_any(got: Any, want: Any) -> Any:
    if want == ANY and isinstance(got, int) and not isinstance(got, bool):
        return ANY
    if isinstance(got, dict) and isinstance(want, dict):
        return {k: _mask_any(v, want.get(k)) for k, v in got.items()}
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return [_mask_any(g, w) for g, w in zip(got, want, strict=True)]
    return got


def _entry_id(e: dict[str, Any]) -> str:
    return canonical({k: e.get(k) for k in ("operator_id", "state", "key", "namespace",
                                             "user_key", "timestamp", "subtask", "index")})


def mask_any(entries: list[dict[str, Any]], expected: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``entries`` with every integer that the expected entry of the same identity (operator,
    state, key, namespace, user key, timestamp, subtask, index) holds as ``"$any"`` at the same
    place replaced by ``"$any"`` (docs/fixtures.md: TTL ``last_access`` is processing time).
    ``key_group`` is kept; anything that is not an integer stays and so still differs."""
    by_id = {_entry_id(e): e for e in expected}
    return [_mask_any(e, by_id.get(_entry_id(e))) for e in entries]
