"""One factory for the decode path: the compiled one (``statequery/backends/_read.pyx``, built
by ``pip install`` when a C compiler is present) or the pure-Python reference
(:func:`statequery.backends.keygroups.scan_key_group` and the entry handlers of
:class:`~statequery.backends.keygroups.CompositeEntryDecoder`).

Both produce identical tables (``tests/backends/test_fastpath.py`` checks every fixture).
``STATEQUERY_PURE_PYTHON=1`` in the environment forces the pure-Python path; it is read at
every scan, so tests can switch per test.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pyarrow as pa

from statequery.arrow.schemas import state_schema
from statequery.arrow.types import arrow_type, sql_arrow_type
from statequery.metadata.state import StateInfo
from statequery.serializers.readers import primitive_name, reader_for, sql_fixed_size
from statequery.serializers.spec import (
    ArrayDataSpec,
    EnumSpec,
    ListSpec,
    MapSpec,
    NamespaceSpec,
    NullableSpec,
    PojoSpec,
    PrimitiveArraySpec,
    PrimitiveSpec,
    RawValueSpec,
    RowDataSpec,
    RowSpec,
    SerializerSpec,
    SqlType,
    TimerSpec,
    TtlSpec,
    TupleSpec,
)

__all__ = [
    "PURE_ENV",
    "bulk_feeder",
    "compiled",
    "pure_forced",
    "entry_sink",
    "flink_length",
    "heap_sink",
    "length_suffixed",
]

PURE_ENV = "STATEQUERY_PURE_PYTHON"

_compiled: ModuleType | None
try:
    from statequery.backends import _read as _compiled
except ImportError:  # not built (no compiler at install time): the pure-Python path
    _compiled = None


def pure_forced() -> bool:
    """``STATEQUERY_PURE_PYTHON`` is set: every compiled twin (``_read``, ``_sst``) is off. The
    one compiled-or-pure switch, read at every scan so tests can switch per test."""
    return os.environ.get(PURE_ENV, "") not in ("", "0")


def compiled() -> ModuleType | None:
    """The compiled decode module, or None (not built, or ``STATEQUERY_PURE_PYTHON`` set)."""
    if _compiled is None or pure_forced():
        return None
    return _compiled


def flink_length(spec: SerializerSpec | None) -> int:
    """``TypeSerializer.getLength()`` (-1 when variable), as the ambiguity rule needs it."""
    if spec is None:
        return -1
    if isinstance(spec, NamespaceSpec):
        n = spec.fixed_length
        return -1 if n is None else n
    if isinstance(spec, TupleSpec):
        total = 0
        for f in spec.fields:
            n = flink_length(f)
            if n < 0:
                return -1
            total += n
        return total
    if isinstance(spec, NullableSpec):
        n = flink_length(spec.inner)
        return -1 if n < 0 or spec.padding != n else n + 1
    n = spec.fixed_length
    return -1 if n is None else n


def length_suffixed(key: SerializerSpec | None, namespace: SerializerSpec | None) -> bool:
    """Whether RocksDB writes a length after the key and after the namespace of a composite
    key: both of variable length (``SerializedCompositeKeyBuilder``'s ambiguous keys; timers'
    keys never carry them)."""
    return flink_length(key) < 0 and flink_length(namespace) < 0


# primitive name -> (compiled type code name, Arrow type of its column)
_TYPES: dict[str, tuple[str, pa.DataType]] = {
    "long": ("T_LONG", pa.int64()),
    "int": ("T_INT", pa.int32()),
    "short": ("T_SHORT", pa.int16()),
    "byte": ("T_BYTE", pa.int8()),
    "double": ("T_DOUBLE", pa.float64()),
    "float": ("T_FLOAT", pa.float32()),
    "boolean": ("T_BOOL", pa.bool_()),
    "string": ("T_STRING", pa.string()),
    "string_data": ("T_STRING_DATA", pa.string()),
}

# SQL type root -> compiled type code name of a BinaryRowData field (8-byte little-endian slot,
# or inline/offset bytes); the field's Arrow type must equal sql_arrow_type's
_SQL_CODES: dict[str, str] = {
    "BOOLEAN": "T_BOOL",
    "TINYINT": "T_BYTE",
    "SMALLINT": "T_SHORT",
    "INTEGER": "T_INT",
    "DATE": "T_INT",
    "TIME_WITHOUT_TIME_ZONE": "T_INT",
    "INTERVAL_YEAR_MONTH": "T_INT",
    "BIGINT": "T_LONG",
    "INTERVAL_DAY_TIME": "T_LONG",
    "FLOAT": "T_FLOAT",
    "DOUBLE": "T_DOUBLE",
    "CHAR": "T_STRING",
    "VARCHAR": "T_STRING",
    "BINARY": "T_BYTES",
    "VARBINARY": "T_BYTES",
}

_TIMESTAMP_ROOTS = ("TIMESTAMP_WITHOUT_TIME_ZONE", "TIMESTAMP_WITH_LOCAL_TIME_ZONE")


def _code(mod: ModuleType, spec: SerializerSpec | None, arrow: pa.DataType | None) -> int:
    """The compiled type code for scalar values of ``spec`` in a column of type ``arrow``; 0
    when the compiled path has no scalar column for that shape."""
    if spec is None or not spec.decodable or arrow is None:
        return 0
    entry: tuple[str, pa.DataType] | None = None
    if isinstance(spec, PrimitiveSpec):
        entry = _TYPES.get(primitive_name(spec.name))
    elif isinstance(spec, PrimitiveArraySpec) and primitive_name(spec.element) == "byte":
        entry = ("T_BYTES", pa.binary())
    if entry is None or not arrow.equals(entry[1]):
        return 0
    return int(getattr(mod, entry[0]))


def _column(
    mod: ModuleType, spec: SerializerSpec | None, arrow: pa.DataType | None, lists: bool = True
) -> Any:
    """A compiled column decoding values of ``spec`` into Arrow type ``arrow`` (a struct for
    tuples, POJOs, rows, RowData and TimeWindow; a list for ``ListSerializer`` values when
    ``lists``), or None when some part of the shape is not compiled (the state then takes the
    pure-Python handlers, as a whole). Keys and namespaces take no lists (flat lists repeat
    them row by row, which list columns do not do)."""
    if spec is None or arrow is None or not spec.decodable:
        return None
    code = _code(mod, spec, arrow)
    if code:
        return mod.Column(code)
    if isinstance(spec, PrimitiveSpec) and spec.name in ("void", "null_value"):
        # always null: VoidSerializer / NullSerializer write one byte, NullValue none
        return mod.NullCol(1 if spec.name == "void" else 0) if pa.types.is_null(arrow) else None
    if isinstance(spec, EnumSpec):
        if not arrow.equals(pa.string()):
            return None
        return mod.Column(mod.T_ENUM, spec.constants, spec.class_name)
    if isinstance(spec, NamespaceSpec):
        if spec.name == "count_window" and arrow.equals(pa.int64()):
            return mod.Column(mod.T_LONG)
        if spec.name == "time_window" and arrow.equals(arrow_type(spec)):
            return mod.StructCol(mod.S_TUPLE, [mod.Column(mod.T_LONG), mod.Column(mod.T_LONG)],
                                 "TimeWindow")
        return None
    if isinstance(spec, ListSpec) and lists and pa.types.is_list(arrow):
        inner = _column(mod, spec.element, arrow.value_type, lists)
        if inner is None:
            return None
        return mod.ListCol(inner, reader_for(spec.element).min_size, spec.display)
    if isinstance(spec, ArrayDataSpec) and lists and pa.types.is_list(arrow):
        return _sql_array(mod, spec.element, arrow, lists)
    if not pa.types.is_struct(arrow):
        return None
    if isinstance(spec, RowDataSpec):
        # a leading string field: the RowKind (RowDataSpec.row_kind); trailing fields: values
        # computed from the others (RowDataSpec.derived)
        first = 1 if spec.row_kind else 0
        last = arrow.num_fields - len(spec.derived)
        if last < first or (spec.row_kind and not pa.types.is_string(arrow.field(0).type)):
            return None
        fields = pa.struct([arrow.field(i) for i in range(first, last)])
        derive = _deriver(spec.derived, first) if spec.derived else None
        return _sql_row(mod, spec.type, spec.field_specs, fields, lists,
                        kind=mod.Column(mod.T_STRING) if spec.row_kind else None, derive=derive)
    if isinstance(spec, TupleSpec):
        specs: list[SerializerSpec | None] = list(spec.fields)
        kind, mask = mod.S_TUPLE, 0
    elif isinstance(spec, RowSpec):
        specs = list(spec.fields)
        kind, mask = mod.S_ROW, 2 if spec.supports_row_kind else 0
    elif isinstance(spec, PojoSpec):
        specs = [f.spec for f in spec.fields]
        kind, mask = mod.S_POJO, 0
    else:
        return None
    if len(specs) != arrow.num_fields:
        return None
    children = [_column(mod, s, arrow.field(i).type, lists) for i, s in enumerate(specs)]
    if any(c is None for c in children):
        return None
    what = spec.class_name if isinstance(spec, PojoSpec) else spec.display
    return mod.StructCol(kind, children, what, mask)


def _sql_row(
    mod: ModuleType,
    t: SqlType,
    field_specs: tuple[SerializerSpec, ...],
    arrow: pa.DataType,
    lists: bool,
    kind: Any = None,
    derive: Any = None,
) -> Any:
    """A ``BinaryRowData`` of fields that are numbers, booleans, strings, bytes, dates, times,
    timestamps, DECIMAL(p <= 38), nested ROWs, or RAW fields whose serializer is compiled (the
    ``NullSerializer`` placeholders of SQL data views); None for anything else (ARRAY, MAP,
    MULTISET, RAW bytes, ...)."""
    fields = t.fields
    if t.root not in ("ROW", "STRUCTURED_TYPE") or not pa.types.is_struct(arrow):
        return None
    if len(fields) != arrow.num_fields or not fields:
        return None
    specs = field_specs if len(field_specs) == len(fields) else (None,) * len(fields)
    children = []
    for i, f in enumerate(fields):
        child = _sql_field(mod, f.type, specs[i], arrow.field(i).type, lists)
        if child is None:
            return None
        children.append(child)
    if kind is not None:  # the RowKind column before the fields
        return mod.StructCol(mod.S_ROWDATA, [kind, *children], str(t), 0, True, derive)
    return mod.StructCol(mod.S_ROWDATA, children, str(t), 0, False, derive)


def _deriver(derived: tuple[tuple[str, str, int, int, str], ...], offset: int
             ) -> Callable[[list[pa.Array]], list[pa.Array]]:
    """The arrays of :attr:`RowDataSpec.derived` values from a row's field arrays (``offset``:
    the row kind column before them), as :func:`statequery.serializers.readers.derived_value`
    computes one value."""
    import pyarrow.compute as pc

    from statequery.arrow.types import DERIVED_TYPES
    from statequery.serializers.readers import DERIVED_RANGES

    def derive(children: list[pa.Array]) -> list[pa.Array]:
        out = []
        for _, function, total_i, count_i, root in derived:
            total, count = children[offset + total_i], children[offset + count_i]
            typ = DERIVED_TYPES[root]
            valid = pc.fill_null(pc.greater(count, 0), False)
            safe = pc.if_else(valid, count, pa.scalar(1, count.type))
            if function == "sum":
                value = total
            elif root in ("FLOAT", "DOUBLE"):
                # as Python divides a float by an int: the int rounded to the nearest double
                value = pc.divide(pc.cast(total, pa.float64(), safe=False),
                                  pc.cast(safe, pa.float64(), safe=False))
            else:
                value = pc.divide(pc.cast(total, pa.int64()), pc.cast(safe, pa.int64()))
            if pa.types.is_integer(typ) and DERIVED_RANGES[root] < 63:
                bits = DERIVED_RANGES[root]
                value = pc.cast(value, pa.int64())
                valid = pc.and_(valid, pc.fill_null(pc.and_(
                    pc.greater_equal(value, -(1 << bits)), pc.less(value, 1 << bits)), False))
            value = pc.if_else(valid, value, pa.nulls(len(value), value.type))
            out.append(pc.cast(value, typ, safe=False))
        return out

    return derive


def _sql_field(
    mod: ModuleType, t: SqlType, spec: SerializerSpec | None, arrow: pa.DataType, lists: bool
) -> Any:
    """The compiled column of one BinaryRowData field of SQL type ``t`` (Arrow type ``arrow``,
    which must be what :func:`sql_arrow_type` gives), or None."""
    while t.root == "DISTINCT_TYPE" and t.element is not None:
        t = t.element
    if not arrow.equals(sql_arrow_type(t, spec)):
        return None
    root = t.root
    if root in ("ROW", "STRUCTURED_TYPE"):
        specs = spec.field_specs if isinstance(spec, RowDataSpec) else ()
        return _sql_row(mod, t, specs, arrow, lists)
    if root == "RAW":
        if not isinstance(spec, RawValueSpec) or not spec.inner.decodable:
            return None  # raw bytes with a reason: the pure path
        inner = _column(mod, spec.inner, arrow, lists)
        return None if inner is None else mod.VarCol(inner)
    if root == "ARRAY":
        return _sql_array(mod, t.element, arrow, lists) if lists else None
    if root == "DECIMAL":
        p = 10 if t.precision is None else t.precision
        if not 1 <= p <= 38:
            return None
        return mod.Column(mod.T_DECIMAL, (), None, p)
    if root in _TIMESTAMP_ROOTS:
        p = 6 if t.precision is None else t.precision
        if p <= 3:
            return mod.Column(mod.T_LONG)
        if p > 6:
            return None  # exact text (readers.sql_timestamp_text): the pure path
        return mod.Column(mod.T_TIMESTAMP, (), None, p)
    name = _SQL_CODES.get(root)
    return None if name is None else mod.Column(getattr(mod, name))


def _sql_array(mod: ModuleType, element: SqlType | None, arrow: pa.DataType, lists: bool) -> Any:
    """A SQL ARRAY (``BinaryArrayData``) of compiled elements, or None."""
    if element is None or not pa.types.is_list(arrow):
        return None
    inner = _sql_field(mod, element, None, arrow.value_type, lists)
    if inner is None:
        return None
    t = element
    while t.root == "DISTINCT_TYPE" and t.element is not None:
        t = t.element
    return mod.SqlArrayCol(inner, sql_fixed_size(t), str(element))


def _is_void(spec: SerializerSpec | None) -> bool:
    return isinstance(spec, NamespaceSpec) and spec.name == "void"


def _field(schema: pa.Schema, name: str) -> pa.DataType | None:
    i = schema.get_field_index(name)
    return None if i < 0 else schema.field(i).type


_NO_COLUMN = object()


def _namespace(mod: ModuleType, spec: SerializerSpec | None, schema: pa.Schema) -> Any:
    """None for the VoidNamespace, a compiled column for other namespaces, or ``_NO_COLUMN``."""
    if _is_void(spec):
        return None
    col = _column(mod, spec, _field(schema, "namespace"), False)
    return _NO_COLUMN if col is None else col


def entry_sink(layout: StateInfo, mode: str, schema: pa.Schema) -> Any | None:
    """A compiled entry handler decoding ``layout``'s entries straight into Arrow buffers, or
    None when the compiled path is off or does not cover this shape (the caller then uses the
    pure-Python handlers).

    Shapes: value/reducing/aggregating, timers, map entries (``rows``) and lists (``rows``,
    ``flat``), with TTL or not; keys, namespaces, user keys, values and elements that are
    primitives, strings, byte arrays, enums, TimeWindows, or structs of those (Tuple, POJO,
    including nested POJOs, Row, and RowData; see :func:`_sql_field` for its fields).
    """
    mod = compiled()
    if mod is None:
        return None
    suffixed = not layout.is_timer and length_suffixed(layout.key, layout.namespace)
    return _sink(mod, layout, mode, schema, False, suffixed)


def heap_sink(layout: StateInfo, mode: str, schema: pa.Schema | None) -> Any | None:
    """A compiled walker of ``layout``'s blocks in the hashmap checkpoint format
    (:mod:`statequery.backends.heap`): ``sink.walk(buf, pos, end, n, kg) -> pos`` decodes a
    block's ``n`` entries into Arrow buffers (the same shapes as :func:`entry_sink`). With
    ``schema`` None it only walks (a state nobody asked for: what it decodes is dropped).
    None when the compiled path is off or does not cover the shape."""
    mod = compiled()
    if mod is None:
        return None
    full = layout.state_value
    if layout.kind == "list":
        if not isinstance(full, ListSpec) or _ttl_inner(full.element, layout.ttl) != layout.value:
            return None
    elif layout.kind == "map":
        if (
            not isinstance(full, MapSpec)
            or full.is_set
            or full.key != layout.user_key
            or _ttl_inner(full.value, layout.ttl) != layout.value
        ):
            return None
    elif layout.kind in ("value", "reducing", "aggregating"):
        if _ttl_inner(full, layout.ttl) != layout.value:
            return None
    elif not layout.is_timer:
        return None
    skip = schema is None
    if skip:
        mode = "rows" if layout.kind == "list" or layout.kind == "map" else mode
        schema = state_schema(layout, mode)
    return _sink(mod, layout, mode, schema, skip)


def _ttl_inner(spec: SerializerSpec | None, ttl: bool) -> SerializerSpec | None:
    if not ttl:
        return spec
    return spec.inner if isinstance(spec, TtlSpec) else None


def _sink(
    mod: ModuleType,
    layout: StateInfo,
    mode: str,
    schema: pa.Schema,
    skip: bool,
    suffixed: bool = False,
) -> Any:
    key_type = _field(schema, "key")
    if layout.is_timer:
        spec = layout.value
        key_spec = spec.key if isinstance(spec, TimerSpec) else layout.key
        ns_spec = spec.namespace if isinstance(spec, TimerSpec) else layout.namespace
        key = _column(mod, key_spec, key_type, False)
        ns = _namespace(mod, ns_spec, schema)
        if key is None or ns is _NO_COLUMN:
            return None
        return mod.EntrySink(mod.K_TIMER, key, None, None, ns, False, skip)
    key = _column(mod, layout.key, key_type, False)
    ns = _namespace(mod, layout.namespace, schema)
    if key is None or ns is _NO_COLUMN:
        return None
    ttl = bool(layout.ttl)
    kind = layout.kind
    if kind in ("value", "reducing", "aggregating"):
        value = _column(mod, layout.value, _field(schema, "value"))
        if value is None:
            return None
        return mod.EntrySink(mod.K_VALUE, key, value, None, ns, ttl, skip, suffixed)
    if kind == "map" and mode == "nested":
        map_type = _field(schema, "map")
        if map_type is None or not pa.types.is_map(map_type):
            return None
        user_key = _column(mod, layout.user_key, map_type.key_type)
        item = map_type.item_type
        if ttl:
            # the map value is the TtlValue itself: struct<last_access, value>
            if not pa.types.is_struct(item) or item.num_fields != 2:
                return None
            inner = _column(mod, layout.value, item.field(1).type)
            value = None if inner is None else mod.StructCol(
                mod.S_TUPLE, [mod.Column(mod.T_LONG), inner], "TtlValue")
        else:
            value = _column(mod, layout.value, item)
        if value is None or user_key is None:
            return None
        return mod.EntrySink(mod.K_MAP_NESTED, key, value, user_key, ns, False, skip, suffixed)
    if kind == "map" and mode == "rows":
        value = _column(mod, layout.value, _field(schema, "value"))
        user_key = _column(mod, layout.user_key, _field(schema, "user_key"))
        if value is None or user_key is None:
            return None
        return mod.EntrySink(mod.K_MAP, key, value, user_key, ns, ttl, skip, suffixed)
    if kind == "list":
        value_type = _field(schema, "value")
        if mode == "flat":
            value = _column(mod, layout.value, value_type)
            if value is None:
                return None
            return mod.EntrySink(mod.K_LIST_FLAT, key, value, None, ns, ttl, skip, suffixed)
        if value_type is not None and pa.types.is_list(value_type):
            value = _column(mod, layout.value, value_type.value_type)
            if value is None:
                return None
            return mod.EntrySink(mod.K_LIST, key, value, None, ns, ttl, skip, suffixed)
    return None


def bulk_feeder(on_entry: object) -> Callable[..., Any] | None:
    """``feed_key_group`` of the compiled module when ``on_entry`` is one of its sinks (RocksDB
    entries then go to the sink in bulk), else None."""
    mod = compiled()
    if mod is None or not isinstance(on_entry, mod.EntrySink):
        return None
    return mod.feed_key_group  # type: ignore[no-any-return]
