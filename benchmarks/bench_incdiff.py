"""Bytes a job's change feed reads: by keys of the SST files that differ (statequery.incdiff),
whole changed subtasks (incdiff.ENABLED False), and two full reads per version pair.

    python benchmarks/bench_incdiff.py JOB_DIR [--start N] [--end N] [--modes keys,subtasks,full]
"""

from __future__ import annotations

import argparse
import time

import statequery
from statequery import incdiff
from statequery.diff import diff_batches
from statequery.io import FileIO


def _run(location: str, start: int | None, end: int | None, mode: str) -> tuple[int, int, float]:
    io = FileIO()
    with statequery.open_job(location, io=io) as job:
        pairs = job._window(start, end)
        for prev, cur in pairs:
            job._savepoint(prev)
            job._savepoint(cur)
        io.stats.reset()
        t = time.perf_counter()
        rows = 0
        if mode == "full":
            for prev, cur in pairs:
                for b in diff_batches(job._savepoint(prev), job._savepoint(cur)):
                    rows += b.num_rows
        else:
            incdiff.ENABLED = mode == "keys"
            rows = job.changes(start=start, end=end).num_rows
        return io.stats.total_bytes, rows, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("job")
    ap.add_argument("--start", type=int)
    ap.add_argument("--end", type=int)
    ap.add_argument("--modes", default="keys,subtasks,full",
                    help="keys (incdiff), subtasks (whole changed subtasks), full (plain diffs)")
    a = ap.parse_args()
    modes = a.modes.split(",")
    for mode in modes:
        n, rows, secs = _run(a.job, a.start, a.end, mode)
        print(f"{mode:9s} {n / 1e6:9.3f} MB  {rows:8d} rows  {secs:7.2f} s", flush=True)


if __name__ == "__main__":
    main()
