"""What the whole-file mutation campaign (tests/fuzz/run_campaign.py) found, pinned.

Each case is a committed fixture, one of its files changed by a recorded mutation (the campaign's
replay description: no new binary files), read on both decode paths: both must raise the same
typed error. Before the fixes these gave a heap write before the compiled SST walk's key buffer
(``double free or corruption``: the process aborted), ``struct.error`` / ``IndexError`` /
``DecodeError`` / an internal ``_Unknown`` out of the change-log reader, and ``ValueError:
embedded null byte`` for a state file name holding a NUL.

``test_a_short_campaign_finds_nothing`` runs a CI-sized campaign (a few hundred inputs, seeded)
and fails on any crash, hang, untyped error or difference between the paths.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import fixture_dir
from fuzz import run_campaign as rc

import statequery
from statequery.backends import fastpath, sst
from statequery.exceptions import (
    CorruptStateError,
    StatequeryError,
    StorageError,
    UnsupportedFormatError,
)


def _both(read: Any, monkeypatch: pytest.MonkeyPatch) -> list[StatequeryError]:
    """The error of ``read()`` on the compiled path, then on the pure path."""
    errors = []
    for pure in ("", "1"):
        monkeypatch.setenv(fastpath.PURE_ENV, pure)
        with pytest.raises(StatequeryError) as e:
            read()
        errors.append(e.value)
    return errors


def _mutated_copy(tmp_path: Path, fixture: str, file: str, mutation: dict[str, Any]) -> str:
    top, inner, _ = rc.fixture_files(fixture)
    dest = tmp_path / top.name
    shutil.copytree(top, dest)
    target = dest / file
    target.write_bytes(rc.apply(target.read_bytes(), mutation))
    return str(dest / inner)


CL = "938b75b9ee5f003ed62e9aa67740eaaa"
#: (fixture, file, mutation, error class, words of its message): one per root cause
CASES = [
    # materialized base of a changelog checkpoint: a timer cut short (was struct.error)
    ("changelog-hashmap-checkpoint", f"{CL}/taskowned/8a00cc59-82f8-4dab-9938-65425751152b",
     {"op": "delete", "pos": 1526, "length": 4}, CorruptStateError, "materialized base"),
    # ... a string length past the end (was IndexError)
    ("changelog-hashmap-checkpoint", f"{CL}/taskowned/6beaf630-69e9-4432-ba38-3f9249e63d3b",
     {"op": "inflate", "pos": 7719, "bytes": "7fffffff"}, CorruptStateError, "materialized base"),
    # a logged change whose namespace byte is not 0 (was DecodeError)
    ("changelog-hashmap-checkpoint", f"{CL}/dstl/845204df-7fcf-463b-b0ac-aa39ecf0cf11",
     {"op": "bitflip", "pos": 15146, "bit": 5}, CorruptStateError, "cannot be read"),
    # a change-log metadata record naming an unknown serializer class (was _Unknown)
    ("changelog-rocksdb-checkpoint",
     "981f4d04c0749f8151bd458d9f0a811a/dstl/19a9f972-c036-4559-8c8d-8e5c96de8818",
     {"op": "bitflip", "pos": 3470, "bit": 2}, UnsupportedFormatError, "unknown serializer"),
    # a data block (checksum recomputed) whose key-group prefix byte 8 became 72: its keys are
    # out of order; the compiled feed stopped at it, the pure loop read on (36 rows against 40,
    # of 80); now the same error on both
    ("datastream-rocksdb-native",
     "savepoint-59db32-b8546faca040/541d62bf-21e3-414c-a7b1-3698ea4e693d",
     {"op": "bitflip", "pos": 161, "bit": 6, "resum": [0, 748]}, CorruptStateError,
     "the table's keys are out of order"),
    # a NUL in a RocksDB file name of the state handle (was ValueError from os.link)
    ("sql-rocksdb-native", "savepoint-e81a78-b827be30c48e/_metadata",
     {"op": "byteset", "pos": 927, "value": 0}, CorruptStateError, "invalid RocksDB file name"),
    # a NUL in a relative state file path (was ValueError from os.path.realpath)
    ("edge-datastream-hashmap-canonical", "savepoint-b00f26-f4932f90dc90/_metadata",
     {"op": "byteset", "pos": 1273, "value": 0}, StorageError, "not a relative path"),
]


@pytest.mark.parametrize(("fixture", "file", "mutation", "error", "words"), CASES,
                         ids=[f"{c[0]}-{c[2]['op']}-{c[2]['pos']}" for c in CASES])
def test_found_mutations_raise_typed_errors_on_both_paths(
    fixture: str, file: str, mutation: dict[str, Any], error: type, words: str,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STATEQUERY_CACHE_DIR", str(tmp_path / "cache"))
    location = _mutated_copy(tmp_path, fixture, file, mutation)

    def read() -> None:
        shutil.rmtree(tmp_path / "cache", ignore_errors=True)
        rc._read_all(location)

    fast, pure = _both(read, monkeypatch)
    assert type(fast) is type(pure) is error, (fast, pure)
    assert words in str(fast) and words in str(pure), (str(fast), str(pure))


#: blocks of real tables changed with their checksums recomputed, which RocksDB (rocksdict)
#: trusted and crashed on (SIGSEGV; found by the campaign, the first under ASan): (fixture,
#: file, mutation, what the SST reader now says on both paths before RocksDB opens the DB)
ROCKSDB_CRASHES = [
    # a 5-byte varint over the index block's first entry (IndexValue::DecodeFrom)
    ("datastream-rocksdb-incremental-checkpoint",
     "d68844c7631329b154d65efd5713b52d/shared/e1a72819-2766-42a3-a178-0bdf916ef95a",
     {"op": "inflate", "pos": 146, "bytes": "ffffffff0f", "resum": [145, 31]},
     "e1a72819-2766-42a3-a178-0bdf916ef95a at byte 151: index entry runs past the block"),
    # a data block's restart offset pointed outside the block (the same table shape gave rows on
    # one read and "bad entry in block" on the next before it crashed on this one)
    ("sql-cep-rocksdb-native", "savepoint-d1bdf9-1b074c803266/2f131185-b342-43f2-b91e-1241e278eae8",
     {"op": "byteset", "pos": 109, "value": 95, "resum": [0, 115]},
     "2f131185-b342-43f2-b91e-1241e278eae8 at byte 0: restart offset out of range"),
]


@pytest.mark.parametrize(("fixture", "file", "mutation", "says"), ROCKSDB_CRASHES,
                         ids=[c[0] for c in ROCKSDB_CRASHES])
def test_malformed_blocks_are_refused_before_rocksdb_reads_them(
    fixture: str, file: str, mutation: dict[str, Any], says: str,
) -> None:
    """Every index and data block is read by the SST reader before the DB is opened: a typed
    error on both paths. Replayed in a subprocess, so a crash fails this test, not the
    session."""
    case = {"fixture": fixture, "file": file, "op": "block", "mutation": mutation}
    where = str(Path(statequery.__file__).resolve().parent.parent)
    r = subprocess.run([sys.executable, rc.__file__, "--replay", json.dumps(case),
                        "--pythonpath", where], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-3000:]}"
    got = json.loads(r.stdout)
    assert got["class"] == "typed" and got["reads"] == ["typed", "typed"], got
    for path in ("compiled", "pure"):
        assert got["detail"][path].startswith("CorruptStateError"), got
        assert says in got["detail"][path], got


# -- the compiled SST block walk: a shared-prefix length of 2**64 - 1 -----------------------------


def _a_data_block(name: str) -> tuple[Path, Any, list[list[int]]]:
    """A table of a real RocksDB fixture, the handle of its first data block holding three
    entries or more, and the header positions of that block's entries."""
    top = fixture_dir(name)
    for path in sorted(p for p in top.iterdir() if rc.is_table(p)):
        with sst.SstFile(str(path)) as t:
            for _, h in t.data_block_handles():
                headers = rc._entry_headers(t.read_block(h).data)
                if len(headers) >= 3:
                    return path, h, headers
    raise LookupError(name)


def test_a_huge_shared_prefix_is_corrupt_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entry 2 of a real data block claims a shared prefix of 2**64 - 1 bytes (a 10-byte
    varint). The compiled walk compared it as a signed -1 with the previous key's length, took
    it as in range and copied the entry's key to 1 byte before its key buffer (heap
    corruption: the process aborted); now both paths raise the pure path's error."""
    path, handle, headers = _a_data_block("datastream-rocksdb-native")
    m = {"op": "decoded-header", "block": handle.offset, "field": 0,
         "frac": 1.5 / len(headers), "bytes": "ffffffffffffffffff01"}
    with sst.SstFile(str(path)) as t:  # entry 1 (0-based): not a restart point
        data = rc.apply_decoded(t.read_block(handle).data, m)
    assert data[headers[1][0]:headers[1][0] + 10] == b"\xff" * 9 + b"\x01"

    def read() -> None:
        with sst.SstFile(str(path)) as table:
            list(sst.merged_entries([table]))

    with rc._DecodedPatch(m):
        fast, pure = _both(read, monkeypatch)
    assert type(fast) is type(pure) is CorruptStateError
    assert str(fast) == str(pure), (str(fast), str(pure))
    assert "block entry runs past the block" in str(fast)


def test_block_walks_agree_on_every_header_varint(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each header varint (shared, non-shared, value length) of every entry of a real data
    block, set to each of the campaign's extreme varints: the compiled and pure block walks
    return the same entries or the same typed error."""
    path, handle, headers = _a_data_block("sql-rocksdb-native")
    checked = 0
    for i in range(len(headers)):
        for field in range(3):
            for big in rc.BIG_VARINTS:
                m = {"op": "decoded-header", "block": handle.offset, "field": field,
                     "frac": (i + 0.5) / len(headers), "bytes": big}
                got = []
                with rc._DecodedPatch(m):
                    for pure in ("", "1"):
                        monkeypatch.setenv(fastpath.PURE_ENV, pure)
                        try:
                            with sst.SstFile(str(path)) as table:
                                got.append(("rows", list(sst.merged_entries([table]))))
                        except StatequeryError as e:
                            got.append(("error", type(e).__name__))
                assert got[0] == got[1], (i, field, big, got)
                checked += 1
    assert checked == 3 * len(headers) * len(rc.BIG_VARINTS)


# -- a CI-sized campaign ------------------------------------------------------------------------


def test_a_short_campaign_finds_nothing(tmp_path: Path) -> None:
    """60 seeded inputs over the default fixtures (every container and serializer family),
    each read on both paths in a worker subprocess: only identical rows or the same typed
    error. The seed is fixed, so a failure replays with ``run_campaign.py --replay``."""
    out = tmp_path / "report.json"
    # the worker imports the statequery this test imports (the memory-checked copy under
    # tests/backends/test_sanitized.py, whose environment it inherits)
    where = str(Path(statequery.__file__).resolve().parent.parent)
    code = rc.main(["--inputs", "60", "--seed", "20261126", "--timeout", "120", "--quiet",
                    "--pythonpath", where, "--out", str(out)])
    report = json.loads(out.read_text())
    bugs = [f for f in report["findings"] if f["class"] in rc.BUGS]
    assert code == 0 and not bugs, json.dumps(bugs[:3], indent=1)[:6000]
    assert report["inputs"] == 60
    assert report["outcomes"].get("rows", 0) > 0 and report["outcomes"].get("typed", 0) > 0


def test_replayed_mutation_is_deterministic() -> None:
    """The same seed gives the same cases and mutations (what makes a report replayable)."""
    a = [c for c, _ in zip(rc.cases(rc.DEFAULT_FIXTURES, 7), range(40), strict=False)]
    b = [c for c, _ in zip(rc.cases(rc.DEFAULT_FIXTURES, 7), range(40), strict=False)]
    assert a == b
    data = bytes(range(256)) * 4
    m = {"op": "inflate", "pos": 10, "bytes": "7fffffff"}
    assert rc.apply(data, m)[10:14] == struct.pack(">i", 2**31 - 1)
