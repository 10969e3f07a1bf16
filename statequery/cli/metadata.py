"""``statequery inspect`` (operators and states: tables, narrow-terminal blocks or JSON) and
``statequery snapshot`` (write the StateMeta snapshot)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from statequery.cli.output import (
    _console,
    _storage_options,
    _user_types,
)
from statequery.exceptions import InvalidOptionError

if TYPE_CHECKING:
    from rich.console import Console

    from statequery.savepoint import Savepoint


def _inspect(args: argparse.Namespace) -> int:
    """``statequery inspect``: operators and states, as tables or JSON."""
    from statequery.savepoint import Savepoint

    sp = Savepoint.open(
        args.path, use_snapshot=not args.no_snapshot,
        storage_options=_storage_options(args), **_user_types(args),
    )
    doc = _inspect_doc(sp)
    if args.json:
        json.dump(doc, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        _print_table(doc)
    return 0


def _inspect_doc(sp: Savepoint) -> dict[str, Any]:
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


def _print_blocks(console: Console, doc: dict[str, Any]) -> None:
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


def _snapshot(args: argparse.Namespace) -> int:
    """``statequery snapshot``: write the StateMeta snapshot."""
    from statequery.savepoint import Savepoint

    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))) \
            and "://" not in args.out:
        raise InvalidOptionError(f"--out {args.out}: the directory "
                                 f"{os.path.dirname(os.path.abspath(args.out))} does "
                                 "not exist")
    # derived again; the plan and captured job of the snapshot it replaces are kept
    sp = Savepoint.open(
        args.path, rederive=True, snapshot=args.out, plan=args.plan,
        storage_options=_storage_options(args), **_user_types(args),
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
