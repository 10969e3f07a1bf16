"""Requests a read makes against an S3-compatible server: moto in server mode on loopback.

Uploads a canonical savepoint (default: the fixture ``datastream-hashmap-canonical``) to a bucket
of a moto server started on 127.0.0.1 (``tests/support/s3server.py``: a free port; stopped at the
end, and by an alarm after ``--timeout`` seconds whatever happens), reads it through ``s3://`` with
statequery, and prints, per scenario, the HTTP requests the server received (counted by a WSGI
middleware, by method) next to what ``FileIO.stats`` counted, the tasks of the plan and the key
groups read.

    pip install 'moto[s3]>=5' flask flask-cors s3fs   # in the test extra
    python benchmarks/bench_s3_requests.py [SAVEPOINT_DIR] [--json]

The figures are recorded in docs/performance.md ("Requests against S3").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "tests" / "fixtures" / "datastream-hashmap-canonical"
sys.path.insert(0, str(ROOT / "tests"))  # the loopback moto server the tests use


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("savepoint", nargs="?", default=str(DEFAULT))
    parser.add_argument("--operator", default="user-state")
    parser.add_argument("--state", default="count")
    parser.add_argument("--key", default="user-3")
    parser.add_argument("--timeout", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    signal.signal(signal.SIGALRM, lambda *_: os._exit(3))  # bounded lifetime, whatever happens
    signal.alarm(args.timeout)

    import logging

    import statequery
    from statequery.io import FileIO

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    from s3server import moto_s3_server

    results = []
    with moto_s3_server() as server:
        location = server.upload_tree(Path(args.savepoint), "sp")
        files = sum(1 for p in Path(args.savepoint).rglob("*") if p.is_file())
        counting = server.count_requests()
        options = server.storage_options

        def scenario(name: str, run: Any) -> None:
            io = FileIO(options)
            detail = run(io)
            server_counts = counting.take()
            results.append({
                "scenario": name,
                "server_requests": sum(server_counts.values()),
                "server_by_method": server_counts,
                "fileio_requests": io.stats.total_requests,
                "fileio_opens": io.stats.total_opens,
                "bytes": io.stats.total_bytes,
                **detail,
            })
            io.close()

        def full_read(io: FileIO) -> dict[str, Any]:
            sp = statequery.open(location, io=io, use_snapshot=False)
            tasks = sp.plan(args.operator, args.state)
            table = sp.read(args.operator, args.state)
            kgs = len(set(table.column("key_group").to_pylist()))
            return {"tasks": len(tasks), "key_groups_read": kgs, "rows": table.num_rows}

        def full_read_split(io: FileIO) -> dict[str, Any]:
            sp = statequery.open(location, io=io, use_snapshot=False)
            from statequery.scan import execute

            tasks = sp.plan(args.operator, args.state, split=8)
            rows = 0
            kgs: set[int] = set()
            for task in tasks:  # as executors would: each task with its own FileIO
                task_io = FileIO(options)
                for _, batch in execute(task, task_io):
                    rows += batch.num_rows
                    kgs.update(batch.column("key_group").to_pylist())
                io.stats.bytes_read.update(task_io.stats.bytes_read)
                io.stats.opens.update(task_io.stats.opens)
                io.stats.requests.update(task_io.stats.requests)
                task_io.close()
            return {"tasks": len(tasks), "key_groups_read": len(kgs), "rows": rows}

        def all_states(io: FileIO) -> dict[str, Any]:
            sp = statequery.open(location, io=io, use_snapshot=False)
            op = sp.operator(args.operator)
            tasks = rows = 0
            for s in op.states:
                if s.keyed_rows:
                    tasks += len(sp.plan(s))
                    rows += sp.read(s).num_rows
            return {"tasks": tasks, "rows": rows}

        def lookup(io: FileIO) -> dict[str, Any]:
            sp = statequery.open(location, io=io, use_snapshot=False)
            found = sp.lookup(args.key)
            return {"states_with_rows": len(found), "key_groups_read": 1}

        scenario(f"full read of {args.operator}/{args.state} (cold, no snapshot)", full_read)
        scenario("same, split into tasks of 8 key groups, one FileIO per task", full_read_split)
        scenario(f"every keyed state of {args.operator} (cold)", all_states)
        scenario(f"lookup {args.key!r} in every operator (cold)", lookup)
    signal.alarm(0)

    if args.json:
        print(json.dumps({"files": files, "results": results}, indent=2))
        return 0
    print(f"{files} files uploaded from {args.savepoint}; moto server on loopback\n")
    print("| scenario | tasks | key groups | server requests (by method) | FileIO requests "
          "| opens | bytes |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for r in results:
        by = ", ".join(f"{k} {v}" for k, v in sorted(r["server_by_method"].items()))
        print(f"| {r['scenario']} | {r.get('tasks', '')} | {r.get('key_groups_read', '')} | "
              f"{r['server_requests']} ({by}) | {r['fileio_requests']} | {r['fileio_opens']} | "
              f"{r['bytes']:,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
