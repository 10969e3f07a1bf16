"""What the Spark commands settle before any JVM starts, and how they end on Ctrl-C; no test
here starts a JVM or a Spark.

* A wrong path, database name, catalog or file is said at once, in one line (``attach
  catalog/user_activty`` named the missing catalog only after 84 s of Spark start).
* The metastore lock is taken first and atomically: a second command while a first is still
  starting its Spark refuses in one line instead of booting a second Spark on the same Derby
  database.
* Ctrl-C during ``sql --spark`` on a server ends in ``statequery: interrupted: ...``, exit 130;
  in the interactive shell it says that the server stopped the statement, and the shell goes on
  (against a Spark Connect endpoint of this test's own whose statement never ends).

"No JVM started" is checked by what Java the commands find: ``JAVA_HOME`` names a folder whose
``bin/java`` is a stub that writes a marker file (and then exits, or, for the command that must
look busy, waits); every assertion on "no JVM" is that the marker is absent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest

CLI = [sys.executable, "-m", "statequery.cli"]
REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "catalog"


def _java_stub(folder: Path, marker: Path, wait: bool = False) -> Path:
    """A ``JAVA_HOME`` whose ``bin/java`` (and ``bin/javac``) writes its arguments to ``marker``
    and exits 1, or with ``wait`` sleeps (a JVM that is still starting)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True)
    body = f'#!/bin/sh\necho "$0 $*" >> "{marker}"\n' + ("exec sleep 300\n" if wait else "exit 1\n")
    for name in ("java", "javac"):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    return folder


@pytest.fixture
def no_java(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    """An environment whose Java is the stub, a Spark folder of its own, and the marker."""
    marker = tmp_path / "java-started"
    home = _java_stub(tmp_path / "jdk", marker)
    env = dict(os.environ, JAVA_HOME=str(home), PATH=f"{home / 'bin'}:{os.environ['PATH']}",
               STATEQUERY_SPARK_DIR=str(tmp_path / "spark"), STATEQUERY_SPARK_PATH="python",
               STATEQUERY_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    env.pop("SPARK_HOME", None)
    yield env, marker


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=600, stdin=subprocess.DEVNULL)


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("statequery: "), proc.stderr[-2000:]
    return lines[0][len("statequery: "):]


def test_attach_of_a_misspelt_catalog_says_so_without_starting_java(
        no_java: tuple[dict[str, str], Path]) -> None:
    env, marker = no_java
    assert _one_line(_run(env, "attach", "catalog/user_activty")) == (
        f"catalog {CATALOG / 'user_activty'} does not exist")
    assert not marker.exists()


def test_detach_of_what_is_not_attached_says_so_without_starting_java(
        no_java: tuple[dict[str, str], Path]) -> None:
    env, marker = no_java
    folder = Path(env["STATEQUERY_SPARK_DIR"])
    # a fresh folder: nothing was ever attached there
    assert _one_line(_run(env, "detach", "word_counts")) == (
        f"no database 'word_counts' to detach: nothing is attached in {folder} "
        "(statequery attach makes databases there)")
    # a metastore where another database is attached (its folder in the warehouse)
    (folder / "metastore_db").mkdir(parents=True)
    (folder / "warehouse" / "user_activity.db").mkdir(parents=True)
    assert _one_line(_run(env, "detach", "user_activity", "word_counts")) == (
        f"no database 'word_counts' to detach: the metastore in {folder} has none of that name")
    assert _one_line(_run(env, "detach", "no-such`db")) == (
        "no database 'no-such`db' to detach: statequery attach makes database names of letters, "
        "digits and _ only")
    assert not marker.exists()


def test_shell_and_sql_spark_check_their_catalog_and_files_without_starting_java(
        no_java: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    env, marker = no_java
    missing = tmp_path / "no-catalog"
    said = f"catalog {missing} does not exist"
    assert _one_line(_run(env, "sql", "--spark", "SELECT 1", "--catalog", str(missing))) == said
    assert _one_line(_run(env, "shell", "--catalog", str(missing), "-e", "SELECT 1")) == said
    assert _one_line(_run(env, "serve", "--catalog", str(missing))) == said
    assert _one_line(_run(env, "shell", "-f", str(tmp_path / "nope.sql"))) == (
        f"{tmp_path / 'nope.sql'}: cannot read it: No such file or directory")
    assert not marker.exists()


def test_a_second_command_while_the_first_starts_its_spark_refuses(
        no_java: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    env, marker = no_java
    folder = Path(env["STATEQUERY_SPARK_DIR"])
    first_marker = tmp_path / "first-java"
    slow = _java_stub(tmp_path / "slow-jdk", first_marker, wait=True)
    first_env = dict(env, JAVA_HOME=str(slow), PATH=f"{slow / 'bin'}:{os.environ['PATH']}")
    first = subprocess.Popen(
        [*CLI, "attach", str(CATALOG / "word_counts")], env=first_env, cwd=REPO,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    try:
        # the first command is starting its JVM (its java runs, and waits) ...
        assert first.stderr is not None
        for line in first.stderr:
            if "starting Spark" in line:
                break
        else:
            pytest.fail(f"attach ended ({first.wait()}) before it started Spark")
        # ... so a second one (each kind) refuses at once, and starts no Java of its own
        for args in (["sql", "--spark", "SELECT 1"], ["attach"],
                     ["shell", "-e", "SHOW DATABASES"], ["serve"]):
            assert _one_line(_run(env, *args)) == (
                f"the metastore in {folder} is in use by statequery attach (pid {first.pid}), "
                "which starts or runs its Spark: the embedded Derby database takes one Spark "
                "at a time. Wait for it to end, or give another --spark-dir"), args
        assert not marker.exists()
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        assert first.stderr is not None
        first.stderr.close()
    assert first_marker.exists()  # the first one did start its (stub) Java
    # and once it is gone, the lock is free again: the next command gets as far as Java
    assert "nothing is attached" not in _run(env, "attach", str(CATALOG / "word_counts")).stderr
    assert marker.exists()


# -- Ctrl-C during sql --spark on a server ------------------------------------------------------


class _ConnectServer:
    """A Spark Connect endpoint of a statement that never ends: ``ExecutePlan`` says it started
    and waits until the client cancels; ``Interrupt`` answers that it interrupted the operation
    it names. statequery's client speaks to it as to Spark's (statequery/cli/connect.py)."""

    def __init__(self) -> None:
        import grpc

        self.executing = threading.Event()
        self.interrupted: list[str] = []
        handlers = {
            "ExecutePlan": grpc.unary_stream_rpc_method_handler(self._execute),
            "Interrupt": grpc.unary_unary_rpc_method_handler(self._interrupt),
            "ReleaseSession": grpc.unary_unary_rpc_method_handler(lambda request, context: b""),
        }
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("spark.connect.SparkConnectService", handlers),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _execute(self, request: bytes, context: Any) -> Iterator[bytes]:
        self.executing.set()
        done = threading.Event()
        context.add_callback(done.set)
        done.wait(120)  # until the client cancels (bounded)
        return iter(())

    def _interrupt(self, request: bytes, context: Any) -> bytes:
        from statequery.cli.connect import _fields, _text

        ids = [bytes(v).decode() for n, w, v in _fields(request) if n == 6 and w == 2]
        self.interrupted += ids
        return b"".join(_text(2, i) for i in ids)


def test_ctrl_c_of_sql_spark_on_a_server_is_an_interrupt_exit_130(tmp_path: Path) -> None:
    server = _ConnectServer()
    folder = tmp_path / "spark"
    _server_json(folder, server)
    env = dict(os.environ, STATEQUERY_SPARK_DIR=str(folder), PYTHONPATH=str(REPO))
    proc = subprocess.Popen([*CLI, "sql", "--spark", "SELECT sum(id) FROM range(1000000000000)"],
                            env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert server.executing.wait(120), "the statement never reached the server"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        server.server.stop(None)
    assert (proc.returncode, out, err) == (
        130, "", "statequery: interrupted: the server stopped the statement\n")
    assert len(server.interrupted) == 1


def _server_json(folder: Path, server: _ConnectServer) -> None:
    """server.json and the token file as statequery serve writes them; this test process plays
    the server's pid."""
    from statequery.serverinfo import token_file, write_token

    folder.mkdir(parents=True, exist_ok=True)
    write_token(folder)
    (folder / "server.json").write_text(json.dumps({
        "token_file": str(token_file(folder)),
        "pid": os.getpid(), "host": "127.0.0.1", "port": server.port,
        "connect_port": server.port, "connect": f"sc://127.0.0.1:{server.port}",
        "url": f"jdbc:hive2://127.0.0.1:{server.port}/default", "catalog": str(CATALOG),
    }))


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True,
                          timeout=60).stdout


def _wait_for_screen(session: str, text: str, last_line: str | None = None) -> str:
    """The pane once it shows ``text`` (and, if given, ends with the line ``last_line``:
    the shell draws its prompt a few characters at a time, so a capture taken in between
    ends with a part of it); polled, bounded."""
    deadline = time.monotonic() + 120
    screen = ""
    while time.monotonic() < deadline:
        screen = _tmux("capture-pane", "-p", "-J", "-S", "-200", "-t", session)
        if text in screen and (last_line is None
                               or screen.rstrip().splitlines()[-1] == last_line):
            return screen
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never showed (last line {last_line!r}); the screen:\n"
                         f"{screen[-3000:]}")


def test_ctrl_c_in_the_interactive_shell_says_the_server_stopped_the_statement(
        tmp_path: Path) -> None:
    import uuid

    server = _ConnectServer()
    folder = tmp_path / "spark"
    _server_json(folder, server)
    variables = dict(STATEQUERY_SPARK_DIR=str(folder), PYTHONPATH=str(REPO),
                     STATEQUERY_SHELL_HISTORY=str(tmp_path / "history"))
    script = tmp_path / "shell.sh"
    script.write_text(
        "#!/bin/sh\ntrap : INT\n" + " ".join(f"{k}='{v}'" for k, v in variables.items())
        + f" {sys.executable} -m statequery.cli shell -S\necho SHELL-EXIT=$?\nsleep 300\n"
    )
    script.chmod(0o755)
    session = f"sq-{uuid.uuid4().hex[:8]}"
    _tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "40", "-c", str(REPO),
          str(script))
    try:
        _wait_for_screen(session, "statequery (default)> ")
        _tmux("send-keys", "-t", session, "-l", "SELECT sum(id) FROM range(1000000000000)")
        _tmux("send-keys", "-t", session, "-H", "3b")  # ;
        _tmux("send-keys", "-t", session, "Enter")
        assert server.executing.wait(120), "the statement never reached the server"
        _tmux("send-keys", "-t", session, "C-c")
        screen = _wait_for_screen(session, "Interrupted: the server stopped the statement",
                                  last_line="statequery (default)>")  # it goes on
        after = screen.split("Interrupted: the server stopped the statement", 1)[1]
        assert "Traceback" not in after and "statequery (default)>" in after
        _tmux("send-keys", "-t", session, "C-d")
        assert "SHELL-EXIT=0" in _wait_for_screen(session, "SHELL-EXIT=")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, timeout=60)
        server.server.stop(None)
    assert len(server.interrupted) == 1
