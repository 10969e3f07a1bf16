package statequery.prototypes;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.serialization.SerializerConfigImpl;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.MapState;
import org.apache.flink.api.common.state.MapStateDescriptor;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.configuration.CheckpointingOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.MemorySize;
import org.apache.flink.configuration.PipelineOptions;
import org.apache.flink.configuration.StateBackendOptions;
import org.apache.flink.core.execution.JobClient;
import org.apache.flink.core.execution.SavepointFormatType;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.util.Collector;

import statequery.fixtures.Event;
import statequery.fixtures.FixtureFunctions;
import statequery.fixtures.FixtureSource;

import java.io.File;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.Base64;
import java.util.List;
import java.time.Duration;
import java.util.concurrent.TimeUnit;

/**
 * The Protobuf types fixture job: the {@code FixtureSource} events (0..199), keyed by
 * {@code "k" + (id % 8)}, into one keyed operator (uid {@code proto-types}) whose states hold
 * {@link Reading} messages (Kryo, {@link ProtobufSerializer} registered for the class: chill-protobuf's
 * form): {@code reading} (a ValueState: the message of the key's latest event) and
 * {@code readings} (a MapState: {@code readings["m" + n % 3]} = the message of the key's n-th
 * event). The message of event {@code id} is line {@code id} of MESSAGES (base64, written by
 * generate_fixtures.py with Python's protobuf). Takes one savepoint, cancels and exits.
 *
 * <pre>
 * java -cp CP statequery.prototypes.ProtoTypesJob BACKEND KIND OUT_DIR MESSAGES
 *   BACKEND  hashmap | rocksdb
 *   KIND     savepoint-canonical | savepoint-native
 * </pre>
 */
public class ProtoTypesJob {
    static final int EVENTS = 200;
    static final int KEYS = 8;
    static byte[][] MESSAGES;

    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println("usage: ProtoTypesJob BACKEND KIND OUT_DIR MESSAGES");
            System.exit(2);
        }
        String backend = args[0];
        String kind = args[1];
        File outDir = new File(args[2]).getAbsoluteFile();
        outDir.mkdirs();
        String outUri = outDir.toURI().toString();
        List<String> lines = Files.readAllLines(new File(args[3]).toPath(), StandardCharsets.US_ASCII);
        MESSAGES = lines.stream().map(l -> Base64.getDecoder().decode(l.trim())).toArray(byte[][]::new);

        Configuration conf = new Configuration();
        conf.set(StateBackendOptions.STATE_BACKEND, backend);
        conf.set(CheckpointingOptions.CHECKPOINT_STORAGE, "filesystem");
        conf.set(CheckpointingOptions.CHECKPOINTS_DIRECTORY, outUri);
        conf.set(CheckpointingOptions.SAVEPOINT_DIRECTORY, outUri);
        conf.set(CheckpointingOptions.FS_SMALL_FILE_THRESHOLD, MemorySize.parse("0b"));
        conf.set(PipelineOptions.GENERIC_TYPES, true);
        conf.set(PipelineOptions.MAX_PARALLELISM, 128);
        conf.set(CheckpointingOptions.LOCAL_BACKUP_ENABLED, false);

        StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(2, conf);
        env.setMaxParallelism(128);
        ((SerializerConfigImpl) env.getConfig().getSerializerConfig())
                .registerTypeWithKryoSerializer(Reading.class, ProtobufSerializer.class);
        env.fromSource(new FixtureSource(),
                        WatermarkStrategy.<Event>forBoundedOutOfOrderness(Duration.ofDays(1))
                                .withTimestampAssigner((e, previous) -> e.ts),
                        "Fixture Source")
                .uid("fixture-source").setParallelism(1)
                .keyBy(e -> "k" + (e.id % KEYS))
                .process(new ProtoTypesFunction(MESSAGES))
                .uid("proto-types").name("Proto Types").setParallelism(2)
                .sinkTo(new FixtureFunctions.CountingSink<>())
                .uid("fixture-sink").name("Fixture Sink").setParallelism(1);

        FixtureFunctions.SINK_COUNT.set(0);
        JobClient client = env.executeAsync("statequery-fixture-proto-types");
        JobID jobId = client.getJobID();
        System.out.println("JOB_ID=" + jobId);
        long deadline = System.nanoTime() + TimeUnit.MINUTES.toNanos(3);
        while (FixtureFunctions.SINK_COUNT.get() < EVENTS) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("timed out, sink saw " + FixtureFunctions.SINK_COUNT.get());
            }
            Thread.sleep(50);
        }
        Thread.sleep(1000);
        SavepointFormatType format = kind.equals("savepoint-native")
                ? SavepointFormatType.NATIVE : SavepointFormatType.CANONICAL;
        String path = client.triggerSavepoint(outUri, format).get(2, TimeUnit.MINUTES);
        if (path.startsWith("file:")) {
            path = new File(new java.net.URI(path)).getAbsolutePath();
        }
        System.out.println("SNAPSHOT_PATH=" + path);
        client.cancel().get(1, TimeUnit.MINUTES);
        try {
            client.getJobExecutionResult().get(1, TimeUnit.MINUTES);
        } catch (Exception expected) {
            // cancelled
        }
        System.out.flush();
        System.exit(0);
    }

    /** uid proto-types: {@code reading} = the latest message; {@code readings}["m" + n % 3]. */
    public static class ProtoTypesFunction extends KeyedProcessFunction<String, Event, String> {
        private final byte[][] messages;
        private transient ValueState<Reading> reading;
        private transient MapState<String, Reading> readings;
        private transient ValueState<Integer> count;

        ProtoTypesFunction(byte[][] messages) {
            this.messages = messages;
        }

        @Override
        public void open(OpenContext openContext) {
            reading = getRuntimeContext().getState(
                    new ValueStateDescriptor<>("reading", TypeInformation.of(Reading.class)));
            readings = getRuntimeContext().getMapState(
                    new MapStateDescriptor<>("readings", Types.STRING, TypeInformation.of(Reading.class)));
            count = getRuntimeContext().getState(new ValueStateDescriptor<>("count", Types.INT));
        }

        @Override
        public void processElement(Event e, Context ctx, Collector<String> out) throws Exception {
            Integer prev = count.value();
            int n = prev == null ? 1 : prev + 1;
            count.update(n);
            Reading m = Reading.parseFrom(messages[e.id]);
            reading.update(m);
            readings.put("m" + (n % 3), m);
            out.collect(ctx.getCurrentKey());
        }
    }
}
