"""``statequery serve``: one long-lived local Spark, with the catalog attached, for many clients.

The server is PySpark's own Spark with two servers started in it, both in pyspark's jars:
Spark Connect (gRPC: ``sc://host:port``, for ``statequery sql --spark``, PySpark's
``SparkSession.builder.remote(...)`` and any Connect client) and Spark's Thrift JDBC server
(HiveServer2: ``jdbc:hive2://host:port``, for ``beeline``, ``statequery shell`` and JDBC/ODBC
tools). Both listen on loopback by default and serve the one session that attached the catalog
(Connect gives each client a new session of it: same catalog, its own settings). It shares the
metastore folder of the console script (:mod:`statequery.spark.session`) and writes
``server.json`` there (pid, host, ports, URLs) once both accept connections; the clients find
it there; ``statequery serve --stop`` ends it.

One Spark holds the embedded Derby metastore, so while the server runs every client goes
through it (a second Spark on the same folder is refused: see ``metastore_holder``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from statequery.cli.serverinfo import _accepts, _alive, running_server, state_file

__all__ = [
    "beeline_argv", "connect_url", "free_port", "running_server", "serve", "state_file",
    "stop_server",
]


def free_port(host: str) -> int:
    import socket

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


def connect_url(host: str, port: int) -> str:
    return f"sc://{host}:{port}"


def serve(
    folder: Path, master: str, catalog: str, host: str, port: int, connect_port: int
) -> int:
    """Run the server in this process until SIGTERM or SIGINT (``statequery serve`` starts it
    detached, with its output in ``server.log``)."""
    from statequery.spark.catalog import attach
    from statequery.spark.session import local_session, stop_session

    # HiveServer2 takes its address from these variables before its configuration
    os.environ["HIVE_SERVER2_THRIFT_PORT"] = str(port)
    os.environ["HIVE_SERVER2_THRIFT_BIND_HOST"] = host
    connect_conf = {
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(connect_port),
        "spark.connect.grpc.port.maxRetries": "0",  # that port or none: server.json names it
    }
    session = local_session(folder, master=master, app="statequery-server", conf=connect_conf)
    stopping = []

    def _stop(signum: int, frame: Any) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    server = None
    connect = None
    try:
        names = attach(session, catalog, keep_unchanged=True)
        print(f"statequery: databases of {catalog}: {', '.join(names)}", flush=True)
        _warm_up(session, names)
        jvm = session.sparkContext._jvm
        server = jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2.startWithSparkSession(
            session._jsparkSession, False
        )
        connect = jvm.org.apache.spark.sql.connect.service.SparkConnectService
        connect.start(session.sparkContext._jsc.sc())
        deadline = time.monotonic() + 120
        for what, p in (("Thrift", port), ("Connect", connect_port)):
            while not _accepts(host, p):
                if time.monotonic() > deadline or stopping:
                    raise RuntimeError(f"the {what} server did not listen on {host}:{p}")
                time.sleep(0.2)
        info = {"pid": os.getpid(), "host": host, "port": port, "url": jdbc_url(host, port),
                "connect_port": connect_port, "connect": connect_url(host, connect_port),
                "master": master, "catalog": catalog, "spark": session.version,
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        tmp = state_file(folder).with_suffix(".tmp")
        tmp.write_text(json.dumps(info, indent=2) + "\n")
        tmp.replace(state_file(folder))
        print(f"statequery: serving {info['url']} and {info['connect']} (pid {info['pid']})",
              flush=True)
        while not stopping:
            time.sleep(0.5)
    finally:
        state_file(folder).unlink(missing_ok=True)
        if connect is not None:
            try:
                connect.stop(getattr(connect, "stop$default$1")(),
                             getattr(connect, "stop$default$2")())
            except Exception:  # noqa: BLE001 - stopping anyway
                pass
        if server is not None:
            try:
                server.stop()
            except Exception:  # noqa: BLE001 - stopping anyway
                pass
        stop_session(session)
        print("statequery: server stopped", flush=True)
    return 0


def _warm_up(session: Any, databases: list[str]) -> None:
    """Read one table before saying the server is ready: the first read of a Spark starts its
    Python worker daemon and imports statequery in the workers (seconds), which the first
    client would otherwise wait for."""
    if not databases:
        return
    name = databases[0].replace("`", "``")
    started = time.monotonic()
    session.sql(f"SELECT count(*) FROM `{name}`.state_meta").collect()
    print(f"statequery: warmed up in {time.monotonic() - started:.1f} s", flush=True)


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
    """``python -m statequery.spark.server FOLDER MASTER CATALOG HOST PORT CONNECT_PORT`` (what
    ``serve`` starts)."""
    folder, master, catalog, host, port, connect_port = argv
    return serve(Path(folder), master, catalog, host, int(port), int(connect_port))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
