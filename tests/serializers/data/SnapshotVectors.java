// Test vectors for statequery, written by Flink 2.3.0 itself: serializer-snapshot bytes
// (TypeSerializerSnapshotSerializationUtil.writeSerializerSnapshot), Java hashCode / key groups
// (KeyGroupRangeAssignment.assignToKeyGroup) and BinaryRowData bytes (RowDataSerializer.toBinaryRow).
// Regenerate flink_vectors.jsonl (needs the fixture classes for the POJO vector):
//   CP="$(python -c 'import os,pyflink;print(os.path.dirname(pyflink.__file__))')/lib/*:examples/flink-jobs/build"
//   javac -cp "$CP" -d /tmp/v tests/serializers/data/SnapshotVectors.java
//   java -cp "$CP:/tmp/v" SnapshotVectors > tests/serializers/data/flink_vectors.jsonl
import org.apache.flink.api.common.serialization.SerializerConfigImpl;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.common.typeutils.TypeSerializer;
import org.apache.flink.api.common.typeutils.TypeSerializerSnapshotSerializationUtil;
import org.apache.flink.api.common.typeutils.base.*;
import org.apache.flink.api.common.typeutils.base.array.*;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.api.java.tuple.Tuple3;
import org.apache.flink.api.java.typeutils.RowTypeInfo;
import org.apache.flink.api.java.typeutils.runtime.EitherSerializer;
import org.apache.flink.api.java.typeutils.runtime.NullableSerializer;
import org.apache.flink.api.java.typeutils.runtime.ValueSerializer;
import org.apache.flink.api.java.typeutils.runtime.kryo.KryoSerializer;
import org.apache.flink.core.memory.DataOutputSerializer;
import org.apache.flink.runtime.state.ArrayListSerializer;
import org.apache.flink.runtime.state.JavaSerializer;
import org.apache.flink.runtime.state.KeyGroupRangeAssignment;
import org.apache.flink.runtime.state.VoidNamespaceSerializer;
import org.apache.flink.runtime.state.ttl.TtlStateFactory;
import org.apache.flink.streaming.api.operators.TimerSerializer;
import org.apache.flink.streaming.api.windowing.windows.GlobalWindow;
import org.apache.flink.streaming.api.windowing.windows.TimeWindow;
import org.apache.flink.table.api.DataTypes;
import org.apache.flink.table.data.*;
import org.apache.flink.table.data.binary.BinaryRowData;
import org.apache.flink.table.data.binary.BinarySegmentUtils;
import org.apache.flink.table.runtime.typeutils.*;
import org.apache.flink.table.types.logical.*;
import org.apache.flink.types.LongValue;
import org.apache.flink.types.Row;
import org.apache.flink.types.RowKind;

import java.math.BigDecimal;
import java.time.LocalDateTime;
import java.util.*;
import java.util.concurrent.TimeUnit;

/** Prints JSON lines of serializer-snapshot bytes and key hashes, as test vectors for statequery. */
public class SnapshotVectors {
    static String hex(byte[] b) {
        StringBuilder sb = new StringBuilder();
        for (byte x : b) sb.append(String.format("%02x", x));
        return sb.toString();
    }

    static void snap(String name, TypeSerializer<?> s) throws Exception {
        DataOutputSerializer out = new DataOutputSerializer(256);
        TypeSerializerSnapshotSerializationUtil.writeSerializerSnapshot(out, s.snapshotConfiguration());
        System.out.println("{\"kind\":\"snapshot\",\"name\":\"" + name + "\",\"hex\":\"" + hex(out.getCopyOfBuffer()) + "\"}");
    }

    static void hash(String name, Object key) {
        int h = key.hashCode();
        System.out.println("{\"kind\":\"hash\",\"name\":\"" + name + "\",\"hash\":" + h
                + ",\"kg128\":" + KeyGroupRangeAssignment.assignToKeyGroup(key, 128)
                + ",\"kg32768\":" + KeyGroupRangeAssignment.assignToKeyGroup(key, 32768) + "}");
    }

    static void row(String name, RowType type, GenericRowData r) {
        BinaryRowData b = new RowDataSerializer(type).toBinaryRow(r);
        byte[] bytes = BinarySegmentUtils.copyToBytes(b.getSegments(), b.getOffset(), b.getSizeInBytes());
        System.out.println("{\"kind\":\"row\",\"name\":\"" + name + "\",\"hex\":\"" + hex(bytes)
                + "\",\"hash\":" + b.hashCode()
                + ",\"kg128\":" + KeyGroupRangeAssignment.assignToKeyGroup(b, 128) + "}");
    }

    public static void main(String[] args) throws Exception {
        SerializerConfigImpl cfg = new SerializerConfigImpl();
        snap("long", LongSerializer.INSTANCE);
        snap("string", StringSerializer.INSTANCE);
        snap("int_array", IntPrimitiveArraySerializer.INSTANCE);
        snap("bytes", BytePrimitiveArraySerializer.INSTANCE);
        snap("string_array", StringArraySerializer.INSTANCE);
        snap("enum", new EnumSerializer<>(TimeUnit.class));
        snap("tuple2", Types.TUPLE(Types.LONG, Types.STRING).createSerializer(cfg));
        snap("row_named", new RowTypeInfo(new TypeInformation<?>[]{Types.INT, Types.STRING}, new String[]{"a", "b"}).createSerializer(cfg));
        snap("pojo", TypeInformation.of(Class.forName("statequery.fixtures.UserProfile")).createSerializer(cfg));
        snap("list", new ListSerializer<>(StringSerializer.INSTANCE));
        snap("arraylist", new ArrayListSerializer<>(LongSerializer.INSTANCE));
        snap("map", new MapSerializer<>(StringSerializer.INSTANCE, LongSerializer.INSTANCE));
        snap("generic_array", new GenericArraySerializer<>(String.class, StringSerializer.INSTANCE));
        snap("nullable", NullableSerializer.wrap(LongSerializer.INSTANCE, true));
        snap("either", new EitherSerializer<>(LongSerializer.INSTANCE, StringSerializer.INSTANCE));
        snap("ttl", new TtlStateFactory.TtlSerializer<>(LongSerializer.INSTANCE, StringSerializer.INSTANCE));
        snap("timer", new TimerSerializer<>(StringSerializer.INSTANCE, VoidNamespaceSerializer.INSTANCE));
        snap("timer_window", new TimerSerializer<>(LongSerializer.INSTANCE, new TimeWindow.Serializer()));
        snap("global_window", new GlobalWindow.Serializer());
        snap("table_time_window", new org.apache.flink.table.runtime.operators.window.TimeWindow.Serializer());
        snap("table_count_window", new org.apache.flink.table.runtime.operators.window.CountWindow.Serializer());
        snap("kryo", new KryoSerializer<>(LocalDateTime.class, cfg));
        snap("java", new JavaSerializer<>());
        snap("value", new ValueSerializer<>(LongValue.class));
        snap("string_data", StringDataSerializer.INSTANCE);
        snap("decimal_data", new DecimalDataSerializer(30, 6));
        snap("timestamp_data", new TimestampDataSerializer(6));
        snap("binary_row", new BinaryRowDataSerializer(3));
        snap("array_data", new ArrayDataSerializer(new IntType()));
        snap("map_data", new MapDataSerializer(new VarCharType(VarCharType.MAX_LENGTH), new BigIntType()));
        snap("raw_value", new RawValueDataSerializer<>(LongSerializer.INSTANCE));
        snap("linked_list", new LinkedListSerializer<>(StringSerializer.INSTANCE));
        snap("external", ExternalSerializer.of(DataTypes.ROW(DataTypes.FIELD("x", DataTypes.INT()))));
        snap("sorted_map", new SortedMapSerializer<>(Comparator.<Long>naturalOrder(), LongSerializer.INSTANCE, StringSerializer.INSTANCE));
        RowType rich = RowType.of(
                new LogicalType[]{
                        new BooleanType(), new TinyIntType(), new SmallIntType(), new IntType(false),
                        new BigIntType(), new FloatType(), new DoubleType(), new DecimalType(12, 2),
                        new DecimalType(30, 6), new CharType(3), new VarCharType(VarCharType.MAX_LENGTH),
                        new VarCharType(10), new BinaryType(4), new VarBinaryType(VarBinaryType.MAX_LENGTH),
                        new DateType(), new TimeType(3), new TimestampType(3), new TimestampType(6),
                        new LocalZonedTimestampType(3), new ArrayType(new IntType()),
                        new MapType(new VarCharType(VarCharType.MAX_LENGTH), new BigIntType()),
                        new MultisetType(new IntType()),
                        RowType.of(new LogicalType[]{new IntType(), new VarCharType(5)}, new String[]{"x", "y"}),
                        new YearMonthIntervalType(YearMonthIntervalType.YearMonthResolution.YEAR_TO_MONTH),
                        new DayTimeIntervalType(DayTimeIntervalType.DayTimeResolution.DAY_TO_SECOND),
                        new RawType<>(Long.class, LongSerializer.INSTANCE)},
                new String[]{"b", "ti", "si", "i", "bi", "f", "d", "dec", "bigdec", "c", "s", "vc", "bin",
                        "vb", "dt", "tm", "ts3", "ts6", "ltz", "arr", "m", "ms", "nested", "ym", "dtint", "raw"});
        snap("row_data", new RowDataSerializer(rich));
        snap("row_data_unnamed", new RowDataSerializer(new BigIntType(), new VarCharType(VarCharType.MAX_LENGTH)));

        hash("string_hello", "hello");
        hash("string_empty", "");
        hash("string_unicode", "h\u00e9llo\u20ac\ud83d\ude00");
        hash("long_42", 42L);
        hash("long_neg", -1234567890123L);
        hash("int_7", 7);
        hash("int_min", Integer.MIN_VALUE);
        hash("short", (short) -5);
        hash("byte", (byte) 3);
        hash("bool_true", true);
        hash("bool_false", false);
        hash("double", 3.5d);
        hash("double_negzero", -0.0d);
        hash("double_nan", Double.NaN);
        hash("float", 1.25f);
        hash("char", 'x');
        hash("tuple2", Tuple2.of("a", 1L));
        hash("tuple3", Tuple3.of(1, "b", true));
        hash("tuple2_null", Tuple2.of(null, 5));
        hash("row", Row.of(1, "x"));
        hash("row_delete", Row.ofKind(RowKind.DELETE, 1, "x"));
        hash("row_nested", Row.of(Row.of(2L), null, "z"));
        hash("big_int", new java.math.BigInteger("123456789012345678901234567890"));
        hash("big_dec", new BigDecimal("12.50"));

        RowType k1 = RowType.of(new LogicalType[]{new VarCharType(VarCharType.MAX_LENGTH)}, new String[]{"word"});
        row("str_short", k1, GenericRowData.of(StringData.fromString("w3")));
        row("str_long", k1, GenericRowData.of(StringData.fromString("a-longer-string-here")));
        row("str_null", k1, GenericRowData.of((Object) null));
        RowType k2 = RowType.of(new LogicalType[]{new BigIntType(), new VarCharType(VarCharType.MAX_LENGTH), new VarCharType(VarCharType.MAX_LENGTH), new IntType()});
        row("example", k2, GenericRowData.of(42L, StringData.fromString("abc"), StringData.fromString("longer-string"), null));
        RowType k3 = RowType.of(new LogicalType[]{
                new BooleanType(), new TinyIntType(), new SmallIntType(), new IntType(), new BigIntType(),
                new FloatType(), new DoubleType(), new DecimalType(10, 2), new DecimalType(30, 6),
                new DateType(), new TimeType(), new TimestampType(3), new TimestampType(9),
                new LocalZonedTimestampType(6), new VarBinaryType(100), new BinaryType(3), new CharType(2)});
        row("all_types", k3, GenericRowData.of(true, (byte) -3, (short) 300, 123456, -9876543210L, 1.5f, -2.25d,
                DecimalData.fromBigDecimal(new BigDecimal("12.50"), 10, 2),
                DecimalData.fromBigDecimal(new BigDecimal("-123456789012345678.123456"), 30, 6),
                19000, 3600000, TimestampData.fromEpochMillis(1700000000123L),
                TimestampData.fromEpochMillis(1700000000123L, 456789),
                TimestampData.fromEpochMillis(-1000L, 123000),
                new byte[]{1, 2, 3, 4, 5, 6, 7, 8, 9}, new byte[]{9, 8, 7}, StringData.fromString("ab")));
        row("nulls", k3, new GenericRowData(17));
        row("empty_str", k1, GenericRowData.of(StringData.fromString("")));
        row("utf8", k1, GenericRowData.of(StringData.fromString("h\u00e9llo\u20ac")));
    }
}
