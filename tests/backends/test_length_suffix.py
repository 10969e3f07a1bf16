"""Length-suffixed RocksDB composite keys on plain (non-changelog) RocksDB snapshots.

The ``labels-*`` fixtures (docs/fixtures.md; ``DataStreamStateJob ... off labels``) hold the
window contents of uid ``labels``: a ``String`` key and a ``LabelWindow`` namespace (a POJO
serializer, no fixed length). With both of variable length Flink writes the composite key
``key-group prefix | key | len(key) | namespace | len(namespace)`` (Flink's
``SerializedCompositeKeyBuilder``; the lengths as little-endian "variable int bytes"). Among the
keys: the empty string (its ``StringSerializer`` bytes are the single length byte 0x01, so its
suffix is 1) and a string with a NUL and a non-BMP character. Each fixture is read on both
decode paths against Flink's dump.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support.entries import canonical, savepoint_entries

import statequery
import statequery.backends.rocksdb as rocks
from statequery.backends.cache import FileCache
from statequery.catalog import Catalog
from statequery.hashing import key_group_of
from statequery.io import FileIO
from statequery.reader import lookup, read_table
from tests.conftest import dump_entries, fixture_dir, fixture_record

NATIVE = ["labels-rocksdb-native", "labels-rocksdb-incremental-checkpoint"]
CANONICAL = ["labels-rocksdb-canonical", "labels-hashmap-canonical"]
FIXTURES = NATIVE + CANONICAL
EMPTY = ""
ODD = "nul\x00\U0001f600-user-1"  # ChangelogTtl.labelKey("user-1")
STATE = "window-contents"
LABELS = {"books", "games", "music", "food"}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rocks, "_DEFAULT_CACHE", FileCache(tmp_path / "cache"))


def _open(name: str, io: FileIO | None = None) -> Any:
    return statequery.open(str(fixture_dir(name)), io=io or FileIO(), use_snapshot=False)


def _dump(name: str, key: str | None = None) -> list[dict]:
    return [
        e
        for e in dump_entries(name)
        if e["operator_uid"] == "labels"
        and e["state"] == STATE
        and (key is None or e["key"] == key)
    ]


def test_the_fixtures_hold_the_edge_keys() -> None:
    for name in FIXTURES:
        assert fixture_record(name).get("changelog") is None
        keys = {e["key"] for e in _dump(name)}
        assert len(keys) == 20 and {EMPTY, ODD} <= keys
        assert {e["namespace"]["label"] for e in _dump(name, EMPTY)} == LABELS


def test_native_keys_carry_length_suffixes(tmp_path: Path) -> None:
    """The raw RocksDB keys: a suffix after the key and after the namespace; the canonical
    savepoint holds the very same composite keys and values."""
    from statequery.backends.rocksdb import read_entries
    from tests.backends.test_rocksdb import _raw_canonical, _raw_rocksdb, _Snapshot, _state_names

    kg = key_group_of(EMPTY, 128)
    for name in NATIVE:
        snap = _Snapshot(fixture_dir(name))
        _, handles = snap.keyed("labels")
        keys = [
            kv.key
            for kv in read_entries(
                handles,
                snap.io,
                STATE,
                max_parallelism=128,
                key_groups=(kg, kg),
                cache=FileCache(tmp_path / name),
                state_names=_state_names(snap, handles[0]),
                resolver=snap.resolver,
            )
        ]
        assert keys and {k[0] for k in keys} == {kg}
        # kg | 0x01 (the empty String: length + 1) | suffix 1 | namespace (PojoSerializer:
        # flags NO_SUBCLASS 0x02, the field's null flag 0, the label as a String) | suffix: the
        # namespace's byte count
        empty = sorted(k for k in keys if k[1:3] == b"\x01\x01")
        namespaces = [b"\x02\x00" + bytes([len(x) + 1]) + x.encode() for x in LABELS]
        assert empty == sorted(bytes([kg, 1, 1]) + ns + bytes([len(ns)]) for ns in namespaces)
        # (the same job run again: TTL timestamps differ, the windows' keys and values do not)
        op_id = snap.keyed("labels")[0].operator_id
        raw = _raw_rocksdb(snap, FileCache(tmp_path / f"{name}-all"))
        canon = _raw_canonical(_Snapshot(fixture_dir("labels-rocksdb-canonical")))
        assert raw.keys() == canon.keys()
        mine = {k: v for k, v in raw.items() if k[0] == op_id}
        assert len(mine) == 80 and mine == {k: canon[k] for k in mine}


@pytest.mark.parametrize("name", FIXTURES)
def test_every_entry_equals_flinks_dump(name: str, decode_path: str) -> None:
    sp = _open(name)
    want = sorted(canonical(e) for e in dump_entries(name))
    assert savepoint_entries(sp, key_group=True) == want


@pytest.mark.parametrize("name", FIXTURES)
def test_namespace_is_the_label_window_struct(name: str, decode_path: str) -> None:
    table = read_table(_open(name), "labels", STATE)
    assert table.schema.field("namespace").type == pa.struct([("label", pa.string())])
    assert table.schema.field("key").type == pa.string()
    got = sorted(
        (r["key"], r["namespace"]["label"], [v["id"] for v in r["value"]])
        for r in table.to_pylist()
    )
    want = sorted(
        (e["key"], e["namespace"]["label"], [v["id"] for v in e["value"]]) for e in _dump(name)
    )
    assert got == want and len(got) == 80


def _assert_read_one_key_group(sp: Any, io: FileIO, kg: int, name: str) -> None:
    """Native: no file of a subtask whose key groups do not hold ``kg`` was read. Canonical:
    per file only its header and the extent of ``kg`` (tests/reader/test_reader.py)."""
    from statequery.backends.rocksdb import from_incremental_handle

    read = {loc for loc, n in io.stats.bytes_read.items() if n and not loc.endswith("_metadata")}
    assert read
    if fixture_record(name)["format"] == "native":
        others: set[str] = set()
        for op in sp.metadata.operators:
            for st in op.subtasks:
                h = st.managed_keyed
                if h is not None and not h.key_group_range.start <= kg <= h.key_group_range.end:
                    others |= {f.location for f in from_incremental_handle(h, sp.resolver).files}
        assert others and not read & others
    else:
        for op in sp.metadata.operators:
            for st in op.subtasks:
                h = st.managed_keyed
                loc = None if h is None else sp.resolver.location(h.delegate)
                if loc is None or loc not in read:
                    continue
                size = sp.resolver.stream_size(h.delegate)
                positive = sorted(o for o in h.offsets if o > 0)
                allowed = positive[0] if positive else size  # the header
                at = kg - h.start_key_group
                if 0 <= at < len(h.offsets) and h.offsets[at] > 0:
                    later = [o for o in positive if o > h.offsets[at]]
                    allowed += (later[0] if later else size) - h.offsets[at]
                assert io.stats.bytes_read[loc] <= allowed, loc


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize("key", [EMPTY, ODD])
def test_key_lookup_reads_one_key_group_and_exactly_the_key(
    name: str, key: str, decode_path: str
) -> None:
    from support.entries import state_entries

    kg = key_group_of(key, 128)
    io = FileIO()
    sp = _open(name, io)
    op = sp.operator("labels")
    sp.metadata  # noqa: B018  (parse _metadata before counting)
    io.stats.reset()
    table = read_table(sp, "labels", STATE, key=key)
    _assert_read_one_key_group(sp, io, kg, name)
    got = sorted(
        canonical(e) for e in state_entries(table, "list", STATE, "labels", op.operator_id, True)
    )
    want = sorted(canonical(e) for e in _dump(name, key))
    assert len(got) == 4 and got == want
    assert {e["key_group"] for e in _dump(name, key)} == {kg}
    # lookup(): every state that holds the key (the windows never fire: no timers)
    result = lookup(_open(name), key, "labels")
    assert [s for _, s in result] == [STATE]
    assert next(iter(result.values())).to_pylist() == table.to_pylist()


@pytest.mark.parametrize("name", ["labels-rocksdb-native", "labels-rocksdb-canonical"])
def test_sql_where_key(name: str, tmp_path: Path, decode_path: str) -> None:
    (tmp_path / "labels").symlink_to(fixture_dir(name))
    for key in (EMPTY, ODD):
        cat = Catalog(str(tmp_path))  # fresh: nothing of the files held from the last key
        sp = cat.savepoint("labels")
        sp.state_meta()  # metadata read before measuring
        cat.io.stats.reset()
        t = statequery.sql(
            "SELECT key, namespace.label AS label, len(value) AS n "
            f"FROM labels.labels__window_contents WHERE key = '{key}' ORDER BY label",
            cat,
        )
        want = sorted((e["namespace"]["label"], len(e["value"])) for e in _dump(name, key))
        assert [(r["label"], r["n"]) for r in t.to_pylist()] == want
        assert set(t.column("key").to_pylist()) == {key}
        _assert_read_one_key_group(sp, cat.io, key_group_of(key, 128), name)


def test_compiled_sink_covers_suffixed_keys() -> None:
    """The compiled path decodes these entries itself (it used to leave them to the pure
    handlers): an entry sink exists for the suffixed list state, rows and flat."""
    from statequery.arrow.schemas import state_schema
    from statequery.backends import fastpath
    from statequery.reader import list_states

    if fastpath.compiled() is None:
        pytest.skip("compiled modules not built (STATEQUERY_NO_EXTENSIONS)")
    sp = _open("labels-rocksdb-canonical")
    ref = next(r for r in list_states(sp, sp.operator("labels")) if r.name == STATE)
    for mode in ("rows", "flat"):
        assert fastpath.entry_sink(ref, mode, state_schema(ref, mode)) is not None


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        # user-7's "books" window: key (7 bytes), its suffix, the namespace (8 bytes), its suffix
        (
            b"\x07user-7\x07\x02\x00\x06books\x08",
            b"\x07user-7\x06\x02\x00\x06books\x08",
            "key length suffix says 6, the key took 7 bytes",
        ),
        (
            b"\x07user-7\x07\x02\x00\x06books\x08",
            b"\x07user-7\x07\x02\x00\x06books\x09",
            "namespace length suffix says 9, the namespace took 8 bytes",
        ),
    ],
)
def test_wrong_suffix_is_a_typed_error_on_both_paths(
    old: bytes, new: bytes, message: str, tmp_path: Path, decode_path: str
) -> None:
    from statequery.exceptions import CorruptStateError

    src = fixture_dir("labels-rocksdb-canonical")
    dest = tmp_path / src.name
    shutil.copytree(src, dest)
    hits = [f for f in dest.iterdir() if old in f.read_bytes()]
    assert len(hits) == 1 and hits[0].read_bytes().count(old) == 1
    hits[0].write_bytes(hits[0].read_bytes().replace(old, new))
    sp = statequery.open(str(dest), use_snapshot=False)
    with pytest.raises(CorruptStateError, match=message) as info:
        read_table(sp, "labels", STATE)
    assert hits[0].name in str(info.value)


# -- crafted composite keys: shapes the fixtures do not hold ----------------------------------


def _sv(s: str) -> bytes:
    """Flink's StringValue: length + 1 in 7-bit groups (low first), then the chars (ASCII)."""
    n, out = len(s) + 1, bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes([*out, n]) + s.encode()


def _suffix(n: int) -> bytes:
    out = bytearray([n & 0xFF])
    while n > 0xFF:
        n >>= 8
        out.append(n & 0xFF)
    return bytes(out)


def _composite(key: str, ns: str, tail: bytes = b"") -> bytes:
    k, n = _sv(key), _sv(ns)
    return b"\x05" + k + _suffix(len(k)) + n + _suffix(len(n)) + tail


def _decode(layout: Any, entries: list[tuple[bytes, bytes]], mode: str | None = None) -> list:
    from tests.backends.test_keygroups import decode

    return decode(layout, entries, mode=mode)


def test_crafted_suffixes_value_map_and_long_namespace(decode_path: str) -> None:
    """String key and String namespace: value and map state (rows and nested), the empty key
    (suffix 1), a 300-char namespace (two-byte StringValue length, two-byte suffix 302 =
    0x2e 0x01), the same rows on both decode paths."""
    from support.flinkenc import row_state

    from statequery.serializers.spec import PrimitiveSpec

    s, long_ = PrimitiveSpec(name="string"), PrimitiveSpec(name="long")
    big = "n" * 300
    assert _composite("", big)[1:4] == b"\x01\x01\xad" and _suffix(302) == b"\x2e\x01"
    value = row_state("v", "value", key=s, namespace=s, value=long_, state_value=long_)
    rows = _decode(
        value,
        [
            (_composite("", "a"), (7).to_bytes(8, "big")),
            (_composite("k", big), (8).to_bytes(8, "big")),
        ],
    )
    assert [(r["key"], r["namespace"], r["value"]) for r in rows] == [("", "a", 7), ("k", big, 8)]
    from statequery.serializers.spec import MapSpec

    m = row_state(
        "m",
        "map",
        key=s,
        namespace=s,
        user_key=s,
        value=long_,
        state_value=MapSpec(key=s, value=long_),
    )
    entries = [
        (_composite("", big, _sv("u1")), b"\x00" + (1).to_bytes(8, "big")),
        (_composite("", big, _sv("u2")), b"\x01"),
        (_composite("x", "y", _sv("u3")), b"\x00" + (3).to_bytes(8, "big")),
    ]
    rows = _decode(m, entries, mode="rows")
    assert [(r["key"], r["namespace"], r["user_key"], r["value"]) for r in rows] == [
        ("", big, "u1", 1),
        ("", big, "u2", None),
        ("x", "y", "u3", 3),
    ]
    nested = _decode(m, entries, mode="nested")
    assert [(r["key"], r["namespace"], r["map"]) for r in nested] == [
        ("", big, [("u1", 1), ("u2", None)]),
        ("x", "y", [("u3", 3)]),
    ]
    # the suffix cut off at the end of the composite key: a typed decode error on both paths
    from statequery.serializers.readers import DecodeError

    cut = b"\x05" + _sv("k") + _suffix(2) + _sv(big)
    with pytest.raises(DecodeError, match="namespace length suffix runs past the end"):
        _decode(value, [(cut, (1).to_bytes(8, "big"))])
    with pytest.raises(DecodeError, match="runs past the end"):  # 302 needs two bytes
        _decode(value, [(cut + b"\x2e", (1).to_bytes(8, "big"))])
    with pytest.raises(DecodeError, match="suffix says 558, the namespace took 302 bytes"):
        _decode(value, [(cut + b"\x2e\x02", (1).to_bytes(8, "big"))])
