"""A type-12 key-groups handle with an offset for every key group is a hashmap checkpoint, or a
Flink 1.15 full RocksDB checkpoint whose every key group holds data (the canonical layout): the
header read records which (``HeaderInfo.layout``), the planner decides each task's backend from
it once (``keyed_backend_kind``), and executing a task opens that backend and reads. A stream of
key group 0 alone (the case four bytes cannot decide) is walked at planning; a layout the header
read should have recorded and did not is a typed error at planning."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from conftest import fixture_dir, fixture_records

from statequery.backends import KeyedContext, is_heap_layout, keyed_backend_kind
from statequery.exceptions import CorruptStateError
from statequery.metadata.handles import ByteStreamHandle, KeyGroupsHandle
from statequery.savepoint import Savepoint
from statequery.scan import execute


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
def test_the_recorded_layout_decides_the_backend(name: str, heap: bool) -> None:
    """From the model alone (no context: nothing could be read) the backend is decided."""
    with Savepoint.open(str(fixture_dir(name)), use_snapshot=False) as sp:
        handles = _handles(sp)
        if name.startswith("v1.15-") and name.endswith("-maxpar6"):
            assert handles, "the fixture exists for its every-offset-set handles"
        for h, header, _max_par in handles:
            assert keyed_backend_kind(h, header.layout) == ("hashmap" if heap else "canonical")


@pytest.mark.parametrize(("name", "heap"), _ambiguous_handles())
def test_every_task_carries_the_backend_the_planner_chose(name: str, heap: bool) -> None:
    with Savepoint.open(str(fixture_dir(name)), use_snapshot=False) as sp:
        kinds = {
            t.backend
            for s in sp.states
            if s.keyed_rows and s.stream != "raw_keyed"
            for t in sp.plan(s)
            if isinstance(t.handle, KeyGroupsHandle) and is_heap_layout(t.handle)
        }
        assert kinds == ({"hashmap"} if heap else {"canonical"}) or not _handles(sp)


def test_executing_opens_the_backend_of_the_task() -> None:
    """Executing does not decide again: a hashmap task told to read canonical fails reading."""
    with Savepoint.open(str(fixture_dir("datastream-hashmap-checkpoint"))) as sp:
        state = next(s for s in sp.states if s.keyed_rows and s.stream != "raw_keyed")
        tasks = sp.plan(state)
        assert tasks and {t.backend for t in tasks} == {"hashmap"}
        assert sum(b.num_rows for t in tasks for _, b in execute(t, sp.context)) > 0
        with pytest.raises(CorruptStateError):
            for t in tasks:
                for _ in execute(dataclasses.replace(t, backend="canonical"), sp.context):
                    pass


@pytest.mark.parametrize(
    "name",
    [
        "v1.15-datastream-rocksdb-full-checkpoint-maxpar6",
        "datastream-hashmap-checkpoint",
        "datastream-hashmap-checkpoint-snappy",
    ],
)
def test_key_group_zero_alone_is_walked_at_planning(name: str) -> None:
    """A handle of key group 0 alone: int32 0 starts both layouts; the canonical walk decides."""
    sp = Savepoint.open(str(fixture_dir(name)))
    try:
        heap = "hashmap" in name
        for h, header, max_par in _handles(sp):
            if h.start_key_group != 0:
                continue
            data = sp.resolver.read(h.delegate, 0, h.offsets[1])  # the header and key group 0
            one = KeyGroupsHandle(
                start_key_group=0,
                num_key_groups=1,
                offsets=h.offsets[:1],
                delegate=ByteStreamHandle(name=f"{name}#kg0", data=data),
            )
            context = KeyedContext(sp.resolver, max_par)
            n = len(header.state_ids)
            kind = keyed_backend_kind(one, None, context, header.compressed, n)
            assert kind == ("hashmap" if heap else "canonical")
            break
        else:
            pytest.fail("no handle starts at key group 0")
    finally:
        sp.close()


def test_a_layout_the_header_read_did_not_record_is_an_error_at_planning() -> None:
    """The bytes that tell could have been read with the header and were not: planning says so
    (a typed error naming the file), rather than executing probing them later."""
    with Savepoint.open(str(fixture_dir("datastream-hashmap-checkpoint"))) as sp:
        h, header, max_par = next(t for t in _handles(sp) if t[0].start_key_group != 0)
        context = KeyedContext(sp.resolver, max_par)
        with pytest.raises(CorruptStateError, match="layout of this key-group stream") as e:
            keyed_backend_kind(h, None, context, header.compressed, len(header.state_ids))
        assert e.value.source == sp.resolver.source_name(h.delegate)
