"""The Spark commands of the console script: ``attach``, ``detach``, ``shell`` and ``sql --spark``.

They share one local metastore (:mod:`statequery.spark.session`), so what ``attach`` creates is
there for ``shell``, ``sql --spark`` and any ``spark-sql`` given the same settings
(``statequery shell --print-command`` prints them).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from statequery.spark.catalog import AttachPlan

__all__ = ["add_parsers", "run"]


def add_parsers(sub: Any) -> None:
    a = sub.add_parser("attach", help="make savepoints databases in Spark's catalog (persistent)")
    a.add_argument("path", nargs="?",
                   help="a savepoint, or a folder of savepoints (default: the shipped catalog/)")
    a.add_argument("--database", help="the database name (one savepoint only)")
    a.add_argument("--replace", action="store_true", help="re-attach an attached database")
    a.add_argument("--pickled", action="store_true",
                   help="state tables with bytes columns get key_py, user_key_py, value_py (and "
                        "*_py_reason): PyFlink's pickles as JSON text (docs/decoding.md)")
    a.add_argument("--classpath", action="append", default=[], metavar="JAR",
                   help="the job's jar (repeatable): every table reads Kryo values with its "
                        "classes (the table option classpath; docs/decoding.md)")
    a.add_argument("--protobuf-descriptors", metavar="FILE",
                   help="a Protobuf descriptor set: every table decodes Protobuf messages kept "
                        "through Kryo with it (docs/decoding.md)")
    a.add_argument("--print", dest="print_sql", action="store_true",
                   help="print the SQL statements instead of running them (for spark-sql -f)")
    _spark_args(a)

    d = sub.add_parser("detach", help="drop databases made by attach (the savepoints stay)")
    d.add_argument("databases", nargs="+")
    _spark_args(d)

    sh = sub.add_parser(
        "shell", help="a Spark SQL shell with every savepoint of a catalog attached",
        description="An interactive Spark SQL shell on the local metastore, with every savepoint "
                    "of the catalog attached as a database: spark-sql, or, while statequery "
                    "serve runs, a shell on its Spark Connect server that opens at once "
                    "(--beeline: beeline on its JDBC server). -e, -f, -i, -S and --database are "
                    "spark-sql's, and -e/-f print what spark-sql prints (tab-separated rows); "
                    "anything after -- goes to spark-sql (or beeline) as it is. "
                    "Example: statequery shell -e \"SHOW DATABASES\"",
    )
    sh.add_argument("--catalog", help="the catalog folder (default: the shipped catalog/)")
    sh.add_argument("--print-command", action="store_true",
                    help="print the spark-sql command line (on a server: beeline's) instead of "
                         "running it")
    sh.add_argument("-e", dest="sql_e", metavar="SQL",
                    help="run these statements (separated by ;) and exit")
    sh.add_argument("-f", dest="sql_f", metavar="FILE", help="run the statements of FILE and exit")
    sh.add_argument("-i", dest="sql_i", metavar="FILE",
                    help="run the statements of FILE first, then go on")
    sh.add_argument("-S", "--silent", action="store_true",
                    help="spark-sql's silent mode: results only, no timing lines")
    sh.add_argument("--database", dest="sql_database", metavar="NAME",
                    help="the database to start in (USE NAME)")
    sh.add_argument("--beeline", action="store_true",
                    help="on a running server: beeline (JDBC, a JVM) instead of the shell on "
                         "Spark Connect")
    sh.add_argument("spark_sql_args", nargs=argparse.REMAINDER,
                    help="after --: passed on to spark-sql as they are")
    _spark_args(sh)


    sv = sub.add_parser(
        "serve", help="one long-lived local Spark with the catalog attached (Connect, JDBC)",
        description="Start a local Spark with Spark Connect and Spark's Thrift JDBC server, "
                    "the catalog attached, "
                    "in the background: statequery shell and statequery sql --spark then "
                    "connect to it instead of starting a Spark each. Everything it opens "
                    "listens on loopback only; every client needs its token, which it writes to "
                    "server.token (0600) in the metastore folder, next to server.json (its "
                    "address); statequery's own clients read it (docs/security.md).",
    )
    sv.add_argument("--catalog", help="the catalog folder (default: the shipped catalog/)")
    sv.add_argument("--host", default="127.0.0.1",
                    help="the loopback address to listen on (default: 127.0.0.1; ::1; no other)")
    sv.add_argument("--ui", action="store_true",
                    help="start the Spark UI too (on 127.0.0.1, password: the token)")
    sv.add_argument("--port", type=int, default=0,
                    help="the Thrift JDBC server's port (default: a free one)")
    sv.add_argument("--connect-port", type=int, default=0,
                    help="the Spark Connect server's port (default: a free one)")
    sv.add_argument("--stop", action="store_true", help="stop the running server")
    sv.add_argument("--status", action="store_true", help="say whether a server runs, and where")
    _spark_args(sv)


def _spark_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spark-dir",
                   help="metastore + warehouse folder (default: $STATEQUERY_SPARK_DIR or "
                        "~/.local/share/statequery/spark)")
    p.add_argument("--master", default="local[*]", help="Spark master (default: local[*])")


def _say(message: str) -> None:
    print(f"statequery: {message}", file=sys.stderr, flush=True)


class SparkCommandError(Exception):
    """A user error of a Spark command (the metastore is busy, ...): one line, no traceback."""


class SparkCommandInterrupted(Exception):
    """Ctrl-C stopped a statement (what became of it on the server, one line): exit 130."""


def _server_holds(folder: Path, server: dict[str, Any]) -> SparkCommandError:
    return SparkCommandError(
        f"the metastore in {folder} is in use by the statequery server at "
        f"{server['url']} (pid {server['pid']}): shell and sql --spark go through it; "
        "for this command stop it first (statequery serve --stop)"
    )


def _check_metastore(folder: Path) -> None:
    from statequery.spark.session import metastore_holder

    holder = metastore_holder(folder)
    if holder is not None:
        from statequery.spark.server import running_server

        server = running_server(folder)
        if server is not None:
            raise _server_holds(folder, server)
        raise SparkCommandError(
            f"the metastore in {folder} is in use by {holder}: its embedded Derby database "
            "takes one Spark at a time. Leave that one first, or give another --spark-dir"
        )


#: the name each Spark command gives itself in the metastore lock
_COMMAND_NAMES = {"sql": "sql --spark"}


def _lock(args: argparse.Namespace, folder: Path) -> int | None:
    """Take the metastore lock of ``folder`` (:func:`statequery.serverinfo.lock_metastore`)
    before any Spark starts: a second command started while this one is still starting its Spark
    refuses at once, in one line, instead of booting a second Spark on the same Derby database."""
    from statequery.serverinfo import MetastoreBusy, lock_metastore, running_server

    try:
        return lock_metastore(folder, _COMMAND_NAMES.get(args.command, args.command))
    except MetastoreBusy as e:
        server = running_server(folder)
        if server is not None:
            raise _server_holds(folder, server) from None
        _check_metastore(folder)  # a JVM that has the Derby database booted: named as such
        raise SparkCommandError(
            f"the metastore in {folder} is in use by {e.holder}, which starts or runs its "
            "Spark: the embedded Derby database takes one Spark at a time. Wait for it to end, "
            "or give another --spark-dir"
        ) from None


def _session(args: argparse.Namespace) -> Any:
    from statequery.serverinfo import spark_dir

    folder = spark_dir(args.spark_dir)
    _lock(args, folder)  # first, before PySpark is even imported
    from statequery.spark.session import local_session

    _check_metastore(folder)
    _say(f"starting Spark ({args.master}), metastore in {folder} ...")
    started = time.monotonic()
    session = local_session(folder, master=args.master)
    _say(f"Spark {session.version} ready in {time.monotonic() - started:.1f} s")
    return session


def run(args: argparse.Namespace) -> int | None:
    """Run a Spark command; None when ``args.command`` is not one of them."""
    if args.command not in ("attach", "detach", "shell", "serve") and not (
        args.command == "sql" and getattr(args, "spark", False)
    ):
        return None
    from statequery.serverinfo import release_metastore

    try:
        return _run(args)
    except SparkCommandInterrupted as e:
        print(f"statequery: {e}", file=sys.stderr)
        return 130
    except SparkCommandError as e:
        print(f"statequery: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # Spark's errors (pyspark.errors), without importing pyspark here
        if not type(e).__module__.startswith(("pyspark", "py4j")):
            raise
        print(f"statequery: {spark_error_message(e)}", file=sys.stderr)
        return 1
    finally:
        release_metastore()


def spark_error_message(e: BaseException) -> str:
    """One line for a Spark error: statequery's own message when the data source raised it."""
    import re

    text = str(e)
    found = re.findall(r"statequery\.exceptions\.\w+: (.*)", text)
    if found:
        return str(found[-1]).strip()
    return text.strip().splitlines()[0] if text.strip() else type(e).__name__


def _check_detach(args: argparse.Namespace) -> None:
    """Refuse, before any Spark starts, to detach what cannot be attached: a name ``attach``
    never makes, or, with the embedded metastore, a database with no folder in its warehouse
    (Spark's Hive metastore makes ``WAREHOUSE/NAME.db`` for each database it creates and
    deletes it with the database)."""
    from statequery.serverinfo import embedded_metastore, folder_conf, spark_dir

    folder = spark_dir(args.spark_dir)
    for name in args.databases:
        if not re.fullmatch(r"[A-Za-z0-9_]+", name):
            raise SparkCommandError(
                f"no database {name!r} to detach: statequery attach makes database names of "
                "letters, digits and _ only"
            )
    if not embedded_metastore(folder):
        return  # a metastore on a database server: only a Spark can tell
    warehouse = folder_conf(folder).get("spark.sql.warehouse.dir", str(folder / "warehouse"))
    if "://" in warehouse and not warehouse.startswith("file:"):
        return
    warehouse = re.sub(r"^file:(//)?", "", warehouse)
    if not (folder / "metastore_db").is_dir():
        raise SparkCommandError(
            f"no database {args.databases[0]!r} to detach: nothing is attached in {folder} "
            "(statequery attach makes databases there)"
        )
    for name in args.databases:
        if not os.path.isdir(os.path.join(warehouse, f"{name.lower()}.db")):
            raise SparkCommandError(
                f"no database {name!r} to detach: the metastore in {folder} has none of that "
                "name"
            )


def _run(args: argparse.Namespace) -> int | None:
    from statequery.catalog import DEFAULT_CATALOG

    if args.command == "attach":
        from statequery.spark.catalog import attach, attach_plans

        path = args.path or DEFAULT_CATALOG
        # before any Spark: a wrong path or name is said at once
        plans = attach_plans(path, args.database, args.pickled, ",".join(args.classpath) or None,
                             args.protobuf_descriptors)
        if args.print_sql:
            for plan in plans:
                for statement in plan.statements(replace=args.replace):
                    print(statement + ";")
            return 0
        with _spark_session(args) as spark:
            names = attach(spark, path, args.database, replace=args.replace,
                           pickled=args.pickled, plans=plans)
            for name in names:
                tables = spark.sql(f"SHOW TABLES IN `{name.replace('`', '``')}`").count()
                _say(f"attached database {name} ({tables} tables)")
        return 0
    if args.command == "detach":
        from statequery.spark.catalog import detach

        _check_detach(args)
        with _spark_session(args) as spark:
            for name in detach(spark, args.databases):
                _say(f"detached database {name} (the savepoint is untouched)")
        return 0
    if args.command == "shell":
        return _shell(args)
    if args.command == "serve":
        return _serve(args)
    return _sql(args)


def _serve(args: argparse.Namespace) -> int:
    import subprocess

    from statequery.spark.server import (
        check_loopback,
        free_port,
        running_server,
        state_file,
        stop_server,
    )
    from statequery.spark.session import spark_dir

    folder = spark_dir(args.spark_dir)
    host = check_loopback(args.host)
    if args.stop:
        stopped = stop_server(folder)
        _say(f"stopped the server at {stopped['url']} (pid {stopped['pid']})" if stopped
             else f"no server runs on {folder}")
        return 0
    info = running_server(folder)
    if info is not None:
        _say(f"a server already runs: {info['url']} and {info.get('connect', '-')} "
             f"(pid {info['pid']}, catalog "
             f"{info['catalog']}); statequery serve --stop stops it")
        return 0
    if args.status:
        _say(f"no server runs on {folder}")
        return 3
    catalog, _ = _catalog_plans(args)  # a wrong catalog is said before any Spark starts
    catalog = os.path.abspath(catalog)
    lock = _lock(args, folder)  # passed on to the server, which holds it while it runs
    _check_metastore(folder)
    from statequery.spark.jvm import serve_auth_jar_path

    if serve_auth_jar_path() is None:
        raise SparkCommandError(
            "statequery serve needs javac (a JDK 17+) on PATH or in JAVA_HOME to build the "
            "password check of its Thrift server (docs/security.md); without it the server would "
            "take any client"
        )
    folder.mkdir(parents=True, exist_ok=True)
    port = args.port or free_port(host)
    connect_port = args.connect_port or free_port(host)
    if connect_port == port:
        connect_port = free_port(host)
    log = folder / "server.log"
    _say(f"starting the server ({args.master}, metastore in {folder}, log {log}) ...")
    started = time.monotonic()
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    # the log holds the statements of every client: the server's user's only
    with os.fdopen(os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab") as out:
        os.fchmod(out.fileno(), 0o600)
        proc = subprocess.Popen(
            [sys.executable, "-m", "statequery.spark.server", str(folder), args.master, catalog,
             host, str(port), str(connect_port), *(["ui"] if args.ui else [])],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            cwd=folder, start_new_session=True, pass_fds=() if lock is None else (lock,),
        )
    if lock is not None:  # the lock now says the server's pid
        os.ftruncate(lock, 0)
        os.pwrite(lock, f"{proc.pid} serve\n".encode(), 0)
    while True:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            raise SparkCommandError(
                "the server did not start: " + (" / ".join(tail) or f"exit {proc.returncode}")
            )
        if state_file(folder).exists():
            info = running_server(folder)
            if info is not None and int(info["pid"]) == proc.pid:
                break
        if time.monotonic() - started > 900:
            proc.terminate()
            raise SparkCommandError(f"the server did not start in 15 minutes (log: {log})")
        time.sleep(0.5)
    _say(f"serving {info['url']} and {info['connect']} (pid {proc.pid}), ready in "
         f"{time.monotonic() - started:.1f} s; statequery shell and statequery sql --spark use "
         "it; statequery serve --stop stops it")
    _say(f"clients need the token in {info['token_file']} (JDBC: any user, the token as the "
         "password; notebooks: statequery.spark.server.remote_session())"
         + (f"; the Spark UI: {info['ui']} (password: the token)" if info.get("ui") else ""))
    return 0


def _server(args: argparse.Namespace) -> dict[str, Any] | None:
    from statequery.serverinfo import running_server, spark_dir

    return running_server(spark_dir(args.spark_dir))


def _beeline(info: dict[str, Any], extra: list[str], database: str | None = None) -> list[str]:
    from statequery.spark.server import beeline_argv

    argv = beeline_argv(info)
    if database:
        argv[2] = str(info["url"]).rsplit("/", 1)[0] + "/" + database
    return argv + extra


def _shell_on_server(args: argparse.Namespace, info: dict[str, Any]) -> int:
    """``statequery shell`` on a running server: the shell on its Spark Connect endpoint
    (:mod:`statequery.cli.sqlshell`), or with ``--beeline`` (or a server without Connect)
    beeline on its Thrift server."""
    if args.beeline or args.print_command or not info.get("connect"):
        return _beeline_shell(args, info)
    rest = list(args.spark_sql_args)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if rest:
        raise SparkCommandError(
            f"{' '.join(rest)}: arguments after -- are for spark-sql (no server) or beeline "
            "(statequery shell --beeline -- ...)"
        )
    from statequery.cli.sqlshell import run_shell

    script = args.sql_e
    if args.sql_f is not None:
        script = _read_text(args.sql_f)
    init = _read_text(args.sql_i) if args.sql_i is not None else None
    return run_shell(info, args.sql_database, script, init, args.silent)


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise SparkCommandError(f"{path}: cannot read it: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SparkCommandError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _beeline_shell(args: argparse.Namespace, info: dict[str, Any]) -> int:
    """beeline on the server's Thrift JDBC server, spark-sql's options translated."""
    import subprocess

    extra: list[str] = []
    if args.sql_i:
        extra += ["-i", args.sql_i]
    if args.silent:
        extra += ["--silent=true", "--outputformat=tsv2", "--showHeader=false"]
    if args.sql_e is not None:
        extra += ["-e", args.sql_e]
    if args.sql_f is not None:
        extra += ["-f", args.sql_f]
    rest = list(args.spark_sql_args)
    extra += rest[1:] if rest and rest[0] == "--" else rest
    argv = _beeline(info, extra, args.sql_database)
    if args.print_command:
        import shlex

        print(shlex.join(argv))
        return 0
    _say(f"connecting to the server at {info['url']} (pid {info['pid']})")
    if args.sql_e is None and args.sql_f is None:
        return subprocess.call(argv)  # interactive: beeline has the terminal
    # -e / -f: beeline prints its prompt before each result even when silent; drop it
    with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True) as p:
        assert p.stdout is not None
        for line in p.stdout:
            sys.stdout.write(_BEELINE_PROMPT.sub("", line))
            sys.stdout.flush()
    return p.returncode


_QUERY_START = ("select", "with", "from", "values", "table", "(")
#: what beeline prints before a result line in -e mode: ``0: jdbc:hive2://host:port/db> ``
_BEELINE_PROMPT = re.compile(r"^\d+: jdbc:hive2://[^ ]*> ")


def _sql_on_server(args: argparse.Namespace, info: dict[str, Any]) -> pa.Table:
    """Run ``args.query`` on the server; its rows as an Arrow table (a query's rows go through
    ``to_json``, so they keep their types; other statements give strings)."""
    import json
    import subprocess

    import pyarrow as pa

    query = args.query.strip().rstrip(";").strip()
    wrapped = query.lower().startswith(_QUERY_START)
    sql = f"SELECT to_json(struct(*)) FROM ({query}) statequery_q" if wrapped else query
    argv = _beeline(info, ["--silent=true", "--outputformat=tsv2",
                           f"--showHeader={'false' if wrapped else 'true'}", "-e", sql])
    proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SparkCommandError(_beeline_error(proc.stderr))
    lines = [_BEELINE_PROMPT.sub("", ln) for ln in proc.stdout.splitlines()]
    lines = [ln for ln in lines if ln.strip()]
    if wrapped:
        return pa.Table.from_pylist([json.loads(ln) for ln in lines])
    if not lines:
        return pa.table({})
    header = lines[0].split("\t")
    rows = [ln.split("\t") for ln in lines[1:]]
    return pa.table({h: [r[i] if i < len(r) else None for r in rows]
                     for i, h in enumerate(header)})


def _sql_on_connect(args: argparse.Namespace, info: dict[str, Any]) -> pa.Table:
    """Run ``args.query`` on the server's Spark Connect endpoint; its rows as an Arrow table."""
    from statequery.cli.connect import ConnectError, Interrupted, connect_error, run_sql
    from statequery.serverinfo import server_token

    try:
        return run_sql(str(info["host"]), int(info["connect_port"]), args.query,
                       token=server_token(info))
    except ConnectError as e:
        raise SparkCommandError(connect_error(str(e))) from None
    except Interrupted as e:  # Ctrl-C: "interrupted: the server stopped the statement"
        raise SparkCommandInterrupted(str(e)) from None


def _beeline_error(stderr: str) -> str:
    """One line for what beeline printed about a failed statement: statequery's own message when
    the data source raised it, else Spark's error without the JDBC wrapping."""
    found = re.findall(r"statequery\.exceptions\.\w+: (.*)", stderr)
    if found:
        return str(found[-1]).strip()
    lines = [ln for ln in stderr.splitlines() if ln.startswith("Error:")]
    line = lines[-1] if lines else (stderr.strip().splitlines() or ["beeline failed"])[-1]
    line = re.sub(r"^Error: ", "", line)
    line = re.sub(r"^(\S+Exception: )?Error running query: ", "", line)
    line = re.sub(r"^(\[\w+\] )?\S+AnalysisException: ", "", line)
    return re.sub(r" \(state=[^)]*\)$", "", line).strip()


def _catalog_plans(args: argparse.Namespace) -> tuple[str, list[AttachPlan]]:
    """The catalog of ``shell``/``sql --spark`` and what attaching it makes, found before any
    Spark starts: a missing or wrong catalog is said at once."""
    from statequery.catalog import DEFAULT_CATALOG
    from statequery.spark.catalog import attach_plans

    catalog = args.catalog or DEFAULT_CATALOG
    return catalog, attach_plans(catalog)


def _attach_catalog(
    spark: Any, catalog: str, plans: list[AttachPlan] | None = None
) -> None:
    from statequery.spark.catalog import attach

    names = attach(spark, catalog, keep_unchanged=True, plans=plans)
    _say(f"databases of {catalog}: {', '.join(names)}")


@contextlib.contextmanager
def _spark_session(args: argparse.Namespace) -> Iterator[Any]:
    """A local session that is stopped with its JVM at the end. A Spark error becomes its one
    line while the JVM still runs (PySpark's exceptions ask the JVM for their text)."""
    import signal

    from statequery.spark.session import stop_session

    spark = _session(args)
    # PySpark's own Ctrl-C handler cancels the running jobs; the call that waited for them then
    # fails with a Py4J error ("An error occurred while calling o199.getResult"), which is the
    # user's interrupt, not an error
    interrupted: list[int] = []
    previous = signal.getsignal(signal.SIGINT)

    def on_interrupt(signum: int, frame: FrameType | None) -> None:
        import logging

        interrupted.append(signum)
        # the command only winds down now: no Py4J log of the call the interrupt broke (a
        # traceback on the root logger)
        logging.disable(logging.CRITICAL)
        if callable(previous):
            previous(signum, frame)
        raise KeyboardInterrupt

    watching = _in_main_thread()
    if watching:
        signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield spark
    except Exception as e:
        if not type(e).__module__.startswith(("pyspark", "py4j")):
            raise
        if interrupted:
            raise SparkCommandInterrupted("interrupted: Spark's jobs were cancelled") from None
        raise SparkCommandError(spark_error_message(e)) from None
    finally:
        if watching:
            signal.signal(signal.SIGINT, previous)
        stop_session(spark)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _shell_args(args: argparse.Namespace) -> list[str]:
    """The spark-sql arguments of ``statequery shell``'s own options, then those after --."""
    out: list[str] = []
    if args.sql_database:
        out += ["--database", args.sql_database]
    if args.sql_i:
        out += ["-i", args.sql_i]
    if args.silent:
        out.append("-S")
    if args.sql_e is not None:
        out += ["-e", args.sql_e]
    if args.sql_f is not None:
        out += ["-f", args.sql_f]
    rest = list(args.spark_sql_args)
    if rest and rest[0] == "--":
        rest = rest[1:]
    return out + rest


def _shell(args: argparse.Namespace) -> int:
    """Attach the catalog in a PySpark session whose JVM then exits, then run spark-sql.

    The embedded Derby metastore takes one JVM at a time: the attaching JVM must be gone
    (:func:`statequery.spark.session.stop_session`) before spark-sql boots the metastore.
    """
    import subprocess

    from statequery.serverinfo import spark_dir

    if args.sql_e is not None and args.sql_f is not None:
        raise SparkCommandError("give -e or -f, not both")
    folder = spark_dir(args.spark_dir)
    info = _server(args)
    if info is not None:
        return _shell_on_server(args, info)
    if args.print_command:
        import shlex

        from statequery.spark.session import spark_sql_argv

        print(shlex.join(spark_sql_argv(folder, args.master) + _shell_args(args)))
        return 0
    for given in (args.sql_f, args.sql_i):  # spark-sql reads them, after Spark started
        if given is not None:
            _read_text(given)
    catalog, plans = _catalog_plans(args)
    with _spark_session(args) as spark:
        _attach_catalog(spark, catalog, plans)
    from statequery.spark.session import spark_sql_argv

    argv = spark_sql_argv(folder, args.master) + _shell_args(args)
    _check_metastore(folder)
    if args.sql_e is None and args.sql_f is None:
        _say("starting spark-sql (SHOW DATABASES; USE <database>; SHOW TABLES; ...)")
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("SPARK_HOME", str(os.path.dirname(os.path.dirname(argv[0]))))
    return subprocess.call(argv, env=env)


def _sql(args: argparse.Namespace) -> int:
    import json

    info = _server(args)
    if info is not None:
        if args.catalog and os.path.abspath(args.catalog) != info["catalog"]:
            raise SparkCommandError(
                f"the server at {info['url']} serves the catalog {info['catalog']}, not "
                f"{args.catalog}: stop it (statequery serve --stop) or use another --spark-dir"
            )
        started = time.monotonic()
        if info.get("connect"):
            table = _sql_on_connect(args, info)
            where = info["connect"]
        else:  # a server of an older statequery: Thrift only
            table = _sql_on_server(args, info)
            where = info["url"]
        _say(f"ran on the server at {where} in {time.monotonic() - started:.1f} s")
    else:
        catalog, plans = _catalog_plans(args)
        with _spark_session(args) as spark:
            _attach_catalog(spark, catalog, plans)
            table = spark.sql(args.query).toArrow()
    from statequery.cli.output import _json_default, _print_rows

    if args.json:
        for row in table.to_pylist():
            sys.stdout.write(json.dumps(row, default=_json_default, ensure_ascii=False) + "\n")
    else:
        _print_rows(table, "sql (Spark)")
    return 0
