"""``statequery shell``: spark-sql on the attached catalog, with -e and interactively (tmux).

Each start attaches the shipped catalog in a PySpark session whose JVM then exits, and opens
spark-sql on the same embedded Derby metastore: a second JVM on it would fail with XSDB6.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

CLI = [sys.executable, "-m", "statequery.cli"]
PRUNED = "statequery: user_state__count: key 'user-3' -> key group(s) 40 of 128, 1 partition(s)"
KEY_QUERY = "SELECT key, value FROM user_activity.user_state__count WITH ('key' = 'user-3')"
DATABASES = {"default", "user_activity", "user_activity_rocksdb", "word_counts"}


def _env(folder: Path) -> dict[str, str]:
    return dict(os.environ, STATEQUERY_SPARK_DIR=str(folder), PYSPARK_PYTHON=sys.executable)


def test_shell_e_runs_statements(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*CLI, "shell", "--master", "local[1]", "-S", "-e", f"SHOW DATABASES; {KEY_QUERY}"],
        capture_output=True, text=True, timeout=900, env=_env(tmp_path / "spark"), cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    assert set(lines[:-1]) == DATABASES
    assert lines[-1] == "user-3\t10"
    assert PRUNED in proc.stderr  # the pruned read says so
    assert "XSDB6" not in proc.stderr
    assert not (tmp_path / "derby.log").exists() and not (tmp_path / "metastore_db").exists()


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def _type(session: str, line: str) -> None:
    """Type ``line`` and Enter into the tmux session, as hexadecimal key codes (-H): tmux would
    take an argument's trailing ``;`` for its own command separator."""
    _tmux("send-keys", "-t", session, "-H", *(f"{b:02x}" for b in line.encode()))
    _tmux("send-keys", "-t", session, "Enter")


def _prompts(screen: str) -> int:
    """How many spark-sql prompts (``spark-sql (default)> ``) the screen shows."""
    return sum(1 for ln in screen.splitlines() if ln.startswith("spark-sql ("))


def _wait_for(session: str, predicate, timeout: float) -> str:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = _tmux("capture-pane", "-p", "-J", "-S", "-2000", "-t", session)
        if predicate(screen):
            return screen
        time.sleep(2)
    raise AssertionError(f"timed out; the screen:\n{screen[-4000:]}")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux)")
def test_shell_interactive_and_metastore_in_use(tmp_path: Path) -> None:
    """The shell in a terminal: SHOW DATABASES and a key query; meanwhile a second Spark on the
    same metastore says in one line who holds it."""
    folder = tmp_path / "spark"
    env = _env(folder)
    session = f"sq-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "shell.sh"
    script.write_text(
        "#!/bin/sh\n"
        + " ".join(f"{k}='{v}'" for k, v in (("STATEQUERY_SPARK_DIR", str(folder)),
                                             ("PYSPARK_PYTHON", sys.executable)))
        + f" {sys.executable} -m statequery.cli shell --master 'local[1]' 2>{tmp_path}/err\n"
        f"echo SHELL-EXIT=$?\nsleep 600\n"
    )
    script.chmod(0o755)
    _tmux("new-session", "-d", "-s", session, "-x", "200", "-y", "50", "-c", str(tmp_path),
          str(script))
    try:
        _wait_for(session, lambda s: _prompts(s) >= 1, timeout=900)
        _type(session, "SHOW DATABASES;")
        screen = _wait_for(session, lambda s: _prompts(s) >= 2, 300)
        assert DATABASES <= {ln.strip() for ln in screen.splitlines()}

        # while the shell holds the metastore, another Spark on it is refused in one line
        busy = subprocess.run(
            [*CLI, "sql", "--spark", "--master", "local[1]", "SELECT 1"],
            capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
        )
        assert busy.returncode == 1
        assert busy.stderr.strip().splitlines() == [
            busy.stderr.strip().splitlines()[0]
        ]
        assert busy.stderr.startswith(f"statequery: the metastore in {folder} is in use by "
                                      "process ")
        assert "(spark-sql)" in busy.stderr and "Traceback" not in busy.stderr

        _type(session, KEY_QUERY + ";")
        screen = _wait_for(session, lambda s: _prompts(s) >= 3, 300)
        assert "user-3\t10" in screen or any(
            ln.split() == ["user-3", "10"] for ln in screen.splitlines()
        )
        assert PRUNED in (tmp_path / "err").read_text()
        _type(session, "quit;")
        screen = _wait_for(session, lambda s: "SHELL-EXIT=" in s, 120)
        assert "SHELL-EXIT=0" in screen
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
