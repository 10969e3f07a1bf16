"""The Spark commands of the console script: ``attach``, ``detach``, ``shell`` and ``sql --spark``.

They share one local metastore (:mod:`statequery.spark.session`), so what ``attach`` creates is
there for ``shell``, ``sql --spark`` and any ``spark-sql`` given the same settings
(``statequery shell --print-command`` prints them).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

__all__ = ["add_parsers", "run"]


def add_parsers(sub: Any) -> None:
    a = sub.add_parser("attach", help="make savepoints databases in Spark's catalog (persistent)")
    a.add_argument("path", nargs="?",
                   help="a savepoint, or a folder of savepoints (default: the shipped catalog/)")
    a.add_argument("--database", help="the database name (one savepoint only)")
    a.add_argument("--replace", action="store_true", help="re-attach an attached database")
    a.add_argument("--print", dest="print_sql", action="store_true",
                   help="print the SQL statements instead of running them (for spark-sql -f)")
    _spark_args(a)

    d = sub.add_parser("detach", help="drop databases made by attach (the savepoints stay)")
    d.add_argument("databases", nargs="+")
    _spark_args(d)

    sh = sub.add_parser("shell", help="spark-sql with every savepoint of a catalog attached")
    sh.add_argument("--catalog", help="the catalog folder (default: the shipped catalog/)")
    sh.add_argument("--print-command", action="store_true",
                    help="print the spark-sql command line instead of running it")
    sh.add_argument("spark_sql_args", nargs=argparse.REMAINDER,
                    help="passed on to spark-sql (e.g. -e \"SHOW DATABASES\")")
    _spark_args(sh)


def _spark_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spark-dir",
                   help="metastore + warehouse folder (default: $STATEQUERY_SPARK_DIR or "
                        "~/.local/share/statequery/spark)")
    p.add_argument("--master", default="local[*]", help="Spark master (default: local[*])")


def _say(message: str) -> None:
    print(f"statequery: {message}", file=sys.stderr, flush=True)


def _session(args: argparse.Namespace) -> Any:
    from statequery.spark.session import local_session, spark_dir

    folder = spark_dir(args.spark_dir)
    _say(f"starting Spark ({args.master}), metastore in {folder} ...")
    started = time.monotonic()
    session = local_session(folder, master=args.master)
    _say(f"Spark {session.version} ready in {time.monotonic() - started:.1f} s")
    return session


def run(args: argparse.Namespace) -> int | None:
    """Run a Spark command; None when ``args.command`` is not one of them."""
    if args.command not in ("attach", "detach", "shell") and not (
        args.command == "sql" and getattr(args, "spark", False)
    ):
        return None
    try:
        return _run(args)
    except Exception as e:  # Spark's errors (pyspark.errors), without importing pyspark here
        if not type(e).__module__.startswith(("pyspark", "py4j")):
            raise
        print(f"statequery: {spark_error_message(e)}", file=sys.stderr)
        return 1


def spark_error_message(e: BaseException) -> str:
    """One line for a Spark error: statequery's own message when the data source raised it."""
    import re

    text = str(e)
    found = re.findall(r"statequery\.exceptions\.\w+: (.*)", text)
    if found:
        return str(found[-1]).strip()
    return text.strip().splitlines()[0] if text.strip() else type(e).__name__


def _run(args: argparse.Namespace) -> int | None:
    from statequery.catalog import DEFAULT_CATALOG

    if args.command == "attach":
        from statequery.spark.catalog import attach, attach_plans

        path = args.path or DEFAULT_CATALOG
        if args.print_sql:
            for plan in attach_plans(path, args.database):
                for statement in plan.statements(replace=args.replace):
                    print(statement + ";")
            return 0
        spark = _session(args)
        try:
            names = attach(spark, path, args.database, replace=args.replace)
            for name in names:
                tables = spark.sql(f"SHOW TABLES IN `{name.replace('`', '``')}`").count()
                _say(f"attached database {name} ({tables} tables)")
        finally:
            spark.stop()
        return 0
    if args.command == "detach":
        from statequery.spark.catalog import detach

        spark = _session(args)
        try:
            for name in detach(spark, args.databases):
                _say(f"detached database {name} (the savepoint is untouched)")
        finally:
            spark.stop()
        return 0
    if args.command == "shell":
        return _shell(args)
    return _sql(args)


def _attach_catalog(spark: Any, catalog: str) -> None:
    from statequery.spark.catalog import attach

    names = attach(spark, catalog, keep_unchanged=True)
    _say(f"databases of {catalog}: {', '.join(names)}")


def _shell(args: argparse.Namespace) -> int:
    from statequery.catalog import DEFAULT_CATALOG
    from statequery.spark.session import spark_dir, spark_sql_argv

    folder = spark_dir(args.spark_dir)
    argv = spark_sql_argv(folder, args.master)
    extra = [a for a in args.spark_sql_args if a != "--"]
    if args.print_command:
        import shlex

        print(shlex.join(argv + extra))
        return 0
    spark = _session(args)
    try:
        _attach_catalog(spark, args.catalog or DEFAULT_CATALOG)
    finally:
        spark.stop()
    _say("starting spark-sql (USE <database>; SHOW TABLES; ...)")
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("SPARK_HOME", str(os.path.dirname(os.path.dirname(argv[0]))))
    import subprocess

    return subprocess.call(argv + extra, env=env)


def _sql(args: argparse.Namespace) -> int:
    import json

    from statequery.catalog import DEFAULT_CATALOG

    spark = _session(args)
    try:
        _attach_catalog(spark, args.catalog or DEFAULT_CATALOG)
        df = spark.sql(args.query)
        table = df.toArrow()
    finally:
        spark.stop()
    from statequery.cli import _json_default, _print_rows

    if args.json:
        for row in table.to_pylist():
            sys.stdout.write(json.dumps(row, default=_json_default, ensure_ascii=False) + "\n")
    else:
        _print_rows(table, "sql (Spark)")
    return 0
