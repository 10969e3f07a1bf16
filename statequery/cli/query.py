"""``statequery sql`` without Spark (a SELECT over a catalog in DuckDB) and ``statequery
spark-views`` (temporary-view statements for spark-sql)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from statequery.cli.output import (
    _json_default,
    _print_rows,
    _user_types,
    python_rows,
)
from statequery.cli.parser import CLI_MAX_BYTES, CLI_MAX_ROWS


def _sql(args: argparse.Namespace) -> int:
    """``statequery sql`` without ``--spark``: a SELECT over a catalog in DuckDB."""
    from statequery.sql import sql

    env = os.environ
    table = sql(
        args.query, args.catalog, memory_limit=args.memory_limit, threads=args.threads,
        timeout=args.timeout, pickled=args.pickled,
        **_user_types(args),
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


def _spark_views(args: argparse.Namespace) -> int:
    """``statequery spark-views``: CREATE TEMPORARY VIEW statements for a catalog."""
    from statequery.catalog.views import view_statements

    print("\n".join(view_statements(args.catalog, args.databases)))
    return 0
