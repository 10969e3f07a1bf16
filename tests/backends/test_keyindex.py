"""Warm lookups through the kept per-key-group index (statequery/backends/keyindex.py).

The first two lookups in a key group walk it whole (the second keeps the index); later lookups
read only the candidate entries. Their answers must equal the full scan's rows for that key, for
present and absent keys and keys of other serialized lengths."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from conftest import fixture_dir

import statequery
from statequery.backends import fastpath, keyindex
from statequery.io import FileIO

# canonical savepoints of the DataStream job: value, list, map, reducing, aggregating states and
# timers under String keys of several lengths
NAMES = ["datastream-hashmap-canonical", "datastream-rocksdb-canonical"]

pytestmark = pytest.mark.skipif(
    keyindex._keyindex is None or fastpath.compiled() is None,
    reason="the compiled modules are not built",
)


def _canon(table: Any) -> list[str]:
    return sorted(repr(sorted(r.items())) for r in table.to_pylist())


def _scan_rows(sp: Any) -> dict[tuple[str, str], dict[Any, list[str]]]:
    """Every keyed state's rows by key, from full scans (no lookup involved)."""
    out: dict[tuple[str, str], dict[Any, list[str]]] = {}
    for op in sp.keyed_operators():
        for s in op.states:
            if not s.keyed_rows:
                continue
            by_key: dict[Any, list[Any]] = defaultdict(list)
            for row in sp.read(op.display_name, s.name, workers=1).to_pylist():
                by_key[row["key"]].append(row)
            out[(op.display_name, s.name)] = {
                k: sorted(repr(sorted(r.items())) for r in rows) for k, rows in by_key.items()
            }
    return out


def _lookup(sp: Any, key: Any) -> dict[tuple[str, str], list[str]]:
    return {name: _canon(t) for name, t in sp.lookup(key).items() if t.num_rows}


def _expected(scan: dict[tuple[str, str], dict[Any, list[str]]], key: Any) -> dict[Any, Any]:
    return {name: rows[key] for name, rows in scan.items() if key in rows}


@pytest.mark.parametrize("name", NAMES)
def test_warm_lookups_equal_the_scan(name: str) -> None:
    keyindex.clear()
    sp = statequery.open(str(fixture_dir(name)), use_snapshot=False)
    scan = _scan_rows(sp)
    keys = sorted({k for rows in scan.values() for k in rows if isinstance(k, str)})
    assert len({len(k) for k in keys}) > 1  # keys of several serialized lengths
    absent = ["no-such-key", "", keys[0] + "x", keys[-1][:-1]]
    for key in [*keys, *absent]:
        want = _expected(scan, key)
        assert _lookup(sp, key) == want, key  # first in its key group (or not)
        assert _lookup(sp, key) == want, key  # second: walked whole, the index kept
        assert _lookup(sp, key) == want, key  # through the kept index
    assert keyindex._cache  # the indexes were kept


@pytest.mark.parametrize("name", NAMES)
def test_indexed_lookup_reads_only_the_entries(name: str) -> None:
    io = FileIO()
    sp = statequery.open(str(fixture_dir(name)), io=io, use_snapshot=False)
    scan = _scan_rows(sp)
    key = max((k for rows in scan.values() for k in rows if isinstance(k, str)),
              key=lambda k: sum(len(rows.get(k, ())) for rows in scan.values()))
    sp.lookup(key)  # headers read and kept
    keyindex.clear()
    io.stats.reset()
    assert _lookup(sp, key) == _expected(scan, key)  # the key group walked whole
    whole = io.stats.total_bytes
    assert _lookup(sp, key) == _expected(scan, key)  # walked whole again, the index kept
    io.stats.reset()
    assert _lookup(sp, key) == _expected(scan, key)  # through the index
    indexed = io.stats.total_bytes
    assert 0 < indexed < whole


def test_a_savepoint_opened_anew_keeps_no_index_of_another() -> None:
    """The indexes belong to one open savepoint: another open of the same files (a test, a
    notebook re-running its cell) reads as a first lookup does, not through the first's index."""
    name = NAMES[0]
    key = "user-3"
    keyindex.clear()
    bytes_of_first_lookups = []
    for _ in range(2):
        io = FileIO()
        sp = statequery.open(str(fixture_dir(name)), io=io, use_snapshot=False)
        sp.state_meta()
        io.stats.reset()
        rows = _lookup(sp, key)
        assert rows
        bytes_of_first_lookups.append(io.stats.total_bytes)
        assert _lookup(sp, key) == _lookup(sp, key) == rows  # the third through the index
    assert keyindex._cache
    assert bytes_of_first_lookups[0] == bytes_of_first_lookups[1] > 0


def test_build_refuses_bytes_that_are_not_a_key_group() -> None:
    from statequery.backends import _keyindex  # type: ignore[attr-defined]

    good = (b"\x00\x00" + (5).to_bytes(4, "big") + b"\x81user" + (1).to_bytes(4, "big")
            + b"v" + b"\xff\xff")
    idx = _keyindex.build(good, 1, [0], 4)
    assert idx.entries == 1
    assert idx.find(b"user") == [(0, 2, len(good) - 2)]
    assert idx.find(b"usex") == []
    assert idx.find(b"use") == []  # another key length: another index
    for bad in (good[:-1], good[:-3], good + b"\x00", b"\x00\x07" + good[2:], b"\x00"):
        with pytest.raises(ValueError):
            _keyindex.build(bad, 1, [0], 4)


# -- the compiled index builder on generated, truncated and mutated bytes ---------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _key_group(entries: list[tuple[int, bytes, bytes]], prefix_len: int) -> bytes:
    """A canonical key group: per state run ``u16 state id``, entries ``int32 len, key (prefix +
    key bytes), int32 len, value``, the last of a run flagged, then ``0xFFFF``."""
    out = bytearray()
    for n, (sid, key, value) in enumerate(entries):
        if n == 0 or entries[n - 1][0] != sid:
            out += sid.to_bytes(2, "big")
        k = bytearray(b"\x00" * prefix_len + key)
        if n + 1 == len(entries) or entries[n + 1][0] != sid:
            k[0] |= 0x80
        out += len(k).to_bytes(4, "big") + k + len(value).to_bytes(4, "big") + value
    return bytes(out + b"\xff\xff")


_ENTRIES = st.lists(
    st.tuples(st.integers(0, 2), st.binary(min_size=0, max_size=6), st.binary(max_size=8)),
    min_size=1, max_size=12,
).map(lambda es: sorted(es, key=lambda e: e[0]))


@given(entries=_ENTRIES, prefix_len=st.sampled_from([1, 2]), key_len=st.integers(0, 6),
       cut=st.integers(0, 400), flips=st.lists(st.tuples(st.integers(0, 400),
                                                         st.integers(0, 255)), max_size=4))
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_index_builder_never_reads_outside_its_bytes(
    entries: list[tuple[int, bytes, bytes]], prefix_len: int, key_len: int, cut: int,
    flips: list[tuple[int, int]],
) -> None:
    """``_keyindex.build`` on a key group, truncated and with bytes changed: a ValueError, or an
    index whose every entry lies inside the bytes; on the intact key group, ``find`` names exactly
    the entries whose key bytes (after the prefix) are the key, in key-group order."""
    from statequery.backends import _keyindex

    good = _key_group(entries, prefix_len)
    idx = _keyindex.build(good, prefix_len, [0, 0, 0], key_len)
    assert idx.entries == len(entries)
    for _sid, key, _ in entries:
        if len(key) != key_len:
            continue
        found = idx.find(key)
        want = [s for s, k, _ in entries if k[:key_len] == key]
        # hash collisions may add candidates; every entry with the key is among them, in order
        assert [f[1] for f in found] == sorted(f[1] for f in found)
        assert all(0 <= s < e <= len(good) for _, s, e in found)
        names = [good[s + 4 + prefix_len: s + 4 + prefix_len + key_len] for _, s, _ in found]
        assert names.count(key) == len(want), (key, names, want)
    bad = bytearray(good[: max(0, len(good) - cut)] if cut else good)
    for at, value in flips:
        if bad:
            bad[at % len(bad)] = value
    try:
        idx = _keyindex.build(bytes(bad), prefix_len, [0, 0, 0], key_len)
    except ValueError:
        return
    assert 0 <= idx.entries
    for _sid, key, _ in entries:
        for sid, s, e in idx.find(key[:key_len].ljust(key_len, b"\0")):
            assert 0 <= s < e <= len(bad) and 0 <= sid < 3
