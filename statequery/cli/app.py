"""The ``statequery`` console script's entry point: parse the command line, run the command, and
turn every error into one line on stderr and an exit status (never a traceback)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from statequery.cli.metadata import _inspect, _snapshot
from statequery.cli.parser import _parser
from statequery.cli.query import _spark_views, _sql
from statequery.cli.read import _lookup, _read
from statequery.exceptions import InvalidOptionError, StatequeryError


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
        if args.command == "inspect":
            return _inspect(args)
        if args.command == "read":
            return _read(args)
        if args.command == "lookup":
            return _lookup(args)
        if args.command == "spark-views":
            return _spark_views(args)
        if args.command == "sql" and args.spark and args.pickled:
            raise InvalidOptionError(
                "sql --spark --pickled: in Spark the *_py columns are a table's own; attach "
                "with `statequery attach --pickled`, or read spark.read.format('statequery')"
                ".option('pickled', 'true')")
        if args.command == "sql" and args.spark and (
                args.classpath or args.protobuf_descriptors or args.protobuf_message):
            raise InvalidOptionError(
                "sql --spark --classpath/--protobuf-descriptors: in Spark they are a table's "
                "options; attach with `statequery attach --classpath JAR`, or read "
                "spark.read.format('statequery').option('classpath', JAR)")
        from statequery.cli.spark import run as run_spark

        spark_status = run_spark(args)
        if spark_status is not None:
            return spark_status
        if args.command == "sql":
            return _sql(args)
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
            return _snapshot(args)
    except StatequeryError as e:
        print(f"statequery: {_one_line(str(e))}", file=sys.stderr)
        return 1
    return 2  # pragma: no cover - argparse rejects unknown commands


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
