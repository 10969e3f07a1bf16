package statequery.bench;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ListState;
import org.apache.flink.api.common.state.ListStateDescriptor;
import org.apache.flink.api.common.state.MapState;
import org.apache.flink.api.common.state.MapStateDescriptor;
import org.apache.flink.api.common.state.ReducingState;
import org.apache.flink.api.common.state.ReducingStateDescriptor;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.connector.sink2.Sink;
import org.apache.flink.api.connector.sink2.SinkWriter;
import org.apache.flink.api.connector.sink2.WriterInitContext;
import org.apache.flink.configuration.CheckpointingOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.ExecutionOptions;
import org.apache.flink.configuration.MemorySize;
import org.apache.flink.configuration.PipelineOptions;
import org.apache.flink.configuration.StateBackendOptions;
import org.apache.flink.configuration.StateRecoveryOptions;
import org.apache.flink.core.execution.JobClient;
import org.apache.flink.core.execution.SavepointFormatType;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.streaming.api.functions.source.legacy.RichParallelSourceFunction;
import org.apache.flink.util.Collector;

import java.io.File;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A large keyed-state savepoint for statequery's benchmarks: KEYS String keys ("user-0000042"),
 * each with a ValueState<Long>, a ListState<String> of 3 elements, a MapState<String, Long> of
 * 2 entries, a ReducingState<Long> and one event-time timer.
 *
 * <pre>
 * java -cp CP statequery.bench.LargeStateJob KEYS BACKEND COMPRESSION KIND OUT_DIR \
 *     [RESTORE_PATH APPEND_EVERY]
 *   KIND  savepoint-canonical | savepoint-native, or several separated by commas (one savepoint
 *         of each format, in that order, of the same job state)
 * </pre>
 * With RESTORE_PATH the job starts from that savepoint (any format, e.g. a canonical savepoint
 * restored into the RocksDB backend) and writes no new keys: the source emits every
 * APPEND_EVERY-th key only (0: none), and for each the function appends one element ("extra") to
 * its list state, which the RocksDB backend stores as an un-compacted merge operand on top of the
 * restored value. Every other state is left as restored.
 * Prints SNAPSHOT_PATH=&lt;dir holding _metadata&gt; per savepoint.
 */
public class LargeStateJob {
    static final AtomicLong SINK_COUNT = new AtomicLong();

    public static void main(String[] args) throws Exception {
        long keys = Long.parseLong(args[0]);
        String backend = args[1];
        boolean compression = Boolean.parseBoolean(args[2]);
        String kind = args[3];
        File outDir = new File(args[4]).getAbsoluteFile();
        outDir.mkdirs();
        String outUri = outDir.toURI().toString();
        String restore = args.length > 5 && !args[5].isEmpty() ? args[5] : null;
        long appendEvery = args.length > 6 ? Long.parseLong(args[6]) : 0;

        Configuration conf = new Configuration();
        conf.set(StateBackendOptions.STATE_BACKEND, backend);
        conf.set(CheckpointingOptions.CHECKPOINT_STORAGE, "filesystem");
        conf.set(CheckpointingOptions.CHECKPOINTS_DIRECTORY, outUri);
        conf.set(CheckpointingOptions.SAVEPOINT_DIRECTORY, outUri);
        conf.set(CheckpointingOptions.FS_SMALL_FILE_THRESHOLD, MemorySize.parse("0b"));
        conf.set(ExecutionOptions.SNAPSHOT_COMPRESSION, compression);
        conf.set(PipelineOptions.GENERIC_TYPES, false);
        conf.set(PipelineOptions.MAX_PARALLELISM, 128);
        long expected = keys;
        if (restore != null) {
            conf.set(StateRecoveryOptions.SAVEPOINT_PATH, restore);
            expected = appendEvery <= 0 ? 0 : (keys + appendEvery - 1) / appendEvery;
        }

        StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(2, conf);
        env.addSource(new KeySource(keys, restore == null ? 1 : appendEvery), Types.STRING).uid("large-source").setParallelism(2)
                .keyBy(k -> k)
                .process(new LargeStateFunction(restore != null)).uid("large-state").name("Large State")
                .setParallelism(2)
                .sinkTo(new CountingSink()).uid("large-sink").setParallelism(1);

        JobClient client = env.executeAsync("statequery-bench-large");
        JobID jobId = client.getJobID();
        long deadline = System.nanoTime() + TimeUnit.MINUTES.toNanos(30);
        while (SINK_COUNT.get() < expected) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("timed out at " + SINK_COUNT.get());
            }
            Thread.sleep(200);
        }
        if (restore != null) {
            Thread.sleep(1000); // the last elements reach the state before the sink counts them
        }
        System.out.println("JOB_ID=" + jobId);
        for (String k : kind.split(",")) {
            SavepointFormatType format = k.trim().equals("savepoint-native")
                    ? SavepointFormatType.NATIVE : SavepointFormatType.CANONICAL;
            String path = client.triggerSavepoint(outUri, format).get(30, TimeUnit.MINUTES);
            if (path.startsWith("file:")) {
                path = new File(new java.net.URI(path)).getAbsolutePath();
            }
            System.out.println("SNAPSHOT_PATH=" + path);
            System.out.flush();
        }
        client.cancel().get(2, TimeUnit.MINUTES);
        System.exit(0);
    }

    /** Emits its share of every STEP-th key once, then idles until cancelled (keeps the job
     * running). */
    public static class KeySource extends RichParallelSourceFunction<String> {
        private final long keys;
        private final long step;
        private volatile boolean running = true;

        KeySource(long keys, long step) {
            this.keys = keys;
            this.step = step;
        }

        @Override
        public void run(SourceContext<String> ctx) throws Exception {
            int idx = getRuntimeContext().getTaskInfo().getIndexOfThisSubtask();
            int n = getRuntimeContext().getTaskInfo().getNumberOfParallelSubtasks();
            for (long i = idx * step; step > 0 && i < keys && running; i += n * step) {
                synchronized (ctx.getCheckpointLock()) {
                    ctx.collect(String.format("user-%07d", i));
                }
            }
            while (running) {
                Thread.sleep(100);
            }
        }

        @Override
        public void cancel() {
            running = false;
        }
    }

    public static class LargeStateFunction extends KeyedProcessFunction<String, String, Long> {
        private transient ValueState<Long> count;
        private transient ListState<String> recent;
        private transient MapState<String, Long> byCategory;
        private transient ReducingState<Long> sum;
        private final boolean appendOnly;

        LargeStateFunction(boolean appendOnly) {
            this.appendOnly = appendOnly;
        }

        @Override
        public void open(OpenContext openContext) {
            count = getRuntimeContext().getState(new ValueStateDescriptor<>("count", Types.LONG));
            recent = getRuntimeContext().getListState(
                    new ListStateDescriptor<>("recent-categories", Types.STRING));
            byCategory = getRuntimeContext().getMapState(
                    new MapStateDescriptor<>("amount-by-category", Types.STRING, Types.LONG));
            sum = getRuntimeContext().getReducingState(
                    new ReducingStateDescriptor<>("sum-amount", Long::sum, Types.LONG));
        }

        @Override
        public void processElement(String key, Context ctx, Collector<Long> out) throws Exception {
            long i = Long.parseLong(key.substring("user-".length()));
            if (appendOnly) { // restored state: one more list element, a RocksDB merge
                recent.add("extra");
                out.collect(i);
                return;
            }
            count.update(i);
            recent.addAll(List.of("books", "games", "music"));
            byCategory.put("books", i % 100);
            byCategory.put("games", i % 7);
            sum.add(i * 3);
            ctx.timerService().registerEventTimeTimer(4102444800000L + i);
            out.collect(i);
        }
    }

    public static class CountingSink implements Sink<Long> {
        @Override
        public SinkWriter<Long> createWriter(WriterInitContext context) {
            return new SinkWriter<Long>() {
                @Override
                public void write(Long element, Context ctx) {
                    SINK_COUNT.incrementAndGet();
                }

                @Override
                public void flush(boolean endOfInput) {}

                @Override
                public void close() {}
            };
        }
    }
}
