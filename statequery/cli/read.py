"""``statequery read`` (the rows of one state) and ``statequery lookup`` (everything every keyed
state holds for one key)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from statequery.cli.output import (
    _json_default,
    _print_rows,
    _storage_options,
    _user_types,
    _write_out,
    python_rows,
)
from statequery.exceptions import InvalidOptionError

if TYPE_CHECKING:
    import pyarrow as pa

    from statequery.savepoint import Savepoint


def _pickled(args: argparse.Namespace) -> bool:
    """``--pickled``/``--no-pickled``, else on for a human (the table view) and off for files
    and JSON lines (their columns are the Python API's)."""
    if args.pickled is not None:
        return bool(args.pickled)
    return not (args.json or getattr(args, "out", None))


def _for_display(table: pa.Table, args: argparse.Namespace) -> pa.Table:
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


def _open_version(args: argparse.Namespace) -> Savepoint:
    """The savepoint of ``args.path``; with ``--version N``, version N of the job there
    (:func:`statequery.open_job`)."""
    from statequery.savepoint import Savepoint

    if getattr(args, "version", None) is None:
        return Savepoint.open(args.path, storage_options=_storage_options(args),
                              **_user_types(args))
    from statequery.history import open_job

    return open_job(args.path, storage_options=_storage_options(args),
                    **_user_types(args)).version(args.version)


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
