"""statequery at 1M, 3M and 10M keys, paired with Flink's own restore in the same run (figures,
no timed test; docs/performance.md, "Scale").

Make the savepoints first (``make_large_savepoint.py``; none is committed)::

    python benchmarks/make_large_savepoint.py --keys 10000000 --heap 13g --out /tmp/scale/c10m
    python benchmarks/make_large_savepoint.py --keys 10000000 --backend rocksdb \\
        --restore /tmp/scale/c10m/savepoint-* --append-every 10 \\
        --kind checkpoint-incremental,savepoint-native --out /tmp/scale/r10m

then, per size, the canonical savepoint, the RocksDB native one and the last checkpoint of the
incremental chain (``KEYS=PATH``; the RocksDB ones were made with ``--append-every 10``)::

    python benchmarks/bench_scale.py --canonical 1000000=/tmp/.../savepoint-... \\
        --native 1000000=/tmp/.../savepoint-... --chain 1000000=/tmp/.../chk-4 \\
        --json /tmp/scale/scale.json [--only full,single,lookup,workers,spark,cluster] \\
        [--runs 1]
    python benchmarks/bench_scale.py --plot /tmp/scale/scale.json   # docs/img/scale.png

What each part measures, every side a fresh process (its wall seconds, its CPU seconds: user +
system of the process and of the worker processes it started, and its peak resident set,
``VmHWM`` of ``/proc/<pid>/status``, per process), each with the load average (``/proc/loadavg``)
at its start:

* ``full``: every state of the operator (``Savepoint.read_operator``, one worker) against Flink's
  restore of the same files into its own backend (``benchmarks/flink/.../RestoreCount.java``:
  canonical into the ``HashMapStateBackend``, RocksDB native and incremental into
  ``EmbeddedRocksDBStateBackend``) followed by an iteration of every entry, as the State
  Processor API does: from disk (page cache warm) and, canonical only, with its files preloaded.
* ``single``: one state (``count``) both sides.
* ``lookup``: cold (a new process: ``statequery.open`` + the first ``lookup(key)`` of every
  state, imports excluded, CPU of that only) and warm (the same key 20 more times on the same
  ``Savepoint``; then 20 other keys of the same key group, and 20 random keys).
* ``workers``: the full scan with ``workers=1`` and ``workers=2`` (statequery/parallel.py),
  alternated, in a new process (its first read imports pyarrow and the readers; two workers:
  and starts the pool), in a process that has read before, and in one whose pool runs
  (``WORKER_VARIANTS``), with Python's bytecode cached as for an installed package;
  ``--only workers`` runs this alone, for the wall-clock 1-vs-2 comparison on an idle machine
  (a few minutes at 10M keys). Each round of variants is bracketed by a machine check
  (``machine_check``: a memory-bound loop alone and two at once): the ratios are printed for
  every round and for the rounds whose checks found a lone process not slowed (this VM has
  phases where a lone busy process runs slower than each of two, which overstates two workers
  against one).
* ``spark``: one state through Spark ``local[2]`` (``bench_spark.py``'s child: scans to the
  ``noop`` sink, the JVM data source and the Python one); ``--spark-conf
  spark.driver.memory=...`` if a size needs it.
* ``cluster``: the same on a standalone cluster on loopback (``tests/support/cluster.py``: a
  master and two one-core workers, one executor each, ``--executor-memory``), started for each
  savepoint and stopped after it; the CPU of the executors and of the driver apart.

Flink needs a JDK 17 and the apache-flink 2.3.0 jars: ``$FLINK_LIB`` (a ``pyflink/lib``) or
``--flink-python``. Give its JVM heap for 10M keys (``--java-opt=-Xmx12g``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import bench_vs_flink  # noqa: E402  (benchmarks/ is not a package)

OPERATOR = "large-state"


# -- /proc ----------------------------------------------------------------------------------------


def loadavg() -> str:
    with open("/proc/loadavg", encoding="ascii") as f:
        return " ".join(f.read().split()[:3])


def vm_hwm_mb(pid: int | str = "self") -> float:
    """Peak resident set of a process (``VmHWM``), MB; -1 when unknown."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return -1.0


def descendants() -> dict[int, tuple[float, float]]:
    """``pid -> (CPU seconds, VmHWM MB)`` of every live descendant of this process."""
    import bench_spark

    return {pid: (cpu, vm_hwm_mb(pid))
            for pid, (_, cpu) in bench_spark._descendants([os.getpid()]).items()}


# -- children (each a fresh process) -------------------------------------------------------------


def child_scan(path: str, state: str, workers: int, warm: bool = False,
               prepared: bool = False) -> dict[str, Any]:
    """One full scan (every state, or ``state``) with ``workers``; figures of this process and
    of the pool's worker processes (read before the pool is shut down). ``prepared``: a
    process that has read before (the catalog's ``word_counts`` read first: the modules a
    read imports on first use, pyarrow among them, are imported before the timing); ``warm``:
    and the pool started before the timing (``parallel.start``)."""
    import pyarrow.compute  # noqa: F401 - this benchmark's own counting (0.3 s to import)

    import statequery
    from statequery import parallel
    from statequery.backends import fastpath
    from statequery.reader import list_states

    if prepared:
        small = statequery.open(os.path.join(REPO, "catalog", "word_counts"))
        for op in small.keyed_operators():
            small.read_states(op, workers=1)
    if warm:
        parallel.start(workers)
    c0, t0 = time.process_time(), time.perf_counter()
    sp = statequery.open(path, use_snapshot=False)
    kinds = {s.name: s.kind for s in list_states(sp, OPERATOR)}
    t1 = time.perf_counter()
    per_state: dict[str, int] = {}
    rows = 0
    if state:
        batches: Any = ((state, b) for b in sp.read_batches(OPERATOR, state, workers=workers))
    else:
        batches = sp.read_operator(OPERATOR, workers=workers)
    for name, batch in batches:
        per_state[name] = per_state.get(name, 0) + bench_vs_flink._entries(kinds[name], batch)
        rows += batch.num_rows
    t2 = time.perf_counter()
    me = resource.getrusage(resource.RUSAGE_SELF)
    pool = descendants()
    parallel.shutdown()
    return {
        "decode_path": "compiled" if fastpath.compiled() is not None else "pure",
        "workers": workers,
        "warm": warm,
        "prepared": prepared,
        "entries": sum(per_state.values()),
        "states": per_state,
        "rows": rows,
        "open_s": t1 - t0,
        "scan_s": t2 - t1,
        "work_cpu_s": time.process_time() - c0,
        # this process's CPU from its start (imports included), without the pool's: the pool
        # workers are counted alive, as wait4 would count them twice once reaped
        "proc_cpu_s": me.ru_utime + me.ru_stime,
        "pool_cpu_s": sum(c for c, _ in pool.values()),
        "pool_hwm_mb": [round(h, 1) for _, h in pool.values()],
        "hwm_mb": vm_hwm_mb(),
    }


def child_lookup(path: str, keys: int, seed: int) -> dict[str, Any]:
    """Cold and warm lookups of every state (imports excluded from cold)."""
    import pyarrow  # noqa: F401  (imports excluded)

    import statequery
    import statequery.backends
    import statequery.savepoint
    import statequery.scan  # noqa: F401
    from statequery.hashing import key_group_of

    rnd = random.Random(seed)
    key = f"user-{rnd.randrange(keys):07d}"
    c0, t0 = time.process_time(), time.perf_counter()
    sp = statequery.open(path, use_snapshot=False)
    first = sp.lookup(key)
    cold_cpu, cold_wall = time.process_time() - c0, time.perf_counter() - t0
    rows = sum(t.num_rows for t in first.values())

    def mean_ms(ks: list[str]) -> float:
        c = time.process_time()
        for k in ks:
            sp.lookup(k)
        return 1000 * (time.process_time() - c) / len(ks)

    same = mean_ms([key] * 20)
    kg = key_group_of(key, 128)
    others = [k for k in (f"user-{i:07d}" for i in range(0, keys, max(1, keys // 20000)))
              if key_group_of(k, 128) == kg and k != key][:20]
    group = mean_ms(others) if others else -1.0
    randoms = mean_ms([f"user-{rnd.randrange(keys):07d}" for _ in range(20)])
    return {
        "key": key,
        "rows": rows,
        "states": len(first),
        "cold_cpu_ms": 1000 * cold_cpu,
        "cold_wall_ms": 1000 * cold_wall,
        "warm_same_key_cpu_ms": same,
        "warm_same_group_cpu_ms": group,
        "random_keys_cpu_ms": randoms,
        "hwm_mb": vm_hwm_mb(),
    }


# -- the parent -----------------------------------------------------------------------------------


def measured(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """bench_vs_flink's runner (wall, CPU of the process and its reaped children, load) plus
    the load average string at the start."""
    load = loadavg()
    res = bench_vs_flink._measured(cmd, env)
    res["loadavg"] = load
    return res


def _child(*args: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--child", *args]


def _flink(cp: str, java_opts: list[str], path: str, state: str, preload: bool) -> list[str]:
    cmd = ["java", *java_opts, "-cp", cp, "statequery.bench.RestoreCount", f"--operator={OPERATOR}"]
    cmd += [f"--states={state}"] if state else []
    cmd += ["--preload"] if preload else []
    return [*cmd, path]


def total_cpu(r: dict[str, Any]) -> float:
    """CPU seconds of a side: statequery's process and its pool's workers, or the JVM's."""
    if "proc_cpu_s" in r:
        return float(r["proc_cpu_s"] + r["pool_cpu_s"])
    return float(r["cpu_s"])


def _line(label: str, r: dict[str, Any]) -> str:
    cpu = total_cpu(r)
    hwm = r.get("hwm_mb", r.get("vm_hwm_mb", -1))
    pool = r.get("pool_hwm_mb") or []
    extra = f" workers' VmHWM {'/'.join(f'{h:.0f}' for h in pool)} MB" if pool else ""
    return (
        f"  {label:22s} {r['entries']:>12,} entries  wall {r['wall_s']:7.2f} s  cpu {cpu:7.2f} s"
        f"  VmHWM {hwm:6.0f} MB{extra}  load {r['loadavg']}"
    )


def part_scan(
    kind: str, keys: int, path: str, state: str, runs: int, cp: str, java_opts: list[str],
    flink_sides: list[str],
) -> dict[str, Any]:
    append = 0 if kind == "canonical" else 10
    want = bench_vs_flink.expected_counts(keys, append)
    wanted = {state: want[state]} if state else want
    sides = ["statequery"] + [s for s in flink_sides if kind == "canonical" or s == "flink-disk"]
    out: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    print(f"\n{kind} {keys:,} keys, {'state ' + state if state else 'every state'}: {path}",
          flush=True)
    for _ in range(runs):
        for side in sides:
            if side == "statequery":
                r = measured(_child("scan", path, state, "1"))
            else:
                r = measured(_flink(cp, java_opts, path, state, side == "flink-preload"))
                r["states"] = {k: v for k, v in r["states"].items() if not state or k == state}
                r["hwm_mb"] = r.get("vm_hwm_mb", -1)
            bench_vs_flink._check(side, r, wanted)
            out[side].append(r)
            print(_line(side, r), flush=True)
    return {"kind": kind, "keys": keys, "path": path, "state": state or None, "sides": out}


def part_lookup(keys: int, path: str, runs: int) -> list[dict[str, Any]]:
    out = []
    for i in range(max(runs, 2)):
        r = measured(_child("lookup", path, str(keys), str(7 + i)))
        out.append(r)
        print(
            f"  lookup {r['key']} ({r['rows']} rows, {r['states']} states): cold "
            f"{r['cold_cpu_ms']:.1f} ms CPU ({r['cold_wall_ms']:.1f} wall); warm same key "
            f"{r['warm_same_key_cpu_ms']:.2f} ms, other keys of its key group "
            f"{r['warm_same_group_cpu_ms']:.2f} ms, random keys {r['random_keys_cpu_ms']:.2f} "
            f"ms CPU; VmHWM {r['hwm_mb']:.0f} MB; load {r['loadavg']}",
            flush=True,
        )
    return out


#: the workers part's variants: (workers, the flags of ``child_scan``)
WORKER_VARIANTS = {
    "1": ("1", []),  # a new process: its first read imports pyarrow and the readers
    "2": ("2", []),  # ... and starts the pool
    "1-prepared": ("1", ["prepared"]),  # a process that has read before
    "2-prepared": ("2", ["prepared"]),  # ... whose first parallel read starts the pool
    "2-warm": ("2", ["prepared", "warm"]),  # ... with the pool running (any read after)
}


def _installed_env() -> dict[str, str]:
    """The environment of a process running statequery as installed: Python's bytecode cached
    (pip compiles a wheel's modules; a ``PYTHONDONTWRITEBYTECODE`` machine would have every new
    process, each pool worker among them, compile every module it imports), in a cache
    directory outside the repository."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "statequery",
        "bench-pycache")
    return env


_COPY_LOOP = ("import time\nb = bytearray(64 << 20)\nc = bytearray(64 << 20)\n"
              "t = time.process_time()\nfor _ in range(80):\n    c[:] = b\n"
              "print(time.process_time() - t)\n")


def machine_check() -> dict[str, float]:
    """A memory-bound loop (copies between two 64 MiB buffers, no page faults) alone, then two at
    once: CPU seconds of the one alone and of the slower of the two. On this VM the ratio
    ``alone / two`` drifts: below 1 (two copiers slow each other down, as on any machine) in
    its steady phases, above 1 in phases where a lone busy process runs slower than each of
    two; a one-worker scan is then slowed as much and two workers against one overstated."""

    def run(n: int) -> list[float]:
        procs = [subprocess.Popen([sys.executable, "-c", _COPY_LOOP], stdout=subprocess.PIPE,
                                  text=True) for _ in range(n)]
        return [float(p.communicate()[0]) for p in procs]

    alone = run(1)[0]
    two = max(run(2))
    return {"alone_s": round(alone, 2), "two_s": round(two, 2),
            "alone_over_two": round(alone / two, 2)}


def _check_line(when: str, check: dict[str, float]) -> str:
    return (f"  machine check {when}: a memory-bound loop alone {check['alone_s']:.2f} CPU-s, "
            f"each of two at once {check['two_s']:.2f}: alone / two "
            f"{check['alone_over_two']:.2f} (above 1: a lone process is slowed, one worker's "
            f"figures with it)")


def part_workers(keys: int, path: str, runs: int) -> dict[str, list[dict[str, Any]]]:
    """The full scan with one worker and with two (the caller and one pool worker), alternated,
    in the variants of :data:`WORKER_VARIANTS`. The ratio is of the scan as a program times it
    (``open`` + the read, in the process); the process's wall (interpreter, imports, pool
    shutdown) is printed too."""
    out: dict[str, list[dict[str, Any]]] = {w: [] for w in WORKER_VARIANTS}
    env = _installed_env()
    subprocess.run([sys.executable, "-c", "import statequery.scan; "
                    "statequery.scan.warm_worker()"], env=env, check=True)  # bytecode cached
    print(f"\nworkers, canonical {keys:,} keys, every state: {path}", flush=True)
    checks = []
    for i in range(runs):
        checks.append(machine_check())
        print(_check_line(f"before round {i + 1}", checks[-1]), flush=True)
        for w, (n, flags) in WORKER_VARIANTS.items():
            r = measured(_child("scan", path, "", n, *flags), env)
            bench_vs_flink._check(f"workers={w}", r, bench_vs_flink.expected_counts(keys, 0))
            out[w].append(r)
            print(_line(f"workers={w}", r) + f"  scan {r['open_s'] + r['scan_s']:.2f} s",
                  flush=True)
    checks.append(machine_check())
    print(_check_line("after", checks[-1]), flush=True)
    scan = {w: sorted(x["open_s"] + x["scan_s"] for x in rs) for w, rs in out.items()}

    def ratio(one: str, two: str, pick: int) -> str:
        return f"{scan[one][pick] / scan[two][pick]:.2f}x"

    mid = (runs - 1) // 2
    print(f"  scan (open + read), best / median: a new process 1 worker {scan['1'][0]:.2f} / "
          f"{scan['1'][mid]:.2f} s, 2 workers {scan['2'][0]:.2f} / {scan['2'][mid]:.2f} s "
          f"({ratio('1', '2', 0)} / {ratio('1', '2', mid)}); a process that has read before "
          f"1 worker {scan['1-prepared'][0]:.2f} / {scan['1-prepared'][mid]:.2f} s, 2 workers "
          f"starting the pool {scan['2-prepared'][0]:.2f} / {scan['2-prepared'][mid]:.2f} s "
          f"({ratio('1-prepared', '2-prepared', 0)} / {ratio('1-prepared', '2-prepared', mid)}),"
          f" with the pool running {scan['2-warm'][0]:.2f} / {scan['2-warm'][mid]:.2f} s "
          f"({ratio('1-prepared', '2-warm', 0)} / {ratio('1-prepared', '2-warm', mid)}) "
          f"(meaningful on an idle machine only)", flush=True)

    def paired(one: str, two: str, steady: bool = False) -> str:
        """Run by run (neighbours in time: the machine drifts); ``steady``: only the rounds
        whose machine check (before and after) found a lone process not slowed."""
        rs = [a["open_s"] + a["scan_s"] for a in out[one]]
        ts = [b["open_s"] + b["scan_s"] for b in out[two]]
        ratios = sorted(a / b for i, (a, b) in enumerate(zip(rs, ts, strict=True))
                        if not steady or max(checks[i]["alone_over_two"],
                                             checks[i + 1]["alone_over_two"]) <= 1.0)
        if not ratios:
            return "none"
        return (f"{statistics.median(ratios):.2f}x (" + ", ".join(f"{r:.2f}" for r in ratios)
                + ")")

    print(f"  two workers against one, run by run, median (all): a new process "
          f"{paired('1', '2')}; a process that has read before, starting the pool "
          f"{paired('1-prepared', '2-prepared')}, with the pool running "
          f"{paired('1-prepared', '2-warm')}", flush=True)
    print(f"  the same, rounds whose machine checks (before and after) are at most 1: a new "
          f"process {paired('1', '2', True)}; starting the pool "
          f"{paired('1-prepared', '2-prepared', True)}, with the pool running "
          f"{paired('1-prepared', '2-warm', True)}", flush=True)
    out["machine_check"] = checks  # before and after the runs
    return out


def _spark_line(label: str, res: dict[str, Any]) -> str:
    cpu = res["scan_cpu_s"]
    driver = ""
    if "driver_jvm" in cpu:
        driver = (f"; driver JVM {cpu['driver_jvm']:.2f}, driver Python "
                  f"{cpu['driver_python']:.2f}")
    hwm = res.get("hwm_mb", {}).get("work", {})
    mem = "/".join(f"{h:.0f}" for h in hwm.get("jvm", []))
    pymem = "/".join(f"{h:.0f}" for h in hwm.get("python", []))
    return (f"  {label}: state count, {res['rows']:,} rows, {res['partitions']} partitions; "
            f"scans {', '.join(f'{s:.2f}' for s in res['scan_s'])} s wall, best scan CPU "
            f"{cpu['python'] + cpu['jvm']:.2f} s (Python {cpu['python']:.2f}, JVM "
            f"{cpu['jvm']:.2f}{driver}); VmHWM JVMs {mem or '-'} MB, Python {pymem or '-'} MB; "
            f"load {res['loadavg']}")


def part_spark(keys: int, path: str, extra: dict[str, str]) -> dict[str, Any]:
    import bench_spark

    out: dict[str, Any] = {}
    for dpath in ("jvm", "python"):
        conf = bench_spark._spark_conf("local[2]", {**bench_spark._path_conf(dpath), **extra})
        load = loadavg()
        t = time.perf_counter()
        res = bench_spark._run_child([json.dumps(conf), path, OPERATOR, "count", "2", "5", "7",
                                      str(keys)])
        res["child_wall_s"] = time.perf_counter() - t
        res["loadavg"] = load
        out[dpath] = res
        print(_spark_line(f"spark local[2] {dpath}", res), flush=True)
    # the same state through the Python API on one core, same minutes, for reference
    api = measured(_child("scan", path, "count", "1"))
    bench_vs_flink._check("statequery", api, {"count": keys})
    out["api"] = api
    print(_line("Python API, 1 worker", api), flush=True)
    return out


def _mb(size: str) -> int:
    """``768m`` / ``2g`` -> MB."""
    units = {"m": 1, "g": 1024}
    return int(float(size[:-1]) * units[size[-1].lower()]) if size[-1].lower() in units \
        else int(size)


def part_cluster(keys: int, path: str, executor_memory: str,
                 extra: dict[str, str]) -> dict[str, Any]:
    """The ``spark`` part's scan on a standalone cluster on loopback (tests/support/cluster.py):
    a master and two workers of one core each, one executor per worker, started for this
    savepoint and stopped after it. CPU: the executors (JVMs) and their Python workers, and the
    driver (its JVM and Python) apart."""
    import bench_spark

    sys.path.insert(0, REPO)
    from tests.support.cluster import StandaloneCluster

    out: dict[str, Any] = {}
    load = loadavg()
    t = time.perf_counter()
    with StandaloneCluster(workers=2, cores=1, worker_memory=f"{_mb(executor_memory) + 256}m",
                           lifetime=2400) as c:
        out["cluster_start_s"] = time.perf_counter() - t
        out["cluster_start_loadavg"] = load
        print(f"  cluster {c.master_url}: master and 2 workers of 1 core up in "
              f"{out['cluster_start_s']:.1f} s (load {load})", flush=True)
        env = dict(c.env, STATEQUERY_BENCH_CPU_ROOTS=",".join(str(p.pid) for p in c.procs))
        for dpath in ("jvm", "python"):
            conf = bench_spark._spark_conf(c.master_url, {
                **c.spark_conf(executor_memory=executor_memory),
                **bench_spark._path_conf(dpath), **extra,
            })
            load = loadavg()
            t = time.perf_counter()
            res = bench_spark._run_child([json.dumps(conf), path, OPERATOR, "count", "2", "5",
                                          "7", str(keys)], env=env)
            res["child_wall_s"] = time.perf_counter() - t
            res["loadavg"] = load
            out[dpath] = res
            print(_spark_line(f"spark cluster 2x1 {dpath}", res), flush=True)
    return out


def _pairs(values: list[str]) -> list[tuple[int, str]]:
    out = []
    for v in values:
        keys, _, path = v.partition("=")
        out.append((int(keys), path))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        if argv[1] == "scan":
            print(json.dumps(child_scan(argv[2], argv[3], int(argv[4]), "warm" in argv[5:],
                                        "prepared" in argv[5:])))
        else:
            print(json.dumps(child_lookup(argv[2], int(argv[3]), int(argv[4]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--canonical", action="append", default=[], help="KEYS=PATH")
    ap.add_argument("--native", action="append", default=[], help="KEYS=PATH (--append-every 10)")
    ap.add_argument("--chain", action="append", default=[],
                    help="KEYS=PATH of the last incremental checkpoint (--append-every 10)")
    ap.add_argument("--only", default="full,single,lookup,workers,spark,cluster")
    ap.add_argument("--flink", default="disk,preload", help="Flink variants: disk, preload")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--java-opt", action="append", default=[])
    ap.add_argument("--flink-python", default=os.environ.get("FLINK_PYTHON", sys.executable))
    ap.add_argument("--spark-conf", action="append", default=[],
                    help="KEY=VALUE added to the Spark settings of the spark and cluster parts "
                         "(spark.driver.memory=2g, ...)")
    ap.add_argument("--executor-memory", default="768m",
                    help="cluster part: each executor's memory (each worker offers 256m more)")
    ap.add_argument("--json", default="", help="append the results to this JSON file")
    ap.add_argument("--plot", default="", help="plot this JSON file (docs/img/scale.png)")
    ap.add_argument("--png", default=os.path.join(REPO, "docs", "img", "scale.png"))
    ap.add_argument("--table", default="", help="print this JSON file's figures as markdown")
    args = ap.parse_args(argv)
    if args.plot:
        plot(args.plot, args.png)
        return 0
    if args.table:
        table(args.table)
        return 0
    only = set(filter(None, args.only.split(",")))
    spark_extra = dict(kv.split("=", 1) for kv in args.spark_conf)
    flink_sides = [f"flink-{v.strip()}" for v in args.flink.split(",") if v.strip()]
    commit = subprocess.run(["git", "-C", REPO, "log", "-1", "--format=%h"],
                            capture_output=True, text=True).stdout.strip()
    print(f"statequery at {commit}; {os.cpu_count()} CPUs; load {loadavg()}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    cp = bench_vs_flink.flink_classpath(args.flink_python) if only & {"full", "single"} else ""
    results: list[dict[str, Any]] = []
    sets = [("canonical", k, p) for k, p in _pairs(args.canonical)]
    sets += [("native", k, p) for k, p in _pairs(args.native)]
    sets += [("chain", k, p) for k, p in _pairs(args.chain)]
    for kind, keys, path in sets:
        bench_vs_flink._page_cache(path)
        rec: dict[str, Any] = {"kind": kind, "keys": keys, "path": path, "commit": commit,
                               "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        if "full" in only:
            rec["full"] = part_scan(kind, keys, path, "", args.runs, cp, args.java_opt,
                                    flink_sides)
        if "single" in only and kind == "canonical":
            rec["single"] = part_scan(kind, keys, path, "count", args.runs, cp, args.java_opt,
                                      ["flink-disk"])
        if "lookup" in only:
            print(f"\nlookups, {kind} {keys:,} keys: {path}", flush=True)
            rec["lookup"] = part_lookup(keys, path, args.runs)
        if "workers" in only and kind == "canonical":
            rec["workers"] = part_workers(keys, path, max(args.runs, 2))
        if "spark" in only and kind == "canonical":
            print(f"\nspark, canonical {keys:,} keys: {path}", flush=True)
            rec["spark"] = part_spark(keys, path, spark_extra)
        if "cluster" in only and kind == "canonical":
            print(f"\nspark cluster (2 workers x 1 core), canonical {keys:,} keys: {path}",
                  flush=True)
            rec["cluster"] = part_cluster(keys, path, args.executor_memory, spark_extra)
        results.append(rec)
        if args.json:
            old: list[Any] = []
            if os.path.exists(args.json):
                with open(args.json, encoding="utf-8") as f:
                    old = json.load(f)
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump([*old, rec], f, indent=1)
    print(f"\nload at the end: {loadavg()}")
    return 0


# -- the tables (docs/performance.md) ------------------------------------------------------------


def work_cpu(side: str, r: dict[str, Any]) -> float:
    """CPU seconds of the work without interpreter or JVM start-up (bench_vs_flink's)."""
    if side == "statequery":
        return float(r["work_cpu_s"] + r["pool_cpu_s"])
    return bench_vs_flink._work_cpu(side, r)


def _records(json_path: str) -> list[dict[str, Any]]:
    out = []
    for path in json_path.split(","):
        with open(path, encoding="utf-8") as f:
            out += json.load(f)
    return out


def table(json_path: str) -> None:
    """Markdown rows: full scans and one state against Flink, lookups, workers (medians)."""
    records = _records(json_path)
    print("| savepoint, read | entries | statequery CPU s (work) | Flink from disk CPU s (work) "
          "| Flink preloaded CPU s (work) | Flink / statequery CPU (work) | wall s | VmHWM MB "
          "| load |")
    print("|---|---:|---:|---:|---:|---|---|---|---|")
    for r in records:
        for part in ("full", "single"):
            if part not in r:
                continue
            sides = r[part]["sides"]
            sq = sides["statequery"]
            med = {
                side: (_median(rs, "cpu_s"), statistics.median(work_cpu(side, x) for x in rs),
                       _median(rs, "wall_s"), _median(rs, "hwm_mb"))
                for side, rs in sides.items()
            }
            cells = []
            for side in ("flink-disk", "flink-preload"):
                m = med.get(side)
                cells.append(f"{m[0]:.2f} ({m[1]:.2f})" if m else "")
            ratios = ", ".join(
                f"{side[6:]} {med[side][0] / med['statequery'][0]:.1f}x "
                f"({med[side][1] / med['statequery'][1]:.1f}x)"
                for side in ("flink-disk", "flink-preload") if side in med
            )
            short = {"statequery": "sq", "flink-disk": "disk", "flink-preload": "preload"}
            walls = ", ".join(f"{short[side]} {m[2]:.1f}" for side, m in med.items())
            hwms = ", ".join(f"{short[side]} {m[3]:,.0f}" for side, m in med.items())
            loads = sorted({x["loadavg"].split()[0] for rs in sides.values() for x in rs})
            what = "every state" if part == "full" else "`count` only"
            print(f"| {r['keys'] / 1e6:g}M {r['kind']}, {what} | {sq[0]['entries']:,} | "
                  f"{med['statequery'][0]:.2f} ({med['statequery'][1]:.2f}) | {cells[0]} | "
                  f"{cells[1]} | {ratios} | {walls} | {hwms} | {loads[0]}-{loads[-1]} |")
    print()
    print("| savepoint | cold lookup CPU ms (wall) | warm, same key, CPU ms | warm, other keys of "
          "its key group | 20 random keys (each first in its key group, mostly) | VmHWM MB | "
          "load |")
    print("|---|---|---|---|---|---|---|")
    for r in records:
        for x in r.get("lookup", []):
            print(f"| {r['keys'] / 1e6:g}M {r['kind']} | {x['cold_cpu_ms']:.0f} "
                  f"({x['cold_wall_ms']:.0f}) | {x['warm_same_key_cpu_ms']:.2f} | "
                  f"{x['warm_same_group_cpu_ms']:.2f} | {x['random_keys_cpu_ms']:.1f} | "
                  f"{x['hwm_mb']:.0f} | {x['loadavg'].split()[0]} |")
    print()
    print("| savepoint | workers | scan s (process wall s) | CPU s: caller + workers | "
          "VmHWM MB: caller / workers | load |")
    print("|---|---:|---|---|---|---|")
    for r in records:
        for w, rs in r.get("workers", {}).items():
            if w == "machine_check":  # before and after the runs (machine_check())
                print(f"| {r['keys'] / 1e6:g}M {r['kind']} | machine check: alone / two | "
                      + ", ".join(f"{c['alone_over_two']:.2f}" for c in rs) + " | | | |")
                continue
            for x in rs:
                print(f"| {r['keys'] / 1e6:g}M {r['kind']} | {w} | "
                      f"{x['open_s'] + x['scan_s']:.2f} ({x['wall_s']:.1f}) | "
                      f"{x['proc_cpu_s']:.2f} + {x['pool_cpu_s']:.2f} | {x['hwm_mb']:.0f} / "
                      f"{'/'.join(f'{h:.0f}' for h in x['pool_hwm_mb']) or '-'} | "
                      f"{x['loadavg'].split()[0]} |")
    spark_rows = [(r, part, dpath, x) for r in records for part in ("spark", "cluster")
                  for dpath, x in r.get(part, {}).items()
                  if isinstance(x, dict) and "scan_cpu_s" in x]
    if spark_rows:
        print()
        print("| savepoint, `count` | Spark, source | rows | scans, wall s | best scan CPU s: "
              "JVMs + Python workers | driver JVM + Python CPU s | total CPU s | count(*) "
              "wall s | VmHWM MB: JVMs / Python workers | load |")
        print("|---|---|---:|---|---|---|---:|---|---|---|")
    for r, part, dpath, x in spark_rows:
        cpu = x["scan_cpu_s"]
        where = "`local[2]`" if part == "spark" else "cluster 2×1"
        driver = (f"{cpu['driver_jvm']:.2f} + {cpu['driver_python']:.2f}"
                  if "driver_jvm" in cpu else "(the same JVM)")
        total = sum(cpu.values())
        hwm = x.get("hwm_mb", {}).get("work", {})
        mem = (f"{'/'.join(f'{h:.0f}' for h in hwm.get('jvm', [])) or '-'} / "
               f"{'/'.join(f'{h:.0f}' for h in hwm.get('python', [])) or '-'}")
        print(f"| {r['keys'] / 1e6:g}M | {where}, {dpath} | {x['rows']:,} | "
              f"{', '.join(f'{s:.1f}' for s in x['scan_s'])} | {cpu['jvm']:.2f} + "
              f"{cpu['python']:.2f} | {driver} | {total:.2f} | "
              f"{', '.join(f'{s:.1f}' for s in x['count_s'])} | {mem} | "
              f"{x['loadavg'].split()[0]} |")
        if part == "spark" and dpath == "python" and "api" in r["spark"]:
            a = r["spark"]["api"]
            print(f"| {r['keys'] / 1e6:g}M | none: Python API, 1 worker | {a['entries']:,} | "
                  f"{a['scan_s']:.1f} | (process) | | {total_cpu(a):.2f} (open "
                  f"and scan {a['work_cpu_s']:.2f}) | | {a['hwm_mb']:.0f} | "
                  f"{a['loadavg'].split()[0]} |")


# -- the plot -------------------------------------------------------------------------------------


def _median(rs: list[dict[str, Any]], key: str) -> float:
    if key == "cpu_s":
        return float(statistics.median(total_cpu(r) for r in rs))
    return float(statistics.median(r[key] for r in rs))


def plot(json_path: str, png: str) -> None:
    """CPU seconds and peak memory of a full scan against the key count, statequery and Flink,
    per savepoint kind (the last record of each kind and size)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = _records(json_path)
    last: dict[tuple[str, int], dict[str, Any]] = {}
    for r in records:  # per kind ("canonical, 05:27" is canonical) and size, each side's last
        if "full" in r:
            kept = last.setdefault((r["kind"].split(",")[0], r["keys"]), {"full": {"sides": {}}})
            kept["full"]["sides"].update(r["full"]["sides"])
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(8, 3.2), dpi=80)
    colors = {"statequery": "tab:blue", "flink-disk": "tab:red", "flink-preload": "tab:orange"}
    kinds = {"canonical": "-o", "native": "--s", "chain": ":^"}
    for kind, style in kinds.items():
        sizes = sorted(k for (kd, k) in last if kd == kind)
        for side, color in colors.items():
            pts = [(k, last[(kind, k)]["full"]["sides"].get(side)) for k in sizes]
            pts = [(k, rs) for k, rs in pts if rs]
            if not pts:
                continue
            xs = [k / 1e6 for k, _ in pts]
            label = f"{kind}: {side}"
            ax_t.plot(xs, [_median(rs, "cpu_s") for _, rs in pts], style, color=color,
                      label=label)
            ax_m.plot(xs, [_median(rs, "hwm_mb") for _, rs in pts], style, color=color,
                      label=label)
    ax_t.set(xlabel="keys (millions)", ylabel="CPU seconds, full scan", yscale="log")
    ax_m.set(xlabel="keys (millions)", ylabel="peak RSS (VmHWM), MB", yscale="log")
    ax_m.axhline(400, color="grey", linewidth=0.8)
    for ax in (ax_t, ax_m):
        ax.grid(alpha=0.3)
    ax_t.legend(fontsize=6)
    fig.tight_layout()
    os.makedirs(os.path.dirname(png), exist_ok=True)
    fig.savefig(png)
    print(f"wrote {png} ({os.path.getsize(png):,} bytes)")


if __name__ == "__main__":
    raise SystemExit(main())
