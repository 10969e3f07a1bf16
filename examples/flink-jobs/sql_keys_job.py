"""The Flink SQL keys fixture job (PyFlink, streaming, parallelism 1): GROUP BY keys of every
common SQL type, with nulls, empty strings and bytes, NUL and non-BMP characters.

A handful of rows (``ROWS``), read by the filesystem connector in continuous mode (the source
never finishes), cast to typed columns in a view, and grouped six ways:

* ``(d DATE, amt DECIMAL(10, 2), b BYTES, flag BOOLEAN, s STRING)``: a composite key, nulls in
  every field;
* ``(amt)`` with ``COUNT(DISTINCT s)``: a DECIMAL key holding a map state (the distinct view);
* ``(d)``: a DATE key;
* ``(big DECIMAL(25, 4))``: a non-compact decimal;
* ``(ts3 TIMESTAMP(3), ts6 TIMESTAMP(6), ltz TIMESTAMP_LTZ(3), t TIME)``;
* ``(i8 TINYINT, i16 SMALLINT, i64 BIGINT, f32 FLOAT, f64 DOUBLE)``.

    python sql_keys_job.py --backend hashmap|rocksdb --kind savepoint-canonical|savepoint-native \
        --out DIR [--max-parallelism 128] [--settle 8]

Prints ``SNAPSHOT_PATH=<dir>`` and ``JOB_ID=<id>``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from pyflink.java_gateway import get_gateway
from pyflink.table import EnvironmentSettings, TableEnvironment

# one row per dict; a missing column is NULL
ROWS: list[dict] = [
    {"n": 1, "ds": "2024-01-01", "amt": "12.50", "bs": "ab", "flag": True, "s": "a",
     "big": "123456789012345678901.2345", "ts3": "2024-01-01 12:34:56.789",
     "ts6": "2024-01-01 12:34:56.123456", "ltz": 1704112496789, "t": "12:34:56",
     "i8": 1, "i16": 300, "i64": 5000000000, "f32": 1.5, "f64": 2.25},
    {"n": 2, "ds": "1969-12-31", "amt": "-0.01", "bs": "", "flag": False, "s": "",
     "big": "-1.0000", "ts3": "1969-12-31 23:59:59.999", "ts6": "1969-12-31 23:59:59.999999",
     "ltz": -1, "t": "00:00:00", "i8": -128, "i16": -32768, "i64": -1, "f32": -0.5,
     "f64": -1e-300},
    {"n": 3, "ds": "2024-02-29", "amt": "0.00", "bs": "longer than seven bytes",
     "flag": True, "s": "x\u0000y", "big": "0.0001", "ts3": "2000-01-01 00:00:00.000",
     "ts6": "2000-01-01 00:00:00.000001", "ltz": 0, "t": "23:59:59", "i8": 127,
     "i16": 0, "i64": 9223372036854775807, "f32": 0.0, "f64": 1e300},
    {"n": 4, "s": "\U0001F600 non-BMP"},
    {"n": 5, "ds": "2024-01-01", "amt": "12.50", "bs": "ab", "flag": True, "s": "a"},
    {"n": 6, "ds": "2024-01-01", "flag": False, "s": "longer-than-seven-bytes"},
    {"n": 7, "amt": "12.50", "bs": "ab", "s": "b"},
    {"n": 8, "ds": "1970-01-01", "amt": "99999999.99", "s": ""},
]

SOURCE = """CREATE TABLE rows_src (
    n BIGINT, ds STRING, amt STRING, bs STRING, flag BOOLEAN, s STRING, big STRING,
    ts3 STRING, ts6 STRING, ltz BIGINT, t STRING, i8 TINYINT, i16 SMALLINT, i64 BIGINT,
    f32 FLOAT, f64 DOUBLE
) WITH ('connector' = 'filesystem', 'path' = 'file://{path}', 'format' = 'json',
        'source.monitor-interval' = '1s')"""

VIEW = """CREATE TEMPORARY VIEW typed AS SELECT
    n, CAST(ds AS DATE) AS d, CAST(amt AS DECIMAL(10, 2)) AS amt, ENCODE(bs, 'UTF-8') AS b,
    flag, s, CAST(big AS DECIMAL(25, 4)) AS big, CAST(ts3 AS TIMESTAMP(3)) AS ts3,
    CAST(ts6 AS TIMESTAMP(6)) AS ts6, TO_TIMESTAMP_LTZ(ltz, 3) AS ltz,
    CAST(t AS TIME) AS t, i8, i16, i64, f32, f64
FROM rows_src"""


def sink(name: str, columns: str) -> str:
    return f"CREATE TABLE {name} ({columns}) WITH ('connector' = 'blackhole')"


QUERIES = [
    (sink("by_composite", "d DATE, amt DECIMAL(10, 2), b BYTES, flag BOOLEAN, s STRING, "
                          "cnt BIGINT, total BIGINT"),
     """INSERT INTO by_composite SELECT d, amt, b, flag, s, COUNT(*), SUM(n) FROM typed
        GROUP BY d, amt, b, flag, s"""),
    (sink("by_decimal", "amt DECIMAL(10, 2), strings BIGINT"),
     "INSERT INTO by_decimal SELECT amt, COUNT(DISTINCT s) FROM typed GROUP BY amt"),
    (sink("by_date", "d DATE, cnt BIGINT"),
     "INSERT INTO by_date SELECT d, COUNT(*) FROM typed GROUP BY d"),
    (sink("by_big", "big DECIMAL(25, 4), cnt BIGINT"),
     "INSERT INTO by_big SELECT big, COUNT(*) FROM typed GROUP BY big"),
    (sink("by_time", "ts3 TIMESTAMP(3), ts6 TIMESTAMP(6), ltz TIMESTAMP_LTZ(3), t TIME, "
                     "cnt BIGINT"),
     "INSERT INTO by_time SELECT ts3, ts6, ltz, t, COUNT(*) FROM typed GROUP BY ts3, ts6, ltz, t"),
    (sink("by_numbers", "i8 TINYINT, i16 SMALLINT, i64 BIGINT, f32 FLOAT, f64 DOUBLE, "
                        "cnt BIGINT"),
     """INSERT INTO by_numbers SELECT i8, i16, i64, f32, f64, COUNT(*) FROM typed
        GROUP BY i8, i16, i64, f32, f64"""),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["hashmap", "rocksdb"], required=True)
    ap.add_argument("--kind", choices=["savepoint-canonical", "savepoint-native"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-parallelism", type=int, default=128)
    ap.add_argument("--settle", type=float, default=8.0)
    args = ap.parse_args()

    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    out_uri = "file://" + out_dir
    input_dir = os.path.join(out_dir, "input", "rows")
    os.makedirs(input_dir, exist_ok=True)
    with open(os.path.join(input_dir, "rows.json"), "w") as f:
        for r in ROWS:
            f.write(json.dumps(r) + "\n")

    t_env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = t_env.get_config()
    settings = {
        "parallelism.default": "1",
        "pipeline.max-parallelism": str(args.max_parallelism),
        "state.backend.type": args.backend,
        "execution.checkpointing.storage": "filesystem",
        "execution.checkpointing.dir": out_uri,
        "execution.checkpointing.savepoint-dir": out_uri,
        "execution.checkpointing.local-backup.enabled": "false",
        "execution.checkpointing.data-inline-threshold": "0b",
        "table.exec.resource.default-parallelism": "1",
        "table.exec.mini-batch.enabled": "false",
        "table.local-time-zone": "UTC",
    }
    for k, v in settings.items():
        conf.set(k, v)
    t_env.execute_sql(SOURCE.format(path=input_dir))
    t_env.execute_sql(VIEW)
    j_set = t_env._j_tenv.createStatementSet()
    for ddl, insert in QUERIES:
        t_env.execute_sql(ddl)
        j_set.addInsertSql(insert)
    j_client = j_set.execute().getJobClient().get()
    job_id = j_client.getJobID().toString()
    print(f"JOB_ID={job_id}", flush=True)

    gateway = get_gateway()
    jvm = gateway.jvm
    field = j_client.getClass().getDeclaredField("miniCluster")
    field.setAccessible(True)
    mini_cluster = field.get(j_client)
    deadline = time.time() + 120
    while True:
        graph = mini_cluster.getExecutionGraph(j_client.getJobID()).get()
        states = {v.getName(): v.getAggregateState().toString()
                  for v in graph.getAllVertices().values()}
        if all(s == "RUNNING" for s in states.values()):
            break
        if any(s in ("FAILED", "CANCELED", "FINISHED") for s in states.values()) \
                or time.time() > deadline:
            raise SystemExit(f"job did not reach RUNNING: {states}")
        time.sleep(0.2)
    time.sleep(args.settle)  # file discovery (1 s) and processing of the few input rows

    fmt_enum = jvm.org.apache.flink.core.execution.SavepointFormatType
    fmt = fmt_enum.NATIVE if args.kind == "savepoint-native" else fmt_enum.CANONICAL
    path = j_client.triggerSavepoint(out_uri, fmt).get()
    if path.startswith("file:"):
        path = path[len("file:"):]
        while path.startswith("//"):
            path = path[1:]
    print(f"SNAPSHOT_PATH={path}", flush=True)
    j_client.cancel().get()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
