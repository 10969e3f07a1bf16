"""Damaged input: every failure is one typed StatequeryError naming file and offset, fast.

Hypothesis mutates and truncates real fixture bytes (``_metadata`` and state-file headers).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statequery.decoder import Decoder
from statequery.exceptions import CorruptStateError, StatequeryError
from statequery.io import FileIO
from statequery.metadata.checkpoint import parse_metadata
from statequery.metadata.handles import HandleResolver
from statequery.metadata.proxy import read_keyed_proxy, read_operator_proxy
from statequery.savepoint import Savepoint, derive_state_meta
from tests.conftest import fixture_dir

SETTINGS = settings(
    max_examples=120,
    deadline=2000,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

METADATA = {
    name: (fixture_dir(name) / "_metadata").read_bytes()
    for name in (
        "datastream-hashmap-canonical",
        "datastream-rocksdb-incremental-checkpoint",
        "sql-hashmap-native",
        "datastream-hashmap-inline",
    )
}


def _header(name: str, uid: str, kind: str) -> bytes:
    sp = Savepoint.open(str(fixture_dir(name)), use_snapshot=False)
    st0 = sp.operator(uid).subtasks[0]
    if kind == "keyed":
        h = st0.keyed_handle
        stream = getattr(h, "meta", h)
        return sp.resolver.read(stream)[: st0.keyed_header.header_end]
    return sp.resolver.read(st0.operator_handle.delegate)[: st0.operator_header.header_end]


KEYED = _header("datastream-hashmap-canonical", "user-state", "keyed")
OPERATOR = _header("datastream-hashmap-canonical", "operator-state", "operator")


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete"]))
        if not buf:
            break
        i = draw(st.integers(0, len(buf) - 1))
        if op == "flip":
            buf[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            buf[i] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF]))
        elif op == "truncate":
            del buf[i:]
        elif op == "insert":
            buf[i:i] = draw(st.binary(min_size=1, max_size=8))
        else:
            del buf[i : i + draw(st.integers(1, 8))]
    return bytes(buf)


def _only_typed(fn, *args):  # type: ignore[no-untyped-def]
    try:
        return fn(*args)
    except StatequeryError as e:
        assert str(e)  # has a message
        return e


@pytest.mark.parametrize("name", sorted(METADATA))
def test_truncated_metadata_names_file_and_offset(name: str) -> None:
    data = METADATA[name]
    for cut in sorted({0, 4, 7, 8, 15, 16, 40, len(data) // 3, len(data) // 2}):
        with pytest.raises(CorruptStateError) as e:
            parse_metadata(data[:cut], f"/sp/{name}/_metadata")
        assert e.value.source == f"/sp/{name}/_metadata" and e.value.offset is not None
        assert 0 <= e.value.offset <= cut


@SETTINGS
@given(st.sampled_from(sorted(METADATA)).flatmap(lambda n: mutated(METADATA[n])))
def test_mutated_metadata_fails_typed_or_parses(data: bytes) -> None:
    result = _only_typed(parse_metadata, data, "/sp/_metadata")
    if isinstance(result, CorruptStateError):
        assert result.source == "/sp/_metadata"


@SETTINGS
@given(mutated(KEYED))
def test_mutated_keyed_header_fails_typed_or_parses(data: bytes) -> None:
    result = _only_typed(read_keyed_proxy, Decoder(data, source="state-file"))
    if isinstance(result, CorruptStateError):
        assert result.source == "state-file" and result.offset is not None


@SETTINGS
@given(mutated(OPERATOR))
def test_mutated_operator_header_fails_typed_or_parses(data: bytes) -> None:
    _only_typed(read_operator_proxy, Decoder(data, source="state-file"))


@settings(
    max_examples=40,
    deadline=5000,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(mutated(METADATA["datastream-hashmap-canonical"]))
def test_mutated_metadata_through_the_whole_listing(data: bytes) -> None:
    """Offsets, sizes and paths from damaged _metadata reach the storage seam: still typed."""
    base = fixture_dir("datastream-hashmap-canonical")
    io = FileIO()
    resolver = HandleResolver(io, str(base))

    def listing() -> object:
        md = parse_metadata(data, str(base / "_metadata"))
        return derive_state_meta(md, resolver, data, max_workers=1)

    _only_typed(listing)
    assert io.stats.total_bytes < 10 << 20  # bounded reads, whatever the lengths say


def test_huge_length_fields_do_not_allocate(tmp_path: Path) -> None:
    data = bytearray(METADATA["datastream-hashmap-canonical"])
    # the master-state count and the operator count set to 2^31-1
    for pos in (16, 20):
        bad = bytes(data[:pos]) + b"\x7f\xff\xff\xff" + bytes(data[pos + 4 :])
        with pytest.raises(CorruptStateError, match="exceeds|left"):
            parse_metadata(bad, "m")


def test_missing_state_file_is_a_storage_error(tmp_path: Path) -> None:
    from statequery.exceptions import StorageError

    dst = tmp_path / "sp"
    shutil.copytree(fixture_dir("datastream-hashmap-canonical"), dst)
    victim = sorted(p for p in dst.iterdir() if p.name != "_metadata")[0]
    victim.unlink()
    with pytest.raises(StorageError, match=victim.name):
        _ = Savepoint.open(str(dst)).states
