"""The ``statequery`` console script.

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
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from statequery.cli.output import (
    _classpath,
    _console,
    _json_default,
    _print_rows,
    _storage_options,
    _write_out,
    python_rows,
)
from statequery.exceptions import InvalidOptionError, StatequeryError

__all__ = ["main"]

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

    q = sub.add_parser("sql", help="run a SELECT over <database>.<table> of a catalog (no Spark)")
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


def _pickled(args: argparse.Namespace) -> bool:
    """``--pickled``/``--no-pickled``, else on for a human (the table view) and off for files
    and JSON lines (their columns are the Python API's)."""
    if args.pickled is not None:
        return bool(args.pickled)
    return not (args.json or getattr(args, "out", None))


def _for_display(table: Any, args: argparse.Namespace) -> Any:
    """The table view with ``--pickled`` left to its default: a bytes column none of whose
    shown values is a pickle (a Java ``byte[]``, a source's reader state) does not get its two
    ``*_py`` columns, which would only say "not a pickle" on every row. Display only: the
    columns of ``--json``/``--out`` and of an explicit ``--pickled`` follow the types."""
    import pyarrow.compute as pc

    if args.pickled is not None:
        return table
    names = table.column_names
    drop: list[str] = []
    for name in names:
        if not name.endswith("_py") or f"{name}_reason" not in names:
            continue
        decoded = table.column(name).null_count < table.num_rows
        reasons = table.column(f"{name}_reason")
        not_pickles = pc.all(pc.fill_null(pc.starts_with(reasons, "not a pickle"), True))
        if not decoded and not_pickles.as_py() is not False:
            drop += [name, f"{name}_reason"]
    return table.drop_columns(drop) if drop else table


def _open_version(args: argparse.Namespace) -> Any:
    """The savepoint of ``args.path``; with ``--version N``, version N of the job there
    (:func:`statequery.open_job`)."""
    from statequery.savepoint import Savepoint

    if getattr(args, "version", None) is None:
        return Savepoint.open(args.path, storage_options=_storage_options(args),
                              classpath=_classpath(args))
    from statequery.history import open_job

    return open_job(args.path, storage_options=_storage_options(args),
                    classpath=_classpath(args)).version(args.version)


def _read(args: argparse.Namespace) -> int:
    from statequery.keys import parse_key_text

    sp = _open_version(args)
    if args.table is not None and (args.operator or args.state):
        raise InvalidOptionError("give a table name or --operator/--state, not both")
    if args.table is not None:
        info = sp.state(args.table)
    elif args.operator and args.state:
        info = sp.state(args.operator, args.state)
    else:
        raise InvalidOptionError("name the state: a table name, or --operator and --state")
    key = None if args.key is None else parse_key_text(args.key, info.key_spec)
    table = sp.read(info, key=key, mode=args.mode, pickled=_pickled(args),
                    workers=args.workers)
    total = table.num_rows
    if args.out:
        _write_out(table, args.out)
        print(f"wrote {total} rows of {info.operator_uid or info.operator_id}/{info.name} "
              f"to {args.out}")
        return 0
    limit = args.limit if args.limit is not None else (None if args.json else 100)
    if limit is not None:
        table = table.slice(0, limit)
    if args.json:
        for row in python_rows(table):
            sys.stdout.write(json.dumps(row, default=_json_default, ensure_ascii=False) + "\n")
    else:
        _print_rows(_for_display(table, args),
                    f"{info.operator_uid or info.operator_name}/{info.name}", total)
    return 0


def _lookup(args: argparse.Namespace) -> int:
    from statequery.keys import key_type_name, parse_key_text

    sp = _open_version(args)
    ops = [sp.operator(args.operator)] if args.operator else list(sp.operators)
    pickled = _pickled(args)
    found = 0
    tried: list[str] = []  # per operator: how the key was read, or why it could not be
    if not any(op.key_spec is not None for op in ops):
        raise InvalidOptionError(
            (f"operator {ops[0].display_name!r} has no" if args.operator else "no operator has")
            + f" keyed state in {sp.location}: lookup reads keyed state (read shows operator "
            "state)"
        )
    for op in ops:
        if op.key_spec is None:
            continue
        try:
            key = parse_key_text(args.key, op.key_spec)
        except InvalidOptionError as e:
            if args.operator:
                raise
            tried.append(f"{op.display_name}: {e}")
            continue  # this operator's key type cannot hold the key
        tried.append(f"{op.display_name}: read as {key_type_name(op.key_spec)} "
                     f"{json.dumps(key, default=_json_default, ensure_ascii=False)}")
        for (op_label, state), table in sp.lookup(key, op.operator_id, pickled).items():
            found += table.num_rows
            if args.json:
                for row in python_rows(table):
                    doc = {"operator": op_label, "state": state, **row}
                    sys.stdout.write(json.dumps(doc, default=_json_default, ensure_ascii=False)
                                     + "\n")
            else:
                _print_rows(_for_display(table, args), f"{op_label}/{state}")
    if not found:
        print(f"statequery: no state holds key {args.key!r} ({'; '.join(tried)})",
              file=sys.stderr)
        return 1
    return 0


def _inspect_doc(sp: Any) -> dict[str, Any]:
    meta = sp.meta
    rows = sp.state_meta().to_pylist()
    return {
        "location": sp.location,
        "checkpoint_id": meta.checkpoint_id,
        "metadata_version": meta.metadata_version,
        "snapshot_type": meta.snapshot_type,
        "format": meta.format,
        "backend": meta.backend,
        "from_snapshot": sp.from_snapshot,
        "operators": [
            {
                "operator_id": op.operator_id,
                "uid": op.uid,
                "name": op.name,
                "parallelism": op.parallelism,
                "max_parallelism": op.max_parallelism,
                "fully_finished": op.fully_finished,
                "finished_subtasks": list(op.finished_subtasks),
                "states": len(op.states),
            }
            for op in meta.operators
        ],
        "states": rows,
        "job": None if sp.job is None else sp.job.to_doc(),
    }


#: below this width ``inspect`` prints one block per operator and state instead of tables, so
#: table names and operator ids are never broken mid-word
_WIDE_LAYOUT = 160


def _operator_note(op: dict[str, Any]) -> str:
    if op["fully_finished"]:
        return "fully finished"
    if op["finished_subtasks"]:
        return f"finished subtasks {op['finished_subtasks']}"
    return ""


def _print_table(doc: dict[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    console = _console()
    console.print(
        Text.assemble(
            (doc["location"], "bold"),
            f"  {doc['snapshot_type']} {doc['checkpoint_id']}, "
            f"format {doc['format'] or '?'}, backend {doc['backend'] or 'any (canonical)'}, "
            f"_metadata v{doc['metadata_version']}"
            + ("  (from StateMeta snapshot)" if doc["from_snapshot"] else ""),
        )
    )
    job = doc.get("job")
    if job:
        console.print(
            f"captured from job {job['job_name']!r} ({job['job_id']}) at {job['captured_at']}"
            f" ({job['trigger']}, Flink {job['flink_version'] or '?'}, "
            f"{len(job['vertices'])} vertices)", highlight=False,
        )
    changes = [r["changelog_changes"] for r in doc["states"]
               if r.get("changelog_changes") is not None]
    if changes:
        console.print(
            f"changelog state backend: {sum(changes)} logged change(s) applied to "
            f"{len(changes)} keyed state(s) on top of the materialized base "
            "(per state: state_meta's changelog_changes)", highlight=False,
        )
    pickled = [r for r in doc["states"] if r.get("pickled_columns")]
    if pickled:
        console.print(
            f"{len(pickled)} state(s) hold bytes (state_meta's pickled_columns): a PyFlink job's "
            "pickles in them are shown as JSON by `statequery read` (--pickled with --json/--out; "
            "`sql --pickled`, Spark option pickled)", highlight=False,
        )
    if console.width < _WIDE_LAYOUT:
        _print_blocks(console, doc)
        return
    ops = Table(title="operators", show_lines=False)
    for col in ("uid", "name", "operator id", "par", "max par", "states", "note"):
        ops.add_column(col, no_wrap=col == "operator id")
    for op in doc["operators"]:
        ops.add_row(
            op["uid"] or "-",
            op["name"] or "-",
            op["operator_id"],
            str(op["parallelism"]),
            str(op["max_parallelism"]),
            str(op["states"]),
            _operator_note(op),
        )
    console.print(ops)
    states = Table(title="states")
    for col in (
        "table",
        "kind",
        "key",
        "namespace",
        "user key",
        "value",
        "ttl",
        "size",
        "decodable",
    ):
        states.add_column(col, overflow="fold", no_wrap=col == "table")
    for r in doc["states"]:
        states.add_row(
            r["table_name"],
            r["kind"],
            r["key_type"] or "",
            r["namespace_type"] or "",
            r["user_key_type"] or "",
            r["value_type"] or "",
            "yes" if r["ttl"] else "",
            str(r["size_bytes"]),
            "yes" if r["decodable"] else f"no: {r['reason']}",
        )
    console.print(states)


def _print_blocks(console: Any, doc: dict[str, Any]) -> None:
    """``inspect`` for narrow terminals: names on lines of their own, details indented below."""
    from rich.padding import Padding
    from rich.text import Text

    def line(*parts: str | tuple[str, str], indent: int = 0) -> None:
        # wrapped continuation lines keep the indent (Padding), words are never split
        text = Padding(Text.assemble(*parts), (0, 0, 0, indent), expand=False)
        console.print(text, highlight=False)

    line(("operators", "bold italic"))
    for op in doc["operators"]:
        line((op["name"] or op["uid"] or op["operator_id"], "bold"), indent=2)
        facts = [
            f"uid {op['uid']}" if op["uid"] else "no uid",
            f"id {op['operator_id']}",
            f"parallelism {op['parallelism']}/{op['max_parallelism']}",
            f"{op['states']} states",
            _operator_note(op),
        ]
        line(" · ".join(f for f in facts if f), indent=4)
    line(("states", "bold italic"))
    for r in doc["states"]:
        line((r["table_name"], "bold"), indent=2)
        facts = [r["kind"]]
        for label, col in (("key", "key_type"), ("namespace", "namespace_type"),
                           ("user key", "user_key_type")):
            if r[col]:
                facts.append(f"{label} {r[col]}")
        facts += ["ttl" if r["ttl"] else "", f"{r['size_bytes']} bytes",
                  "decodable" if r["decodable"] else f"not decodable: {r['reason']}"]
        line(" · ".join(f for f in facts if f), indent=4)
        if r["value_type"]:
            line(f"value {r['value_type']}", indent=4)


def _silence_stdout() -> None:
    """Point stdout at /dev/null: the reader went away (``| head``), and Python's final flush
    must not report a broken pipe either."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real file descriptor (e.g. captured in tests)
        pass


def _one_line(text: str) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return " ".join(lines[:1]) + (" ..." if len(lines) > 1 else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv``; returns the exit status (0 ok, 1 a user error, with a
    one-line ``statequery: ...`` message on stderr). A closed output pipe is a quiet exit 0.

    No input or environment problem shows a traceback: errors statequery knows are typed
    (:class:`StatequeryError`); anything else is reported in one line as unexpected (a bug to
    report), with the traceback only when ``STATEQUERY_DEBUG=1``."""
    try:
        return _main(argv)
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except StatequeryError as e:
        print(f"statequery: {_one_line(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("statequery: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print("statequery: out of memory", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - the last line of defence against a traceback
        if os.environ.get("STATEQUERY_DEBUG"):
            raise
        print(f"statequery: unexpected error (please report it; STATEQUERY_DEBUG=1 shows the "
              f"traceback): {type(e).__name__}: {_one_line(str(e))}", file=sys.stderr)
        return 1


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    if not (sys.argv[1:] if argv is None else argv):  # plain `statequery`: what it can do
        parser.print_help()
        return 2
    args = parser.parse_args(argv)
    try:
        from statequery.savepoint import Savepoint

        if args.command == "inspect":
            sp = Savepoint.open(
                args.path, use_snapshot=not args.no_snapshot,
                storage_options=_storage_options(args), classpath=_classpath(args),
            )
            doc = _inspect_doc(sp)
            if args.json:
                json.dump(doc, sys.stdout, indent=2, default=str)
                sys.stdout.write("\n")
            else:
                _print_table(doc)
            return 0
        if args.command == "read":
            return _read(args)
        if args.command == "lookup":
            return _lookup(args)
        if args.command == "spark-views":
            from statequery.catalog.views import view_statements

            print("\n".join(view_statements(args.catalog, args.databases)))
            return 0
        if args.command == "sql" and args.spark and args.pickled:
            raise InvalidOptionError(
                "sql --spark --pickled: in Spark the *_py columns are a table's own; attach "
                "with `statequery attach --pickled`, or read spark.read.format('statequery')"
                ".option('pickled', 'true')")
        from statequery.cli.spark import run as run_spark

        spark_status = run_spark(args)
        if spark_status is not None:
            return spark_status
        if args.command == "sql":
            from statequery.sql import sql

            env = os.environ
            table = sql(
                args.query, args.catalog, memory_limit=args.memory_limit, threads=args.threads,
                timeout=args.timeout, pickled=args.pickled,
                max_rows=args.max_rows if args.max_rows is not None else (
                    None if env.get("STATEQUERY_SQL_MAX_ROWS") else CLI_MAX_ROWS),
                max_bytes=args.max_bytes if args.max_bytes is not None else (
                    None if env.get("STATEQUERY_SQL_MAX_BYTES") else CLI_MAX_BYTES),
            )
            if args.json:
                for row in python_rows(table):
                    sys.stdout.write(json.dumps(row, default=_json_default, ensure_ascii=False)
                                     + "\n")
            else:
                _print_rows(table, "sql")
            return 0
        from statequery.cli.extra import COMMANDS
        from statequery.cli.history import COMMANDS as HISTORY_COMMANDS

        if args.command in COMMANDS:
            return COMMANDS[args.command](args)
        if args.command in HISTORY_COMMANDS:
            return HISTORY_COMMANDS[args.command](args)
        if args.command == "capture":
            from statequery.cli.capture import run as run_capture

            return run_capture(args)
        if args.command == "snapshot":
            if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))) \
                    and "://" not in args.out:
                raise InvalidOptionError(f"--out {args.out}: the directory "
                                         f"{os.path.dirname(os.path.abspath(args.out))} does "
                                         "not exist")
            # derived again; the plan and captured job of the snapshot it replaces are kept
            sp = Savepoint.open(
                args.path, rederive=True, snapshot=args.out, plan=args.plan,
                storage_options=_storage_options(args), classpath=_classpath(args),
            )
            where = sp.write_snapshot(args.out, index=args.index)
            named = (
                f", {len(sp.plan_nodes)} operators named by the plan"
                + ("" if args.plan else " it kept")
                if sp.sql_plan is not None
                else ""
            )
            indexed = (
                f", run index of {sp.run_index.key_group_count} key groups" if args.index else ""
            )
            print(f"wrote StateMeta snapshot {where} ({len(sp.states)} states{named}{indexed})")
            return 0
    except StatequeryError as e:
        print(f"statequery: {_one_line(str(e))}", file=sys.stderr)
        return 1
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
