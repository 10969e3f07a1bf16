"""statequery.reader against the real Flink-written fixtures (docs/fixtures.md).

Every state of every fixture, read with statequery and normalised with ``tests/support/entries.py``,
must equal Flink's own dump (with ``key_group``) and the generator's expected contents (without),
entry by entry, all rows. RocksDB native snapshots (type-11 handles) belong to the RocksDB issue:
until a backend is registered for them their keyed state must fail with a typed error, and their
operator state must still match.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from conftest import (
    dump_entries,
    expected_entries,
    fixture_classpath,
    fixture_dir,
    fixture_names,
    fixture_record,
)
from support.entries import (
    canonical,
    entry_lines,
    jsonify_column,
    mask_any,
    same_table,
    state_entries,
)

import statequery
from statequery.arrow.schemas import state_schema
from statequery.backends import is_heap_layout
from statequery.exceptions import (
    InvalidOptionError,
    NoSuchOperatorError,
    NoSuchStateError,
    UnsupportedFormatError,
)
from statequery.hashing import key_group_of
from statequery.io import FileIO
from statequery.metadata.handles import layout_probe
from statequery.metadata.model import PROBE_SLACK
from statequery.reader import list_states, lookup, read_state, read_table, schema_of
from statequery.scan import read_schema

FIXTURES = fixture_names()
NATIVE_ROCKSDB = {
    "datastream-rocksdb-native",
    "sql-rocksdb-native",
    "datastream-rocksdb-incremental-checkpoint",
} | {n for n in FIXTURES if fixture_record(n)["backend"] == "rocksdb"
     and fixture_record(n)["format"] == "native"}
DECODED = [n for n in FIXTURES if n not in NATIVE_ROCKSDB]


def _open(name: str, io: FileIO | None = None) -> Any:
    # a fixture with the job's jar beside it (types-kryo-*) is read with it, one with a
    # descriptor set (types-protobuf-*) with that
    descriptors = fixture_dir(name).parent / "descriptors.pb"
    return statequery.open(str(fixture_dir(name)), io=io or FileIO(), use_snapshot=False,
                           classpath=fixture_classpath(name),
                           protobuf_descriptors=descriptors if descriptors.is_file() else None)


def _state_entries(sp: Any, op: Any, name: str, kind: str, key_group: bool = True) -> list[Any]:
    """The entries of one state as the oracle renders them (Protobuf messages as their bytes,
    re-encoded from the decoded structs: tests/support/protobuf_entries.py)."""
    from support.protobuf_entries import reencoded, wrap

    table, is_protobuf = reencoded(sp, op.operator_id, name, read_table(sp, op, name))
    entries = state_entries(table, kind, name, op.uid or "", op.operator_id, key_group)
    return wrap(entries) if is_protobuf else entries


def _entries_of(sp: Any, key_group: bool, only_operator_state: bool = False) -> list[str]:
    lines: list[str] = []
    for op in sp.metadata.operators:
        if only_operator_state and any(st.managed_keyed for st in op.subtasks):
            continue
        for ref in list_states(sp, op):
            if only_operator_state and ref.keyed_rows:
                continue
            lines.extend(
                canonical(e)
                for e in _state_entries(sp, op, ref.name, ref.kind, key_group)
            )
    return sorted(lines)


def _diff(mine: list[str], theirs: list[str]) -> str:
    a, b = Counter(mine), Counter(theirs)
    extra = list((a - b).elements())[:8]
    missing = list((b - a).elements())[:8]
    return f"\nstatequery only: {extra}\noracle only: {missing}"


def _assert_equals_expected(name: str, mine_no_kg: list[str]) -> None:
    """``"$any"`` in the expected file (TTL ``last_access``) matches any integer. Fixtures whose
    manifest says ``"expected": "subset"`` (the SQL operator fixtures) model only some states:
    every expected entry must then be among ours."""
    want = expected_entries(name)
    got = sorted(canonical(e) for e in mask_any([json.loads(x) for x in mine_no_kg], want))
    expected = sorted(canonical(e) for e in want)
    if fixture_record(name).get("expected") == "subset":
        assert expected, f"{name}: empty expected subset"
        missing = Counter(expected) - Counter(got)
        assert not missing, f"expected entries statequery did not read: {list(missing)[:8]}"
    else:
        assert got == expected, _diff(got, expected)


@pytest.mark.parametrize("name", DECODED)
def test_every_state_equals_flink_dump_and_expected(name: str, decode_path: str) -> None:
    sp = _open(name)
    mine = _entries_of(sp, key_group=True)
    dump = sorted(canonical(e) for e in dump_entries(name))
    assert mine == dump, _diff(mine, dump)
    _assert_equals_expected(name, _entries_of(sp, key_group=False))
    assert len(mine) == len(dump) > 0


@pytest.mark.parametrize("name", sorted(NATIVE_ROCKSDB & set(FIXTURES)))
def test_native_rocksdb_operator_state_and_typed_keyed_error(name: str) -> None:
    sp = _open(name)
    mine = _entries_of(sp, key_group=True, only_operator_state=True)
    keyed = [op for op in sp.metadata.operators if any(st.managed_keyed for st in op.subtasks)]
    keyed_ids = {op.operator_id for op in keyed}
    # operators with keyed state (and their operator state, e.g. SQL windows' watermark) below
    dump = sorted(canonical(e) for e in dump_entries(name)
                  if "key" not in e and e["operator_id"] not in keyed_ids)
    assert mine == dump, _diff(mine, dump)
    assert keyed
    registered = False
    for op in keyed:
        try:
            states = list_states(sp, op)
        except UnsupportedFormatError as e:
            assert "type 11" in str(e)
            continue
        # a RocksDB backend is registered: then it must match the dump too
        for ref in states:
            got = entry_lines(_state_entries(sp, op, ref.name, ref.kind))
            want = sorted(
                canonical(e)
                for e in dump_entries(name)
                if e["operator_id"] == op.operator_id and e["state"] == ref.name
            )
            assert got == want, _diff(got, want)
        registered = True
    if registered:  # and the generator's expected contents
        _assert_equals_expected(name, _entries_of(sp, key_group=False))


# -- lookup: the same rows as a filtered full read, from one key group ----------------------------


def _keyed_keys(name: str, limit: int) -> list[Any]:
    keys = []
    for e in dump_entries(name):
        if "key" in e and e["key"] not in keys:
            keys.append(e["key"])
    step = max(1, len(keys) // limit)
    return keys[::step][:limit]


def _python_key(sp: Any, json_key: Any) -> Any:
    """The key as ``read()`` returns it whose fixture JSON form (dates as day numbers, decimals
    as strings, ...) is ``json_key``: the value a user gives back."""
    if isinstance(json_key, str):
        return json_key
    for op in sp.keyed_operators():
        for s in op.states:
            if not s.keyed_rows:
                continue
            column = sp.read(s).column("key")
            for j, k in zip(jsonify_column(column), column.to_pylist(), strict=True):
                if j == json_key:
                    return k
    raise AssertionError(f"no state holds the key {json_key!r}")


def _allowed_bytes(sp: Any, kg: int) -> dict[str, int]:
    """Per keyed-state file: its header, plus the extent of ``kg`` when the file holds it."""
    allowed: dict[str, int] = {}
    for op in sp.metadata.operators:
        for st in op.subtasks:
            h = st.managed_keyed
            if h is None:
                continue
            loc = sp.resolver.location(h.delegate)
            if loc is None:
                continue
            offsets = list(h.offsets)
            positive = sorted(o for o in offsets if o > 0)
            header = positive[0] if positive else sp.resolver.stream_size(h.delegate)
            extent = 0
            if h.start_key_group <= kg < h.start_key_group + len(offsets):
                start = h.offsets[kg - h.start_key_group]
                if start > 0:
                    later = [o for o in positive if o > start]
                    end = later[0] if later else sp.resolver.stream_size(h.delegate)
                    extent = end - start
            # a type-12 handle with an offset for every key group is hashmap, or a Flink 1.15
            # full RocksDB checkpoint: listing reads 4 bytes of a key group to tell which
            # (statequery.metadata.handles.layout_by_first_bytes)
            probe = 4 if is_heap_layout(h) else 0
            at = layout_probe(h) if probe else None
            if at is not None and at[0] - header <= PROBE_SLACK:
                # the probe rides on the header's read: the bytes up to it come along
                probe = max(probe, at[0] + 4 - header)
            allowed[loc] = allowed.get(loc, 0) + header + extent + probe
            # listing an operator's states reads its operator-state header too (SQL window
            # operators keep their watermark there); that file holds no keyed state
            op_handle = getattr(st, "managed_operator", None)
            op_loc = sp.resolver.location(op_handle.delegate) if op_handle is not None else None
            if op_loc is not None:
                allowed[op_loc] = sp.resolver.stream_size(op_handle.delegate)
            # listing reads the first key group of a raw keyed stream (timer services, or
            # whether it holds anything statequery reads), and a lookup of heap timers its key
            # group: both extents of that file
            raw = st.raw_keyed
            raw_loc = sp.resolver.location(raw.delegate) if raw is not None else None
            if raw_loc is not None:
                ends = [*raw.offsets[1:], sp.resolver.stream_size(raw.delegate)]
                extents = [e - o for o, e in zip(raw.offsets, ends, strict=True)]
                at = kg - raw.start_key_group
                allowed[raw_loc] = extents[0] + (extents[at] if 0 < at < len(extents) else 0)
    return allowed


@pytest.mark.parametrize("name", DECODED)
def test_lookup_equals_filtered_full_read_and_reads_one_key_group(
    name: str, decode_path: str
) -> None:
    record = fixture_record(name)
    full = _open(name)
    for key in _keyed_keys(name, 3):
        io = FileIO()
        sp = _open(name, io)
        sp.metadata  # noqa: B018  (parse _metadata before counting)
        io.stats.reset()
        result = lookup(sp, _python_key(full, key))
        assert result, f"no rows for {key!r}"
        # bytes: only headers and the one key group that holds the key
        kgs = {t.column("key_group")[0].as_py() for t in result.values()}
        assert len(kgs) == 1, kgs
        kg = kgs.pop()
        allowed = _allowed_bytes(sp, kg)
        for loc, n in io.stats.bytes_read.items():
            if loc.endswith("_metadata"):
                continue
            assert loc in allowed, f"lookup read {n} bytes of {loc}, which holds no keyed state"
            assert n <= allowed[loc], (
                f"{loc}: read {n} bytes, header + key group {kg} = {allowed[loc]}"
            )
        # values: a full read filtered to the key
        for (op_label, state), table in result.items():
            op = full.operator(op_label)
            whole = read_table(full, op.operator_id, state)
            key0 = table.column("key")[0].as_py()
            want = whole.take([i for i, k in enumerate(whole.column("key").to_pylist())
                               if k == key0])
            assert same_table(table, want)  # NaN-aware; rows may hold instants beyond year 9999
            assert table.schema == whole.schema
        # and it covers every state that holds the key
        expected_states = {e["state"] for e in dump_entries(name) if e.get("key") == key}
        assert {s for _, s in result} == expected_states
        assert record["max_parallelism"] > kg >= 0


def test_lookup_key_group_is_flinks() -> None:
    name = "datastream-hashmap-canonical-maxpar256"
    for e in dump_entries(name)[:50]:
        if "key" in e and isinstance(e["key"], str):
            assert key_group_of(e["key"], 256) == e["key_group"]


def test_read_state_key_and_key_groups_filters() -> None:
    sp = _open("datastream-hashmap-canonical")
    rows = read_table(sp, "user-state", "amount-by-category", key="user-7").to_pylist()
    assert rows and {r["key"] for r in rows} == {"user-7"}
    assert {r["user_key"] for r in rows} == {"books", "games", "music", "food"}
    kg = rows[0]["key_group"]
    in_kg = read_table(sp, "user-state", "count", key_groups=[kg]).to_pylist()
    assert {r["key_group"] for r in in_kg} == {kg} and "user-7" in {r["key"] for r in in_kg}
    assert read_table(sp, "user-state", "count", key_groups=[]).num_rows == 0
    # a key that does not exist: its key group is read, no rows
    assert read_table(sp, "user-state", "count", key="nobody").num_rows == 0


def test_sql_row_keys_accept_scalars_tuples_and_dicts() -> None:
    sp = _open("sql-hashmap-canonical")
    op = next(o for o in sp.metadata.operators if o.name.startswith("GroupAggregate"))
    a = read_table(sp, op.operator_id, "accState", key="w1").to_pylist()
    b = read_table(sp, op.operator_id, "accState", key=("w1",)).to_pylist()
    c = read_table(sp, op.operator_id, "accState", key={"f0": "w1"}).to_pylist()
    assert a == b == c and len(a) == 1 and a[0]["key"] == {"f0": "w1"}
    assert lookup(sp, "w1")[(op.name, "accState")].num_rows == 1


def test_modes_flat_and_nested() -> None:
    sp = _open("datastream-rocksdb-canonical")
    rows = read_table(sp, "user-state", "recent-categories").to_pylist()
    flat = read_table(sp, "user-state", "recent-categories", mode="flat").to_pylist()
    assert sum(len(r["value"]) for r in rows) == len(flat)
    by_key = {r["key"]: r["value"] for r in rows}
    for r in flat:
        assert by_key[r["key"]][r["index"]] == r["value"]
    entries = read_table(sp, "user-state", "amount-by-category").to_pylist()
    nested = read_table(sp, "user-state", "amount-by-category", mode="nested").to_pylist()
    assert len(nested) == len({r["key"] for r in entries})
    as_maps = {r["key"]: dict(r["map"]) for r in nested}
    for r in entries:
        assert as_maps[r["key"]][r["user_key"]] == r["value"]
    # heap layout gives the same shapes
    heap = _open("datastream-hashmap-checkpoint")
    heap_nested = read_table(heap, "user-state", "amount-by-category", mode="nested")
    assert sorted(
        map(json.dumps, [{"k": r["key"], "m": sorted(r["map"])} for r in heap_nested.to_pylist()])
    ) == sorted(map(json.dumps, [{"k": r["key"], "m": sorted(r["map"])} for r in nested]))
    heap_flat = read_table(heap, "user-state", "recent-categories", mode="flat")
    assert heap_flat.num_rows == len(flat)


def test_batches_respect_batch_size_and_schema() -> None:
    sp = _open("datastream-hashmap-canonical")
    schema = schema_of(sp, "user-state", "amount-by-category")
    batches = list(read_state(sp, "user-state", "amount-by-category", batch_size=7))
    assert all(b.num_rows <= 7 for b in batches)
    assert all(b.schema == schema for b in batches)
    assert (
        sum(b.num_rows for b in batches)
        == read_table(sp, "user-state", "amount-by-category").num_rows
    )


def test_schemas_of_every_kind() -> None:
    sp = _open("datastream-hashmap-canonical")
    names = {
        "count": ["key_group", "key", "namespace", "value"],
        "recent-categories": ["key_group", "key", "namespace", "value"],
        "amount-by-category": ["key_group", "key", "namespace", "user_key", "value"],
        "_timer_state/event_user-timers": ["key_group", "key", "namespace", "timestamp",
                                           "timestamp_ms"],
        "buffered-ids": ["subtask", "index", "value"],
        "rules": ["user_key", "value"],
    }
    for state, cols in names.items():
        op = "operator-state" if state in ("buffered-ids", "rules") else "user-state"
        assert schema_of(sp, op, state).names == cols
    window = schema_of(sp, "window-agg", "window-contents")
    assert window.field("namespace").type == pa.struct(
        [("start", pa.timestamp("ms", tz="UTC")), ("end", pa.timestamp("ms", tz="UTC"))]
    )
    profile = schema_of(sp, "user-state", "profile").field("value").type
    assert profile.get_field_index("address") >= 0 and profile.field("tier").type == pa.string()
    assert schema_of(sp, "user-state", "recent-categories", mode="flat").names == [
        "key_group",
        "key",
        "namespace",
        "index",
        "value",
    ]
    assert schema_of(sp, "user-state", "amount-by-category", mode="nested").names == [
        "key_group",
        "key",
        "namespace",
        "map",
    ]


def test_savepoint_api_delegates() -> None:
    sp = _open("datastream-hashmap-native")
    info = sp.state("user-state", "count")
    table = sp.read(info)
    assert table.num_rows == 20 and table.schema == state_schema(
        next(r for r in list_states(sp, "user-state") if r.name == "count")
    )


def test_typed_errors_for_bad_requests() -> None:
    sp = _open("datastream-hashmap-canonical")
    with pytest.raises(NoSuchOperatorError):
        list(read_state(sp, "no-such-operator", "count"))
    with pytest.raises(NoSuchStateError, match="count"):
        list(read_state(sp, "user-state", "no-such-state"))
    with pytest.raises(InvalidOptionError):
        list(read_state(sp, "operator-state", "buffered-ids", key="x"))
    with pytest.raises(InvalidOptionError):
        list(read_state(sp, "user-state", "count", mode="sideways"))


@pytest.mark.parametrize("name", DECODED)
def test_schema_from_state_meta_equals_schema_of_the_rows(name: str) -> None:
    """``arrow.state_schema(StateInfo)`` (metadata only) is the schema the rows come in."""
    sp = _open(name)
    for info in sp.states:
        if info.kind not in ("value", "list", "map", "reducing", "aggregating", "event_timer",
                             "processing_timer", "operator_list", "operator_union",
                             "broadcast"):
            continue
        schema = state_schema(info)
        if sp.context.classpath:  # Kryo values typed by the job's classes (types-kryo-*)
            schema = read_schema(info, None, False, sp.context.classpath)
        assert schema == schema_of(sp, info.operator_id, info.name)
        table = read_table(sp, info.operator_id, info.name)
        assert table.schema == schema


def test_key_groups_must_be_integers() -> None:
    import statequery
    from statequery.exceptions import InvalidOptionError
    from tests.conftest import fixture_dir

    sp = statequery.open(str(fixture_dir("datastream-hashmap-canonical")))
    with pytest.raises(InvalidOptionError, match="key_groups must be integers"):
        sp.read("user-state", "count", key_groups=["forty"])
    assert sp.read("user-state", "count", key_groups=[40]).column("key").to_pylist() == ["user-3"]


@pytest.mark.parametrize("name", ["ttl-kryo-hashmap-canonical", "ttl-kryo-rocksdb-native"])
def test_ttl_modes_and_kryo_values(name: str) -> None:
    """TTL: ``last_access`` parallel to the list value, per element in ``flat``, inside the map
    value struct in ``nested``; Kryo values: raw bytes plus a reason, header flags both."""
    sp = _open(name)
    meta = {r["state_name"]: r for r in sp.state_meta().to_pylist()}
    assert all(meta[s]["ttl"] for s in ("ttl-count", "ttl-list", "ttl-map"))
    for s in ("kryo-value", "kryo-map"):
        assert meta[s]["value_serializer"].endswith("KryoSerializerSnapshot")
        assert not meta[s]["decodable"] and "statequery.fixtures.Note" in meta[s]["reason"]
    rows = {r["key"]: r for r in read_table(sp, "ttl-kryo-state", "ttl-list").to_pylist()}
    flat = read_table(sp, "ttl-kryo-state", "ttl-list", mode="flat").to_pylist()
    assert len(flat) == sum(len(r["value"]) == len(r["last_access"]) and len(r["value"])
                            for r in rows.values()) == 200
    for f in flat:
        r = rows[f["key"]]
        assert (r["value"][f["index"]], r["last_access"][f["index"]]) == (f["value"],
                                                                          f["last_access"])
    nested = {r["key"]: dict(r["map"])
              for r in read_table(sp, "ttl-kryo-state", "ttl-map", mode="nested").to_pylist()}
    for r in read_table(sp, "ttl-kryo-state", "ttl-map").to_pylist():
        assert nested[r["key"]][r["user_key"]] == {"last_access": r["last_access"],
                                                   "value": r["value"]}
    kryo = read_table(sp, "ttl-kryo-state", "kryo-map", key="k3")
    assert kryo.schema.field("value").type == pa.binary() and kryo.num_rows == 4
    assert all(v.startswith(b"\x57\x01\x01") for v in kryo.column("value").to_pylist())
    assert all("kryo" in x.lower() and "statequery.fixtures.Note" in x
               for x in kryo.column("value_reason").to_pylist())
