"""``statequery serve``: one warm Spark (Spark Connect and the Thrift JDBC server) for
``sql --spark``, ``shell``, PySpark's Connect client and beeline; one server for the module."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
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
    """A running server; at the end, ``serve --stop`` stops it and its JVM.

    Its metastore folder is one that every user of the machine may enter (pytest's own temporary
    folders are the user's only): another uid can read ``server.json`` and knows the ports;
    only the token file is the server's user's."""
    from statequery.spark.session import metastore_holder

    tmp_path = tmp_path_factory.mktemp("server")
    shared = Path(tempfile.mkdtemp(prefix="statequery-serve-"))
    shared.chmod(0o755)
    folder = shared / "spark"
    env = dict(os.environ, STATEQUERY_SPARK_DIR=str(folder), PYSPARK_PYTHON=sys.executable)
    try:
        start = _run(["serve", "--master", "local[2]"], env, tmp_path)
        assert start.returncode == 0, start.stderr[-4000:]
        info = json.loads((folder / "server.json").read_text())
        try:
            yield {"info": info, "env": env, "tmp": tmp_path, "folder": folder,
                   "start": start.stderr}
        finally:
            stop = _run(["serve", "--stop"], env, tmp_path)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
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
from statequery.spark.server import remote_session
spark = remote_session()  # the server of $STATEQUERY_SPARK_DIR, with its token
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
        screen = _wait_for(session, lambda s: s.rstrip().splitlines()[-1].strip() == ">")
        before = _prompts(screen)
        _tmux("send-keys", "-t", session, "C-c")
        # a fresh prompt before typing on (keys typed at once could reach the half-typed line
        # before the shell has taken the interrupt, on a loaded machine)
        _wait_for(session, lambda s: _prompts(s) > before)
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


# --- secure by default (issue 31): loopback only, a token on every connection ----------------

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0,
                                reason="running a client as another uid needs root (setpriv)")


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (the server's JVM, its Python workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    return ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))


def _listening(pid: int) -> list[tuple[str, int, str]]:
    """(address, port, protocol) of each listening TCP socket and bound UDP socket that ``pid``
    or a process below it holds: what ``ss -ltunp`` shows, read from /proc."""
    inodes = set()
    for p in _descendants(pid):
        try:
            fds = os.listdir(f"/proc/{p}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{p}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(int(link[8:-1]))
    found = []
    for proto, state in (("tcp", "0A"), ("tcp6", "0A"), ("udp", "07"), ("udp6", "07")):
        for line in Path(f"/proc/net/{proto}").read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[9]) in inodes and fields[3] == state:
                address, port = fields[1].split(":")
                found.append((str(_address(address)), int(port, 16), proto))
    return found


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


@pytest.fixture(scope="module")
def nobody(server: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """How to run a client as uid 65534: its environment (this checkout and this environment's
    packages on ``PYTHONPATH``, a home of its own) and a Python it may execute."""
    if os.geteuid() != 0:
        pytest.skip("running a client as another uid needs root (setpriv)")
    home = Path(tempfile.mkdtemp(prefix="statequery-nobody-"))
    os.chown(home, NOBODY, NOBODY)
    from pyspark import __file__ as pyspark_file

    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(home), "LANG": "C.UTF-8",
           "PYTHONPATH": os.pathsep.join([str(REPO), sysconfig.get_paths()["purelib"]]),
           "STATEQUERY_SPARK_DIR": server["env"]["STATEQUERY_SPARK_DIR"],
           "SPARK_HOME": str(Path(pyspark_file).parent)}
    if os.environ.get("JAVA_HOME"):
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    try:
        for python in (sys.executable, shutil.which(f"python{version}"),
                       f"/usr/bin/python{version}"):
            if python and subprocess.run(
                [*_SETPRIV, python, "-c", "import grpc, pyarrow, statequery.cli.connect"],
                env=env, capture_output=True, timeout=120, cwd="/",
            ).returncode == 0:
                break
        else:
            pytest.fail(f"no Python {version} that uid {NOBODY} may run with these packages")
        yield {"env": env, "python": python, "home": home}
    finally:
        shutil.rmtree(home, ignore_errors=True)


_SETPRIV = ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups"]


def _as_nobody(nobody: dict[str, Any], argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*_SETPRIV, *argv], env=nobody["env"], capture_output=True, text=True,
                          timeout=300, cwd="/", stdin=subprocess.DEVNULL)


def test_nothing_listens_beyond_loopback(server: dict[str, Any]) -> None:
    """Every socket the server, its JVM and its Python workers listen on is a loopback one: the
    Thrift and Connect ports, the driver's RPC and block manager; no Spark UI (off unless
    ``--ui``)."""
    info = server["info"]
    sockets = _listening(int(info["pid"]))
    ports = {port for _, port, _ in sockets}
    assert {int(info["port"]), int(info["connect_port"])} <= ports
    assert len(sockets) >= 4  # and the driver's RPC and block manager
    outside = [s for s in sockets if not _loopback(s[0])]
    assert outside == [], f"listening beyond loopback: {outside}; all: {sockets}"
    assert info["ui"] is None


def test_the_token_is_the_server_users_only(server: dict[str, Any]) -> None:
    """The token is in a 0600 file of the server's user, not in server.json, not on any command
    line of the server's processes (which every user can read in /proc)."""
    info, folder = server["info"], server["folder"]
    path = Path(info["token_file"])
    assert path == folder / "server.token"
    st = path.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    token = path.read_text().strip()
    assert len(token) >= 40
    assert token not in (folder / "server.json").read_text()
    assert stat.S_IMODE((folder / "server.log").stat().st_mode) == 0o600
    for pid in _descendants(int(info["pid"])):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert token.encode() not in cmdline, pid


#: a raw Spark Connect client (statequery's, no PySpark): one statement per token given
_RAW_CONNECT = """
import json, sys
from statequery.cli.connect import ConnectError, run_sql
port, query = int(sys.argv[1]), sys.argv[2]
for token in sys.argv[3:]:
    try:
        rows = run_sql("127.0.0.1", port, query, 60, token or None).to_pylist()
        print(json.dumps(["rows", rows]))
    except ConnectError as e:
        print(json.dumps(["refused", str(e)]))
"""


@needs_root
def test_another_uid_cannot_query_over_connect(
    server: dict[str, Any], nobody: dict[str, Any], tmp_path: Path,
) -> None:
    """uid 65534, which can read server.json but not the token, gets no statement run on Spark
    Connect: statequery's client says it cannot read the token; a raw client without the token
    or with a guessed one is refused by the server. With the token the same client works."""
    info = server["info"]
    secret = tmp_path / "secret"  # the kind of file the attacker read
    secret.write_text("root only\n")
    secret.chmod(0o600)
    query = f"SELECT value FROM text.`{secret}`"
    cli = _as_nobody(nobody, [nobody["python"], "-m", "statequery.cli", "sql", "--spark",
                              "--json", query])
    assert cli.returncode == 1 and cli.stdout == ""
    assert cli.stderr.strip() == (
        f"statequery: {info['token_file']}: cannot read the server's token (Permission "
        "denied): only the user who started statequery serve can connect to it"
    )
    raw = _as_nobody(nobody, [nobody["python"], "-c", _RAW_CONNECT, str(info["connect_port"]),
                              query, "", "guess"])
    assert raw.returncode == 0, raw.stderr[-3000:]
    assert [json.loads(ln) for ln in raw.stdout.splitlines()] == [
        ["refused", "No authentication token provided"],
        ["refused", "Invalid authentication token"],
    ]
    token = Path(info["token_file"]).read_text().strip()
    mine = subprocess.run([sys.executable, "-c", _RAW_CONNECT, str(info["connect_port"]),
                           "SELECT 41 + 1 AS answer", token], capture_output=True, text=True,
                          timeout=300, env=server["env"])
    assert mine.returncode == 0, mine.stderr[-3000:]
    assert [json.loads(ln) for ln in mine.stdout.splitlines()] == [["rows", [{"answer": 42}]]]


#: a raw HiveServer2 client: the SASL PLAIN exchange of the Thrift transport, its answer
_RAW_SASL = """
import json, socket, struct, sys
port, user, password = int(sys.argv[1]), sys.argv[2], sys.argv[3]
with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
    plain = b"\\0" + user.encode() + b"\\0" + password.encode()
    for status, payload in ((1, b"PLAIN"), (2, plain)):  # START, OK
        s.sendall(struct.pack(">BI", status, len(payload)) + payload)
    f = s.makefile("rb")
    status, n = struct.unpack(">BI", f.read(5))
    print(json.dumps([status, f.read(n).decode()]))
"""
_SASL_COMPLETE, _SASL_BAD = 5, 3


@needs_root
def test_another_uid_cannot_query_over_thrift(
    server: dict[str, Any], nobody: dict[str, Any],
) -> None:
    """uid 65534 gets no statement run on the Thrift JDBC server: beeline is refused at login;
    a raw client's SASL PLAIN login is refused without the token or with a guess, and accepted
    with the token."""
    from statequery.spark.session import _pyspark_home

    info = server["info"]
    beeline = _as_nobody(nobody, [str(_pyspark_home() / "bin" / "beeline"), "-u", info["url"],
                                  "-n", "nobody", "-p", "guess", "-e", "SELECT 41 + 1"])
    said = beeline.stdout + beeline.stderr
    assert "Error validating the login" in said, said[-3000:]
    assert "42" not in beeline.stdout and "row selected" not in said
    for password in ("", "guess"):
        raw = _as_nobody(nobody, [nobody["python"], "-c", _RAW_SASL, str(info["port"]),
                                  "nobody", password])
        assert raw.returncode == 0, raw.stderr[-3000:]
        assert json.loads(raw.stdout) == [_SASL_BAD, "Error validating the login"]
    token = Path(info["token_file"]).read_text().strip()
    mine = subprocess.run([sys.executable, "-c", _RAW_SASL, str(info["port"]), "anyone", token],
                          capture_output=True, text=True, timeout=120)
    assert json.loads(mine.stdout) == [_SASL_COMPLETE, ""]


def test_serve_listens_on_loopback_only(tmp_path: Path) -> None:
    """``--host`` other than a loopback address is refused in one line, before any Spark."""
    env = dict(os.environ, STATEQUERY_SPARK_DIR=str(tmp_path / "spark"))
    for host, why in (("0.0.0.0", "not a loopback address"),
                      ("192.168.1.10", "not a loopback address"),
                      ("example.org", "not an IP address")):
        run = _run(["serve", "--host", host], env, tmp_path)
        assert run.returncode == 1
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"statequery: --host {host}: {why}; ")
    assert not (tmp_path / "spark").exists()


def _get(url: str, password: str | None) -> tuple[int, str]:
    import base64
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url)
    if password is not None:
        login = base64.b64encode(f"anyone:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {login}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return int(response.status), response.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return int(e.code), ""


def test_ui_when_asked_on_loopback_behind_the_token(server: dict[str, Any]) -> None:
    """``serve --ui`` (a server of its own, beside the module's): the Spark UI listens on
    127.0.0.1 and answers 401 without the token as the password of a Basic login."""
    shared = Path(tempfile.mkdtemp(prefix="statequery-serve-ui-"))
    folder = shared / "spark"
    env = dict(server["env"], STATEQUERY_SPARK_DIR=str(folder))
    try:
        start = _run(["serve", "--ui", "--master", "local[1]"], env, shared)
        assert start.returncode == 0, start.stderr[-4000:]
        info = json.loads((folder / "server.json").read_text())
        try:
            ui = str(info["ui"])
            assert ui.startswith("http://127.0.0.1:")
            assert f"the Spark UI: {ui} (password: the token)" in start.stderr
            sockets = _listening(int(info["pid"]))
            assert int(ui.rsplit(":", 1)[1]) in {port for _, port, _ in sockets}
            assert [s for s in sockets if not _loopback(s[0])] == [], sockets
            token = Path(info["token_file"]).read_text().strip()
            assert _get(f"{ui}/jobs/", None)[0] == 401
            assert _get(f"{ui}/jobs/", "guess")[0] == 401
            status, page = _get(f"{ui}/jobs/", token)
            assert status == 200 and "Spark Jobs" in page
        finally:
            stop = _run(["serve", "--stop"], env, shared)
        assert stop.returncode == 0 and not Path(info["token_file"]).exists()
    finally:
        shutil.rmtree(shared, ignore_errors=True)
