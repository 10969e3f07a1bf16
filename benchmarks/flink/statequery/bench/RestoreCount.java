package statequery.bench;

import org.apache.flink.api.common.state.AggregatingStateDescriptor;
import org.apache.flink.api.common.state.AppendingState;
import org.apache.flink.api.common.state.ListState;
import org.apache.flink.api.common.state.ListStateDescriptor;
import org.apache.flink.api.common.state.MapState;
import org.apache.flink.api.common.state.MapStateDescriptor;
import org.apache.flink.api.common.state.ReducingStateDescriptor;
import org.apache.flink.api.common.state.State;
import org.apache.flink.api.common.state.StateDescriptor;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeutils.TypeSerializer;
import org.apache.flink.api.common.typeutils.base.ListSerializer;
import org.apache.flink.api.common.typeutils.base.MapSerializer;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.core.fs.CloseableRegistry;
import org.apache.flink.core.fs.FSDataInputStream;
import org.apache.flink.core.memory.DataInputViewStreamWrapper;
import org.apache.flink.metrics.groups.UnregisteredMetricsGroup;
import org.apache.flink.runtime.checkpoint.Checkpoints;
import org.apache.flink.runtime.checkpoint.OperatorState;
import org.apache.flink.runtime.checkpoint.OperatorSubtaskState;
import org.apache.flink.runtime.checkpoint.metadata.CheckpointMetadata;
import org.apache.flink.runtime.state.AbstractKeyedStateBackend;
import org.apache.flink.runtime.state.IncrementalKeyedStateHandle.HandleAndLocalPath;
import org.apache.flink.runtime.state.IncrementalRemoteKeyedStateHandle;
import org.apache.flink.runtime.state.KeyGroupsSavepointStateHandle;
import org.apache.flink.runtime.state.KeyGroupsStateHandle;
import org.apache.flink.runtime.state.KeyGroupedInternalPriorityQueue;
import org.apache.flink.runtime.state.KeyedBackendSerializationProxy;
import org.apache.flink.runtime.state.KeyedStateBackendParametersImpl;
import org.apache.flink.runtime.state.KeyedStateHandle;
import org.apache.flink.runtime.state.StateBackend;
import org.apache.flink.runtime.state.StreamStateHandle;
import org.apache.flink.runtime.state.internal.InternalKvState;
import org.apache.flink.runtime.state.hashmap.HashMapStateBackend;
import org.apache.flink.runtime.state.memory.ByteStreamStateHandle;
import org.apache.flink.runtime.state.metainfo.StateMetaInfoSnapshot;
import org.apache.flink.runtime.state.ttl.TtlTimeProvider;
import org.apache.flink.state.rocksdb.EmbeddedRocksDBStateBackend;
import org.apache.flink.util.CloseableIterator;

import statequery.fixtures.DumpEnvironment;
import statequery.fixtures.SavepointDump;

import java.io.BufferedInputStream;
import java.io.DataInputStream;
import java.io.File;
import java.io.FileInputStream;
import java.io.IOException;
import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.lang.management.MemoryPoolMXBean;
import java.lang.management.MemoryType;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;
import java.util.stream.Stream;

/**
 * Flink's own restore-and-iterate, counted: the reference statequery's benchmarks compare with
 * ({@code benchmarks/bench_vs_flink.py}). Restores each subtask of one keyed operator with Flink
 * 2.3's own {@link HashMapStateBackend} (canonical savepoints) or {@link EmbeddedRocksDBStateBackend}
 * (RocksDB native savepoints), the way the fixture oracle {@link SavepointDump} does (same task
 * environment, same backend options), then iterates every entry of every state as the State
 * Processor API does (every key and namespace of the state, then the state's value for it),
 * counting entries without printing them. Timers are counted by iterating their queue.
 *
 * <pre>
 * java -cp CP statequery.bench.RestoreCount [--operator=UID] [--states=a,b] [--preload]
 *     [--tmp=DIR] DIR_OR_METADATA
 * </pre>
 *
 * <ul>
 *   <li>{@code --states}: iterate only these states (the restore still restores every state of the
 *       subtask: neither backend can restore a part of a keyed handle).
 *   <li>{@code --preload}: "Flink with its files preloaded": every state file of the operator is
 *       read into a byte array ({@link ByteStreamStateHandle}) before the restore clock starts, so
 *       the restore reads from memory, not from the file system.
 *   <li>{@code --tmp}: the backends' working directory (RocksDB copies the DB files there on
 *       restore), default the JVM's temp directory; e.g. {@code /dev/shm}.
 * </ul>
 *
 * Entries: a value or reducing/aggregating state 1 per key and namespace, a list state one per
 * element, a map state one per map entry, a timer queue one per timer. Prints one JSON line:
 * wall and CPU (whole JVM: {@code getProcessCpuTime}) seconds of each phase, entries per state,
 * peak heap and GC. Exit code 1 if a state could not be read.
 */
public class RestoreCount {

    public static void main(String[] args) throws Exception {
        String operator = "large-state";
        List<String> only = null;
        boolean preload = false;
        String tmp = System.getProperty("java.io.tmpdir");
        List<String> positional = new ArrayList<>();
        for (String a : args) {
            if (a.startsWith("--operator=")) {
                operator = a.substring("--operator=".length());
            } else if (a.startsWith("--states=")) {
                only = Arrays.asList(a.substring("--states=".length()).split(","));
            } else if (a.equals("--preload")) {
                preload = true;
            } else if (a.startsWith("--tmp=")) {
                tmp = a.substring("--tmp=".length());
            } else {
                positional.add(a);
            }
        }
        if (positional.size() != 1) {
            System.err.println("usage: RestoreCount [--operator=UID] [--states=a,b] [--preload] [--tmp=DIR] DIR_OR_METADATA");
            System.exit(2);
        }
        Map<String, Object> out = new RestoreCount(operator, only, preload, new File(tmp)).run(new File(positional.get(0)));
        System.out.println(json(out));
        System.exit(((Number) out.get("errors")).intValue() == 0 ? 0 : 1);
    }

    private final String operator;
    private final List<String> only;
    private final boolean preload;
    private final File tmpRoot;
    private final ClassLoader classLoader = RestoreCount.class.getClassLoader();
    private final com.sun.management.OperatingSystemMXBean os =
            (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
    private int errors;

    RestoreCount(String operator, List<String> only, boolean preload, File tmpRoot) {
        this.operator = operator;
        this.only = only;
        this.preload = preload;
        this.tmpRoot = tmpRoot;
    }

    /** Wall and whole-process CPU time of a phase, summed over its runs. */
    private final class Clock {
        long wall;
        long cpu;
        private long w0;
        private long c0;

        void start() {
            w0 = System.nanoTime();
            c0 = os.getProcessCpuTime();
        }

        void stop() {
            wall += System.nanoTime() - w0;
            cpu += os.getProcessCpuTime() - c0;
        }
    }

    Map<String, Object> run(File input) throws Exception {
        long mainStartCpu = os.getProcessCpuTime();
        long mainStartMs = ManagementFactory.getRuntimeMXBean().getUptime();
        File f = input.getAbsoluteFile();
        File metaFile = f.isDirectory() ? new File(f, "_metadata") : f;
        Clock meta = new Clock();
        meta.start();
        CheckpointMetadata metadata;
        try (DataInputStream in = new DataInputStream(new BufferedInputStream(new FileInputStream(metaFile)))) {
            metadata = Checkpoints.loadCheckpointMetadata(in, classLoader, metaFile.getParentFile().getAbsolutePath());
        }
        OperatorState op = null;
        for (OperatorState o : metadata.getOperatorStates()) {
            if (operator.equals(o.getOperatorUid().orElse("")) || operator.equals(o.getOperatorID().toHexString())) {
                op = o;
            }
        }
        if (op == null) {
            throw new IOException("no operator " + operator + " in " + metaFile);
        }
        meta.stop();

        tmpRoot.mkdirs();
        File tmpDir = Files.createTempDirectory(tmpRoot.toPath(), "restore-count").toFile();
        DumpEnvironment denv = new DumpEnvironment(classLoader, tmpDir);
        Configuration conf = new Configuration(); // as SavepointDump configures its backends
        conf.setString("state.backend.rocksdb.memory.managed", "false");
        conf.setString("state.backend.rocksdb.timer-service.factory", "ROCKSDB");
        conf.setString("execution.checkpointing.local-backup.enabled", "false");
        HashMapStateBackend heapBackend = new HashMapStateBackend().configure(conf, classLoader);
        EmbeddedRocksDBStateBackend rocksBackend = new EmbeddedRocksDBStateBackend().configure(conf, classLoader);
        File rocksDir = new File(tmpDir, "rocksdb");
        rocksDir.mkdirs();
        rocksBackend.setDbStoragePath(rocksDir.getAbsolutePath());

        Clock load = new Clock();
        Clock restore = new Clock();
        Clock iterate = new Clock();
        Clock dispose = new Clock();
        long preloadBytes = 0;
        Map<String, long[]> perState = new TreeMap<>(); // name -> {entries, wall ns, cpu ns}
        List<Map<String, Object>> subtasks = new ArrayList<>();
        String backendName = null;
        try {
            for (Map.Entry<Integer, OperatorSubtaskState> e : new TreeMap<>(op.getSubtaskStates()).entrySet()) {
                List<KeyedStateHandle> handles = new ArrayList<>(e.getValue().getManagedKeyedState());
                if (handles.isEmpty()) {
                    continue;
                }
                Map<String, Object> sub = new LinkedHashMap<>();
                sub.put("subtask", e.getKey());
                load.start();
                long bytes = 0;
                int files = 0;
                if (preload) {
                    List<KeyedStateHandle> loaded = new ArrayList<>();
                    for (KeyedStateHandle h : handles) {
                        loaded.add(preloaded(h));
                    }
                    handles = loaded;
                }
                boolean rocks = false;
                KeyedBackendSerializationProxy<?> proxy = null;
                Map<String, StateMetaInfoSnapshot> metas = new TreeMap<>();
                int start = Integer.MAX_VALUE;
                int end = Integer.MIN_VALUE;
                for (KeyedStateHandle h : handles) {
                    StreamStateHandle header;
                    if (h instanceof IncrementalRemoteKeyedStateHandle) {
                        rocks = true;
                        IncrementalRemoteKeyedStateHandle r = (IncrementalRemoteKeyedStateHandle) h;
                        header = r.getMetaDataStateHandle();
                        for (HandleAndLocalPath x : concat(r.getSharedState(), r.getPrivateState())) {
                            files++;
                            bytes += x.getStateSize();
                        }
                    } else if (h instanceof KeyGroupsStateHandle) {
                        header = ((KeyGroupsStateHandle) h).getDelegateStateHandle();
                        files++;
                        bytes += header.getStateSize();
                    } else {
                        throw new IOException("unsupported keyed handle " + h.getClass().getName());
                    }
                    KeyedBackendSerializationProxy<?> p = new KeyedBackendSerializationProxy<>(classLoader);
                    try (FSDataInputStream in = header.openInputStream()) {
                        p.read(new DataInputViewStreamWrapper(in));
                    }
                    proxy = proxy == null ? p : proxy;
                    for (StateMetaInfoSnapshot m : p.getStateMetaInfoSnapshots()) {
                        metas.putIfAbsent(m.getName(), m);
                    }
                    start = Math.min(start, h.getKeyGroupRange().getStartKeyGroup());
                    end = Math.max(end, h.getKeyGroupRange().getEndKeyGroup());
                }
                load.stop();
                preloadBytes += preload ? bytes : 0;
                sub.put("files", files);
                sub.put("bytes", bytes);
                StateBackend backend = rocks ? rocksBackend : heapBackend;
                backendName = rocks ? "rocksdb" : "hashmap";
                TypeSerializer keySerializer = proxy.getKeySerializerSnapshot().restoreSerializer();
                CloseableRegistry registry = new CloseableRegistry();
                Clock one = new Clock();
                one.start();
                restore.start();
                KeyedStateBackendParametersImpl params = new KeyedStateBackendParametersImpl(
                        denv.env, denv.jobId, "count_" + e.getKey(), keySerializer,
                        op.getMaxParallelism(), new org.apache.flink.runtime.state.KeyGroupRange(start, end),
                        denv.kvStateRegistry, TtlTimeProvider.DEFAULT, new UnregisteredMetricsGroup(),
                        (name, value) -> {}, handles, registry, 1.0);
                AbstractKeyedStateBackend kb = (AbstractKeyedStateBackend) backend.createKeyedStateBackend(params);
                restore.stop();
                one.stop();
                sub.put("restore_s", one.wall / 1e9);
                try {
                    for (StateMetaInfoSnapshot m : metas.values()) {
                        if (only != null && !only.contains(m.getName())) {
                            continue;
                        }
                        long[] acc = perState.computeIfAbsent(m.getName(), k -> new long[3]);
                        Clock c = new Clock();
                        c.start();
                        iterate.start();
                        try {
                            switch (m.getBackendStateType()) {
                                case KEY_VALUE:
                                    acc[0] += countKeyValue(kb, keySerializer, m);
                                    break;
                                case PRIORITY_QUEUE:
                                    acc[0] += countQueue(kb, m);
                                    break;
                                default:
                                    throw new IOException("unsupported backend state type " + m.getBackendStateType());
                            }
                        } catch (Exception ex) {
                            errors++;
                            System.err.println("RestoreCount ERROR: subtask " + e.getKey() + " state " + m.getName() + ": " + ex);
                            ex.printStackTrace();
                        }
                        iterate.stop();
                        c.stop();
                        acc[1] += c.wall;
                        acc[2] += c.cpu;
                    }
                } finally {
                    dispose.start();
                    kb.dispose();
                    registry.close();
                    dispose.stop();
                }
                subtasks.add(sub);
            }
        } finally {
            denv.close();
            deleteRecursively(tmpDir);
        }

        Map<String, Object> res = new LinkedHashMap<>();
        res.put("backend", backendName);
        res.put("preload", preload);
        res.put("errors", errors);
        long entries = 0;
        Map<String, Object> states = new LinkedHashMap<>();
        for (Map.Entry<String, long[]> s : perState.entrySet()) {
            Map<String, Object> st = new LinkedHashMap<>();
            st.put("entries", s.getValue()[0]);
            st.put("iterate_s", s.getValue()[1] / 1e9);
            st.put("iterate_cpu_s", s.getValue()[2] / 1e9);
            states.put(s.getKey(), st);
            entries += s.getValue()[0];
        }
        res.put("entries", entries);
        res.put("jvm_start_to_main_s", mainStartMs / 1e3);
        res.put("jvm_cpu_before_main_s", mainStartCpu / 1e9);
        res.put("metadata_s", meta.wall / 1e9);
        res.put("metadata_cpu_s", meta.cpu / 1e9);
        res.put("load_s", load.wall / 1e9); // headers (+ with --preload: reading the files into memory)
        res.put("load_cpu_s", load.cpu / 1e9);
        res.put("preload_bytes", preloadBytes);
        res.put("restore_s", restore.wall / 1e9);
        res.put("restore_cpu_s", restore.cpu / 1e9);
        res.put("iterate_s", iterate.wall / 1e9);
        res.put("iterate_cpu_s", iterate.cpu / 1e9);
        res.put("dispose_s", dispose.wall / 1e9);
        res.put("process_cpu_s", os.getProcessCpuTime() / 1e9);
        long heapPeak = 0;
        for (MemoryPoolMXBean pool : ManagementFactory.getMemoryPoolMXBeans()) {
            if (pool.getType() == MemoryType.HEAP && pool.getPeakUsage() != null) {
                heapPeak += pool.getPeakUsage().getUsed();
            }
        }
        res.put("heap_peak_mb", heapPeak / 1048576.0); // sum of the heap pools' peaks (an upper bound)
        res.put("vm_hwm_mb", vmHwmMb()); // the process's peak resident set (RocksDB's native memory too)
        long gcCount = 0;
        long gcMs = 0;
        for (GarbageCollectorMXBean gc : ManagementFactory.getGarbageCollectorMXBeans()) {
            gcCount += Math.max(0, gc.getCollectionCount());
            gcMs += Math.max(0, gc.getCollectionTime());
        }
        res.put("gc_count", gcCount);
        res.put("gc_s", gcMs / 1e3);
        res.put("subtasks", subtasks);
        res.put("states", states);
        return res;
    }

    @SuppressWarnings({"unchecked", "rawtypes"})
    private long countKeyValue(AbstractKeyedStateBackend kb, TypeSerializer keySerializer, StateMetaInfoSnapshot m)
            throws Exception {
        String name = m.getName();
        String type = m.getOption(StateMetaInfoSnapshot.CommonOptionsKeys.KEYED_STATE_TYPE);
        TypeSerializer nsSer = SavepointDump.restored(m, StateMetaInfoSnapshot.CommonSerializerKeys.NAMESPACE_SERIALIZER);
        TypeSerializer valueSer = SavepointDump.restored(m, StateMetaInfoSnapshot.CommonSerializerKeys.VALUE_SERIALIZER);
        StateDescriptor desc;
        switch (type) { // the descriptors SavepointDump builds
            case "VALUE":
                desc = new ValueStateDescriptor(name, valueSer);
                break;
            case "LIST":
                desc = new ListStateDescriptor(name, ((ListSerializer) valueSer).getElementSerializer());
                break;
            case "MAP":
                desc = new MapStateDescriptor(name, ((MapSerializer) valueSer).getKeySerializer(),
                        ((MapSerializer) valueSer).getValueSerializer());
                break;
            case "REDUCING":
                desc = new ReducingStateDescriptor(name, SavepointDump.NO_REDUCE, valueSer);
                break;
            case "AGGREGATING":
                desc = new AggregatingStateDescriptor(name, new SavepointDump.AccumulatorAsResult(), valueSer);
                break;
            default:
                throw new IOException("unsupported keyed state type " + type);
        }
        State state = kb.getOrCreateKeyedState(nsSer, desc);
        InternalKvState kv = (InternalKvState) state;
        long n = 0;
        // Every (key, namespace) of the state, then its value: the State Processor API's walk.
        // (Both backends yield each pair once; RocksDB skips the repeats of map entries' keys.)
        try (Stream<Tuple2<Object, Object>> s = kb.getKeysAndNamespaces(name)) {
            for (Tuple2<Object, Object> t : (Iterable<Tuple2<Object, Object>>) s::iterator) {
                kb.setCurrentKey(t.f0);
                kv.setCurrentNamespace(t.f1);
                switch (type) {
                    case "VALUE":
                        n += ((ValueState) state).value() != null ? 1 : 0;
                        break;
                    case "LIST": {
                        Iterable<?> it = (Iterable<?>) ((ListState) state).get();
                        if (it != null) {
                            for (Object o : it) {
                                n += o != null ? 1 : 0;
                            }
                        }
                        break;
                    }
                    case "MAP": {
                        Iterable<Map.Entry> it = ((MapState) state).entries();
                        if (it != null) {
                            for (Map.Entry me : it) {
                                n += me.getKey() != null ? 1 : 0;
                            }
                        }
                        break;
                    }
                    default:
                        n += ((AppendingState) state).get() != null ? 1 : 0;
                }
            }
        }
        return n;
    }

    @SuppressWarnings({"unchecked", "rawtypes"})
    private long countQueue(AbstractKeyedStateBackend kb, StateMetaInfoSnapshot m) throws Exception {
        TypeSerializer elementSer = SavepointDump.restored(m, StateMetaInfoSnapshot.CommonSerializerKeys.VALUE_SERIALIZER);
        KeyGroupedInternalPriorityQueue queue = kb.create(m.getName(), elementSer);
        long n = 0;
        try (CloseableIterator it = queue.iterator()) {
            while (it.hasNext()) {
                n += it.next() != null ? 1 : 0;
            }
        }
        return n;
    }

    // ------------------------------------------------------------------ --preload

    private KeyedStateHandle preloaded(KeyedStateHandle h) throws IOException {
        if (h instanceof KeyGroupsSavepointStateHandle) {
            KeyGroupsSavepointStateHandle k = (KeyGroupsSavepointStateHandle) h;
            return new KeyGroupsSavepointStateHandle(k.getGroupRangeOffsets(), inMemory(k.getDelegateStateHandle()));
        }
        if (h instanceof KeyGroupsStateHandle) {
            KeyGroupsStateHandle k = (KeyGroupsStateHandle) h;
            return KeyGroupsStateHandle.restore(k.getGroupRangeOffsets(), inMemory(k.getDelegateStateHandle()),
                    k.getStateHandleId());
        }
        if (h instanceof IncrementalRemoteKeyedStateHandle) {
            IncrementalRemoteKeyedStateHandle r = (IncrementalRemoteKeyedStateHandle) h;
            List<HandleAndLocalPath> shared = new ArrayList<>();
            for (HandleAndLocalPath x : r.getSharedState()) {
                shared.add(HandleAndLocalPath.of(inMemory(x.getHandle()), x.getLocalPath()));
            }
            List<HandleAndLocalPath> priv = new ArrayList<>();
            for (HandleAndLocalPath x : r.getPrivateState()) {
                priv.add(HandleAndLocalPath.of(inMemory(x.getHandle()), x.getLocalPath()));
            }
            return IncrementalRemoteKeyedStateHandle.restore(r.getBackendIdentifier(), r.getKeyGroupRange(),
                    r.getCheckpointId(), shared, priv, inMemory(r.getMetaDataStateHandle()),
                    r.getCheckpointedSize(), r.getStateHandleId());
        }
        throw new IOException("--preload: unsupported keyed handle " + h.getClass().getName());
    }

    private static StreamStateHandle inMemory(StreamStateHandle h) throws IOException {
        if (h instanceof ByteStreamStateHandle) {
            return h;
        }
        byte[] data;
        try (FSDataInputStream in = h.openInputStream()) {
            data = in.readAllBytes();
        }
        return new ByteStreamStateHandle("preloaded-" + h.getStreamStateHandleID(), data);
    }

    // ------------------------------------------------------------------ helpers

    private static List<HandleAndLocalPath> concat(List<HandleAndLocalPath> a, List<HandleAndLocalPath> b) {
        List<HandleAndLocalPath> all = new ArrayList<>(a);
        all.addAll(b);
        return all;
    }

    private static void deleteRecursively(File f) {
        File[] children = f.listFiles();
        if (children != null) {
            for (File c : children) {
                deleteRecursively(c);
            }
        }
        f.delete();
    }

    /** Flat JSON of numbers, booleans, strings, lists and maps (the values above). */
    @SuppressWarnings("unchecked")
    /** VmHWM of /proc/self/status in MB (Linux), -1 elsewhere. */
    private static double vmHwmMb() {
        try {
            for (String line : java.nio.file.Files.readAllLines(java.nio.file.Paths.get("/proc/self/status"))) {
                if (line.startsWith("VmHWM:")) {
                    return Long.parseLong(line.replaceAll("[^0-9]", "")) / 1024.0;
                }
            }
        } catch (IOException | RuntimeException e) {
            return -1;
        }
        return -1;
    }

    private static String json(Object o) {
        if (o == null) {
            return "null";
        }
        if (o instanceof Map) {
            StringBuilder sb = new StringBuilder("{");
            for (Map.Entry<String, Object> e : ((Map<String, Object>) o).entrySet()) {
                sb.append(sb.length() > 1 ? ", " : "").append(json(e.getKey())).append(": ").append(json(e.getValue()));
            }
            return sb.append('}').toString();
        }
        if (o instanceof List) {
            StringBuilder sb = new StringBuilder("[");
            for (Object x : (List<Object>) o) {
                sb.append(sb.length() > 1 ? ", " : "").append(json(x));
            }
            return sb.append(']').toString();
        }
        if (o instanceof String) {
            return '"' + ((String) o).replace("\\", "\\\\").replace("\"", "\\\"") + '"';
        }
        if (o instanceof Double) {
            return String.format(Locale.ROOT, "%.6f", (Double) o);
        }
        return String.valueOf(o);
    }
}
