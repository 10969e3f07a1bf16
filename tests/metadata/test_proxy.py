"""State-file headers: bounded reads, contents, and unknown serializer snapshots."""

from __future__ import annotations

from typing import Any

import pytest

from statequery.decoder import Decoder
from statequery.exceptions import CorruptStateError
from statequery.io import FileIO
from statequery.metadata.checkpoint import load_metadata
from statequery.metadata.handles import ByteStreamHandle, HandleResolver, KeyGroupsHandle
from statequery.metadata.proxy import read_header, read_keyed_proxy, read_operator_proxy
from statequery.serializers.spec import OpaqueSpec, TimerSpec
from tests.conftest import fixture_dir


def _subtask(name: str, uid: str, index: int = 0) -> tuple[HandleResolver, Any, FileIO]:
    io = FileIO()
    md = load_metadata(io, str(fixture_dir(name) / "_metadata"))
    op = [o for o in md.operators if o.uid == uid][0]
    return HandleResolver(io, md.directory), op.subtasks[index], io


def _keyed_header_bytes(name: str = "datastream-hashmap-canonical") -> tuple[bytes, int]:
    resolver, st, _ = _subtask(name, "user-state")
    data = resolver.read(st.managed_keyed)
    proxy = read_keyed_proxy(Decoder(data))
    return data, proxy.header_end or 0


def test_keyed_header_of_the_datastream_job() -> None:
    resolver, st, io = _subtask("datastream-hashmap-canonical", "user-state")
    proxy = read_header(resolver, st.managed_keyed, read_keyed_proxy)
    assert proxy.version == 6 and not proxy.compressed and proxy.error is None
    assert proxy.key_serializer.name == "string"
    kinds = {s.name: (s.backend_type, s.state_type) for s in proxy.states}
    assert kinds == {
        "count": ("KEY_VALUE", "VALUE"),
        "recent-categories": ("KEY_VALUE", "LIST"),
        "amount-by-category": ("KEY_VALUE", "MAP"),
        "sum-amount": ("KEY_VALUE", "REDUCING"),
        "avg-amount": ("KEY_VALUE", "AGGREGATING"),
        "profile": ("KEY_VALUE", "VALUE"),
        "_timer_state/event_user-timers": ("PRIORITY_QUEUE", None),
        "_timer_state/processing_user-timers": ("PRIORITY_QUEUE", None),
    }
    assert [s.state_id for s in proxy.states] == list(range(8))
    timer = proxy.state("_timer_state/event_user-timers").serializers["VALUE_SERIALIZER"]
    assert isinstance(timer, TimerSpec) and timer.key.name == "string"
    # the first key group's data starts right after the header
    first = min(o for o in st.managed_keyed.offsets if o > 0)
    assert proxy.header_end == first


def test_header_reads_only_a_bounded_prefix() -> None:
    resolver, st, io = _subtask("datastream-rocksdb-canonical", "user-state")
    handle = st.managed_keyed
    total = handle.delegate.size
    io.stats.reset()
    proxy = read_header(resolver, handle, read_keyed_proxy, prefix=2048)
    assert proxy.error is None and len(proxy.states) == 8 and proxy.header_end is not None
    # the 4110-byte header: 2 KiB, then 8 KiB of the 9.6 KB file; never the whole file
    assert 2048 < proxy.header_end < 8192 < total
    assert io.stats.total_bytes == 2048 + 8192
    # one open, two ranged reads through it
    assert io.stats.total_opens == 1 and io.stats.total_requests == 3
    # growing from a tiny prefix gives the same result
    assert read_header(resolver, handle, read_keyed_proxy, prefix=16) == proxy


def test_snappy_fixture_header_records_compression() -> None:
    resolver, st, _ = _subtask("datastream-rocksdb-canonical-snappy", "user-state")
    assert read_header(resolver, st.managed_keyed, read_keyed_proxy).compressed


def test_operator_header() -> None:
    resolver, st, _ = _subtask("datastream-hashmap-canonical", "operator-state")
    proxy = read_header(resolver, st.managed_operator.delegate, read_operator_proxy)
    assert proxy.version == 6 and proxy.error is None
    assert [(s.name, s.distribution_mode) for s in proxy.operator_states] == sorted(
        [("buffered-ids", "SPLIT_DISTRIBUTE"), ("union-markers", "UNION")],
        key=lambda x: [s.name for s in proxy.operator_states].index(x[0]),
    )
    (rules,) = proxy.broadcast_states
    assert rules.backend_type == "BROADCAST"
    assert {k: v.name for k, v in rules.serializers.items()} == {
        "KEY_SERIALIZER": "string",
        "VALUE_SERIALIZER": "string",
    }
    first = min(o for p in st.managed_operator.partitions for o in p.offsets)
    assert proxy.header_end == first


def _rename(data: bytes, old: bytes, new: bytes, count: int = 1) -> bytes:
    assert len(old) == len(new)
    assert data.count(old) >= count
    return data.replace(old, new, count)


def test_unknown_simple_snapshot_in_the_middle_is_resynchronised() -> None:
    data, end = _keyed_header_bytes()
    hdr = data[:end]
    proxy0 = read_keyed_proxy(Decoder(hdr))
    # make the class of the "count" state's value unknown (a simple snapshot: empty payload)
    at = hdr.index(b"\x00\x05count\x00\x00\x00\x00")
    old = b"LongSerializer$LongSerializerSnapshot"
    i = hdr.index(old, at)
    bad = hdr[:i] + b"LongSerializer$QongSerializerSnapshot" + hdr[i + len(old) :]
    proxy = read_keyed_proxy(Decoder(bad, source="f"))
    assert proxy.error is None and proxy.header_end == end
    assert [s.name for s in proxy.states] == [s.name for s in proxy0.states]
    broken = [s for s in proxy.states if s.reason]
    assert [s.name for s in broken] == ["count"] and "QongSerializerSnapshot" in broken[0].reason
    assert isinstance(
        broken[0].serializers["VALUE_SERIALIZER"]
        if "VALUE_SERIALIZER" in broken[0].serializers
        else None,
        (OpaqueSpec, type(None)),
    )
    others = [s for s in proxy.states if not s.reason]
    assert others == [s for s in proxy0.states if s.name != broken[0].name]


def test_unknown_key_serializer_keeps_the_state_list() -> None:
    data, end = _keyed_header_bytes()
    bad = _rename(
        data[:end],
        b"StringSerializer$StringSerializerSnapshot",
        b"StringSerializer$QtringSerializerSnapshot",
    )
    proxy = read_keyed_proxy(Decoder(bad))
    assert isinstance(proxy.key_serializer, OpaqueSpec) and proxy.error
    assert "QtringSerializerSnapshot" in proxy.error
    assert len(proxy.states) == 8


def test_truncated_header_is_a_corrupt_state_error() -> None:
    data, end = _keyed_header_bytes()
    for cut in (0, 3, 5, 40, end // 2, end - 1):
        with pytest.raises(CorruptStateError) as e:
            proxy = read_keyed_proxy(Decoder(data[:cut], source="state-file"))
            assert proxy.header_end is None or proxy.header_end <= cut
            raise CorruptStateError("header parsed partially", "state-file", cut)
        assert e.value.source == "state-file"


def test_inline_fixture_headers_come_from_metadata() -> None:
    resolver, st, io = _subtask("datastream-hashmap-inline", "user-state")
    assert isinstance(st.managed_keyed, KeyGroupsHandle)
    assert isinstance(st.managed_keyed.delegate, ByteStreamHandle)
    io.stats.reset()
    proxy = read_header(resolver, st.managed_keyed, read_keyed_proxy)
    assert len(proxy.states) == 8 and io.stats.total_bytes == 0
