"""``statequery serve``: one warm Spark (Spark Connect and the Thrift JDBC server) for
``sql --spark``, ``shell``, PySpark's Connect client and beeline; one server for the module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import statequery

pytestmark = [pytest.mark.spark, pytest.mark.slow]

CLI = [sys.executable, "-m", "statequery.cli"]
REPO = Path(__file__).resolve().parents[2]
KEY_QUERY = "SELECT key, value FROM user_activity.user_state__count WITH ('key' = 'user-3')"


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=900, env=env,
                          cwd=cwd)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A running server; at the end, ``serve --stop`` stops it and its JVM."""
    from statequery.spark.session import metastore_holder

    tmp_path = tmp_path_factory.mktemp("server")
    folder = tmp_path / "spark"
    env = dict(os.environ, STATEQUERY_SPARK_DIR=str(folder), PYSPARK_PYTHON=sys.executable)
    start = _run(["serve", "--master", "local[2]"], env, tmp_path)
    assert start.returncode == 0, start.stderr[-4000:]
    info = json.loads((folder / "server.json").read_text())
    try:
        yield {"info": info, "env": env, "tmp": tmp_path, "folder": folder,
               "start": start.stderr}
    finally:
        stop = _run(["serve", "--stop"], env, tmp_path)
    assert stop.returncode == 0
    assert f"stopped the server at {info['url']} (pid {info['pid']})" in stop.stderr
    assert not (folder / "server.json").exists()
    with pytest.raises(ProcessLookupError):
        os.kill(int(info["pid"]), 0)
    assert metastore_holder(folder) is None  # the server's JVM is gone too
    assert "no server runs" in _run(["serve", "--stop"], env, tmp_path).stderr
    assert _run(["serve", "--status"], env, tmp_path).returncode == 3


def test_serve_says_where_it_listens_and_a_second_serve_finds_it(
    server: dict[str, Any],
) -> None:
    info, env, tmp = server["info"], server["env"], server["tmp"]
    assert info["host"] == "127.0.0.1"
    assert info["connect"] == f"sc://127.0.0.1:{info['connect_port']}"
    assert (f"serving jdbc:hive2://127.0.0.1:{info['port']}/default and {info['connect']} "
            f"(pid {info['pid']})") in server["start"]
    again = _run(["serve"], env, tmp)
    assert again.returncode == 0
    assert f"a server already runs: {info['url']} and {info['connect']} (pid {info['pid']}" \
        in again.stderr
    assert "starting" not in again.stderr
    status = _run(["serve", "--status"], env, tmp)
    assert status.returncode == 0 and info["connect"] in status.stderr
    # a command that needs a Spark of its own says that the server holds the metastore
    busy = _run(["attach", "--replace"], env, tmp)
    assert busy.returncode == 1
    assert busy.stderr.strip() == (
        f"statequery: the metastore in {server['folder']} is in use by the statequery server at "
        f"{info['url']} (pid {info['pid']}): shell and sql --spark go through it; for this "
        "command stop it first (statequery serve --stop)"
    )


def test_two_sql_clients_at_once_on_connect(server: dict[str, Any]) -> None:
    info, env, tmp = server["info"], server["env"], server["tmp"]
    rocks = statequery.open(str(REPO / "catalog" / "user_activity_rocksdb"))
    amounts = rocks.read("user_state__amount_by_category")
    clients = [
        subprocess.Popen([*CLI, "sql", "--spark", "--json", query], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, cwd=tmp)
        for query in (
            "SELECT key, value FROM user_activity.user_state__count WHERE key = 'user-3'",
            "SELECT count(*) AS n, count(DISTINCT key) AS keys "
            "FROM user_activity_rocksdb.user_state__amount_by_category",
        )
    ]
    outs = [c.communicate(timeout=600) for c in clients]
    for c, (_, err) in zip(clients, outs, strict=True):
        assert c.returncode == 0, err[-3000:]
        assert f"ran on the server at {info['connect']}" in err
        assert "starting Spark" not in err
    assert [json.loads(ln) for ln in outs[0][0].splitlines()] == [{"key": "user-3", "value": 10}]
    keys = len(set(amounts.column("key").to_pylist()))
    assert [json.loads(ln) for ln in outs[1][0].splitlines()] == [
        {"n": amounts.num_rows, "keys": keys}
    ]
    shown = _run(["sql", "--spark", "--json", "SHOW DATABASES"], env, tmp)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert [json.loads(ln)["namespace"] for ln in shown.stdout.splitlines()] == [
        "default", "user_activity", "user_activity_rocksdb", "word_counts"
    ]


def test_errors_on_the_server_are_one_line(server: dict[str, Any]) -> None:
    env, tmp = server["env"], server["tmp"]
    bad = _run(["sql", "--spark", "SELECT * FROM user_activity.nope"], env, tmp)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    last = bad.stderr.strip().splitlines()
    assert len(last) == 1 and last[0].startswith("statequery: [TABLE_OR_VIEW_NOT_FOUND] ")
    assert "`user_activity`.`nope`" in last[0]
    refused = _run(["sql", "--spark",
                    "SELECT count(*) FROM user_activity.state_meta WITH ('key' = 'x')"], env, tmp)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "statequery: the state_meta table has no keys: the options key and key_groups "
        "apply to state tables and operator tables"
    ]


_NOTEBOOK = """
import json, sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
one = spark.sql(sys.argv[2]).collect()
df = spark.table("user_activity.user_state__count")
total = df.count()
three = df.where("key = 'user-3'").select("value").collect()
print(json.dumps({"one": [r.asDict() for r in one], "total": total,
                  "three": [r.value for r in three]}))
spark.stop()
"""


def test_pyspark_connect_client_while_a_jdbc_shell_runs(server: dict[str, Any]) -> None:
    """A notebook's client (``SparkSession.builder.remote``) and the shell (beeline on the
    Thrift server) at the same time, on one server."""
    info, env, tmp = server["info"], server["env"], server["tmp"]
    notebook = subprocess.Popen(
        [sys.executable, "-W", "ignore", "-c", _NOTEBOOK, info["connect"], KEY_QUERY],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp,
    )
    shell = _run(["shell", "-S", "-e", f"SHOW DATABASES; {KEY_QUERY}"], env, tmp)
    out, err = notebook.communicate(timeout=600)
    assert shell.returncode == 0, shell.stderr[-3000:]
    lines = [ln for ln in shell.stdout.splitlines() if ln.strip()]
    assert lines == ["default", "user_activity", "user_activity_rocksdb", "word_counts",
                     "user-3\t10"]
    assert f"connecting to the server at {info['url']}" in shell.stderr
    assert notebook.returncode == 0, err[-3000:]
    count = statequery.open(str(REPO / "catalog" / "user_activity")).read("user_state__count")
    assert json.loads(out) == {"one": [{"key": "user-3", "value": 10}], "total": count.num_rows,
                               "three": [10]}
