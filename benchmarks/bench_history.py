"""One key through time on a wide incremental job (docs/performance.md, "One key through time").

    java -cp CP statequery.fixtures.WideHistoryJob /tmp/wide 1000000 10 10000   # build.sh: CP
    java -cp CP statequery.fixtures.WideHistoryJob /tmp/wide-hm 1000000 10 10000 hashmap
    python benchmarks/bench_history.py /tmp/wide [KEY ...] [--whole] [--s3]

Prints the bytes ``job.history(key)`` read against the bytes of the checkpoints (the job
directory on disk, shared files once, and the sum of every version's size), cold (a new Job,
a new file cache) and warm (the same Job again, three times: the best), wall and CPU time of
each, which files the bytes came from (table files, ``_metadata``, other state files) and the
machine's load average. ``--whole``: without point reads inside the table files (each table
the key can be in is fetched whole, as before them; ``statequery.backends.rocksdb.POINT_READS``).
``--s3``: the job directory uploaded to the tests' loopback S3 server (moto, the ``test`` extra)
and read from there (table blocks shared between versions are then read once per ``FileIO``;
local files are read afresh by each version); the requests the server received are printed.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import statequery
from statequery.backends import rocksdb
from statequery.backends.cache import FileCache
from statequery.io import FileIO


def _disk_bytes(root: str) -> int:
    return sum(
        os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root) for f in files
    )


#: (served URI, local directory): where a served location's bytes are on disk
_SERVED: list[tuple[str, str]] = []


def _kind(location: str) -> str:
    for uri, local in _SERVED:
        if location.startswith(uri):
            location = local + location[len(uri):]
    if location.endswith("_metadata"):
        return "_metadata"
    try:
        with open(location, "rb") as f:
            f.seek(-8, os.SEEK_END)
            magic = f.read(8)
    except OSError:
        return "other"
    return "tables" if magic == b"\xf7\xcf\xf4\x85\xb7\x41\xe2\x88" else "other"


def _by_kind(io: FileIO) -> str:
    out: dict[str, int] = {}
    for loc, n in io.stats.bytes_read.items():
        out[_kind(loc)] = out.get(_kind(loc), 0) + n
    return ", ".join(f"{k} {v}" for k, v in sorted(out.items()))


@contextlib.contextmanager
def _served(root: str, s3: bool) -> Iterator[tuple[str, dict[str, Any], Any]]:
    """``(location, storage options, request counter or None)`` of the job directory."""
    if not s3:
        yield root, {}, None
        return
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from s3server import moto_s3_server  # the loopback S3 server of the tests

    with moto_s3_server() as server:
        uri = server.upload_tree(root, "job")
        _SERVED.append((uri, root.rstrip("/")))
        yield uri, server.storage_options, server.count_requests()


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if "--whole" in sys.argv:
        rocksdb.POINT_READS = False
    root = args[0]
    keys = args[1:] or ["user-123456", "user-7", "user-999999"]
    disk = _disk_bytes(root)
    with _served(root, "--s3" in sys.argv) as (location, options, counter):
        print(f"{location}: {disk} bytes on disk; load average {os.getloadavg()[0]:.1f} "
              f"on {os.cpu_count()} cores; point reads {rocksdb.POINT_READS}")
        for key in keys:
            _measure(location, options, counter, key, disk)


def _measure(root: str, options: dict[str, Any], counter: Any, key: str, disk: int) -> None:
    with tempfile.TemporaryDirectory() as cache_dir:
        rocksdb._DEFAULT_CACHE = FileCache(cache_dir)
        io = FileIO(options)
        t0 = time.perf_counter()
        job = statequery.open_job(root, io=io)
        listed = time.perf_counter() - t0
        versions = job.complete_versions()
        per_version = sum(v.size_bytes or 0 for v in versions)
        io.stats.reset()
        if counter is not None:
            counter.take()
        t0, c0 = time.perf_counter(), time.process_time()
        table = job.history(key)
        cold, cold_cpu = time.perf_counter() - t0, time.process_time() - c0
        cold_bytes, requests, kinds = io.stats.total_bytes, io.stats.total_requests, _by_kind(io)
        served = "" if counter is None else f", server saw {counter.take()}"
        warm = warm_cpu = float("inf")
        for _ in range(3):
            io.stats.reset()
            t0, c0 = time.perf_counter(), time.process_time()
            job.history(key)
            warm = min(warm, time.perf_counter() - t0)
            warm_cpu = min(warm_cpu, time.process_time() - c0)
        print(
            f"{key}: {len(versions)} versions (listed in {listed:.2f}s), {table.num_rows} rows;"
            f" cold {cold:.2f}s (CPU {cold_cpu:.2f}s) read {cold_bytes} bytes in {requests} "
            f"requests ({kinds}){served} = {cold_bytes / disk:.2%} of the {disk} bytes on disk "
            f"({cold_bytes / per_version:.2%} of the versions' {per_version}); warm "
            f"{warm:.3f}s (CPU {warm_cpu:.3f}s) read {io.stats.total_bytes} bytes; "
            f"load {os.getloadavg()[0]:.1f}"
        )
        job.close()


if __name__ == "__main__":
    main()
