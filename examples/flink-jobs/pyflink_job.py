"""The PyFlink DataStream fixture job (Python functions, ``python.execution-mode`` thread or
process).

Input: events ``i = 0..N_EVENTS-1`` (pyflink_model.event), a bounded collection, UNION a
keep-alive Table API datagen stream filtered to nothing, so the job keeps running after the
bounded part ends (as sql_job.py). Pipeline (parallelism 1, max parallelism 128):

* ``py-timestamps``: event time from the event (a Python TimestampAssigner)
* ``py-typed``: ``key_by(user, key_type=Types.STRING())``, a Python KeyedProcessFunction with
  value/list/map/reducing/aggregating states of declared types, pickled values, two timers
* ``py-pickled``: ``key_by((user, i % 2))`` without key_type: a pickled key, one value state
* ``py-window``: ``key_by(user, key_type=Types.STRING())``, 1 h tumbling event-time windows,
  a Python ReduceFunction (sum of amount)
* ``py-broadcast``: a broadcast stream of rules, a KeyedBroadcastProcessFunction (broadcast state)

Once the collection source is FINISHED (plus a grace period) it takes one savepoint and prints
``SNAPSHOT_PATH=<dir>`` and ``JOB_ID=<id>``.

    python pyflink_job.py --mode thread|process --backend hashmap|rocksdb \
        --kind savepoint-canonical|savepoint-native --out DIR
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyflink_model as model  # noqa: E402
from pyflink.common import Configuration, Duration, Row, Time, Types  # noqa: E402
from pyflink.common.watermark_strategy import TimestampAssigner, WatermarkStrategy  # noqa: E402
from pyflink.datastream import StreamExecutionEnvironment  # noqa: E402
from pyflink.datastream.functions import (  # noqa: E402
    AggregateFunction,
    KeyedBroadcastProcessFunction,
    KeyedProcessFunction,
    ReduceFunction,
    RuntimeContext,
)
from pyflink.datastream.state import (  # noqa: E402
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from pyflink.datastream.window import TumblingEventTimeWindows  # noqa: E402
from pyflink.java_gateway import get_gateway  # noqa: E402
from pyflink.table import StreamTableEnvironment  # noqa: E402

EVENT_TYPE = Types.TUPLE([Types.INT(), Types.STRING(), Types.LONG(), Types.LONG()])
DETAIL_TYPE = Types.ROW_NAMED(
    ["total", "last", "where"],
    [Types.LONG(), Types.STRING(),
     Types.ROW_NAMED(["city", "zip"], [Types.STRING(), Types.INT()])])
EXTREMES_TYPE = Types.ROW_NAMED(
    ["lmin", "lmax", "imin", "imax", "dmax", "text", "missing"],
    [Types.LONG(), Types.LONG(), Types.INT(), Types.INT(), Types.DOUBLE(), Types.STRING(),
     Types.STRING()])


class Timestamps(TimestampAssigner):
    def extract_timestamp(self, value, record_timestamp) -> int:
        return value[3]


class SumAvg(AggregateFunction):
    def create_accumulator(self):
        return (0, 0)

    def add(self, value, accumulator):
        return accumulator[0] + value, accumulator[1] + 1

    def get_result(self, accumulator):
        return accumulator[0] / accumulator[1]

    def merge(self, a, b):
        return a[0] + b[0], a[1] + b[1]


# Thread mode (PyFlink 2.3.0, pyflink/fn_execution/embedded/java_utils.py) declares a
# Types.LIST(...) state to Java as PICKLED_BYTE_ARRAY but hands it a java.util.ArrayList (its
# ListDataConverter does not pickle): BytePrimitiveArraySerializer throws ClassCastException at
# the snapshot. The same for Types.SQL_TIMESTAMP() (a java.sql.Timestamp handed to a byte[]
# serializer). The job writes ``tags`` and ``ts`` in process mode only (model.THREAD_SKIPPED).


class UserState(KeyedProcessFunction):
    """Every state of pyflink_model.typed_states, updated per event."""

    def __init__(self, mode: str) -> None:
        self.skipped = model.THREAD_SKIPPED if mode == "thread" else ()

    def open(self, ctx: RuntimeContext):
        self.count = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))
        self.label = ctx.get_state(ValueStateDescriptor("label", Types.STRING()))
        self.recent = ctx.get_list_state(ListStateDescriptor("recent", Types.LONG()))
        self.detail = ctx.get_map_state(
            MapStateDescriptor("detail-by-category", Types.STRING(), DETAIL_TYPE))
        self.total = ctx.get_reducing_state(
            ReducingStateDescriptor("sum", lambda a, b: a + b, Types.LONG()))
        self.avg = ctx.get_aggregating_state(AggregatingStateDescriptor(
            "avg", SumAvg(), Types.TUPLE([Types.LONG(), Types.LONG()])))
        self.dec = ctx.get_state(ValueStateDescriptor("dec", Types.BIG_DEC()))
        self.ts = ctx.get_state(ValueStateDescriptor("ts", Types.SQL_TIMESTAMP()))
        self.tags = ctx.get_state(ValueStateDescriptor("tags", Types.LIST(Types.STRING())))
        self.attrs = ctx.get_state(
            ValueStateDescriptor("attrs", Types.MAP(Types.STRING(), Types.LONG())))
        self.extremes = ctx.get_state(ValueStateDescriptor("extremes", EXTREMES_TYPE))
        self.blob = ctx.get_state(ValueStateDescriptor("blob", Types.PICKLED_BYTE_ARRAY()))
        self.blobs = ctx.get_list_state(ListStateDescriptor("blobs", Types.PICKLED_BYTE_ARRAY()))

    def process_element(self, value, ctx: KeyedProcessFunction.Context):
        i, user, amount, ts = value
        u = model.user_index(user)
        self.count.update((self.count.value() or 0) + 1)
        self.label.update(model.label(u))
        self.recent.add(amount)
        cat = model.category(i)
        old = self.detail.get(cat)
        total = (old[0] if old is not None else 0) + amount
        self.detail.put(cat, Row(total, model.last_text(i),
                                 Row(model.city(u), model.zip_code(u))))
        self.total.add(amount)
        self.avg.add(amount)
        self.dec.update(model.dec(u))
        if "ts" not in self.skipped:
            self.ts.update(model.sql_ts(u))
        if "tags" not in self.skipped:
            self.tags.update(model.tags(u))
        self.attrs.update(model.attrs(u))
        self.extremes.update(Row(*model.extremes(u)))
        self.blob.update(model.blob(u))
        if model.blob_appended(i):
            self.blobs.add(model.blobs_element(i))
        ctx.timer_service().register_event_time_timer(model.TIMER_BASE + u)
        ctx.timer_service().register_processing_time_timer(model.TIMER_BASE + 1000 + u)
        yield user

    def on_timer(self, timestamp, ctx):
        yield "timer"


class PairCount(KeyedProcessFunction):
    def open(self, ctx: RuntimeContext):
        self.n = ctx.get_state(ValueStateDescriptor("pair-count", Types.LONG()))

    def process_element(self, value, ctx):
        self.n.update((self.n.value() or 0) + 1)
        yield value[1]


class SumAmount(ReduceFunction):
    def reduce(self, a, b):
        return a[0], a[1], a[2] + b[2], max(a[3], b[3])


class Rules(KeyedBroadcastProcessFunction):
    def process_element(self, value, ctx):
        yield value[1]

    def process_broadcast_element(self, value, ctx):
        ctx.get_broadcast_state(RULES).put(value[0], value[1])


RULES = MapStateDescriptor("rules", Types.STRING(), Types.STRING())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["thread", "process"], required=True)
    ap.add_argument("--backend", choices=["hashmap", "rocksdb"], required=True)
    ap.add_argument("--kind", choices=["savepoint-canonical", "savepoint-native"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-parallelism", type=int, default=128)
    args = ap.parse_args()

    # pemja (thread mode) embeds the base interpreter, whose sys.path lacks this venv's packages
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in [*sys.path, os.environ.get("PYTHONPATH", "")] if p and os.path.isdir(p))
    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    out_uri = "file://" + out_dir
    conf = Configuration()
    for k, v in {
        "parallelism.default": "1",
        "pipeline.max-parallelism": str(args.max_parallelism),
        "state.backend.type": args.backend,
        "execution.checkpointing.storage": "filesystem",
        "execution.checkpointing.dir": out_uri,
        "execution.checkpointing.savepoint-dir": out_uri,
        "execution.checkpointing.local-backup.enabled": "false",
        "execution.checkpointing.data-inline-threshold": "0b",
        "python.execution-mode": args.mode,
        "python.executable": sys.executable,  # the workers (and pemja's thread mode) use this venv
        "python.client.executable": sys.executable,
        "python.fn-execution.bundle.size": "1",
        "table.exec.resource.default-parallelism": "1",
    }.items():
        conf.set_string(k, v)
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_parallelism(1)
    env.set_max_parallelism(args.max_parallelism)
    env.add_python_file(str(Path(__file__).resolve().parent / "pyflink_model.py"))
    t_env = StreamTableEnvironment.create(env)
    t_env.execute_sql("""CREATE TABLE keepalive (i INT) WITH (
        'connector' = 'datagen', 'rows-per-second' = '1',
        'fields.i.kind' = 'random', 'fields.i.min' = '1', 'fields.i.max' = '1000000')""")
    keepalive = t_env.to_data_stream(t_env.sql_query("SELECT i FROM keepalive WHERE i < 0")) \
        .map(lambda r: (r[0], "", 0, 0), output_type=EVENT_TYPE).uid("py-keepalive-map")

    # the collection sources are non-parallel: Flink gives them max parallelism 1
    events = env.from_collection([model.event(i) for i in range(model.N_EVENTS)],
                                 type_info=EVENT_TYPE).set_parallelism(1).uid("py-events")
    stream = events.union(keepalive).assign_timestamps_and_watermarks(
        WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_days(1))
        .with_timestamp_assigner(Timestamps())).uid("py-timestamps")

    stream.key_by(lambda e: e[1], key_type=Types.STRING()) \
        .process(UserState(args.mode), output_type=Types.STRING()) \
        .uid("py-typed").name("Py Typed") \
        .sink_to(_discard(env)).uid("py-typed-sink")
    stream.key_by(lambda e: (e[1], e[0] % 2)) \
        .process(PairCount(), output_type=Types.STRING()).uid("py-pickled").name("Py Pickled") \
        .sink_to(_discard(env)).uid("py-pickled-sink")
    stream.key_by(lambda e: e[1], key_type=Types.STRING()) \
        .window(TumblingEventTimeWindows.of(Time.hours(1))) \
        .reduce(SumAmount(), output_type=EVENT_TYPE).uid("py-window").name("Py Window") \
        .map(lambda e: e[1], output_type=Types.STRING()).uid("py-window-map") \
        .sink_to(_discard(env)).uid("py-window-sink")
    rules = env.from_collection(model.RULES, type_info=Types.TUPLE([Types.STRING(),
                                                                    Types.STRING()])) \
        .set_parallelism(1).uid("py-rules")
    stream.key_by(lambda e: e[1], key_type=Types.STRING()).connect(rules.broadcast(RULES)) \
        .process(Rules(), output_type=Types.STRING()).uid("py-broadcast").name("Py Broadcast") \
        .sink_to(_discard(env)).uid("py-broadcast-sink")

    j_client = env.execute_async("pyflink-fixture")._j_job_client
    job_id = j_client.getJobID().toString()
    print(f"JOB_ID={job_id}", flush=True)
    jvm = get_gateway().jvm
    field = j_client.getClass().getDeclaredField("miniCluster")
    field.setAccessible(True)
    mini_cluster = field.get(j_client)
    deadline = time.time() + 240
    while True:
        graph = mini_cluster.getExecutionGraph(j_client.getJobID()).get()
        states = {v.getName(): v.getAggregateState().toString()
                  for v in graph.getAllVertices().values()}
        bounded = [s for name, s in states.items() if "Collection" in name]
        rest = [s for name, s in states.items() if "Collection" not in name]
        if bounded and all(s == "FINISHED" for s in bounded) and all(s == "RUNNING" for s in rest):
            break
        if any(s in ("FAILED", "CANCELED") for s in states.values()) or time.time() > deadline:
            raise SystemExit(f"job did not reach the expected state: {states}")
        time.sleep(0.2)
    time.sleep(5)  # grace: the Python operators drain the last bundles
    graph = mini_cluster.getExecutionGraph(j_client.getJobID()).get()
    if graph.getState().toString() != "RUNNING":
        raise SystemExit(f"job is {graph.getState().toString()}, not RUNNING")
    fmt_enum = jvm.org.apache.flink.core.execution.SavepointFormatType
    fmt = fmt_enum.NATIVE if args.kind == "savepoint-native" else fmt_enum.CANONICAL
    path = j_client.triggerSavepoint(out_uri, fmt).get()
    if path.startswith("file:"):
        path = path[len("file:"):]
        while path.startswith("//"):
            path = path[1:]
    print(f"SNAPSHOT_PATH={path}", flush=True)
    j_client.cancel().get()
    sys.stdout.flush()


def _discard(env):
    """A sink that drops everything (Java DiscardingSink, Sink V2)."""
    from pyflink.datastream.connectors import Sink

    jvm = get_gateway().jvm
    return Sink(jvm.org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink())


if __name__ == "__main__":
    main()
