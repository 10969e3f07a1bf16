"""The data source on a real Spark standalone cluster: a master and two workers on loopback
(tests/support/cluster.py), one executor each, a driver submitted with ``spark-submit``, savepoints
on a local path both workers see and in an S3 bucket served by moto (tests/support/s3server.py).

Checks: partitions spread over both executors, a ``key`` read plans and runs one task, and every
result equals the Python API's ``statequery.open(path).read(...)``.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.cluster import StandaloneCluster, spark_home
from support.s3server import S3Server, moto_s3_server

import statequery
from statequery.spark.jvm import session_conf
from tests.conftest import fixture_dir

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

CANONICAL = "datastream-hashmap-canonical"
ROCKSDB = "datastream-rocksdb-native"
JOB = Path(__file__).with_name("cluster_job.py")


def _queries(s3_canonical: str, s3_rocksdb: str) -> list[dict[str, Any]]:
    local = str(fixture_dir(CANONICAL))
    per16 = {"key_groups_per_partition": "16"}
    spread = {"placement": True}
    return [
        {"id": "local-count", "path": local,
         "options": {"operator": "user-state", "state": "count", **per16}, **spread},
        {"id": "local-profile", "path": local,
         "options": {"operator": "user-state", "state": "profile"}},
        {"id": "local-key", "path": local,
         "options": {"operator": "user-state", "state": "count", "key": "user-3"}},
        {"id": "s3-meta", "path": s3_canonical, "options": {}},
        {"id": "s3-count", "path": s3_canonical,
         "options": {"operator": "user-state", "state": "count", **per16}, **spread},
        {"id": "s3-recent", "path": s3_canonical,
         "options": {"operator": "user-state", "state": "recent-categories", "mode": "flat"}},
        {"id": "s3-rocksdb-profile", "path": s3_rocksdb,
         "options": {"operator": "user-state", "state": "profile", **per16}, **spread},
        {"id": "s3-rocksdb-key", "path": s3_rocksdb,
         "options": {"operator": "user-state", "state": "count", "key": "user-3"}},
    ]


@pytest.fixture(scope="module")
def s3() -> Any:
    with moto_s3_server() as server:
        yield server


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with StandaloneCluster(
        workers=2, cores=1, worker_memory="768m", lifetime=600,
        base_dir=tmp_path_factory.mktemp("spark-cluster"),
    ) as c:
        yield c


@pytest.fixture(scope="module")
def run(cluster: StandaloneCluster, s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Submit cluster_job.py once with every query; its results, keyed by query id."""
    tmp = tmp_path_factory.mktemp("cluster-job")
    queries = _queries(
        s3.upload_tree(fixture_dir(CANONICAL), "savepoints/canonical"),
        s3.upload_tree(fixture_dir(ROCKSDB), "savepoints/rocksdb-native"),
    )
    (tmp / "spec.json").write_text(json.dumps({"queries": queries}), encoding="utf-8")
    conf = cluster.spark_conf(executor_memory="512m")
    # what a user does for their own object store: credentials and endpoint for the driver (its
    # environment) and for the executors (spark.executorEnv.*); s3fs reads the AWS_* variables
    for name, value in s3.env.items():
        conf[f"spark.executorEnv.{name}"] = value
    conf["spark.executorEnv.STATEQUERY_CACHE_DIR"] = os.environ["STATEQUERY_CACHE_DIR"]
    # statequery's JVM data source (its jar shipped to the executors by spark.jars), unless
    # STATEQUERY_SPARK_PATH=python
    conf.update(session_conf())
    cmd = [str(spark_home() / "bin" / "spark-submit")]
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    cmd += [str(JOB), str(tmp / "spec.json"), str(tmp / "result.pickle")]
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, env={**cluster.env, **s3.env}, cwd=tmp, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    cluster.track(proc)
    try:
        out, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
    assert proc.returncode == 0, f"spark-submit failed:\n{out[-6000:]}\n{cluster.logs()}"
    with open(tmp / "result.pickle", "rb") as f:
        results = pickle.load(f)
    timings = ", ".join(
        f"{q['id']} {results[q['id']]['seconds']:.1f}" for q in queries
    )
    print(
        f"cluster: up in {cluster.start_seconds:.1f} s; spark-submit "
        f"{time.monotonic() - started:.1f} s (session {results['session_s']:.1f} s; "
        f"queries: {timings})",
        file=sys.stderr,
    )
    return {"results": results, "queries": {q["id"]: q for q in queries}, "cluster": cluster,
            "s3": s3, "log": out}


def _canonical_rows(rows: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)


def _python_api(query: dict[str, Any], s3: S3Server) -> list[dict[str, Any]]:
    storage = s3.storage_options if query["path"].startswith("s3://") else None
    sp = statequery.open(query["path"], storage_options=storage)
    opts = query["options"]
    if "state" not in opts:
        return sp.state_meta().to_pylist()  # type: ignore[no-any-return]
    table = sp.read(opts["operator"], opts["state"], key=opts.get("key"), mode=opts.get("mode"))
    return table.to_pylist()  # type: ignore[no-any-return]


def test_both_executors_registered(run: Any) -> None:
    assert run["results"]["executors"] == 2
    dirs = run["cluster"].executor_dirs()
    assert {d.parent.parent.name for d in dirs} == {"worker-0", "worker-1"}


@pytest.mark.parametrize("qid", ["local-count", "s3-count", "s3-rocksdb-profile"])
def test_partitions_spread_over_both_executors(run: Any, qid: str) -> None:
    result = run["results"][qid]
    assert result["partitions"] == 8  # 128 key groups, 16 per partition
    assert result["tasks"] == 8
    placement = result["placement"]
    assert [p[0] for p in placement] == list(range(8))
    workers = {Path(cwd).parent.parent.name for _, cwd, _, _ in placement}
    assert workers == {"worker-0", "worker-1"}, placement
    cluster_dir = str(run["cluster"].dir)
    assert all(cwd.startswith(cluster_dir) for _, cwd, _, _ in placement)
    assert len({pid for _, _, pid, _ in placement}) >= 2
    assert sum(n for *_, n in placement) == len(result["rows"]) == 20


@pytest.mark.parametrize("qid", ["local-key", "s3-rocksdb-key"])
def test_key_lookup_plans_one_task(run: Any, qid: str) -> None:
    result = run["results"][qid]
    assert result["partitions"] == 1
    assert result["tasks"] == 1
    assert [r["key"] for r in result["rows"]] == ["user-3"]
    assert "key 'user-3' -> key group(s)" in run["log"]


@pytest.mark.parametrize(
    "qid",
    ["local-count", "local-profile", "local-key", "s3-count", "s3-recent",
     "s3-rocksdb-profile", "s3-rocksdb-key"],
)
def test_results_equal_python_api(run: Any, qid: str) -> None:
    query = run["queries"][qid]
    got = run["results"][qid]["rows"]
    expected = _python_api(query, run["s3"])
    assert got, qid
    assert _canonical_rows(got) == _canonical_rows(expected)


def test_state_meta_from_s3(run: Any) -> None:
    got = run["results"]["s3-meta"]["rows"]
    expected = _python_api(run["queries"]["s3-meta"], run["s3"])
    assert sorted(r["table_name"] for r in got) == sorted(r["table_name"] for r in expected)
    kinds = {r["table_name"]: r["kind"] for r in got}
    assert kinds["user_state__count"] == "value"
    assert run["queries"]["s3-meta"]["path"].startswith("s3://")
