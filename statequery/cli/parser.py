"""The command line of the ``statequery`` console script (argparse, one-line errors).
The ``statequery`` console script.

    statequery inspect PATH [--json]        operators and states of a savepoint/checkpoint
    statequery snapshot PATH [--out FILE] [--plan PLAN.json] [--index]
                                           write the StateMeta snapshot (next to _metadata);
                                           with a Flink SQL compiled plan, SQL state gets the
                                           query's column names; --index: with the run index
                                           (reads of one state read only its runs)
    statequery read PATH TABLE | --operator OP --state NAME [--key K] [--mode M]
                    [--limit N] [--json | --out FILE.parquet|.csv|.arrow] [--[no-]pickled]
                                            the rows of one state (PyFlink's pickles shown
                                            as JSON in the table view; --pickled for --json/--out)
    statequery lookup PATH KEY [--operator OP] [--json] [--[no-]pickled]
                                            everything every state holds for one key
    statequery spark-views [--catalog DIR] [DATABASE ...]
                                            CREATE TEMPORARY VIEW statements for spark-sql
    statequery sql "SELECT ..." [--catalog DIR] [--json] [--spark] [--pickled]
                                            a SELECT over <database>.<table> (no Spark, or
                                            in a local Spark with --spark)
    statequery attach [PATH] [--database NAME] [--replace] [--print]
                                            savepoints as persistent databases in Spark
    statequery detach DATABASE ...          drop them again (savepoints untouched)
    statequery shell [-e SQL | -f FILE] [--beeline] [-- SPARK-SQL ARGS]
                                            spark-sql with the catalog attached (on a running
                                            server: a shell on its Spark Connect, no JVM)
    statequery serve [--stop | --status]    one warm local Spark (Spark Connect and JDBC on
                                            loopback) for shell, sql --spark and notebooks
    statequery diff OLD NEW [--operator OP] [--state NAME] [--key K] [--json]
                                            what changed between two snapshots
    statequery stats PATH [--parallelism N] [--json]   state sizes per key group, skew
    statequery versions DIR                 a job's checkpoints/savepoints as versions
    statequery changes DIR [OP [STATE]] [--start N] [--end N]
                                            the change feed between consecutive versions
    statequery history DIR KEY              one key's entries in every version
    statequery splits PATH OPERATOR [--json]           a FLIP-27 source's splits
    statequery capture --rest URL JOB_ID [--savepoint DIR | --latest-checkpoint | --catalog DIR]
                                            a savepoint of a running job, recorded with the
                                            job (names without --plan); docs/capture.md

Errors print ``statequery: <message>`` on stderr and exit with status 1.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

#: result limits of ``statequery sql`` (a terminal, not a data pipeline: ``--out`` of ``read``
#: or the Python API for more)
CLI_MAX_ROWS = 100_000


CLI_MAX_BYTES = 256 << 20


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``statequery: <what is wrong> (see 'statequery CMD
    --help')``, exit status 2, instead of the usage block above the message. Subcommand parsers
    are of this class too (``add_subparsers`` uses the parent's class)."""

    def error(self, message: str) -> NoReturn:
        import difflib
        import re

        bad = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if bad:
            close = difflib.get_close_matches(bad.group(1), re.findall(r"'([^']*)'",
                                                                       bad.group(2)), n=1)
            if close:
                message += f"; did you mean '{close[0]}'?"
        self.exit(2, f"statequery: {message} (see '{self.prog} --help')\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="statequery",
        description="Inspect the state inside Apache Flink savepoints and checkpoints (no JVM).",
        epilog="Try it on the example catalog: statequery inspect user_activity; statequery "
        "lookup user_activity user-3; statequery sql \"SELECT key, value FROM "
        "user_activity.user_state__count WHERE key = 'user-3'\". 'statequery COMMAND --help' "
        "lists a command's options.",
    )
    from statequery import __version__

    p.add_argument("--version", action="version", version=f"statequery {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    store = _Parser(add_help=False)
    store.add_argument(
        "--storage-option", action="append", default=[], metavar="KEY=VALUE",
        help="an fsspec storage option for remote paths (repeatable; VALUE may be JSON), e.g. "
             "endpoint_url=http://127.0.0.1:9000 (default: $STATEQUERY_STORAGE_OPTIONS)",
    )
    classes = _Parser(add_help=False)
    classes.add_argument(
        "--classpath", action="append", default=[], metavar="JAR",
        help="the job's jar (or a directory of its classes; repeatable, or several joined by "
             "commas): values Flink serialized with Kryo are decoded with its classes "
             "(docs/decoding.md)",
    )
    classes.add_argument(
        "--protobuf-descriptors", metavar="FILE",
        help="a Protobuf descriptor set (protoc --include_imports --descriptor_set_out): "
             "Protobuf messages kept through Kryo (chill-protobuf) are decoded as structs "
             "(docs/decoding.md)",
    )
    classes.add_argument(
        "--protobuf-message", action="append", default=[], metavar="CLASS=NAME",
        help="the message of a Java class where protoc's naming (java_package + message name) "
             "does not find it (repeatable), e.g. com.acme.Msg=acme.v1.Msg",
    )
    i = sub.add_parser("inspect", help="list operators and states (the state_meta table)",
                       parents=[store, classes])
    i.add_argument("path", help="savepoint/checkpoint directory, its _metadata, or a URI")
    i.add_argument("--json", action="store_true", help="print JSON instead of a table")
    i.add_argument(
        "--no-snapshot",
        action="store_true",
        help="ignore a StateMeta snapshot and read the state-file headers",
    )
    s = sub.add_parser("snapshot", help="write the StateMeta snapshot", parents=[store])
    s.add_argument("path", help="savepoint/checkpoint directory, its _metadata, or a URI")
    s.add_argument("--out", help="where to write it (default: next to _metadata)")
    s.add_argument(
        "--plan",
        help="the job's Flink SQL compiled plan (COMPILE PLAN / EXPLAIN PLAN ... JSON): kept in "
        "the snapshot, it names SQL state tables and their RowData columns (without it, the "
        "plan of the snapshot being replaced is kept)",
    )
    s.add_argument(
        "--index",
        action="store_true",
        help="also record the run index (walks every key group of the canonical keyed state "
        "files once): later reads of some states of uncompressed streams read only their runs",
    )

    r = sub.add_parser("read", help="the rows of one state", parents=[store, classes])
    r.add_argument("path", help="savepoint/checkpoint directory, its _metadata, or a URI")
    r.add_argument("table", nargs="?", help="a table_name from inspect (or use --operator/--state)")
    r.add_argument("--operator", help="operator uid, name or id")
    r.add_argument("--state", help="state name")
    r.add_argument("--key", help="only this key (JSON array/object for composite keys)")
    r.add_argument("--mode", choices=("rows", "flat", "nested"), help="list/map row shape")
    r.add_argument("--limit", type=int, default=None,
                   help="at most this many rows (default: 100 shown as a table, all otherwise)")
    r.add_argument("--json", action="store_true", help="print JSON lines")
    r.add_argument("--out", help="write all rows to a .parquet, .csv or .arrow file")
    _version_arg(r)
    _pickled_arg(r)
    r.add_argument("--workers", type=int, default=None, metavar="N",
                   help="processes a large read runs in (default: $STATEQUERY_WORKERS, else "
                   "every core; 1: this process)")

    lk = sub.add_parser("lookup", help="everything every keyed state holds for one key",
                        parents=[store, classes])
    lk.add_argument("path", help="savepoint/checkpoint directory, its _metadata, or a URI")
    lk.add_argument("key", help="the key (JSON array/object for composite keys)")
    lk.add_argument("--operator", help="only this operator (uid, name or id)")
    lk.add_argument("--json", action="store_true", help="print JSON lines")
    _version_arg(lk)
    _pickled_arg(lk)

    sv = sub.add_parser("spark-views", help="Spark SQL views for every table of a catalog")
    sv.add_argument("databases", nargs="*", help="only these databases (default: all)")
    sv.add_argument("--catalog", help="the catalog folder (default: the shipped catalog/)")

    q = sub.add_parser("sql", help="run a SELECT over <database>.<table> of a catalog (no Spark)",
                       parents=[classes])
    q.add_argument("query", help="e.g. \"SELECT key, value FROM user_activity.user_state__count\"")
    q.add_argument("--catalog", help="the catalog folder (default: the shipped catalog/)")
    q.add_argument("--json", action="store_true", help="print JSON lines")
    q.add_argument("--spark", action="store_true",
                   help="run it in a local Spark (the catalog attached as databases)")
    q.add_argument("--pickled", action="store_true",
                   help="state tables get key_py, user_key_py, value_py (and *_py_reason) "
                        "after their bytes columns: PyFlink's pickles as JSON text "
                        "(docs/decoding.md)")
    q.add_argument("--memory-limit", metavar="SIZE",
                   help="DuckDB's memory cap, e.g. 2GiB (default: $STATEQUERY_SQL_MEMORY_LIMIT, "
                        "else a quarter of the machine's memory, at most 8GiB)")
    q.add_argument("--threads", type=int,
                   help="DuckDB threads (default: $STATEQUERY_SQL_THREADS, else half the cores, "
                        "at most 4)")
    q.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="interrupt the query after this long (default: $STATEQUERY_SQL_TIMEOUT, "
                        "else 60)")
    q.add_argument("--max-rows", type=int,
                   help=f"refuse results longer than this (default: $STATEQUERY_SQL_MAX_ROWS, "
                        f"else {CLI_MAX_ROWS})")
    q.add_argument("--max-bytes", metavar="SIZE",
                   help=f"refuse results larger than this (default: $STATEQUERY_SQL_MAX_BYTES, "
                        f"else {CLI_MAX_BYTES >> 20}MiB)")
    from statequery.cli.spark import _spark_args, add_parsers

    _spark_args(q)
    from statequery.cli.extra import add_parsers as add_extra_parsers

    add_extra_parsers(sub, [store, classes])
    from statequery.cli.history import add_parsers as add_history_parsers

    add_history_parsers(sub, [store, classes])
    add_parsers(sub)
    from statequery.cli.capture import add_parser as add_capture_parser

    add_capture_parser(sub, [store])
    return p


def _version_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--version", type=int, metavar="CHECKPOINT_ID",
        help="PATH is a job's checkpoint directory (or a folder of its savepoints): read this "
             "version of it (statequery versions lists them; default: the newest)",
    )


def _pickled_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pickled", action=argparse.BooleanOptionalAction, default=None,
        help="add key_py, user_key_py, value_py (and *_py_reason) after bytes columns: the "
             "Python values a PyFlink job pickled there, as JSON text, decoded without running "
             "code (default: on in the table view, off for --json and --out, whose columns "
             "stay those of Savepoint.read)",
    )
