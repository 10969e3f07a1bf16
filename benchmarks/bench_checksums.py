"""What verifying RocksDB block checksums costs the SST reader: prints figures (not a timed test).

    python benchmarks/bench_checksums.py [--keys 1000000] [--dir /tmp/statequery-bench/checksums]

For each checksum type RocksDB writes (crc32c, xxHash, xxHash64, XXH3), RocksDB (rocksdict) writes
one column family of ``--keys`` entries (snappy, 4 KiB blocks, RocksDB's defaults otherwise) once;
then a full walk of its tables (``merged_entries``, as a full scan of a list state does) is timed
in CPU seconds, best of 5, with the checksums verified and with verification switched off on the
opened tables, on the compiled walk and on the pure-Python one; and the verification alone, per
data block. CPU time (``time.process_time``) because the machine may be shared.
"""

from __future__ import annotations

import argparse
import glob
import os
import time
from typing import Any

KINDS = ["crc32c", "xxhash", "xxhash64", "xxh3"]


def write_tables(path: str, kind: str, keys: int) -> list[str]:
    import rocksdict as r

    if not glob.glob(os.path.join(path, "*.sst")):
        o = r.Options(raw_mode=True)
        o.create_if_missing(True)
        o.set_compression_type(r.DBCompressionType.snappy())
        o.set_disable_auto_compactions(True)
        b = r.BlockBasedOptions()
        b.set_checksum_type(getattr(r.ChecksumType, kind)())
        o.set_block_based_table_factory(b)
        db = r.Rdict(path, o)
        for i in range(keys):
            db[b"\x00\x05key%08d" % i] = b"value-%012d-" % i + b"x" * (i % 40)
        db.flush()
        db.close()
    return sorted(glob.glob(os.path.join(path, "*.sst")))


def walk_cpu(paths: list[str], verify: bool, pure: bool) -> tuple[float, int]:
    from statequery.backends.sst import SstFile, merged_entries

    os.environ["STATEQUERY_PURE_PYTHON"] = "1" if pure else "0"
    best, rows = float("inf"), 0
    for _ in range(5):
        tables = [SstFile(p) for p in paths]
        if not verify:
            for t in tables:
                t._checksum = None
        c = time.process_time()
        rows = sum(1 for _ in merged_entries(tables))
        best = min(best, time.process_time() - c)
        for t in tables:
            t.close()
    return best, rows


def verify_cpu(paths: list[str]) -> tuple[float, int, float]:
    """CPU seconds per data block of the verification alone, blocks, mean block bytes."""
    from statequery.backends.sst import _BLOCK_TRAILER, SstFile

    raws: list[tuple[Any, Any, bytes]] = []
    for p in paths:
        t = SstFile(p)
        raws += [(t, h, t._pread(h.offset, h.size + _BLOCK_TRAILER))
                 for _, h in t.data_block_handles()]
    best = float("inf")
    for _ in range(5):
        c = time.process_time()
        for t, h, raw in raws:
            stored, computed = t._checksums(raw, h)
            assert stored == computed
        best = min(best, time.process_time() - c)
    size = sum(len(raw) for _, _, raw in raws) / len(raws)
    return best / len(raws), len(raws), size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--dir", default="/tmp/statequery-bench/checksums")
    args = ap.parse_args()
    from statequery.backends.sst import has_compiled_walk

    print(f"{args.keys} keys; compiled walk built: {has_compiled_walk()}")
    for kind in KINDS:
        paths = write_tables(os.path.join(args.dir, kind), kind, args.keys)
        per_block, blocks, size = verify_cpu(paths)
        line = [f"{kind:9s} {blocks} data blocks of {size:.0f} B: {per_block * 1e6:.2f} us/block"]
        for pure in (False, True):
            on, rows = walk_cpu(paths, True, pure)
            off, _ = walk_cpu(paths, False, pure)
            line.append(f"{'pure' if pure else 'compiled'} walk of {rows} rows "
                        f"{off:.3f} -> {on:.3f} CPU s ({(on / off - 1) * 100:+.1f}%)")
        print("; ".join(line))


if __name__ == "__main__":
    main()
