package statequery.kryotypes;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ListState;
import org.apache.flink.api.common.state.ListStateDescriptor;
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
import java.time.Duration;
import java.util.concurrent.TimeUnit;

/**
 * The Kryo types fixture job: the {@code FixtureSource} events (0..199), keyed by
 * {@code "k" + (id % 8)} (8 keys, 25 events each, in input order), into one keyed operator (uid
 * {@code kryo-types}) whose states hold classes Flink serializes with Kryo: {@code order} (a
 * ValueState of {@link Order}: {@code Order.make(k, n)} after the key's n-th event) and
 * {@code shapes} (a MapState of {@link Shape}, an interface: {@code shapes["s" + n % 3] =
 * Shape.make(k, n)}) and {@code shape-log} (a ListState of {@link Shape}: {@code Shape.make(k, n)}
 * appended when n % 5 == 0). Takes one savepoint, cancels and exits.
 *
 * <pre>
 * java -cp CP statequery.kryotypes.KryoTypesJob BACKEND KIND OUT_DIR
 *   BACKEND  hashmap | rocksdb
 *   KIND     savepoint-canonical | savepoint-native
 * </pre>
 */
public class KryoTypesJob {
    static final int EVENTS = 200;
    static final int KEYS = 8;

    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: KryoTypesJob BACKEND KIND OUT_DIR");
            System.exit(2);
        }
        String backend = args[0];
        String kind = args[1];
        File outDir = new File(args[2]).getAbsoluteFile();
        outDir.mkdirs();
        String outUri = outDir.toURI().toString();

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
        env.fromSource(new FixtureSource(),
                        WatermarkStrategy.<Event>forBoundedOutOfOrderness(Duration.ofDays(1))
                                .withTimestampAssigner((e, previous) -> e.ts),
                        "Fixture Source")
                .uid("fixture-source").setParallelism(1)
                .keyBy(e -> "k" + (e.id % KEYS))
                .process(new KryoTypesFunction())
                .uid("kryo-types").name("Kryo Types").setParallelism(2)
                .sinkTo(new FixtureFunctions.CountingSink<>())
                .uid("fixture-sink").name("Fixture Sink").setParallelism(1);

        FixtureFunctions.SINK_COUNT.set(0);
        JobClient client = env.executeAsync("statequery-fixture-kryo-types");
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

    /** uid kryo-types: {@code order} = Order.make(k, n); {@code shapes}["s" + n % 3] = Shape.make(k, n). */
    public static class KryoTypesFunction extends KeyedProcessFunction<String, Event, String> {
        private transient ValueState<Order> order;
        private transient MapState<String, Shape> shapes;
        private transient ListState<Shape> shapeLog;

        @Override
        public void open(OpenContext openContext) {
            order = getRuntimeContext().getState(
                    new ValueStateDescriptor<>("order", TypeInformation.of(Order.class)));
            shapes = getRuntimeContext().getMapState(
                    new MapStateDescriptor<>("shapes", Types.STRING, TypeInformation.of(Shape.class)));
            shapeLog = getRuntimeContext().getListState(
                    new ListStateDescriptor<>("shape-log", TypeInformation.of(Shape.class)));
        }

        @Override
        public void processElement(Event e, Context ctx, Collector<String> out) throws Exception {
            int k = e.id % KEYS;
            Order prev = order.value();
            int n = prev == null ? 1 : prev.count() + 1;
            order.update(Order.make(k, n));
            shapes.put("s" + (n % 3), Shape.make(k, n));
            if (n % 5 == 0) {
                shapeLog.add(Shape.make(k, n));
            }
            out.collect(ctx.getCurrentKey());
        }
    }
}
