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
replacement scans off. No part of a query is ever turned into Python code. See ``docs/sql.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from statequery.exceptions import (
    InvalidOptionError,
    MissingExtraError,
    NoSuchTableError,
    SavepointNotFoundError,
    require_extra,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from sqlglot import exp

    from statequery.catalog import Catalog

__all__ = ["sql"]

#: the SQL dialect queries are written in (what Spark users type); DuckDB runs the transpiled tree
DIALECT = "spark"

#: DuckDB settings of the query connection, fixed before any query text reaches it and then locked
DUCKDB_CONFIG: dict[str, Any] = {
    "enable_external_access": False,  # no file, network, ATTACH, COPY, INSTALL or LOAD
    "autoload_known_extensions": False,
    "autoinstall_known_extensions": False,
    "allow_community_extensions": False,
    "allow_unsigned_extensions": False,
    "python_enable_replacements": False,  # a table name never resolves to a Python variable
    "temp_directory": "",  # never spill to disk
}


@dataclass
class _Source:
    """One table reference of the query, registered in DuckDB as ``name``."""

    name: str
    alias: str
    database: str
    table: str
    node: exp.Table
    keys: list[Any] | None = None  # pushed-down keys (parsed), None: the whole table
    types: dict[str, pa.DataType] = field(default_factory=dict)  # top-level columns, lower-cased


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
    except SqlglotError as e:
        raise InvalidOptionError(f"cannot parse SQL: {e}") from None
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
    return tree, explain


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
    if src.table.lower() == "state_meta":
        return sp.state_meta()
    if src.table.lower() == "state_stats":
        return sp.stats().table
    op_tables = {k.lower(): v for k, v in sp.operator_tables().items()}
    if src.table.lower() in op_tables:  # every keyed state of an operator, in one pass
        table = sp.operator_table(src.table)
        operator = op_tables[src.table.lower()]
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
        return sp.read(info)
    parts = [sp.read(info, key=k) for k in src.keys]
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def _connect() -> Any:
    """A fresh in-memory DuckDB connection that can reach nothing but what is registered."""
    try:
        import duckdb
    except ImportError:
        raise MissingExtraError("statequery.sql", "duckdb", "sql") from None
    con = duckdb.connect(":memory:", config=DUCKDB_CONFIG)
    con.execute("SET TimeZone = 'UTC'")
    return con


def _lock(con: Any) -> None:
    con.execute("SET disabled_filesystems = 'LocalFileSystem'")
    con.execute("SET lock_configuration = true")


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


def sql(query: str, catalog: Catalog | str | None = None) -> pa.Table:
    """Run a ``SELECT`` over the tables ``<database>.<table>`` of ``catalog`` (a
    :class:`~statequery.catalog.Catalog`, a folder, or the shipped default) as a pyarrow Table.

    Raises :class:`InvalidOptionError` for SQL that does not parse, is not one query, reads
    anything but catalog tables, or that DuckDB rejects; :class:`NoSuchTableError` for unknown
    databases or tables; :class:`MissingExtraError` without DuckDB (``statequery[sql]``).
    """
    require_extra("sqlglot", "sql", "statequery.sql (SQL without Spark)")
    from sqlglot import exp

    from statequery.catalog import Catalog

    tree, explain = _parse(query)
    con = _connect()  # before reading: a missing extra is reported first
    try:
        cat = catalog if isinstance(catalog, Catalog) else (
            Catalog() if catalog is None else Catalog(catalog)
        )
        ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
        sources: list[_Source] = []
        for node in list(tree.find_all(exp.Table)):
            if not node.args.get("db"):
                if node.name.lower() in ctes:
                    continue
                raise NoSuchTableError(
                    f"table {node.name!r}: name tables <database>.<table> "
                    f"(databases: {', '.join(cat.databases()) or 'none'})"
                )
            if node.args.get("catalog"):
                raise NoSuchTableError(f"table {node.sql()!r}: name tables <database>.<table>")
            sources.append(_Source(f"__sq_t{len(sources)}", node.alias_or_name, node.db,
                                   node.name, node))
        if not sources:
            raise InvalidOptionError("the query reads no <database>.<table>")
        for src in sources:
            try:
                table = _read(cat, src)
            except SavepointNotFoundError as e:  # an unknown database
                raise NoSuchTableError(str(e)) from None
            src.types = {f.name.lower(): f.type for f in table.schema}
            con.register(src.name, table)
        for src in sources:
            src.node.replace(
                exp.Table(this=exp.to_identifier(src.name, quoted=True),
                          alias=exp.TableAlias(this=exp.to_identifier(src.alias, quoted=True)))
            )
        _lock(con)
        text = tree.sql(dialect="duckdb", comments=False)
        return _run(con, ("EXPLAIN " if explain else "") + text, sources)
    finally:
        con.close()


def _run(con: Any, text: str, sources: list[_Source]) -> pa.Table:
    import duckdb

    try:
        statements = duckdb.extract_statements(text)
        allowed = (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN)
        if len(statements) != 1 or statements[0].type not in allowed:  # defence in depth
            raise InvalidOptionError("only one SELECT query is accepted")
        table = con.sql(text).to_arrow_table()
    except duckdb.Error as e:
        raise InvalidOptionError(f"cannot run the query: {e}") from None
    return _restore_types(table, sources)
