"""The edge-value fixture jobs, modelled in Python (docs/fixtures.md, "The edge-value jobs").

``EdgeDataStreamJob.java`` / ``EdgeData.java`` hold the same values; floats are given by their
bits so both sides agree to the last bit. Used by generate_fixtures.py (``edge-datastream-*``).
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Callable
from typing import Any

STRINGS = [
    "",
    "\u0000",
    "a\u0000b\u0000",
    "\U0001D11E",  # 𝄞
    "东京",
    "Ω≈ç√",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "😀🎉👍🏽",
    "plain-ascii",
]
K = len(STRINGS)
ROUNDS = 3
BYTE_EDGES = [-128, 127, 0, -1]
SHORT_EDGES = [-32768, 32767, 0, -1]
INT_EDGES = [-(2**31), 2**31 - 1, 0, -1]
LONG_EDGES = [-(2**63), 2**63 - 1, 0, -1]
CHAR_EDGES = ["\u0000", "\uffff", "A", "东"]
FLOAT_BITS = [0x7FC00000, 0x7F800000, 0xFF800000, 0x80000000, 0x00000000, 0x00000001, 0x00400000,
              0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3DCCCCCD]
DOUBLE_BITS = [0x7FF8000000000000, 0x7FF0000000000000, 0xFFF0000000000000, 0x8000000000000000, 0,
               0x1, 0x0008000000000000, 0x0010000000000000, 0x7FEFFFFFFFFFFFFF,
               0xFFEFFFFFFFFFFFFF, 0x3FB999999999999A]
NF = len(FLOAT_BITS)
TS_EDGES = [-62135596800000, -1, 0, 1, 253402300799999]
LONG_MAX = 2**63 - 1
HOUR_MS = 3_600_000
SESSION_GAP_MS = 60_000
TIERS = ["GOLD", "SILVER", "BRONZE"]


def _json_float(v: float) -> Any:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def flt(j: int) -> Any:
    return _json_float(struct.unpack(">f", FLOAT_BITS[j % NF].to_bytes(4, "big"))[0])


def dbl(j: int) -> Any:
    return _json_float(struct.unpack(">d", DOUBLE_BITS[j % NF].to_bytes(8, "big"))[0])


def s(j: int) -> str:
    return STRINGS[j % K]


def b64(data: bytes) -> dict:
    return {"$bytes": base64.b64encode(data).decode("ascii")}


def large_string() -> str:
    return "L" + "0123456789abcdef" * 4100 + "东\U0001D11E"


def large_bytes() -> bytes:
    return bytes((i * 31) & 0xFF for i in range(66000))


def _canonical_key(v: Any) -> str:
    import json

    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def jmap(pairs: list[tuple[Any, Any]]) -> list[dict]:
    """A Map value: [{"key", "value"}] sorted by the canonical JSON of the key."""
    return [{"key": k, "value": v} for k, v in sorted(pairs, key=lambda p: _canonical_key(p[0]))]


def ttl(value: Any) -> dict:
    return {"value": value, "last_access": "$any"}


def pojo(k: int) -> dict:
    boxed = k % 2 == 1
    return {
        "b": BYTE_EDGES[k % 4], "s": SHORT_EDGES[k % 4], "i": INT_EDGES[k % 4],
        "l": LONG_EDGES[k % 4], "c": CHAR_EDGES[k % 4], "f": flt(k), "d": dbl(k), "z": k % 2 == 0,
        "bBox": BYTE_EDGES[(k + 1) % 4] if boxed else None,
        "sBox": SHORT_EDGES[(k + 1) % 4] if boxed else None,
        "iBox": INT_EDGES[(k + 1) % 4] if boxed else None,
        "lBox": LONG_EDGES[(k + 1) % 4] if boxed else None,
        "cBox": CHAR_EDGES[(k + 1) % 4] if boxed else None,
        "fBox": flt(k + 5) if boxed else None,
        "dBox": dbl(k + 5) if boxed else None,
        "zBox": (k % 4 == 1) if boxed else None,
        "str": None if k % 3 == 0 else s(k + 3),
        "bytes": None if k % 3 == 1 else b64(b"" if k % 3 == 0 else bytes([0, 255, 127, 128])),
        "tier": None if k % 2 == 1 else TIERS[k % 3],
        "address": None if k % 2 == 0 else {"city": s(k), "zip": k - 5},
    }


def nullable_strings(k: int) -> list:
    if k % 3 == 1:
        return [None, "", s(k), None]
    if k % 3 == 2:
        return list(STRINGS)
    return []


def nullable_longs(k: int) -> list:
    return [] if k % 3 == 0 else [None, *LONG_EDGES, None]


def nullable_map(k: int) -> list[dict]:
    if k == 9:
        return jmap([(f"m{i:04d}", None if i % 100 == 0 else i * 7 - 3500) for i in range(1000)])
    if k % 3 == 1:
        return jmap([("", None), ("k" + s(k), LONG_EDGES[k % 4]), ("\U0001D11E", LONG_MAX)])
    if k % 3 == 2:
        return jmap([("\u0000", -(2**63))])
    return []


EDGE_DS_UIDS = {
    "fixture-source": "Source: Fixture Source",
    "edge-filter": "Edge Filter",
    "edge-index": "Edge Index",
    "edge-state": "Edge State",
    "edge-sink": "Edge Sink: Writer",
    "edge-window-input": "Edge Window Input",
    "edge-timestamps": "Edge Timestamps",
    "edge-tumble": "Edge Tumble",
    "edge-tumble-sink": "Edge Tumble Sink: Writer",
    "edge-session": "Edge Session",
    "edge-session-sink": "Edge Session Sink: Writer",
}

POJO_TYPE = ("POJO<statequery.fixtures.EdgePojo>{b TINYINT, bBox TINYINT NULL, "
             "bytes BYTES NULL, c CHAR, cBox CHAR NULL, d DOUBLE, dBox DOUBLE NULL, f FLOAT, "
             "fBox FLOAT NULL, i INT, iBox INT NULL, l BIGINT, lBox BIGINT NULL, s SMALLINT, "
             "sBox SMALLINT NULL, str STRING, tier ENUM<Tier>, z BOOLEAN, zBox BOOLEAN NULL, "
             "address POJO<Address>}")
WINDOW_KEY = "TUPLE2<STRING, INT>"


def edge_ds_states(st: Callable[..., dict]) -> dict[str, list[dict]]:
    """uid -> the manifest's state records (``st`` is generate_fixtures._st)."""
    v = ("STRING", "VOID")
    return {
        "edge-state": [
            st("str", "value", "STRING", *v),
            st("bytes", "value", "BYTES", *v),
            st("pojo", "value", POJO_TYPE, *v),
            st("row", "value",
               "ROW<f0 STRING, f1 INT, f2 DOUBLE, f3 BIGINT> (RowSerializer: no names stored)", *v),
            st("tuple-nullable", "value",
               "TUPLE3<BIGINT, DOUBLE, STRING> (each field through NullableSerializer)", *v),
            st("nullable-list", "value", "ARRAY<STRING> (ListSerializer)", *v),
            st("nullable-longs", "value",
               "ARRAY<BIGINT> (ListSerializer of NullableSerializer)", *v),
            st("nullable-map", "value", "MAP<STRING, BIGINT> (MapSerializer)", *v),
            st("str-list", "list", "STRING", *v),
            st("long-list", "list", "BIGINT", *v),
            st("double-list", "list", "DOUBLE", *v),
            st("bytes-list", "list", "BYTES", *v),
            st("long-to-double", "map", "DOUBLE", *v, user_key_type="BIGINT"),
            st("char-to-short", "map", "SMALLINT", *v, user_key_type="CHAR"),
            st("byte-to-int", "map", "INT", *v, user_key_type="TINYINT"),
            st("int-to-float", "map", "FLOAT", *v, user_key_type="INT"),
            st("float-to-bool", "map", "BOOLEAN", *v, user_key_type="FLOAT"),
            st("double-to-string", "map", "STRING", *v, user_key_type="DOUBLE"),
            st("str-map", "map", "STRING", *v, user_key_type="STRING"),
            st("bytes-map", "map", "BYTES", *v, user_key_type="STRING"),
            st("last-double", "reducing", "DOUBLE", *v),
            st("min-long", "reducing", "BIGINT", *v),
            st("agg", "aggregating", "TUPLE2<BIGINT, STRING> (accumulator: count, last)", *v),
            st("ttl-str", "value", "STRING", *v, ttl=True),
            st("ttl-map", "map", "STRING", *v, user_key_type="STRING", ttl=True),
            st("ttl-list", "list", "STRING", *v, ttl=True),
            st("_timer_state/event_user-timers", "event_timer", None, *v),
            st("_timer_state/processing_user-timers", "processing_timer", None, *v),
        ],
        "edge-tumble": [
            st("window-contents", "aggregating", "TUPLE2<BIGINT, STRING> (accumulator)", WINDOW_KEY,
               "TimeWindow"),
            st("_timer_state/event_window-timers", "event_timer", None, WINDOW_KEY, "TimeWindow"),
            st("_timer_state/processing_window-timers", "processing_timer", None, WINDOW_KEY,
               "TimeWindow"),
        ],
        "edge-session": [
            st("window-contents", "aggregating", "TUPLE2<BIGINT, STRING> (accumulator)", WINDOW_KEY,
               "TimeWindow"),
            st("merging-window-set", "list",
               "TUPLE2<TimeWindow, TimeWindow> (window, state window)", WINDOW_KEY, "VOID"),
            st("_timer_state/event_window-timers", "event_timer", None, WINDOW_KEY, "TimeWindow"),
            st("_timer_state/processing_window-timers", "processing_timer", None, WINDOW_KEY,
               "TimeWindow"),
        ],
    }


def edge_datastream_entries(add: Callable[..., None], large: bool) -> None:
    """Every entry of the edge-state, edge-tumble and edge-session operators (the source's reader
    state is added by the caller). ``add(uid, state, kind, **fields)``."""
    for k in range(K):
        ks = {"key": STRINGS[k], "namespace": None}

        def a(state: str, kind: str, **fields: Any) -> None:
            add("edge-state", state, kind, **fields, **ks)  # noqa: B023

        big = large and k == 9
        a("str", "value", value=large_string() if big else s(k + 1))
        raw = {0: b"", 1: bytes(range(256)), 2: b"\x00\xff"}[k % 3]
        a("bytes", "value", value=b64(large_bytes() if big else raw))
        a("pojo", "value", value=pojo(k))
        # Types.ROW_NAMED(name, count, ratio, when): the RowSerializer snapshot keeps no field
        # names and Row.of rows are positional, so Flink reads f0..f3
        a("row", "value", value={
            "f0": None if k % 2 == 0 else s(k),
            "f1": None if k % 3 == 0 else INT_EDGES[k % 4],
            "f2": dbl(k + 2),
            "f3": None if k % 4 == 3 else LONG_EDGES[(k + 2) % 4],
        })
        tup = {0: [None, None, None], 1: [LONG_EDGES[k % 4], dbl(k), s(k)],
               2: [None, dbl(k + 1), ""]}[k % 3]
        a("tuple-nullable", "value", value={"f0": tup[0], "f1": tup[1], "f2": tup[2]})
        a("nullable-list", "value", value=nullable_strings(k))
        a("nullable-longs", "value", value=nullable_longs(k))
        a("nullable-map", "value", value=nullable_map(k))
        a("str-list", "list", value=["", *(s(k + r) for r in range(ROUNDS))])
        longs = list(LONG_EDGES) + ([j * 1_000_000_007 for j in range(1000)] if k == 9 else [])
        a("long-list", "list", value=longs)
        a("double-list", "list", value=[dbl(j) for j in range(NF)])
        a("bytes-list", "list", value=[b64(b""), b64(b"\x00"), b64(b"\xff\x80\x7f")])
        for j in range(4):
            a("long-to-double", "map", user_key=LONG_EDGES[j], value=dbl(j + k))
            a("char-to-short", "map", user_key=CHAR_EDGES[j], value=SHORT_EDGES[(j + k) % 4])
            a("byte-to-int", "map", user_key=BYTE_EDGES[j], value=INT_EDGES[(j + k) % 4])
            a("int-to-float", "map", user_key=INT_EDGES[j], value=flt(j + k))
        for m in range(4):  # four float/double user keys per key (all eleven over the keys)
            j = (k + m) % NF
            a("float-to-bool", "map", user_key=flt(j), value=(j + k) % 2 == 0)
            a("double-to-string", "map", user_key=dbl(j),
              value=None if (j + k) % 3 == 0 else s(j + k))
        for m in (0, 1, 2, 5):
            j = (k + m) % K
            a("str-map", "map", user_key=STRINGS[j], value=None if j == k else s(j + k))
        a("bytes-map", "map", user_key="empty", value=b64(b""))
        a("bytes-map", "map", user_key="ff", value=b64(b"\xff"))
        a("last-double", "reducing", value=dbl(3 * k + ROUNDS - 1))
        a("min-long", "reducing", value=min(LONG_EDGES[(k + r) % 4] for r in range(ROUNDS)))
        a("agg", "aggregating", value={"f0": ROUNDS, "f1": s(k + 2 * (ROUNDS - 1))})
        a("ttl-str", "value", value=ttl(s(k + 5)))
        a("ttl-map", "map", user_key="a", value=ttl(None))
        a("ttl-map", "map", user_key="", value=ttl(s(k)))
        a("ttl-list", "list", value=[ttl(s(k)), ttl("")])
        for t in (LONG_MAX, LONG_MAX - 1 - k):
            a("_timer_state/event_user-timers", "event_timer", timestamp=t)
        a("_timer_state/processing_user-timers", "processing_timer", timestamp=LONG_MAX - 1000 - k)

        # the window branch: (STRINGS[k], INT_EDGES[j]) gets elements at ts and ts + 30 s
        for j in range(4):
            wkey = {"key": {"f0": STRINGS[k], "f1": INT_EDGES[j]}}
            ts = TS_EDGES[(k + j) % len(TS_EDGES)]
            windows: dict[int, int] = {}
            for t in (ts, ts + 30_000):
                # Python's % floors, like TimeWindow.getWindowStartWithOffset
                start = t - t % HOUR_MS
                windows[start] = windows.get(start, 0) + 1
            for start, count in windows.items():
                ns = {"start": start, "end": start + HOUR_MS}
                add("edge-tumble", "window-contents", "aggregating", namespace=ns,
                    value={"f0": count, "f1": STRINGS[k]}, **wkey)
                add("edge-tumble", "_timer_state/event_window-timers", "event_timer", namespace=ns,
                    timestamp=start + HOUR_MS - 1, **wkey)
            # session windows [ts, ts+60s) and [ts+30s, ts+90s) merge into [ts, ts+90s); the
            # merged window keeps the first window as its state window
            first = {"start": ts, "end": ts + SESSION_GAP_MS}
            merged = {"start": ts, "end": ts + 30_000 + SESSION_GAP_MS}
            add("edge-session", "window-contents", "aggregating", namespace=first,
                value={"f0": 2, "f1": STRINGS[k]}, **wkey)
            add("edge-session", "merging-window-set", "list", namespace=None,
                value=[{"f0": merged, "f1": first}], **wkey)
            add("edge-session", "_timer_state/event_window-timers", "event_timer", namespace=merged,
                timestamp=merged["end"] - 1, **wkey)
    if large:
        add("edge-state", "str", "value", key=large_string(), namespace=None, value="large-key")


# --------------------------------------------------------------------------------------------
# The edge-value SQL job (sql_edge_job.py): the model covers ``agg_words`` (the second global
# aggregation): GROUP BY s2, LISTAGG(s, '|'), COUNT(DISTINCT s), COUNT(DISTINCT dec38),
# MAX(dec38), COUNT(*). The other operators are checked against Flink's dump only.
# --------------------------------------------------------------------------------------------


def _dec(text: str | None, scale: int) -> str | None:
    from decimal import Context, Decimal

    if text is None:
        return None
    return format(Decimal(text).quantize(Decimal(1).scaleb(-scale), context=Context(prec=60)), "f")


def sql_edge_entries(add: Callable[..., None], rows: list[dict]) -> None:
    """``add(state, kind, key, **fields)`` for the agg_words operator; ``rows``: EDGE_ROWS."""
    groups: dict[Any, list[dict]] = {}
    for r in rows:  # file order = arrival order (one source split, parallelism 1)
        groups.setdefault(r["s2"], []).append(r)
    for s2, mine in groups.items():
        key = {"f0": s2}
        names = [r["s"] for r in mine if r["s"] is not None]
        decs = [_dec(r["dec38"], 10) for r in mine if r["dec38"] is not None]
        distinct_s = list(dict.fromkeys(names))
        distinct_d = list(dict.fromkeys(decs))
        from decimal import Decimal

        add("accState", "value", key, value={
            "f0": "|",  # LISTAGG's accumulator keeps its delimiter
            "f1": "|".join(names) if names else None,
            "f2": len(distinct_s),
            "f3": len(distinct_d),
            "f4": max(decs, key=Decimal) if decs else None,
            "f5": len(mine),
            "f6": None,  # RAW MapView placeholders of the state-backed distinct views
            "f7": None,
        })
        for v in distinct_s:
            add("distinctAcc_0", "map", key, user_key=v, value=1)
        for v in distinct_d:
            add("distinctAcc_1", "map", key, user_key=v, value=1)
        if len(names) < len(mine):
            add("distinctAcc_0_null_state", "value", key, value=1)
        if len(decs) < len(mine):
            add("distinctAcc_1_null_state", "value", key, value=1)
