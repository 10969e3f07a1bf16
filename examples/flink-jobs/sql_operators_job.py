"""The Flink SQL operators fixture job (PyFlink, streaming, parallelism 1).

One job holds one instance of every stateful Flink SQL operator (``--job ops``), or the
mini-batch, two-phase (local/global) and distinct-split aggregations (``--job minibatch``, whose
settings apply to a whole job), or every built-in aggregate function and window aggregate shape
(``--job aggs``; ``--job aggs-minibatch`` the same with the mini-batch settings). Input is
deterministic: ``events`` (N_EVENTS JSON rows, ids in order) and a Debezium changelog of ``prices``
(for ChangelogNormalize), both read by the filesystem connector in continuous mode
(``source.monitor-interval``), so the sources never finish and no operator is FINISHED when the
savepoint is taken. The watermark trails event time by one day: no window, OVER frame, interval
join, temporal join or MATCH_RECOGNIZE ever fires, all their input stays in state (``--job cep``
and ``--job over`` read the events with a watermark five minutes behind: see there).

The job is compiled to a plan first (``StatementSet.compilePlan``; written to ``--plan``) and the
compiled plan is executed, so the savepoint's operators carry the plan's node ids (operator names
``GroupAggregate[7]``, uids ``7_group-aggregate``...).

    python sql_operators_job.py --job ops|minibatch|aggs|cep|over --backend hashmap|rocksdb \
        --kind savepoint-canonical|savepoint-native --out DIR --plan PLAN.json [--max-parallelism 8]

Prints ``SNAPSHOT_PATH=<dir>`` and ``JOB_ID=<id>``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from pyflink.java_gateway import get_gateway
from pyflink.table import EnvironmentSettings, TableEnvironment

N_EVENTS = 60
N_USERS = 6
CATEGORIES = ["books", "games", "music"]
TS_BASE = 1_700_000_000_000
MINUTE = 60_000


def event(i: int) -> dict:
    """Event i: one per minute; users cycle every 6 events, categories change every 10."""
    return {"id": i, "user": f"user-{i % N_USERS}", "amount": (i * 37) % 101,
            "category": CATEGORIES[(i // 10) % 3], "ts": TS_BASE + i * MINUTE}


# The prices changelog (Debezium JSON): per category an insert, then updates; "music" deleted.
def price_changes() -> list[dict]:
    out = []
    for n, cat in enumerate(CATEGORIES):
        out.append({"before": None, "after": {"category": cat, "price": 10 + n}, "op": "c"})
    for n, cat in enumerate(CATEGORIES):
        out.append({"before": {"category": cat, "price": 10 + n},
                    "after": {"category": cat, "price": 20 + n}, "op": "u"})
    out.append({"before": {"category": "music", "price": 22}, "after": None, "op": "d"})
    return out


def write_inputs(root: str) -> tuple[str, str]:
    events_dir = os.path.join(root, "events")
    prices_dir = os.path.join(root, "prices")
    os.makedirs(events_dir, exist_ok=True)
    os.makedirs(prices_dir, exist_ok=True)
    with open(os.path.join(events_dir, "events.json"), "w") as f:
        for i in range(N_EVENTS):
            f.write(json.dumps(event(i)) + "\n")
    with open(os.path.join(prices_dir, "prices.json"), "w") as f:
        for c in price_changes():
            f.write(json.dumps(c) + "\n")
    return events_dir, prices_dir


def sources(events_dir: str, prices_dir: str) -> list[str]:
    return [
        f"""CREATE TABLE events (
            id BIGINT, `user` STRING, amount INT, category STRING, ts BIGINT,
            rowtime AS TO_TIMESTAMP_LTZ(ts, 3),
            pt AS PROCTIME(),
            WATERMARK FOR rowtime AS rowtime - INTERVAL '1' DAY
        ) WITH ('connector' = 'filesystem', 'path' = 'file://{events_dir}', 'format' = 'json',
                'source.monitor-interval' = '1s')""",
        f"""CREATE TABLE prices (
            category STRING, price INT, PRIMARY KEY (category) NOT ENFORCED
        ) WITH ('connector' = 'filesystem', 'path' = 'file://{prices_dir}',
                'format' = 'debezium-json', 'source.monitor-interval' = '1s')""",
    ]


VIEWS = [
    # a versioned view: the latest event per category (deduplication on event time, keep last)
    """CREATE TEMPORARY VIEW latest_event AS SELECT category, amount, rowtime FROM (
        SELECT category, amount, rowtime,
               ROW_NUMBER() OVER (PARTITION BY category ORDER BY rowtime DESC) AS rn
        FROM events) WHERE rn = 1""",
]


def sink(name: str, columns: str, pk: str | None = None) -> str:
    key = f", PRIMARY KEY ({pk}) NOT ENFORCED" if pk else ""
    return f"CREATE TABLE {name} ({columns}{key}) WITH ('connector' = 'blackhole')"


WINDOW_COLS = "category STRING, window_start TIMESTAMP(3), window_end TIMESTAMP(3), cnt BIGINT, " \
              "total INT"

# (sink DDL, INSERT) per operator
OPS = [
    # group aggregation over an updating input: MIN/MAX/FIRST_VALUE/LAST_VALUE/LISTAGG with
    # retraction and COUNT(DISTINCT) keep state-backed views (RAW placeholders in accState)
    (sink("user_totals", "category STRING, `user` STRING, cnt BIGINT, total INT, "
                         "first_amount INT, last_amount INT, max_amount INT"),
     """INSERT INTO user_totals SELECT category, `user`, COUNT(*) AS cnt, SUM(amount) AS total,
        FIRST_VALUE(amount) AS first_amount, LAST_VALUE(amount) AS last_amount,
        MAX(amount) AS max_amount
        FROM events GROUP BY category, `user`"""),
    (sink("category_stats", "category STRING, users BIGINT, user_list STRING, min_total INT, "
                            "max_total INT, first_user STRING, last_user STRING"),
     """INSERT INTO category_stats SELECT category, COUNT(DISTINCT `user`) AS users,
        LISTAGG(`user`) AS user_list, MIN(total) AS min_total, MAX(total) AS max_total,
        FIRST_VALUE(`user`) AS first_user, LAST_VALUE(`user`) AS last_user
        FROM (SELECT category, `user`, SUM(amount) AS total FROM events
              GROUP BY category, `user`)
        GROUP BY category"""),
    # window TVF aggregations
    (sink("tumble_agg", WINDOW_COLS),
     """INSERT INTO tumble_agg SELECT category, window_start, window_end, COUNT(*) AS cnt,
        SUM(amount) AS total
        FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(rowtime), INTERVAL '15' MINUTE))
        GROUP BY category, window_start, window_end"""),
    (sink("hop_agg", WINDOW_COLS),
     """INSERT INTO hop_agg SELECT category, window_start, window_end, COUNT(*) AS cnt,
        SUM(amount) AS total
        FROM TABLE(HOP(TABLE events, DESCRIPTOR(rowtime), INTERVAL '10' MINUTE,
                       INTERVAL '20' MINUTE))
        GROUP BY category, window_start, window_end"""),
    (sink("cumulate_agg", WINDOW_COLS),
     """INSERT INTO cumulate_agg SELECT category, window_start, window_end, COUNT(*) AS cnt,
        SUM(amount) AS total
        FROM TABLE(CUMULATE(TABLE events, DESCRIPTOR(rowtime), INTERVAL '10' MINUTE,
                            INTERVAL '30' MINUTE))
        GROUP BY category, window_start, window_end"""),
    (sink("session_agg", WINDOW_COLS),
     """INSERT INTO session_agg SELECT category, window_start, window_end, COUNT(*) AS cnt,
        SUM(amount) AS total
        FROM TABLE(SESSION(TABLE events PARTITION BY category, DESCRIPTOR(rowtime),
                           INTERVAL '5' MINUTE))
        GROUP BY category, window_start, window_end"""),
    # window Top-N and window deduplication
    (sink("window_top2", "window_start TIMESTAMP(3), window_end TIMESTAMP(3), category STRING, "
                         "id BIGINT, amount INT, rn BIGINT"),
     """INSERT INTO window_top2 SELECT window_start, window_end, category, id, amount, rn FROM (
          SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end, category
                                       ORDER BY amount DESC) AS rn
          FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(rowtime), INTERVAL '15' MINUTE)))
        WHERE rn <= 2"""),
    (sink("window_first", "window_start TIMESTAMP(3), window_end TIMESTAMP(3), category STRING, "
                          "id BIGINT, amount INT"),
     """INSERT INTO window_first SELECT window_start, window_end, category, id, amount FROM (
          SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end, category
                                       ORDER BY rowtime ASC) AS rn
          FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(rowtime), INTERVAL '15' MINUTE)))
        WHERE rn = 1"""),
    # Top-N
    (sink("top3", "category STRING, id BIGINT, amount INT, rn BIGINT"),
     """INSERT INTO top3 SELECT category, id, amount, rn FROM (
          SELECT category, id, amount,
                 ROW_NUMBER() OVER (PARTITION BY category ORDER BY amount DESC) AS rn
          FROM events) WHERE rn <= 3"""),
    # deduplication: keep first row (processing time), keep last row (processing time)
    (sink("first_per_user", "`user` STRING, id BIGINT, amount INT"),
     """INSERT INTO first_per_user SELECT `user`, id, amount FROM (
          SELECT `user`, id, amount, ROW_NUMBER() OVER (PARTITION BY `user` ORDER BY pt ASC) AS rn
          FROM events) WHERE rn = 1"""),
    (sink("last_per_user", "`user` STRING, id BIGINT, amount INT"),
     """INSERT INTO last_per_user SELECT `user`, id, amount FROM (
          SELECT `user`, id, amount, ROW_NUMBER() OVER (PARTITION BY `user` ORDER BY pt DESC)
                 AS rn
          FROM events) WHERE rn = 1"""),
    # regular joins: without unique keys (inner, left outer) and with them (inner, full outer)
    (sink("join_inner", "`user` STRING, even_id BIGINT, third_id BIGINT"),
     """INSERT INTO join_inner SELECT a.`user`, a.id, b.id
        FROM (SELECT `user`, id FROM events WHERE MOD(id, 2) = 0) a
        JOIN (SELECT `user`, id FROM events WHERE MOD(id, 3) = 0) b ON a.`user` = b.`user`"""),
    (sink("join_left", "category STRING, even_id BIGINT, fifth_id BIGINT"),
     """INSERT INTO join_left SELECT a.category, a.id, b.id
        FROM (SELECT category, id FROM events WHERE MOD(id, 2) = 0) a
        LEFT JOIN (SELECT category, id FROM events WHERE MOD(id, 5) = 0 AND category <> 'games') b
        ON a.category = b.category"""),
    (sink("join_unique", "`user` STRING, cnt BIGINT, total INT", "`user`"),
     """INSERT INTO join_unique SELECT a.`user`, a.cnt, b.total
        FROM (SELECT `user`, COUNT(*) AS cnt FROM events GROUP BY `user`) a
        JOIN (SELECT `user`, SUM(amount) AS total FROM events GROUP BY `user`) b
        ON a.`user` = b.`user`"""),
    (sink("join_full", "category STRING, cnt BIGINT, price INT"),
     """INSERT INTO join_full SELECT COALESCE(a.category, b.category), a.cnt, b.price
        FROM (SELECT category, COUNT(*) AS cnt FROM events WHERE id < 20 GROUP BY category) a
        FULL OUTER JOIN prices b ON a.category = b.category"""),
    # interval join
    (sink("interval_join", "`user` STRING, even_id BIGINT, third_id BIGINT"),
     """INSERT INTO interval_join SELECT a.`user`, a.id, b.id
        FROM (SELECT * FROM events WHERE MOD(id, 2) = 0) a,
             (SELECT * FROM events WHERE MOD(id, 3) = 0) b
        WHERE a.`user` = b.`user`
          AND a.rowtime BETWEEN b.rowtime - INTERVAL '10' MINUTE AND b.rowtime"""),
    # temporal (versioned) join against the latest event per category (a versioned view)
    (sink("temporal_join", "id BIGINT, category STRING, latest_amount INT"),
     """INSERT INTO temporal_join SELECT e.id, e.category, v.amount
        FROM (SELECT * FROM events WHERE MOD(id, 4) = 0) e
        JOIN latest_event FOR SYSTEM_TIME AS OF e.rowtime AS v
        ON e.category = v.category"""),
    # OVER aggregations: ROWS and RANGE frames
    (sink("over_rows", "`user` STRING, id BIGINT, sum3 INT"),
     """INSERT INTO over_rows SELECT `user`, id, SUM(amount) OVER (PARTITION BY `user`
          ORDER BY rowtime ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) AS sum3 FROM events"""),
    (sink("over_range", "`user` STRING, id BIGINT, max_30m INT"),
     """INSERT INTO over_range SELECT `user`, id, MAX(amount) OVER (PARTITION BY `user`
          ORDER BY rowtime RANGE BETWEEN INTERVAL '30' MINUTE PRECEDING AND CURRENT ROW)
          AS max_30m
        FROM events"""),
    # MATCH_RECOGNIZE
    (sink("pattern_match", "`user` STRING, high_id BIGINT, low_id BIGINT"),
     """INSERT INTO pattern_match SELECT * FROM events MATCH_RECOGNIZE (
          PARTITION BY `user` ORDER BY rowtime
          MEASURES A.id AS high_id, B.id AS low_id
          ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
          PATTERN (A B) DEFINE A AS A.amount > 50, B AS B.amount <= 50)"""),
    # changelog normalize (Debezium source with duplicates possible) and the upsert materializer
    (sink("price_counts", "price INT, cnt BIGINT"),
     "INSERT INTO price_counts SELECT price, COUNT(*) AS cnt FROM prices GROUP BY price"),
    (sink("latest_by_category", "category STRING, `user` STRING, total INT", "category"),
     """INSERT INTO latest_by_category SELECT category, `user`, SUM(amount) AS total FROM events
        GROUP BY category, `user` ON CONFLICT DO DEDUPLICATE"""),
]

MINIBATCH = [
    (sink("mb_totals", "category STRING, cnt BIGINT, total INT, max_amount INT"),
     """INSERT INTO mb_totals SELECT category, COUNT(*) AS cnt, SUM(amount) AS total,
        MAX(amount) AS max_amount
        FROM events GROUP BY category"""),
    (sink("mb_distinct", "category STRING, users BIGINT, total INT"),
     """INSERT INTO mb_distinct SELECT category, COUNT(DISTINCT `user`) AS users,
        SUM(amount) AS total
        FROM events GROUP BY category"""),
]

# Every built-in aggregate function's accumulator (``--job aggs``, and with mini-batch, two-phase
# aggregation and split distinct aggregates: ``--job aggs-minibatch``), for the column names
# statequery takes from the compiled plan (statequery.metadata.plan).
_WINDOW_AGGS = """AVG(amount) AS avg_amount, COUNT(*) AS cnt, SUM(amount) AS total,
        MAX(amount) AS max_amount, COUNT(DISTINCT `user`) AS users"""
_WINDOW_AGG_COLS = "category STRING, window_start TIMESTAMP(3), window_end TIMESTAMP(3), " \
                   "avg_amount INT, cnt BIGINT, total INT, max_amount INT, users BIGINT"


def _window_agg(name: str, tvf: str) -> tuple[str, str]:
    return (sink(name, _WINDOW_AGG_COLS),
            f"""INSERT INTO {name} SELECT category, window_start, window_end, {_WINDOW_AGGS}
            FROM TABLE({tvf}) GROUP BY category, window_start, window_end""")


AGGS = [
    # an append-only input: the plain accumulators
    (sink("agg_plain", "category STRING, avg_amount INT, cnt BIGINT, total INT, users BIGINT, "
                       "user_list STRING, first_amount INT, last_amount INT, min_amount INT, "
                       "max_amount INT, user_bag MULTISET<STRING>, by_id STRING, "
                       "amounts STRING"),
     """INSERT INTO agg_plain SELECT category, AVG(amount) AS avg_amount, COUNT(*) AS cnt,
        SUM(amount) AS total, COUNT(DISTINCT `user`) AS users, LISTAGG(`user`) AS user_list,
        FIRST_VALUE(amount) AS first_amount, LAST_VALUE(amount) AS last_amount,
        MIN(amount) AS min_amount, MAX(amount) AS max_amount, COLLECT(`user`) AS user_bag,
        JSON_OBJECTAGG(KEY CAST(id AS STRING) VALUE amount) AS by_id,
        JSON_ARRAYAGG(amount) AS amounts
        FROM events GROUP BY category"""),
    # an updating input (per-user totals): the accumulators with retraction
    (sink("agg_retract", "category STRING, avg_total INT, sum_total INT, cnt BIGINT, "
                         "min_total INT, max_total INT, first_user STRING, last_user STRING, "
                         "user_list STRING, user_bag MULTISET<STRING>, by_user STRING"),
     """INSERT INTO agg_retract SELECT category, AVG(total) AS avg_total, SUM(total) AS sum_total,
        COUNT(total) AS cnt, MIN(total) AS min_total, MAX(total) AS max_total,
        FIRST_VALUE(`user`) AS first_user, LAST_VALUE(`user`) AS last_user,
        LISTAGG(`user`) AS user_list, COLLECT(`user`) AS user_bag,
        JSON_OBJECTAGG(KEY `user` VALUE total) AS by_user
        FROM (SELECT category, `user`, SUM(amount) AS total FROM events
              GROUP BY category, `user`)
        GROUP BY category"""),
    # a distinct aggregate beside plain ones (split into two levels by the distinct-split option)
    (sink("agg_distinct", "tier INT, custs BIGINT, tiers BIGINT, sum_price INT"),
     """INSERT INTO agg_distinct SELECT MOD(amount, 2) AS tier, COUNT(DISTINCT `user`) AS custs,
        COUNT(DISTINCT category) AS tiers, SUM(amount) AS sum_price
        FROM events GROUP BY MOD(amount, 2)"""),
    _window_agg("agg_tumble", "TUMBLE(TABLE events, DESCRIPTOR(rowtime), INTERVAL '15' MINUTE)"),
    _window_agg("agg_hop", "HOP(TABLE events, DESCRIPTOR(rowtime), INTERVAL '10' MINUTE, "
                           "INTERVAL '20' MINUTE)"),
    _window_agg("agg_cumulate", "CUMULATE(TABLE events, DESCRIPTOR(rowtime), INTERVAL '10' MINUTE, "
                                "INTERVAL '30' MINUTE)"),
    _window_agg("agg_session", "SESSION(TABLE events PARTITION BY category, DESCRIPTOR(rowtime), "
                               "INTERVAL '5' MINUTE)"),
    # SUM alone over an updating input: SumWithRetractAggFunction keeps (sum, count)
    (sink("agg_sum_retract", "category STRING, sum_total INT"),
     """INSERT INTO agg_sum_retract SELECT category, SUM(total) AS sum_total
        FROM (SELECT category, `user`, SUM(amount) AS total FROM events
              GROUP BY category, `user`)
        GROUP BY category"""),
]


# --job cep (fixtures sql-cep-*): MATCH_RECOGNIZE with partial matches pending, state TTL
# (table.exec.state.ttl and a STATE_TTL hint), the window join and the newer upsert
# materializer, in savepoints and checkpoints of both backends. ``cep_events`` reads the same
# rows as ``events`` with a watermark five minutes behind, so the pattern operator has processed
# every event but the last five (still in its queue, by timestamp): its NFA holds partial
# matches and its shared buffer the events and nodes they point to.
CEP_SOURCE = """CREATE TABLE cep_events (
            id BIGINT, `user` STRING, amount INT, category STRING, ts BIGINT,
            rowtime AS TO_TIMESTAMP_LTZ(ts, 3),
            WATERMARK FOR rowtime AS rowtime - INTERVAL '5' MINUTE
        ) WITH ('connector' = 'filesystem', 'path' = 'file://{events_dir}', 'format' = 'json',
                'source.monitor-interval' = '1s')"""

# the TTL of the job (every stateful operator without a hint) and of the hinted aggregation
CEP_TTL = "1 d"
CEP_HINT_TTL = "2 s"

CEP = [
    # A (amount > 50), one or more B (amount <= 95), then C (amount > 95): per user the amounts
    # (i * 37) % 101 rarely exceed 95, so runs of A B+ (several at once, each a branch of the
    # shared buffer) are open when the snapshot is taken
    (sink("pattern_runs", "`user` STRING, a_id BIGINT, last_b_id BIGINT, c_id BIGINT"),
     """INSERT INTO pattern_runs SELECT * FROM cep_events MATCH_RECOGNIZE (
          PARTITION BY `user` ORDER BY rowtime
          MEASURES A.id AS a_id, LAST(B.id) AS last_b_id, C.id AS c_id
          ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
          PATTERN (A B+ C) DEFINE A AS A.amount > 50, B AS B.amount <= 95,
                                   C AS C.amount > 95)"""),
    # state TTL: a per-operator hint (expired at snapshot time) and the job's TTL (live)
    (sink("ttl_short", "`user` STRING, cnt BIGINT, total INT"),
     f"""INSERT INTO ttl_short SELECT /*+ STATE_TTL('events' = '{CEP_HINT_TTL}') */ `user`,
        COUNT(*) AS cnt, SUM(amount) AS total FROM events GROUP BY `user`"""),
    (sink("ttl_job", "category STRING, cnt BIGINT, total INT"),
     """INSERT INTO ttl_job SELECT category, COUNT(*) AS cnt, SUM(amount) AS total
        FROM events GROUP BY category"""),
    # window join (window TVF join): nothing fires, every row waits in its window
    (sink("window_join", "`user` STRING, window_start TIMESTAMP(3), window_end TIMESTAMP(3), "
                         "even_id BIGINT, third_id BIGINT"),
     """INSERT INTO window_join SELECT L.`user`, L.window_start, L.window_end, L.id, R.id
        FROM (SELECT * FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(rowtime), INTERVAL '15' MINUTE))
              WHERE MOD(id, 2) = 0) L
        JOIN (SELECT * FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(rowtime), INTERVAL '15' MINUTE))
              WHERE MOD(id, 3) = 0) R
        ON L.`user` = R.`user` AND L.window_start = R.window_start
           AND L.window_end = R.window_end"""),
    # the upsert materializer of Flink 2.x (table.exec.sink.upsert-materialize-strategy.type)
    (sink("latest_v2", "category STRING, `user` STRING, total INT", "category"),
     """INSERT INTO latest_v2 SELECT category, `user`, SUM(amount) AS total FROM events
        GROUP BY category, `user`"""),
]


# --job over (fixtures sql-over-*): every OVER aggregation operator with fired frames. The input
# is ``over_events``: the events with a watermark five minutes behind (the event-time functions
# have fired every row but the last five, ids 55..59, still in ``inputState``) and processing
# time (the processing-time functions compute each row on arrival). ``table.exec.state.ttl``
# (OVER_TTL) makes each function keep its cleanup time and register processing-time cleanup
# timers. One statement per Flink function (in the order of the plan's node ids):
#   RowTimeRowsBoundedPrecedingFunction, RowTimeRangeBoundedPrecedingFunction,
#   RowTimeUnboundedPrecedingOverFunctionV2 (ROWS and RANGE), ProcTimeRowsBoundedPrecedingFunction,
#   ProcTimeRangeBoundedPrecedingFunction, ProcTimeUnboundedPrecedingFunction.
OVER_SOURCE = """CREATE TABLE over_events (
            id BIGINT, `user` STRING, amount INT, category STRING, ts BIGINT,
            rowtime AS TO_TIMESTAMP_LTZ(ts, 3),
            pt AS PROCTIME(),
            WATERMARK FOR rowtime AS rowtime - INTERVAL '5' MINUTE
        ) WITH ('connector' = 'filesystem', 'path' = 'file://{events_dir}', 'format' = 'json',
                'source.monitor-interval' = '1s')"""

OVER_TTL = "1 d"

OVER = [
    # event time, ROWS BETWEEN 2 PRECEDING: SUM is COUNT + $SUM0 in the plan
    (sink("over_rows3", "`user` STRING, id BIGINT, sum3 INT, n3 BIGINT"),
     """INSERT INTO over_rows3 SELECT `user`, id, SUM(amount) OVER w AS sum3,
          COUNT(*) OVER w AS n3
        FROM over_events
        WINDOW w AS (PARTITION BY `user` ORDER BY rowtime
                     ROWS BETWEEN 2 PRECEDING AND CURRENT ROW)"""),
    # event time, RANGE BETWEEN INTERVAL '30' MINUTE PRECEDING: AVG keeps (sum, count)
    (sink("over_range30", "`user` STRING, id BIGINT, max_30m INT, avg_30m INT"),
     """INSERT INTO over_range30 SELECT `user`, id, MAX(amount) OVER w AS max_30m,
          AVG(amount) OVER w AS avg_30m
        FROM over_events
        WINDOW w AS (PARTITION BY `user` ORDER BY rowtime
                     RANGE BETWEEN INTERVAL '30' MINUTE PRECEDING AND CURRENT ROW)"""),
    # event time, ROWS BETWEEN UNBOUNDED PRECEDING (per category)
    (sink("over_rows_unbounded", "category STRING, id BIGINT, running_min INT, "
                                 "running_cnt BIGINT"),
     """INSERT INTO over_rows_unbounded SELECT category, id,
          MIN(amount) OVER w AS running_min, COUNT(amount) OVER w AS running_cnt
        FROM over_events
        WINDOW w AS (PARTITION BY category ORDER BY rowtime
                     ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)"""),
    # event time, RANGE UNBOUNDED PRECEDING
    (sink("over_range_unbounded", "`user` STRING, id BIGINT, max_id BIGINT, seen BIGINT"),
     """INSERT INTO over_range_unbounded SELECT `user`, id, MAX(id) OVER w AS max_id,
          COUNT(*) OVER w AS seen
        FROM over_events
        WINDOW w AS (PARTITION BY `user` ORDER BY rowtime RANGE UNBOUNDED PRECEDING)"""),
    # processing time, ROWS BETWEEN 3 PRECEDING
    (sink("over_proc_rows4", "`user` STRING, id BIGINT, proc_max4 INT, proc_cnt4 BIGINT"),
     """INSERT INTO over_proc_rows4 SELECT `user`, id, MAX(amount) OVER w AS proc_max4,
          COUNT(*) OVER w AS proc_cnt4
        FROM over_events
        WINDOW w AS (PARTITION BY `user` ORDER BY pt ROWS BETWEEN 3 PRECEDING AND CURRENT ROW)"""),
    # processing time, RANGE BETWEEN INTERVAL '1' HOUR PRECEDING (the whole run is in the frame)
    (sink("over_proc_range", "category STRING, id BIGINT, proc_total BIGINT"),
     """INSERT INTO over_proc_range SELECT category, id,
          SUM(CAST(amount AS BIGINT)) OVER w AS proc_total
        FROM over_events
        WINDOW w AS (PARTITION BY category ORDER BY pt
                     RANGE BETWEEN INTERVAL '1' HOUR PRECEDING AND CURRENT ROW)"""),
    # processing time, unbounded preceding
    (sink("over_proc_unbounded", "`user` STRING, id BIGINT, proc_max_id BIGINT"),
     """INSERT INTO over_proc_unbounded SELECT `user`, id, MAX(id) OVER w AS proc_max_id
        FROM over_events
        WINDOW w AS (PARTITION BY `user` ORDER BY pt
                     ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)"""),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", choices=["ops", "minibatch", "aggs", "aggs-minibatch", "cep",
                                      "over"],
                    required=True)
    ap.add_argument("--backend", choices=["hashmap", "rocksdb"], required=True)
    ap.add_argument("--kind", choices=["savepoint-canonical", "savepoint-native", "checkpoint"],
                    required=True)
    ap.add_argument("--incremental", action="store_true")
    ap.add_argument("--upsert-strategy", choices=["VALUE", "MAP"], default="VALUE",
                    help="--job cep: table.exec.sink.upsert-materialize-strategy.type")
    ap.add_argument("--out", required=True)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--max-parallelism", type=int, default=8)
    ap.add_argument("--settle", type=float, default=8.0)
    args = ap.parse_args()

    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    out_uri = "file://" + out_dir
    events_dir, prices_dir = write_inputs(os.path.join(out_dir, "input"))

    t_env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = t_env.get_config()
    settings = {
        "parallelism.default": "1",
        "pipeline.max-parallelism": str(args.max_parallelism),
        "state.backend.type": args.backend,
        "execution.checkpointing.storage": "filesystem",
        "execution.checkpointing.dir": out_uri,
        "execution.checkpointing.savepoint-dir": out_uri,
        "execution.checkpointing.local-backup.enabled": "false",
        "execution.checkpointing.data-inline-threshold": "0b",
        "table.exec.resource.default-parallelism": "1",
        "table.exec.source.cdc-events-duplicate": "true",
    }
    if args.incremental:
        settings["execution.checkpointing.incremental"] = "true"
    checkpoint = args.kind == "checkpoint"
    if checkpoint:
        settings.update({
            "execution.checkpointing.interval": "1h",
            "execution.checkpointing.min-pause": "1h",
            "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        })
    if args.job == "cep":
        settings.update({
            "table.exec.mini-batch.enabled": "false",
            "table.exec.state.ttl": CEP_TTL,
            "table.exec.sink.upsert-materialize": "FORCE",
            "table.exec.sink.upsert-materialize-strategy.type": args.upsert_strategy,
        })
    elif args.job == "over":
        settings.update({
            "table.exec.mini-batch.enabled": "false",
            "table.exec.state.ttl": OVER_TTL,
        })
    elif args.job in ("minibatch", "aggs-minibatch"):
        settings.update({
            "table.exec.mini-batch.enabled": "true",
            "table.exec.mini-batch.allow-latency": "1s",
            "table.exec.mini-batch.size": "1000",
            "table.optimizer.agg-phase-strategy": "TWO_PHASE",
            "table.optimizer.distinct-agg.split.enabled": "true",
        })
    else:
        settings["table.exec.mini-batch.enabled"] = "false"
    for k, v in settings.items():
        conf.set(k, v)
    for stmt in sources(events_dir, prices_dir) + VIEWS:
        t_env.execute_sql(stmt)
    if args.job == "cep":
        t_env.execute_sql(CEP_SOURCE.format(events_dir=events_dir))
    if args.job == "over":
        t_env.execute_sql(OVER_SOURCE.format(events_dir=events_dir))
    statements = {"ops": OPS, "minibatch": MINIBATCH, "aggs": AGGS,
                  "aggs-minibatch": AGGS, "cep": CEP, "over": OVER}[args.job]
    j_set = t_env._j_tenv.createStatementSet()
    for ddl, insert in statements:
        t_env.execute_sql(ddl)
        j_set.addInsertSql(insert)

    plan = j_set.compilePlan()
    plan_json = plan.asJsonString()
    with open(args.plan, "w") as f:
        f.write(plan_json)
    j_result = plan.execute()
    j_client = j_result.getJobClient().get()
    job_id = j_client.getJobID().toString()
    print(f"JOB_ID={job_id}", flush=True)

    gateway = get_gateway()
    jvm = gateway.jvm
    field = j_client.getClass().getDeclaredField("miniCluster")
    field.setAccessible(True)
    mini_cluster = field.get(j_client)
    deadline = time.time() + 120
    while True:
        graph = mini_cluster.getExecutionGraph(j_client.getJobID()).get()
        states = {v.getName(): v.getAggregateState().toString()
                  for v in graph.getAllVertices().values()}
        if all(s == "RUNNING" for s in states.values()):
            break
        if any(s in ("FAILED", "CANCELED", "FINISHED") for s in states.values()) \
                or time.time() > deadline:
            raise SystemExit(f"job did not reach RUNNING: {states}")
        time.sleep(0.2)
    time.sleep(args.settle)  # file discovery (1 s) and processing of the few input rows

    if checkpoint:
        ctype = jvm.org.apache.flink.core.execution.CheckpointType.CONFIGURED
        chk = mini_cluster.triggerCheckpoint(j_client.getJobID(), ctype).get()
        path = os.path.join(out_dir, job_id, f"chk-{chk}")
    else:
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


if __name__ == "__main__":
    main()
