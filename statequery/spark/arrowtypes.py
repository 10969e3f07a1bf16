"""Arrow types Spark accepts: a statequery schema with the types Spark cannot take replaced by the
nearest ones it can, and record batches cast to it."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import StructType


def _spark_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz=t.tz)
    if pa.types.is_time32(t):
        # milliseconds (or seconds) of the day: Spark has no TIME type for data sources, and
        # Arrow casts time32 to int32 only (also inside structs, lists and maps)
        return pa.int32()
    if pa.types.is_time(t):
        return pa.int64()  # time64: micro- or nanoseconds of the day
    if pa.types.is_null(t):
        return pa.string()  # always null (VoidNamespace)
    if pa.types.is_dictionary(t):
        return _spark_type(t.value_type)
    if pa.types.is_uint8(t) or pa.types.is_uint16(t):
        return pa.int32()
    if pa.types.is_uint32(t) or pa.types.is_uint64(t):
        return pa.int64()
    if pa.types.is_decimal256(t):
        return pa.string()  # wider than Spark's DECIMAL(38)
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _spark_type(f.type), f.nullable) for f in t])
    if pa.types.is_map(t):
        return pa.map_(_spark_type(t.key_type), _spark_type(t.item_type))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_spark_type(t.value_type))
    return t


def spark_arrow_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the types Spark cannot take replaced by the nearest ones it can."""
    return pa.schema([pa.field(f.name, _spark_type(f.type), True) for f in schema])


def _to_spark_struct(schema: pa.Schema) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def _cast(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    if batch.schema.equals(schema):
        return batch
    columns = [col.cast(field.type) for col, field in zip(batch.columns, schema, strict=True)]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
