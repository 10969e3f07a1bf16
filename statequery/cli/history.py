"""Subcommands over a job's versions (:mod:`statequery.history`, docs/history.md).

    statequery versions DIR [DIR ...] [--json]        a job's checkpoints/savepoints as versions
    statequery changes DIR [OP [STATE]] [--start N] [--end N] [--key K] [--limit N] [--json]
                    [--out FILE]                      the change feed between consecutive versions
    statequery history DIR KEY [--operator OP] [--limit N] [--json] [--out FILE]
                                                      one key's entries in every version

``DIR`` may be given several times with ``--also DIR`` (a job restarted under a new job id).
Registered by :mod:`statequery.cli.parser` through :func:`add_parsers` and :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from statequery.cli.output import _storage_options, _user_types

if TYPE_CHECKING:
    import pyarrow as pa

    from statequery.history import Job

__all__ = ["COMMANDS", "add_parsers"]


def add_parsers(sub: Any, parents: list[argparse.ArgumentParser] | None = None) -> None:
    """``parents``: the shared ``--storage-option`` flag of :mod:`statequery.cli`."""
    parents = parents or []
    where = "a job's checkpoint directory (<job-id>/chk-N, shared/), a folder of its savepoints, " \
        "or a URI"
    v = sub.add_parser("versions", help="a job's retained checkpoints/savepoints as versions",
                       parents=parents)
    v.add_argument("path", nargs="+", help=where + "; several merge into one history")
    v.add_argument("--json", action="store_true", help="print JSON lines")

    c = sub.add_parser("changes", help="the change feed between consecutive versions of a job",
                       parents=parents)
    c.add_argument("path", help=where)
    c.add_argument("operator", nargs="?", help="only this operator (uid, name or id)")
    c.add_argument("state", nargs="?", help="only this state (name, or a table name)")
    c.add_argument("--start", type=int, help="from the changes into this checkpoint id")
    c.add_argument("--end", type=int, help="up to the changes into this checkpoint id")
    c.add_argument("--key", help="only this key (JSON array/object for composite keys)")
    _also(c)
    _output(c)

    h = sub.add_parser("history", help="one key's entries in every version of a job",
                       parents=parents)
    h.add_argument("path", help=where)
    h.add_argument("key", help="the key (JSON array/object for composite keys)")
    h.add_argument("--operator", help="only this operator (uid, name or id)")
    _also(h)
    _output(h)


def _also(p: argparse.ArgumentParser) -> None:
    p.add_argument("--also", action="append", default=[], metavar="DIR",
                   help="another directory of the same job's history (repeatable)")


def _output(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=int, default=None,
                   help="at most this many rows (default: 100 shown as a table, all otherwise)")
    p.add_argument("--json", action="store_true", help="print JSON lines")
    p.add_argument("--out", help="write all rows to a .parquet, .csv or .arrow file")


def _job(args: argparse.Namespace, paths: list[str]) -> Job:
    from statequery.history import open_job

    return open_job(*paths, storage_options=_storage_options(args), **_user_types(args))


def _key(job: Job, text: str | None, operator: str | None) -> Any:
    if text is None:
        return None
    from statequery.exceptions import InvalidOptionError
    from statequery.keys import parse_key_text

    sp = job.version()
    ops = [sp.operator(operator)] if operator else list(sp.operators)
    spec = next((o.key_spec for o in ops if o.key_spec is not None), None)
    if spec is None:
        raise InvalidOptionError("the key: no keyed state in the newest version")
    return parse_key_text(text, spec)


def _show(args: argparse.Namespace, table: pa.Table, title: str, summary: str) -> None:
    from statequery.cli.output import _print_rows, _write_out

    total = table.num_rows
    if args.out:
        _write_out(table, args.out)
        print(f"wrote {total} rows to {args.out} ({summary})")
        return
    limit = args.limit if args.limit is not None else (None if args.json else 100)
    shown = table.slice(0, limit) if limit is not None else table
    if args.json:
        for row in shown.to_pylist():
            sys.stdout.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        return
    columns = [c for c in table.column_names if shown[c].null_count < shown.num_rows]
    if columns:
        _print_rows(shown.select(columns), title, total)
    print(summary)


def _versions(args: argparse.Namespace) -> int:
    from statequery.cli.output import _print_rows

    job = _job(args, args.path)
    table = job.versions_table()
    if args.json:
        for row in table.to_pylist():
            sys.stdout.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        return 0
    _print_rows(table, ", ".join(job.locations))
    done = sum(table["complete"].to_pylist())
    print(f"{table.num_rows} versions, {done} complete")
    return 0


def _changes(args: argparse.Namespace) -> int:
    with _job(args, [args.path, *args.also]) as job:
        key = _key(job, args.key, args.operator)
        table = job.changes(args.operator, args.state, args.start, args.end, key=key)
        counts = Counter(table["change"].to_pylist())
        summary = f"{table.num_rows} changes" + (
            ": " + ", ".join(f"{n} {c}" for c, n in sorted(counts.items())) if counts else "")
        _show(args, table, f"{args.path}: changes", summary)
    return 0


def _history(args: argparse.Namespace) -> int:
    with _job(args, [args.path, *args.also]) as job:
        key = _key(job, args.key, args.operator)
        table = job.history(key, args.operator)
        n = len(set(table["checkpoint_id"].to_pylist()))
        summary = f"{table.num_rows} entries in {n} of {len(job.complete_versions())} versions"
        _show(args, table, f"{args.path}: {args.key}", summary)
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "versions": _versions,
    "changes": _changes,
    "history": _history,
}
