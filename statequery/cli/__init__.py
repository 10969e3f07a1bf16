"""The ``statequery`` console script.

    statequery inspect PATH [--json]        operators and states of a savepoint/checkpoint
    statequery snapshot PATH [--out FILE]   write the StateMeta snapshot (next to _metadata)

Errors print ``statequery: <message>`` on stderr and exit with status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from statequery.exceptions import StatequeryError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="statequery",
        description="Inspect the state inside Apache Flink savepoints and checkpoints (no JVM).",
    )
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("inspect", help="list operators and states (the state_meta table)")
    i.add_argument("path", help="savepoint/checkpoint directory, its _metadata, or a URI")
    i.add_argument("--json", action="store_true", help="print JSON instead of a table")
    i.add_argument(
        "--no-snapshot",
        action="store_true",
        help="ignore a StateMeta snapshot and read the state-file headers",
    )
    s = sub.add_parser("snapshot", help="write the StateMeta snapshot")
    s.add_argument("path", help="savepoint/checkpoint directory, its _metadata, or a URI")
    s.add_argument("--out", help="where to write it (default: next to _metadata)")
    return p


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
    }


def _print_table(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    # a pipe or file gets the full table instead of 80 columns of wrapped cells
    console = Console() if sys.stdout.isatty() else Console(width=240)
    console.print(
        f"[bold]{doc['location']}[/bold]  {doc['snapshot_type']} {doc['checkpoint_id']}, "
        f"format {doc['format'] or '?'}, backend {doc['backend'] or 'any (canonical)'}, "
        f"_metadata v{doc['metadata_version']}"
        + ("  (from StateMeta snapshot)" if doc["from_snapshot"] else "")
    )
    ops = Table(title="operators", show_lines=False)
    for col in ("uid", "name", "operator id", "par", "max par", "states", "note"):
        ops.add_column(col)
    for op in doc["operators"]:
        note = (
            "fully finished"
            if op["fully_finished"]
            else (f"finished subtasks {op['finished_subtasks']}" if op["finished_subtasks"] else "")
        )
        ops.add_row(
            op["uid"] or "-",
            op["name"] or "-",
            op["operator_id"],
            str(op["parallelism"]),
            str(op["max_parallelism"]),
            str(op["states"]),
            note,
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
        states.add_column(col, overflow="fold")
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


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        from statequery.savepoint import Savepoint

        if args.command == "inspect":
            sp = Savepoint.open(args.path, use_snapshot=not args.no_snapshot)
            doc = _inspect_doc(sp)
            if args.json:
                json.dump(doc, sys.stdout, indent=2, default=str)
                sys.stdout.write("\n")
            else:
                _print_table(doc)
            return 0
        if args.command == "snapshot":
            sp = Savepoint.open(args.path, use_snapshot=False)
            where = sp.write_snapshot(args.out)
            print(f"wrote StateMeta snapshot {where} ({len(sp.states)} states)")
            return 0
    except StatequeryError as e:
        print(f"statequery: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # pragma: no cover
        return 130
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
