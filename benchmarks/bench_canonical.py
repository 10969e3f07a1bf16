"""Canonical-savepoint decoding benchmark: prints figures (not a timed test).

    python benchmarks/make_large_savepoint.py --keys 1000000 --out /tmp/statequery-bench/hashmap
    python benchmarks/bench_canonical.py /tmp/statequery-bench/hashmap/savepoint-*

For every state of the operator (default ``large-state``): a full scan in a fresh process on one
core — rows/s, MB/s of state files read, peak RSS — then single-key lookups: latency cold (open
the savepoint, parse ``_metadata`` and the state headers, read one key group) and warm (headers
cached), and the bytes each lookup read through the storage seam.

``--index N``: single-state full scans without and with the run index (a StateMeta snapshot
written with ``index=True`` into a temporary directory, never into the savepoint), N paired
rounds in fresh processes: CPU and wall time, bytes read, the load average (``--pure``: on the
pure-Python decode path).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_scan(
    path: str,
    operator: str,
    state: str,
    mode: str | None,
    batch_size: int,
    snapshot: str | None = None,
) -> dict[str, Any]:
    import statequery
    from statequery.reader import list_states, read_state

    base_rss = _rss_mb()
    if snapshot:
        sp = statequery.open(path, snapshot=snapshot)
        assert sp.from_snapshot
    else:
        sp = statequery.open(path, use_snapshot=False)
    list_states(sp, operator)  # headers
    sp.io.stats.reset()
    t = time.perf_counter()
    cpu = time.process_time()
    rows = 0
    arrow_bytes = 0
    for batch in read_state(sp, operator, state, mode=mode, batch_size=batch_size):
        rows += batch.num_rows
        arrow_bytes += batch.nbytes
    dt = time.perf_counter() - t
    cpu = time.process_time() - cpu
    return {
        "state": state,
        "cpu_s": cpu,
        "mode": mode or "rows",
        "rows": rows,
        "seconds": dt,
        "rows_per_s": rows / dt if dt else 0.0,
        "mb_read": sp.io.stats.total_bytes / 1e6,
        "mb_per_s": sp.io.stats.total_bytes / 1e6 / dt if dt else 0.0,
        "arrow_mb": arrow_bytes / 1e6,
        "peak_rss_mb": _rss_mb(),
        "base_rss_mb": base_rss,
        "indexed": bool(snapshot),
        "load": os.getloadavg()[0],
    }


def child_all(path: str, operator: str) -> dict[str, Any]:
    """Every state of the operator, one after the other (the savepoint read completely)."""
    import statequery
    from statequery.backends import fastpath
    from statequery.reader import list_states, read_state

    sp = statequery.open(path, use_snapshot=False)
    refs = list_states(sp, operator)
    sp.io.stats.reset()
    t = time.perf_counter()
    cpu = time.process_time()
    rows = 0
    for ref in refs:
        for batch in read_state(sp, operator, ref.name):
            rows += batch.num_rows
    dt = time.perf_counter() - t
    return {
        "path": "compiled" if fastpath.compiled() is not None else "pure",
        "rows": rows,
        "seconds": dt,
        "cpu_seconds": time.process_time() - cpu,
        "rows_per_s": rows / dt,
        "mb_read": sp.io.stats.total_bytes / 1e6,
        "peak_rss_mb": _rss_mb(),
    }


def child_lookup(path: str, operator: str, n: int, seed: int, keys_total: int) -> dict[str, Any]:
    import statequery
    from statequery.io import FileIO
    from statequery.reader import lookup

    rnd = random.Random(seed)
    keys = [f"user-{rnd.randrange(keys_total):07d}" for _ in range(n)]
    cold, warm, cold_bytes, warm_bytes, rows = [], [], [], [], []
    for key in keys:
        io = FileIO()
        t = time.perf_counter()
        sp = statequery.open(path, io=io, use_snapshot=False)
        result = lookup(sp, key, operator)
        cold.append(time.perf_counter() - t)
        cold_bytes.append(io.stats.total_bytes)
        io.stats.reset()
        t = time.perf_counter()
        result = lookup(sp, key, operator)
        warm.append(time.perf_counter() - t)
        warm_bytes.append(io.stats.total_bytes)
        rows.append(sum(tb.num_rows for tb in result.values()))
    cold.sort()
    warm.sort()
    return {
        "lookups": n,
        "cold_ms_median": 1000 * cold[n // 2],
        "cold_ms_max": 1000 * cold[-1],
        "warm_ms_median": 1000 * warm[n // 2],
        "warm_ms_max": 1000 * warm[-1],
        "cold_kb_median": sorted(cold_bytes)[n // 2] / 1024,
        "warm_kb_median": sorted(warm_bytes)[n // 2] / 1024,
        "warm_kb_max": max(warm_bytes) / 1024,
        "rows_per_lookup": sum(rows) / n,
    }


def _run_child(args: list[str], pure: bool = False) -> dict[str, Any]:
    env = dict(os.environ)
    if pure:
        env["STATEQUERY_PURE_PYTHON"] = "1"
    out = subprocess.run(
        [sys.executable, __file__, "--child", *args],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _key_group_stats(path: str, operator: str) -> dict[str, Any]:
    import statequery

    sp = statequery.open(path, use_snapshot=False)
    extents = []
    files = 0
    total = 0
    for op in sp.metadata.operators:
        if operator not in (op.uid, op.name, op.operator_id):
            continue
        for st in op.subtasks:
            h = st.managed_keyed
            if h is None:
                continue
            files += 1
            size = sp.resolver.stream_size(h.delegate)
            total += size
            pos = sorted(o for o in h.offsets if o > 0)
            extents += [b - a for a, b in zip(pos, pos[1:] + [size], strict=False)]
            header = pos[0] if pos else size
    return {
        "files": files,
        "state_mb": total / 1e6,
        "key_groups": len(extents),
        "kg_kb_median": sorted(extents)[len(extents) // 2] / 1024 if extents else 0,
        "kg_kb_max": max(extents) / 1024 if extents else 0,
        "header_b": header,
    }


def _warm_page_cache(sp: Any) -> None:
    """Read every keyed state file once, so that scans measure decoding, not the disk."""
    for op in sp.metadata.operators:
        for st in op.subtasks:
            h = st.managed_keyed
            loc = None if h is None else sp.resolver.location(getattr(h, "delegate", h))
            if loc and os.path.isfile(loc):
                with open(loc, "rb") as f:
                    while f.read(1 << 24):
                        pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        kind, rest = argv[1], argv[2:]
        if kind == "scan":
            snapshot = rest[5] if len(rest) > 5 else None
            res = child_scan(rest[0], rest[1], rest[2], rest[3] or None, int(rest[4]), snapshot)
        elif kind == "all":
            res = child_all(rest[0], rest[1])
        else:
            res = child_lookup(rest[0], rest[1], int(rest[2]), int(rest[3]), int(rest[4]))
        print(json.dumps(res))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("savepoint")
    ap.add_argument("--operator", default="large-state")
    ap.add_argument(
        "--keys",
        type=int,
        default=None,
        help="number of keys the job wrote (for lookups; default: from the value state)",
    )
    ap.add_argument("--lookups", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=65536)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument(
        "--paired",
        type=int,
        default=0,
        metavar="N",
        help="only the full scan of every state, N times on the compiled and the pure-Python "
        "decode path alternately (fresh processes); medians of wall and CPU time, and the ratio",
    )
    ap.add_argument(
        "--index",
        type=int,
        default=0,
        metavar="N",
        help="single-state full scans without and with the run index, N paired rounds",
    )
    ap.add_argument("--pure", action="store_true", help="with --index: the pure-Python path")
    ap.add_argument("--states", help="with --index: comma-separated states (default: all)")
    args = ap.parse_args(argv)
    if args.paired:
        return _paired(args.savepoint, args.operator, args.paired)
    if args.index:
        states = args.states.split(",") if args.states else None
        return _indexed(args.savepoint, args.operator, args.index, args.pure, states)

    import statequery
    from statequery.reader import list_states

    sp = statequery.open(args.savepoint, use_snapshot=False)
    refs = list_states(sp, args.operator)
    layout = _key_group_stats(args.savepoint, args.operator)
    _warm_page_cache(sp)
    results: dict[str, Any] = {"savepoint": args.savepoint, "layout": layout, "scans": []}
    print(f"savepoint {args.savepoint}")
    print(
        f"  {layout['files']} keyed files, {layout['state_mb']:.1f} MB, "
        f"{layout['key_groups']} key groups (median {layout['kg_kb_median']:.0f} KiB, "
        f"max {layout['kg_kb_max']:.0f} KiB), header {layout['header_b']} B"
    )
    print(
        f"\n{'state':40s} {'mode':6s} {'rows':>10s} {'s':>7s} {'rows/s':>10s} "
        f"{'MB/s':>7s} {'peak RSS':>9s}"
    )
    keys_total = args.keys
    runs = [(r.name, None) for r in refs]
    runs += [(r.name, "flat") for r in refs if r.kind == "list"]
    runs += [(r.name, "nested") for r in refs if r.kind == "map"]
    for state, mode in runs:
        res = _run_child(
            ["scan", args.savepoint, args.operator, state, mode or "", str(args.batch_size)]
        )
        results["scans"].append(res)
        if keys_total is None and state == "count" and mode is None:
            keys_total = res["rows"]
        print(
            f"{state:40s} {res['mode']:6s} {res['rows']:>10,} {res['seconds']:>7.2f} "
            f"{res['rows_per_s']:>10,.0f} {res['mb_per_s']:>7.1f} "
            f"{res['peak_rss_mb']:>7.0f} MB"
        )
    every = _run_child(["all", args.savepoint, args.operator])
    results["all_states"] = every
    print(
        f"{'(every state, one after the other)':40s} {'rows':6s} {every['rows']:>10,} "
        f"{every['seconds']:>7.2f} {every['rows_per_s']:>10,.0f} "
        f"{every['mb_read'] / every['seconds']:>7.1f} {every['peak_rss_mb']:>7.0f} MB"
    )
    lk = _run_child(
        ["lookup", args.savepoint, args.operator, str(args.lookups), "7", str(keys_total or 1000)]
    )
    results["lookup"] = lk
    print(
        f"\nlookup of one key ({lk['lookups']} random keys, {lk['rows_per_lookup']:.1f} rows "
        "each, every state of the operator):"
    )
    print(
        f"  cold (open + _metadata + headers + 1 key group): median {lk['cold_ms_median']:.1f} "
        f"ms, max {lk['cold_ms_max']:.1f} ms, {lk['cold_kb_median']:.1f} KiB read"
    )
    print(
        f"  warm (headers cached):                           median {lk['warm_ms_median']:.1f} "
        f"ms, max {lk['warm_ms_max']:.1f} ms, {lk['warm_kb_median']:.1f} KiB read "
        f"(max {lk['warm_kb_max']:.1f})"
    )
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


def _paired(path: str, operator: str, n: int) -> int:
    """Compiled vs pure-Python decode path, paired runs. On a shared machine wall time is noisy:
    CPU time (``time.process_time`` of the scanning process) is the figure to compare."""
    import statistics

    runs: dict[str, list[dict[str, Any]]] = {"compiled": [], "pure": []}
    for i in range(n):
        for pure in (False, True):
            res = _run_child(["all", path, operator], pure=pure)
            runs["pure" if pure else "compiled"].append(res)
            print(
                f"run {i + 1} {res['path']:8s} {res['rows']:>10,} rows"
                f"  wall {res['seconds']:7.2f} s  cpu {res['cpu_seconds']:7.2f} s"
                f"  {res['rows'] / res['cpu_seconds']:>12,.0f} rows/cpu-s"
                f"  peak RSS {res['peak_rss_mb']:.0f} MB",
                flush=True,
            )
    med = {
        k: (
            statistics.median(r["seconds"] for r in v),
            statistics.median(r["cpu_seconds"] for r in v),
        )
        for k, v in runs.items()
    }
    print(
        f"median wall: compiled {med['compiled'][0]:.2f} s, pure {med['pure'][0]:.2f} s; "
        f"median cpu: compiled {med['compiled'][1]:.2f} s, pure {med['pure'][1]:.2f} s; "
        f"pure/compiled cpu ratio {med['pure'][1] / med['compiled'][1]:.1f}x"
    )
    return 0


def _indexed(
    path: str, operator: str, n: int, pure: bool, states: list[str] | None
) -> int:
    """Single-state full scans without the run index (today's walk of every state's entries)
    and with it (a snapshot with the index, written to a temporary directory), paired."""
    import statistics
    import tempfile

    import statequery
    from statequery.reader import list_states

    sp = statequery.open(path, use_snapshot=False)
    names = states or [r.name for r in list_states(sp, operator)]
    _warm_page_cache(sp)
    tmp = tempfile.mkdtemp(prefix="statequery-bench-index-")
    plain = sp.write_snapshot(os.path.join(tmp, "meta.msgpack"))
    t = time.perf_counter()
    cpu = time.process_time()
    indexed = statequery.open(path, use_snapshot=False).write_snapshot(
        os.path.join(tmp, "meta-index.msgpack"), index=True
    )
    build = (time.perf_counter() - t, time.process_time() - cpu)
    size = os.path.getsize(indexed) - os.path.getsize(plain)
    kgs = statequery.open(path, snapshot=indexed).run_index.key_group_count
    print(f"savepoint {path}")
    print(
        f"  run index: {kgs} key groups, {size:,} bytes in the snapshot "
        f"({os.path.getsize(indexed):,} with, {os.path.getsize(plain):,} without); "
        f"built in {build[0]:.2f} s wall, {build[1]:.2f} s CPU (a walk of every key group)"
    )
    print(f"  decode path: {'pure Python' if pure else 'compiled'}; load {os.getloadavg()}")
    print(
        f"\n{'state':40s} {'index':6s} {'rows':>10s} {'cpu s':>7s} {'wall s':>7s} "
        f"{'MB read':>8s} {'load':>5s}"
    )
    runs: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    for _ in range(n):
        for state in names:
            for snap in (None, indexed):
                res = _run_child(
                    ["scan", path, operator, state, "", "65536", *([snap] if snap else [])],
                    pure=pure,
                )
                runs.setdefault((state, bool(snap)), []).append(res)
                print(
                    f"{state:40s} {'yes' if snap else 'no':6s} {res['rows']:>10,} "
                    f"{res['cpu_s']:>7.3f} {res['seconds']:>7.3f} {res['mb_read']:>8.1f} "
                    f"{res['load']:>5.1f}",
                    flush=True,
                )
    print(f"\nmedians of {n} (CPU ratio = without / with the index):")
    for state in names:
        a, b = runs[(state, False)], runs[(state, True)]
        ca = statistics.median(r["cpu_s"] for r in a)
        cb = statistics.median(r["cpu_s"] for r in b)
        wa = statistics.median(r["seconds"] for r in a)
        wb = statistics.median(r["seconds"] for r in b)
        print(
            f"{state:40s} cpu {ca:6.3f} -> {cb:6.3f} s ({ca / cb:5.1f}x)  wall {wa:6.3f} -> "
            f"{wb:6.3f} s ({wa / wb:5.1f}x)  read {a[0]['mb_read']:7.1f} -> "
            f"{b[0]['mb_read']:6.1f} MB"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
