"""Arrow types of serializer specs, the state schemas, and values converting to them."""

from __future__ import annotations

import pickle
import subprocess
import sys
from decimal import Decimal

import pyarrow as pa
from support.flinkenc import row_state

from statequery.arrow.batches import BatchBuilder
from statequery.arrow.schemas import state_schema
from statequery.arrow.types import arrow_type, sql_arrow_type
from statequery.serializers.spec import (
    EitherSpec,
    EnumSpec,
    ListSpec,
    MapSpec,
    NamespaceSpec,
    PojoField,
    PojoSpec,
    PrimitiveArraySpec,
    PrimitiveSpec,
    RowDataSpec,
    SqlField,
    SqlType,
    TupleSpec,
)

S = PrimitiveSpec(name="string")
L = PrimitiveSpec(name="long")


def test_datastream_types() -> None:
    assert arrow_type(L) == pa.int64()
    assert arrow_type(PrimitiveSpec(name="bigdec")) == pa.string()
    assert arrow_type(PrimitiveSpec(name="decimal_data", precision=30, scale=6)) == pa.decimal128(
        30, 6
    )
    assert arrow_type(PrimitiveSpec(name="timestamp_data", precision=9)) == pa.string()  # text
    assert arrow_type(PrimitiveSpec(name="instant")) == pa.timestamp("ns", tz="UTC")
    assert arrow_type(EnumSpec(constants=("A",))) == pa.string()
    assert arrow_type(PrimitiveArraySpec(element="byte")) == pa.binary()
    assert arrow_type(TupleSpec(fields=(L, S))) == pa.struct(
        [("f0", pa.int64()), ("f1", pa.string())]
    )
    assert arrow_type(MapSpec(key=S, value=L)) == pa.map_(pa.string(), pa.int64())
    assert arrow_type(EitherSpec(left=S, right=L)).names == ["left", "right"]
    assert arrow_type(NamespaceSpec(name="void")) == pa.null()


def test_sql_types() -> None:
    t = SqlType(
        "ROW",
        fields=(
            SqlField("a", SqlType("TIMESTAMP_WITH_LOCAL_TIME_ZONE", precision=3)),
            SqlField("b", SqlType("MULTISET", element=SqlType("VARCHAR"))),
            SqlField("c", SqlType("TIME_WITHOUT_TIME_ZONE")),
            SqlField("d", SqlType("DATE")),
            SqlField("e", SqlType("ARRAY", element=SqlType("DECIMAL", precision=5, scale=1))),
        ),
    )
    assert sql_arrow_type(t) == pa.struct(
        [
            ("a", pa.timestamp("ms", tz="UTC")),
            ("b", pa.map_(pa.string(), pa.int32())),
            ("c", pa.time32("ms")),
            ("d", pa.date32()),
            ("e", pa.list_(pa.decimal128(5, 1))),
        ]
    )
    assert arrow_type(RowDataSpec(type=t)) == sql_arrow_type(t)


def test_reader_values_convert_to_their_arrow_types() -> None:
    pojo = PojoSpec(
        class_name="P",
        fields=(PojoField("n", "P", S), PojoField("tier", "P", EnumSpec(constants=("A",)))),
    )
    layout = row_state(
        "x",
        "value",
        key=S,
        namespace=NamespaceSpec(name="time_window"),
        value=pojo,
        state_value=pojo,
    )
    b = BatchBuilder(state_schema(layout), layout)
    for col, v in (
        ("key_group", 1),
        ("key", "k"),
        ("namespace", {"start": 0, "end": 10}),
        ("value", {"n": None, "tier": "A"}),
    ):
        b.appender(col)(v)
    batch = b.flush()
    assert batch is not None and batch.num_rows == 1
    dec = PrimitiveSpec(name="decimal_data", precision=4, scale=2)
    layout = row_state(
        "d",
        "list",
        key=S,
        namespace=NamespaceSpec(name="void"),
        value=dec,
        state_value=ListSpec(element=dec),
    )
    b = BatchBuilder(state_schema(layout), layout)
    for col, v in (
        ("key_group", 1),
        ("key", "k"),
        ("namespace", None),
        ("value", [Decimal("12.50")]),
    ):
        b.appender(col)(v)
    assert b.flush().column("value").to_pylist() == [[Decimal("12.50")]]  # type: ignore[union-attr]


def test_layouts_pickle_and_decode_in_a_fresh_process() -> None:
    """Spark ships layouts (frozen specs) to executors, which build their readers there."""
    layout = row_state(
        "v", "value", key=S, namespace=NamespaceSpec(name="void"), value=L, state_value=L
    )
    blob = pickle.dumps(layout)
    code = (
        "import pickle, sys, struct\n"
        "from statequery.arrow.batches import BatchBuilder\n"
        "from statequery.arrow.schemas import state_schema\n"
        "from statequery.backends.keygroups import CompositeEntryDecoder\n"
        "layout = pickle.loads(sys.stdin.buffer.read())\n"
        "b = BatchBuilder(state_schema(layout), layout)\n"
        "d = CompositeEntryDecoder(layout, None, b)\n"
        "buf = b'\\x02k\\x00' + struct.pack('>q', 9)\n"
        "d.on_entry(buf, 0, 3, 3, 11, 3)\n"
        "print(b.flush().to_pylist())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, check=True)
    assert (
        out.stdout.decode().strip()
        == "[{'key_group': 3, 'key': 'k', 'namespace': None, 'value': 9}]"
    )
