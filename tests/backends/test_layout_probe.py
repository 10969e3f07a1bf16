"""A type-12 key-groups handle with an offset for every key group is a hashmap checkpoint, or a
Flink 1.15 full RocksDB checkpoint whose every key group holds data (the canonical layout):
``heap_layout_of`` tells them apart by the bytes, on every such handle of the fixtures, and on a
stream cut to its key group 0 alone (the case four bytes cannot decide)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import fixture_dir, fixture_records

from statequery.backends import HandleStream, heap_layout_of, is_heap_layout
from statequery.metadata.handles import KeyGroupsHandle
from statequery.savepoint import Savepoint


def _ambiguous_handles() -> list[tuple[str, bool]]:
    """Fixtures holding type-12 handles with every offset set, and whether they are hashmap."""
    out = []
    for r in fixture_records():
        if r["snapshot"] != "checkpoint" and r["format"] != "native":
            continue
        if r["backend"] == "hashmap" or r["name"].endswith("-maxpar6"):
            out.append((r["name"], r["backend"] == "hashmap"))
    return out


def _handles(sp: Savepoint) -> list[tuple[Any, Any, int]]:
    found = []
    for op in sp.meta.operators:
        for st in op.subtasks:
            h = st.keyed_handle
            if isinstance(h, KeyGroupsHandle) and is_heap_layout(h) and st.keyed_header:
                found.append((h, st.keyed_header, op.max_parallelism))
    return found


@pytest.mark.parametrize(("name", "heap"), _ambiguous_handles())
def test_the_bytes_decide_the_layout(name: str, heap: bool) -> None:
    sp = Savepoint.open(str(fixture_dir(name)))
    handles = _handles(sp)
    if name.startswith("v1.15-") and name.endswith("-maxpar6"):
        assert handles, "the fixture exists for its every-offset-set handles"
    for h, header, max_par in handles:
        stream = HandleStream(sp.resolver, h.delegate)
        n = len(header.state_ids)
        assert heap_layout_of(h, stream, header.compressed, n, max_par) is heap


class _Cut:
    """A stream holding only its first ``size`` bytes."""

    def __init__(self, inner: Any, size: int) -> None:
        self._inner, self._size, self.name = inner, size, inner.name + "#cut"

    def size(self) -> int:
        return self._size

    def read_range(self, start: int, length: int) -> bytes:
        return self._inner.read_range(start, max(0, min(length, self._size - start)))


@pytest.mark.parametrize(
    "name",
    [
        "v1.15-datastream-rocksdb-full-checkpoint-maxpar6",
        "datastream-hashmap-checkpoint",
        "datastream-hashmap-checkpoint-snappy",
    ],
)
def test_key_group_zero_alone_is_walked(name: str) -> None:
    """A handle of key group 0 alone: int32 0 starts both layouts; the canonical walk decides."""
    sp = Savepoint.open(str(fixture_dir(name)))
    heap = "hashmap" in name
    for h, header, max_par in _handles(sp):
        if h.start_key_group != 0:
            continue
        one = KeyGroupsHandle(
            start_key_group=0, num_key_groups=1, offsets=h.offsets[:1], delegate=h.delegate
        )
        stream = _Cut(HandleStream(sp.resolver, h.delegate), h.offsets[1])
        n = len(header.state_ids)
        assert heap_layout_of(one, stream, header.compressed, n, max_par) is heap
        break
    else:
        pytest.fail("no handle starts at key group 0")


def _keyed_file_reads(name: str) -> tuple[dict[int, int], dict[int, str | None]]:
    """Listing ``name`` from its bytes: the ranged reads (requests less opens) of each keyed
    state file, by the start key group of its handle, and the layout each header recorded."""
    import statequery
    from statequery.io import FileIO

    io = FileIO({})
    try:
        sp = statequery.open(str(fixture_dir(name)), io=io, use_snapshot=False, max_workers=1)
        sp.state_meta()
        reads, layouts = {}, {}
        for op in sp.meta.operators:
            for st in op.subtasks:
                h = st.keyed_handle
                if isinstance(h, KeyGroupsHandle) and is_heap_layout(h):
                    loc = sp.resolver.location(h.delegate)
                    reads[h.start_key_group] = io.stats.requests[loc] - io.stats.opens[loc]
                    layouts[h.start_key_group] = st.keyed_header.layout
        return reads, layouts
    finally:
        io.close()


@pytest.mark.parametrize(
    ("name", "layout"),
    [
        ("v1.15-datastream-rocksdb-full-checkpoint-maxpar6", "canonical"),
        ("datastream-hashmap-checkpoint", "heap"),
        ("datastream-hashmap-checkpoint-snappy", "heap"),
    ],
)
def test_the_probe_rides_on_the_header_read(
    name: str, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At listing, the 4 bytes that decide come with the header's read: one ranged read per
    keyed state file. Those of a handle not starting at key group 0 follow the header, so they
    come with it even when nothing past the header may be read (``PROBE_SLACK`` 0); a handle
    starting at key group 0 then reads them on their own (key group 0 lies between)."""
    import statequery.metadata.model as model

    reads, layouts = _keyed_file_reads(name)
    assert len(reads) >= 2 and 0 in reads and any(kg != 0 for kg in reads)
    assert reads == dict.fromkeys(reads, 1)
    assert layouts == dict.fromkeys(reads, layout)

    monkeypatch.setattr(model, "PROBE_SLACK", 0)
    reads, layouts = _keyed_file_reads(name)
    assert reads == {kg: 2 if kg == 0 else 1 for kg in reads}
    assert layouts == dict.fromkeys(reads, layout)
