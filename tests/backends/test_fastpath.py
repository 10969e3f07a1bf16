"""The compiled decode path (statequery/backends/_read.pyx) against the pure-Python reference:
identical tables for every state of every fixture, in every read mode."""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
import pytest
from conftest import fixture_dir, fixture_names

import statequery
from statequery.arrow.schemas import state_schema
from statequery.backends import fastpath
from statequery.io import FileIO
from statequery.reader import list_states, read_table

FIXTURES = fixture_names()


def _modes(kind: str) -> list[str | None]:
    return {"list": [None, "flat"], "map": [None, "nested"]}.get(kind, [None])


def _tables(name: str, pure: bool, monkeypatch: pytest.MonkeyPatch) -> dict[Any, Any]:
    if pure:
        monkeypatch.setenv(fastpath.PURE_ENV, "1")
    else:
        monkeypatch.delenv(fastpath.PURE_ENV, raising=False)
    sp = statequery.open(str(fixture_dir(name)), io=FileIO(), use_snapshot=False)
    out: dict[Any, Any] = {}
    for op in sp.metadata.operators:
        for ref in list_states(sp, op):
            for mode in _modes(ref.layout.kind):
                k = (op.operator_id, ref.name, mode)
                try:
                    out[k] = read_table(sp, op, ref.name, mode=mode)
                except (statequery.StatequeryError, ValueError) as e:
                    # ValueError: nested mode of a map with a null-typed value (CEP shared
                    # buffer) fails in state_schema on both paths; compared, not hidden
                    out[k] = f"{type(e).__name__}: {e}"
    return out


def test_compiled_path_is_built() -> None:
    """``pip install`` builds the extension here (gcc and Cython are present); a machine without
    a compiler sets STATEQUERY_NO_EXTENSIONS, as for the build itself."""
    if os.environ.get("STATEQUERY_NO_EXTENSIONS"):
        assert fastpath.key_group_scanner().__module__ == "statequery.backends.keygroups"
        return
    assert fastpath.compiled() is not None, "statequery.backends._read was not built"


@pytest.mark.parametrize("name", FIXTURES)
def test_compiled_and_pure_tables_are_identical(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pure = _tables(name, True, monkeypatch)
    fast = _tables(name, False, monkeypatch)
    assert pure.keys() == fast.keys()
    for k, want in pure.items():
        got = fast[k]
        if isinstance(want, str) or isinstance(got, str):
            assert got == want, k
            continue
        assert got.schema == want.schema, k
        assert got.equals(want), (k, got.slice(0, 5).to_pylist(), want.slice(0, 5).to_pylist())


def test_compiled_path_covers_the_common_shapes() -> None:
    """The fixtures' value, list, map and timer states of primitives and strings go through the
    compiled sinks (not silently through the fallback)."""
    if fastpath.compiled() is None:
        assert os.environ.get("STATEQUERY_NO_EXTENSIONS"), "compiled path not built"
        return
    covered: set[str] = set()
    for name in FIXTURES:
        sp = statequery.open(str(fixture_dir(name)), io=FileIO(), use_snapshot=False)
        for op in sp.metadata.operators:
            for ref in list_states(sp, op):
                layout = ref.layout
                if not layout.keyed:
                    continue
                for mode in _modes(layout.kind):
                    m = "rows" if mode is None else mode
                    try:
                        schema = state_schema(layout, mode)
                    except ValueError:  # see _tables
                        continue
                    if fastpath.entry_sink(layout, m, schema) is not None:
                        covered.add("timer" if layout.is_timer else f"{layout.kind}/{m}")
    assert {"value", "list/rows", "list/flat", "map/rows", "timer"} <= {
        c if c in ("timer", "list/rows", "list/flat", "map/rows") else c.split("/")[0]
        for c in covered
    }, covered


def test_arrow_arrays_are_built_without_python_values() -> None:
    """A sink's columns come out as Arrow arrays over its own buffers."""
    mod = fastpath.compiled()
    if mod is None:
        assert os.environ.get("STATEQUERY_NO_EXTENSIONS"), "compiled path not built"
        return
    sink = mod.EntrySink(mod.K_VALUE, mod.T_STRING, mod.T_LONG)
    # key "é€😀" as StringValue (length+1, then UTF-16 units as varints), VoidNamespace 0
    units = "é€😀".encode("utf-16-be")
    key = bytearray([len(units) // 2 + 1])
    for i in range(0, len(units), 2):
        c = (units[i] << 8) | units[i + 1]
        while c >= 0x80:
            key.append((c & 0x7F) | 0x80)
            c >>= 7
        key.append(c)
    buf = bytes(key) + b"\x00" + (42).to_bytes(8, "big")
    sink(buf, 0, len(key) + 1, len(key) + 1, len(buf), 7)
    schema = pa.schema(
        [
            ("key_group", pa.int32()),
            ("key", pa.string()),
            ("namespace", pa.null()),
            ("value", pa.int64()),
        ]
    )
    arrays = sink.arrays(schema)
    assert arrays["key"].to_pylist() == ["é€😀"]
    assert arrays["value"].to_pylist() == [42]
    assert arrays["key_group"].to_pylist() == [7]
    assert len(sink) == 0


@pytest.mark.parametrize("name", ["datastream-hashmap-canonical", "datastream-rocksdb-native"])
def test_reads_of_several_keys_are_identical(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several keys: rows are kept by the key column the compiled sink filled (no Python list)."""
    from statequery.scan import read_table as read_keys

    sp = statequery.open(str(fixture_dir(name)))
    for state in ("count", "recent-categories", "amount-by-category"):
        info = sp.state("user-state", state)
        got = {}
        for pure in (True, False):
            if pure:
                monkeypatch.setenv(fastpath.PURE_ENV, "1")
            else:
                monkeypatch.delenv(fastpath.PURE_ENV, raising=False)
            got[pure] = read_keys(sp, info, keys=["user-3", "user-5", "user-11"]).to_pylist()
        assert got[True] == got[False]
        assert {r["key"] for r in got[False]} == {"user-3", "user-5", "user-11"}
