"""Spark benchmark of the ``statequery`` data source: prints figures (not a timed test).

    python benchmarks/make_large_savepoint.py --keys 1000000 --out /tmp/statequery-bench/hashmap
    python benchmarks/bench_spark.py /tmp/statequery-bench/hashmap/savepoint-* [--cluster] [--json]

Measures, next to the single-core Python API scan of the same state (``bench_canonical.py``'s
child, in a fresh process pinned to core 0; best of ``--api-runs``), for each data source path
of ``--paths`` (``python``: the Python data source; ``jvm``: statequery's columnar JVM data
source, :mod:`statequery.spark.jvm`):

* a full scan of one state through Spark on ``local[2]`` (and with ``--cluster`` on a standalone
  cluster of two 1-core workers on loopback, tests/support/cluster.py): the DataFrame is written to
  Spark's ``noop`` sink, so every row crosses from the Python reader into the JVM and nothing else
  is done with it; best and median of ``--repeat`` scans after a warm-up;
* a warm ``count()`` of the same DataFrame (a new one each time: planning included), best and
  median of ``--repeat``;
* warm single-key queries: ``spark.read.format("statequery").option("key", k)...collect()`` for
  ``--lookups`` random keys in the same session (planning included: a new DataFrame each time);
* ``spark-sql`` start-up to the first result: ``spark-sql -e "CREATE TEMPORARY VIEW ... USING
  statequery OPTIONS (..., key ...); SELECT ..."`` as a fresh process, wall clock to the line
  with the result and to exit.

Each Spark measurement runs in its own process (a fresh driver JVM). The machine's cores are
shared: read the figures as orders of magnitude, compare only figures of the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _spark_conf(master: str, extra: dict[str, str]) -> dict[str, str]:
    conf = {
        "spark.master": master,
        "spark.ui.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
    }
    conf.update(extra)
    return conf


def _descendants(roots: list[int]) -> dict[int, tuple[str, float]]:
    """``pid -> (command name, CPU seconds)`` of every live descendant of ``roots`` (Linux
    ``/proc``; the roots themselves left out): user + system, with its reaped children's."""
    ticks = os.sysconf("SC_CLK_TCK")
    procs: dict[int, tuple[int, str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                head, tail = f.read().rsplit(")", 1)
        except OSError:
            continue
        fields = tail.split()
        cpu = sum(int(x) for x in fields[11:15]) / ticks  # utime stime cutime cstime
        procs[int(entry)] = (int(fields[1]), head.split("(", 1)[1], cpu)
    out: dict[int, tuple[str, float]] = {}
    for pid, (_, comm, cpu) in procs.items():
        node = pid
        while node and node not in roots:
            node = procs.get(node, (0, "", 0.0))[0]
        if node and pid not in roots:
            out[pid] = (comm, cpu)
    return out


def _tree_cpu(roots: list[int]) -> dict[str, float]:
    """CPU seconds (user + system, with reaped children's) so far of the descendants of
    ``roots``: JVMs (driver, executors) and Python workers, by kind."""
    out = {"jvm": 0.0, "python": 0.0}
    for comm, cpu in _descendants(roots).values():
        out["jvm" if comm == "java" else "python"] += cpu
    return out


def _tree_hwm(roots: list[int]) -> dict[str, list[float]]:
    """Peak resident set (``VmHWM``, MB) of each live descendant of ``roots``, by kind (``jvm``,
    ``python``), largest first."""
    out: dict[str, list[float]] = {"jvm": [], "python": []}
    for pid, (comm, _) in _descendants(roots).items():
        try:
            with open(f"/proc/{pid}/status", encoding="ascii") as f:
                hwm = next((int(x.split()[1]) / 1024 for x in f if x.startswith("VmHWM:")), 0.0)
        except OSError:
            continue
        if hwm:  # kernel threads and exited processes have none
            out["jvm" if comm == "java" else "python"].append(round(hwm, 1))
    return {k: sorted(v, reverse=True) for k, v in out.items()}


def child_spark(
    conf: dict[str, str], path: str, operator: str, state: str, repeat: int, lookups: int,
    seed: int, keys_total: int,
) -> dict[str, Any]:
    """Scan and key-query figures of one Spark application (this process is its driver)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    t = time.perf_counter()
    builder = SparkSession.builder.appName("statequery-bench")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    session_s = time.perf_counter() - t

    def frame(**options: str) -> Any:
        return (spark.read.format("statequery").option("operator", operator)
                .option("state", state).options(**options).load(path))

    t = time.perf_counter()
    df = frame()
    partitions = df.rdd.getNumPartitions()
    rows = df.count()  # warm-up: page cache, Python workers, the savepoint's headers
    frame().write.format("noop").mode("overwrite").save()
    warmup_s = time.perf_counter() - t
    # the processes doing the work: this driver's JVM and Python workers (local mode), or the
    # cluster's workers with their executors (STATEQUERY_BENCH_CPU_ROOTS)
    roots = [int(p) for p in os.environ.get("STATEQUERY_BENCH_CPU_ROOTS", "").split(",") if p]
    roots = roots or [os.getpid()]
    me = [os.getpid()]

    def timed(run: Any) -> tuple[list[float], list[dict[str, float]]]:
        """Wall and CPU of each run: the work's processes (``jvm``, ``python``; in local mode
        the driver's JVM is the executor) and, on a cluster, the driver's apart (``driver_jvm``:
        its JVM; ``driver_python``: this process and its Python children, the JVM data
        source's planning worker)."""
        walls, cpu = [], []
        for _ in range(repeat):
            before, dbefore, c0 = _tree_cpu(roots), _tree_cpu(me), time.process_time()
            t = time.perf_counter()
            run()
            walls.append(time.perf_counter() - t)
            after, dafter = _tree_cpu(roots), _tree_cpu(me)
            cpu.append({k: after[k] - before[k] for k in after})
            if roots != me:
                cpu[-1]["driver_jvm"] = dafter["jvm"] - dbefore["jvm"]
                cpu[-1]["driver_python"] = (dafter["python"] - dbefore["python"]
                                            + time.process_time() - c0)
        return walls, cpu

    def count() -> None:
        assert frame().count() == rows

    loads = [os.getloadavg()[0]]
    scans, cpu = timed(lambda: frame().write.format("noop").mode("overwrite").save())
    counts, count_cpu = timed(count)
    loads.append(os.getloadavg()[0])

    rnd = random.Random(seed)
    keys = [f"user-{rnd.randrange(keys_total):07d}" for _ in range(lookups + 1)]
    latencies = []
    for i, key in enumerate(keys):
        t = time.perf_counter()
        got = frame(key=key).collect()
        dt = time.perf_counter() - t
        assert [r["key"] for r in got] == [key], (key, got)
        if i:  # the first one is the warm-up
            latencies.append(dt)
    hwm = {"work": _tree_hwm(roots), "driver": _tree_hwm(me) if roots != me else {}}
    spark.stop()
    best = min(scans)
    return {
        "master": conf["spark.master"],
        "path": "jvm" if "spark.jars" in conf else "python",
        "load": loads,
        "count_s": counts,
        "count_cpu_s": count_cpu[counts.index(min(counts))],
        "scan_s_median": statistics.median(scans),
        "count_s_median": statistics.median(counts),
        "partitions": partitions,
        "rows": rows,
        "session_s": session_s,
        "warmup_scan_s": warmup_s,
        "scan_s": scans,
        "rows_per_s": rows / best,
        "scan_cpu_s": cpu[scans.index(best)],
        "lookup_ms_median": 1000 * statistics.median(latencies),
        "lookup_ms_min": 1000 * min(latencies),
        "lookup_ms_max": 1000 * max(latencies),
        "lookups": len(latencies),
        "hwm_mb": hwm,
    }


def python_scan(path: str, operator: str, state: str) -> dict[str, Any]:
    """The single-core Python API scan, measured as bench_canonical.py measures it, in a process
    pinned to one core (``taskset -c 0`` where there is taskset)."""
    import resource
    import shutil

    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [*pin, sys.executable, str(HERE / "bench_canonical.py"), "--child", "scan", path,
         operator, state, "", "65536"],
        check=True, capture_output=True, text=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    res: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    # the whole child process: imports, open and headers included
    res["process_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return res


def _run_child(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", *args], capture_output=True, text=True,
        env=env or dict(os.environ),
    )
    if out.returncode:
        sys.stderr.write(out.stdout[-3000:] + out.stderr[-6000:])
        raise SystemExit(f"child {args[:1]} failed with {out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def spark_sql_startup(path: str, operator: str, state: str, key: str) -> dict[str, Any]:
    """Wall clock of a fresh ``spark-sql`` process: to the result line, and to exit."""
    import pyspark

    binary = Path(pyspark.__file__).parent / "bin" / "spark-sql"
    sql = (
        f"CREATE TEMPORARY VIEW v USING statequery OPTIONS (path '{path}', "
        f"operator '{operator}', state '{state}', key '{key}'); "
        "SELECT key, value FROM v;"
    )
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    cmd = [str(binary), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
           "--conf", "spark.driver.host=127.0.0.1", "-e", sql]
    with open(os.devnull, "wb") as devnull:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="statequery-bench-sql-") as cwd:
            t = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=devnull, cwd=cwd,
                                    env=env, text=True)
            first = None
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith(key) and first is None:
                    first = time.perf_counter() - t
            proc.wait()
            total = time.perf_counter() - t
    if proc.returncode or first is None:
        raise SystemExit(f"spark-sql failed (exit {proc.returncode}) or printed no {key!r}")
    return {"first_result_s": first, "exit_s": total}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        conf = json.loads(argv[1])
        res = child_spark(conf, argv[2], argv[3], argv[4], int(argv[5]), int(argv[6]),
                          int(argv[7]), int(argv[8]))
        print(json.dumps(res))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("savepoint")
    ap.add_argument("--operator", default="large-state")
    ap.add_argument("--state", default="count")
    ap.add_argument("--keys", type=int, default=1_000_000, help="keys in the savepoint")
    ap.add_argument("--repeat", type=int, default=2, help="timed scans after the warm-up")
    ap.add_argument("--lookups", type=int, default=20)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--cluster", action="store_true", help="also on a 2-worker cluster")
    ap.add_argument("--skip", default="", help="comma list of: python, local, cluster, sql")
    ap.add_argument(
        "--paths", default="python,jvm",
        help="the data source paths to measure on Spark: python (the Python data source), jvm "
             "(statequery's columnar JVM data source, statequery.spark.jvm)",
    )
    ap.add_argument("--api-runs", type=int, default=3,
                    help="single-core Python API scans (fresh processes, pinned to core 0)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    common = [args.savepoint, args.operator, args.state, str(args.repeat), str(args.lookups),
              str(args.seed), str(args.keys)]
    out: dict[str, Any] = {"savepoint": args.savepoint, "state": args.state}

    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if "python" not in skip:
        runs = [python_scan(args.savepoint, args.operator, args.state)
                for _ in range(max(1, args.api_runs))]
        out["python"] = py = min(runs, key=lambda r: r["seconds"])
        py["seconds_all"] = [r["seconds"] for r in runs]
        print(f"python, 1 core : {py['rows']:,} rows in {py['seconds']:.2f} s = "
              f"{py['rows_per_s']:,.0f} rows/s (scan CPU {py['cpu_s']:.2f} s; all runs "
              + ", ".join(f"{r['seconds']:.2f}" for r in runs) + " s)",
              flush=True)
    if "local" not in skip:
        for path in paths:
            conf = _spark_conf("local[2]", _path_conf(path))
            key = "local" if path == "python" else f"local_{path}"
            out[key] = res = _run_child([json.dumps(conf), *common])
            _print_spark(f"spark local[2], {path} path", res)
    if args.cluster and "cluster" not in skip:
        sys.path.insert(0, str(ROOT))
        from tests.support.cluster import StandaloneCluster

        t = time.perf_counter()
        with StandaloneCluster(workers=2, cores=1, worker_memory="1g", lifetime=900) as c:
            start_s = time.perf_counter() - t
            env = dict(c.env, STATEQUERY_BENCH_CPU_ROOTS=",".join(str(p.pid) for p in c.procs))
            for path in paths:
                conf = _spark_conf(
                    c.master_url, {**c.spark_conf(executor_memory="768m"), **_path_conf(path)}
                )
                key = "cluster" if path == "python" else f"cluster_{path}"
                out[key] = res = _run_child([json.dumps(conf), *common], env=env)
                res["cluster_start_s"] = start_s
                _print_spark(f"spark cluster 2x1, {path} path", res)
        print(f"  (cluster start-up {start_s:.1f} s)")
    if "sql" not in skip:
        key = f"user-{random.Random(args.seed).randrange(args.keys):07d}"
        out["spark_sql"] = res = spark_sql_startup(
            args.savepoint, args.operator, args.state, key
        )
        print(f"spark-sql -e (key {key}): first result {res['first_result_s']:.1f} s, "
              f"exit {res['exit_s']:.1f} s", flush=True)
    if args.json:
        print(json.dumps(out, indent=2))
    return 0


def _path_conf(path: str) -> dict[str, str]:
    """The settings of a data source path: the JVM data source's jar, or nothing."""
    if path == "python":
        return {}
    if path != "jvm":
        raise SystemExit(f"--paths: unknown path {path!r} (python, jvm)")
    sys.path.insert(0, str(ROOT))
    from statequery.spark.jvm import session_conf

    conf = session_conf(enabled=True)
    if not conf:
        raise SystemExit("the statequery Spark jar could not be built (javac?)")
    return conf


def _print_spark(label: str, res: dict[str, Any]) -> None:
    scans = ", ".join(f"{s:.2f}" for s in res["scan_s"])
    print(
        f"{label}: {res['rows']:,} rows, {res['partitions']} partitions; scans {scans} s "
        f"(warm-up {res['warmup_scan_s']:.2f} s) = {res['rows_per_s']:,.0f} rows/s best; "
        f"key query median {res['lookup_ms_median']:.0f} ms "
        f"(min {res['lookup_ms_min']:.0f}, max {res['lookup_ms_max']:.0f}, "
        f"{res['lookups']} keys); session start {res['session_s']:.1f} s",
        flush=True,
    )
    cpu = res["scan_cpu_s"]
    print(f"  best scan CPU: Python workers {cpu['python']:.2f} s, JVMs {cpu['jvm']:.2f} s "
          f"(local: the driver; cluster: the executors, the daemons not counted); "
          f"median scan {res['scan_s_median']:.2f} s")
    cpu = res["count_cpu_s"]
    counts = ", ".join(f"{s:.2f}" for s in res["count_s"])
    print(f"  count(*): {counts} s, best {min(res['count_s']):.2f} s, median "
          f"{res['count_s_median']:.2f} s; best CPU: Python {cpu['python']:.2f} s, JVMs "
          f"{cpu['jvm']:.2f} s; load average {res['load'][0]:.1f}-{res['load'][1]:.1f}")


if __name__ == "__main__":
    raise SystemExit(main())
