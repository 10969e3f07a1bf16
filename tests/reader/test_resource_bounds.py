"""Bounded resources: decompressors never inflate beyond a block's declared size, declared sizes
beyond what a codec can reach are refused before allocating, non-regular files are refused before
reading, and a fuzz run over every format stays under a fixed memory cap."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

import statequery
from statequery.backends.sst import _decompress
from statequery.exceptions import CorruptStateError, StorageError
from statequery.io import FileIO
from tests.conftest import fixture_dir

ROOT = Path(__file__).parents[2]

#: the fixed cap: growth of the harness's peak RSS over its warmed-up baseline
FUZZ_RSS_CAP = 64 << 20


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _compress(kind: int, data: bytes) -> bytes:
    import zlib

    import cramjam

    if kind == 1:
        return bytes(cramjam.snappy.compress_raw(data))
    size = _varint(len(data))
    if kind == 2:
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        return size + c.compress(data) + c.flush()
    if kind == 3:
        return size + bytes(cramjam.bzip2.compress(data))
    if kind == 4:
        return size + bytes(cramjam.lz4.compress_block(data, store_size=False))
    return size + bytes(cramjam.zstd.compress(data))


@pytest.mark.parametrize("kind", [1, 2, 3, 4, 7])
def test_block_codecs_round_trip_and_refuse_bombs(kind: int) -> None:
    data = bytes(range(256)) * 64 + b"\0" * 20000
    block = _compress(kind, data)
    assert _decompress(kind, block, "t.sst", 0) == data
    # a block declaring 2 GB: refused before anything is allocated
    sizeless = block[len(_varint(len(data))):] if kind != 1 else block[len(_varint(len(data))):]
    tracemalloc.start()
    t0 = time.monotonic()
    with pytest.raises(CorruptStateError, match=r"declares \d+ uncompressed bytes|inflated"):
        _decompress(kind, _varint(2 << 30) + sizeless, "t.sst", 4096)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < (1 << 20) and time.monotonic() - t0 < 1.0
    # a block that inflates to more than it declares stops at the declared size
    if kind != 1:  # snappy's declared size is its own stream header
        with pytest.raises(CorruptStateError, match="t.sst"):
            _decompress(kind, _varint(1000) + sizeless, "t.sst", 4096)


def test_bzip2_bomb_costs_its_declared_size_only() -> None:
    """16 MiB of zeros in a 1 MiB-declared bzip2 block: an error, never 16 MiB of output."""
    import cramjam

    payload = bytes(cramjam.bzip2.compress(b"\0" * (16 << 20)))
    tracemalloc.start()
    with pytest.raises(CorruptStateError, match="bzip2"):
        _decompress(3, _varint(1 << 20) + payload, "bomb.sst", 0)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 4 << 20, peak


@pytest.mark.parametrize("kind", ["fifo", "dir", "device"])
def test_non_regular_state_file_errors_within_a_second(tmp_path: Path, kind: str) -> None:
    src = fixture_dir("datastream-hashmap-canonical")
    dest = tmp_path / src.name
    shutil.copytree(src, dest)
    sp = statequery.open(str(dest), io=FileIO(), use_snapshot=False)
    op = next(o for o in sp.metadata.operators if o.uid == "user-state")
    handle = next(s.managed_keyed for s in op.subtasks if s.managed_keyed is not None)
    target = Path(sp.resolver.location(handle.delegate))
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "dir":
        target.mkdir()
    else:
        target.symlink_to("/dev/zero")
    outcome: dict[str, Any] = {}

    def read() -> None:
        try:
            statequery.open(str(dest), io=FileIO(), use_snapshot=False).read("user_state__count")
        except BaseException as e:  # noqa: BLE001 - inspected below
            outcome["error"] = e

    t0 = time.monotonic()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    elapsed = time.monotonic() - t0
    if reader.is_alive() and kind == "fifo":  # unblock the hung reader before failing
        with open(target, "wb"):
            pass
    assert elapsed < 1.0, f"reading took {elapsed:.1f}s"
    assert isinstance(outcome.get("error"), StorageError), outcome
    # a device can only be named through a link, which leaves the savepoint: refused as such
    why = "outside" if kind == "device" else "regular file"
    assert target.name in str(outcome["error"]) and why in str(outcome["error"])


def test_huge_read_length_allocates_only_what_exists(tmp_path: Path) -> None:
    f = tmp_path / "small"
    f.write_bytes(b"x" * 1000)
    tracemalloc.start()
    data = FileIO().new_input(str(f)).read(10, 2**40)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert data == b"x" * 990 and peak < 16 << 20


def test_fuzz_every_format_under_a_fixed_memory_cap() -> None:
    """Every format (canonical plain and snappy, heap plain and snappy, operator state,
    ``_metadata``, SST, MANIFEST, OPTIONS, StateMeta snapshot) with length fields maxed out: each
    read ends in rows or a typed error, and the harness's peak RSS grows by less than the cap."""
    examples = int(os.environ.get("STATEQUERY_MEMORY_FUZZ_EXAMPLES", "8"))
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.fuzz_memory", str(examples)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["untyped"] == [], report["untyped"]
    assert set(report["formats"]) == {
        "_metadata", "canonical", "canonical-snappy", "heap", "heap-snappy", "operator",
        "sst", "manifest", "options", "statemeta",
    }
    for fmt, r in report["formats"].items():
        assert sum(r["outcomes"].values()) == examples, fmt
    caught = sum(r["outcomes"].get("CorruptStateError", 0) for r in report["formats"].values())
    assert caught > examples * 3  # the mutations are mostly detected, not silently read
    assert report["peak_growth"] < FUZZ_RSS_CAP, report
