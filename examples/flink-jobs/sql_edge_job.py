"""The edge-value Flink SQL fixture job (PyFlink, streaming, parallelism 1, max parallelism 300).

Input: ``EDGE_ROWS`` (below), one JSON line each, read by the filesystem connector in continuous
mode (the source never finishes). Every typed column is CAST from a string in the view ``typed``:
DECIMAL(38, 10) at its largest and smallest, compact DECIMAL(18, 4), TIMESTAMP(9) and
TIMESTAMP_LTZ(9) from year 1 to 9999 and just before 1970, DATE and TIME at their extremes,
BYTES (empty, NUL, non-ASCII), FLOAT/DOUBLE NaN, infinities, -0.0 and subnormals, strings that are
empty, NUL, supplementary, of several scripts, and NULL in every column. Mini-batch is on
(``table.exec.mini-batch.*``). Statements (one statement set, blackhole sinks):

* ``agg_keys``: GROUP BY a composite key (STRING, DATE, DECIMAL(38, 10), BYTES, BOOLEAN) with
  NULLs, COUNT(*), LISTAGG, COUNT(DISTINCT), MAX/MIN of TIMESTAMP(9), TIMESTAMP_LTZ(9),
  DECIMAL(18, 4), TIME, SUM(DECIMAL(18, 4));
* ``agg_words``: GROUP BY s2 (includes '' and NULL), LISTAGG with a delimiter, COUNT(DISTINCT)
  of STRING and of DECIMAL(38, 10) (COUNT(DISTINCT) of BYTES is not supported by Flink);
* ``session``: SESSION window TVF aggregation per s;
* ``over_rows``: OVER (PARTITION BY s ORDER BY rowtime ROWS 2 PRECEDING) over every column;
* ``join_bytes``: a regular join on the BYTES column (empty bytes match).

The rowtime is ``1700000000000 + id * 1000`` ms with a one-day watermark delay: no window or OVER
frame fires. Once the job runs it waits ``--settle`` seconds and takes a savepoint (canonical or
native) or a retained checkpoint, then cancels.

    python sql_edge_job.py --backend hashmap|rocksdb \
        --kind savepoint-canonical|savepoint-native|checkpoint --out DIR [--incremental] \
        [--max-parallelism 300]

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

TS_BASE = 1_700_000_000_000
D38_MAX = "9999999999999999999999999999.9999999999"
D18_MAX = "99999999999999.9999"

# id, s, s2, bs (CAST to BYTES: UTF-8), dec38, dec18, ts9, ltz9, d, t, flag, i, l, f, dbl
_COLS = ["id", "s", "s2", "bs", "dec38", "dec18", "ts9", "ltz9", "d", "t", "flag", "i", "l", "f",
         "dbl"]
EDGE_ROWS = [dict(zip(_COLS, r, strict=True)) for r in [
    (0, "", "a", "", D38_MAX, D18_MAX, "9999-12-31 23:59:59.999999999",
     "1969-12-31 23:59:59.999999999", "9999-12-31", "23:59:59.999", True, 2147483647,
     9223372036854775807, "NaN", "-0.0"),
    (1, "", "", "", D38_MAX, "-" + D18_MAX, "0001-01-01 00:00:00", "0001-01-01 00:00:00",
     "9999-12-31", "00:00:00", True, -2147483648, -9223372036854775808, "-Infinity", "4.9E-324"),
    (2, None, "\u0000", None, None, None, None, None, None, None, None, None, 0, "-0.0", "NaN"),
    (3, None, "\U0001D11E", None, None, None, None, None, None, None, None, None, -1, "1.4E-45",
     "Infinity"),
    (4, "\u0000", "东京", "\u0000", "-" + D38_MAX, "0.0001", "1969-12-31 23:59:59.999999999",
     "1970-01-01 00:00:00", "1969-12-31", "00:00:00.001", False, 0, 1, "3.4028235E38",
     "1.7976931348623157E308"),
    (5, "\U0001D11E", "Ω≈ç√", "\U0001D11E", "0.0000000001", "-0.0001",
     "1970-01-01 00:00:00.000000001", "1900-01-01 00:00:00.123456789", "0001-01-01", "12:00:00",
     True, -1, 42, "0.1", "0.1"),
    (6, "东京", "مرحبا بالعالم", "ÿ", "0", "0", "2024-02-29 12:34:56.123456789",
     "2024-02-29 12:34:56.123456789", "1970-01-01", "23:59:59", False, 7, -42, "-1.0E-40",
     "-2.2250738585072014E-308"),
    (7, "Ω≈ç√", "नमस्ते दुनिया", "a\u0000b", "-0.0000000001", D18_MAX,
     "1899-12-31 23:59:59.999999999", "9999-12-31 23:59:59.999999999", "1899-12-31", "00:00:00",
     None, None, 100, "Infinity", "-Infinity"),
    (8, "مرحبا بالعالم", "😀🎉👍🏽", "", "12345678901234567890.1234567890", "-0.0001",
     None, "1970-01-01 00:00:00.000000001", "2000-01-01", None, True, 1, 2, None, None),
    (9, "नमस्ते दुनिया", "", None, None, None, "1970-01-01 00:00:00", None, None, "23:59:59.999",
     False, None, 3, "0.0", "0.0"),
    (10, "😀🎉👍🏽", None, "😀", D38_MAX, "1.5", "2262-04-11 23:47:16.854775807",
     "1677-09-21 00:12:43.145224192", "2262-04-11", "01:02:03.004", True, 5, 4, "1.0", "1.0"),
    (11, "", "\u0000", "", D38_MAX, "2.25", "1970-01-01 00:00:00", "1970-01-01 00:00:00",
     "9999-12-31", "00:00:00", True, 6, 5, "2.0", "2.0"),
    (12, "", "a", "", D38_MAX, "0.0001", "1970-01-01 00:00:00", "1970-01-01 00:00:00",
     "1970-01-01", "00:00:00", True, 8, 6, "3.0", "3.0"),
    (13, "x", "b", None, "1.0000000000", "1", "2000-01-01 00:00:00", "2000-01-01 00:00:00",
     None, "00:00:00", True, 9, 7, "4.0", "4.0"),
    (14, "x", "c", None, "1", "1", "2000-01-01 00:00:00", "2000-01-01 00:00:00",
     None, "00:00:00", True, 10, 8, "5.0", "5.0"),
]]


def write_input(root: str) -> str:
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "edge.json"), "w") as f:
        for r in EDGE_ROWS:
            f.write(json.dumps({**r, "ts": TS_BASE + r["id"] * 1000}) + "\n")
    return root


def ddl(input_dir: str) -> list[str]:
    return [
        f"""CREATE TABLE edge_raw (
            id BIGINT, s STRING, s2 STRING, bs STRING, dec38 STRING, dec18 STRING, ts9 STRING,
            ltz9 STRING, d STRING, t STRING, flag BOOLEAN, i INT, l BIGINT, f STRING, dbl STRING,
            ts BIGINT,
            rt AS TO_TIMESTAMP_LTZ(ts, 3),
            WATERMARK FOR rt AS rt - INTERVAL '1' DAY
        ) WITH ('connector' = 'filesystem', 'path' = 'file://{input_dir}', 'format' = 'json',
                'source.monitor-interval' = '1s')""",
        """CREATE VIEW typed AS SELECT id, s, s2, CAST(bs AS BYTES) AS b,
            CAST(dec38 AS DECIMAL(38, 10)) AS dec38, CAST(dec18 AS DECIMAL(18, 4)) AS dec18,
            CAST(ts9 AS TIMESTAMP(9)) AS ts9, CAST(ltz9 AS TIMESTAMP_LTZ(9)) AS ltz9,
            CAST(d AS DATE) AS d, CAST(t AS TIME(3)) AS t, flag, i, l,
            CAST(f AS FLOAT) AS f, CAST(dbl AS DOUBLE) AS dbl, rt
            FROM edge_raw""",
    ]


STATEMENTS = [
    ("""CREATE TABLE agg_keys (s STRING, d DATE, dec38 DECIMAL(38, 10), b BYTES, flag BOOLEAN,
        cnt BIGINT, words STRING, distinct_words BIGINT, max_ts9 TIMESTAMP(9),
        min_ltz9 TIMESTAMP_LTZ(9), max_dec18 DECIMAL(18, 4), min_t TIME(3),
        sum_dec18 DECIMAL(38, 4), max_i INT, min_l BIGINT) WITH ('connector' = 'blackhole')""",
     """INSERT INTO agg_keys SELECT s, d, dec38, b, flag, COUNT(*), LISTAGG(s2),
        COUNT(DISTINCT s2), MAX(ts9), MIN(ltz9), MAX(dec18), MIN(t), SUM(dec18), MAX(i), MIN(l)
        FROM typed GROUP BY s, d, dec38, b, flag"""),
    ("""CREATE TABLE agg_words (s2 STRING, names STRING, distinct_s BIGINT, distinct_dec38 BIGINT,
        max_dec38 DECIMAL(38, 10), cnt BIGINT) WITH ('connector' = 'blackhole')""",
     """INSERT INTO agg_words SELECT s2, LISTAGG(s, '|'), COUNT(DISTINCT s),
        COUNT(DISTINCT dec38), MAX(dec38), COUNT(*)
        FROM typed GROUP BY s2"""),
    ("""CREATE TABLE session_agg (s STRING, window_start TIMESTAMP(3), window_end TIMESTAMP(3),
        cnt BIGINT, max_dec38 DECIMAL(38, 10), words STRING) WITH ('connector' = 'blackhole')""",
     """INSERT INTO session_agg SELECT s, window_start, window_end, COUNT(*), MAX(dec38),
        LISTAGG(s2)
        FROM TABLE(SESSION(TABLE typed PARTITION BY s, DESCRIPTOR(rt), INTERVAL '5' MINUTE))
        GROUP BY s, window_start, window_end"""),
    ("""CREATE TABLE over_rows (s STRING, b BYTES, dec38 DECIMAL(38, 10), dec18 DECIMAL(18, 4),
        ts9 TIMESTAMP(9), ltz9 TIMESTAMP_LTZ(9), d DATE, t TIME(3), flag BOOLEAN, i INT, l BIGINT,
        f FLOAT, dbl DOUBLE, sum_l BIGINT, cnt_s2 BIGINT, max_dec38 DECIMAL(38, 10))
        WITH ('connector' = 'blackhole')""",
     """INSERT INTO over_rows SELECT s, b, dec38, dec18, ts9, ltz9, d, t, flag, i, l, f, dbl,
        SUM(l) OVER w, COUNT(s2) OVER w, MAX(dec38) OVER w
        FROM typed
        WINDOW w AS (PARTITION BY s ORDER BY rt ROWS BETWEEN 2 PRECEDING AND CURRENT ROW)"""),
    ("""CREATE TABLE join_bytes (s STRING, b BYTES, b2 BYTES, dec38 DECIMAL(38, 10),
        ts9 TIMESTAMP(9), f FLOAT, dbl DOUBLE) WITH ('connector' = 'blackhole')""",
     """INSERT INTO join_bytes SELECT a.s, a.b, c.b, a.dec38, c.ts9, a.f, c.dbl
        FROM typed a JOIN (SELECT * FROM typed WHERE id < 8) c ON a.b = c.b"""),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["hashmap", "rocksdb"], required=True)
    ap.add_argument("--kind", choices=["savepoint-canonical", "savepoint-native", "checkpoint"],
                    required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--incremental", action="store_true")
    ap.add_argument("--max-parallelism", type=int, default=300)
    ap.add_argument("--settle", type=float, default=8.0)
    ap.add_argument("--plan", help="write the compiled plan here")
    args = ap.parse_args()

    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    out_uri = "file://" + out_dir
    input_dir = write_input(os.path.join(out_dir, "input"))

    t_env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = t_env.get_config()
    settings = {
        "parallelism.default": "1",
        "pipeline.max-parallelism": str(args.max_parallelism),
        "state.backend.type": args.backend,
        "execution.checkpointing.incremental": str(args.incremental).lower(),
        "execution.checkpointing.storage": "filesystem",
        "execution.checkpointing.dir": out_uri,
        "execution.checkpointing.savepoint-dir": out_uri,
        "execution.checkpointing.local-backup.enabled": "false",
        "execution.checkpointing.data-inline-threshold": "0b",
        "table.exec.resource.default-parallelism": "1",
        "table.local-time-zone": "UTC",
        "table.exec.mini-batch.enabled": "true",
        "table.exec.mini-batch.allow-latency": "1s",
        "table.exec.mini-batch.size": "1000",
    }
    checkpoint = args.kind == "checkpoint"
    if checkpoint:
        settings.update({
            "execution.checkpointing.interval": "1h",
            "execution.checkpointing.min-pause": "1h",
            "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        })
    for k, v in settings.items():
        conf.set(k, v)
    for stmt in ddl(input_dir):
        t_env.execute_sql(stmt)
    j_set = t_env._j_tenv.createStatementSet()
    for create, insert in STATEMENTS:
        t_env.execute_sql(create)
        j_set.addInsertSql(insert)
    plan = j_set.compilePlan()
    if args.plan:
        with open(args.plan, "w") as f:
            f.write(plan.asJsonString())
    j_client = plan.execute().getJobClient().get()
    job_id = j_client.getJobID().toString()
    print(f"JOB_ID={job_id}", flush=True)

    jvm = get_gateway().jvm
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
    time.sleep(args.settle)  # file discovery (1 s), the rows, the mini-batch flush (1 s)

    if checkpoint:
        ctype = jvm.org.apache.flink.core.execution.CheckpointType.CONFIGURED
        chk = mini_cluster.triggerCheckpoint(j_client.getJobID(), ctype).get()
        path = os.path.join(out_dir, job_id, f"chk-{chk}")
    else:
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
