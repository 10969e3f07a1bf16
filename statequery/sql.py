"""A Spark-free SQL front end: ``SELECT`` over the tables of a catalog, run by DuckDB.

>>> import statequery
>>> statequery.sql("SELECT key, value FROM user_activity.user_state__count WHERE key = 'user-3'")

Tables are named ``<database>.<table>`` (a database of :class:`statequery.catalog.Catalog`, one of
its ``tables()``, ``state_meta`` included). The query is written in Spark SQL's dialect and parsed
with sqlglot, which also decides what is accepted: one ``SELECT`` (set operations, ``WITH`` and a
leading ``EXPLAIN`` included), reading catalog tables and its own CTEs only. For every table
reference, an equality (``key = 'k'``) or ``key IN (...)`` among the top-level ``AND`` conjuncts of
its ``SELECT``'s ``WHERE`` is pushed down: the literal is parsed against the state's key type
(:func:`statequery.keys.parse_key_text`) and only the key group(s) that can hold it are read.

The query then runs in DuckDB (the ``sql`` extra), transpiled from the sqlglot tree (never from the
user's text), over the Arrow tables statequery read and nothing else: an in-memory database with
external access disabled (no files, no network, no extensions), its configuration locked, Python
replacement scans off, in a process of its own (:mod:`statequery.sqlworker`) whose memory and time
are bounded whatever function the query calls. No part of a query is ever turned into Python
code. See ``docs/sql.md`` and ``docs/security.md`` ("Query limits").
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import re
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from statequery import sqlworker as _worker
from statequery.exceptions import (
    InvalidOptionError,
    MissingExtraError,
    NoSuchTableError,
    QueryLimitError,
    QueryTimeoutError,
    SavepointNotFoundError,
    StatequeryError,
    require_extra,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from sqlglot import exp

    from statequery.catalog import Catalog

__all__ = [
    "ALLOWED_FUNCTIONS", "ALLOWED_NAMED_FUNCTIONS", "SPARK_ONLY_FUNCTIONS", "QueryLimits", "sql",
]

#: the SQL dialect queries are written in (what Spark users type); DuckDB runs the transpiled tree
DIALECT = "spark"

#: DuckDB settings of the query connection, fixed before any query text reaches it and then locked
DUCKDB_CONFIG = _worker.DUCKDB_CONFIG

#: the functions a query may call, as sqlglot's expression classes (what the Spark SQL text
#: parses to). An allow-list: anything else (every table function, ``read_*``, ``query``,
#: ``range``, ``repeat``, settings, environment, files) is refused before DuckDB sees the query.
#: Each is a pure function of its arguments whose output is bounded by its input.
ALLOWED_FUNCTIONS = frozenset({
    # boolean and conditional operators, casts
    "And", "Or", "Xor", "Case", "If", "Coalesce", "Nullif", "Nvl2", "Greatest", "Least",
    "Cast", "TryCast", "Collate", "Exists", "Typeof",
    # aggregates
    "Count", "CountIf", "Sum", "Avg", "Min", "Max", "ArgMax", "ArgMin", "AnyValue", "First",
    "Last", "ArrayAgg", "ArrayUniqueAgg", "Stddev", "StddevPop", "StddevSamp", "Variance",
    "VariancePop", "ApproxDistinct", "ApproxQuantile", "Quantile", "Median", "Corr", "CovarPop",
    "CovarSamp", "LogicalAnd", "LogicalOr", "BitwiseAndAgg", "BitwiseOrAgg", "BitwiseXorAgg",
    "PercentileCont", "PercentileDisc",
    # window functions
    "RowNumber", "Rank", "DenseRank", "PercentRank", "CumeDist", "Ntile", "Lag", "Lead",
    "FirstValue", "LastValue", "NthValue",
    # numbers
    "Abs", "Acos", "Asin", "Atan", "Atan2", "Cos", "Sin", "Tan", "Cbrt", "Ceil", "Floor", "Round",
    "Sqrt", "Exp", "Ln", "Log", "Pow", "Sign", "IsNan", "Hex", "Unhex",
    # strings
    "Concat", "ConcatWs", "Lower", "Upper", "Length", "Substring", "Trim", "Left", "Right",
    "Replace", "Translate", "Reverse", "Initcap", "StrPosition", "StartsWith", "EndsWith",
    "Contains", "RegexpLike", "RegexpExtract", "RegexpReplace", "RegexpSplit", "Split",
    "Levenshtein", "MD5", "SHA", "SHA2", "ToBase64", "FromBase64", "Ascii", "Chr", "Format",
    "JSONExtract", "JSONExtractScalar", "JSONFormat", "FromJson",
    # dates and times
    "CurrentDate", "CurrentTimestamp", "DateAdd", "DateSub", "DateDiff", "DateTrunc",
    "TimestampAdd", "TimestampSub", "TimestampDiff", "TimestampTrunc", "Extract", "Year",
    "Month", "Day", "DayOfMonth", "DayOfWeek", "DayOfYear", "WeekOfYear", "Quarter", "Hour",
    "Minute", "Second", "AddMonths", "MonthsBetween", "LastDay", "NextDay", "TsOrDsAdd",
    "TsOrDsToDate", "StrToDate", "StrToTime", "StrToUnix", "TimeToStr", "UnixToStr",
    "UnixToTime", "UnixSeconds", "UnixMillis", "TimeStrToTime",
    # arrays, maps, structs (over the values of a row: bounded by the row)
    "Array", "ArraySize", "ArrayContains", "ArrayDistinct", "ArrayExcept", "ArrayIntersect",
    "ArrayFilter", "ArrayMax", "ArrayMin", "ArrayPosition", "ArrayRemove", "ArraySlice",
    "ArraySort", "ArrayToString", "ArraysZip", "Flatten", "Transform", "Reduce",
    "Explode", "Posexplode", "PosexplodeOuter", "Inline", "Unnest", "Map",
    "VarMap", "MapKeys", "MapContainsKey", "MapFromEntries", "Struct", "StructExtract",
})

#: functions sqlglot does not model (parsed as ``Anonymous``), by lower-case name. Spark's
#: ``timestamp_seconds/millis/micros``, ``isnull``, ``isnotnull``, ``every``, ``some`` and
#: ``bround`` are not DuckDB's: they are translated (:func:`_rewrite`)
ALLOWED_NAMED_FUNCTIONS = frozenset({
    "cardinality", "date_part", "make_date", "map_values", "map_entries", "mean", "now",
    "bround", "isnull", "isnotnull", "every", "some", "element_at", "timestamp_seconds",
    "timestamp_millis", "timestamp_micros",
})

#: Spark functions DuckDB does not have and statequery does not translate (their meaning differs
#: at the edges): refused with what to write instead
SPARK_ONLY_FUNCTIONS = {
    "pmod": "((a % n) + n) % n (pmod(a, n) for n > 0)",
    "array_union": "array_distinct(concat(a, b))",
    "arrays_overlap": "size(array_intersect(a, b)) > 0",
    "forall": "size(filter(a, x -> NOT p(x))) = 0",
}


def _function_refusal(node: exp.Expr) -> str | None:
    """Why the function call ``node`` may not run, or None."""
    from sqlglot import exp

    if isinstance(node, exp.Anonymous):
        name = str(node.name)
        if name.lower() in ALLOWED_NAMED_FUNCTIONS:
            return None
        if name.lower() in SPARK_ONLY_FUNCTIONS:
            return (f"{name.lower()}() is a Spark SQL function DuckDB does not have; write "
                    f"{SPARK_ONLY_FUNCTIONS[name.lower()]}")
    else:
        if type(node).__name__ in ALLOWED_FUNCTIONS:
            return None
        name = node.sql_name() if hasattr(node, "sql_name") else type(node).__name__
    return (f"the function {name.lower()}() is not allowed in a query (statequery.sql runs "
            "an allow-list of pure functions, docs/sql.md)")


# -- limits --------------------------------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40,
          "tb": 1 << 40, "tib": 1 << 40}


def parse_bytes(text: str | int, what: str) -> int:
    """``"512MiB"``, ``"2g"``, ``"1073741824"`` as a number of bytes (powers of 1024)."""
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
        if not m or m.group(2).lower() not in _UNITS:
            raise InvalidOptionError(f"{what}: {text!r} is not a size (e.g. 512MiB, 2GiB)")
        value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise InvalidOptionError(f"{what}: {text!r} must be positive")
    return value


def _machine_memory() -> int:
    """Physical memory, or the cgroup's limit when lower (containers)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        total = 8 << 30
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return total


def _env(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


def _positive_number(text: str | float, what: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise InvalidOptionError(f"{what}: {text!r} is not a number") from None
    if not value > 0 or value != value or value == float("inf"):
        raise InvalidOptionError(f"{what}: {text!r} must be a positive number")
    return value


@dataclass(frozen=True)
class QueryLimits:
    """What one query may use (docs/security.md, "Query limits").

    * ``memory_limit`` (bytes): DuckDB's memory cap (default: a quarter of the machine's or
      container's memory, at least 256 MiB and at most 8 GiB; ``$STATEQUERY_SQL_MEMORY_LIMIT``);
    * ``threads``: DuckDB's threads (default: half the cores, at most 4;
      ``$STATEQUERY_SQL_THREADS``);
    * ``timeout`` (seconds of wall-clock time in DuckDB): the query is interrupted after it
      (default 60; ``$STATEQUERY_SQL_TIMEOUT``);
    * ``max_rows`` / ``max_bytes``: the largest result (default: no row limit, and at most
      ``memory_limit`` bytes of Arrow data; ``$STATEQUERY_SQL_MAX_ROWS``,
      ``$STATEQUERY_SQL_MAX_BYTES``).
    """

    memory_limit: int
    threads: int
    timeout: float
    max_rows: int | None = None
    max_bytes: int | None = None

    @classmethod
    def resolve(
        cls,
        memory_limit: int | str | None = None,
        threads: int | None = None,
        timeout: float | None = None,
        max_rows: int | None = None,
        max_bytes: int | str | None = None,
    ) -> QueryLimits:
        """The limits from the arguments, else the environment, else the machine's defaults."""
        mem_arg = memory_limit if memory_limit is not None else _env("STATEQUERY_SQL_MEMORY_LIMIT")
        if mem_arg is None:
            mem = min(max(_machine_memory() // 4, 256 << 20), 8 << 30)
        else:
            mem = parse_bytes(mem_arg, "memory limit (STATEQUERY_SQL_MEMORY_LIMIT)")
            if mem < 16 << 20:
                raise InvalidOptionError(f"memory limit {mem_arg!r}: at least 16MiB")
        thr_arg: Any = threads if threads is not None else _env("STATEQUERY_SQL_THREADS")
        if thr_arg is None:
            thr = max(1, min(4, (os.cpu_count() or 2) // 2))
        else:
            thr = int(_positive_number(thr_arg, "threads (STATEQUERY_SQL_THREADS)"))
            if thr < 1 or float(thr_arg) != thr:
                raise InvalidOptionError(f"threads: {thr_arg!r} must be a positive integer")
        to_arg: Any = timeout if timeout is not None else _env("STATEQUERY_SQL_TIMEOUT")
        to = 60.0 if to_arg is None else _positive_number(
            to_arg, "timeout (STATEQUERY_SQL_TIMEOUT)")
        rows_arg: Any = max_rows if max_rows is not None else _env("STATEQUERY_SQL_MAX_ROWS")
        rows = None
        if rows_arg is not None:
            rows = int(_positive_number(rows_arg, "max rows (STATEQUERY_SQL_MAX_ROWS)"))
        bytes_arg = max_bytes if max_bytes is not None else _env("STATEQUERY_SQL_MAX_BYTES")
        size = mem if bytes_arg is None else parse_bytes(
            bytes_arg, "max bytes (STATEQUERY_SQL_MAX_BYTES)")
        return cls(mem, thr, to, rows, size)


@dataclass
class _Source:
    """One table reference of the query, registered in DuckDB as ``name``."""

    name: str
    alias: str
    database: str
    table: str
    node: exp.Table
    keys: list[Any] | None = None  # pushed-down keys (parsed), None: the whole table
    pickled: bool = False  # state tables with the *_py columns (statequery.pickled)
    types: dict[str, pa.DataType] = field(default_factory=dict)  # top-level columns, lower-cased
    data: pa.Table | None = None  # what was read


def _forbidden_nodes() -> tuple[type, ...]:
    from sqlglot import exp

    names = ("DDL", "DML", "Command", "Into", "Set", "Pragma", "Use", "Copy", "Attach", "Detach",
             "Describe", "Transaction", "Commit", "Rollback", "Install", "LoadData", "Summarize")
    return tuple(getattr(exp, n) for n in names if isinstance(getattr(exp, n, None), type))


def _parse(query: str) -> tuple[exp.Expr, bool]:
    """The query's tree and whether it was prefixed by ``EXPLAIN``; anything but one query is an
    :class:`InvalidOptionError`."""
    import sqlglot
    from sqlglot import TokenType, exp
    from sqlglot.errors import SqlglotError

    explain = False
    try:
        tokens = sqlglot.Dialect.get_or_raise(DIALECT).tokenize(query)
        if tokens and tokens[0].token_type == TokenType.COMMAND and tokens[0].text.upper() == (
            "EXPLAIN"
        ):
            if len(tokens) != 2:
                raise InvalidOptionError("EXPLAIN must be followed by one SELECT")
            explain, query = True, tokens[1].text
        trees = sqlglot.parse(query, read=DIALECT)
    except StatequeryError:
        raise
    except SqlglotError as e:
        raise InvalidOptionError(f"cannot parse SQL: {e}") from None
    except (ValueError, TypeError, AttributeError, KeyError, IndexError, RecursionError) as e:
        raise InvalidOptionError(f"cannot parse SQL: {type(e).__name__}: {e}") from None
    trees = [t for t in trees if t is not None]
    if len(trees) != 1:
        raise InvalidOptionError(
            f"exactly one SELECT statement is accepted, not {len(trees)} statements"
        )
    tree = trees[0]
    if not isinstance(tree, exp.Query):
        raise InvalidOptionError(
            f"only SELECT queries are supported, not {type(tree).__name__.upper()}"
        )
    forbidden = _forbidden_nodes()
    for node in tree.walk():
        if isinstance(node, forbidden):
            raise InvalidOptionError(
                f"only SELECT queries are supported: {type(node).__name__.upper()} is not allowed"
            )
        if isinstance(node, exp.Table) and not isinstance(node.this, exp.Identifier):
            raise InvalidOptionError(
                f"only catalog tables can be read, not {node.this.sql(DIALECT)!r}"
            )
        if isinstance(node, exp.Func):
            refused = _function_refusal(node)
            if refused:
                raise InvalidOptionError(refused)
        if isinstance(node, exp.Bracket):
            _check_index(node)
        if isinstance(node, (exp.Lateral, exp.From, exp.Join)) and isinstance(
            node.this, exp.Func
        ) and not isinstance(node.this, (exp.Explode, exp.Unnest, exp.Inline)):
            raise InvalidOptionError(
                f"only catalog tables can be read, not {node.this.sql(DIALECT)!r}"
            )
    return _rewrite(tree), explain


#: functions whose value is the length of their argument (Spark's ``size``/``array_size``/
#: ``cardinality``, and ``len``/``length``/``array_length`` as DuckDB users write them)
_LENGTH_FUNCTIONS = ("Length", "ArraySize")
_LENGTH_NAMES = ("cardinality", "array_length", "len", "length")


def _check_index(node: exp.Bracket) -> None:
    """``x[len(x)]``: arrays are indexed from 0 here (Spark SQL), so the index one past the
    last element is always NULL; a query writing it means the last element (DuckDB's and SQL's
    1-based arrays). Refused with the ways to say that."""
    from sqlglot import exp

    if len(node.expressions) != 1 or node.args.get("offset"):
        return
    index = node.expressions[0]
    length = type(index).__name__ in _LENGTH_FUNCTIONS or (
        isinstance(index, exp.Anonymous) and str(index.name).lower() in _LENGTH_NAMES)
    if not length or not index.args.get("this") and not index.expressions:
        return
    arg = index.args.get("this") if not isinstance(index, exp.Anonymous) else index.expressions[0]
    if not isinstance(arg, exp.Expr) or arg != node.this:
        return
    x = node.this.sql(DIALECT)
    raise InvalidOptionError(
        f"{node.sql(DIALECT)} is past the end: arrays are indexed from 0 in statequery.sql "
        f"(Spark SQL), so the last element is {x}[size({x}) - 1] or element_at({x}, -1)"
    )


#: Spark's ``timestamp_seconds/millis/micros`` (not in DuckDB) as sqlglot's UNIX_TO_TIME scales
_EPOCH_SCALES = {"timestamp_seconds": 0, "timestamp_millis": 3, "timestamp_micros": 6}


def _rewrite(tree: exp.Expr) -> exp.Expr:
    """What the Spark SQL text means, in the tree DuckDB's SQL is generated from:

    * a struct field named in double quotes, ``value."avg_amount.count"`` (a name with a dot,
      as plan-named accumulators have), is the field (Spark reads ``"..."`` as a string, which
      after a dot names nothing);
    * ``timestamp_seconds/millis/micros(n)`` are ``UNIX_TO_TIME`` at that scale (DuckDB's
      ``to_timestamp``, ``epoch_ms``, ``make_timestamp``), a ``TIMESTAMP`` as in Spark; Spark's
      ``isnull``, ``isnotnull``, ``every``, ``some`` and ``bround`` (HALF_EVEN) are what DuckDB
      calls ``IS NULL``, ``IS NOT NULL``, ``bool_and``, ``bool_or`` and ``round_even``;
    * ``size(x)`` is DuckDB's ``cardinality(x)`` (an array's or a map's, as Spark's), and
      ``array_distinct(a)`` keeps the first of each element in order, as Spark's;
    * the index parameter of ``transform(a, (x, i) -> ...)`` / ``filter(a, (x, i) -> ...)``
      counts from 0 (:func:`_lambda_indices`).
    """
    from sqlglot import exp

    _lambda_indices(tree)
    for node in list(tree.walk()):
        if isinstance(node, exp.Column):
            for part in ("this", "table", "db", "catalog"):
                name = node.args.get(part)
                if isinstance(name, exp.Literal) and name.is_string:
                    node.set(part, exp.to_identifier(name.this, quoted=True))
        elif isinstance(node, exp.Dot):
            name = node.args.get("expression")
            if isinstance(name, exp.Literal) and name.is_string:
                node.set("expression", exp.to_identifier(name.this, quoted=True))
        elif isinstance(node, exp.Anonymous) and str(node.name).lower() in _TRANSLATED:
            node.replace(_translate(str(node.name).lower(), node.expressions))
        elif isinstance(node, exp.ArraySize) and not node.args.get("expression"):
            # Spark's size(): an array's or a map's; DuckDB's array_length takes no map
            node.replace(exp.Anonymous(this="cardinality", expressions=[node.this]))
        elif isinstance(node, exp.ArrayDistinct) and not node.args.get("expression"):
            # Spark keeps the first of each element in order (one NULL included); DuckDB's
            # list_distinct neither keeps the order nor the NULL
            e, i = exp.to_identifier("__sq_e"), exp.to_identifier("__sq_i")
            node.replace(exp.ArrayFilter(this=node.this, expression=exp.Lambda(
                this=exp.EQ(this=exp.ArrayPosition(this=node.this.copy(), expression=e.copy()),
                            expression=i.copy()),
                expressions=[e, i])))
    return tree


def _lambda_indices(tree: exp.Expr) -> None:
    """Spark's ``transform(a, (x, i) -> ...)`` and ``filter(a, (x, i) -> ...)`` count ``i`` from
    0, DuckDB's from 1 (sqlglot passes the lambda through): ``i`` is ``(i - 1)`` in the body,
    where it is this lambda's ``i`` (not an inner lambda's of the same name)."""
    from sqlglot import exp

    for lam in list(tree.find_all(exp.Lambda)):
        if len(lam.expressions) != 2 or not isinstance(lam.parent, (exp.Transform,
                                                                    exp.ArrayFilter)):
            continue
        name = str(lam.expressions[1].name).lower()
        for node in list(lam.this.walk()) if isinstance(lam.this, exp.Expr) else []:
            if isinstance(node, exp.Column) and (node.table or not isinstance(
                node.this, exp.Identifier
            )):
                continue
            if not isinstance(node, (exp.Column, exp.Identifier)) or isinstance(
                node.parent, (exp.Column, exp.Dot)
            ) and node.arg_key != "this" or str(node.name).lower() != name:
                continue
            if isinstance(node, exp.Identifier) and isinstance(node.parent, exp.Column):
                continue  # the Column around it is the reference
            nearest = _lambda_of(node)
            if nearest is not None and nearest[0] is lam and nearest[1] == 1:
                node.replace(exp.Paren(this=exp.Sub(this=node.copy(),
                                                    expression=exp.Literal.number(1))))


_TRANSLATED = ("timestamp_seconds", "timestamp_millis", "timestamp_micros", "isnull",
               "isnotnull", "every", "some", "bround")


def _translate(name: str, args: list[exp.Expr]) -> exp.Expr:
    """Spark's ``name(args)`` in nodes DuckDB's SQL is generated from."""
    from sqlglot import exp

    arity = (1, 2) if name == "bround" else (1,)
    if len(args) not in arity:
        raise InvalidOptionError(
            f"{name}() takes {' or '.join(map(str, arity))} argument(s), not {len(args)}")
    if name in _EPOCH_SCALES:
        scale = _EPOCH_SCALES[name]
        new: exp.Expr = exp.UnixToTime(this=args[0], scale=exp.Literal.number(scale))
        # DuckDB's to_timestamp gives a TIMESTAMP WITH TIME ZONE; Spark a TIMESTAMP (UTC here)
        return exp.Cast(this=new, to=exp.DataType.build("TIMESTAMP")) if scale == 0 else new
    if name == "isnull":
        return exp.Paren(this=exp.Is(this=args[0], expression=exp.Null()))
    if name == "isnotnull":
        return exp.Paren(this=exp.Not(this=exp.Is(this=args[0], expression=exp.Null())))
    if name == "every":
        return exp.LogicalAnd(this=args[0])
    if name == "some":
        return exp.LogicalOr(this=args[0])
    # bround: HALF_EVEN rounding, DuckDB's round_even (its scale is required)
    return exp.Anonymous(this="round_even", expressions=[
        args[0], args[1] if len(args) > 1 else exp.Literal.number(0)])


def _path(node: exp.Expr) -> list[str] | None:
    """``a.b.c`` (a column and the struct fields after it) as its names, else None."""
    from sqlglot import exp

    if isinstance(node, exp.Column):
        parts = node.parts
        if all(isinstance(p, exp.Identifier) for p in parts):
            return [str(p.name) for p in parts]
        return None
    if isinstance(node, exp.Dot) and isinstance(node.expression, exp.Identifier):
        base = _path(node.this)
        return None if base is None else [*base, str(node.expression.name)]
    return None


def _arrow_type(node: exp.Expr, sources: list[_Source]) -> pa.DataType | None:
    """The Arrow type of ``node`` when it names a catalog table's column (or a struct field in
    it) read by the ``SELECT`` it stands in; None when that is not certain."""
    import pyarrow as pa
    from sqlglot import exp

    path = _path(node)
    select = node.find_ancestor(exp.Select)
    if not path or select is None:
        return None
    here = [s for s in sources if s.node.find_ancestor(exp.Select) is select]
    named = [s for s in here if len(path) > 1 and s.alias.lower() == path[0].lower()]
    if named:
        candidates, names = named, path[1:]
    elif select.args.get("laterals"):
        return None  # a LATERAL VIEW's column may have the name
    else:
        candidates, names = here, path
    found = {str(s.types[names[0].lower()]): s.types[names[0].lower()]
             for s in candidates if names[0].lower() in s.types}
    if len(found) != 1:
        return None
    typ = next(iter(found.values()))
    for name in names[1:]:
        if not pa.types.is_struct(typ):
            return None
        fields = [typ.field(i) for i in range(typ.num_fields)
                  if typ.field(i).name.lower() == name.lower()]
        if len(fields) != 1:
            return None
        typ = fields[0].type
    return typ


def _spark_type(typ: pa.DataType) -> str:
    """``typ`` as a Spark SQL type string for sqlglot's schema (field names lower-cased and
    quoted: Spark resolves them case-insensitively); ``STRING`` where it is not worth saying
    (``VOID`` would make sqlglot drop the whole struct's type)."""
    import pyarrow as pa

    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        return f"ARRAY<{_spark_type(typ.value_type)}>"
    if pa.types.is_map(typ):
        return f"MAP<{_spark_type(typ.key_type)}, {_spark_type(typ.item_type)}>"
    if pa.types.is_struct(typ):
        fields = ", ".join(
            "`" + typ.field(i).name.lower().replace("`", "``") + "` "
            + _spark_type(typ.field(i).type) for i in range(typ.num_fields))
        return f"STRUCT<{fields}>" if fields else "STRING"
    for check, name in ((pa.types.is_boolean, "BOOLEAN"), (pa.types.is_int8, "TINYINT"),
                        (pa.types.is_int16, "SMALLINT"), (pa.types.is_int32, "INT"),
                        (pa.types.is_integer, "BIGINT"), (pa.types.is_float32, "FLOAT"),
                        (pa.types.is_floating, "DOUBLE"), (pa.types.is_string, "STRING"),
                        (pa.types.is_large_string, "STRING"), (pa.types.is_binary, "BINARY"),
                        (pa.types.is_large_binary, "BINARY"), (pa.types.is_date, "DATE"),
                        (pa.types.is_timestamp, "TIMESTAMP")):
        if check(typ):
            return name
    if pa.types.is_decimal(typ):
        return f"DECIMAL({typ.precision}, {typ.scale})"
    return "STRING"


#: functions whose value is always an array (sqlglot does not always say so)
_ARRAY_RESULTS = ("Transform", "ArrayFilter", "MapKeys", "ArrayDistinct", "ArrayExcept",
                  "ArrayIntersect", "ArrayRemove", "ArraySort", "ArraysZip", "Split",
                  "RegexpSplit", "ArrayAgg", "ArrayUniqueAgg", "Array", "ArraySlice")
_ARRAY_NAMES = ("map_values", "map_entries")


def _container(node: exp.Expr, typ: exp.DataType | None) -> str | None:
    """``"array"``, ``"map"`` or ``"struct"``: what the annotated expression ``node`` is, when
    that is established, else None."""
    from sqlglot import exp

    if typ is not None:
        for kind, dtype in (("array", exp.DType.ARRAY), ("map", exp.DType.MAP),
                            ("struct", exp.DType.STRUCT)):
            if typ.is_type(dtype):
                return kind
    if type(node).__name__ in _ARRAY_RESULTS or (
        isinstance(node, exp.Anonymous) and str(node.name).lower() in _ARRAY_NAMES
    ):
        return "array"
    if isinstance(node, exp.Concat) and any(
        isinstance(a, exp.Expr) and a.type is not None and a.type.is_type(exp.DType.ARRAY)
        for a in node.expressions
    ):
        return "array"
    if isinstance(node, exp.FromJson) and isinstance(node.expression, exp.Literal):
        try:
            schema = exp.DataType.build(str(node.expression.this), dialect=DIALECT)
        except Exception:  # noqa: BLE001 - a schema sqlglot cannot read: not established
            return None
        return _container(exp.Null(), schema) if schema.this != exp.DType.UNKNOWN else None
    return None


def _annotated(tree: exp.Expr, sources: list[_Source]) -> dict[int, str | None]:
    """What the base of every Spark-style ``x[i]`` in ``tree`` is (``"array"``, ``"map"``,
    ``"struct"``, or None: not established), by the bracket's ``meta["sq_bracket"]`` number.

    A copy of the tree is qualified and its types annotated by sqlglot with a schema of the
    catalog tables' Arrow types: a column is followed through subqueries, CTEs, aliases, joins,
    set operations and ``LATERAL VIEW`` back to a catalog column or to the function that built
    it."""
    from sqlglot import exp
    from sqlglot.optimizer.annotate_types import annotate_types
    from sqlglot.optimizer.qualify import qualify
    from sqlglot.schema import MappingSchema

    tables: dict[str, object] = {}
    for src in sources:
        database: dict[str, object] = tables.setdefault(src.database, {})  # type: ignore[assignment]
        database[src.table] = {name: _spark_type(typ) for name, typ in src.types.items()}
    copy = tree.copy()
    try:
        schema = MappingSchema(tables, dialect=DIALECT)
        copy = qualify(copy, schema=schema, dialect=DIALECT, validate_qualify_columns=False,
                       quote_identifiers=False, identify=False)
        annotate_types(copy, schema=schema, dialect=DIALECT)
    except Exception:  # noqa: BLE001 - sqlglot's optimizer fails in its own ways: not established
        return {}
    laterals = {str(lat.alias).lower(): _lateral_columns(lat) for lat in copy.find_all(exp.Lateral)
                if lat.alias and isinstance(lat.this, (exp.Explode, exp.ExplodeOuter, exp.Inline))}
    kinds: dict[int, str | None] = {}
    for node in copy.find_all(exp.Bracket):
        number = node.meta.get("sq_bracket") if node.meta else None
        if number is None:
            continue
        fields: list[str] = []
        base = node.this
        while isinstance(base, exp.Dot) and isinstance(base.expression, exp.Identifier):
            fields.insert(0, str(base.expression.name))
            base = base.this
        lambda_param = _lambda_of(base)
        if lambda_param is not None or (
            isinstance(base, exp.Column) and base.table and base.table.lower() in laterals
        ):
            # sqlglot types a LATERAL VIEW's columns as the exploded array itself, or not at
            # all, and a lambda's parameters not at all: what they are is read from the
            # function's argument here
            typ = (_lambda_param_type(*lambda_param) if lambda_param is not None
                   else laterals[base.table.lower()].get(base.name.lower()))
            for name in fields:
                typ = _field_type(typ, name)
            kinds[number] = _container(exp.Null(), typ) if typ is not None else _UNKNOWN
        else:
            kinds[number] = _container(node.this, node.this.type)
    return kinds


#: a base whose type is not established and must not be guessed from a catalog column's name
_UNKNOWN = "unknown"


def _field_type(typ: exp.DataType | None, name: str) -> exp.DataType | None:
    """The type of the struct field ``name`` (case-insensitive) of ``typ``, else None."""
    from sqlglot import exp

    if typ is None or not typ.is_type(exp.DType.STRUCT):
        return None
    found = [f.args.get("kind") for f in typ.expressions
             if isinstance(f, exp.ColumnDef) and f.name.lower() == name.lower()]
    return found[0] if len(found) == 1 and isinstance(found[0], exp.DataType) else None


def _lambda_of(node: exp.Expr) -> tuple[exp.Lambda, int] | None:
    """The nearest lambda that has ``node`` (a bare name) as a parameter, and which one."""
    from sqlglot import exp

    if isinstance(node, exp.Column) and not node.table and isinstance(node.this, exp.Identifier):
        name = node.name
    elif isinstance(node, exp.Identifier):
        name = str(node.name)
    else:
        return None
    for lam in _ancestors(node, exp.Lambda):
        params = [str(p.name).lower() for p in lam.expressions]
        if name.lower() in params:
            return lam, params.index(name.lower())
    return None


def _ancestors(node: exp.Expr, kind: type[exp.Lambda]) -> list[exp.Lambda]:
    found = []
    parent = node.parent
    while parent is not None:
        if isinstance(parent, kind):
            found.append(parent)
        parent = parent.parent
    return found


def _lambda_param_type(lam: exp.Lambda, position: int) -> exp.DataType | None:
    """The type of parameter ``position`` of ``lam`` in ``transform(a, x -> ...)``,
    ``filter(a, (x, i) -> ...)``, ``exists(a, x -> ...)``, ``aggregate(a, z, (acc, x) -> ...)``
    and ``array_sort(a, (l, r) -> ...)``: an element of ``a`` (an index: INT), else None."""
    from sqlglot import exp

    func = lam.parent
    array = func.this if isinstance(func, exp.Func) else None
    if not isinstance(array, exp.Expr):
        return None
    outer = _lambda_of(array)
    typ = _lambda_param_type(*outer) if outer is not None else array.type
    if typ is None or not typ.is_type(exp.DType.ARRAY) or len(typ.expressions) != 1:
        return None
    element = typ.expressions[0]
    if isinstance(func, exp.Reduce):
        roles = {1: element}
    elif isinstance(func, exp.ArraySort):
        roles = {0: element, 1: element}
    elif isinstance(func, (exp.Transform, exp.ArrayFilter, exp.Exists)):
        roles = {0: element, 1: exp.DataType.build("INT")}
    else:
        return None
    return roles.get(position)


def _lateral_columns(lateral: exp.Lateral) -> dict[str, exp.DataType]:
    """The columns of ``LATERAL VIEW [pos]explode[_outer](x) t [AS a, b]`` or
    ``inline(x)`` by lower-cased name, with their types from ``x``'s annotated type (Spark's
    names when the view names none: ``pos``, ``col``, ``key``, ``value``)."""
    from sqlglot import exp

    func = lateral.this
    arg = func.this
    typ = arg.type if isinstance(arg, exp.Expr) else None
    if typ is None:
        return {}
    names: list[str]
    types: list[exp.DataType]
    if isinstance(func, exp.Inline):
        element = typ.expressions[0] if typ.is_type(exp.DType.ARRAY) and typ.expressions else None
        if not isinstance(element, exp.DataType) or not element.is_type(exp.DType.STRUCT):
            return {}
        defs = [f for f in element.expressions if isinstance(f, exp.ColumnDef)]
        names = [f.name for f in defs]
        types = [f.args["kind"] for f in defs]
    elif typ.is_type(exp.DType.ARRAY) and len(typ.expressions) == 1:
        names, types = ["col"], list(typ.expressions)
    elif typ.is_type(exp.DType.MAP) and len(typ.expressions) == 2:
        names, types = ["key", "value"], list(typ.expressions)
    else:
        return {}
    if isinstance(func, (exp.Posexplode, exp.PosexplodeOuter)):
        names, types = ["pos", *names], [exp.DataType.build("INT"), *types]
    alias = lateral.args.get("alias")
    given = [str(c.name) for c in alias.columns] if alias is not None else []
    if given:
        if len(given) != len(names):
            return {}
        names = given
    return {n.lower(): t for n, t in zip(names, types, strict=True)
            if isinstance(t, exp.DataType)}


def _spark_bracket(node: exp.Bracket) -> bool:
    """``x[i]`` written as Spark's index/key/field access (not ``element_at``, not JSON)."""
    return (len(node.expressions) == 1 and not node.args.get("json_access")
            and not node.args.get("offset"))


def _type_brackets(tree: exp.Expr, sources: list[_Source]) -> None:
    """Spark indexes arrays from 0 and maps by key, DuckDB arrays from 1; sqlglot shifts an
    index only when it is an integer literal and it does not know the base is not an array.
    Here every ``x[i]`` is decided by what ``x`` is (:func:`_annotated`, else a catalog column's
    Arrow type): into an array the index is shifted whatever its type (``value[key_group % 3]``,
    ``a[i]``), a negative one giving NULL as Spark's ``try_element_at``; into a map or a struct
    it is a key, never shifted. Where what ``x`` is cannot be established, the query is refused
    (an :class:`InvalidOptionError` with what to write instead) rather than guessed."""
    import pyarrow as pa
    from sqlglot import exp

    brackets = [b for b in tree.find_all(exp.Bracket) if _spark_bracket(b)]
    if not brackets:
        return
    for number, node in enumerate(brackets):
        node.meta["sq_bracket"] = number
    kinds = _annotated(tree, sources)
    for number, node in enumerate(brackets):
        node.meta.pop("sq_bracket", None)
        kind = kinds.get(number)
        if kind == _UNKNOWN:
            kind = None
        elif kind is None:
            typ = _arrow_type(node.this, sources)
            if typ is not None and (pa.types.is_list(typ) or pa.types.is_large_list(typ)
                                    or pa.types.is_fixed_size_list(typ)):
                kind = "array"
            elif typ is not None and pa.types.is_map(typ):
                kind = "map"
            elif typ is not None and pa.types.is_struct(typ):
                kind = "struct"
            else:  # sqlglot's optimizer gave up: what the function that built it says
                kind = _container(node.this, None)
        index = node.expressions[0]
        if kind is None:
            if isinstance(index, exp.Literal) and index.is_string:
                continue  # a key or a field name: never shifted, whatever x is
            x, i = node.this.sql(DIALECT), index.sql(DIALECT)
            literal = _literal_text(index) if isinstance(index, exp.Literal) else None
            one = str(int(literal) + 1) if literal and literal.isdigit() else (
                f"{i} + 1" if isinstance(index, (exp.Column, exp.Literal)) else f"({i}) + 1")
            raise InvalidOptionError(
                f"{node.sql(DIALECT)}: cannot tell whether {x} is an array (indexed from 0) or "
                f"a map (looked up by key), so its index is not guessed; write "
                f"element_at({x}, {one}) for the element at index {i} of an array "
                f"(element_at counts from 1), element_at({x}, {i}) for the value of key {i} "
                f"of a map, or CAST({x} AS ARRAY<...>) / CAST({x} AS MAP<...>)")
        # the generator shifts by DuckDB's offset minus this one: 0, the index is written here
        node.set("offset", 1)
        if not isinstance(node.this, (exp.Column, exp.Dot, exp.Bracket, exp.Paren)):
            node.set("this", exp.Paren(this=node.this))  # concat(a, b)[0] is DuckDB's (a || b)[1]
        if kind != "array":
            continue
        literal = _literal_text(index)
        if literal is not None and isinstance(index, (exp.Literal, exp.Neg)) and re.fullmatch(
            r"-?\d+", literal
        ):
            n = int(literal)
            node.set("expressions", [exp.Literal.number(n + 1 if n >= 0 else 0)])
        else:  # a negative index is NULL (DuckDB's 0), never DuckDB's from-the-end
            node.set("expressions", [exp.Add(
                this=exp.Anonymous(this="greatest", expressions=[
                    exp.Cast(this=index, to=exp.DataType.build("BIGINT")),
                    exp.Literal.number(-1)]),
                expression=exp.Literal.number(1))])


def _is_key_column(node: exp.Expr, src: _Source, single: bool) -> bool:
    from sqlglot import exp

    if not isinstance(node, exp.Column) or node.name.lower() != "key" or node.args.get("db"):
        return False
    qualifier = node.table
    return qualifier.lower() == src.alias.lower() if qualifier else single


def _literal_text(node: exp.Expr) -> str | None:
    from sqlglot import exp

    if isinstance(node, exp.Literal):
        return str(node.this)
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and node.this.is_number:
        return "-" + str(node.this.this)
    if isinstance(node, exp.Boolean):
        return "true" if node.this else "false"
    if isinstance(node, (exp.Cast, exp.TryCast)) and isinstance(node.this, exp.Literal):
        # typed literals (DATE '2024-01-01', TIMESTAMP '...', CAST('12.50' AS DECIMAL(10, 2))):
        # the text is read against the state's key type, exactly as a plain literal is
        return str(node.this.this)
    return None


def _push_down(src: _Source, key_spec: Any) -> None:
    """Find ``key = literal`` / ``key IN (literals)`` in the WHERE of ``src``'s SELECT; parse the
    keys into ``src.keys`` and drop that conjunct (the read returns exactly those keys)."""
    from sqlglot import exp

    from statequery.keys import parse_key_text

    select = src.node.parent_select
    if not isinstance(select, exp.Select) or src.node.find_ancestor(exp.Subquery) is not (
        select.find_ancestor(exp.Subquery)
    ):
        return
    where = select.args.get("where")
    if where is None:
        return
    single = not select.args.get("joins") and isinstance(select.args.get("from_"), exp.From)
    for conj in where.this.flatten() if isinstance(where.this, exp.And) else [where.this]:
        texts: list[str | None] = []
        if isinstance(conj, exp.EQ):
            if _is_key_column(conj.this, src, single):
                texts = [_literal_text(conj.expression)]
            elif _is_key_column(conj.expression, src, single):
                texts = [_literal_text(conj.this)]
        elif (
            isinstance(conj, exp.In)
            and not conj.args.get("query")
            and _is_key_column(conj.this, src, single)
        ):
            texts = [_literal_text(e) for e in conj.expressions]
        if not texts or any(t is None for t in texts):
            continue
        keys: list[Any] = []
        for t in texts:
            k = parse_key_text(t or "", key_spec)
            if k not in keys:
                keys.append(k)
        src.keys = keys
        conj.replace(exp.true())
        return


def _read(cat: Catalog, src: _Source) -> pa.Table:
    import pyarrow as pa

    sp = cat.savepoint(src.database)
    if src.table.lower().endswith("__changes"):  # the change feed of a job (docs/history.md)
        from statequery.history import changes_of

        return changes_of(cat.folder(src.database), sp, src.table[: -len("__changes")])
    if src.table.lower() == "state_meta":
        return sp.state_meta()
    if src.table.lower() == "state_stats":
        return sp.stats().table
    operator = sp.operator_table_id(src.table)
    if operator is not None:  # every keyed state of an operator, in one pass
        table = sp.operator_table(src.table)
        _push_down(src, sp.operator(operator).key_spec)
        names = [s.name for s in table.states]
        batches = [
            b
            for k in (src.keys if src.keys is not None else [None])
            for b in table.batches(sp.read_operator(operator, names, key=k))
        ]
        return pa.Table.from_batches(batches, schema=table.schema)
    row = cat.resolve(src.database, src.table)
    info = sp.state(row["table_name"])
    if info.key_spec is not None:
        _push_down(src, info.key_spec)
    if src.keys is None:
        return sp.read(info, pickled=src.pickled)
    parts = [sp.read(info, key=k, pickled=src.pickled) for k in src.keys]
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def _require_duckdb() -> None:
    import importlib.util

    if importlib.util.find_spec("duckdb") is None:
        raise MissingExtraError("statequery.sql", "duckdb", "sql")


def _connect(limits: QueryLimits | None = None) -> Any:
    """A fresh in-memory DuckDB connection that can reach nothing but what is registered, with
    the memory and thread caps of ``limits`` (what the query process runs queries on)."""
    _require_duckdb()
    limits = limits or QueryLimits.resolve()
    return _worker.connect(limits.memory_limit, limits.threads)


def _lock(con: Any) -> None:
    _worker.lock(con)


def _restore_types(table: pa.Table, sources: list[_Source]) -> pa.Table:
    """Give result columns named like a source column that column's Arrow type back (DuckDB has
    no millisecond TIMESTAMP WITH TIME ZONE and names list items differently) when it casts
    losslessly."""
    import pyarrow as pa

    columns = list(table.columns)
    fields = list(table.schema)
    for i, f in enumerate(fields):
        known = {s.types[f.name.lower()] for s in sources if f.name.lower() in s.types}
        if len(known) != 1:
            continue
        want = known.pop()
        if f.type == want or pa.types.is_null(want):
            continue
        try:
            columns[i] = columns[i].cast(want, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            continue
        fields[i] = pa.field(f.name, want)
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def sql(
    query: str,
    catalog: Catalog | str | None = None,
    *,
    memory_limit: int | str | None = None,
    threads: int | None = None,
    timeout: float | None = None,
    max_rows: int | None = None,
    max_bytes: int | str | None = None,
    pickled: bool = False,
    classpath: Sequence[str] | str | None = None,
    protobuf_descriptors: str | os.PathLike[str] | None = None,
    protobuf_messages: Mapping[str, str] | Sequence[str] | str | None = None,
) -> pa.Table:
    """Run a ``SELECT`` over the tables ``<database>.<table>`` of ``catalog`` (a
    :class:`~statequery.catalog.Catalog`, a folder, or the shipped default) as a pyarrow Table.

    ``pickled``: state tables have ``key_py``, ``user_key_py``, ``value_py`` (and
    ``*_py_reason``) after their bytes columns, the Python values a PyFlink job pickled there
    as JSON text (:meth:`Savepoint.read`'s ``pickled``; ``state_meta``'s ``pickled_columns``
    lists them); operator tables and ``state_meta`` are unchanged.

    ``classpath``, ``protobuf_descriptors``, ``protobuf_messages``: those of
    :func:`statequery.open` (the job's jars, a Protobuf descriptor set), for every table the
    query reads: its Kryo values are decoded with them (docs/decoding.md, "Kryo values").

    The limits (:class:`QueryLimits`: memory cap, threads, wall-clock timeout, result rows and
    bytes) default to ``$STATEQUERY_SQL_*``, else to sizes from the machine.

    Raises :class:`InvalidOptionError` for SQL that does not parse, is not one query, reads
    anything but catalog tables, calls a function outside the allow-list, or that DuckDB
    rejects; :class:`NoSuchTableError` for unknown databases or tables;
    :class:`QueryLimitError` / :class:`QueryTimeoutError` past a limit;
    :class:`MissingExtraError` without DuckDB (``statequery[sql]``).
    """
    require_extra("sqlglot", "sql", "statequery.sql (SQL without Spark)")
    from sqlglot import exp

    from statequery.catalog import Catalog

    limits = QueryLimits.resolve(memory_limit, threads, timeout, max_rows, max_bytes)
    tree, explain = _parse(query)
    _require_duckdb()  # before reading: a missing extra is reported first
    worker = _take_worker()  # it starts while the tables are read
    try:
        user_types: dict[str, Any] = {
            "classpath": classpath, "protobuf_descriptors": protobuf_descriptors,
            "protobuf_messages": protobuf_messages}
        if isinstance(catalog, Catalog):
            cat = catalog if all(v is None for v in user_types.values()) else (
                dataclasses.replace(catalog, _open={}, **user_types))
        else:
            cat = Catalog(catalog or "", **user_types)
        sources = _sources(tree, cat, pickled)
        for src in sources:
            try:
                table = _read(cat, src)
            except SavepointNotFoundError as e:  # an unknown database
                raise NoSuchTableError(str(e)) from None
            src.types = {f.name.lower(): f.type for f in table.schema}
            src.data = table
        _type_brackets(tree, sources)
        for src in sources:
            src.node.replace(
                exp.Table(this=exp.to_identifier(src.name, quoted=True),
                          alias=exp.TableAlias(this=exp.to_identifier(src.alias, quoted=True)))
            )
        try:
            text = tree.sql(dialect="duckdb", comments=False)
        except Exception as e:  # noqa: BLE001 - sqlglot's generator fails in its own ways
            raise InvalidOptionError(
                f"cannot translate the query for DuckDB: {type(e).__name__}: {e}") from None
    except BaseException:
        _give_back(worker)  # it has run nothing
        raise
    return _run(worker, ("EXPLAIN " if explain else "") + text, sources, limits)


def _cte_in_scope(node: exp.Table) -> bool:
    """Whether the bare table name ``node`` names a CTE where it stands, as DuckDB resolves it:
    a CTE is seen in the body of the query whose ``WITH`` defines it (every branch of a set
    operation, every subquery in it), in the CTEs after it in that ``WITH``, and in its own
    body under ``WITH RECURSIVE``; not in the CTEs before it, and not outside that query (where
    DuckDB would look the name up in its own catalog: ``pg_settings``, ``duckdb_tables``)."""
    from sqlglot import exp

    name = node.name.lower()
    below: exp.Expr = node
    parent = below.parent
    while parent is not None:
        if isinstance(parent, exp.With):
            ctes = [c for c in parent.expressions if isinstance(c, exp.CTE)]
            here = next((i for i, c in enumerate(ctes) if c is below), len(ctes))
            seen = ctes[: here + 1] if parent.args.get("recursive") else ctes[:here]
            if any(c.alias_or_name.lower() == name for c in seen):
                return True
        elif isinstance(parent, exp.Query):
            with_ = parent.args.get("with_")
            if isinstance(with_, exp.With) and with_ is not below and any(
                isinstance(c, exp.CTE) and c.alias_or_name.lower() == name
                for c in with_.expressions
            ):
                return True
        below, parent = parent, parent.parent
    return False


def _sources(tree: exp.Expr, cat: Catalog, pickled: bool) -> list[_Source]:
    """The catalog tables ``tree`` reads, each under a name of its own no query can write (a
    random token: a query naming ``__sq_...`` names nothing); a bare name must be a CTE in
    scope where it stands (:func:`_cte_in_scope`)."""
    from sqlglot import exp

    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    token = secrets.token_hex(8)
    sources: list[_Source] = []
    for node in list(tree.find_all(exp.Table)):
        if not node.args.get("db"):
            if _cte_in_scope(node):
                continue
            if node.name.lower() in ctes:
                raise NoSuchTableError(
                    f"table {node.name!r}: a CTE of that name is defined, but not where it is "
                    "read (a CTE is seen only in the query its WITH belongs to, and by the CTEs "
                    "after it); name tables <database>.<table>")
            raise NoSuchTableError(
                f"table {node.name!r}: name tables <database>.<table> "
                f"(databases: {', '.join(cat.databases()) or 'none'})"
            )
        if node.args.get("catalog"):
            raise NoSuchTableError(f"table {node.sql()!r}: name tables <database>.<table>")
        sources.append(_Source(f"__sq_{token}_{len(sources)}", node.alias_or_name, node.db,
                               node.name, node, pickled=pickled))
    if not sources:
        raise InvalidOptionError("the query reads no <database>.<table>")
    return sources


def _size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n >> 20} MiB"


# -- the query process ---------------------------------------------------------------------------

#: memory a query process may use beyond DuckDB's cap (what DuckDB allocates outside its buffer
#: manager: a vector's strings, thread-local state) before it is stopped
PROCESS_MARGIN = 64 << 20
#: idle query processes kept for the next query (about 115 MiB each)
IDLE_WORKERS = 2
#: a query process larger than this after its query is ended rather than kept (what a large
#: query allocated may stay mapped)
IDLE_RSS = 256 << 20
#: how often the parent looks at a running query's process (seconds)
WATCH_INTERVAL = 0.01

_BOOT = ("import sys, importlib.util as u; del sys.path[0]; "
         "s = u.spec_from_file_location('_statequery_sqlworker', sys.argv[1]); "
         "m = u.module_from_spec(s); s.loader.exec_module(m); m.main()")


def _grace(timeout: float) -> float:
    """How long after its timeout a query process that has not stopped is ended."""
    return min(2.0, max(0.5, timeout / 4))


class _Worker:
    """A query process (:mod:`statequery.sqlworker`), started at once and greeted on first
    use."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.greeted = False
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, _worker.__file__],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                close_fds=True,
            )
        except OSError as e:
            raise StatequeryError(
                f"cannot start the SQL query process ({sys.executable!r}): {e}") from None

    def alive(self) -> bool:
        return self.pid == os.getpid() and self.proc.poll() is None

    def greet(self) -> None:
        if self.greeted:
            return
        assert self.proc.stdout is not None
        frame = _worker.read_frame(self.proc.stdout)
        if frame is not None and frame[0] == b"E":
            raise MissingExtraError("statequery.sql", "duckdb", "sql")
        if frame is None or frame[0] != b"H":
            raise StatequeryError("the SQL query process did not start "
                                  f"(exit status {self.proc.poll()})")
        self.greeted = True

    def rss(self) -> int | None:
        try:
            with open(f"/proc/{self.proc.pid}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


_IDLE: list[_Worker] = []
_IDLE_LOCK = threading.Lock()


def _take_worker() -> _Worker:
    with _IDLE_LOCK:
        while _IDLE:
            worker = _IDLE.pop()
            if worker.alive():
                return worker
            if worker.pid == os.getpid():
                worker.kill()
    return _Worker()


def _give_back(worker: _Worker) -> None:
    if not worker.alive():
        if worker.pid == os.getpid():
            worker.kill()
        return
    rss = worker.rss()
    with _IDLE_LOCK:
        if len(_IDLE) < IDLE_WORKERS and (rss is None or rss <= IDLE_RSS):
            _IDLE.append(worker)
            return
    worker.close()


@atexit.register
def _close_idle() -> None:
    with _IDLE_LOCK:
        idle = [w for w in _IDLE if w.pid == os.getpid()]
        _IDLE.clear()
    for worker in idle:
        worker.close()


def _send_tables(worker: _Worker, sources: list[_Source]) -> None:
    import pyarrow as pa

    out = worker.proc.stdin
    assert out is not None
    for src in sources:
        table = src.data if src.data is not None else pa.table({})
        batches = table.to_batches(max_chunksize=65536) or [None]
        for batch in batches:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                if batch is not None:
                    writer.write_batch(batch)
            _worker.write_frame(out, b"B", sink.getvalue().to_pybytes())
        _worker.write_frame(out, b"T", b"")
    out.flush()


def _run(worker: _Worker, text: str, sources: list[_Source], limits: QueryLimits) -> pa.Table:
    """Run ``text`` in the query process ``worker`` over the tables of ``sources``: DuckDB is
    interrupted after ``limits.timeout`` seconds, the process is ended a grace period later or
    as soon as it grows past DuckDB's memory cap plus :data:`PROCESS_MARGIN`, and the result is
    streamed in batches, stopped as soon as it passes ``max_rows`` or ``max_bytes``."""
    import pyarrow as pa

    done = False
    why: list[str] = []
    stop = threading.Event()
    watcher: threading.Thread | None = None
    batches: list[pa.RecordBatch] = []
    try:
        worker.greet()
        assert worker.proc.stdin is not None and worker.proc.stdout is not None
        select = text[len("EXPLAIN "):] if text.startswith("EXPLAIN ") else text
        request = {
            "text": text, "select": select, "tables": [s.name for s in sources],
            "memory_limit": limits.memory_limit, "threads": limits.threads,
            "timeout": limits.timeout, "grace": _grace(limits.timeout),
            "max_rows": limits.max_rows, "max_bytes": limits.max_bytes,
            "budget": limits.memory_limit + PROCESS_MARGIN,
        }
        try:
            _worker.write_frame(worker.proc.stdin, b"J", json.dumps(request).encode())
            _send_tables(worker, sources)
        except (BrokenPipeError, OSError):
            pass  # the process ended: said below
        frame = _worker.read_frame(worker.proc.stdout)
        if frame is not None and frame[0] == b"R":
            start = time.monotonic()
            rss = int(json.loads(frame[1]).get("rss") or 0)
            ceiling = (rss + limits.memory_limit + PROCESS_MARGIN) if rss else None
            deadline = start + limits.timeout + _grace(limits.timeout)

            def watch() -> None:
                while not stop.wait(WATCH_INTERVAL):
                    now = worker.rss() if ceiling is not None else None
                    if now is not None and ceiling is not None and now > ceiling:
                        why.append("memory")
                    elif time.monotonic() > deadline:
                        why.append("timeout")
                    else:
                        continue
                    worker.proc.kill()
                    return

            watcher = threading.Thread(target=watch, name="statequery-sql-watch", daemon=True)
            watcher.start()
            frame = _worker.read_frame(worker.proc.stdout)
        schema = None
        while frame is not None and frame[0] == b"B":
            batches.extend(pa.ipc.open_stream(pa.py_buffer(frame[1])))
            frame = _worker.read_frame(worker.proc.stdout)
        if frame is not None and frame[0] == b"S":
            schema = pa.ipc.open_stream(pa.py_buffer(frame[1])).schema
            done = True
        elif frame is not None and frame[0] == b"E":
            error = json.loads(frame[1])
            # past its time or memory, a process is not kept (what it grew to stays mapped)
            done = error.get("error") not in ("timeout", "memory")
            raise _query_error(str(error.get("error")), str(error.get("message", "")), limits)
        else:
            stop.set()
            status = worker.proc.wait()
            reason = why[0] if why else (
                "timeout" if status == _worker.EXIT_DEADLINE else "died")
            raise _query_error(reason, f"exit status {status}", limits)
        table = pa.Table.from_batches(batches, schema=schema)
    except BaseException:
        if not done:
            worker.kill()
        raise
    finally:
        stop.set()
        if watcher is not None:
            watcher.join()
        batches.clear()
        if done:
            _give_back(worker)
    return _restore_types(table, sources)


def _query_error(kind: str, message: str, limits: QueryLimits) -> StatequeryError:
    """The typed error for what the query process said (or what ended it)."""
    if kind == "timeout":
        return QueryTimeoutError(
            f"the query ran longer than its timeout of {limits.timeout:g} s and was "
            "interrupted (STATEQUERY_SQL_TIMEOUT, --timeout)")
    if kind == "memory":
        return QueryLimitError(
            f"the query needs more memory than its cap of {_size(limits.memory_limit)} "
            "(STATEQUERY_SQL_MEMORY_LIMIT, --memory-limit)")
    if kind == "rows":
        return QueryLimitError(
            f"the result has more than {limits.max_rows} rows (max rows: "
            "STATEQUERY_SQL_MAX_ROWS, --max-rows; or add a LIMIT)")
    if kind == "bytes":
        return QueryLimitError(
            f"the result is larger than {_size(limits.max_bytes or 0)} (max bytes: "
            "STATEQUERY_SQL_MAX_BYTES, --max-bytes; or add a LIMIT)")
    if kind == "missing":
        return MissingExtraError("statequery.sql", "duckdb", "sql")
    if kind == "invalid":
        return InvalidOptionError(message)
    return QueryLimitError(
        f"the query's process ended ({message}) before it answered: it ran out of the memory "
        f"it may use (cap {_size(limits.memory_limit)}: STATEQUERY_SQL_MEMORY_LIMIT, "
        "--memory-limit) or failed")
