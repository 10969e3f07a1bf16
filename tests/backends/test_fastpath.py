"""The compiled decode path (statequery/backends/_read.pyx) against the pure-Python reference:
identical tables for every state of every fixture, in every read mode."""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
import pytest
from conftest import fixture_dir, fixture_names
from support.entries import same_table

import statequery
from statequery.arrow.schemas import state_schema
from statequery.backends import fastpath, keygroups
from statequery.io import FileIO
from statequery.reader import list_states, read_table

FIXTURES = fixture_names()


def _modes(kind: str) -> list[str | None]:
    return {"list": [None, "flat"], "map": [None, "nested"]}.get(kind, [None])


def _tables(name: str, pure: bool, monkeypatch: pytest.MonkeyPatch) -> dict[Any, Any]:
    if pure:
        monkeypatch.setenv(fastpath.PURE_ENV, "1")
    else:
        monkeypatch.delenv(fastpath.PURE_ENV, raising=False)
    sp = statequery.open(str(fixture_dir(name)), io=FileIO(), use_snapshot=False)
    out: dict[Any, Any] = {}
    for op in sp.metadata.operators:
        for ref in list_states(sp, op):
            for mode in _modes(ref.kind):
                k = (op.operator_id, ref.name, mode)
                try:
                    out[k] = read_table(sp, op, ref.name, mode=mode)
                except statequery.StatequeryError as e:
                    out[k] = f"{type(e).__name__}: {e}"
    return out


def test_compiled_path_is_built() -> None:
    """``pip install`` builds the extension here (gcc and Cython are present); a machine without
    a compiler sets STATEQUERY_NO_EXTENSIONS, as for the build itself."""
    if os.environ.get("STATEQUERY_NO_EXTENSIONS"):
        assert keygroups.key_group_scanner().__module__ == "statequery.backends.keygroups"
        return
    assert fastpath.compiled() is not None, "statequery.backends._read was not built"


@pytest.mark.parametrize("name", FIXTURES)
def test_compiled_and_pure_tables_are_identical(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pure = _tables(name, True, monkeypatch)
    fast = _tables(name, False, monkeypatch)
    assert pure.keys() == fast.keys()
    for k, want in pure.items():
        got = fast[k]
        if isinstance(want, str) or isinstance(got, str):
            assert got == want, k
            continue
        assert got.schema == want.schema, k
        assert same_table(got, want), (k, got.slice(0, 5).to_pylist(), want.slice(0, 5).to_pylist())


def test_compiled_path_covers_the_common_shapes() -> None:
    """The fixtures' value, list, map and timer states of primitives and strings go through the
    compiled sinks (not silently through the fallback)."""
    if fastpath.compiled() is None:
        assert os.environ.get("STATEQUERY_NO_EXTENSIONS"), "compiled path not built"
        return
    want = {"value", "list/rows", "list/flat", "map/rows", "timer"}

    def shapes(covered: set[str]) -> set[str]:
        return {c if c in ("timer", "list/rows", "list/flat", "map/rows") else c.split("/")[0]
                for c in covered}

    covered: set[str] = set()
    for name in FIXTURES:
        sp = statequery.open(str(fixture_dir(name)), io=FileIO(), use_snapshot=False)
        for op in sp.metadata.operators:
            for ref in list_states(sp, op):
                layout = ref
                if not layout.keyed:
                    continue
                for mode in _modes(layout.kind):
                    m = "rows" if mode is None else mode
                    schema = state_schema(layout, mode)
                    if fastpath.entry_sink(layout, m, schema) is not None:
                        covered.add("timer" if layout.is_timer else f"{layout.kind}/{m}")
        if want <= shapes(covered):  # every shape seen: the other fixtures cannot change that
            break
    assert want <= shapes(covered), covered


def test_arrow_arrays_are_built_without_python_values() -> None:
    """A sink's columns come out as Arrow arrays over its own buffers."""
    mod = fastpath.compiled()
    if mod is None:
        assert os.environ.get("STATEQUERY_NO_EXTENSIONS"), "compiled path not built"
        return
    sink = mod.EntrySink(mod.K_VALUE, mod.T_STRING, mod.T_LONG)
    # key "é€😀" as StringValue (length+1, then UTF-16 units as varints), VoidNamespace 0
    units = "é€😀".encode("utf-16-be")
    key = bytearray([len(units) // 2 + 1])
    for i in range(0, len(units), 2):
        c = (units[i] << 8) | units[i + 1]
        while c >= 0x80:
            key.append((c & 0x7F) | 0x80)
            c >>= 7
        key.append(c)
    buf = bytes(key) + b"\x00" + (42).to_bytes(8, "big")
    sink(buf, 0, len(key) + 1, len(key) + 1, len(buf), 7)
    schema = pa.schema(
        [
            ("key_group", pa.int32()),
            ("key", pa.string()),
            ("namespace", pa.null()),
            ("value", pa.int64()),
        ]
    )
    arrays = sink.arrays(schema)
    assert arrays["key"].to_pylist() == ["é€😀"]
    assert arrays["value"].to_pylist() == [42]
    assert arrays["key_group"].to_pylist() == [7]
    assert len(sink) == 0


@pytest.mark.parametrize("name", ["datastream-hashmap-canonical", "datastream-rocksdb-native"])
def test_reads_of_several_keys_are_identical(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several keys: rows are kept by the key column the compiled sink filled (no Python list)."""
    from statequery.scan import read_table as read_keys

    sp = statequery.open(str(fixture_dir(name)))
    for state in ("count", "recent-categories", "amount-by-category"):
        info = sp.state("user-state", state)
        got = {}
        for pure in (True, False):
            if pure:
                monkeypatch.setenv(fastpath.PURE_ENV, "1")
            else:
                monkeypatch.delenv(fastpath.PURE_ENV, raising=False)
            keys = ["user-3", "user-5", "user-11"]
            got[pure] = read_keys(sp.model, sp.context, info, keys=keys).to_pylist()
        assert got[True] == got[False]
        assert {r["key"] for r in got[False]} == {"user-3", "user-5", "user-11"}


def _sink_for(name: str, state: str, mode: str = "rows") -> Any:
    sp = statequery.open(str(fixture_dir(name)), io=FileIO(), use_snapshot=False)
    for op in sp.metadata.operators:
        for ref in list_states(sp, op):
            if ref.name == state:
                layout = ref
                return fastpath.entry_sink(layout, mode, state_schema(layout, mode))
    raise AssertionError(f"{name} has no state {state}")


# real fixture states of the shapes compiled since issue 13 (item 3), and some it leaves to the
# pure-Python handlers
_COMPILED = [
    ("datastream-hashmap-canonical", "window-contents", "rows"),  # TimeWindow namespace
    ("datastream-hashmap-canonical", "_timer_state/event_window-timers", "rows"),
    ("datastream-hashmap-canonical", "profile", "rows"),  # POJO: nested POJO, enum
    ("datastream-hashmap-canonical", "avg-amount", "rows"),  # Tuple2 accumulator
    ("ttl-kryo-hashmap-canonical", "ttl-count", "rows"),  # TTL value
    ("ttl-kryo-hashmap-canonical", "ttl-list", "rows"),  # TTL list
    ("ttl-kryo-hashmap-canonical", "ttl-list", "flat"),
    ("ttl-kryo-hashmap-canonical", "ttl-map", "rows"),  # TTL map
    ("sql-hashmap-canonical", "distinctAcc_0", "rows"),  # RowData key
    ("sql-ops-rocksdb-native", "window-aggs", "rows"),  # long / TimeWindow namespace, RowData
    ("sql-ops-rocksdb-native", "session-window-mapping", "rows"),  # TimeWindow user key/value
    ("sql-ops-rocksdb-native", "left-records", "rows"),  # Tuple2<RowData, int>, RowData keys
    ("sql-ops-rocksdb-native", "agg1$list", "flat"),  # StringData elements
    # RowData with DECIMAL(12, 2), DECIMAL(30, 6), TIMESTAMP(6), strings past 7 bytes and a
    # NullSerializer RAW field (MapView placeholder)
    ("sql-hashmap-canonical", "accState", "rows"),
    ("sql-ops-rocksdb-native", "values", "rows"),  # a list of rows inside the value
    ("sql-ops-rocksdb-native", "IntervalJoinLeftCache", "rows"),  # List<Tuple2<RowData, bool>>
    ("sql-ops-rocksdb-native", "window_rank", "rows"),  # long namespace, List<RowData>
    ("datastream-hashmap-canonical", "amount-by-category", "nested"),  # one map per key
    ("ttl-kryo-hashmap-canonical", "ttl-map", "nested"),  # map<user key, TtlValue>
    ("sql-ops-rocksdb-native", "left-records", "nested"),
    ("sql-ops-rocksdb-native", "agg5$orderToValueMap", "rows"),  # SQL ARRAY values
    ("sql-ops-rocksdb-native", "agg5$valueToOrderMap", "nested"),
]
_PURE_ONLY = [
    ("sql-ops-rocksdb-native", "sharedBuffer-events", "rows"),  # CEP serializers: unknown
    ("ttl-kryo-hashmap-canonical", "kryo-value", "rows"),  # Kryo: raw bytes
    ("ttl-kryo-hashmap-canonical", "kryo-map", "nested"),
]


@pytest.mark.parametrize(("name", "state", "mode"), _COMPILED + _PURE_ONLY)
def test_compiled_shapes_of_real_fixtures(name: str, state: str, mode: str) -> None:
    if fastpath.compiled() is None:
        assert os.environ.get("STATEQUERY_NO_EXTENSIONS"), "compiled path not built"
        return
    sink = _sink_for(name, state, mode)
    assert (sink is not None) == ((name, state, mode) in _COMPILED)


@pytest.mark.parametrize(
    "name",
    [
        "datastream-hashmap-canonical",
        "ttl-kryo-hashmap-canonical",
        "sql-ops-rocksdb-native",
        "sql-ops-hashmap-native",  # the heap format: HeapBlockDecoder walks with the sinks
        "datastream-hashmap-checkpoint-snappy",
    ],
)
def test_reads_take_the_compiled_sinks(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full read on the compiled path attaches a sink for the windowed, POJO, tuple, TTL and
    RowData states (so the identity test above cannot pass by falling back)."""
    if fastpath.compiled() is None:
        assert os.environ.get("STATEQUERY_NO_EXTENSIONS"), "compiled path not built"
        return
    from statequery.arrow.batches import BatchBuilder

    monkeypatch.delenv(fastpath.PURE_ENV, raising=False)
    attached: set[str] = set()
    attach = BatchBuilder.attach

    def spy(self: BatchBuilder, sink: Any) -> Any:
        attached.add(self._state())
        return attach(self, sink)

    monkeypatch.setattr(BatchBuilder, "attach", spy)
    sp = statequery.open(str(fixture_dir(name)), io=FileIO(), use_snapshot=False)
    rows = 0
    for op in sp.metadata.operators:
        for ref in list_states(sp, op):
            if ref.keyed_rows:
                rows += read_table(sp, op, ref.name).num_rows
    assert rows > 0
    want = {
        "datastream-hashmap-canonical": {"window-contents", "profile", "avg-amount",
                                         "_timer_state/event_window-timers"},
        "ttl-kryo-hashmap-canonical": {"ttl-count", "ttl-list", "ttl-map"},
        "sql-ops-rocksdb-native": {"window-aggs", "session-window-mapping", "left-records",
                                   "deduplicate-state", "accState",
                                   "_timer_state/event_window-timers"},
        "sql-ops-hashmap-native": {"window-aggs", "session-window-mapping", "left-records",
                                   "deduplicate-state", "accState", "agg1$list",
                                   "_timer_state/event_window-timers"},
        "datastream-hashmap-checkpoint-snappy": {"window-contents", "profile", "avg-amount",
                                                 "count", "recent-categories",
                                                 "amount-by-category",
                                                 "_timer_state/event_window-timers"},
    }[name]
    assert want <= attached, attached


# -- null markers, checked against the pure-Python readers -----------------------------------


def _string_value(s: str | None) -> bytes:
    """``StringValue.writeString``."""
    if s is None:
        return b"\x00"
    units = s.encode("utf-16-be")
    out = bytearray()
    for c in [len(units) // 2 + 1] + [
        (units[i] << 8) | units[i + 1] for i in range(0, len(units), 2)
    ]:
        while c >= 0x80:
            out.append((c & 0x7F) | 0x80)
            c >>= 7
        out.append(c)
    return bytes(out)


def _binary_row(fields: list[Any]) -> bytes:
    """A BinaryRowData with its int32 size: int fields in their slot (BIGINT, compact DECIMAL),
    str (VARCHAR) inline or in the variable part, bytes in the variable part, None null."""
    import struct

    n = len(fields)
    null_bytes = ((n + 63 + 8) // 64) * 8
    head = bytearray(null_bytes + 8 * n)
    var = bytearray()
    for i, v in enumerate(fields):
        slot = null_bytes + 8 * i
        if v is None:
            head[(i + 8) >> 3] |= 1 << ((i + 8) & 7)
        elif isinstance(v, int):
            head[slot : slot + 8] = struct.pack("<q", v)
        else:
            b = v if isinstance(v, bytes) else v.encode("utf-8")
            if isinstance(v, str) and len(b) <= 7:
                head[slot : slot + len(b)] = b
                head[slot + 7] = 0x80 | len(b)
            else:
                off = len(head) + len(var)
                head[slot : slot + 8] = struct.pack("<Q", (off << 32) | len(b))
                var += b + b"\x00" * (-len(b) % 8)
    row = bytes(head + var)
    return struct.pack(">i", len(row)) + row


def _binary_array(values: list[int | None]) -> bytes:
    """A BinaryArrayData of BIGINT elements (int32 n, null bits, 8-byte slots)."""
    import struct

    n = len(values)
    nulls = bytearray(((n + 31) // 32) * 4)
    slots = b""
    for i, v in enumerate(values):
        if v is None:
            nulls[i >> 3] |= 1 << (i & 7)
        slots += struct.pack("<q", v or 0)
    return struct.pack("<i", n) + bytes(nulls) + slots


def test_null_markers_match_the_pure_readers() -> None:
    """POJO null values and null fields, Row null masks, BinaryRowData null fields and strings
    past the inline limit, null and empty lists and SQL arrays, null array elements, negative
    decimals, TTL map entries with a null
    value: compiled columns equal the pure readers' values."""
    mod = fastpath.compiled()
    if mod is None:
        assert os.environ.get("STATEQUERY_NO_EXTENSIONS"), "compiled path not built"
        return
    import struct

    from statequery.arrow.types import arrow_type
    from statequery.serializers.readers import reader_for
    from statequery.serializers.spec import (
        EnumSpec,
        ListSpec,
        PojoField,
        PojoSpec,
        PrimitiveSpec,
        RowDataSpec,
        RowSpec,
        SqlField,
        SqlType,
        TupleSpec,
    )

    long_, string = PrimitiveSpec(name="long"), PrimitiveSpec(name="string")
    inner = PojoSpec(class_name="A", fields=(PojoField("city", "A", string),))
    pojo = PojoSpec(
        class_name="P",
        fields=(
            PojoField("address", "P", inner),
            PojoField("n", "P", long_),
            PojoField("tier", "P", EnumSpec(class_name="T", constants=("GOLD", "SILVER"))),
        ),
    )
    row = RowSpec(fields=(long_, string, TupleSpec(fields=(long_, string))))
    row_data = RowDataSpec(
        type=SqlType("ROW", fields=(SqlField("a", SqlType("BIGINT")),
                                    SqlField("b", SqlType("VARCHAR", length=2147483647))))
    )

    with_list = PojoSpec(class_name="L", fields=(PojoField("xs", "L", ListSpec(element=long_)),))
    arrays = RowDataSpec(
        type=SqlType("ROW", fields=(SqlField("xs", SqlType("ARRAY", element=SqlType("BIGINT"))),))
    )
    decimals = RowDataSpec(
        type=SqlType("ROW", fields=(SqlField("a", SqlType("DECIMAL", precision=10, scale=2)),
                                    SqlField("b", SqlType("DECIMAL", precision=30, scale=3))))
    )

    def pojo_bytes(address: str | None | bool, n: int | None, tier: int | None) -> bytes:
        if address is False:
            return b"\x01"  # the whole POJO is null
        out = b"\x02"
        out += b"\x01" if address is None else b"\x00\x02\x00" + _string_value(address)
        out += b"\x01" if n is None else b"\x00" + struct.pack(">q", n)
        out += b"\x01" if tier is None else b"\x00" + struct.pack(">i", tier)
        return out

    def row_bytes(mask: int, *values: bytes) -> bytes:
        return bytes([mask]) + b"".join(values)

    cases = [
        (pojo, [pojo_bytes("x", 1, 0), pojo_bytes(None, None, 1), pojo_bytes(False, 0, 0),
                pojo_bytes("é", 2, None)]),
        (row, [row_bytes(0, struct.pack(">q", 5), _string_value("a"), struct.pack(">q", 1),
                         _string_value("b")),
               row_bytes(0x10 | 0x08, struct.pack(">q", 5)),  # fields 1 and 2 null
               row_bytes(0x40 | 0x20 | 0x08, _string_value("only"))]),  # a RowKind bit set,
        # fields 0 and 2 null
        (row_data, [_binary_row([1, "short"]), _binary_row([None, "a longer string €"]),
                    _binary_row([7, None])]),
        (with_list, [b"\x02\x00" + struct.pack(">iqq", 2, 5, -6), b"\x02\x01",
                     b"\x02\x00" + struct.pack(">i", 0), b"\x01"]),
        (arrays, [_binary_row([_binary_array([1, None, 3])]), _binary_row([_binary_array([])]),
                  _binary_row([None])]),
        (decimals, [_binary_row([-12345, (-(10**25)).to_bytes(16, "big", signed=True)]),
                    _binary_row([99_999_999, b"\x7f" + b"\xff" * 3]),
                    _binary_row([None, b""])]),
    ]
    for spec, values in cases:
        t = arrow_type(spec)
        col = fastpath._column(mod, spec, t)
        assert col is not None, spec
        sink = mod.EntrySink(mod.K_VALUE, mod.T_LONG, col)
        read = reader_for(spec).read_at
        want = []
        for v in values:
            key = struct.pack(">q", 1) + b"\x00"
            sink(key + v, 0, len(key), len(key), len(key) + len(v), 0)
            want.append(read(v, 0, len(v))[0])
        schema = pa.schema([("key_group", pa.int32()), ("key", pa.int64()),
                            ("namespace", pa.null()), ("value", t)])
        got = sink.arrays(schema)["value"]
        assert got.equals(pa.array(want, type=t)), (got.to_pylist(), want)

    # TTL map: a null value has a null last_access too
    sink = mod.EntrySink(mod.K_MAP, mod.T_LONG, mod.T_LONG, mod.T_STRING, None, True)
    key = struct.pack(">q", 3) + b"\x00" + _string_value("k")
    for v in (b"\x00" + struct.pack(">qq", 1_700_000_000_000, 42), b"\x01"):
        sink(key + v, 0, len(key), len(key), len(key) + len(v), 0)
    from statequery.arrow.types import EPOCH_MS

    schema = pa.schema([("key_group", pa.int32()), ("key", pa.int64()), ("namespace", pa.null()),
                        ("user_key", pa.string()), ("value", pa.int64()),
                        ("last_access", EPOCH_MS)])
    arrays = sink.arrays(schema)
    assert arrays["value"].to_pylist() == [42, None]
    assert arrays["last_access"].cast(pa.int64()).to_pylist() == [1_700_000_000_000, None]


def test_bad_struct_bytes_fail_on_both_paths() -> None:
    """Subclass and invalid POJO flags, enum indexes out of range, row null masks and
    BinaryRowData regions past the end: a DecodeError on both paths."""
    mod = fastpath.compiled()
    if mod is None:
        assert os.environ.get("STATEQUERY_NO_EXTENSIONS"), "compiled path not built"
        return
    import struct

    from statequery.arrow.types import arrow_type
    from statequery.decoder import DecodeError
    from statequery.serializers.readers import DECODE_ERRORS, reader_for
    from statequery.serializers.spec import (
        EnumSpec,
        PojoField,
        PojoSpec,
        PrimitiveSpec,
        RowDataSpec,
        RowSpec,
        SqlField,
        SqlType,
    )

    long_ = PrimitiveSpec(name="long")
    enum = EnumSpec(class_name="T", constants=("GOLD",))
    pojo = PojoSpec(class_name="P", fields=(PojoField("tier", "P", enum),))
    row_data = RowDataSpec(
        type=SqlType("ROW", fields=(SqlField("b", SqlType("VARCHAR", length=2147483647)),))
    )
    bad_region = bytearray(_binary_row(["a string past seven"]))
    bad_region[12] = 0x7F  # the first slot's length: now past the end of the row
    cases = [
        (pojo, b"\x04"),  # written as a subclass
        (pojo, b"\x00"),  # no flag set
        (pojo, b"\x02\x00" + struct.pack(">i", 1)),  # enum index 1 of 1 constant
        (RowSpec(fields=(long_, long_)), b""),  # no null mask
        (RowSpec(fields=(long_, long_)), b"\x00" + struct.pack(">q", 1)),  # second field missing
        (row_data, _binary_row(["x"])[:-1]),  # size prefix past the end
        (row_data, bytes(bad_region)),
        (RowDataSpec(type=SqlType("ROW", fields=(
            SqlField("a", SqlType("DECIMAL", precision=4, scale=2)),))), _binary_row([10_000])),
        (RowDataSpec(type=SqlType("ROW", fields=(  # 5 elements announced, 2 present
            SqlField("xs", SqlType("ARRAY", element=SqlType("BIGINT"))),))),
         _binary_row([struct.pack("<i", 5) + _binary_array([1, 2])[4:]])),
        (row_data, _binary_row([b"\xff".decode("latin-1")]).replace(b"\xc3\xbf", b"\xff\xbf")),
    ]
    for spec, v in cases:
        with pytest.raises(DECODE_ERRORS):  # the pure scan turns these into DecodeError
            value, p = reader_for(spec).read_at(v, 0, len(v))
            if p != len(v):
                raise DecodeError("short", p)
        sink = mod.EntrySink(mod.K_VALUE, mod.T_LONG, fastpath._column(mod, spec, arrow_type(spec)))
        key = struct.pack(">q", 1) + b"\x00"
        with pytest.raises(DecodeError):
            sink(key + v, 0, len(key), len(key), len(key) + len(v), 0)
