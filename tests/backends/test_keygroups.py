"""Canonical key-group streams and heap key groups built byte by byte (format reference §2, §5):
the cases the Flink fixtures do not contain — TTL state, ambiguous composite keys, opaque
(Kryo) values, two-byte prefixes, compression of the heap layout — and the errors."""

from __future__ import annotations

import struct
from typing import Any

import cramjam
import pyarrow as pa
import pytest
from support.flinkenc import row_state

from statequery.arrow.batches import BatchBuilder
from statequery.arrow.schemas import state_schema
from statequery.backends.heap import HeapBlockDecoder, HeapKeyGroupStream
from statequery.backends.keygroups import (
    CompositeEntryDecoder,
    KeyGroupStream,
    scan_key_group,
    serialized_key,
)
from statequery.exceptions import CorruptStateError, UnsupportedFormatError
from statequery.metadata.state import StateInfo
from statequery.serializers.readers import DecodeError
from statequery.serializers.spec import (
    ListSpec,
    MapSpec,
    NamespaceSpec,
    OpaqueSpec,
    PrimitiveSpec,
    TimerSpec,
    TtlSpec,
)

S = PrimitiveSpec(name="string")
L = PrimitiveSpec(name="long")
VOID = NamespaceSpec(name="void")
WINDOW = NamespaceSpec(name="time_window")


class MemStream:
    def __init__(self, data: bytes, name: str = "mem") -> None:
        self.data = data
        self.name = name
        self.reads: list[tuple[int, int]] = []

    def size(self) -> int:
        return len(self.data)

    def read_range(self, start: int, length: int) -> bytes:
        self.reads.append((start, length))
        return self.data[start : start + length]


def sv(s: str) -> bytes:
    b = s.encode()
    assert len(b) < 127
    return bytes([len(b) + 1]) + b


def be(fmt: str, *v: Any) -> bytes:
    return struct.pack(">" + fmt, *v)


def key_group(runs: list[tuple[int, list[tuple[bytes, bytes]]]]) -> bytes:
    """A canonical key group: runs of (state id, [(key, value)]), flags on each run's last key."""
    out = bytearray(be("H", runs[0][0]))
    for r, (_, entries) in enumerate(runs):
        for i, (k, v) in enumerate(entries):
            if i == len(entries) - 1:
                k = bytes([k[0] | 0x80]) + k[1:]
            out += be("i", len(k)) + k + be("i", len(v)) + v
        out += be("H", runs[r + 1][0] if r + 1 < len(runs) else 0xFFFF)
    return bytes(out)


def decode(
    layout: StateInfo,
    entries: list[tuple[bytes, bytes]],
    kg: int = 5,
    mode: str | None = None,
    prefix_len: int = 1,
) -> list[dict[str, Any]]:
    builder = BatchBuilder(state_schema(layout, mode), layout)
    d = CompositeEntryDecoder(layout, mode, builder)
    scan_key_group(key_group([(0, entries)]), kg, prefix_len, [d.on_entry], [d.finish])
    batch = builder.flush()
    return [] if batch is None else batch.to_pylist()


def ts(ms: int) -> Any:
    return pa.scalar(ms, pa.timestamp("ms", tz="UTC")).as_py()


def test_ttl_value_list_and_map() -> None:
    value = row_state(
        "v", "value", key=S, namespace=VOID, value=L, ttl=True, state_value=TtlSpec(inner=L)
    )
    rows = decode(value, [(b"\x05" + sv("k") + b"\x00", be("qq", 1000, 42))])
    assert rows == [
        {"key_group": 5, "key": "k", "namespace": None, "value": 42, "last_access": ts(1000)}
    ]
    lst = row_state("l", "list", key=S, namespace=VOID, value=S, ttl=True)
    raw = be("q", 7) + sv("a") + b"," + be("q", 8) + sv("b")
    assert decode(lst, [(b"\x05" + sv("k") + b"\x00", raw)]) == [
        {
            "key_group": 5,
            "key": "k",
            "namespace": None,
            "value": ["a", "b"],
            "last_access": [ts(7), ts(8)],
        }
    ]
    flat = decode(lst, [(b"\x05" + sv("k") + b"\x00", raw)], mode="flat")
    assert [(r["index"], r["value"], r["last_access"]) for r in flat] == [
        (0, "a", ts(7)),
        (1, "b", ts(8)),
    ]
    mp = row_state("m", "map", key=S, namespace=VOID, user_key=S, value=L, ttl=True)
    rows = decode(
        mp,
        [
            (b"\x05" + sv("k") + b"\x00" + sv("u"), b"\x00" + be("qq", 9, 3)),
            (b"\x05" + sv("k") + b"\x00" + sv("v"), b"\x01"),
        ],
    )
    assert [(r["user_key"], r["value"], r["last_access"]) for r in rows] == [
        ("u", 3, ts(9)),
        ("v", None, None),
    ]


def test_window_namespace_timers_and_two_byte_prefix() -> None:
    agg = row_state("w", "aggregating", key=S, namespace=WINDOW, value=L, state_value=L)
    key = be("H", 300) + sv("k") + be("qq", 0, 3600000)
    rows = decode(agg, [(key, be("q", 5))], kg=300, prefix_len=2)
    assert rows[0]["namespace"] == {"start": ts(0), "end": ts(3600000)}
    assert rows[0]["key_group"] == 300
    timer = row_state(
        "_timer_state/event_t",
        "event_timer",
        key=S,
        namespace=VOID,
        value=TimerSpec(key=S, namespace=VOID),
    )
    tkey = b"\x06" + bytes.fromhex("800003bb2cc3d800") + sv("k9") + b"\x00"
    assert decode(timer, [(tkey, b"")], kg=6) == [
        {"key_group": 6, "key": "k9", "namespace": None, "timestamp": ts(4102444800000),
         "timestamp_ms": 4102444800000}
    ]
    with pytest.raises(DecodeError, match="key group 7 inside key group 6"):
        decode(timer, [(b"\x07" + tkey[1:], b"")], kg=6)
    with pytest.raises(DecodeError, match="expected empty"):
        decode(timer, [(tkey, b"x")], kg=6)


def test_ambiguous_key_and_namespace_lengths() -> None:
    """Variable key and variable namespace: each is followed by its length (LE base-256)."""
    layout = row_state("v", "value", key=S, namespace=S, value=L, state_value=L)
    key = b"\x05" + sv("key") + bytes([4]) + sv("namespace") + bytes([10])
    assert decode(layout, [(key, be("q", 1))])[0]["namespace"] == "namespace"
    bad = b"\x05" + sv("key") + bytes([5]) + sv("namespace") + bytes([10])
    with pytest.raises(DecodeError, match="length suffix"):
        decode(layout, [(bad, be("q", 1))])


def test_opaque_values_come_back_raw_with_reason() -> None:
    kryo = OpaqueSpec(family="kryo", type_class="com.acme.Thing", reason="Kryo")
    layout = row_state("v", "value", key=S, namespace=VOID, value=kryo, state_value=kryo)
    schema = state_schema(layout)
    assert schema.field("value").type == pa.binary() and "value_reason" in schema.names
    rows = decode(layout, [(b"\x05" + sv("k") + b"\x00", b"\x01\x02\x03")])
    assert rows[0]["value"] == b"\x01\x02\x03"
    assert "com.acme.Thing" in rows[0]["value_reason"]
    from support.entries import state_entries

    table = pa.Table.from_pylist(rows, schema=schema)
    (entry,) = state_entries(table, "value", "v", "", "0" * 32)
    assert entry["value"] == {"$raw": "AQID", "$class": "com.acme.Thing"}
    lst = row_state("l", "list", key=S, namespace=VOID, value=kryo)
    rows = decode(lst, [(b"\x05" + sv("k") + b"\x00", b"\x01,\x02")])
    assert rows[0]["value"] == b"\x01,\x02" and rows[0]["value_reason"]
    mp = row_state("m", "map", key=S, namespace=VOID, user_key=S, value=kryo)
    rows = decode(mp, [(b"\x05" + sv("k") + b"\x00" + sv("u"), b"\x00\xff")])
    assert rows[0]["value"] == b"\xff"


def test_strict_slots() -> None:
    layout = row_state("v", "value", key=S, namespace=VOID, value=L, state_value=L)
    with pytest.raises(DecodeError, match="8 expected"):
        decode(layout, [(b"\x05" + sv("k") + b"\x00", be("q", 1) + b"x")])
    with pytest.raises(DecodeError, match="VoidNamespace"):
        decode(layout, [(b"\x05" + sv("k") + b"\x01", be("q", 1))])
    lst = row_state("l", "list", key=S, namespace=VOID, value=S)
    with pytest.raises(DecodeError, match="delimiter"):
        decode(lst, [(b"\x05" + sv("k") + b"\x00", sv("a") + b";" + sv("b"))])


def test_key_group_stream_seeks_and_reports_file_offsets() -> None:
    layout = row_state("v", "value", key=S, namespace=VOID, value=L, state_value=L)
    header = b"H" * 10
    kg1 = key_group([(0, [(b"\x01" + sv("a") + b"\x00", be("q", 1))])])
    kg3 = key_group([(0, [(b"\x03" + sv("b") + b"\x00", be("q", 2))])])
    data = header + kg1 + kg3
    stream = MemStream(data, "file-x")
    kgs = KeyGroupStream(stream, {0: 0, 1: 10, 2: 0, 3: 10 + len(kg1)}, False, 1)
    builder = BatchBuilder(state_schema(layout), layout)
    d = CompositeEntryDecoder(layout, None, builder)
    assert list(kgs.scan([d.on_entry], [d.finish], key_groups=[3])) == [3]
    assert stream.reads == [(10 + len(kg1), len(kg3))]
    assert builder.flush().to_pylist()[0]["key"] == "b"  # type: ignore[union-attr]
    broken = header + kg1[:-1] + b"\x00" + kg3  # the end mark of key group 1 is damaged
    with pytest.raises(CorruptStateError) as info:
        list(
            KeyGroupStream(MemStream(broken, "file-x"), {1: 10, 3: 10 + len(kg1)}, False, 1).scan(
                [d.on_entry], [d.finish]
            )
        )
    assert info.value.source == "file-x" and "key group 1" in str(info.value)
    assert info.value.offset is not None and 10 <= info.value.offset < 10 + len(kg1)


def _framed(data: bytes) -> bytes:
    return bytes(cramjam.snappy.compress(data))


def test_heap_key_groups_plain_and_compressed() -> None:
    value = row_state("count", "value", key=S, namespace=VOID, value=L, state_value=L)
    lst = row_state(
        "list", "list", key=S, namespace=VOID, value=S, state_value=ListSpec(element=S)
    )
    mp = row_state(
        "map",
        "map",
        key=S,
        namespace=VOID,
        user_key=S,
        value=L,
        state_value=MapSpec(key=S, value=L),
    )
    timers = row_state(
        "_timer_state/event_t",
        "event_timer",
        key=S,
        namespace=VOID,
        value=TimerSpec(key=S, namespace=VOID),
    )
    blocks = [
        be("H", 0) + be("i", 1) + b"\x00" + sv("k") + be("q", 3),
        be("H", 1) + be("i", 1) + b"\x00" + sv("k") + be("i", 2) + sv("a") + sv("b"),
        be("H", 3) + be("i", 1) + be("q", 5 ^ -(1 << 63)) + sv("k") + b"\x00",
        be("H", 2)
        + be("i", 1)
        + b"\x00"
        + sv("k")
        + be("i", 2)
        + sv("x")
        + b"\x00"
        + be("q", 1)
        + sv("y")
        + b"\x01",
    ]
    layouts = [value, lst, mp, timers]
    for compressed in (False, True):
        body = b"".join(_framed(b) for b in blocks) if compressed else b"".join(blocks)
        data = (
            b"HEADER"
            + be("i", 4)
            + body
            + be("i", 5)
            + (_framed(blocks[0]) if compressed else blocks[0])
        )
        stream = MemStream(data)
        offsets = {4: 6, 5: 6 + 4 + len(body)}
        got: dict[str, Any] = {}
        for layout in layouts:
            builder = BatchBuilder(state_schema(layout), layout)
            decs = [HeapBlockDecoder(x, builder if x is layout else None) for x in layouts]
            list(HeapKeyGroupStream(stream, offsets, compressed).scan(decs))
            got[layout.name] = builder.flush().to_pylist()  # type: ignore[union-attr]
        assert [(r["key_group"], r["value"]) for r in got["count"]] == [(4, 3), (5, 3)]
        assert got["list"][0]["value"] == ["a", "b"]
        assert [(r["user_key"], r["value"]) for r in got["map"]] == [("x", 1), ("y", None)]
        assert got["_timer_state/event_t"][0]["timestamp"] == ts(5)
    # a wrong key-group id at a heap offset
    with pytest.raises(CorruptStateError, match="starts with key group id"):
        list(
            HeapKeyGroupStream(MemStream(data), {4: 6 + 4 + len(body)}, True).scan(
                [HeapBlockDecoder(x) for x in layouts]
            )
        )


def test_heap_cannot_delimit_opaque_values() -> None:
    kryo = OpaqueSpec(family="kryo")
    layout = row_state("v", "value", key=S, namespace=VOID, value=kryo, state_value=kryo)
    block = be("H", 0) + be("i", 1) + b"\x00" + sv("k") + b"\x01"
    with pytest.raises(UnsupportedFormatError, match="cannot be delimited"):
        list(
            HeapKeyGroupStream(MemStream(be("i", 0) + block), {0: 0}, False).scan(
                [HeapBlockDecoder(layout, BatchBuilder(state_schema(layout), layout))]
            )
        )


def test_serialized_keys_match_the_readers() -> None:
    from statequery.serializers.readers import reader_for

    for spec, key in (
        (S, "héllo€😀"),
        (S, ""),
        (L, -5),
        (PrimitiveSpec(name="int"), 7),
        (PrimitiveSpec(name="boolean"), True),
    ):
        raw = serialized_key(key, spec)
        assert raw is not None
        assert reader_for(spec).slot(raw, 0, len(raw)) == key
    assert serialized_key({"f0": "x"}, None) is None


def test_heap_ttl_states() -> None:
    ttl_long = TtlSpec(inner=L)
    value = row_state("v", "value", key=S, namespace=VOID, value=L, ttl=True,
                        state_value=ttl_long)
    lst = row_state("l", "list", key=S, namespace=VOID, value=L, ttl=True,
                      state_value=ListSpec(element=ttl_long))
    mp = row_state("m", "map", key=S, namespace=VOID, user_key=S, value=L, ttl=True,
                     state_value=MapSpec(key=S, value=ttl_long))
    blocks = (
        be("H", 0) + be("i", 1) + b"\x00" + sv("k") + be("qq", 11, 1)
        + be("H", 1) + be("i", 1) + b"\x00" + sv("k") + be("i", 2) + be("qq", 12, 2)
        + be("qq", 13, 3)
        + be("H", 2) + be("i", 1) + b"\x00" + sv("k") + be("i", 1) + sv("u") + b"\x00"
        + be("qq", 14, 4)
    )
    stream = MemStream(be("i", 0) + blocks)
    layouts = [value, lst, mp]
    got = {}
    for layout in layouts:
        for mode in (None, "flat", "nested"):
            builder = BatchBuilder(state_schema(layout, mode), layout)
            decs = [HeapBlockDecoder(x, builder if x is layout else None, mode) for x in layouts]
            list(HeapKeyGroupStream(stream, {0: 0}, False).scan(decs))
            got[layout.name, mode] = builder.flush().to_pylist()  # type: ignore[union-attr]
    assert [(r["value"], r["last_access"]) for r in got["v", None]] == [(1, ts(11))]
    assert got["l", None][0]["value"] == [2, 3]
    assert got["l", None][0]["last_access"] == [ts(12), ts(13)]
    assert [(r["index"], r["value"]) for r in got["l", "flat"]] == [(0, 2), (1, 3)]
    assert [(r["user_key"], r["value"], r["last_access"]) for r in got["m", None]] == [
        ("u", 4, ts(14))]
    assert got["m", "nested"][0]["map"] == [("u", {"last_access": ts(14), "value": 4})]
