"""Bad input: real fixture state files, mutated, must give typed errors — never a crash, never
an allocation beyond the bytes that exist, and (where the format can tell) never a wrong value.

* any byte flip in a keyed or operator state file: the read either succeeds or raises
  :class:`CorruptStateError` naming the file (and the key group, for keyed state) with an offset;
  peak memory stays bounded by a small multiple of the file;
* snappy-compressed files carry checksums: a flip either raises or (when it hit bytes nobody reads)
  gives exactly the original rows;
* truncation anywhere inside the data always raises.

Uncompressed canonical data has no checksums: a flip inside a value's bytes can turn it into
another valid value of the same type, which no reader can detect (Flink would restore it too).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from conftest import fixture_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import statequery
from statequery.exceptions import CorruptStateError, StatequeryError
from statequery.io import FileIO
from statequery.reader import list_states, read_table


def _snapshot_rows(sp: Any, op: Any) -> dict[str, Any]:
    return {ref.name: read_table(sp, op, ref.name) for ref in list_states(sp, op)}


class _Mutable:
    """A private copy of one fixture; one state file is mutated and restored per example."""

    def __init__(self, name: str, operator: str, keyed: bool) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="sq-corrupt-", dir=_BASE[-1]))
        src = fixture_dir(name)
        self.dir = self.tmp / src.name
        shutil.copytree(src, self.dir)
        sp = self._open()
        self.op = next(
            o
            for o in sp.metadata.operators
            if operator in (o.uid, o.name) or o.name.startswith(operator)
        )
        st0 = next(
            s
            for s in self.op.subtasks
            if (s.managed_keyed if keyed else s.managed_operator) is not None
        )
        handle = st0.managed_keyed if keyed else st0.managed_operator
        self.path = Path(sp.resolver.location(handle.delegate))
        self.original = self.path.read_bytes()
        if keyed:
            self.data_start = min(o for o in handle.offsets if o > 0)
        else:
            self.data_start = min(o for p in handle.partitions for o in p.offsets)
        self.baseline = _snapshot_rows(sp, self.op.operator_id)

    def _open(self) -> Any:
        return statequery.open(str(self.dir), io=FileIO(), use_snapshot=False)

    def read_with(self, data: bytes) -> dict[str, Any]:
        self.path.write_bytes(data)
        try:
            sp = self._open()
            tracemalloc.start()
            try:
                return _snapshot_rows(sp, self.op.operator_id)
            finally:
                _, peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
                assert peak < 64 * len(self.original) + (8 << 20), f"peak {peak} bytes"
        finally:
            self.path.write_bytes(self.original)


_CACHE: dict[tuple[str, str, bool], _Mutable] = {}
_BASE: list[Path] = []


@pytest.fixture(scope="module", autouse=True)
def _private_copies(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The mutated copies live in pytest's temporary directory (Hypothesis examples share them
    across one module, so the folder is module-scoped), never loose in the system temp dir."""
    _BASE.append(tmp_path_factory.mktemp("corrupt"))
    yield
    _CACHE.clear()
    _BASE.pop()


def _mutable(name: str, operator: str, keyed: bool = True) -> _Mutable:
    k = (name, operator, keyed)
    if k not in _CACHE:
        _CACHE[k] = _Mutable(name, operator, keyed)
    return _CACHE[k]


def _check_error(e: CorruptStateError, m: _Mutable, keyed: bool) -> None:
    assert e.source is not None and m.path.name in e.source, e
    assert e.offset is not None and 0 <= e.offset <= len(m.original), e
    if keyed:
        assert "key group" in str(e), e


CASES = [
    ("datastream-hashmap-canonical", "user-state", True),
    ("datastream-hashmap-canonical", "window-agg", True),
    ("datastream-hashmap-checkpoint", "user-state", True),
    ("sql-hashmap-canonical", "GroupAggregate", True),
    ("datastream-hashmap-canonical", "operator-state", False),
]
SNAPPY = [
    ("datastream-rocksdb-canonical-snappy", "user-state", True),
    ("datastream-rocksdb-canonical-snappy", "operator-state", False),
    ("datastream-hashmap-checkpoint-snappy", "user-state", True),  # one snappy stream per block
]
SETTINGS = settings(
    max_examples=int(os.environ.get("STATEQUERY_FUZZ_EXAMPLES", "30")),  # more: a longer hunt
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize(("name", "operator", "keyed"), CASES + SNAPPY)
@SETTINGS
@given(data=st.data())
def test_byte_flips_give_typed_errors(name: str, operator: str, keyed: bool, data: Any) -> None:
    m = _mutable(name, operator, keyed)
    pos = data.draw(st.integers(m.data_start, len(m.original) - 1), label="position")
    xor = data.draw(st.integers(1, 255), label="xor")
    mutated = bytearray(m.original)
    mutated[pos] ^= xor
    try:
        rows = m.read_with(bytes(mutated))
    except CorruptStateError as e:
        _check_error(e, m, keyed)
        return
    except StatequeryError as e:  # pragma: no cover - reported with the mutation
        pytest.fail(f"flip at {pos}: untyped-for-corruption error {type(e).__name__}: {e}")
    if (name, operator, keyed) in SNAPPY:
        assert rows.keys() == m.baseline.keys()
        for state, table in rows.items():
            assert table.equals(m.baseline[state]), f"flip at {pos} changed {state}"


@pytest.mark.parametrize(("name", "operator", "keyed"), CASES + SNAPPY)
@SETTINGS
@given(data=st.data())
def test_truncation_always_raises(name: str, operator: str, keyed: bool, data: Any) -> None:
    m = _mutable(name, operator, keyed)
    cut = data.draw(st.integers(m.data_start, len(m.original) - 1), label="cut")
    with pytest.raises(CorruptStateError) as info:
        m.read_with(m.original[:cut])
    _check_error(info.value, m, keyed)


@pytest.mark.parametrize(("name", "operator", "keyed"), CASES[:3])
@SETTINGS
@given(data=st.data())
def test_impossible_lengths_never_allocate(
    name: str, operator: str, keyed: bool, data: Any
) -> None:
    """Overwrite 4 bytes with a huge or negative int32 (a key/value/element length)."""
    m = _mutable(name, operator, keyed)
    pos = data.draw(st.integers(m.data_start, len(m.original) - 4), label="position")
    value = data.draw(st.sampled_from([0x7FFFFFFF, 0x7FFFFFF0, -1, -(2**31), 1 << 28]))
    mutated = bytearray(m.original)
    mutated[pos : pos + 4] = value.to_bytes(4, "big", signed=True)
    try:
        m.read_with(bytes(mutated))
    except CorruptStateError as e:
        _check_error(e, m, keyed)


def test_baselines_are_real() -> None:
    for case in CASES + SNAPPY:
        m = _mutable(*case)
        assert sum(t.num_rows for t in m.baseline.values()) > 0


def test_private_copies_live_in_pytest_tmp(tmp_path_factory: pytest.TempPathFactory) -> None:
    m = _mutable(*CASES[0])
    assert m.tmp.is_relative_to(tmp_path_factory.getbasetemp())
    assert m.tmp.parent != Path(tempfile.gettempdir())


def _outcome(m: _Mutable, data: bytes) -> Any:
    try:
        return m.read_with(data)
    except CorruptStateError as e:
        _check_error(e, m, True)
        return CorruptStateError


@pytest.mark.parametrize(("name", "operator", "keyed"), [c for c in CASES + SNAPPY if c[2]])
@SETTINGS
@given(data=st.data())
def test_both_decode_paths_agree(name: str, operator: str, keyed: bool, data: Any) -> None:
    """The compiled decode path and the pure-Python reference on the same mutated bytes: both
    raise CorruptStateError, or both give identical tables (a flip inside a value can give
    another valid value; it must be the same one)."""
    from statequery.backends import fastpath

    if fastpath.compiled() is None:
        assert os.environ.get("STATEQUERY_NO_EXTENSIONS"), "compiled path not built"
        return
    m = _mutable(name, operator, keyed)
    pos = data.draw(st.integers(m.data_start, len(m.original) - 1), label="position")
    xor = data.draw(st.integers(1, 255), label="xor")
    mutated = bytearray(m.original)
    mutated[pos] ^= xor
    saved = os.environ.get(fastpath.PURE_ENV)
    try:
        os.environ[fastpath.PURE_ENV] = "1"
        pure = _outcome(m, bytes(mutated))
        os.environ.pop(fastpath.PURE_ENV)
        fast = _outcome(m, bytes(mutated))
    finally:
        if saved is None:
            os.environ.pop(fastpath.PURE_ENV, None)
        else:
            os.environ[fastpath.PURE_ENV] = saved
    if pure is CorruptStateError or fast is CorruptStateError:
        assert pure is fast, f"flip {xor:#x} at {pos}: pure {pure!r:.200}, compiled {fast!r:.200}"
        return
    assert pure.keys() == fast.keys()
    for state, table in pure.items():
        assert fast[state].equals(table), f"flip {xor:#x} at {pos}: {state} differs"
