"""Differential testing of the two decode paths, for every shape (issue 19, item 2).

Hypothesis generates states of every shape the compiled path (``statequery/backends/_read.pyx``
through ``statequery/backends/fastpath.py``) decodes: keys, namespaces, user keys, values and
list elements that are primitives, strings (``''``, NUL, non-BMP characters, lone surrogates,
strings past 64 KiB), byte arrays (empty too), enums, POJOs with null fields and null values,
Tuples, Rows with null masks and RowKind bits, RowData with every compiled SQL field type
(DECIMAL compact and not, TIMESTAMP(p > 3), nested ROW, ARRAY, RAW), TTL values, value, list
(rows and flat), map (rows and nested) and timer states, in the VoidNamespace, TimeWindows and
CountWindows. :mod:`flinkenc` encodes them as Flink's serializers do (checked against real
fixture bytes below), and every example is read from the three containers the walkers consume:

* a canonical key-group stream (``KeyGroupStream.scan`` -> ``scan_key_group``), with runs of
  another state the walk must skip;
* a hashmap-checkpoint key group (``HeapKeyGroupStream.scan`` -> ``HeapBlockDecoder``), with a
  block of another state walked by a skipping sink;
* RocksDB key/value pairs (``RocksDBKeyedBackend._scan_db`` -> ``feed_key_group``).

Both paths must return identical Arrow tables, or both a :class:`CorruptStateError`, also for
the same bytes truncated or with a byte changed. Anything else (SystemError, a crash, another
exception type) fails the test. CI runs a fixed derivation of examples (``CI=true``, see
conftest.py); ``STATEQUERY_FUZZ_EXAMPLES=2000`` hunts longer.

:func:`test_every_compiled_shape_is_in_the_harness` fails when ``_read`` gains a type code, a
struct kind, a sink kind or a column class that no strategy here generates.
"""

from __future__ import annotations

import decimal
import functools
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pytest
from conftest import fixture_dir
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from support import flinkenc

import statequery
from statequery.arrow.batches import BatchBuilder
from statequery.arrow.schemas import state_schema
from statequery.backends import fastpath
from statequery.exceptions import CorruptStateError
from statequery.metadata.state import StateInfo
from statequery.serializers.spec import (
    ROW_KINDS,
    ArrayDataSpec,
    AvroSpec,
    EnumSpec,
    ListSpec,
    MapSpec,
    NamespaceSpec,
    OpaqueSpec,
    PojoField,
    PojoSpec,
    PrimitiveArraySpec,
    PrimitiveSpec,
    RawValueSpec,
    RowDataSpec,
    RowSpec,
    SerializerSpec,
    SqlField,
    SqlType,
    TimerSpec,
    TtlSpec,
    TupleSpec,
)

EXAMPLES = int(os.environ.get("STATEQUERY_FUZZ_EXAMPLES", "60"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    # a failure prints its example at once (shrinking these nested shapes can take minutes)
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much],
)

# -- what the harness covers of the compiled module -------------------------------------------

#: every name of ``_read``'s type codes, struct kinds, sink kinds and column classes, and the
#: strategy below that generates it (the coverage test checks both directions)
COVERS: dict[str, str] = {}


def covers(*names: str) -> Callable[[Any], Any]:
    def mark(fn: Any) -> Any:
        for n in names:
            COVERS[n] = fn.__name__
        return fn

    return mark


# -- values -----------------------------------------------------------------------------------

_ODD_STRINGS = ["", "东京", "Ω≈ç√", "a\x00b", "\x00", "𝄞", "x𝄞y", "\ud800", "\udc00x",
                "\ud800\ud800\udc00", "é" * 40, "a" * 200]
# past 64 KiB (3-byte length varints, 3-byte UTF-8 characters); built by map so that
# Hypothesis does not print 100 kB strategy reprs
_LONG_STRINGS = st.sampled_from([("a", 70_000), ("€", 30_000), ("𝄞", 20_000)]).map(
    lambda cn: cn[0] * cn[1])


def _text(surrogates: bool = True) -> st.SearchStrategy[str]:
    chars = st.characters() if surrogates else st.characters(blacklist_categories=("Cs",))
    odd = _ODD_STRINGS if surrogates else [s for s in _ODD_STRINGS
                                           if not any("\ud800" <= c <= "\udfff" for c in s)]
    return st.one_of(st.text(chars, max_size=12), st.sampled_from(odd), _LONG_STRINGS)


_I = {8: (-(1 << 7), (1 << 7) - 1), 16: (-(1 << 15), (1 << 15) - 1),
      32: (-(1 << 31), (1 << 31) - 1), 64: (-(1 << 63), (1 << 63) - 1)}


def _ints(bits: int) -> st.SearchStrategy[int]:
    lo, hi = _I[bits]
    return st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, 0, -1, 1]))


def _floats(width: int) -> st.SearchStrategy[float]:
    return st.floats(allow_nan=False, width=width)


_BYTES = st.one_of(st.binary(max_size=16), st.sampled_from([b"", b"\x00"]),
                   st.just(70_000).map(bytes))


@dataclass(frozen=True)
class Shape:
    """A serializer and a strategy of its values (in the pure readers' form)."""

    spec: SerializerSpec
    values: st.SearchStrategy[Any]


@covers("T_LONG", "T_INT", "T_SHORT", "T_BYTE", "T_DOUBLE", "T_FLOAT", "T_BOOL", "T_STRING",
        "T_STRING_DATA", "T_BYTES", "T_ENUM", "Column")
def scalar(draw: Any) -> Shape:
    name = draw(st.sampled_from(
        ["long", "int", "short", "byte", "double", "float", "boolean", "string", "string_data",
         "bytes", "enum", "long_value", "int_value", "string_value", "boolean_value"]))
    if name == "bytes":
        return Shape(PrimitiveArraySpec(element="byte"), _BYTES)
    if name == "enum":
        n = draw(st.integers(1, 4))
        constants = tuple(["GOLD", "SILVER", "", "東"][:n])
        return Shape(EnumSpec(class_name="com.example.Tier", constants=constants),
                     st.sampled_from(constants))
    base = name.removesuffix("_value")
    values = {
        "long": _ints(64), "int": _ints(32), "short": _ints(16), "byte": _ints(8),
        "double": _floats(64), "float": _floats(32), "boolean": st.booleans(),
        "string": st.one_of(st.none(), _text()), "string_data": _text(False),
    }[base]
    return Shape(PrimitiveSpec(name=name), values)


@covers("NullCol")
def always_null(draw: Any) -> Shape:
    """``VoidSerializer`` (one 0 byte) and ``NullValue`` (no bytes): always null."""
    return Shape(PrimitiveSpec(name=draw(st.sampled_from(["void", "null_value"]))),
                 st.just(None))


@covers("S_TUPLE", "StructCol")
def tuple_(draw: Any, depth: int, lists: bool) -> Shape:
    parts = [shape(draw, depth + 1, lists) for _ in range(draw(st.integers(1, 3)))]
    spec = TupleSpec(class_name=f"org.apache.flink.api.java.tuple.Tuple{len(parts)}",
                     fields=tuple(p.spec for p in parts))
    return Shape(spec, st.fixed_dictionaries({f"f{i}": p.values for i, p in enumerate(parts)}))


@covers("S_ROW")
def row(draw: Any, depth: int, lists: bool) -> Shape:
    parts = [shape(draw, depth + 1, lists) for _ in range(draw(st.integers(1, 9)))]
    kind = draw(st.booleans())
    names = tuple(f"c{i}" for i in range(len(parts)))
    spec = RowSpec(fields=tuple(p.spec for p in parts), names=names, supports_row_kind=kind)
    return Shape(spec, st.fixed_dictionaries(
        {n: st.one_of(st.none(), p.values) for n, p in zip(names, parts, strict=True)}))


@covers("S_POJO")
def pojo(draw: Any, depth: int, lists: bool, nullable: bool = True) -> Shape:
    parts = [shape(draw, depth + 1, lists) for _ in range(draw(st.integers(1, 3)))]
    names = tuple(f"p{i}" for i in range(len(parts)))
    spec = PojoSpec(class_name="com.example.Pojo",
                    fields=tuple(PojoField(n, "com.example.Pojo", p.spec)
                                 for n, p in zip(names, parts, strict=True)))
    values = st.fixed_dictionaries(
        {n: st.one_of(st.none(), p.values) for n, p in zip(names, parts, strict=True)})
    return Shape(spec, st.one_of(st.none(), values) if nullable else values)


@covers("ListCol")
def list_(draw: Any, depth: int) -> Shape:
    inner = shape(draw, depth + 1, True)
    return Shape(ListSpec(element=inner.spec), st.lists(inner.values, max_size=4))


# -- Flink SQL ----------------------------------------------------------------------------------

_PLACEHOLDER = OpaqueSpec(reason="harness: the logical type decides")


@dataclass(frozen=True)
class SqlShape:
    type: SqlType
    spec: SerializerSpec  # the stored field serializer (RawValueSpec for RAW, RowDataSpec...)
    values: st.SearchStrategy[Any]


_DEC = decimal.Context(prec=200)


def _decimals(p: int, s: int) -> st.SearchStrategy[Any]:
    top = 10**p - 1
    return st.one_of(st.integers(-top, top), st.sampled_from([top, -top, 0])).map(
        lambda u: decimal.Decimal(u).scaleb(-s, _DEC))


@covers("T_DECIMAL", "T_TIMESTAMP", "VarCol")
def sql_scalar(draw: Any, raw: bool = True) -> SqlShape:
    """A scalar field; ``raw``: RAW too (not inside arrays, which store no element
    serializer)."""
    root = draw(st.sampled_from(
        ["BOOLEAN", "TINYINT", "SMALLINT", "INTEGER", "DATE", "TIME_WITHOUT_TIME_ZONE",
         "INTERVAL_YEAR_MONTH", "BIGINT", "INTERVAL_DAY_TIME", "FLOAT", "DOUBLE", "CHAR",
         "VARCHAR", "BINARY", "VARBINARY", "DECIMAL", "TIMESTAMP_WITHOUT_TIME_ZONE",
         "TIMESTAMP_WITH_LOCAL_TIME_ZONE"] + (["RAW"] if raw else [])))
    if root == "DECIMAL":
        p = draw(st.sampled_from([1, 5, 18, 19, 30, 38]))
        s = draw(st.integers(0, p))
        return SqlShape(SqlType("DECIMAL", precision=p, scale=s), _PLACEHOLDER, _decimals(p, s))
    if root.startswith("TIMESTAMP"):
        # p <= 3: epoch millis in the slot; 4..6: millis + nanos of the milli (T_TIMESTAMP);
        # p > 6 reads as exact text on the pure path only
        p = draw(st.integers(0, 6))
        return SqlShape(SqlType(root, precision=p), _PLACEHOLDER, _ints(64))
    if root == "RAW":
        # RawValueDataSerializer over a compiled serializer (the NullSerializer placeholders of
        # SQL data views are VoidSerializer-like)
        void = draw(st.booleans())
        sh = Shape(PrimitiveSpec(name="void"), st.just(flinkenc.VOID)) if void else scalar(draw)
        return SqlShape(SqlType("RAW", class_name="x"), RawValueSpec(inner=sh.spec), sh.values)
    values = {
        "BOOLEAN": st.booleans(), "TINYINT": _ints(8), "SMALLINT": _ints(16),
        "INTEGER": _ints(32), "DATE": st.integers(-700_000, 2_900_000),
        "TIME_WITHOUT_TIME_ZONE": st.integers(0, 86_399_999),
        "INTERVAL_YEAR_MONTH": _ints(32), "BIGINT": _ints(64), "INTERVAL_DAY_TIME": _ints(64),
        "FLOAT": _floats(32), "DOUBLE": _floats(64), "CHAR": _text(False),
        "VARCHAR": _text(False), "BINARY": _BYTES, "VARBINARY": _BYTES,
    }[root]
    return SqlShape(SqlType(root), _PLACEHOLDER, values)


@covers("SqlArrayCol")
def sql_field(draw: Any, depth: int, lists: bool, raw: bool = True) -> SqlShape:
    kind = draw(st.sampled_from(["scalar"] * 4 + (["row"] if depth < 2 else [])
                                + (["array"] if depth < 2 and lists else [])))
    if kind == "row":
        return sql_row(draw, depth + 1, lists, raw)
    if kind == "array":
        el = sql_field(draw, depth + 1, lists, False)  # arrays store no element serializer
        return SqlShape(SqlType("ARRAY", element=el.type), _PLACEHOLDER,
                        st.lists(st.one_of(st.none(), el.values), max_size=5))
    return sql_scalar(draw, raw)


@covers("S_ROWDATA")
def sql_row(draw: Any, depth: int, lists: bool, raw: bool = True) -> SqlShape:
    """A ROW (``lists``: ARRAY fields too; keys have none, the compiled path repeats keys row
    by row, which list columns do not do)."""
    fields = [sql_field(draw, depth, lists, raw) for _ in range(draw(st.integers(1, 6)))]
    names = [f"r{i}" for i in range(len(fields))]
    t = SqlType("ROW", fields=tuple(SqlField(n, f.type) for n, f in zip(names, fields,
                                                                         strict=True)))
    spec = RowDataSpec(type=t, field_specs=tuple(f.spec for f in fields))
    values = st.fixed_dictionaries(
        {n: st.one_of(st.none(), f.values) for n, f in zip(names, fields, strict=True)})
    return SqlShape(t, spec, values)


def accumulator(draw: Any, r: SqlShape) -> SqlShape:
    """``r`` with an aggregate's sum and count after its fields, and the aggregate's current
    value computed from them (``RowDataSpec.derived``, as with a compiled plan)."""
    assert isinstance(r.spec, RowDataSpec)
    integral = draw(st.booleans())
    total_root = draw(st.sampled_from(["INTEGER", "BIGINT"])) if integral else "DOUBLE"
    function = draw(st.sampled_from(["avg", "sum"])) if integral else "avg"
    root = draw(st.sampled_from(["TINYINT", "INTEGER", "BIGINT"] if integral
                                else ["FLOAT", "DOUBLE"]))
    n = len(r.type.fields)
    t = SqlType("ROW", fields=(*r.type.fields, SqlField("acc.sum", SqlType(total_root)),
                               SqlField("acc.count", SqlType("BIGINT"))))
    spec = replace(r.spec, type=t, field_specs=(*r.spec.field_specs, _PLACEHOLDER, _PLACEHOLDER),
                   derived=(("acc", function, n, n + 1, root),))
    totals = _ints(32 if total_root == "INTEGER" else 64) if integral else _floats(64)
    counts = st.one_of(st.integers(-2, 40), _ints(64))
    values = st.tuples(r.values, st.one_of(st.none(), totals), st.one_of(st.none(), counts)).map(
        lambda v: {**v[0], "acc.sum": v[1], "acc.count": v[2]})
    return SqlShape(t, spec, values)


def row_data(draw: Any, lists: bool) -> Shape:
    r = sql_row(draw, 0, lists)
    assert isinstance(r.spec, RowDataSpec)
    if lists and draw(st.integers(0, 3)) == 0:
        r = accumulator(draw, r)
        assert isinstance(r.spec, RowDataSpec)
    if lists and draw(st.booleans()):
        # a row of a SQL operator's state that shows its RowKind (values and list elements)
        kind = st.sampled_from(ROW_KINDS)
        return Shape(replace(r.spec, row_kind=True),
                     st.tuples(kind, r.values).map(lambda kv: {"row_kind": kv[0], **kv[1]}))
    return Shape(r.spec, r.values)


def array_data(draw: Any) -> Shape:
    el = sql_field(draw, 1, True, False)
    return Shape(ArrayDataSpec(element=el.type), st.lists(st.one_of(st.none(), el.values),
                                                          max_size=5))


# -- shapes of keys, namespaces, values -----------------------------------------------------------


def shape(draw: Any, depth: int = 0, lists: bool = True, top: bool = False) -> Shape:
    """A shape the compiled path decodes: ``lists`` allows list values (not in keys and
    namespaces); ``top``: a whole key/value (RowData and SQL arrays only there)."""
    kinds = ["scalar"] * 5
    if depth < 2:
        kinds += ["tuple", "row", "pojo"] + (["list"] if lists else [])
    if top:
        kinds += ["rowdata", "rowdata"] + (["array"] if lists else [])
    if depth > 0:
        kinds += ["null"]
    kind = draw(st.sampled_from(kinds))
    if kind == "scalar":
        return scalar(draw)
    if kind == "null":
        return always_null(draw)
    if kind == "tuple":
        return tuple_(draw, depth, lists)
    if kind == "row":
        return row(draw, depth, lists)
    if kind == "pojo":
        return pojo(draw, depth, lists)
    if kind == "list":
        return list_(draw, depth)
    if kind == "rowdata":
        return row_data(draw, lists)
    return array_data(draw)


@covers("NAMESPACE_VOID", "NAMESPACE_TIME_WINDOW", "NAMESPACE_COUNT_WINDOW")
def namespace(draw: Any) -> Shape:
    name = draw(st.sampled_from(["void", "time_window", "count_window"]))
    if name == "void":
        return Shape(NamespaceSpec(name="void"), st.none())
    if name == "count_window":
        return Shape(NamespaceSpec(name="count_window"), _ints(64))
    return Shape(NamespaceSpec(name="time_window"),
                 st.fixed_dictionaries({"start": _ints(64), "end": _ints(64)}))


@dataclass
class Case:
    """One generated state: its layout, how its bytes are written, its logical entries."""

    layout: StateInfo
    mode: str
    enc: flinkenc.StateBytes
    entries: list[flinkenc.Entry]
    #: the strategy of the state's keys (a lookup's key absent from ``entries``)
    keys: st.SearchStrategy[Any] | None = None


@covers("K_VALUE", "K_TIMER", "K_MAP", "K_LIST", "K_LIST_FLAT", "K_MAP_NESTED", "TTL")
def case(draw: Any, name: str = "s") -> Case:
    kind = draw(st.sampled_from(["value", "list", "map", "timer"]))
    key = shape(draw, 0, lists=False, top=True)
    ns = namespace(draw)
    prefix_len = draw(st.sampled_from([1, 2]))
    ttl = kind != "timer" and draw(st.booleans())
    kgs = st.sampled_from([0, 1, 5, 127] if prefix_len == 1 else [0, 200, 32767])
    user_key = value = None
    if kind == "timer":
        layout = flinkenc.row_state(
            name=f"_timer_state/event_{name}", kind="event_timer", key=key.spec,
            namespace=ns.spec, value=TimerSpec(key=key.spec, namespace=ns.spec))
        values: st.SearchStrategy[Any] = _ints(64)
        modes = ["rows"]
    else:
        value = shape(draw, 0, lists=True, top=True)
        wrapped = TtlSpec(inner=value.spec) if ttl else value.spec
        if ttl:
            values = st.fixed_dictionaries({"last_access": _ints(64), "value": value.values})
        else:
            values = value.values
        if kind == "value":
            full: SerializerSpec = wrapped
            modes = ["rows"]
        elif kind == "list":
            full = ListSpec(element=wrapped)
            values = st.lists(values, max_size=4)
            modes = ["rows", "flat"]
        else:
            user_key = shape(draw, 0, lists=True, top=True)
            full = MapSpec(key=user_key.spec, value=wrapped)
            modes = [draw(st.sampled_from(["rows", "nested"]))]
            # an Arrow map has no null keys (the nested read of a null user key is an error
            # on both paths, checked by the rows mode and the mutations)
            keys = user_key.values
            if modes == ["nested"]:
                keys = keys.filter(lambda k: k is not None)
            values = st.lists(st.tuples(keys, st.one_of(st.none(), values)), max_size=4)
        layout = flinkenc.row_state(name=name, kind=kind, key=key.spec, namespace=ns.spec,
                             user_key=None if user_key is None else user_key.spec,
                             value=value.spec, ttl=ttl, state_value=full)
    enc = flinkenc.StateBytes(
        kind=kind, key=key.spec, ns=ns.spec, value=None if value is None else value.spec,
        user_key=None if user_key is None else user_key.spec, ttl=ttl, prefix_len=prefix_len)
    entries = draw(st.lists(
        st.builds(flinkenc.Entry, kgs, key.values, ns.values, st.none(), values),
        min_size=1, max_size=6))
    return Case(layout, draw(st.sampled_from(modes)), enc, entries, key.values)


# -- reading one case on one path -----------------------------------------------------------------


def _pure(on: bool) -> None:
    if on:
        os.environ[fastpath.PURE_ENV] = "1"
    else:
        os.environ.pop(fastpath.PURE_ENV, None)


def _builder(c: Case) -> BatchBuilder:
    return BatchBuilder(state_schema(c.layout, c.mode), c.layout)


def _flush(builder: BatchBuilder, batches: list[pa.RecordBatch]) -> None:
    b = builder.flush()
    if b is not None:
        batches.append(b)


def _table(builder: BatchBuilder, batches: list[pa.RecordBatch]) -> pa.Table:
    _flush(builder, batches)
    return pa.Table.from_batches(batches, schema=builder.schema)


class Corrupt:
    """The outcome of a read that raised :class:`CorruptStateError` (equal to any other: the
    paths must agree that bytes are corrupt; their messages may differ)."""

    def __init__(self, e: CorruptStateError) -> None:
        self.message = str(e)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Corrupt)

    def __repr__(self) -> str:
        return f"CorruptStateError({self.message[:300]!r})"


def _outcome(read: Callable[[], pa.Table]) -> Any:
    """The table, or :class:`Corrupt` (anything else propagates: a crash, SystemError, ...)."""
    try:
        return read()
    except CorruptStateError as e:
        return Corrupt(e)


def _canonical_pairs(c: Case) -> list[tuple[int, list[tuple[bytes, bytes]]]]:
    """Per key group (file order), the state's (key, value) pairs: map entries one pair per
    user key; RocksDB's order inside a key group."""
    out: dict[int, dict[bytes, bytes]] = {}
    for e in c.entries:
        if c.enc.kind == "map":
            for uk, v in e.value:
                k, val = c.enc.composite(flinkenc.Entry(e.kg, e.key, e.ns, uk, v))
                out.setdefault(e.kg, {})[k] = val
        else:
            k, val = c.enc.composite(e)
            out.setdefault(e.kg, {})[k] = val
    return [(kg, sorted(pairs.items())) for kg, pairs in sorted(out.items()) if pairs]


def canonical_bytes(c: Case, other: list[tuple[bytes, bytes]]) -> tuple[bytes, dict[int, int]]:
    """The case's entries in a canonical stream; ``other`` is a run of state 1 put before the
    case's run in every key group (a state the scan skips)."""
    runs = []
    for kg, pairs in _canonical_pairs(c):
        if other:
            p = kg.to_bytes(c.enc.prefix_len, "big")
            runs.append((kg, 1, [(p + k, v) for k, v in other]))
        runs.append((kg, 0, pairs))
    return flinkenc.canonical_stream(runs)


def read_canonical(c: Case, data: bytes, offsets: dict[int, int],
                   key_bytes: tuple[bytes, ...] | None = None,
                   key_groups: frozenset[int] | None = None) -> pa.Table:
    """``key_bytes``: a lookup's read (only the entries of those serialized keys: the key
    filter, compiled ``_read.KeyFilter`` or the pure ``startswith``) of ``key_groups``."""
    from statequery.backends.keygroups import CompositeEntryDecoder, KeyGroupStream

    builder = _builder(c)
    decoder = CompositeEntryDecoder(c.layout, c.mode, builder, key_bytes)
    stream = KeyGroupStream(flinkenc.MemoryStream(data), offsets, False, c.enc.prefix_len)
    batches: list[pa.RecordBatch] = []
    for _kg in stream.scan([decoder.on_entry, None], [decoder.finish], key_groups=key_groups):
        _flush(builder, batches)
    return _table(builder, batches)


def heap_bytes(c: Case, other: Case | None) -> tuple[bytes, dict[int, int]]:
    groups: dict[int, list[bytes]] = {}
    for e in c.entries:
        groups.setdefault(e.kg, []).append(c.enc.heap(e))
    skipped: dict[int, list[bytes]] = {}
    if other is not None:
        for e in other.entries:
            skipped.setdefault(e.kg, []).append(other.enc.heap(e))
    out = []
    for kg in sorted(set(groups) | set(skipped)):
        blocks = []
        if kg in skipped:
            blocks.append((1, skipped[kg]))
        blocks.append((0, groups.get(kg, [])))
        out.append((kg, blocks))
    return flinkenc.heap_stream(out)


def read_heap(c: Case, other: Case | None, data: bytes, offsets: dict[int, int]) -> pa.Table:
    from statequery.backends.heap import HeapBlockDecoder, HeapKeyGroupStream

    builder = _builder(c)
    blocks = [HeapBlockDecoder(c.layout, builder, c.mode)]
    blocks.append(HeapBlockDecoder(other.layout if other is not None else c.layout, None, None))
    stream = HeapKeyGroupStream(flinkenc.MemoryStream(data), offsets, False)
    batches: list[pa.RecordBatch] = []
    for _kg in stream.scan(blocks):
        _flush(builder, batches)
    return _table(builder, batches)


class _Pairs:
    """RocksDB's side of ``RocksDBKeyedBackend._scan_db``: the column family's sorted pairs."""

    def __init__(self, name: str, pairs: list[tuple[bytes, bytes]]) -> None:
        self.column_families = [name]
        self.pairs = pairs

    def items(self, state: str, bounds: Any = None, *, key_prefix: bytes | None = None,
              match: Any = None) -> tuple[Any, Any]:
        return iter(self.pairs), None

    def describe(self, state: str) -> str:
        return "differential pairs"

    def wrap_error(self, state: str, e: Exception) -> CorruptStateError:
        return CorruptStateError(f"{type(e).__name__}: {e}", "differential pairs")


def rocksdb_pairs(c: Case) -> list[tuple[bytes, bytes]]:
    return [p for _kg, pairs in _canonical_pairs(c) for p in pairs]


def read_rocksdb(c: Case, pairs: list[tuple[bytes, bytes]],
                 key_bytes: tuple[bytes, ...] | None = None) -> pa.Table:
    from statequery.backends.rocksdb import RocksDBKeyedBackend

    backend = object.__new__(RocksDBKeyedBackend)
    backend.max_parallelism = 128 if c.enc.prefix_len == 1 else 32768
    builder = _builder(c)
    batches: list[pa.RecordBatch] = []
    raw = key_bytes[0] if key_bytes is not None and len(key_bytes) == 1 else None
    for _kg in backend._scan_db(_Pairs(c.layout.name, pairs), c.layout, c.mode, builder, None,
                                key_bytes, raw):
        _flush(builder, batches)
    return _table(builder, batches)


def _both(read: Callable[[], pa.Table]) -> tuple[Any, Any]:
    saved = os.environ.get(fastpath.PURE_ENV)
    try:
        _pure(True)
        pure = _outcome(read)
        _pure(False)
        fast = _outcome(read)
    finally:
        if saved is None:
            os.environ.pop(fastpath.PURE_ENV, None)
        else:
            os.environ[fastpath.PURE_ENV] = saved
    return pure, fast


def _diff(fast: pa.Table, pure: pa.Table) -> str:
    if fast.num_rows != pure.num_rows:
        return f"{fast.num_rows} rows compiled, {pure.num_rows} pure"
    out = []
    for name in pure.column_names:
        a, b = fast.column(name), pure.column(name)
        if not a.equals(b):
            out.append(f"{name}: compiled {str(a)[:400]} pure {str(b)[:400]}")
    return "; ".join(out)


def _same_array(a: Any, b: Any) -> bool:
    """Arrow equality, except that NaN equals NaN (mutated float bytes are often NaNs, which
    ``equals`` never finds equal; their payload bits may differ: the pure path goes through
    Python floats)."""
    import pyarrow.compute as pc

    if isinstance(a, pa.ChunkedArray):
        a, b = a.combine_chunks(), b.combine_chunks()
    if a.equals(b):
        return True
    t = a.type
    if t != b.type or len(a) != len(b) or not a.is_valid().equals(b.is_valid()):
        return False
    if pa.types.is_floating(t):
        same = pc.or_kleene(pc.equal(a, b), pc.and_(pc.is_nan(a), pc.is_nan(b)))
        return bool(pc.all(pc.fill_null(same, True)).as_py())
    if pa.types.is_struct(t):
        # children under a null parent are not values (Arrow's equals ignores them too)
        valid = a.is_valid()
        return all(_same_array(pc.filter(a.field(i), valid), pc.filter(b.field(i), valid))
                   for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_map(t):
        return bool(pc.list_value_length(a).equals(pc.list_value_length(b))) and _same_array(
            a.flatten(), b.flatten())
    return False


def assert_same(pure: Any, fast: Any, what: str) -> None:
    if isinstance(pure, Corrupt) or isinstance(fast, Corrupt):
        assert pure == fast, f"{what}: pure {pure!r:.400}, compiled {fast!r:.400}"
        return
    assert fast.schema == pure.schema, what
    assert fast.num_rows == pure.num_rows and all(
        _same_array(fast.column(n), pure.column(n)) for n in pure.column_names
    ), f"{what}: {_diff(fast, pure)}"


def _compiled(c: Case) -> None:
    """The case takes the compiled sinks (the test would pass vacuously on the fallback)."""
    schema = state_schema(c.layout, c.mode)
    assert fastpath.entry_sink(c.layout, c.mode, schema) is not None, c.layout
    assert fastpath.heap_sink(c.layout, c.mode, schema) is not None, c.layout


def _mutate(draw: Any, data: bytes, start: int) -> bytes:
    """``data`` truncated, or with one byte changed, or with 4 bytes overwritten by an
    impossible length, at a position from ``start`` on."""
    if len(data) <= start:
        return data
    pos = draw(st.integers(start, len(data) - 1), label="position")
    how = draw(st.sampled_from(["cut", "xor", "length"]), label="mutation")
    if how == "cut":
        return data[:pos]
    out = bytearray(data)
    if how == "xor":
        out[pos] ^= draw(st.integers(1, 255), label="xor")
    else:
        v = draw(st.sampled_from([0x7FFFFFFF, -1, -(2**31), 1 << 28, 0]), label="length")
        out[pos : pos + 4] = v.to_bytes(4, "big", signed=True)
    return bytes(out)


def _delimitable(c: Case) -> bool:
    """False for list state elements of no bytes (a Tuple of NullValues): the ``,``-joined
    value cannot hold them (both paths reject it; no Flink job writes it)."""
    return c.enc.kind != "list" or all(c.enc._ttl(x) for e in c.entries for x in e.value)


def _check_built() -> None:
    if fastpath.compiled() is None:
        assert os.environ.get("STATEQUERY_NO_EXTENSIONS"), "compiled path not built"
        pytest.skip("compiled path not built (STATEQUERY_NO_EXTENSIONS)")


# -- the properties ---------------------------------------------------------------------------


@SETTINGS
@given(data=st.data())
def test_canonical_streams_read_the_same(data: Any) -> None:
    """Also with the compiled path's buffers built into an arena (a pool worker's result slot;
    from none to more than the case needs, so what does not fit goes to bytes)."""
    _check_built()
    c = case(data.draw)
    _compiled(c)
    assume(_delimitable(c))
    other = data.draw(st.lists(st.tuples(st.binary(max_size=6), st.binary(max_size=6)),
                               max_size=2), label="skipped run")
    stream, offsets = canonical_bytes(c, other)
    capacity = data.draw(st.sampled_from([0, 1, 63, 200, 4096, 1 << 20]), label="arena bytes")
    pure, fast = _both(lambda: read_canonical(c, stream, offsets))
    assert not isinstance(pure, Corrupt), f"the pure path rejects the encoder's bytes: {pure}"
    assert_same(pure, fast, "canonical")
    _same_in_arena(pure, fast, lambda: read_canonical(c, stream, offsets), capacity,
                   "canonical")
    piece = data.draw(st.sampled_from([1, 2, 3, 7, 16, 61]), label="walk piece bytes")
    _same_in_pieces(pure, fast, lambda: read_canonical(c, stream, offsets), piece, "canonical")
    bad = _mutate(data.draw, stream, 8)
    pure, fast = _both(lambda: read_canonical(c, bad, offsets))
    assert_same(pure, fast, "canonical, mutated")
    _same_in_arena(pure, fast, lambda: read_canonical(c, bad, offsets), capacity,
                   "canonical, mutated")
    _same_in_pieces(pure, fast, lambda: read_canonical(c, bad, offsets), piece,
                    "canonical, mutated")


def _same_in_pieces(pure: Any, fast: Any, read: Callable[[], pa.Table], piece: int,
                    what: str) -> None:
    """``read`` with every key group over ``2 * piece`` bytes walked in pieces of ``piece``
    bytes (``KeyGroupStream._walk_in_pieces``) gives on each path what one walk of the whole
    gave, a corrupt stream the same error, message and offset."""
    from statequery.backends import keygroups

    saved = keygroups.WALK_PIECE_BYTES
    keygroups.WALK_PIECE_BYTES = piece
    try:
        pure_pieces, fast_pieces = _both(read)
    finally:
        keygroups.WALK_PIECE_BYTES = saved
    for whole, pieces, path in ((pure, pure_pieces, "pure"), (fast, fast_pieces, "compiled")):
        label = f"{what}, in {piece}-byte pieces ({path})"
        assert_same(whole, pieces, label)
        if isinstance(whole, Corrupt):
            assert whole.message == pieces.message, label


def _same_in_arena(pure: Any, fast: Any, read: Callable[[], pa.Table], capacity: int,
                   what: str) -> None:
    """``read`` on the compiled path into an arena of ``capacity`` bytes gives what both paths
    gave without one, and no slice of the arena outlives the table."""
    from statequery.backends import _read

    arena = _into_arena(read, capacity)
    assert_same(pure, arena, f"{what}, into a {capacity}-byte arena")
    assert_same(fast, arena, f"{what}, into a {capacity}-byte arena (compiled)")
    del arena
    assert _read.arena_live() == 0  # every slice of the arena went with the table


def _into_arena(read: Callable[[], pa.Table], capacity: int) -> Any:
    """The compiled path's outcome with its buffers built into an arena of ``capacity`` bytes
    (as a pool worker builds them into its result slot; what does not fit goes to bytes)."""
    from statequery.backends import _read

    saved = os.environ.get(fastpath.PURE_ENV)
    _pure(False)
    _read.arena_set(memoryview(bytearray(capacity)), 0)
    try:
        return _outcome(read)
    finally:
        _read.arena_set(None)
        if saved is not None:
            os.environ[fastpath.PURE_ENV] = saved


@SETTINGS
@given(data=st.data())
def test_heap_key_groups_read_the_same(data: Any) -> None:
    _check_built()
    c = case(data.draw)
    _compiled(c)
    other = case(data.draw, "other") if data.draw(st.booleans(), label="skipped state") else None
    stream, offsets = heap_bytes(c, other)
    pure, fast = _both(lambda: read_heap(c, other, stream, offsets))
    assert not isinstance(pure, Corrupt), f"the pure path rejects the encoder's bytes: {pure}"
    assert_same(pure, fast, "heap")
    bad = _mutate(data.draw, stream, 8)
    pure, fast = _both(lambda: read_heap(c, other, bad, offsets))
    assert_same(pure, fast, "heap, mutated")


@SETTINGS
@given(data=st.data())
def test_rocksdb_pairs_read_the_same(data: Any) -> None:
    _check_built()
    c = case(data.draw)
    _compiled(c)
    assume(_delimitable(c))
    pairs = rocksdb_pairs(c)
    pure, fast = _both(lambda: read_rocksdb(c, pairs))
    assert not isinstance(pure, Corrupt), f"the pure path rejects the encoder's bytes: {pure}"
    assert_same(pure, fast, "rocksdb")
    mutated = _mutate_pairs(data.draw, c, pairs)
    if mutated is None:
        return
    bad, what = mutated
    pure, fast = _both(lambda: read_rocksdb(c, bad))
    assert_same(pure, fast, f"rocksdb, {what}")


def _mutate_pairs(draw: Any, c: Case, pairs: list[tuple[bytes, bytes]],
                  ) -> tuple[list[tuple[bytes, bytes]], str] | None:
    """``pairs`` with one entry's key or value mutated (:func:`_mutate`), and what was; None
    when there is none, or the mutated key moved to another key group (out of order)."""
    if not pairs:
        return None
    i = draw(st.integers(0, len(pairs) - 1), label="entry")
    k, v = pairs[i]
    which = draw(st.sampled_from(["key", "value"]), label="part")
    if which == "key":
        k = _mutate(draw, k, c.enc.prefix_len)
        if len(k) < c.enc.prefix_len or k[: c.enc.prefix_len] != pairs[i][0][: c.enc.prefix_len]:
            return None  # another key group's key, out of order
    else:
        v = _mutate(draw, v, 0)
    return pairs[:i] + [(k, v)] + pairs[i + 1 :], f"{which} of entry {i} mutated"


# -- keyed reads (lookups): the key filter --------------------------------------------------------

_PROBES = ["present", "absent", "empty", "prefix", "other key group"]


@dataclass(frozen=True)
class Lookup:
    """A keyed read: the serialized keys wanted and the key groups read (None: every one)."""

    what: str
    wanted: tuple[bytes, ...]
    key_groups: frozenset[int] | None


def _key_bytes(c: Case, e: flinkenc.Entry) -> bytes:
    return flinkenc.encode(c.enc.key, e.key)


def lookup(draw: Any, c: Case) -> Lookup:
    """One to three probes: a key of the state, a key it does not hold, the empty key, a proper
    prefix of one of its keys, and one of its keys read in the other key groups only (as a
    lookup reads the key group the key hashes to)."""
    present = [_key_bytes(c, e) for e in c.entries]
    probes = draw(st.lists(st.sampled_from(_PROBES), min_size=1, max_size=3, unique=True),
                  label="probes")
    wanted: list[bytes] = []
    key_groups: frozenset[int] | None = None
    for probe in probes:
        i = draw(st.integers(0, len(c.entries) - 1), label="entry")
        k = present[i]
        if probe == "absent":
            assert c.keys is not None
            k = _key_bytes(c, replace(c.entries[i], key=draw(c.keys, label="absent key")))
            if any(p.startswith(k) for p in present):
                # a key the state holds after all (a boolean, a short enum): bytes of no key
                k = draw(st.binary(min_size=1, max_size=12).filter(
                    lambda b: not any(p.startswith(b) for p in present)), label="absent bytes")
        elif probe == "empty":
            k = b""
        elif probe == "prefix":
            k = k[: draw(st.integers(0, max(len(k) - 1, 0)), label="prefix length")]
        elif probe == "other key group":
            key_groups = frozenset(e.kg for e in c.entries) - {c.entries[i].kg}
        wanted.append(k)
    return Lookup("+".join(probes), tuple(wanted), key_groups)


def _expected(c: Case, q: Lookup) -> Case:
    """The case with only the entries a lookup ``q`` reads (its unkeyed read is the lookup's
    expected table)."""
    return replace(c, entries=[
        e for e in c.entries
        if (q.key_groups is None or e.kg in q.key_groups)
        and any(c.enc.key_ns(e).startswith(k) for k in q.wanted)])


def _filtered_in_c(c: Case, q: Lookup) -> None:
    """The compiled path filters ``q``'s keys with ``_read.KeyFilter`` (not vacuous)."""
    from statequery.backends.keygroups import CompositeEntryDecoder

    mod = fastpath.compiled()
    assert mod is not None
    decoder = CompositeEntryDecoder(c.layout, c.mode, _builder(c), q.wanted)
    assert isinstance(decoder.on_entry, mod.KeyFilter), decoder.on_entry


@SETTINGS
@given(data=st.data())
def test_keyed_canonical_reads_are_the_same(data: Any) -> None:
    """A lookup's read of a canonical stream (``scan_key_group`` comparing keys in C against the
    pure ``startswith``): the same rows, exactly the entries of the wanted keys, also on
    truncated and mutated bytes."""
    _check_built()
    c = case(data.draw)
    _compiled(c)
    assume(_delimitable(c))
    q = lookup(data.draw, c)
    _filtered_in_c(c, q)
    other = data.draw(st.lists(st.tuples(st.binary(max_size=6), st.binary(max_size=6)),
                               max_size=2), label="skipped run")
    stream, offsets = canonical_bytes(c, other)
    pure, fast = _both(lambda: read_canonical(c, stream, offsets, q.wanted, q.key_groups))
    assert not isinstance(pure, Corrupt), f"the pure path rejects the encoder's bytes: {pure}"
    assert_same(pure, fast, f"canonical, keyed ({q.what})")
    want = _expected(c, q)
    want_stream, want_offsets = canonical_bytes(want, [])
    assert_same(read_canonical(want, want_stream, want_offsets), fast,
                f"canonical, keyed ({q.what}): the wanted keys' entries")
    bad = _mutate(data.draw, stream, 8)
    pure, fast = _both(lambda: read_canonical(c, bad, offsets, q.wanted, q.key_groups))
    assert_same(pure, fast, f"canonical, keyed ({q.what}), mutated")


@SETTINGS
@given(data=st.data())
def test_keyed_rocksdb_reads_are_the_same(data: Any) -> None:
    """A lookup's read of RocksDB pairs (``_read.KeyFilter`` called per entry against the pure
    ``startswith``): the same rows, exactly the wanted keys' entries, also with an entry's key
    or value truncated or mutated."""
    _check_built()
    c = case(data.draw)
    _compiled(c)
    assume(_delimitable(c))
    q = lookup(data.draw, c)
    _filtered_in_c(c, q)
    n = c.enc.prefix_len
    pairs = [p for p in rocksdb_pairs(c)
             if q.key_groups is None or int.from_bytes(p[0][:n], "big") in q.key_groups]
    pure, fast = _both(lambda: read_rocksdb(c, pairs, q.wanted))
    assert not isinstance(pure, Corrupt), f"the pure path rejects the encoder's bytes: {pure}"
    assert_same(pure, fast, f"rocksdb, keyed ({q.what})")
    assert_same(read_rocksdb(c, rocksdb_pairs(_expected(c, q))), fast,
                f"rocksdb, keyed ({q.what}): the wanted keys' entries")
    mutated = _mutate_pairs(data.draw, c, pairs)
    if mutated is None:
        return
    bad, what = mutated
    pure, fast = _both(lambda: read_rocksdb(c, bad, q.wanted))
    assert_same(pure, fast, f"rocksdb, keyed ({q.what}), {what}")


def test_a_key_cut_short_is_not_matched_by_its_value_bytes() -> None:
    """A RocksDB entry whose key was cut to half the wanted key, and whose value bytes happen to
    continue it: not the wanted key on either path (the pure filter compared past the composite
    key into the value and raised CorruptStateError; ``_read.KeyFilter`` skipped the entry)."""
    _check_built()
    long_ = PrimitiveSpec(name="long")
    void = NamespaceSpec(name="void")
    layout = flinkenc.row_state(name="s", kind="value", key=long_, namespace=void, value=long_,
                         state_value=long_)
    c = Case(layout, "rows", flinkenc.StateBytes("value", long_, void, long_),
             [flinkenc.Entry(0, 7, None, None, 1), flinkenc.Entry(0, 8, None, None, 2)])
    wanted = flinkenc.encode(long_, 7)
    (k7, _v7), kv8 = rocksdb_pairs(c)
    cut = [(k7[:5], wanted[4:] + bytes(4)), kv8]  # prefix + 4 key bytes; the rest in the value
    for keys, rows in (((wanted,), []), ((flinkenc.encode(long_, 8),), [(8, 2)])):
        pure, fast = _both(functools.partial(read_rocksdb, c, cut, keys))
        assert_same(pure, fast, "rocksdb, a key cut short")
        assert [(r["key"], r["value"]) for r in fast.to_pylist()] == rows


# -- the harness covers every compiled shape ------------------------------------------------------


def test_every_compiled_shape_is_in_the_harness() -> None:
    """Every type code (``T_*``), struct kind (``S_*``), sink kind (``K_*``) and column class
    the compiled module exposes has a strategy above that generates it; adding one to
    ``_read.pyx`` without adding it here fails this test."""
    _check_built()
    mod = fastpath.compiled()
    exposed = {n for n in dir(mod) if n.split("_")[0] in ("T", "S", "K") and n.isupper()}
    base = mod.Col
    exposed |= {n for n in dir(mod)
                if isinstance(getattr(mod, n), type) and issubclass(getattr(mod, n), base)
                and getattr(mod, n) is not base}
    missing = exposed - set(COVERS)
    assert not missing, f"compiled shapes no harness strategy generates: {sorted(missing)}"
    # and the fastpath glue maps nothing else: every primitive and SQL type it compiles
    assert {v[0] for v in fastpath._TYPES.values()} <= set(COVERS)
    assert set(fastpath._SQL_CODES.values()) <= set(COVERS)


# -- the encoder against real Flink bytes ---------------------------------------------------------


def _canonical_streams(name: str) -> Any:
    """``(layouts in state-id order, KeyGroupStream)`` of every canonical keyed subtask."""
    from statequery.backends import (
        CanonicalKeyedBackend,
        KeyedContext,
        is_heap_layout,
        keyed_backend_kind,
        open_keyed_backend,
    )
    from statequery.backends.heap import HeapKeyGroupStream
    from statequery.backends.keygroups import KeyGroupStream, key_group_prefix_bytes
    from statequery.metadata.handles import KeyGroupsHandle
    from statequery.scan import _header_order

    sp = statequery.open(str(fixture_dir(name)), use_snapshot=False)
    for op in sp.meta.operators:
        for sub in op.subtasks:
            h, header = sub.keyed_handle, sub.keyed_header
            if not isinstance(h, KeyGroupsHandle) or header is None:
                continue
            context = KeyedContext(sp.resolver, op.max_parallelism, op.display_name)
            order = _header_order(op, header.state_ids)
            kind = keyed_backend_kind(h, header.layout, context, header.compressed, len(order))
            backend = open_keyed_backend(kind, h, context, header.compressed, op.key_spec, order)
            if is_heap_layout(h):
                yield backend.order, HeapKeyGroupStream(
                    backend.stream, backend._offsets_by_key_group(), backend.compressed)
            else:
                assert isinstance(backend, CanonicalKeyedBackend)
                yield backend.order, KeyGroupStream(
                    backend.stream, backend._offsets_by_key_group(), backend.compressed,
                    key_group_prefix_bytes(op.max_parallelism))


def _enc_of(layout: StateInfo, prefix_len: int) -> flinkenc.StateBytes | None:
    """The encoder of a fixture state, when it is of a shape the harness generates."""
    schema = state_schema(layout, "rows")
    # Avro values take the pure reader on both paths (docs/avro.md): re-encoded all the same
    if not isinstance(layout.value, AvroSpec) and fastpath.entry_sink(
            layout, "rows", schema) is None:
        return None
    if layout.is_timer:
        t = layout.value
        assert isinstance(t, TimerSpec)
        return flinkenc.StateBytes("timer", t.key, t.namespace, prefix_len=prefix_len)
    assert layout.key is not None and layout.namespace is not None
    return flinkenc.StateBytes(layout.kind if layout.kind in ("list", "map") else "value",
                               layout.key, layout.namespace, layout.value, layout.user_key,
                               layout.ttl, prefix_len)


def _voids(spec: SerializerSpec | None, v: Any) -> Any:
    """Decoded values with the RAW placeholders of SQL data views (a NullSerializer's byte,
    read as None) put back as :data:`flinkenc.VOID` (Flink writes them non-null)."""
    if v is None or spec is None:
        return v
    if isinstance(spec, TtlSpec):
        return {"last_access": v["last_access"], "value": _voids(spec.inner, v["value"])}
    if isinstance(spec, ListSpec):
        return [_voids(spec.element, x) for x in v]
    if isinstance(spec, MapSpec):
        return [(_voids(spec.key, k), _voids(spec.value, x)) for k, x in v]
    if isinstance(spec, TupleSpec):
        return {f"f{i}": _voids(f, v[f"f{i}"]) for i, f in enumerate(spec.fields)}
    if isinstance(spec, RowDataSpec):
        return _void_row(spec.type, spec.field_specs, v)
    return v


def _void_row(t: SqlType, specs: tuple[SerializerSpec, ...], v: dict[str, Any]) -> Any:
    out = dict(v)
    for i, f in enumerate(t.fields):
        fs = specs[i] if len(specs) == len(t.fields) else None
        name = f.name or f"f{i}"
        if out[name] is None:
            if isinstance(fs, RawValueSpec) and isinstance(fs.inner, PrimitiveSpec) and (
                    fs.inner.name in ("void", "null_value")):
                out[name] = flinkenc.VOID
        elif f.type.root in ("ROW", "STRUCTURED_TYPE"):
            inner = fs.field_specs if isinstance(fs, RowDataSpec) else ()
            out[name] = _void_row(f.type, inner, out[name])
    return out


def _same_bytes(ours: bytes, flinks: bytes) -> bool:
    """Equal, up to RowKind bytes: a ``BinaryRowData``'s first null-bits byte holds its RowKind
    (1-3 for updates and deletes), which decoded values do not carry; the encoder writes 0."""
    if len(ours) != len(flinks):
        return False
    return all(a == b or (a == 0 and b in (1, 2, 3)) for a, b in zip(ours, flinks, strict=True))


class _Reencode:
    """An entry handler: decodes each entry with the pure readers and checks that the encoder
    writes exactly its bytes."""

    def __init__(self, enc: flinkenc.StateBytes) -> None:
        from statequery.serializers.readers import reader_for

        self.enc = enc
        self.key = reader_for(enc.key).read_at
        self.ns = reader_for(enc.ns).read_at
        self.uk = None if enc.user_key is None else reader_for(enc.user_key).read_at
        v = enc.value
        self.full = TtlSpec(inner=v) if enc.ttl and v is not None else v
        self.value = None if self.full is None else reader_for(self.full).read_at
        self.checked = 0

    def __call__(self, buf: bytes, kpos: int, kend: int, vpos: int, vend: int, kg: int) -> None:
        enc = self.enc
        p = kpos
        ts = None
        if enc.kind == "timer":
            ts = struct.unpack_from(">q", buf, p)[0] ^ flinkenc.LONG_MIN
            p += 8
        key, p = self.key(buf, p, kend)
        ns, p = self.ns(buf, p, kend)
        entry = flinkenc.Entry(kg, _voids(enc.key, key), ns, None, ts)
        if enc.kind == "map":
            assert self.uk is not None and self.value is not None
            entry.user_key, p = self.uk(buf, p, kend)
            entry.value = None if buf[vpos] else self.value(buf, vpos + 1, vend)[0]
            entry.value = _voids(self.full, entry.value)
        elif enc.kind == "list":
            assert self.value is not None
            entry.value, q = [], vpos
            while q < vend:
                x, q = self.value(buf, q, vend)
                entry.value.append(_voids(self.full, x))
                q += 1
        elif enc.kind == "value":
            assert self.value is not None
            entry.value = _voids(self.full, self.value(buf, vpos, vend)[0])
        k, v = enc.composite(entry)
        assert _same_bytes(k[enc.prefix_len :], buf[kpos:kend]), (k.hex(), buf[kpos:kend].hex())
        assert _same_bytes(v, buf[vpos:vend]), (v.hex(), buf[vpos:vend].hex())
        self.checked += 1


class _HeapReencode:
    """A heap block walker (``walk(buf, pos, end, kg)``) that checks every entry's bytes."""

    def __init__(self, layout: StateInfo, enc: flinkenc.StateBytes | None) -> None:
        from statequery.backends.heap import HeapBlockDecoder
        from statequery.serializers.readers import reader_for

        self.layout = layout
        self.enc = enc
        self.skip = HeapBlockDecoder(layout, None, None)
        self.checked = 0
        if enc is not None:
            full = layout.state_value if not layout.is_timer else layout.value
            assert full is not None
            self.ns, self.key = reader_for(enc.ns).read_at, reader_for(enc.key).read_at
            self.full = reader_for(full).read_at
            self.full_spec = full

    def walk(self, buf: bytes, pos: int, end: int, kg: int) -> int:
        if self.enc is None:
            return self.skip.walk(buf, pos, end, kg)  # type: ignore[no-any-return]
        n = struct.unpack_from(">i", buf, pos)[0]
        pos += 4
        for _ in range(n):
            start = pos
            if self.enc.kind == "timer":
                t, pos = self.full(buf, pos, end)
                e = flinkenc.Entry(kg, t["key"], t["namespace"], None, t["timestamp"])
            else:
                ns, pos = self.ns(buf, pos, end)
                key, pos = self.key(buf, pos, end)
                v, pos = self.full(buf, pos, end)
                e = flinkenc.Entry(kg, _voids(self.enc.key, key), ns, None,
                                   _voids(self.full_spec, v))
            assert _same_bytes(self.enc.heap(e), buf[start:pos]), (
                self.layout.name, self.enc.heap(e).hex(), buf[start:pos].hex())
            self.checked += 1
        return pos


@pytest.mark.parametrize("name", ["datastream-hashmap-canonical", "datastream-rocksdb-canonical",
                                  "sql-hashmap-canonical", "ttl-kryo-hashmap-canonical",
                                  "sql-ops-hashmap-native", "datastream-hashmap-checkpoint",
                                  "types-avro-hashmap-canonical"])
def test_the_encoder_writes_flinks_bytes(name: str) -> None:
    """Values decoded from real Flink-written savepoints re-encode to exactly Flink's bytes
    (keys, namespaces, user keys, values, list elements, TTL values, timers; canonical streams
    and hashmap-checkpoint key groups)."""
    _check_built()
    checked: dict[str, int] = {}
    for order, stream in _canonical_streams(name):
        if hasattr(stream, "prefix_len"):
            handlers: list[Any] = []
            for layout in order:
                enc = _enc_of(layout, stream.prefix_len) if layout.keyed else None
                handlers.append(None if enc is None else _Reencode(enc))
            for _kg in stream.scan([h for h in handlers], ()):
                pass
            for layout, h in zip(order, handlers, strict=True):
                if h is not None:
                    checked[layout.name] = checked.get(layout.name, 0) + h.checked
        else:
            blocks = []
            for layout in order:
                enc = _enc_of(layout, 1) if layout.keyed else None
                if enc is not None and (layout.kind in ("list", "map") and layout.state_value
                                        is None):
                    enc = None
                blocks.append(_HeapReencode(layout, enc))
            for _kg in stream.scan(blocks):
                pass
            for b in blocks:
                if b.enc is not None:
                    checked[b.layout.name] = checked.get(b.layout.name, 0) + b.checked
    assert sum(checked.values()) > 0, checked
    if name.startswith("types-avro"):  # every Avro value, map value and list element
        assert checked["everything"] == 8 and checked["items"] == 32, checked
        assert checked["history"] == 8 and checked["specific"] == 8, checked


# -- the values of issue 19, pinned ---------------------------------------------------------------

_EDGE = ["", "东京", "Ω≈ç√", "a\x00b", "𝄞", "plain"]


def _edge_map(text: str) -> list[tuple[str, bytes]]:
    """A map with an empty user key and empty bytes (one entry per user key)."""
    return [(text, b""), ("" if text else "~", b"\x00")]


@pytest.mark.parametrize("kind", ["list-flat", "list-rows", "map-rows", "map-nested", "value"])
def test_issue_19_values_on_every_container(kind: str) -> None:
    """Keyed window state of ``Tuple2<String, Integer>`` keys holding ``''``, CJK, symbols, NUL
    and a non-BMP character (segfaults and SystemErrors before), empty strings and byte arrays
    as values and user keys: both paths, three containers, and the values that went in."""
    _check_built()
    t2 = TupleSpec(fields=(PrimitiveSpec(name="string"), PrimitiveSpec(name="int")))
    tw = NamespaceSpec(name="time_window")
    s, b = PrimitiveSpec(name="string"), PrimitiveArraySpec(element="byte")
    base, mode = kind.split("-") if "-" in kind else (kind, "rows")
    entries = []
    for i, text in enumerate(_EDGE):
        key, ns = {"f0": text, "f1": i}, {"start": 0, "end": 60_000}
        v: Any = {"list": [text, "", None], "value": text,
                  "map": _edge_map(text) if mode == "rows" else [(text, b"")]}[base]
        entries.append(flinkenc.Entry(i % 3, key, ns, None, v))
    value = b if base == "map" else s
    full: SerializerSpec = {"list": ListSpec(element=s), "value": s,
                            "map": MapSpec(key=s, value=b)}[base]
    layout = flinkenc.row_state(name="window-contents", kind=base, key=t2, namespace=tw,
                         user_key=s if base == "map" else None, value=value, state_value=full)
    c = Case(layout, mode, flinkenc.StateBytes(base, t2, tw, value, layout.user_key), entries)
    _compiled(c)
    stream, offsets = canonical_bytes(c, [])
    heap, heap_offsets = heap_bytes(c, None)
    pairs = rocksdb_pairs(c)
    tables = []
    for read in (lambda: read_canonical(c, stream, offsets),
                 lambda: read_heap(c, None, heap, heap_offsets),
                 lambda: read_rocksdb(c, pairs)):
        pure, fast = _both(read)
        assert not isinstance(pure, Corrupt), pure
        assert_same(pure, fast, kind)
        tables.append(fast)
    keys = sorted({r["key"]["f0"] for t in tables for r in t.select(["key"]).to_pylist()})
    assert keys == sorted(_EDGE)
    for t in tables:
        rows = t.to_pylist()
        if kind == "list-flat":
            assert sorted((r["key"]["f0"], r["index"], r["value"]) for r in rows
                          if r["value"] is not None) == sorted(
                (x, i, y) for x in _EDGE for i, y in enumerate([x, ""]))
        elif kind == "list-rows":
            assert sorted((r["key"]["f0"], tuple(r["value"])) for r in rows) == sorted(
                (x, (x, "", None)) for x in _EDGE)
        elif kind == "value":
            assert sorted((r["key"]["f0"], r["value"]) for r in rows) == sorted(
                (x, x) for x in _EDGE)
        elif kind == "map-rows":
            assert sorted((r["key"]["f0"], r["user_key"], r["value"]) for r in rows) == sorted(
                (x, uk, v) for x in _EDGE for uk, v in _edge_map(x))
        else:
            assert sorted((r["key"]["f0"], tuple(r["map"])) for r in rows) == sorted(
                (x, ((x, b""),)) for x in _EDGE)


# -- the pre-check of a RocksDB table's data blocks (issue 33, item 3) ----------------------------


def _block(draw: Any) -> bytes:
    """A block: an entry area of any bytes, a restart array (offsets mostly inside the area,
    sometimes past it), its count word (sometimes with the hash-index flag and a bucket array,
    sometimes a count that does not fit)."""
    area = draw(st.binary(max_size=120), label="entries")
    n = draw(st.sampled_from([1, 1, 2, 3, 6, 0]), label="restarts")
    inside = st.integers(0, max(len(area) - 1, 0))
    restarts = [draw(st.one_of(*[inside] * 8, st.just(len(area)), st.integers(0, 2**32 - 1)),
                     label="restart") for _ in range(n)]
    word = draw(st.one_of(*[st.just(n)] * 6, st.just(n + 1), st.integers(0, 2**32 - 1)),
                label="count word")
    tail = b""
    if draw(st.integers(0, 3), label="hash index") == 0:
        buckets = draw(st.binary(max_size=8), label="buckets")
        count = draw(st.one_of(*[st.just(len(buckets))] * 4, st.integers(0, 2**16 - 1)),
                     label="bucket count")
        tail = buckets + struct.pack("<H", count)
        word |= 0x80000000
    return area + struct.pack(f"<{n}I", *restarts) + tail + struct.pack("<I", word & 0xFFFFFFFF)


def _table_file(draw: Any, path: str) -> tuple[Any, list[tuple[bytes, Any]]]:
    """A file of generated blocks, each with its trailer (compression byte, checksum of the
    footer's type, with a base context sometimes), some mutated, truncated or pointed past the
    file after their checksum was computed; an :class:`~statequery.backends.sst.SstFile` over
    it (built without a footer: the pre-check needs only the blocks) and their handles."""
    import cramjam

    from statequery.backends import checksums, sst

    kind = draw(st.sampled_from([checksums.CRC32C, checksums.XXHASH, checksums.XXHASH64,
                                 checksums.XXH3]), label="checksum type")
    fn = checksums.checksum_function(kind)
    assert fn is not None
    base = draw(st.sampled_from([0, 0, 0x5A5A1234]), label="base context")
    out = bytearray()
    handles = []
    for _ in range(draw(st.integers(1, 4), label="blocks")):
        data = _block(draw)
        compression = draw(st.sampled_from([0, 0, 0, 1, 1, 7, 9]), label="compression")
        if compression == 1:
            data = bytes(cramjam.snappy.compress_raw(data))
        elif compression == 7:
            # a varint32 uncompressed size, then the zstd frame (format_version >= 2)
            data = sst._encode_handle(sst.BlockHandle(len(data), 0))[:-1] + bytes(
                cramjam.zstd.compress(data))
        offset = len(out)
        body = data + bytes([compression])
        stored = (fn(body, len(body)) + checksums.context_modifier(base, offset)) & 0xFFFFFFFF
        block = bytearray(body + struct.pack("<I", stored))
        how = draw(st.sampled_from(["none"] * 6 + ["xor", "xor-resum", "cut", "size"]),
                   label="mutation")
        size = len(data)
        if how in ("xor", "xor-resum") and block:
            pos = draw(st.integers(0, len(block) - 1), label="position")
            block[pos] ^= draw(st.integers(1, 255), label="xor")
            if how == "xor-resum" and pos < len(body):
                n = len(body)
                block[n:] = struct.pack("<I", (fn(bytes(block), n) + checksums.context_modifier(
                    base, offset)) & 0xFFFFFFFF)
        elif how == "cut":
            block = block[: draw(st.integers(0, len(block)), label="cut")]
        elif how == "size":
            size = draw(st.sampled_from([size + 1, size + 100, 2**40, 2**64 - 1]), label="size")
        out += block
        handles.append((b"k", sst.BlockHandle(offset, size)))
    with open(path, "wb") as f:
        f.write(out)
    table = object.__new__(sst.SstFile)
    table.path = table.source = path
    table._f = open(path, "rb")
    table.size = len(out)
    table.checksum_type = kind
    table._checksum = fn
    table._base_context = base
    table._footer_start = len(out)
    table._index = handles
    table._top_index = None
    table.meta_blocks = {}
    table._global_seqno = None
    return table, handles


def _verdict(check: Callable[[], None]) -> Any:
    """None, or the typed error's class and message (anything else propagates)."""
    from statequery.exceptions import StatequeryError

    try:
        check()
    except StatequeryError as e:
        return type(e).__name__, str(e)
    return None


@SETTINGS
@given(data=st.data())
def test_block_prechecks_agree(data: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """``SstFile.check_blocks`` (the check before RocksDB opens a table) on generated,
    truncated and mutated blocks: the compiled call per table (``_sst.check_data_blocks``)
    and the pure loop over ``read_block`` pass the same blocks and raise the same typed error
    with the same message."""
    from statequery.backends import sst

    _check_built()
    assert sst.compiled_module() is not None
    path = str(tmp_path_factory.mktemp("precheck") / "table.sst")
    table, _ = _table_file(data.draw, path)
    try:
        pure, fast = _both(lambda: _verdict(table.check_blocks))  # type: ignore[arg-type,return-value]
    finally:
        table.close()
        os.unlink(path)
    assert pure == fast, (pure, fast)


def test_block_prechecks_agree_on_real_tables() -> None:
    """Every table of a few real RocksDB fixtures (snappy, uncompressed, format_version 6
    contexts where present) passes the pre-check on both paths, and each restart-array check
    of a real data block equals ``_Block``'s."""
    from statequery.backends import _sst, sst

    _check_built()
    seen = 0
    for name in ("datastream-rocksdb-native", "sql-rocksdb-native",
                 "datastream-rocksdb-incremental-checkpoint"):
        for path in sorted(fixture_dir(name).rglob("*")):
            if not path.is_file() or not path.name[:1].isalnum():
                continue
            with open(path, "rb") as f:
                f.seek(-8, os.SEEK_END) if path.stat().st_size >= 8 else None
                magic = f.read(8)
            if int.from_bytes(magic, "little") not in (sst.BLOCK_BASED_MAGIC, sst.LEGACY_MAGIC):
                continue
            with sst.SstFile(str(path)) as t:
                assert _both(lambda: _verdict(t.check_blocks)) == (None, None)  # type: ignore[arg-type,return-value]
                for _, h in t.data_block_handles():
                    block = t.read_block(h)
                    assert _sst.check_block(block.data, t.source, h.offset) == block.limit
                    seen += 1
    assert seen > 10


def _varint_bytes(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _index_block(draw: Any, first_keys: bool) -> bytes:
    """An index block with delta-encoded values (RocksDB's ``IndexBlockIter`` format: a full
    handle at restart points, a zig-zag size delta otherwise), then its restart array."""
    prefix = draw(st.binary(min_size=1, max_size=4), label="common prefix")
    keys = sorted({prefix + k for k in draw(st.lists(st.binary(max_size=8), min_size=1,
                                                     max_size=8), label="keys")})
    interval = draw(st.sampled_from([1, 2, 2, 3, 16]), label="restart interval")
    offset = draw(st.sampled_from([0, 0, 7, 2**40, 2**62 - 10, 2**63 + 5]), label="first offset")
    body = bytearray()
    restarts = []
    prev_key = b""
    prev_size = 0
    for i, key in enumerate(keys):
        size = draw(st.sampled_from([0, 1, 4096, 4100, 70000, 2**62 + 1]), label="size")
        shared = 0
        if i % interval:  # not a restart point: a shared prefix (none: a full handle)
            while shared < min(len(key), len(prev_key)) and key[shared] == prev_key[shared]:
                shared += 1
        restart = shared == 0
        if i % interval == 0:
            restarts.append(len(body))
        body += _varint_bytes(shared) + _varint_bytes(len(key) - shared) + key[shared:]
        if restart:
            body += _varint_bytes(offset) + _varint_bytes(size)
        else:
            d = size - prev_size
            body += _varint_bytes((d << 1) ^ (d >> 63) if abs(d) < 2**62 else 2 * abs(d))
        if first_keys:
            first = draw(st.binary(max_size=6), label="first key")
            body += _varint_bytes(len(first)) + first
        offset += size + 5
        prev_key, prev_size = key, size
    if not restarts:
        restarts = [0]
    return bytes(body) + struct.pack(f"<{len(restarts)}I", *restarts) + struct.pack(
        "<I", len(restarts))


def _index_outcome(data: bytes, first_keys: bool) -> Any:
    from statequery.backends import sst

    def read() -> Any:
        block = sst._Block(data, "index.sst", 1000, delta_values=True, first_keys=first_keys)
        return [(k, h.offset, h.size) for k, h in block.all_handles()]

    try:
        return read()
    except CorruptStateError as e:
        return type(e).__name__, str(e)


@SETTINGS
@given(data=st.data())
def test_index_walks_agree(data: Any) -> None:
    """The index block walk of ``SstFile.data_block_handles`` on generated, truncated and
    mutated delta-encoded index blocks (with and without first keys, 10-byte varints, offsets
    and sizes past 2**62): the compiled walk (``_sst.index_handles``) and the pure one return
    the same handles or raise the same typed error with the same message."""
    from statequery.backends import sst

    _check_built()
    assert sst.compiled_module() is not None
    first_keys = data.draw(st.booleans(), label="first keys")
    block = _index_block(data.draw, first_keys)
    how = data.draw(st.sampled_from(["none", "none", "mutate", "varint"]), label="how")
    if how == "mutate":
        block = _mutate(data.draw, block, 0)
    elif how == "varint" and block:
        pos = data.draw(st.integers(0, len(block) - 1), label="position")
        big = data.draw(st.sampled_from(["ffffffffffffffffff01", "ffffffffffffffff7f", "80",
                                         "ffffffff0f"]), label="varint")
        block = block[:pos] + bytes.fromhex(big) + block[pos + 1 :]
    pure, fast = _both(lambda: _index_outcome(block, first_keys))  # type: ignore[arg-type,return-value]
    assert pure == fast, (pure, fast)


@SETTINGS
@given(data=st.data())
def test_data_block_handles_in_one_compiled_call_agree(data: Any) -> None:
    """``SstFile.data_block_handles`` of a single-level index walks, strips (``key[:-8]``) and
    checks (each block inside the data) in one compiled call (``_sst.index_handles`` with
    ``strip`` and ``data_end``): on generated, mutated and varint-forged index blocks, a list
    it returns is what the pure walk, strip and check give; it returns None (the pure steps
    then raise) whenever a handle lies past the data."""
    from statequery.backends import _sst, sst

    _check_built()
    first_keys = data.draw(st.booleans(), label="first keys")
    block = _index_block(data.draw, first_keys)
    if data.draw(st.booleans(), label="mutate"):
        block = _mutate(data.draw, block, 0)
    data_end = data.draw(st.sampled_from([0, 5, 4101, 70000, 200000, 2**62, 2**63 - 1]),
                         label="data end")
    strip = data.draw(st.booleans(), label="strip")
    saved = os.environ.get(fastpath.PURE_ENV)
    os.environ[fastpath.PURE_ENV] = "1"
    try:
        b = sst._Block(block, "index.sst", 1000, delta_values=True, first_keys=first_keys)
        pure: Any = [(k[:-8] if strip else k, h) for k, h in b.all_handles()]
        if any(h.offset + h.size + 5 > data_end for _, h in pure):
            pure = "past the data"
    except CorruptStateError as e:
        pure = type(e).__name__
    finally:
        if saved is None:
            os.environ.pop(fastpath.PURE_ENV, None)
        else:
            os.environ[fastpath.PURE_ENV] = saved
    try:
        b = sst._Block(block, "index.sst", 1000, delta_values=True, first_keys=first_keys)
    except CorruptStateError:
        return  # the block's restart array: refused before any walk, on both paths
    fast = _sst.index_handles(b.data, b.restarts[0] if b.restarts else b.limit, b.limit,
                              first_keys, sst.BlockHandle, strip, data_end)
    if fast is not None:
        assert isinstance(pure, list), pure
        assert [(k, h.offset, h.size) for k, h in fast] == [(k, h.offset, h.size)
                                                             for k, h in pure]
    if pure == "past the data":
        assert fast is None


def test_index_handles_are_left_out_of_the_cycle_collector() -> None:
    """A table's data block handles (tens of thousands per large table, kept while the DB is
    open) cannot form reference cycles: the compiled walk leaves them and their entries
    untracked, so the collector's full passes do not traverse them."""
    import gc

    from statequery.backends import _sst, sst

    _check_built()
    import random

    rnd = random.Random(5)
    keys = sorted({rnd.randbytes(12) for _ in range(200)})
    body = bytearray()
    restarts = []
    offset = 0
    for i, key in enumerate(keys):
        if i % 16 == 0:
            restarts.append(len(body))
        body += _varint_bytes(0) + _varint_bytes(len(key)) + key
        body += _varint_bytes(offset) + _varint_bytes(4000 + i)
        offset += 4005 + i
    block = bytes(body) + struct.pack(f"<{len(restarts)}I", *restarts) + struct.pack(
        "<I", len(restarts))
    b = sst._Block(block, "index.sst", 0, delta_values=True)
    out = _sst.index_handles(b.data, 0, b.limit, False, sst.BlockHandle, True, offset)
    assert out is not None and len(out) == len(keys)
    assert [(k, h) for k, h in out] == [(k[:-8], h) for k, h in b.all_handles()]
    assert not any(gc.is_tracked(e) or gc.is_tracked(e[1]) for e in out)
