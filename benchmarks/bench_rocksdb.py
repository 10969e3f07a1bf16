"""RocksDB native-savepoint benchmark: prints figures (not a timed test).

    # a canonical savepoint; the same job restored into RocksDB: native + canonical of one state
    python benchmarks/make_large_savepoint.py --keys 1000000 --out /tmp/statequery-bench/hashmap
    python benchmarks/make_large_savepoint.py --backend rocksdb \\
        --restore /tmp/statequery-bench/hashmap/savepoint-* --append-every 10 \\
        --kind savepoint-native,savepoint-canonical --out /tmp/statequery-bench/rocksdb-native
    python benchmarks/bench_rocksdb.py NATIVE_DIR --canonical CANONICAL_DIR

For every state of the operator (default ``large-state``), a full scan in a fresh process on one
core, **cold** (an empty, temporary cache directory: the time includes fetching every file of both
subtasks from the savepoint into the cache, hard-linking them into a DB directory, reading the
table properties and opening RocksDB) and **warm** (the cache already holds the files: a fresh
process, still restoring the DB directory and opening RocksDB, but fetching nothing). Reported:
rows/s, MB/s (the state's own table bytes, compressed, per second; cold also the savepoint bytes
fetched per second), peak RSS (``ru_maxrss``: it includes RocksDB's native memory, which
``tracemalloc`` cannot see), and where the time went (fetch into the cache, DB restore/open,
iteration + decoding). Then single-key lookups: cold (empty cache), warm cache with a fresh open,
and warm (same ``Savepoint`` object), with the bytes and files fetched from the savepoint through
the storage seam, and a check that only files of the subtask owning the key's key group were
touched; once reading only the tables that can hold the key (the default), once restoring the
owner's whole DB (``SELECTIVE_LOOKUPS = False``). Wall and CPU time (``time.process_time``)
are printed: on a shared machine only CPU time compares across runs. With ``--canonical`` the
same figures are measured on the canonical savepoint of the same job state
(``bench_canonical.py``'s children) for comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _Timers:
    """Wall time spent in the RocksDB backend's restore steps (monkey-patched wrappers)."""

    def __init__(self) -> None:
        self.t: dict[str, float] = defaultdict(float)
        self.n: dict[str, int] = defaultdict(int)

    def wrap(self, owner: Any, name: str, label: str) -> None:
        fn = getattr(owner, name)
        timers = self

        def wrapper(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                timers.t[label] += time.perf_counter() - t
                timers.n[label] += 1

        setattr(owner, name, wrapper)


def _instrument() -> _Timers:
    from statequery.backends import cache, rocksdb

    timers = _Timers()
    timers.wrap(cache.FileCache, "_download", "fetch")  # savepoint -> cache (verified)
    timers.wrap(rocksdb.RocksDBState, "_restore", "restore")  # fetch + link + tables + open
    timers.wrap(rocksdb.RocksDBState, "close", "close")
    return timers


def _open(path: str, io: Any = None) -> Any:
    import statequery

    return (
        statequery.open(path, io=io, use_snapshot=False)
        if io
        else statequery.open(path, use_snapshot=False)
    )


def child_scan(
    path: str, operator: str, states: list[str], mode: str | None, batch_size: int
) -> dict[str, Any]:
    """Scan ``states`` one after the other (one state: the per-state figure)."""
    from statequery.reader import list_states, read_state

    timers = _instrument()
    base_rss = _rss_mb()
    sp = _open(path)
    list_states(sp, operator)  # _metadata + the handles' meta-data streams
    sp.io.stats.reset()
    t = time.perf_counter()
    cpu = time.process_time()
    rows = 0
    for state in states:
        for batch in read_state(sp, operator, state, mode=mode, batch_size=batch_size):
            rows += batch.num_rows
    cpu = time.process_time() - cpu
    dt = time.perf_counter() - t
    fetched = sp.io.stats.total_bytes
    return {
        "states": states,
        "mode": mode or "rows",
        "rows": rows,
        "seconds": dt,
        "rows_per_s": rows / dt if dt else 0.0,
        "cpu_s": cpu,
        "rows_per_cpu_s": rows / cpu if cpu else 0.0,
        "fetched_mb": fetched / 1e6,
        "fetch_s": timers.t["fetch"],
        "restore_s": timers.t["restore"],  # includes fetch_s
        "opens": timers.n["restore"],
        "close_s": timers.t["close"],
        "peak_rss_mb": _rss_mb(),
        "base_rss_mb": base_rss,
    }


def _subtask_of_location(sp: Any, operator: str) -> dict[str, tuple[int, str]]:
    """Location of every file of every keyed handle of ``operator`` -> (subtask index, RocksDB
    file name, or ``meta`` for the handle's meta-data stream: the state header)."""
    from statequery.backends.rocksdb import from_incremental_handle

    out: dict[str, tuple[int, str]] = {}
    for op in sp.metadata.operators:
        if operator not in (op.uid, op.name, op.operator_id):
            continue
        for st in op.subtasks:
            h = st.managed_keyed
            if h is None:
                continue
            for f in from_incremental_handle(h, sp.resolver).files:
                if f.location:
                    out[f.location] = (st.index, f.local_path)
            meta = sp.resolver.location(h.meta)
            if meta:
                out[meta] = (st.index, "meta")
    return out


def _owner(sp: Any, operator: str, key_group: int) -> int:
    for op in sp.metadata.operators:
        if operator in (op.uid, op.name, op.operator_id):
            for st in op.subtasks:
                h = st.managed_keyed
                if h is not None and h.key_group_range.start <= key_group <= h.key_group_range.end:
                    return int(st.index)
    raise AssertionError(f"no subtask owns key group {key_group}")


def child_lookup(
    path: str, operator: str, n: int, seed: int, keys_total: int, cold_n: int,
    selective: bool = True,
) -> dict[str, Any]:
    """Lookups: cold (an empty cache per key), warm cache + fresh open, warm (same object).

    ``selective``: a cold lookup fetches the MANIFEST and only the tables whose key range can
    hold the key (``rocksdb.SELECTIVE_LOOKUPS``); else the owning subtask's whole DB."""
    from statequery.backends import rocksdb
    from statequery.backends.cache import FileCache
    from statequery.hashing import key_group_of
    from statequery.io import FileIO
    from statequery.reader import lookup

    timers = _instrument()
    rocksdb.SELECTIVE_LOOKUPS = selective
    rnd = random.Random(seed)
    keys = [f"user-{rnd.randrange(keys_total):07d}" for _ in range(n)]
    probe = _open(path)
    where = _subtask_of_location(probe, operator)
    max_par = next(
        op.max_parallelism
        for op in probe.metadata.operators
        if operator in (op.uid, op.name, op.operator_id)
    )
    res: dict[str, list[float]] = defaultdict(list)
    checks: list[str] = []
    rows: list[int] = []
    root = tempfile.mkdtemp(prefix="statequery-bench-lookup-")
    try:
        for i, key in enumerate(keys):
            kg = key_group_of(key, max_par, None)
            owner = _owner(probe, operator, kg)
            if i < cold_n:  # cold: an empty cache
                cache_dir = os.path.join(root, f"cold-{i}")
                rocksdb._DEFAULT_CACHE = FileCache(cache_dir)
                timers.t.clear()
                io = FileIO()
                t = time.perf_counter()
                cpu = time.process_time()
                sp = _open(path, io)
                result = lookup(sp, key, operator)
                res["cold_ms"].append(1000 * (time.perf_counter() - t))
                res["cold_cpu_ms"].append(1000 * (time.process_time() - cpu))
                res["cold_fetch_ms"].append(1000 * timers.t["fetch"])
                res["cold_restore_ms"].append(1000 * timers.t["restore"])
                res["cold_kb"].append(io.stats.total_bytes / 1024)
                read = io.stats.bytes_read
                mine = {loc: where[loc] for loc in read if loc in where}
                data = {sub for sub, name in mine.values() if name != "meta"}
                headers = {sub for sub, name in mine.values() if name == "meta"}
                others = [
                    loc for loc in read if loc not in where and loc != probe.metadata.location
                ]
                n_owner = sum(1 for sub, name in where.values() if sub == owner and name != "meta")
                n_data = sum(1 for _, name in mine.values() if name != "meta")
                data_b = sum(read[loc] for loc, (_, name) in mine.items() if name != "meta")
                owner_b = sum(
                    os.path.getsize(loc) for loc, (sub, name) in where.items()
                    if sub == owner and name != "meta" and os.path.exists(loc))
                header_b = sum(read[loc] for loc, (_, name) in mine.items() if name == "meta")
                ssts = sum(1 for _, name in mine.values() if name.endswith(".sst"))
                res["cold_files"].append(n_data)
                res["cold_ssts"].append(ssts)
                res["cold_data_mib"].append(data_b / 2**20)
                res["owner_files"].append(n_owner)
                res["owner_mib"].append(owner_b / 2**20)
                # selective: a subset of the owner's files; else all of them
                ok = data == {owner} and not others and (
                    n_data <= n_owner if selective else n_data == n_owner)
                checks.append(
                    f"{key} kg {kg}: owner subtask {owner}; DB files fetched: {n_data} "
                    f"({ssts} SSTs) of subtask(s) {sorted(data)} (the owner has {n_owner}, "
                    f"{owner_b / 2**20:.1f} MiB), "
                    f"{data_b / 2**20:.1f} MiB; state headers of subtasks {sorted(headers)} "
                    f"({header_b} B); _metadata {read.get(probe.metadata.location, 0)} B; "
                    f"other files {len(others)} -> {'OK' if ok else 'FAILED'}"
                )
                if not ok:
                    raise AssertionError(checks[-1])
                shutil.rmtree(cache_dir, ignore_errors=True)
            # warm cache, fresh open: _metadata, the meta-data stream, restore from the cache
            warm_dir = os.path.join(root, "warm")
            rocksdb._DEFAULT_CACHE = FileCache(warm_dir)
            _ = lookup(_open(path), key, operator)  # fill the cache with this subtask's files
            timers.t.clear()
            io = FileIO()
            t = time.perf_counter()
            cpu = time.process_time()
            sp = _open(path, io)
            result = lookup(sp, key, operator)
            res["warm_open_ms"].append(1000 * (time.perf_counter() - t))
            res["warm_open_cpu_ms"].append(1000 * (time.process_time() - cpu))
            res["warm_open_restore_ms"].append(1000 * timers.t["restore"])
            res["warm_open_kb"].append(io.stats.total_bytes / 1024)
            # warm: the same Savepoint again (headers parsed; the DB is restored again)
            io.stats.reset()
            timers.t.clear()
            timers.n.clear()
            t = time.perf_counter()
            cpu = time.process_time()
            result = lookup(sp, key, operator)
            res["warm_ms"].append(1000 * (time.perf_counter() - t))
            res["warm_cpu_ms"].append(1000 * (time.process_time() - cpu))
            res["warm_restore_ms"].append(1000 * timers.t["restore"])
            res["warm_kb"].append(io.stats.total_bytes / 1024)
            res["opens_per_lookup"].append(timers.n["restore"])
            rows.append(sum(tb.num_rows for tb in result.values()))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def med(v: list[float]) -> float:
        return sorted(v)[len(v) // 2] if v else 0.0

    out: dict[str, Any] = {
        "lookups": n,
        "cold_lookups": cold_n,
        "checks": checks,
        "rows_per_lookup": sum(rows) / n,
    }
    for k, v in res.items():
        out[k + "_median"] = med(v)
        out[k + "_max"] = max(v) if v else 0.0
    return out


def _run_child(script: str, args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, script, "--child", *args],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-4000:])
        raise SystemExit(f"child {args[:2]} failed")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def layout(path: str, operator: str) -> dict[str, Any]:
    """Files per subtask, table bytes / entries / merge operands per column family (read
    locally, outside the measured storage seam)."""
    from statequery.backends.rocksdb import from_incremental_handle
    from statequery.backends.sst import SstFile

    sp = _open(path)
    subtasks = []
    cfs: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for op in sp.metadata.operators:
        if operator not in (op.uid, op.name, op.operator_id):
            continue
        for st in op.subtasks:
            h = st.managed_keyed
            if h is None:
                continue
            files = from_incremental_handle(h, sp.resolver).files
            size = sum(max(f.size, 0) for f in files)
            subtasks.append(
                {
                    "subtask": st.index,
                    "key_groups": [h.key_group_range.start, h.key_group_range.end],
                    "files": len(files),
                    "mb": size / 1e6,
                    "ssts": sum(f.local_path.endswith(".sst") for f in files),
                }
            )
            for f in files:
                if not f.local_path.endswith(".sst") or not f.location:
                    continue
                with SstFile(f.location) as t:
                    p = t.properties
                    c = cfs[p.column_family_name]
                    c["tables"] += 1
                    c["bytes"] += t.size
                    c["entries"] += p.num_entries
                    c["merge_operands"] += p.merge_operands
                    c["raw_bytes"] += p.get_int("rocksdb.raw.key.size") + p.get_int(
                        "rocksdb.raw.value.size"
                    )
    return {"subtasks": subtasks, "cfs": {k: dict(v) for k, v in cfs.items()}}


def _page_cache(path: str) -> None:
    for name in os.listdir(path):
        p = os.path.join(path, name)
        if os.path.isfile(p):
            with open(p, "rb") as f:
                while f.read(1 << 24):
                    pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        kind, rest = argv[1], argv[2:]
        if kind == "scan":
            res = child_scan(rest[0], rest[1], json.loads(rest[2]), rest[3] or None, int(rest[4]))
        else:
            res = child_lookup(
                rest[0], rest[1], int(rest[2]), int(rest[3]), int(rest[4]), int(rest[5]),
                rest[6] != "0" if len(rest) > 6 else True,
            )
        print(json.dumps(res))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("savepoint", help="the RocksDB native savepoint directory")
    ap.add_argument("--canonical", help="a canonical savepoint of the same job state, to compare")
    ap.add_argument("--operator", default="large-state")
    ap.add_argument("--keys", type=int, default=1_000_000, help="keys the job wrote")
    ap.add_argument("--lookups", type=int, default=20)
    ap.add_argument("--cold-lookups", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=65536)
    ap.add_argument("--repeat", type=int, default=1, help="runs per figure (the best counts)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)

    from statequery.reader import list_states

    script = os.path.abspath(__file__)
    tmp_root = tempfile.mkdtemp(prefix="statequery-bench-cache-")
    # the default cache (STATEQUERY_CACHE_DIR) of every child: a temporary directory
    try:
        os.environ["STATEQUERY_CACHE_DIR"] = os.path.join(tmp_root, "unused")
        refs = list_states(_open(args.savepoint), args.operator)
        lay = layout(args.savepoint, args.operator)
        _page_cache(args.savepoint)
        results: dict[str, Any] = {"savepoint": args.savepoint, "layout": lay, "scans": []}
        print(f"savepoint {args.savepoint}")
        for s in lay["subtasks"]:
            print(
                f"  subtask {s['subtask']}: key groups {s['key_groups'][0]}-"
                f"{s['key_groups'][1]}, {s['files']} files ({s['ssts']} SSTs), "
                f"{s['mb']:.1f} MB"
            )
        for cf, c in sorted(lay["cfs"].items()):
            print(
                f"  {cf:34s} {c['tables']:>3} tables {c['bytes'] / 1e6:>6.1f} MB "
                f"(raw {c['raw_bytes'] / 1e6:5.1f} MB) {c['entries']:>10,} entries "
                f"{c['merge_operands']:>8,} merge operands"
            )
        canon_script = os.path.join(HERE, "bench_canonical.py")
        if args.canonical:
            _page_cache(args.canonical)
        print(
            f"\nbest of {args.repeat}; rows/s (MB/s of the state's own tables, compressed) and "
            "peak RSS; cold = empty cache, warm = cache filled"
        )
        head = (
            f"{'state':30s} {'mode':6s} {'rows':>9s} | {'RocksDB cold':>27s} | "
            f"{'RocksDB warm':>27s}"
        )
        if args.canonical:
            head += f" | {'canonical (same state)':>27s}"
        print(head)
        runs: list[tuple[list[str], str | None]] = [([r.name], None) for r in refs]
        runs += [([r.name], "flat") for r in refs if r.kind == "list"]
        runs += [([r.name], "nested") for r in refs if r.kind == "map"]
        runs.append(([r.name for r in refs], None))

        def best(results_: list[dict[str, Any]]) -> dict[str, Any]:
            return min(results_, key=lambda r: r["seconds"])

        for states, mode in runs:
            cache_dir = os.path.join(tmp_root, "scan")
            env = {"STATEQUERY_CACHE_DIR": cache_dir}
            cf_bytes = sum(lay["cfs"].get(s, {}).get("bytes", 0) for s in states)
            label = states[0] if len(states) == 1 else "(every state, one after the other)"
            label = label.replace("_timer_state/", "timers/")
            tries: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for _ in range(args.repeat):  # interleaved, so that all three see the same noise
                shutil.rmtree(cache_dir, ignore_errors=True)
                for cache in ("cold", "warm"):
                    tries[cache].append(
                        _run_child(
                            script,
                            [
                                "scan",
                                args.savepoint,
                                args.operator,
                                json.dumps(states),
                                mode or "",
                                str(args.batch_size),
                            ],
                            env,
                        )
                    )
                if args.canonical:
                    if len(states) == 1:
                        tries["canonical"].append(
                            _run_child(
                                canon_script,
                                [
                                    "scan",
                                    args.canonical,
                                    args.operator,
                                    states[0],
                                    mode or "",
                                    str(args.batch_size),
                                ],
                            )
                        )
                    else:
                        tries["canonical"].append(
                            _run_child(canon_script, ["all", args.canonical, args.operator])
                        )
            line = ""
            for cache in ("cold", "warm", "canonical"):
                if cache not in tries:
                    continue
                res = best(tries[cache])
                res["cache"] = cache
                res["label"] = label
                if cache == "canonical":
                    res.setdefault("mb_read", res.get("mb_per_s", 0) * res["seconds"])
                    res["mb_per_s"] = res["mb_read"] / res["seconds"] if res["seconds"] else 0.0
                else:
                    res["cf_mb"] = cf_bytes / 1e6
                    res["mb_per_s"] = cf_bytes / 1e6 / res["seconds"] if res["seconds"] else 0.0
                results["scans"].append(res)
                line += (
                    f" | {res['rows_per_s']:>9,.0f} {res['mb_per_s']:>5.1f} MB/s "
                    f"{res['peak_rss_mb']:>4.0f} MB"
                )
            rows = best(tries["cold"])["rows"]
            print(f"{label:30s} {mode or 'rows':6s} {rows:>9,}{line}")
        print(
            "\ntime split (best run): seconds total / fetch into the cache / whole restore "
            "(fetch + link + table properties + RocksDB open), for cold and warm"
        )
        for res in results["scans"]:
            if res["cache"] == "canonical":
                continue
            print(
                f"  {res['label']:30s} {res['mode']:6s} {res['cache']:4s} "
                f"{res['seconds']:6.2f} s / {res['fetch_s']:5.2f} / {res['restore_s']:5.2f} "
                f"({res['opens']} restores, {res['fetched_mb']:.1f} MB fetched); CPU "
                f"{res['cpu_s']:.2f} s, {res['rows_per_cpu_s']:,.0f} rows per CPU-second"
            )
        for selective in (True, False):
            lk = _run_child(
                script,
                [
                    "lookup",
                    args.savepoint,
                    args.operator,
                    str(args.lookups),
                    "7",
                    str(args.keys),
                    str(args.cold_lookups),
                    "1" if selective else "0",
                ],
            )
            results["lookup" if selective else "lookup_full_restore"] = lk
            how = (
                "cold: the MANIFEST and the tables that can hold the key (TableReadState)"
                if selective
                else "cold: the owning subtask's whole DB restored (SELECTIVE_LOOKUPS = False)"
            )
            print(
                f"\nlookup of one key ({lk['lookups']} random keys, {lk['rows_per_lookup']:.1f} "
                f"rows each, every state of the operator; {how}):"
            )
            print(
                f"  cold (empty cache; {lk['cold_lookups']} keys):  median "
                f"{lk['cold_ms_median']:.0f} ms wall / {lk['cold_cpu_ms_median']:.0f} ms CPU "
                f"(fetch {lk['cold_fetch_ms_median']:.0f} ms), max {lk['cold_ms_max']:.0f} ms, "
                f"{lk['cold_kb_median'] / 1024:.2f} MiB fetched; DB files "
                f"{lk['cold_files_median']:.0f} of the owner's {lk['owner_files_median']:.0f} "
                f"({lk['cold_ssts_median']:.0f} SSTs), {lk['cold_data_mib_median']:.2f} of "
                f"{lk['owner_mib_median']:.1f} MiB"
            )
            print(
                f"  warm cache, fresh open:        median {lk['warm_open_ms_median']:.0f} ms wall "
                f"/ {lk['warm_open_cpu_ms_median']:.0f} ms CPU, max "
                f"{lk['warm_open_ms_max']:.0f} ms, {lk['warm_open_kb_median']:.1f} KiB fetched"
            )
            print(
                f"  warm (same Savepoint object):  median {lk['warm_ms_median']:.1f} ms wall / "
                f"{lk['warm_cpu_ms_median']:.1f} ms CPU, max {lk['warm_ms_max']:.1f} ms, "
                f"{lk['warm_kb_median']:.1f} KiB fetched (max {lk['warm_kb_max']:.1f}), "
                f"{lk['opens_per_lookup_median']:.0f} restores"
            )
            for line in lk["checks"]:
                print(f"  storage seam: {line}")
        print(f"\nload average at the end: {os.getloadavg()}")

        if args.canonical:
            clk = _run_child(
                canon_script,
                ["lookup", args.canonical, args.operator, str(args.lookups), "7", str(args.keys)],
            )
            results["canonical_lookup"] = clk
            print(
                f"  canonical of the same state, for comparison: cold median "
                f"{clk['cold_ms_median']:.1f} ms ({clk['cold_kb_median']:.0f} KiB read), warm "
                f"median {clk['warm_ms_median']:.1f} ms ({clk['warm_kb_median']:.0f} KiB read)"
            )
        if args.json:
            print(json.dumps(results, indent=1))
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
