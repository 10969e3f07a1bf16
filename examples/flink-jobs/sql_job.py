"""The Flink SQL fixture job (PyFlink TableEnvironment, streaming mode, parallelism 2).

Input: a bounded datagen sequence id = 1..500, UNION ALL an unbounded keep-alive datagen
(1 row/s, ids >= 1) filtered to nothing, so the job keeps running after the bounded part ends.
One GROUP BY aggregation into a blackhole sink. Once the bounded source subtasks are FINISHED
(plus a grace period) it takes one savepoint through the Java JobClient, cancels the job and
prints ``SNAPSHOT_PATH=<dir>`` and ``JOB_ID=<id>``.

    python sql_job.py --backend hashmap|rocksdb --kind savepoint-canonical|savepoint-native \
        --out DIR [--incremental] [--max-parallelism 128] [--compression] [--inline]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from pyflink.java_gateway import get_gateway
from pyflink.table import EnvironmentSettings, TableEnvironment

N_ROWS = 500

DDL = [
    f"""CREATE TABLE src_bounded (id BIGINT) WITH (
        'connector' = 'datagen', 'rows-per-second' = '10000',
        'fields.id.kind' = 'sequence', 'fields.id.start' = '1', 'fields.id.end' = '{N_ROWS}')""",
    """CREATE TABLE src_keepalive (id BIGINT) WITH (
        'connector' = 'datagen', 'rows-per-second' = '1',
        'fields.id.kind' = 'random', 'fields.id.min' = '1', 'fields.id.max' = '1000000')""",
    """CREATE TABLE sink (
        word STRING, cnt BIGINT, total BIGINT, distinct_mod5 BIGINT,
        max_quarter DECIMAL(12, 2), max_big DECIMAL(30, 6), max_ts TIMESTAMP(6), max_label STRING
    ) WITH ('connector' = 'blackhole')""",
]

QUERY = """
INSERT INTO sink
SELECT
    word,
    COUNT(*),
    SUM(id),
    COUNT(DISTINCT MOD(id, 5)),
    MAX(CAST(CAST(id AS DECIMAL(10, 2)) / 4 AS DECIMAL(12, 2))),
    MAX(CAST(id AS DECIMAL(30, 6))),
    MAX(TIMESTAMPADD(SECOND, CAST(id AS INT), TIMESTAMP '2024-01-01 00:00:00.123456')),
    MAX(CONCAT('longer-than-seven-', CAST(id AS STRING)))
FROM (
    SELECT CONCAT('w', CAST(MOD(id, 17) AS STRING)) AS word, id
    FROM (
        SELECT id FROM src_bounded
        UNION ALL
        SELECT id FROM src_keepalive WHERE id < 0
    )
)
GROUP BY word
"""


# With --async-state: COUNT(MOD(id, 5)) for the distinct count, whose state-backed MapView the
# asynchronous group aggregation does not support (the planner would fall back to the
# synchronous operator): the accumulator row has 7 fields, all in one State V2 value state.
ASYNC_QUERY = QUERY.replace("COUNT(DISTINCT MOD(id, 5))", "COUNT(MOD(id, 5))")
assert ASYNC_QUERY != QUERY


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["hashmap", "rocksdb", "forst"], required=True)
    ap.add_argument("--kind", choices=["savepoint-canonical", "savepoint-native"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--incremental", action="store_true")
    ap.add_argument("--max-parallelism", type=int, default=128)
    ap.add_argument("--compression", action="store_true")
    ap.add_argument("--inline", action="store_true")
    ap.add_argument("--async-state", action="store_true",
                    help="table.exec.async-state.enabled: the operators on State V2 (ForSt)")
    args = ap.parse_args()

    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    out_uri = "file://" + out_dir

    t_env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = t_env.get_config()
    settings = {
        "parallelism.default": "2",
        "pipeline.max-parallelism": str(args.max_parallelism),
        "state.backend.type": args.backend,
        "execution.checkpointing.incremental": str(args.incremental).lower(),
        "execution.checkpointing.storage": "filesystem",
        "execution.checkpointing.dir": out_uri,
        "execution.checkpointing.savepoint-dir": out_uri,
        "execution.checkpointing.snapshot-compression": str(args.compression).lower(),
        "execution.checkpointing.local-backup.enabled": "false",
        "table.exec.mini-batch.enabled": "false",
        "table.exec.resource.default-parallelism": "2",
    }
    if args.async_state:
        settings["table.exec.async-state.enabled"] = "true"
    if not args.inline:
        settings["execution.checkpointing.data-inline-threshold"] = "0b"
    for k, v in settings.items():
        conf.set(k, v)
    for stmt in DDL:
        t_env.execute_sql(stmt)

    result = t_env.execute_sql(ASYNC_QUERY if args.async_state else QUERY)
    j_client = result.get_job_client()._j_job_client
    job_id = j_client.getJobID().toString()
    print(f"JOB_ID={job_id}", flush=True)

    gateway = get_gateway()
    jvm = gateway.jvm
    # The local JobClient (MiniClusterJobClient) keeps its MiniCluster in a private field.
    field = j_client.getClass().getDeclaredField("miniCluster")
    field.setAccessible(True)
    mini_cluster = field.get(j_client)

    deadline = time.time() + 180
    while True:
        graph = mini_cluster.getExecutionGraph(j_client.getJobID()).get()
        states = {
            v.getName(): v.getAggregateState().toString()
            for v in graph.getAllVertices().values()
        }
        bounded = [s for name, s in states.items() if "src_bounded" in name]
        if not bounded:
            raise SystemExit(f"no src_bounded vertex in {states}")
        if all(s == "FINISHED" for s in bounded):
            break
        if any(s in ("FAILED", "CANCELED") for s in states.values()) or time.time() > deadline:
            raise SystemExit(f"job did not reach the expected state: {states}")
        time.sleep(0.2)
    time.sleep(3)  # grace: the aggregation drains the last buffers of the finished source

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
