"""``statequery serve``: one warm Spark (Spark Connect and the Thrift JDBC server) for
``sql --spark``, ``shell``, PySpark's Connect client and beeline; one server for the module."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
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
    """A notebook's client (``SparkSession.builder.remote``) and ``shell --beeline`` (beeline
    on the Thrift server) at the same time, on one server."""
    info, env, tmp = server["info"], server["env"], server["tmp"]
    notebook = subprocess.Popen(
        [sys.executable, "-W", "ignore", "-c", _NOTEBOOK, info["connect"], KEY_QUERY],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp,
    )
    shell = _run(["shell", "--beeline", "-S", "-e", f"SHOW DATABASES; {KEY_QUERY}"], env, tmp)
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


#: a statement of every kind of value, over several lines, with a ``;`` in a string and in a
#: comment; its line is what spark-sql 4.3 (``statequery shell -S -f`` without a server)
#: printed for it, byte for byte
_VALUES = """
SELECT NULL AS n, 1.5D, 1e10D, CAST(1.10 AS DECIMAL(5,2)), array(1,2), map('b',1,'a',2),
  named_struct('x',1,'y','s'), DATE'2024-01-02', TIMESTAMP'2024-01-02 03:04:05.5', true, X'6869',
  1.5F, array(NULL), CAST(3 AS TINYINT), 0.0001D, TIMESTAMP_NTZ'2024-01-02 03:04:05',
  0.1F, CAST(3.4e38 AS FLOAT), CAST('NaN' AS DOUBLE), -0.0D, 123456789.125D,
  map(1, array(named_struct('a', CAST(NULL AS STRING)))), 'a;b' AS semi -- a ; in a comment
;"""
_VALUES_LINE = (
    'NULL\t1.5\t1.0E10\t1.10\t[1,2]\t{"a":2,"b":1}\t{"x":1,"y":"s"}\t2024-01-02\t'
    "2024-01-02 03:04:05.5\ttrue\thi\t1.5\t[null]\t3\t1.0E-4\t2024-01-02 03:04:05\t0.1\t3.4E38\t"
    'NaN\t-0.0\t1.23456789125E8\t{1:[{"a":null}]}\ta;b'
)
_DATABASES = ["default", "user_activity", "user_activity_rocksdb", "word_counts"]


def test_shell_e_and_f_print_what_spark_sql_prints(server: dict[str, Any]) -> None:
    """``shell -e`` and ``-f`` on the server go through Spark Connect (no beeline, no JVM) and
    print what spark-sql prints: rows as tab-separated lines, no header."""
    env, tmp = server["env"], server["tmp"]
    started = time.monotonic()
    shell = _run(["shell", "-S", "-e", f"SHOW DATABASES; {KEY_QUERY}"], env, tmp)
    took = time.monotonic() - started
    assert shell.returncode == 0, shell.stderr[-3000:]
    assert shell.stdout.splitlines() == [*_DATABASES, "user-3\t10"]
    assert shell.stderr == ""  # -S: nothing but the results; beeline would say more
    assert took < 60

    # without -S: spark-sql's timing line for each statement, on standard error
    timed = _run(["shell", "-e", "SHOW DATABASES"], env, tmp)
    assert timed.returncode == 0, timed.stderr[-3000:]
    assert timed.stdout.splitlines() == _DATABASES
    assert timed.stderr.startswith("Time taken: ")
    assert timed.stderr.rstrip().endswith(" seconds, Fetched 4 row(s)")

    script = tmp / "script.sql"
    script.write_text(
        _VALUES + "\n-- the session keeps its database\nUSE user_activity;\nSHOW TABLES;\n"
        "DESCRIBE user_state__count;\n"
        "SELECT key, value FROM user_state__count WHERE key IN ('user-3', 'user-1') ORDER BY key"
    )
    ran = _run(["shell", "-S", "-f", str(script)], env, tmp)
    assert ran.returncode == 0, ran.stderr[-3000:]
    lines = ran.stdout.splitlines()
    assert lines[0] == _VALUES_LINE
    listed = _run(["sql", "--spark", "--json", "SHOW TABLES IN user_activity"], env, tmp)
    names = [json.loads(ln)["tableName"] for ln in listed.stdout.splitlines()]
    assert {"state_meta", "user_state__count", "window_agg"} <= set(names)
    assert lines[1:1 + len(names)] == names  # SHOW TABLES: the names only
    described = lines[1 + len(names):-2]
    assert [ln.split("\t")[:2] for ln in described] == [
        [f"{name:<20}", f"{kind:<20}"] for name, kind in (
            ("key_group", "int"), ("key", "string"), ("namespace", "string"),
            ("value", "bigint"))
    ]
    count = statequery.open(str(REPO / "catalog" / "user_activity")).read("user_state__count")
    values = dict(zip(count.column("key").to_pylist(), count.column("value").to_pylist(),
                      strict=True))
    assert lines[-2:] == [f"user-1\t{values['user-1']}", f"user-3\t{values['user-3']}"]

    # --database, and the statements of a standard input that is not a terminal
    piped = subprocess.run(
        [*CLI, "shell", "-S", "--database", "word_counts"], input="SELECT current_database();\n",
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp,
    )
    assert piped.returncode == 0, piped.stderr[-3000:]
    assert piped.stdout == "word_counts\n" and piped.stderr == ""


def test_shell_e_stops_at_an_error_in_one_line(server: dict[str, Any]) -> None:
    env, tmp = server["env"], server["tmp"]
    bad = _run(["shell", "-S", "-e", "SELECT 1; SELECT * FROM user_activity.nope; SELECT 2"],
               env, tmp)
    assert bad.returncode == 1
    assert bad.stdout == "1\n"  # the statement after the error does not run
    assert bad.stderr.startswith("statequery: [TABLE_OR_VIEW_NOT_FOUND] ")
    assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
    # statequery's own error, raised by the data source in the server's Python worker
    refused = _run(["shell", "-S", "-e",
                    "SELECT count(*) FROM user_activity.state_meta WITH ('key' = 'x')"], env, tmp)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "statequery: the state_meta table has no keys: the options key and key_groups apply "
        "to state tables and operator tables"
    )
    extra = _run(["shell", "-e", "SELECT 1", "--", "--hiveconf", "x=y"], env, tmp)
    assert extra.returncode == 1
    assert extra.stderr.strip() == (
        "statequery: --hiveconf x=y: arguments after -- are for spark-sql (no server) or "
        "beeline (statequery shell --beeline -- ...)"
    )


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def _type(session: str, text: str, enter: bool = True) -> None:
    """Type ``text`` as hexadecimal key codes (tmux would take a trailing ``;`` for its own)."""
    _tmux("send-keys", "-t", session, "-H", *(f"{b:02x}" for b in text.encode()))
    if enter:
        _tmux("send-keys", "-t", session, "Enter")


def _screen(session: str) -> str:
    return _tmux("capture-pane", "-p", "-J", "-S", "-2000", "-t", session)


def _wait_for(session: str, predicate: Callable[[str], bool], timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = _screen(session)
        if predicate(screen):
            return screen
        time.sleep(0.2)
    raise AssertionError(f"timed out; the screen:\n{screen[-4000:]}")


def _prompts(screen: str) -> int:
    return sum(1 for ln in screen.splitlines() if ln.startswith("statequery ("))


def _cells(screen: str) -> list[list[str]]:
    """The rows of the tables on the screen (rich's box lines), as their cells."""
    return [[c.strip() for c in ln.strip().strip("│").split("│")]
            for ln in screen.splitlines() if ln.startswith("│")]


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux)")
def test_shell_interactive_on_connect(server: dict[str, Any]) -> None:
    """The shell in a terminal: -i, tables drawn, a statement over three lines, USE, an error
    in one line, Ctrl-C of a long statement (the server stops it) and of a half-typed line,
    Ctrl-D; the history keeps the statements."""
    env, tmp = server["env"], server["tmp"]
    history = tmp / "history"
    init = tmp / "init.sql"
    init.write_text("USE word_counts;\n")
    session = f"sq-{uuid.uuid4().hex[:8]}"
    script = tmp / "shell.sh"
    variables = dict(STATEQUERY_SPARK_DIR=env["STATEQUERY_SPARK_DIR"],
                     STATEQUERY_SHELL_HISTORY=str(history),
                     PYTHONPATH=env.get("PYTHONPATH", ""))
    script.write_text(
        # the Ctrl-C the test presses goes to this script too: it goes on (with Python's own
        # handler, not an ignored signal, for the shell)
        "#!/bin/sh\ntrap : INT\n" + " ".join(f"{k}='{v}'" for k, v in variables.items())
        + f" {sys.executable} -m statequery.cli shell -i {init} 2>&1\necho SHELL-EXIT=$?\n"
        "sleep 600\n"
    )
    script.chmod(0o755)
    started = time.monotonic()
    _tmux("new-session", "-d", "-s", session, "-x", "200", "-y", "60", "-c", str(tmp),
          str(script))
    try:
        screen = _wait_for(session, lambda s: _prompts(s) >= 1, 60)
        opened = time.monotonic() - started
        assert "statequery (word_counts)> " in screen  # -i ran first
        assert opened < 30, opened  # no JVM starts (beeline: seconds more)

        _type(session, "SHOW DATABASES;")
        screen = _wait_for(session, lambda s: _prompts(s) >= 2)
        assert _cells(screen) == [[d] for d in _DATABASES]
        assert "4 rows in " in screen

        _type(session, "SELECT key, value")
        _type(session, "  FROM user_activity.user_state__count")
        _type(session, "  WHERE key = 'user-3';")
        screen = _wait_for(session, lambda s: _prompts(s) >= 3)
        assert ["user-3", "10"] in _cells(screen)

        _type(session, "USE user_activity;")
        screen = _wait_for(session, lambda s: "statequery (user_activity)> " in s)
        _type(session, "SELECT * FROM nope;")
        screen = _wait_for(session, lambda s: _prompts(s) >= 5)
        errors = [ln for ln in screen.splitlines() if ln.startswith("Error: ")]
        assert len(errors) == 1 and "Traceback" not in screen
        assert errors[0].startswith("Error: [TABLE_OR_VIEW_NOT_FOUND] The table or view `nope`")

        # Ctrl-C of a statement that would run for minutes: the server stops it
        _type(session, "SELECT sum(id % 7) FROM range(0, 1000000000000);")
        time.sleep(3)
        assert _prompts(_screen(session)) == 5  # still running
        pressed = time.monotonic()
        _tmux("send-keys", "-t", session, "C-c")
        screen = _wait_for(session, lambda s: _prompts(s) >= 6, 60)
        assert time.monotonic() - pressed < 30
        assert "Interrupted: the server stopped the statement" in screen

        # Ctrl-C of a half-typed statement drops it
        _type(session, "SELECT 1,")
        _wait_for(session, lambda s: s.rstrip().splitlines()[-1].strip() == ">")  # goes on
        _tmux("send-keys", "-t", session, "C-c")
        _type(session, "SELECT 41 + 1 AS answer;")
        screen = _wait_for(session, lambda s: ["42"] in _cells(s))
        assert _cells(screen)[-1] == ["42"] and "┃ answer ┃" in screen

        _tmux("send-keys", "-t", session, "C-d")
        screen = _wait_for(session, lambda s: "SHELL-EXIT=" in s, 60)
        assert "SHELL-EXIT=0" in screen
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    kept = history.read_text().splitlines()
    assert "SELECT key, value FROM user_activity.user_state__count WHERE key = 'user-3';" \
        in kept
    assert "USE user_activity;" in kept and "SELECT 41 + 1 AS answer;" in kept
