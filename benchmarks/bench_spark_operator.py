"""Spark: several states of one operator through their state tables vs the operator table
(prints figures; not a timed test).

    python benchmarks/bench_spark_operator.py /tmp/statequery-bench/hashmap-100k/savepoint-* \
        [--operator large-state] [--repeat 3] [--master local[2]]

In one Spark application (this process is the driver), alternating the two ways ``--repeat``
times after a warm-up of each:

* **every keyed state**: one ``noop`` write per state table, in sequence (what a report over
  every state costs today), against one ``noop`` write of the operator table (every state in one
  scan, each partition walking its key groups once);
* **a join of two states** (``--join``, default the first two value-like states): ``SELECT
  count(*)`` over the two state tables joined on ``key``, against a ``GROUP BY key`` over the
  operator table restricted to those two states.

Per way: wall seconds (median) and the CPU seconds of the driver JVM and the Python workers
(``/proc`` of this process's descendants), and the rows. The machine's cores are shared: compare
figures of one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_spark import _spark_conf, _tree_cpu  # noqa: E402


def _measure(fn: Any) -> tuple[float, dict[str, float], Any]:
    root = [os.getpid()]
    before = _tree_cpu(root)
    t = time.perf_counter()
    result = fn()
    wall = time.perf_counter() - t
    after = _tree_cpu(root)
    return wall, {k: after[k] - before[k] for k in after}, result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("savepoint")
    ap.add_argument("--operator", default="large-state")
    ap.add_argument("--join", default="", help="two state names, comma-separated")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    import statequery

    sp = statequery.open(args.savepoint)
    states = sp.operator_states(args.operator, keyed_only=True)
    table = sp.operator_table(args.operator)
    join = [n for n in args.join.split(",") if n] or [
        s.name for s in states if s.kind in ("value", "reducing", "aggregating")
    ][:2]
    cols = [table.columns[n] for n in join]

    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("statequery-bench-operator")
    for k, v in _spark_conf(args.master, {"spark.sql.shuffle.partitions": "4"}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()

    def state_df(name: str) -> Any:
        return (spark.read.format("statequery").option("operator", args.operator)
                .option("state", name).load(args.savepoint))

    def op_df(names: list[str] | None = None) -> Any:
        r = spark.read.format("statequery").option("operator", args.operator)
        if names:
            r = r.option("states", ",".join(names))
        return r.load(args.savepoint)

    def every_state_tables() -> int:
        for s in states:
            state_df(s.name).write.format("noop").mode("overwrite").save()
        return len(states)

    def every_state_operator() -> int:
        op_df().write.format("noop").mode("overwrite").save()
        return 1

    def join_tables() -> int:
        a, b = (state_df(n).selectExpr("key", "value AS v") for n in join)
        return int(a.join(b.withColumnRenamed("v", "w"), "key").count())

    def join_operator() -> int:
        df = op_df(join).selectExpr("key", f"`{cols[0]}`.value AS v", f"`{cols[1]}`.value AS w")
        grouped = df.groupBy("key").agg({"v": "max", "w": "max"})
        return int(grouped.where("`max(v)` IS NOT NULL AND `max(w)` IS NOT NULL").count())

    ways = {
        "every state, one table each": every_state_tables,
        "every state, operator table": every_state_operator,
        f"join {'+'.join(join)}, two tables": join_tables,
        f"join {'+'.join(join)}, operator table": join_operator,
    }
    for fn in ways.values():  # warm-up: page cache, Python workers, headers
        fn()
    runs: dict[str, list[tuple[float, dict[str, float], Any]]] = {w: [] for w in ways}
    for _ in range(args.repeat):
        for w, fn in ways.items():
            runs[w].append(_measure(fn))
    spark.stop()
    out: dict[str, Any] = {"savepoint": args.savepoint, "master": args.master,
                           "states": len(states), "load_avg": os.getloadavg(), "ways": {}}
    for w, rs in runs.items():
        wall = statistics.median(r[0] for r in rs)
        jvm = statistics.median(r[1]["jvm"] for r in rs)
        py = statistics.median(r[1]["python"] for r in rs)
        out["ways"][w] = {"wall_s": wall, "jvm_cpu_s": jvm, "python_cpu_s": py,
                          "result": rs[0][2]}
        print(f"{w:45s} wall {wall:7.2f} s   CPU jvm {jvm:6.2f} s + python {py:6.2f} s"
              f"   (result {rs[0][2]})", flush=True)
    print(f"load average {out['load_avg']}")
    if args.json:
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
