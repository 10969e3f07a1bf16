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
import org.apache.flink.configuration.ExternalizedCheckpointRetention;
import org.apache.flink.configuration.ExecutionOptions;
import org.apache.flink.configuration.MemorySize;
import org.apache.flink.configuration.PipelineOptions;
import org.apache.flink.configuration.StateBackendOptions;
import org.apache.flink.configuration.StateRecoveryOptions;
import org.apache.flink.core.execution.CheckpointType;
import org.apache.flink.core.execution.JobClient;
import org.apache.flink.core.execution.SavepointFormatType;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.runtime.minicluster.MiniCluster;
import org.apache.flink.streaming.api.functions.source.legacy.RichParallelSourceFunction;
import org.apache.flink.util.Collector;

import java.io.File;
import java.lang.reflect.Field;
import java.time.Duration;
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
 *   KIND  savepoint-canonical | savepoint-native | checkpoint-incremental, or several separated
 *         by commas (one savepoint of each format, in that order, of the same job state)
 * </pre>
 * checkpoint-incremental (RocksDB backend, with RESTORE_PATH and APPEND_EVERY &gt; 0): a chain of
 * 3 incremental checkpoints, all retained: the appends are released a third at a time and a
 * checkpoint taken after each third (the first uploads the restored SSTs, the next two share
 * them and add their own); prints CHECKPOINT_PATH=&lt;chk-N dir&gt; for each. The savepoints of
 * the other kinds are then taken of the final state (the state of the last checkpoint).
 * With RESTORE_PATH the job starts from that savepoint (any format, e.g. a canonical savepoint
 * restored into the RocksDB backend) and writes no new keys: the source emits every
 * APPEND_EVERY-th key only (0: none), and for each the function appends one element ("extra") to
 * its list state, which the RocksDB backend stores as an un-compacted merge operand on top of the
 * restored value. Every other state is left as restored.
 * Prints SNAPSHOT_PATH=&lt;dir holding _metadata&gt; per savepoint.
 */
public class LargeStateJob {
    static final AtomicLong SINK_COUNT = new AtomicLong();
    /** Records the sources may emit in all (the incremental chain releases them in thirds). */
    static final AtomicLong GATE = new AtomicLong(Long.MAX_VALUE);
    static final AtomicLong EMITTED = new AtomicLong();
    static final int CHAIN = 3;

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
        boolean chain = kind.contains("checkpoint-incremental");
        if (chain) {
            if (restore == null || expected == 0 || !backend.equals("rocksdb")) {
                throw new IllegalArgumentException(
                        "checkpoint-incremental needs rocksdb, RESTORE_PATH and APPEND_EVERY > 0");
            }
            conf.set(CheckpointingOptions.INCREMENTAL_CHECKPOINTS, true);
            conf.set(CheckpointingOptions.MAX_RETAINED_CHECKPOINTS, CHAIN);
            conf.set(CheckpointingOptions.LOCAL_BACKUP_ENABLED, false);
            conf.set(CheckpointingOptions.CHECKPOINTING_INTERVAL, Duration.ofHours(1));
            conf.set(CheckpointingOptions.MIN_PAUSE_BETWEEN_CHECKPOINTS, Duration.ofHours(1));
            conf.set(CheckpointingOptions.EXTERNALIZED_CHECKPOINT_RETENTION,
                    ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION);
            GATE.set(0);
        }

        StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(2, conf);
        env.addSource(new KeySource(keys, restore == null ? 1 : appendEvery), Types.STRING).uid("large-source").setParallelism(2)
                .keyBy(k -> k)
                .process(new LargeStateFunction(restore != null)).uid("large-state").name("Large State")
                .setParallelism(2)
                .sinkTo(new CountingSink()).uid("large-sink").setParallelism(1);

        JobClient client = env.executeAsync("statequery-bench-large");
        JobID jobId = client.getJobID();
        long deadline = System.nanoTime() + TimeUnit.MINUTES.toNanos(60);
        if (chain) {
            System.out.println("JOB_ID=" + jobId);
            MiniCluster miniCluster = miniClusterOf(client);
            for (int n = 1; n <= CHAIN; n++) {
                long mark = expected * n / CHAIN;
                GATE.set(mark);
                while (SINK_COUNT.get() < mark) {
                    if (System.nanoTime() > deadline) {
                        throw new IllegalStateException("timed out at " + SINK_COUNT.get());
                    }
                    Thread.sleep(100);
                }
                Thread.sleep(1000); // the last elements reach the state before the sink counts them
                long id = miniCluster.triggerCheckpoint(jobId, CheckpointType.CONFIGURED)
                        .get(30, TimeUnit.MINUTES);
                System.out.println("CHECKPOINT_PATH="
                        + new File(new File(outDir, jobId.toString()), "chk-" + id).getAbsolutePath());
                System.out.flush();
            }
            GATE.set(Long.MAX_VALUE);
        }
        while (SINK_COUNT.get() < expected) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("timed out at " + SINK_COUNT.get());
            }
            Thread.sleep(200);
        }
        if (restore != null) {
            Thread.sleep(1000); // the last elements reach the state before the sink counts them
        }
        if (!chain) {
            System.out.println("JOB_ID=" + jobId);
        }
        for (String k : kind.split(",")) {
            if (k.trim().equals("checkpoint-incremental")) {
                continue;
            }
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

    /** The local environment's JobClient keeps its MiniCluster in a private field. */
    static MiniCluster miniClusterOf(JobClient client) throws Exception {
        for (Class<?> c = client.getClass(); c != null; c = c.getSuperclass()) {
            for (Field f : c.getDeclaredFields()) {
                if (MiniCluster.class.isAssignableFrom(f.getType())) {
                    f.setAccessible(true);
                    return (MiniCluster) f.get(client);
                }
            }
        }
        throw new IllegalStateException("no MiniCluster inside " + client.getClass());
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
                while (EMITTED.get() >= GATE.get() && running) {
                    Thread.sleep(50);
                }
                synchronized (ctx.getCheckpointLock()) {
                    EMITTED.incrementAndGet();
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
