"""The watchdog of tests/support/cluster.py: what it guards dies when the process that started it
dies, or when its lifetime is over (no Spark needed: stand-in process groups)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from support import cluster


def _group(tmp_path: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        ["sh", "-c", "sleep 600 & sleep 600"], start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    with open(tmp_path / "groups", "a", encoding="ascii") as f:
        f.write(f"{proc.pid}\n")
    return proc


def _watchdog(parent: int, lifetime: float, tmp_path: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, cluster.__file__, "--watchdog", str(parent), str(lifetime),
         str(tmp_path / "groups")],
        start_new_session=True, stderr=subprocess.PIPE,
    )


def _wait_gone(pgid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not cluster._group_alive(pgid):
            return True
        time.sleep(0.2)
    return False


def test_kills_the_group_when_the_starter_dies(tmp_path: Path) -> None:
    starter = subprocess.Popen(["sleep", "600"])
    group = _group(tmp_path)
    dog = _watchdog(starter.pid, 600, tmp_path)
    time.sleep(1.5)
    assert cluster._group_alive(group.pid)  # the starter lives: nothing is killed
    starter.kill()
    starter.wait()
    try:
        assert _wait_gone(group.pid), "the watchdog left the group alive"
        assert dog.wait(timeout=30) == 0
        assert b"its starter died" in dog.stderr.read()  # type: ignore[union-attr]
    finally:
        cluster._kill_groups([group.pid])
        group.wait()
        dog.kill()


def test_kills_the_group_after_its_lifetime(tmp_path: Path) -> None:
    group = _group(tmp_path)
    dog = _watchdog(os.getpid(), 2, tmp_path)
    try:
        assert _wait_gone(group.pid), "the watchdog left the group alive"
        assert dog.wait(timeout=30) == 0
        assert b"lifetime 2 s over" in dog.stderr.read()  # type: ignore[union-attr]
    finally:
        cluster._kill_groups([group.pid])
        group.wait()
        dog.kill()


def test_exits_by_itself_once_the_group_is_gone(tmp_path: Path) -> None:
    group = _group(tmp_path)
    dog = _watchdog(os.getpid(), 600, tmp_path)
    time.sleep(1.5)
    cluster._kill_groups([group.pid])
    group.wait()
    assert dog.wait(timeout=30) == 0
