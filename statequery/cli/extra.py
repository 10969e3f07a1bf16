"""Subcommands beyond reading: ``statequery diff`` (and ``statequery stats``).

    statequery diff OLD NEW [--operator OP] [--state NAME] [--key K] [--limit N] [--json]
                    [--out FILE]            what changed between two savepoints/checkpoints
    statequery stats PATH [--operator OP] [--state NAME] [--parallelism N] [--top N]
                    [--key-groups] [--json] where state is big or skewed
    statequery splits PATH OPERATOR [--source KIND] [--json]
                                            a FLIP-27 source's splits (where it resumes)
    statequery export PATH OPERATOR --out DIR [--state NAME ...] [--format parquet|arrow|csv]
                    [--key K] [--mode M]    every state of an operator to files, in one pass

Registered by :mod:`statequery.cli.parser` through :func:`add_parsers` and :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

from statequery.cli.output import _storage_options, _user_types

__all__ = ["COMMANDS", "add_parsers"]


def add_parsers(sub: Any, parents: list[argparse.ArgumentParser] | None = None) -> None:
    """``parents``: the shared ``--storage-option`` flag of :mod:`statequery.cli`."""
    parents = parents or []
    d = sub.add_parser("diff", help="what changed between two savepoints/checkpoints",
                       parents=parents)
    d.add_argument("old", help="the earlier savepoint/checkpoint (directory, _metadata or URI)")
    d.add_argument("new", help="the later savepoint/checkpoint")
    d.add_argument("--operator", help="only this operator (uid, name or id)")
    d.add_argument("--state", help="only this state (name, or a table name)")
    d.add_argument("--key", help="only this key (JSON array/object for composite keys)")
    d.add_argument("--limit", type=int, default=None,
                   help="at most this many rows (default: 100 shown as a table, all otherwise)")
    d.add_argument("--json", action="store_true", help="print JSON lines")
    d.add_argument("--out", help="write all rows to a .parquet, .csv or .arrow file")

    st = sub.add_parser("stats", help="entries, keys and bytes per state and key group; skew",
                        parents=parents)
    st.add_argument("path", help="savepoint/checkpoint directory, its _metadata, or a URI")
    st.add_argument("--operator", help="only this operator (uid, name or id)")
    st.add_argument("--state", help="only this state (name, or a table name)")
    st.add_argument("--parallelism", type=int, help="also spread the key groups over N subtasks")
    st.add_argument("--top", type=int, default=5, help="heaviest keys per state (default 5)")
    st.add_argument("--key-groups", action="store_true",
                    help="print the per-key-group table (the state_stats table)")
    st.add_argument("--json", action="store_true", help="print JSON")

    sr = sub.add_parser("splits", help="the splits of a FLIP-27 source (where it resumes)",
                        parents=parents)
    sr.add_argument("path", help="savepoint/checkpoint directory, its _metadata, or a URI")
    sr.add_argument("operator", help="the source operator (uid, name or id)")
    sr.add_argument("--source", help="number_sequence, file or kafka (default: recognised)")
    sr.add_argument("--json", action="store_true", help="print JSON lines")

    ex = sub.add_parser(
        "export", help="several states of one operator to files, read in one pass",
        description="Write the states of one operator (default: every readable state) to one "
        "file per state, DIR/<table_name>.<format>. Each key group is read and walked once for "
        "all of them; files are streamed batch by batch and renamed into place when complete.",
        parents=parents,
    )
    ex.add_argument("path", help="savepoint/checkpoint directory, its _metadata, or a URI")
    ex.add_argument("operator", help="the operator (uid, name or id)")
    ex.add_argument("--out", required=True, help="the directory to write into (created)")
    ex.add_argument("--state", action="append", default=None,
                    help="only this state (name or table name; repeatable)")
    ex.add_argument("--format", choices=("parquet", "arrow", "csv"), default="parquet",
                    help="the files' format (default: parquet)")
    ex.add_argument("--key", help="only this key (JSON array/object for composite keys)")
    ex.add_argument("--mode", choices=("rows", "flat", "nested"), help="list/map row shape")
    ex.add_argument("--workers", type=int, default=None, metavar="N",
                    help="processes the read runs in (default: $STATEQUERY_WORKERS, else every "
                    "core; 1: this process)")


def _diff(args: argparse.Namespace) -> int:
    import pyarrow as pa

    from statequery.cli.output import _print_rows, _write_out
    from statequery.cli.progress import progress_bar
    from statequery.diff import DIFF_SCHEMA, diff_batches, diff_work, state_pairs
    from statequery.exceptions import InvalidOptionError
    from statequery.keys import parse_key_text
    from statequery.savepoint import Savepoint

    old = Savepoint.open(args.old, storage_options=_storage_options(args),
        **_user_types(args))
    new = Savepoint.open(args.new, storage_options=_storage_options(args),
        **_user_types(args))
    key = None
    if args.key is not None:
        spec = None
        for sp in (new, old):
            op = sp.operator(args.operator) if args.operator else None
            ops = [op] if op is not None else list(sp.operators)
            spec = next((o.key_spec for o in ops if o.key_spec is not None), None)
            if spec is not None:
                break
        if spec is None:
            raise InvalidOptionError("--key: no keyed state to compare")
        key = parse_key_text(args.key, spec)
    pairs = state_pairs(old, new, args.operator, args.state)
    batches = []
    with progress_bar("diff", diff_work(old, new, pairs)) as advance:
        for batch in diff_batches(old, new, args.operator, args.state, key, progress=advance):
            batches.append(batch)
    table = pa.Table.from_batches(batches, schema=DIFF_SCHEMA)
    total = table.num_rows
    summary = ", ".join(f"{n} {c}" for c, n in sorted(Counter(table["change"].to_pylist()).items()))
    if args.out:
        _write_out(table, args.out)
        print(f"wrote {total} rows to {args.out} ({summary or 'no differences'})")
        return 0
    limit = args.limit if args.limit is not None else (None if args.json else 100)
    shown = table.slice(0, limit) if limit is not None else table
    if args.json:
        for row in shown.to_pylist():
            sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
        return 0
    columns = [c for c in DIFF_SCHEMA.names if shown[c].null_count < shown.num_rows]
    if columns:  # no rows: no table (it would be a blank line)
        _print_rows(shown.select(columns), f"{old.location} -> {new.location}", total)
    print(f"{total} differences" + (f": {summary}" if summary else ""))
    return 0


def _stats(args: argparse.Namespace) -> int:
    from statequery.cli.output import _print_rows
    from statequery.cli.progress import progress_bar
    from statequery.exceptions import InvalidOptionError
    from statequery.savepoint import Savepoint
    from statequery.stats import skew_summary, state_stats, stats_work

    if args.parallelism is not None and args.parallelism <= 0:
        raise InvalidOptionError(f"--parallelism must be positive, got {args.parallelism}")
    sp = Savepoint.open(args.path, storage_options=_storage_options(args),
        **_user_types(args))
    with progress_bar("stats", stats_work(sp, args.operator, args.state)) as advance:
        stats = state_stats(sp, args.operator, args.state, top=args.top, progress=advance)
    skew = skew_summary(stats, args.parallelism)
    if args.json:
        doc = {"location": sp.location, "skew": skew.to_pylist(),
               "heaviest_keys": stats.heaviest_keys.to_pylist()}
        if args.key_groups:
            doc["key_groups"] = stats.table.to_pylist()
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if args.key_groups:
        _print_rows(stats.table, "state_stats", None)
    shown = [c for c in skew.column_names if c not in ("operator_id", "at_parallelism")]
    if args.parallelism is None:
        shown = [c for c in shown if not c.endswith("_at")]
    _print_rows(skew.select(shown), f"{sp.location}: size and skew per keyed state")
    _print_rows(stats.heaviest_keys.drop_columns(["operator_id"]), "heaviest keys")
    ops = stats.table.filter(stats.table["key_group"].is_null())
    if ops.num_rows:
        _print_rows(ops.select(["operator", "state", "kind", "subtask", "entries", "bytes"]),
                    "operator state")
    return 0


def _splits(args: argparse.Namespace) -> int:
    from statequery.cli.output import _print_rows
    from statequery.savepoint import Savepoint
    from statequery.sources import source_splits

    sp = Savepoint.open(args.path, storage_options=_storage_options(args),
        **_user_types(args))
    table = source_splits(sp, args.operator, args.source)
    if args.json:
        for row in table.to_pylist():
            sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
    else:
        _print_rows(table, f"{args.operator}: source splits")
    return 0


def _export(args: argparse.Namespace) -> int:
    if args.key is None:  # a full read: the pool starts while this process imports and opens
        from statequery import parallel

        parallel.start(args.workers, wait=False)
    from statequery.cli.export import export_operator
    from statequery.keys import parse_key_text
    from statequery.savepoint import Savepoint

    sp = Savepoint.open(args.path, storage_options=_storage_options(args),
        **_user_types(args))
    key = None
    if args.key is not None:
        key = parse_key_text(args.key, sp.operator(args.operator).key_spec)
    written = export_operator(
        sp, args.operator, args.out, args.format, states=args.state, key=key, mode=args.mode,
        workers=args.workers,
    )
    for path, rows in written:
        print(f"wrote {rows} rows to {path}")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "diff": _diff,
    "stats": _stats,
    "splits": _splits,
    "export": _export,
}
