"""statequery capture against a real Flink 2.3.0 session cluster on loopback.

One cluster for the module (tests/support/flinkcluster.py: a JobManager and a TaskManager of 1 GB
each, private configuration, 127.0.0.1 only, killed on teardown and by a watchdog). Two jobs run
on it, submitted through the REST API as a jar (examples/flink-jobs/src/.../CaptureStreamJob.java,
CaptureSqlJob.java): a DataStream job with named vertices and a SQL GROUP BY. The Flink
distribution comes from ``$STATEQUERY_FLINK_HOME``, PyFlink, or a cached
``pip install --no-deps apache-flink==2.3.0 apache-flink-libraries==2.3.0``
(tests/support/flinkcluster.py).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.flinkcluster import FlinkCluster, capture_jobs_jar, flink_session_cluster

import statequery
from statequery.capture import CaptureError, SavepointFailedError
from statequery.catalog import Catalog
from statequery.cli import main
from statequery.metadata.statemeta import SNAPSHOT_FILE_NAME

pytestmark = [pytest.mark.slow, pytest.mark.flink]


class Jobs:
    def __init__(self, cluster: FlinkCluster, datastream: str, sql: str) -> None:
        self.cluster = cluster
        self.datastream = datastream
        self.sql = sql


def _records_in(cluster: FlinkCluster, job_id: str, vertex_prefix: str) -> int:
    doc = cluster.get(f"/jobs/{job_id}")
    for v in doc["vertices"]:
        if v["name"].startswith(vertex_prefix):
            return int(v["metrics"]["read-records"])
    return 0


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    root = tmp_path_factory.mktemp("flink")
    with flink_session_cluster(lifetime=900, root=root) as cluster:
        jar = cluster.upload_jar(capture_jobs_jar(cluster.home, root / "build"))
        ds = cluster.run_jar(jar, "statequery.fixtures.CaptureStreamJob")
        sql = cluster.run_jar(jar, "statequery.fixtures.CaptureSqlJob")
        cluster.wait_running(ds)
        cluster.wait_running(sql)
        # every key (5 users, 5 categories) has state: > 25 records through each keyed vertex
        deadline = time.monotonic() + 120
        while (_records_in(cluster, ds, "Count Per User") < 25
               or _records_in(cluster, sql, "GroupAggregate") < 25):
            assert time.monotonic() < deadline, "the jobs processed too few records"
            time.sleep(1)
        yield Jobs(cluster, ds, sql)
    for p in cluster.processes:
        assert p.poll() is not None  # both JVMs ended


def test_sql_job_column_names_without_a_plan(jobs: Jobs, capsys: pytest.CaptureFixture[str]
                                             ) -> None:
    url = jobs.cluster.url
    assert main(["capture", "--rest", url, jobs.sql]) == 0
    out = capsys.readouterr().out
    assert "captured savepoint of job 'statequery-capture-sql'" in out
    location = out.split(": ", 1)[1].splitlines()[0].strip()
    assert Path(location, SNAPSHOT_FILE_NAME).is_file()
    assert main(["inspect", location, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["from_snapshot"] and doc["job"]["job_name"] == "statequery-capture-sql"
    rows = {r["table_name"]: r for r in doc["states"]}
    acc = rows["groupaggregate_4__accstate"]
    assert acc["key_type"] == "ROW<category STRING>"
    assert acc["value_type"] == "ROW<cnt BIGINT, max_amount INTEGER>"
    sp = statequery.open(location)
    table = sp.read("groupaggregate_4__accstate")
    assert sorted(r["category"] for r in table.column("key").to_pylist()) == \
        ["c0", "c1", "c2", "c3", "c4"]
    values = table.column("value").to_pylist()
    assert sum(v["cnt"] for v in values) >= 25
    assert all(1 <= v["max_amount"] <= 100 for v in values)


def test_datastream_job_vertex_names(jobs: Jobs, tmp_path: Path) -> None:
    started = time.monotonic()
    result = statequery.capture(jobs.cluster.url, jobs.datastream)
    took = time.monotonic() - started
    print(f"capture took {took:.2f} s, of which the savepoint {result.seconds:.2f} s")
    assert took < 60
    sp = statequery.open(result.location)
    assert sp.from_snapshot and sp.job is not None
    assert sp.job.job_name == "statequery-capture-datastream"
    op = sp.operator("Count Per User")
    vertex = sp.job.vertex(op.operator_id)
    assert vertex is not None and vertex.name == "Count Per User -> Discard: Writer"
    state = sp.state("count_per_user__count")
    assert state.operator_name == "Count Per User"
    keys = sorted(sp.read(state).column("key").to_pylist())
    assert keys == [f"user-{i}" for i in range(5)]
    assert {v.name for v in sp.job.vertices} == {"Source: Numbers",
                                                 "Count Per User -> Discard: Writer"}
    assert sp.job.checkpoint_config["state_backend"] == "HashMapStateBackend"


def test_latest_checkpoint(jobs: Jobs, tmp_path: Path) -> None:
    out = tmp_path / "meta.msgpack"
    result = statequery.capture(jobs.cluster.url, jobs.datastream, latest_checkpoint=True,
                                out=str(out))
    assert result.job.trigger == "checkpoint" and "/chk-" in result.location
    assert result.snapshot == str(out)
    sp = statequery.open(result.location, snapshot=str(out))
    assert sp.from_snapshot and sp.snapshot_type == "checkpoint"
    assert sp.job is not None and sp.job.job_id == jobs.datastream


def test_catalog_follows_the_job(jobs: Jobs, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    catalog = tmp_path / "catalog"
    assert main(["capture", "--rest", jobs.cluster.url, jobs.datastream, "--catalog",
                 str(catalog), "--keep", "2", "--every", "1.5", "--count", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("captured savepoint") == 3 and out.count("removed older capture") == 1
    dbs = Catalog(str(catalog)).databases()
    assert len(dbs) == 2 and all(d.startswith("statequery_capture_datastream_2") for d in dbs)
    old, new = sorted(dbs)
    cat = Catalog(str(catalog))
    assert cat.savepoint(new).job is not None
    # consecutive snapshots compare: the counts grew between them
    assert main(["diff", cat.location(old), cat.location(new), "--state", "count", "--json"]
                ) == 0
    changes = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert changes and {c["change"] for c in changes} <= {"changed", "added"}


def test_failures_are_typed_and_write_nothing(jobs: Jobs, tmp_path: Path) -> None:
    before = sorted(p.name for p in (jobs.cluster.root / "savepoints").iterdir())
    with pytest.raises(SavepointFailedError, match="savepoint directory"):
        statequery.capture(jobs.cluster.url, jobs.datastream,
                           savepoint="file:///proc/statequery-not-writable")
    assert sorted(p.name for p in (jobs.cluster.root / "savepoints").iterdir()) == before
    # a cancelled job: no savepoint, nothing written
    req = urllib.request.Request(f"{jobs.cluster.url}/jobs/{jobs.sql}?mode=cancel",
                                 method="PATCH")
    urllib.request.urlopen(req, timeout=30).read()
    deadline = time.monotonic() + 60
    while jobs.cluster.get(f"/jobs/{jobs.sql}")["state"] != "CANCELED":
        assert time.monotonic() < deadline
        time.sleep(0.5)
    with pytest.raises(CaptureError, match="is CANCELED"):
        statequery.capture(jobs.cluster.url, jobs.sql, savepoint=(tmp_path / "sp").as_uri())
    assert not (tmp_path / "sp").exists()
