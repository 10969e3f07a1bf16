"""``statequery serve``: one warm Spark (Thrift JDBC server) for ``sql --spark`` and ``shell``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import statequery

pytestmark = [pytest.mark.spark, pytest.mark.slow]

CLI = [sys.executable, "-m", "statequery.cli"]
REPO = Path(__file__).resolve().parents[2]
KEY_QUERY = "SELECT key, value FROM user_activity.user_state__count WITH ('key' = 'user-3')"


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=900, env=env,
                          cwd=cwd)


def test_server_serves_two_clients_at_once_and_the_shell(tmp_path: Path) -> None:
    from statequery.spark.session import metastore_holder

    folder = tmp_path / "spark"
    env = dict(os.environ, STATEQUERY_SPARK_DIR=str(folder), PYSPARK_PYTHON=sys.executable)
    start = _run(["serve", "--master", "local[2]"], env, tmp_path)
    assert start.returncode == 0, start.stderr[-4000:]
    try:
        info = json.loads((folder / "server.json").read_text())
        assert info["host"] == "127.0.0.1"
        assert f"serving jdbc:hive2://127.0.0.1:{info['port']}/default (pid {info['pid']})" \
            in start.stderr
        again = _run(["serve"], env, tmp_path)  # a second serve finds the first
        assert again.returncode == 0
        assert f"a server already runs: {info['url']} (pid {info['pid']}" in again.stderr
        assert "starting" not in again.stderr

        rocks = statequery.open(str(REPO / "catalog" / "user_activity_rocksdb"))
        total = rocks.read("user_state__amount_by_category").num_rows
        clients = [
            subprocess.Popen([*CLI, "sql", "--spark", "--json", query], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
            for query in (
                KEY_QUERY,
                "SELECT count(*) AS n, count(DISTINCT key) AS keys "
                "FROM user_activity_rocksdb.user_state__amount_by_category",
            )
        ]
        outs = [c.communicate(timeout=600) for c in clients]
        for c, (_, err) in zip(clients, outs, strict=True):
            assert c.returncode == 0, err[-3000:]
            assert f"ran on the server at {info['url']}" in err
            assert "starting Spark" not in err
        assert [json.loads(ln) for ln in outs[0][0].splitlines()] == [
            {"key": "user-3", "value": 10}
        ]
        keys = len(set(rocks.read("user_state__amount_by_category").column("key").to_pylist()))
        assert [json.loads(ln) for ln in outs[1][0].splitlines()] == [{"n": total, "keys": keys}]

        shell = _run(["shell", "-S", "-e", f"SHOW DATABASES; {KEY_QUERY}"], env, tmp_path)
        assert shell.returncode == 0, shell.stderr[-3000:]
        lines = [ln for ln in shell.stdout.splitlines() if ln.strip()]
        assert lines == ["default", "user_activity", "user_activity_rocksdb", "word_counts",
                         "user-3\t10"]
        assert f"connecting to the server at {info['url']}" in shell.stderr

        bad = _run(["sql", "--spark", "SELECT * FROM user_activity.nope"], env, tmp_path)
        assert bad.returncode == 1 and "Traceback" not in bad.stderr
        last = bad.stderr.strip().splitlines()[-1]
        assert last.startswith("statequery: ") and "nope" in last
        refused = _run(["sql", "--spark",
                        "SELECT count(*) FROM user_activity.state_meta WITH ('key' = 'x')"],
                       env, tmp_path)
        assert refused.returncode == 1
        assert refused.stderr.strip().splitlines()[-1] == (
            "statequery: the state_meta table has no keys: the options key and key_groups "
            "apply to state tables and operator tables"
        )
        status = _run(["serve", "--status"], env, tmp_path)
        assert status.returncode == 0 and info["url"] in status.stderr
        # a command that needs a Spark of its own says that the server holds the metastore
        busy = _run(["attach", "--replace"], env, tmp_path)
        assert busy.returncode == 1
        assert busy.stderr.strip() == (
            f"statequery: the metastore in {folder} is in use by the statequery server at "
            f"{info['url']} (pid {info['pid']}): shell and sql --spark go through it; for this "
            "command stop it first (statequery serve --stop)"
        )
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
