"""``statequery serve``: one long-lived local Spark, with the catalog attached, for many clients.

The server is PySpark's own Spark with Spark's Thrift JDBC server (HiveServer2, shipped in
pyspark's jars) started in it: it listens on loopback by default, shares the metastore folder
of the console script (:mod:`statequery.spark.session`), and writes ``server.json`` there (its
pid, host, port and JDBC URL) once it accepts connections. ``statequery shell`` and
``statequery sql --spark`` find that file and connect with pyspark's ``beeline`` instead of
starting a Spark of their own; ``statequery serve --stop`` ends it.

One Spark holds the embedded Derby metastore, so while the server runs every client goes
through it (a second Spark on the same folder is refused: see ``metastore_holder``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["beeline_argv", "free_port", "running_server", "serve", "state_file", "stop_server"]


def state_file(folder: Path) -> Path:
    """Where a running server says where it listens (in the metastore folder)."""
    return folder / "server.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def running_server(folder: Path) -> dict[str, Any] | None:
    """The server of ``folder`` (what it wrote in ``server.json``) when it runs, else None.

    A file left by a server that died is removed.
    """
    path = state_file(folder)
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not _alive(int(info.get("pid", 0))):
        path.unlink(missing_ok=True)
        return None
    if not _accepts(str(info["host"]), int(info["port"])):
        return None  # alive but not (yet, or any more) listening
    return info


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def jdbc_url(host: str, port: int) -> str:
    return f"jdbc:hive2://{host}:{port}/default"


def beeline_argv(info: dict[str, Any]) -> list[str]:
    """The ``beeline`` command line that connects to the server ``info`` describes."""
    from statequery.spark.session import _pyspark_home

    user = os.environ.get("USER") or "statequery"
    return [str(_pyspark_home() / "bin" / "beeline"), "-u", str(info["url"]), "-n", user]


def serve(folder: Path, master: str, catalog: str, host: str, port: int) -> int:
    """Run the server in this process until SIGTERM or SIGINT (``statequery serve`` starts it
    detached, with its output in ``server.log``)."""
    from statequery.spark.catalog import attach
    from statequery.spark.session import local_session, stop_session

    # HiveServer2 takes its address from these variables before its configuration
    os.environ["HIVE_SERVER2_THRIFT_PORT"] = str(port)
    os.environ["HIVE_SERVER2_THRIFT_BIND_HOST"] = host
    session = local_session(folder, master=master, app="statequery-server")
    stopping = []

    def _stop(signum: int, frame: Any) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    server = None
    try:
        names = attach(session, catalog, keep_unchanged=True)
        print(f"statequery: databases of {catalog}: {', '.join(names)}", flush=True)
        jvm = session.sparkContext._jvm
        server = jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2.startWithSparkSession(
            session._jsparkSession, False
        )
        deadline = time.monotonic() + 120
        while not _accepts(host, port):
            if time.monotonic() > deadline or stopping:
                raise RuntimeError(f"the Thrift server did not listen on {host}:{port}")
            time.sleep(0.2)
        info = {"pid": os.getpid(), "host": host, "port": port, "url": jdbc_url(host, port),
                "master": master, "catalog": catalog, "spark": session.version,
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        tmp = state_file(folder).with_suffix(".tmp")
        tmp.write_text(json.dumps(info, indent=2) + "\n")
        tmp.replace(state_file(folder))
        print(f"statequery: serving {info['url']} (pid {info['pid']})", flush=True)
        while not stopping:
            time.sleep(0.5)
    finally:
        state_file(folder).unlink(missing_ok=True)
        if server is not None:
            try:
                server.stop()
            except Exception:  # noqa: BLE001 - stopping anyway
                pass
        stop_session(session)
        print("statequery: server stopped", flush=True)
    return 0


def stop_server(folder: Path, timeout: float = 120.0) -> dict[str, Any] | None:
    """Stop the server of ``folder``; returns what it had written, or None if none ran."""
    path = state_file(folder)
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    pid = int(info.get("pid", 0))
    if not _alive(pid):
        path.unlink(missing_ok=True)
        return None
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
        try:  # our own child (tests): reap it
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    path.unlink(missing_ok=True)
    return dict(info)


def main(argv: list[str]) -> int:
    """``python -m statequery.spark.server FOLDER MASTER CATALOG HOST PORT`` (what ``serve``
    starts)."""
    folder, master, catalog, host, port = argv
    return serve(Path(folder), master, catalog, host, int(port))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
