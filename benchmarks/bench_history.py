"""One key through time on a wide incremental job (docs/performance.md, "One key through time").

    java -cp CP statequery.fixtures.WideHistoryJob /tmp/wide 1000000 10 10000   # build.sh: CP
    python benchmarks/bench_history.py /tmp/wide [KEY ...]

Prints the bytes ``job.history(key)`` read against the bytes of the checkpoints (the job
directory on disk, shared files once, and the sum of every version's size), cold (a new Job)
and warm (the same Job again), and the time of each.
"""

from __future__ import annotations

import os
import sys
import time

import statequery
from statequery.io import FileIO


def _disk_bytes(root: str) -> int:
    return sum(
        os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root) for f in files
    )


def main() -> None:
    root = sys.argv[1]
    keys = sys.argv[2:] or ["user-123456", "user-7", "user-999999"]
    disk = _disk_bytes(root)
    for key in keys:
        io = FileIO()
        t0 = time.perf_counter()
        job = statequery.open_job(root, io=io)
        listed = time.perf_counter() - t0
        versions = job.complete_versions()
        per_version = sum(v.size_bytes or 0 for v in versions)
        io.stats.reset()
        t0 = time.perf_counter()
        table = job.history(key)
        cold = time.perf_counter() - t0
        cold_bytes = io.stats.total_bytes
        io.stats.reset()
        t0 = time.perf_counter()
        job.history(key)
        warm = time.perf_counter() - t0
        print(
            f"{key}: {len(versions)} versions (listed in {listed:.2f}s), {table.num_rows} rows; "
            f"cold {cold:.2f}s read {cold_bytes} bytes = {cold_bytes / disk:.2%} of the "
            f"{disk} bytes on disk ({cold_bytes / per_version:.2%} of the versions' "
            f"{per_version}); warm {warm:.3f}s read {io.stats.total_bytes} bytes"
        )
        job.close()


if __name__ == "__main__":
    main()
