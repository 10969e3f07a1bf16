"""The Arrow types the Spark data source hands Spark: every column a real state read gives must
cast to the schema it reports (no JVM needed: this is the conversion Spark's Python worker runs)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from conftest import fixture_dir

import statequery
from statequery.spark import spark_arrow_schema
from statequery.spark.arrowtypes import _cast, _to_spark_struct


@pytest.mark.parametrize("name", ["keys-sql-hashmap-native", "edge-sql-rocksdb-native",
                                  "sql-cep-hashmap-native", "types-avro-rocksdb-native"])
def test_every_keyed_state_casts_to_what_spark_takes(name: str) -> None:
    """A SQL ``TIME`` field (``time32[ms]``, inside the composite key struct of
    ``GroupAggregate[20]``) failed the cast to int64; it is the int32 milliseconds of the day."""
    sp = statequery.open(str(fixture_dir(name)))
    times = 0
    for s in sp.states:
        if not s.keyed_rows:
            continue
        table = sp.read(s)
        schema = spark_arrow_schema(table.schema)
        _to_spark_struct(schema)  # Spark accepts the schema
        for batch in table.to_batches():
            cast = _cast(batch, schema)
            assert cast.num_rows == batch.num_rows
        if "time32" in str(table.schema):
            times += 1
            before = table.to_pylist()
            after = pa.Table.from_batches([_cast(b, schema) for b in table.to_batches()],
                                          schema=schema).to_pylist()
            assert len(before) == len(after)
    if name.startswith("keys-sql"):
        assert times >= 1  # the TIME key of GroupAggregate[20]


def test_time_is_its_milliseconds_of_the_day() -> None:
    schema = pa.schema([("t", pa.struct([("f3", pa.time32("ms"))]))])
    batch = pa.RecordBatch.from_pylist([{"t": {"f3": 3_600_000}}, {"t": {"f3": None}}],
                                       schema=schema)
    got = _cast(batch, spark_arrow_schema(schema))
    assert got.schema.field("t").type == pa.struct([("f3", pa.int32())])
    assert got.to_pylist() == [{"t": {"f3": 3_600_000}}, {"t": {"f3": None}}]


def test_row_kinds_and_accumulator_names_reach_spark() -> None:
    """A SQL operator's rows keep their ``row_kind`` field, and accumulators named from the plan
    (``avg_amount.sum``: a dot in a field name) keep their names, in what Spark is handed."""
    from conftest import FIXTURES

    sp = statequery.open(str(fixture_dir("sql-ops-hashmap-native")))
    mat = next(o for o in sp.operators if o.name.startswith("SinkMaterializer"))
    table = sp.read(mat.operator_id, "values")
    schema = spark_arrow_schema(table.schema)
    _to_spark_struct(schema)
    rows = pa.Table.from_batches([_cast(b, schema) for b in table.to_batches()],
                                 schema=schema).to_pylist()
    assert {r["row_kind"] for row in rows for r in row["value"]} == {"+U"}
    sp = statequery.open(str(fixture_dir("sql-aggs-hashmap-canonical")),
                         plan=str(FIXTURES / "plans" / "sql-aggs.json"))
    agg = next(o for o in sp.operators if o.name == "GroupAggregate[6]")
    table = sp.read(agg.operator_id, "accState", key={"category": "books"})
    schema = spark_arrow_schema(table.schema)
    struct = _to_spark_struct(schema)
    assert "avg_amount.sum" in str(struct)
    row = pa.Table.from_batches([_cast(b, schema) for b in table.to_batches()],
                                schema=schema).to_pylist()[0]
    assert (row["value"]["avg_amount.sum"], row["value"]["avg_amount.count"]) == (997, 20)
