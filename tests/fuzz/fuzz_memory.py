"""The memory fuzz harness: every format, length fields maxed out, peak RSS measured.

Run by ``tests/reader/test_resource_bounds.py`` in a subprocess
(``python -m tests.fuzz.fuzz_memory N``) so its peak resident set (``ru_maxrss``) belongs to the
harness alone; it prints one JSON document.
For each format a private copy of a real fixture is made, and ``N`` times one field of the target
file is overwritten with a maxed-out length (int32/int64 max, -1, the largest varints) at a
seeded-random position; then the whole savepoint is opened and every state read. Each outcome must
be rows or a :class:`StatequeryError`; anything else is reported under ``untyped``.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import struct
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parents[1] / "fixtures"

#: what overwrites a field: big-endian int32/int64 maxima and -1 (Java lengths and counts), and
#: the largest varint32/varint64 (RocksDB block handles, lengths, MANIFEST records)
MAXED = [
    struct.pack(">i", 2**31 - 1),
    struct.pack(">i", -1),
    struct.pack(">i", 1 << 28),
    struct.pack(">q", 2**63 - 1),
    b"\xff\xff\xff\xff\x0f",
    b"\xff" * 9 + b"\x01",
    struct.pack("<I", 2**32 - 1),  # little-endian fixed32 (RocksDB block sizes, footers)
]


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _fixture(name: str) -> Path:
    manifest = json.loads((FIXTURES / "manifest.json").read_text())
    rec = next(r for r in manifest["fixtures"] if r["name"] == name)
    return FIXTURES / rec["path"]


def _read_all(location: str, use_snapshot: bool = False) -> int:
    import statequery
    from statequery.io import FileIO

    sp = statequery.open(location, io=FileIO(), use_snapshot=use_snapshot)
    rows = 0
    for table in sp.state_meta().column("table_name").to_pylist():
        rows += sp.read(table).num_rows
    return rows


def _state_file(sp_dir: Path, operator: str, keyed: bool) -> Path:
    import statequery
    from statequery.io import FileIO

    sp = statequery.open(str(sp_dir), io=FileIO(), use_snapshot=False)
    op = next(o for o in sp.metadata.operators
              if operator in (o.uid, o.name) or (o.name or "").startswith(operator))
    for s in op.subtasks:
        h = s.managed_keyed if keyed else s.managed_operator
        if h is not None:
            return Path(sp.resolver.location(h.delegate))
    raise LookupError(operator)


def _rocksdb_file(sp_dir: Path, prefix: str) -> Path:
    import statequery
    from statequery.backends.rocksdb import from_incremental_handle
    from statequery.io import FileIO

    sp = statequery.open(str(sp_dir), io=FileIO(), use_snapshot=False)
    for op in sp.metadata.operators:
        for s in op.subtasks:
            h = s.managed_keyed
            if h is None or not hasattr(h, "shared"):
                continue
            for f in from_incremental_handle(h, sp.resolver).files:
                if f.location and (f.local_path.startswith(prefix)
                                   or (prefix == ".sst" and f.local_path.endswith(".sst"))):
                    return Path(f.location)
    raise LookupError(prefix)


def _snapshot(sp_dir: Path) -> Path:
    import statequery
    from statequery.io import FileIO

    return Path(statequery.open(str(sp_dir), io=FileIO(), use_snapshot=False).write_snapshot())


#: format -> (fixture, how to find the target file in the private copy, read with the snapshot)
FORMATS: dict[str, tuple[str, Callable[[Path], Path], bool]] = {
    "_metadata": ("datastream-hashmap-canonical", lambda d: d / "_metadata", False),
    "canonical": ("datastream-hashmap-canonical",
                  lambda d: _state_file(d, "user-state", True), False),
    "canonical-snappy": ("datastream-rocksdb-canonical-snappy",
                         lambda d: _state_file(d, "user-state", True), False),
    "heap": ("datastream-hashmap-checkpoint", lambda d: _state_file(d, "user-state", True), False),
    "heap-snappy": ("datastream-hashmap-checkpoint-snappy",
                    lambda d: _state_file(d, "user-state", True), False),
    "operator": ("datastream-hashmap-canonical",
                 lambda d: _state_file(d, "operator-state", False), False),
    "sst": ("datastream-rocksdb-native", lambda d: _rocksdb_file(d, ".sst"), False),
    "manifest": ("datastream-rocksdb-native", lambda d: _rocksdb_file(d, "MANIFEST"), False),
    "options": ("datastream-rocksdb-native", lambda d: _rocksdb_file(d, "OPTIONS"), False),
    "statemeta": ("sql-hashmap-canonical", _snapshot, True),
}


def run(examples: int, seed: int = 20261123) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="sq-fuzz-"))
    cache = work / "cache"
    os.environ["STATEQUERY_CACHE_DIR"] = str(cache)
    from statequery.exceptions import StatequeryError

    report: dict[str, Any] = {"formats": {}, "untyped": []}
    try:
        targets = {}
        for fmt, (fixture, find, snap) in FORMATS.items():
            src = _fixture(fixture)
            dest = work / fmt / src.name
            shutil.copytree(src, dest)
            target = find(dest)
            targets[fmt] = (dest, target, target.read_bytes(), snap)
            _read_all(str(dest), snap)  # warm-up: imports, pools, one clean read per format
        shutil.rmtree(cache / "objects", ignore_errors=True)
        report["baseline_rss"] = base = peak_rss()
        rng = random.Random(seed)
        for fmt, (dest, target, original, snap) in targets.items():
            outcomes: Counter[str] = Counter()
            slowest = 0.0
            for _ in range(examples):
                field = rng.choice(MAXED)
                pos = rng.randrange(0, max(1, len(original) - len(field)))
                data = bytearray(original)
                data[pos : pos + len(field)] = field
                target.write_bytes(bytes(data))
                # mutated bytes under the same name and size: fetch them again
                shutil.rmtree(cache / "objects", ignore_errors=True)
                t0 = time.monotonic()
                try:
                    _read_all(str(dest), snap)
                    outcomes["rows"] += 1
                except StatequeryError as e:
                    outcomes[type(e).__name__] += 1
                except BaseException as e:  # noqa: BLE001 - the harness reports everything
                    outcomes["untyped"] += 1
                    report["untyped"].append({
                        "format": fmt, "position": pos, "field": field.hex(),
                        "error": f"{type(e).__name__}: {e}"[:300],
                        "trace": traceback.format_exc()[-800:],
                    })
                slowest = max(slowest, time.monotonic() - t0)
            target.write_bytes(original)
            report["formats"][fmt] = {
                "file_bytes": len(original), "outcomes": dict(outcomes),
                "slowest_seconds": round(slowest, 3),
            }
        report["peak_rss"] = peak = peak_rss()
        report["peak_growth"] = peak - base
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parents[2]))
    print(json.dumps(run(int(sys.argv[1]) if len(sys.argv) > 1 else 20)))
