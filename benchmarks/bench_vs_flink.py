"""statequery against Flink's own restore-and-iterate, paired runs: prints figures (no timed test).

    python benchmarks/bench_vs_flink.py SAVEPOINT --keys 1000000 [--append-every 10] [--runs 3]

On one savepoint of ``LargeStateJob`` (``make_large_savepoint.py``), in alternation, each run a
fresh process (statequery, Flink from disk, Flink preloaded, statequery, ...):

* **statequery**: every state of the operator in one pass over the state files
  (:meth:`Savepoint.read_operator`, ``full``), and one state (``single``, ``--state``, default
  ``count``) as :func:`statequery.reader.read_state` reads it; one core, Arrow batches counted and
  dropped.
* **Flink** (``benchmarks/flink/statequery/bench/RestoreCount.java``): each subtask restored into
  Flink 2.3's own ``HashMapStateBackend`` (canonical) or ``EmbeddedRocksDBStateBackend`` (RocksDB
  native), the way the fixture oracle ``SavepointDump`` restores, then every entry of the wanted
  states iterated and counted (as the State Processor API walks state: every key, then its
  value). ``disk``: the backend reads the savepoint's files (local file system, page cache warm);
  ``preload``: the files are read into byte arrays first (untimed by the restore clock), so the
  restore deserializes from memory.

Per run: entries (a list element, a map entry, a timer, a value each count one; checked against
what the deterministic job wrote: ``--keys`` keys, each with a value, a 3-element list (+1 element
for every ``--append-every``-th key), a 2-entry map, a reducing value and an event-time timer),
wall seconds of the whole process, its CPU seconds (user + system, ``wait4``) and peak RSS, and the
phases each side reports (statequery: open / scan; Flink: metadata / restore / iterate). Then the
medians and the statequery/Flink ratios. The machine's load average is printed with every run:
on a shared machine wall time is contention, compare CPU seconds.

``--index`` adds ``statequery-index`` to the single-state scenario: the same read with the run
index (a StateMeta snapshot written once with ``write_snapshot(index=True)`` into a temporary
file, never beside the savepoint, and opened with ``snapshot=``).

``--lookups N`` adds single-key lookups (cold: open + read one key group / fetch one subtask's
files; warm), by ``bench_canonical.py``'s / ``bench_rocksdb.py``'s children, with the number of
files and SSTs per subtask; Flink's equivalent is restoring the owning subtask (its restore time
per subtask is printed).

Needs a JDK 17 and apache-flink 2.3.0 in ``--flink-python`` (default ``/work/venv/bin/python``)
for its jars; statequery is whatever ``import statequery`` finds (PYTHONPATH).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


# -- the statequery side (child process) ----------------------------------------------------------


def _entries(layout_kind: str, batch: Any) -> int:
    """Entries in a batch: list rows count their elements (a list element is a Flink entry)."""
    if layout_kind == "list" and batch.num_rows:
        import pyarrow.compute as pc

        return int(pc.sum(pc.list_value_length(batch.column("value"))).as_py() or 0)
    return int(batch.num_rows)


def child_statequery(path: str, operator: str, state: str, snapshot: str = "") -> dict[str, Any]:
    import statequery
    from statequery.backends import fastpath
    from statequery.reader import list_states, read_state

    t0 = time.perf_counter()
    c0 = time.process_time()
    if snapshot:  # a StateMeta snapshot with the run index (statequery-index)
        sp = statequery.open(path, snapshot=snapshot)
    else:
        sp = statequery.open(path, use_snapshot=False)
    indexed = sp.run_index.key_group_count  # key groups of the run index known at open
    infos = list_states(sp, operator)  # _metadata + state headers (or the snapshot)
    kinds = {s.name: s.kind for s in infos}
    t1 = time.perf_counter()
    c1 = time.process_time()
    per_state: dict[str, int] = {s.name: 0 for s in infos}
    rows = 0
    if state:
        per_state = {state: 0}
        for batch in read_state(sp, operator, state):
            per_state[state] += _entries(kinds[state], batch)
            rows += batch.num_rows
    else:
        for name, batch in sp.read_operator(operator):  # every state, one walk per key group
            per_state[name] += _entries(kinds[name], batch)
            rows += batch.num_rows
    t2 = time.perf_counter()
    c2 = time.process_time()
    return {
        "indexed_key_groups": indexed,
        "decode_path": "compiled" if fastpath.compiled() is not None else "pure",
        "entries": sum(per_state.values()),
        "rows": rows,
        "states": per_state,
        "open_s": t1 - t0,
        "open_cpu_s": c1 - c0,
        "scan_s": t2 - t1,
        "scan_cpu_s": c2 - c1,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def make_index(path: str, snapshot: str) -> dict[str, Any]:
    """Write the StateMeta snapshot with the run index to ``snapshot`` (outside the savepoint)."""
    import statequery

    sp = statequery.open(path, use_snapshot=False)
    t = time.perf_counter()
    c = time.process_time()
    where = sp.write_snapshot(snapshot, index=True)
    return {
        "index_s": time.perf_counter() - t,
        "index_cpu_s": time.process_time() - c,
        "bytes": os.path.getsize(where),
    }


# -- running children ------------------------------------------------------------------------------


def _load() -> float:
    return os.getloadavg()[0]


def _measured(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``cmd``; its last stdout line is JSON. Adds the whole process's wall and CPU seconds
    and peak RSS (``wait4``), and the load average before and after."""
    load0 = _load()
    out = tempfile.TemporaryFile()
    err = tempfile.TemporaryFile()
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=out, stderr=err, env={**os.environ, **(env or {})})
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    err.seek(0)
    stdout = out.read().decode()
    if proc.returncode != 0:
        sys.stderr.write(err.read().decode()[-4000:])
        raise SystemExit(f"{cmd[:3]} ... failed ({proc.returncode})")
    res: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    res["wall_s"] = wall
    res["cpu_s"] = ru.ru_utime + ru.ru_stime
    res["user_s"] = ru.ru_utime
    res["sys_s"] = ru.ru_stime
    res["rss_mb"] = ru.ru_maxrss / 1024
    res["load"] = (load0, _load())
    return res


def flink_classpath(flink_python: str) -> str:
    """Compile RestoreCount (and the oracle classes it shares) against the wheel's jars."""
    sys.path.insert(0, HERE)
    from make_large_savepoint import compile_job

    return compile_job(flink_python)


def _page_cache(path: str) -> None:
    """Read every file of the savepoint once: both sides then read from the page cache."""
    for d, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(d, name), "rb") as f:
                while f.read(1 << 24):
                    pass


def expected_counts(keys: int, append_every: int) -> dict[str, int]:
    extra = (keys + append_every - 1) // append_every if append_every > 0 else 0
    return {
        "count": keys,
        "recent-categories": 3 * keys + extra,
        "amount-by-category": 2 * keys,
        "sum-amount": keys,
        "_timer_state/event_user-timers": keys,
        "_timer_state/processing_user-timers": 0,
    }


def _check(side: str, res: dict[str, Any], want: dict[str, int]) -> str:
    got = {k: (v["entries"] if isinstance(v, dict) else v) for k, v in res["states"].items()}
    bad = {k: (got.get(k), want.get(k)) for k in got if got.get(k) != want.get(k)}
    if bad:
        raise SystemExit(f"{side}: entry counts differ from the job's (got, expected): {bad}")
    return "counts OK"


# -- the benchmark ---------------------------------------------------------------------------------


def _fmt_run(i: int, side: str, r: dict[str, Any]) -> str:
    if side.startswith("statequery"):
        phases = f"open {r['open_s']:.2f} s, scan {r['scan_s']:.2f} s ({r['scan_cpu_s']:.2f} cpu)"
    else:
        phases = (
            f"restore {r['restore_s']:.2f} s ({r['restore_cpu_s']:.2f} cpu), iterate "
            f"{r['iterate_s']:.2f} s ({r['iterate_cpu_s']:.2f} cpu), heap peak "
            f"{r['heap_peak_mb']:.0f} MB, gc {r['gc_s']:.2f} s"
        )
    return (
        f"  run {i + 1} {side:16s} {r['entries']:>10,} entries  wall {r['wall_s']:6.2f} s  "
        f"cpu {r['cpu_s']:6.2f} s (sys {r['sys_s']:.2f})  {r['entries'] / r['cpu_s']:>11,.0f}"
        f" entries/cpu-s  RSS {r['rss_mb']:5.0f} MB  load {r['load'][0]:.1f}  [{phases}]"
    )


def scenario(
    name: str,
    path: str,
    operator: str,
    state: str,
    runs: int,
    sides: list[str],
    cp: str,
    want: dict[str, int],
    java_opts: list[str],
    cache_root: str,
) -> dict[str, Any]:
    script = os.path.abspath(__file__)
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    wanted = {state: want[state]} if state else want
    print(f"\n{name}: {path}" + (f" (state {state})" if state else " (every state)"), flush=True)
    child = [sys.executable, script, "--child", path, operator, state]
    warm = os.path.join(cache_root, f"{name}-warm")
    if "statequery-warm" in sides:  # fill the cache once, untimed
        _measured(child, {"STATEQUERY_CACHE_DIR": warm})
    snapshot = os.path.join(cache_root, f"{name}-index.msgpack")
    if "statequery-index" in sides:  # the run index, once (statequery snapshot --index)
        made = _measured([sys.executable, script, "--make-index", path, snapshot])
        print(
            f"  run index written to {snapshot}: {made['bytes']:,} bytes, "
            f"{made['index_cpu_s']:.2f} CPU-s ({made['index_s']:.2f} s wall) to walk every "
            f"key group; process {made['cpu_s']:.2f} CPU-s",
            flush=True,
        )
    for i in range(runs):
        for side in sides:
            if side == "statequery-warm":  # RocksDB: the files already in the cache
                res = _measured(child, {"STATEQUERY_CACHE_DIR": warm})
            elif side == "statequery-index":  # canonical: the run index in a snapshot
                res = _measured([*child, snapshot])
            elif side == "statequery":
                cache = os.path.join(cache_root, f"{name}-{i}")  # RocksDB: cold cache each run
                res = _measured(child, {"STATEQUERY_CACHE_DIR": cache})
                shutil.rmtree(cache, ignore_errors=True)
            else:
                cmd = ["java", *java_opts, "-cp", cp, "statequery.bench.RestoreCount"]
                cmd += [f"--operator={operator}"]
                cmd += [f"--states={state}"] if state else []
                cmd += ["--preload"] if side == "flink-preload" else []
                res = _measured([*cmd, path])
                res["states"] = {k: v for k, v in res["states"].items() if not state or k == state}
            _check(side, res, wanted)
            results[side].append(res)
            print(_fmt_run(i, side, res), flush=True)
    summary: dict[str, Any] = {"name": name, "path": path, "state": state or None, "sides": {}}
    for side, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_s", "rss_mb")}
        med["work_cpu_s"] = statistics.median(_work_cpu(side, r) for r in rs)
        med["entries"] = rs[0]["entries"]
        med["load"] = statistics.median(r["load"][0] for r in rs)
        med["cpu_runs"] = [round(r["cpu_s"], 2) for r in rs]
        if side.startswith("statequery"):
            med["scan_cpu_s"] = statistics.median(r["scan_cpu_s"] for r in rs)
            med["decode_path"] = rs[0]["decode_path"]
        else:
            for k in ("restore_s", "restore_cpu_s", "iterate_s", "iterate_cpu_s", "heap_peak_mb"):
                med[k] = statistics.median(r[k] for r in rs)
            med["subtasks"] = rs[-1]["subtasks"]
            med["per_state"] = {
                k: {
                    "entries": v["entries"],
                    "iterate_cpu_s": statistics.median(r["states"][k]["iterate_cpu_s"] for r in rs),
                }
                for k, v in rs[0]["states"].items()
            }
        summary["sides"][side] = med
    sq = summary["sides"].get("statequery")
    print("  entries per state: " + ", ".join(f"{k} {v:,}" for k, v in wanted.items()))
    print(
        f"  {'medians':16s} {'entries':>10s} {'wall s':>7s} {'cpu s':>7s} {'work cpu':>8s} "
        f"{'entries/cpu-s':>14s} {'/work-cpu-s':>12s} {'entries/wall-s':>15s} {'RSS MB':>7s} "
        f"{'load':>5s}  Flink/statequery cpu (work cpu)"
    )
    notes: list[str] = []
    for side, m in summary["sides"].items():
        ratio = ""
        if sq is not None and not side.startswith("statequery"):
            m["cpu_ratio"] = m["cpu_s"] / sq["cpu_s"]
            m["work_cpu_ratio"] = m["work_cpu_s"] / sq["work_cpu_s"]
            ratio = f"{m['cpu_ratio']:.1f}x ({m['work_cpu_ratio']:.1f}x)"
        if not side.startswith("statequery"):
            per = ", ".join(
                f"subtask {s['subtask']} {s['restore_s']:.2f} s ({s['files']} files)"
                for s in m["subtasks"]
            )
            notes.append(
                f"  {side}: restore per subtask (last run; Flink's cost of a lookup): {per}"
            )
        print(
            f"  {side:16s} {m['entries']:>10,} {m['wall_s']:>7.2f} {m['cpu_s']:>7.2f} "
            f"{m['work_cpu_s']:>8.2f} {m['entries'] / m['cpu_s']:>14,.0f} "
            f"{m['entries'] / m['work_cpu_s']:>12,.0f} {m['entries'] / m['wall_s']:>15,.0f} "
            f"{m['rss_mb']:>7.0f} {m['load']:>5.1f}  {ratio}"
        )
    for line in notes:
        print(line)
    for side, m in summary["sides"].items():
        if "per_state" in m:
            print(
                f"  {side}: iterate CPU s per state (median): "
                + ", ".join(f"{k} {v['iterate_cpu_s']:.2f}" for k, v in m["per_state"].items())
            )
    return summary


def _work_cpu(side: str, r: dict[str, Any]) -> float:
    """CPU seconds of the work itself, without interpreter or JVM start-up: statequery's open
    (``_metadata`` + headers) and scan; Flink's metadata, headers (+ preload), restore, iterate
    (JIT and GC threads included: whole-process CPU during those phases)."""
    if side.startswith("statequery"):
        return float(r["open_cpu_s"] + r["scan_cpu_s"])
    return float(r["metadata_cpu_s"] + r["load_cpu_s"] + r["restore_cpu_s"] + r["iterate_cpu_s"])


def _markdown(label: str, scenarios: list[dict[str, Any]]) -> None:
    """The medians as rows of docs/performance.md's tables: CPU, then wall and memory."""
    rows_cpu, rows_wall = [], []
    for sc in scenarios:
        sides = sc["sides"]
        sq = sides["statequery"]
        flink = [sides[k] for k in ("flink-disk", "flink-preload") if k in sides]
        what = f"{label}, " + (f"`{sc['state']}` only" if sc["state"] else "every state")

        def cpu(m: dict[str, Any]) -> str:
            return f"{m['cpu_s']:.2f} ({m['work_cpu_s']:.2f})"

        ratios = ", ".join(f"{m['cpu_ratio']:.1f}× ({m['work_cpu_ratio']:.1f}×)" for m in flink)
        rows_cpu.append(
            f"| {what} | {sq['entries']:,} | {cpu(sq)} | "
            + " | ".join(cpu(m) for m in flink)
            + f" | {ratios} | {sq['entries'] / sq['cpu_s'] / 1e6:.2f}M "
            f"({sq['entries'] / sq['work_cpu_s'] / 1e6:.2f}M) | "
            + " | ".join(f"{m['entries'] / m['work_cpu_s'] / 1e6:.2f}M" for m in flink)
            + f" | {sq['load']:.1f} |"
        )
        rows_wall.append(
            f"| {what} | "
            + " / ".join(f"{m['wall_s']:.2f}" for m in (sq, *flink))
            + " | "
            + " / ".join(f"{m['rss_mb']:.0f}" for m in (sq, *flink))
            + " | "
            + " / ".join(f"{m['restore_cpu_s']:.2f} + {m['iterate_cpu_s']:.2f}" for m in flink)
            + " | "
            + " / ".join(f"{m['heap_peak_mb']:.0f}" for m in flink)
            + f" | {sq['load']:.1f} |"
        )
    print("\n".join(["", *rows_cpu, "", *rows_wall]))


def lookups(path: str, operator: str, keys: int, n: int, native: bool) -> dict[str, Any]:
    """bench_canonical's / bench_rocksdb's lookup child, and the layout (files, SSTs)."""
    if native:
        sys.path.insert(0, HERE)
        import bench_rocksdb

        lay = bench_rocksdb.layout(path, operator)
        res = _measured(
            [
                sys.executable,
                os.path.join(HERE, "bench_rocksdb.py"),
                "--child",
                "lookup",
                path,
                operator,
                str(n),
                "7",
                str(keys),
                str(min(5, n)),
            ]
        )
        res["layout"] = lay["subtasks"]
        fetched = (
            f"{res['cold_files_median']} files ({res['cold_ssts_median']} SSTs, "
            f"{res['cold_kb_median'] / 1024:.1f} MiB) fetched"
            if "cold_files_median" in res
            else f"{res['cold_kb_median'] / 1024:.1f} MiB fetched"
        )
        print(
            f"\nlookups ({n} random keys, every state of the operator), RocksDB native: cold "
            f"(empty cache) median {res['cold_ms_median']:.0f} ms, {fetched}; warm cache + "
            f"fresh open {res['warm_open_ms_median']:.0f} ms, warm {res['warm_ms_median']:.0f} "
            f"ms; load {res['load'][0]:.1f}"
        )
        for s in lay["subtasks"]:
            print(
                f"  subtask {s['subtask']}: {s['files']} files, {s['ssts']} SSTs, {s['mb']:.1f} MB"
            )
    else:
        res = _measured(
            [
                sys.executable,
                os.path.join(HERE, "bench_canonical.py"),
                "--child",
                "lookup",
                path,
                operator,
                str(n),
                "7",
                str(keys),
            ]
        )
        print(
            f"\nlookups ({n} random keys, every state of the operator), canonical: cold median "
            f"{res['cold_ms_median']:.1f} ms ({res['cold_kb_median']:.0f} KiB read), warm "
            f"median {res['warm_ms_median']:.1f} ms; load {res['load'][0]:.1f}"
        )
    return res


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        print(json.dumps(child_statequery(*argv[1:5])))
        return 0
    if argv and argv[0] == "--make-index":
        print(json.dumps(make_index(argv[1], argv[2])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("savepoint", help="a savepoint of LargeStateJob (canonical or RocksDB native)")
    ap.add_argument("--keys", type=int, required=True, help="keys the job wrote")
    ap.add_argument(
        "--append-every",
        type=int,
        default=0,
        help="the savepoint was made with make_large_savepoint --restore --append-every N",
    )
    ap.add_argument("--operator", default="large-state")
    ap.add_argument("--runs", type=int, default=3, help="paired runs per scenario")
    ap.add_argument(
        "--state",
        default="count",
        help="the single-state scenario's state ('' for none); canonical savepoints only",
    )
    ap.add_argument("--single-only", action="store_true", help="only the single-state scenario")
    ap.add_argument(
        "--index",
        action="store_true",
        help="single state: also statequery with the run index (a StateMeta snapshot with "
        "--index, written once to a temporary file, not beside the savepoint)",
    )
    ap.add_argument("--flink", default="disk,preload", help="Flink variants: disk, preload")
    ap.add_argument("--lookups", type=int, default=0, help="single-key lookups (0: none)")
    ap.add_argument(
        "--java-opt", action="append", default=[], help="a JVM option (default: the JVM's)"
    )
    ap.add_argument(
        "--flink-python",
        default=os.environ.get("FLINK_PYTHON", "/work/venv/bin/python"),
        help="a Python with apache-flink 2.3.0 installed (for its jars)",
    )
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--markdown", action="store_true", help="print the medians as table rows")
    ap.add_argument("--label", default="", help="the savepoint's name in those rows")
    args = ap.parse_args(argv)

    import statequery
    from statequery.metadata.handles import IncrementalHandle

    sp = statequery.open(args.savepoint, use_snapshot=False)
    native = any(
        isinstance(st.managed_keyed, IncrementalHandle)
        for op in sp.metadata.operators
        for st in op.subtasks
    )
    cp = flink_classpath(args.flink_python)
    _page_cache(args.savepoint)
    sides = ["statequery"] + [f"flink-{v.strip()}" for v in args.flink.split(",") if v.strip()]
    want = expected_counts(args.keys, args.append_every)
    commit = subprocess.run(
        ["git", "-C", REPO, "log", "-1", "--format=%h %s"], capture_output=True, text=True
    ).stdout.strip()
    print(
        f"savepoint {args.savepoint} ({'RocksDB native' if native else 'canonical'}), "
        f"{args.keys:,} keys, expected entries {sum(want.values()):,}; statequery "
        f"{statequery.__file__} at {commit}; {os.cpu_count()} CPUs, load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    cache_root = tempfile.mkdtemp(prefix="statequery-bench-vs-flink-")
    out: dict[str, Any] = {"savepoint": args.savepoint, "commit": commit, "scenarios": []}
    try:
        if not args.single_only:
            out["scenarios"].append(
                scenario(
                    "native-full" if native else "canonical-full",
                    args.savepoint,
                    args.operator,
                    "",
                    args.runs,
                    sides[:1] + ["statequery-warm"] + sides[1:] if native else sides,
                    cp,
                    want,
                    args.java_opt,
                    cache_root,
                )
            )
        if args.state and not native:
            out["scenarios"].append(
                scenario(
                    "canonical-single",
                    args.savepoint,
                    args.operator,
                    args.state,
                    args.runs,
                    sides[:1] + ["statequery-index"] + sides[1:] if args.index else sides,
                    cp,
                    want,
                    args.java_opt,
                    cache_root,
                )
            )
        if args.lookups:
            out["lookups"] = lookups(args.savepoint, args.operator, args.keys, args.lookups, native)
    finally:
        shutil.rmtree(cache_root, ignore_errors=True)
    print(f"\nload average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.markdown:
        _markdown(args.label or os.path.basename(args.savepoint.rstrip("/")), out["scenarios"])
    if args.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
