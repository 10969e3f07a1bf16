"""A Spark-free SQL front end: ``SELECT`` over the tables of a catalog, run by sqlglot.

>>> import statequery
>>> statequery.sql("SELECT key, value FROM user_activity.user_state__count WHERE key = 'user-3'")

Tables are named ``<database>.<table>`` (a database of :class:`statequery.catalog.Catalog`, one of
its ``tables()``, ``state_meta`` included). The query is parsed with ``sqlglot.parse_one``; for
every table reference, an equality (``key = 'k'``) or ``key IN (...)`` among the top-level ``AND``
conjuncts of its ``SELECT``'s ``WHERE`` is pushed down: the literal is parsed against the state's
key type (:func:`statequery.keys.parse_key_text`) and only the key group(s) that can hold it are
read. Everything else runs in sqlglot's Python executor over the rows read.

Struct columns are also offered flattened, one column per field and nested field, named with dots
(``value.address.city``), so ``SELECT value.address.city`` and ``WHERE value.tier = 'GOLD'`` work;
column names match case-insensitively. See ``docs/sql.md`` for what the executor does not do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from statequery.exceptions import (
    InvalidOptionError,
    NoSuchTableError,
    SavepointNotFoundError,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from sqlglot import exp

    from statequery.catalog import Catalog

__all__ = ["sql"]


@dataclass
class _Source:
    """One table reference of the query, renamed ``name`` for the executor."""

    name: str
    alias: str
    database: str
    table: str
    node: exp.Table
    keys: list[Any] | None = None  # pushed-down keys (parsed), None: the whole table
    columns: list[str] = field(default_factory=list)  # flattened: struct fields as ``a.b``
    top_columns: list[str] = field(default_factory=list)  # the table's own columns
    types: dict[str, pa.DataType] = field(default_factory=dict)


def _sqlglot_type(t: pa.DataType) -> str:
    import pyarrow as pa

    if pa.types.is_boolean(t):
        return "BOOLEAN"
    if pa.types.is_integer(t):
        return "BIGINT"
    if pa.types.is_floating(t):
        return "DOUBLE"
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision}, {t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "VARCHAR"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "VARBINARY"
    if pa.types.is_timestamp(t):
        return "TIMESTAMP"
    if pa.types.is_date(t):
        return "DATE"
    return "UNKNOWN"


def _flat_fields(name: str, t: pa.DataType) -> list[tuple[str, pa.DataType, tuple[str, ...]]]:
    """``(column name, type, path)`` for a column and, for structs, every (nested) field."""
    import pyarrow as pa

    out: list[tuple[str, pa.DataType, tuple[str, ...]]] = [(name, t, ())]
    if pa.types.is_struct(t):
        for i in range(t.num_fields):
            f = t.field(i)
            for sub, st, path in _flat_fields(f"{name}.{f.name}", f.type):
                out.append((sub, st, (f.name, *path)))
    return out


def _flatten(table: pa.Table) -> tuple[list[str], list[str], list[tuple[Any, ...]]]:
    """Column names, sqlglot types and row tuples, struct fields as extra dotted columns."""
    specs: list[tuple[int, str, pa.DataType, tuple[str, ...]]] = []
    for i, f in enumerate(table.schema):
        for name, t, path in _flat_fields(f.name, f.type):
            specs.append((i, name, t, path))
    rows = []
    for record in zip(*(c.to_pylist() for c in table.columns), strict=True):
        row = []
        for i, _, _, path in specs:
            v = record[i]
            for step in path:
                v = None if v is None else v.get(step)
            row.append(v)
        rows.append(tuple(row))
    return [s[1] for s in specs], [_sqlglot_type(s[2]) for s in specs], rows


def _parse(query: str) -> exp.Expr:
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import ParseError

    try:
        tree = sqlglot.parse_one(query)
    except ParseError as e:
        raise InvalidOptionError(f"cannot parse SQL: {e}") from None
    if not isinstance(tree, exp.Query):
        raise InvalidOptionError(
            f"only SELECT queries are supported, not {type(tree).__name__.upper()}"
        )
    return tree


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
    row = cat.resolve(src.database, src.table)
    info = sp.state(row["table_name"])
    if info.key_spec is not None:
        _push_down(src, info.key_spec)
    if src.keys is None:
        return sp.read(info)
    parts = [sp.read(info, key=k) for k in src.keys]
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def _rewrite_columns(tree: exp.Expr, sources: list[_Source]) -> exp.Expr:
    """Qualifier-aware rewrite of ``a.b.c`` references to the flattened, quoted column names."""
    from sqlglot import exp

    aliases = {s.alias.lower(): s for s in sources}
    by_lower: dict[str, str] = {}
    for s in sources:
        for c in s.columns:
            by_lower.setdefault(c.lower(), c)

    def parts_of(node: exp.Expr) -> list[str] | None:
        if isinstance(node, exp.Column):
            if isinstance(node.this, exp.Star):
                return None
            return [p.name for p in node.parts]
        if isinstance(node, exp.Dot):
            left = parts_of(node.this)
            if left is None or not isinstance(node.expression, exp.Identifier):
                return None
            return [*left, node.expression.name]
        return None

    def fix(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, (exp.Column, exp.Dot)) or isinstance(node.parent, exp.Dot):
            return node
        parts = parts_of(node)
        if not parts:
            return node
        if len(parts) > 1 and parts[0].lower() in aliases:
            src = aliases[parts[0].lower()]
            wanted = ".".join(parts[1:]).lower()
            for c in src.columns:
                if c.lower() == wanted:
                    return exp.column(exp.to_identifier(c, quoted=True),
                                      table=exp.to_identifier(src.alias, quoted=True))
        name = by_lower.get(".".join(parts).lower())
        if name is not None:
            return exp.column(exp.to_identifier(name, quoted=True))
        return node

    return tree.transform(fix, copy=False)


def _expand_stars(tree: exp.Expr, sources: list[_Source]) -> None:
    """``*`` and ``t.*`` over statequery tables: their own columns, not the flattened fields."""
    from sqlglot import exp

    by_name = {s.name: s for s in sources}
    for select in list(tree.find_all(exp.Select)):
        from_ = select.args.get("from_")
        items = [from_.this] if isinstance(from_, exp.From) else []
        items += [j.this for j in select.args.get("joins") or []]
        mine = [by_name.get(t.name) if isinstance(t, exp.Table) else None for t in items]
        if not mine or any(m is None for m in mine):
            continue
        srcs = [m for m in mine if m is not None]
        out: list[exp.Expr] = []
        for e in select.expressions:
            if isinstance(e, exp.Star):
                picked = srcs
            elif isinstance(e, exp.Column) and isinstance(e.this, exp.Star):
                picked = [s for s in srcs if s.alias.lower() == e.table.lower()]
            else:
                out.append(e)
                continue
            if not picked:
                out.append(e)
                continue
            for s in picked:
                out.extend(
                    exp.column(exp.to_identifier(c, quoted=True),
                               table=exp.to_identifier(s.alias, quoted=True))
                    for c in s.top_columns
                )
        select.set("expressions", out)


def _to_arrow(
    columns: tuple[str, ...], rows: list[tuple[Any, ...]], sources: list[_Source]
) -> pa.Table:
    import pyarrow as pa

    arrays = []
    for i, _ in enumerate(columns):
        values = [r[i] for r in rows]
        try:
            array = pa.array(values)
            if pa.types.is_null(array.type):  # no rows or all null: the column's type if known
                known = {s.types[columns[i]] for s in sources if columns[i] in s.types}
                if len(known) == 1:
                    array = pa.array(values, type=known.pop())
            arrays.append(array)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            raise InvalidOptionError(
                f"result column {columns[i]!r} mixes types Arrow cannot hold in one column: {e}"
            ) from None
    return pa.Table.from_arrays(arrays, names=list(columns))


def sql(query: str, catalog: Catalog | str | None = None) -> pa.Table:
    """Run a ``SELECT`` over the tables ``<database>.<table>`` of ``catalog`` (a
    :class:`~statequery.catalog.Catalog`, a folder, or the shipped default) as a pyarrow Table.

    Raises :class:`InvalidOptionError` for SQL that does not parse, is not a query, or that the
    executor rejects, and :class:`NoSuchTableError` for unknown databases or tables.
    """
    from sqlglot import exp
    from sqlglot.errors import SqlglotError
    from sqlglot.executor import execute
    from sqlglot.executor.table import Table
    from sqlglot.schema import MappingSchema

    from statequery.catalog import Catalog

    cat = catalog if isinstance(catalog, Catalog) else Catalog() if catalog is None else Catalog(
        catalog
    )
    tree = _parse(query)
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
        sources.append(_Source(f"__sq_t{len(sources)}", node.alias_or_name, node.db, node.name,
                               node))
    if not sources:
        raise InvalidOptionError("the query reads no <database>.<table>")

    data: dict[str, Any] = {}
    schema: dict[str, object] = {}
    try:
        for src in sources:
            try:
                table = _read(cat, src)
            except SavepointNotFoundError as e:  # an unknown database
                raise NoSuchTableError(str(e)) from None
            columns, types, rows = _flatten(table)
            src.columns = columns
            src.top_columns = list(table.column_names)
            src.types = {n: t for n, t, _ in (f for c in table.schema
                                              for f in _flat_fields(c.name, c.type))}
            data[src.name] = Table(columns=columns, rows=rows)
            schema[src.name] = dict(zip(columns, types, strict=True))
        for src in sources:
            src.node.replace(
                exp.Table(this=exp.to_identifier(src.name, quoted=True),
                          alias=exp.TableAlias(this=exp.to_identifier(src.alias, quoted=True)))
            )
        _expand_stars(tree, sources)
        tree = _rewrite_columns(tree, sources)
        result = execute(tree, schema=MappingSchema(schema, normalize=False), tables=data)
    except SqlglotError as e:
        raise InvalidOptionError(f"cannot run the query: {e}") from None
    return _to_arrow(tuple(result.columns), list(result.rows), sources)
