"""The driver program tests/spark/test_cluster.py submits to the standalone cluster.

    spark-submit --master spark://... tests/spark/cluster_job.py SPEC.json RESULT.pickle

SPEC is ``{"queries": [{"id": ..., "path": ..., "options": {...}}, ...]}``. For every query it
records, in RESULT (a pickle of plain Python values):

* ``rows``: ``spark.read.format("statequery").options(...).load(path).collect()`` as dicts,
* ``partitions``: the planned partition count, ``tasks``: the tasks the collect job ran
  (from Spark's status tracker),
* ``placement`` (queries with ``"placement": true``, which collect through the RDD API): for
  each partition, the working directory and pid of the process that read it (a standalone
  executor runs in ``<worker dir>/<app id>/<executor id>``) and its row count.

Only pyspark and the ``statequery`` data source (found statically) are used: this is what a user
submits to their own cluster.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
from typing import Any


def _with_placement(index: int, rows: Any) -> Any:
    rows = [r.asDict(recursive=True) for r in rows]
    yield (index, os.getcwd(), os.getpid(), rows)


def main(spec_path: str, out_path: str) -> None:
    from pyspark.sql import SparkSession

    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    started = time.monotonic()
    spark = SparkSession.builder.appName("statequery-cluster-test").getOrCreate()
    sc = spark.sparkContext
    tracker = sc.statusTracker()
    results: dict[str, Any] = {"executors": sc._jsc.sc().getExecutorMemoryStatus().size() - 1,
                               "session_s": time.monotonic() - started}
    for query in spec["queries"]:
        qid = query["id"]
        started = time.monotonic()
        df = spark.read.format("statequery").options(**query["options"]).load(query["path"])
        sc.setJobGroup(qid, qid)
        placement = None
        if query.get("placement"):  # rows read through the RDD API, with who read them
            parts = df.rdd.mapPartitionsWithIndex(_with_placement).collect()
            rows = [row for part in parts for row in part[3]]
            placement = sorted((i, cwd, pid, len(part)) for i, cwd, pid, part in parts)
        else:
            rows = [r.asDict(recursive=True) for r in df.collect()]
        tasks = 0
        for job_id in tracker.getJobIdsForGroup(qid):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else []:
                stage = tracker.getStageInfo(stage_id)
                tasks += stage.numTasks if stage is not None else 0
        results[qid] = {
            "rows": rows,
            "partitions": df.rdd.getNumPartitions(),
            "tasks": tasks,
            "placement": placement,
            "seconds": time.monotonic() - started,
        }
    spark.stop()
    with open(out_path, "wb") as f:
        pickle.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
