"""A shared Hive metastore on PostgreSQL (docs/spark.md): ``attach`` from one process, queries
from two concurrent ``spark-sql`` processes and ``statequery serve`` at once, a savepoint folder
replaced under an attached database (refused), ``detach``, attach again."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.pg import JDBC_JAR, metastore_conf, postgres, postgres_bin

import statequery

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.skipif(postgres_bin() is None or not JDBC_JAR.exists(),
                       reason="needs Debian's postgresql and libpostgresql-jdbc-java"),
]

CLI = [sys.executable, "-m", "statequery.cli"]
REPO = Path(__file__).resolve().parents[2]
KEY_QUERY = "SELECT key, value FROM user_activity.user_state__count WITH ('key' = 'user-3')"


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=900, env=env,
                          cwd=cwd)


def test_metastore_on_postgresql(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    for name in ("user_activity", "word_counts"):
        shutil.copytree(REPO / "catalog" / name, catalog / name)
    folder = tmp_path / "spark"
    folder.mkdir()
    env = dict(os.environ, STATEQUERY_SPARK_DIR=str(folder), PYSPARK_PYTHON=sys.executable)
    count = statequery.open(str(catalog / "user_activity")).read("user_state__count")
    with postgres() as pg:
        (folder / "spark-defaults.conf").write_text(metastore_conf(pg))
        attached = _run(["attach", str(catalog), "--master", "local[1]"], env, tmp_path)
        assert attached.returncode == 0, attached.stderr[-4000:]
        assert "attached database user_activity (18 tables)" in attached.stderr
        assert "attached database word_counts (7 tables)" in attached.stderr
        assert not (folder / "metastore_db").exists()  # nothing in Derby

        # the spark-sql command line of the folder's settings (a server would make it beeline)
        argv = shlex.split(_run(["shell", "--print-command"], env, tmp_path).stdout)
        assert f"spark.driver.extraClassPath={JDBC_JAR}" in argv

        served = _run(["serve", "--catalog", str(catalog), "--master", "local[1]"], env,
                      tmp_path)
        assert served.returncode == 0, served.stderr[-4000:]
        try:
            # two spark-sql processes and a client of the server, all at once
            sqls = [
                subprocess.Popen(
                    [*argv, "--master", "local[1]", "-S", "-e", query],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                    cwd=tmp_path,
                )
                for query in (KEY_QUERY, "SELECT count(*) FROM user_activity.user_state__count")
            ]
            client = _run(["sql", "--spark", "--json",
                           "SELECT count(*) AS n FROM user_activity.user_state__count "
                           "WHERE key = 'user-3'"], env, tmp_path)
            outs = [p.communicate(timeout=900) for p in sqls]
            for p, (_, err) in zip(sqls, outs, strict=True):
                assert p.returncode == 0, err[-3000:]
            assert outs[0][0].splitlines() == ["user-3\t10"]
            assert outs[1][0].splitlines() == [str(count.num_rows)]
            assert client.returncode == 0, client.stderr[-3000:]
            assert json.loads(client.stdout) == {"n": 1}

            # the savepoint directory of word_counts now holds another savepoint: refused
            (old,) = (catalog / "word_counts").iterdir()
            (other,) = (REPO / "catalog" / "user_activity_rocksdb").iterdir()
            shutil.rmtree(old)
            shutil.copytree(other, old)
            stale = _run(["sql", "--spark", "SELECT count(*) FROM word_counts.state_meta"], env,
                         tmp_path)
            assert stale.returncode == 1
            assert len(stale.stderr.strip().splitlines()) == 1
            assert "is not the savepoint this table was set up over" in stale.stderr
        finally:
            stopped = _run(["serve", "--stop"], env, tmp_path)
        assert stopped.returncode == 0 and "stopped the server" in stopped.stderr

        detached = _run(["detach", "word_counts", "--master", "local[1]"], env, tmp_path)
        assert detached.returncode == 0, detached.stderr[-3000:]
        assert "detached database word_counts" in detached.stderr
        again = _run(["attach", str(catalog / "word_counts"), "--database", "word_counts",
                      "--master", "local[1]"], env, tmp_path)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "attached database word_counts (18 tables)" in again.stderr  # the new savepoint
