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

Secure by default (docs/security.md, "statequery serve"): every socket of the server's JVM is
bound to loopback (the driver and its block manager with ``spark.driver.bindAddress``, the Spark
UI, off unless ``ui``, with ``SPARK_LOCAL_IP``), and every client needs the server's token, a
random secret written to ``server.token`` (0600) in the metastore folder: Spark Connect checks
it (``spark.connect.authenticate.token``, given to the JVM in its environment, never on a
command line), the Thrift server takes it as the password (``hive.server2.authentication=CUSTOM``
with ``statequery.serve.TokenAuthenticator``), the Spark UI as the password of a Basic login.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from statequery.exceptions import InvalidOptionError, ServerAccessError
from statequery.serverinfo import (
    TOKEN_ENV,
    _accepts,
    _alive,
    running_server,
    server_token,
    spark_dir,
    state_file,
    token_file,
    write_token,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "beeline_argv", "check_loopback", "connect_url", "free_port", "remote_session",
    "remote_url", "running_server", "serve", "state_file", "stop_server",
]

#: the class of the Thrift server's password check (statequery/spark/java_serve)
AUTHENTICATOR = "statequery.serve.TokenAuthenticator"


def check_loopback(host: str) -> str:
    """``host`` when it is a loopback address (``127.0.0.0/8``, ``::1``, ``localhost``);
    :class:`InvalidOptionError` otherwise: the server speaks no TLS, so its token would cross
    the network in the clear, and its JVM binds its other sockets to loopback anyway."""
    import ipaddress

    if host == "localhost":
        return "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise InvalidOptionError(
            f"--host {host}: not an IP address; statequery serve listens on loopback only "
            "(127.0.0.1 or ::1)"
        ) from None
    if not address.is_loopback:
        raise InvalidOptionError(
            f"--host {host}: not a loopback address; statequery serve listens on loopback only "
            "(no TLS: its token would cross the network in the clear); reach it from another "
            "machine through an SSH tunnel (docs/security.md)"
        )
    return host


def free_port(host: str) -> int:
    """A port free on ``host`` (an IPv4 or IPv6 address) now."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _url_host(host: str) -> str:
    """``host`` as the host of a URL: an IPv6 address in brackets (RFC 3986)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def jdbc_url(host: str, port: int) -> str:
    return f"jdbc:hive2://{_url_host(host)}:{port}/default"


def beeline_argv(info: dict[str, Any]) -> list[str]:
    """The ``beeline`` command line that connects to the server ``info`` describes."""
    from statequery.spark.session import _pyspark_home

    user = os.environ.get("USER") or "statequery"
    server_token(info)  # readable, or one line saying why not
    # -w: beeline reads the password (the token) from the file: never on a command line, which
    # every user of the machine can read in /proc
    return [str(_pyspark_home() / "bin" / "beeline"), "-u", str(info["url"]), "-n", user,
            "-w", str(info["token_file"])]


def connect_url(host: str, port: int) -> str:
    return f"sc://{_url_host(host)}:{port}"


def remote_url(info: dict[str, Any]) -> str:
    """The Spark Connect URL of PySpark's client for the server ``info`` describes, with its
    token (``;token=``): a secret, for ``SparkSession.builder.remote``. The host is
    ``localhost``: with a token and any other host PySpark's client insists on TLS, which the
    server does not speak (on ``localhost`` it uses gRPC's local credentials)."""
    return f"sc://localhost:{int(info['connect_port'])}/;token={server_token(info)}"


def remote_session(folder: str | Path | None = None) -> SparkSession:
    """A PySpark Connect session on the running ``statequery serve`` of ``folder`` (default:
    the console script's, ``$STATEQUERY_SPARK_DIR``), authenticated with its token: what a
    notebook of the server's user calls::

        from statequery.spark.server import remote_session
        spark = remote_session()
        spark.table("user_activity.user_state__count").show()
    """
    from pyspark.sql import SparkSession

    where = spark_dir(str(folder) if folder is not None else None)
    info = running_server(where)
    if info is None:
        raise ServerAccessError(f"no statequery serve runs on {where} (statequery serve)")
    return SparkSession.builder.remote(remote_url(info)).getOrCreate()


def serve(
    folder: Path, master: str, catalog: str, host: str, port: int, connect_port: int,
    ui: bool = False,
) -> int:
    """Run the server in this process until SIGTERM or SIGINT (``statequery serve`` starts it
    detached, with its output in ``server.log``). ``ui``: the Spark UI too, on loopback, behind
    a Basic login whose password is the token."""
    from statequery.spark.catalog import attach
    from statequery.spark.jvm import serve_auth_jar_path
    from statequery.spark.session import folder_conf, local_session, stop_session

    host = check_loopback(host)
    auth_jar = serve_auth_jar_path()
    if auth_jar is None:
        raise ServerAccessError(
            "statequery serve needs javac (a JDK 17+) on PATH or in JAVA_HOME to build the "
            "password check of its Thrift server; without it the server would take any client"
        )
    # the token: in a 0600 file for the clients, in the environment of the JVM (which inherits
    # it; another user cannot read a process's environment) for Connect and the Thrift check
    os.environ[TOKEN_ENV] = write_token(folder)
    # every socket of the JVM on loopback: the driver RPC and block manager (bindAddress), and
    # what Spark binds to SPARK_LOCAL_IP (the UI, which would listen on all interfaces)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # HiveServer2 takes its address from these variables before its configuration
    os.environ["HIVE_SERVER2_THRIFT_PORT"] = str(port)
    os.environ["HIVE_SERVER2_THRIFT_BIND_HOST"] = host
    extra_cp = folder_conf(folder).get("spark.driver.extraClassPath")
    connect_conf = {
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.ui.enabled": "true" if ui else "false",
        "spark.ui.killEnabled": "false",
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(connect_port),
        "spark.connect.grpc.port.maxRetries": "0",  # that port or none: server.json names it
        # the Thrift server's authentication: a password, checked by TokenAuthenticator (the
        # Hadoop configuration is what HiveServer2's HiveConf is made of)
        "spark.hadoop.hive.server2.authentication": "CUSTOM",
        "spark.hadoop.hive.server2.custom.authentication.class": AUTHENTICATOR,
        # the Thrift password check, on the JVM's own class path (HiveServer2 loads it there)
        "spark.driver.extraClassPath": f"{extra_cp}{os.pathsep}{auth_jar}" if extra_cp
        else auth_jar,
    }
    if ui:
        connect_conf["spark.ui.filters"] = "statequery.serve.TokenFilter"
    session = local_session(folder, master=master, app="statequery-server", conf=connect_conf)
    stopping = []

    def _stop(signum: int, frame: FrameType | None) -> None:
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
        assert jvm is not None  # a local session's JVM
        # CustomAuthenticationProviderImpl reads the class from a HiveConf of its own (made of
        # the system properties and hive-site.xml)
        jvm.java.lang.System.setProperty("hive.server2.authentication", "CUSTOM")
        jvm.java.lang.System.setProperty("hive.server2.custom.authentication.class",
                                         AUTHENTICATOR)
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
                "token_file": str(token_file(folder)),
                "ui": session.sparkContext.uiWebUrl if ui else None,
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
        token_file(folder).unlink(missing_ok=True)
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


def _warm_up(session: SparkSession, databases: list[str]) -> None:
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
    token_file(folder).unlink(missing_ok=True)
    return dict(info)


def main(argv: list[str]) -> int:
    """``python -m statequery.spark.server FOLDER MASTER CATALOG HOST PORT CONNECT_PORT [ui]``
    (what ``serve`` starts)."""
    from statequery.exceptions import StatequeryError

    folder, master, catalog, host, port, connect_port = argv[:6]
    try:
        return serve(Path(folder), master, catalog, host, int(port), int(connect_port),
                     ui=argv[6:] == ["ui"])
    except StatequeryError as e:
        print(f"statequery: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
