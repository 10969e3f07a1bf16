"""Regenerate statequery's test fixtures with a real Flink 2.3.0 (see docs/fixtures.md).

    python examples/flink-jobs/generate_fixtures.py                 # the whole matrix
    python examples/flink-jobs/generate_fixtures.py --only NAME      # one fixture (repeatable)

Needs the `fixtures` extra (apache-flink==2.3.0, which bundles the Flink runtime) and a JDK 17
(`java`, `javac`). For each fixture it

1. runs the DataStream job (Java, MiniCluster in one JVM) or the SQL job (PyFlink) into a scratch
   directory under the system temp dir and takes one savepoint or retained checkpoint,
2. copies the snapshot into ``tests/fixtures/<name>/`` (savepoints keep their Flink directory name,
   checkpoints keep ``<job-id>/{chk-N,shared,taskowned}``),
3. writes ``tests/fixtures/expected/<name>.jsonl`` from a pure-Python model of the job over its
   deterministic input (nothing is read back from the snapshot except the generated operator ids
   of the SQL job, which have no uid),
4. runs the Flink-based oracle ``statequery.fixtures.SavepointDump`` (if it is built) into
   ``tests/fixtures/dump/<name>.jsonl`` and compares it with the expected file,
5. records the fixture in ``tests/fixtures/manifest.json``.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import edge_model  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
FIXTURES = REPO / "tests" / "fixtures"
BUILD = HERE / "build"
FLINK_VERSION = "2.3.0"
MAX_FIXTURE_BYTES = 2 * 1024 * 1024


def _fx(name, job, backend, snapshot, fmt, *, incremental=False, max_parallelism=128,
        compression=False, inline=False, timers="rocksdb", changelog="off", unread=None,
        large=False, s3=False):
    fx = {"name": name, "job": job, "backend": backend, "snapshot": snapshot, "format": fmt,
          "incremental": incremental, "max_parallelism": max_parallelism,
          "compression": compression, "inline": inline}
    if timers != "rocksdb":  # state.backend.rocksdb.timer-service.factory
        fx["timers"] = timers
    if changelog != "off":  # state.changelog.enabled, periodic-materialize.interval
        fx["changelog"] = changelog
    if unread:  # the manifest's "unread" list: what statequery lists but cannot read yet, why
        fx["unread"] = unread
    if large:  # edge jobs: also the >64 KiB string and the 66000-byte array
        fx["large"] = True
    if s3:  # checkpoint and ForSt primary directory on the S3 test server (moto)
        fx["s3"] = True
    return fx


def _edge(job, backend, snapshot, fmt, *, incremental=False, large=False, max_parallelism=96):
    """An edge-value fixture (edge_model.py): name edge-<job>-<backend>-<format|checkpoint>."""
    if snapshot == "savepoint":
        suffix = fmt
    else:
        suffix = ("incremental-" if incremental else "full-" if backend == "rocksdb" else "") + (
            "checkpoint")
    return _fx(f"edge-{job}-{backend}-{suffix}", f"edge-{job}", backend, snapshot, fmt,
               incremental=incremental, max_parallelism=max_parallelism, large=large)


MATRIX = [
    _fx("datastream-hashmap-canonical", "datastream", "hashmap", "savepoint", "canonical"),
    _fx("datastream-hashmap-native", "datastream", "hashmap", "savepoint", "native"),
    _fx("datastream-rocksdb-canonical", "datastream", "rocksdb", "savepoint", "canonical"),
    _fx("datastream-rocksdb-native", "datastream", "rocksdb", "savepoint", "native"),
    _fx("sql-hashmap-canonical", "sql", "hashmap", "savepoint", "canonical"),
    _fx("sql-hashmap-native", "sql", "hashmap", "savepoint", "native"),
    _fx("sql-rocksdb-canonical", "sql", "rocksdb", "savepoint", "canonical"),
    _fx("sql-rocksdb-native", "sql", "rocksdb", "savepoint", "native"),
    _fx("datastream-hashmap-inline", "datastream", "hashmap", "savepoint", "canonical",
        inline=True),
    _fx("datastream-rocksdb-canonical-snappy", "datastream", "rocksdb", "savepoint", "canonical",
        compression=True),
    _fx("datastream-hashmap-canonical-maxpar256", "datastream", "hashmap", "savepoint", "canonical",
        max_parallelism=256),
    _fx("datastream-hashmap-checkpoint", "datastream", "hashmap", "checkpoint", "native"),
    _fx("datastream-rocksdb-incremental-checkpoint", "datastream", "rocksdb", "checkpoint",
        "native", incremental=True),
    _fx("datastream-hashmap-checkpoint-snappy", "datastream", "hashmap", "checkpoint", "native",
        compression=True),
    # heap timers on RocksDB: checkpoints write the timers into the operator's raw keyed state
    _fx("datastream-rocksdb-checkpoint-heaptimers", "datastream", "rocksdb", "checkpoint",
        "native", timers="heap"),
    _fx("datastream-rocksdb-incremental-checkpoint-heaptimers", "datastream", "rocksdb",
        "checkpoint", "native", incremental=True, timers="heap"),
    # ForSt (Flink 2.x's disaggregated state backend), its primary directory local
    _fx("datastream-forst-native", "datastream", "forst", "savepoint", "native"),
    _fx("datastream-forst-checkpoint", "datastream", "forst", "checkpoint", "native",
        incremental=True),
    # ForSt with the asynchronous state API (State V2, KEY_VALUE_V2 states): the primary
    # directory is then the checkpoint directory (disaggregated), the checkpoint's SSTs are the
    # database's own files under <job-id>/shared/op_<operator>_<id>__<subtask>_<par>__attempt_0/db/
    _fx("async-datastream-forst-checkpoint", "async-datastream", "forst", "checkpoint", "native",
        incremental=True),
    _fx("async-datastream-forst-native", "async-datastream", "forst", "savepoint", "native"),
    _fx("async-sql-forst-native", "async-sql", "forst", "savepoint", "native"),
    # the same with checkpoints and ForSt's primary directory on the S3 test server (moto,
    # s3://statequery-test/<name>/checkpoints and .../primary): ForSt copies its tables into the
    # checkpoint's shared/ (s3:// handles); the fixture mirrors the bucket under <name>/
    _fx("async-datastream-forst-s3-checkpoint", "async-datastream", "forst", "checkpoint",
        "native", incremental=True, s3=True),
    # the changelog state backend before its first materialization: keyed state only in the log
    _fx("changelog-hashmap-unmaterialized-checkpoint", "datastream", "hashmap", "checkpoint",
        "native", changelog="1h"),
    # ... and after a materialization, with a non-empty change log on top of the base
    _fx("changelog-hashmap-checkpoint", "datastream", "hashmap", "checkpoint", "native",
        changelog="2s+log"),
    _fx("changelog-rocksdb-checkpoint", "datastream", "rocksdb", "checkpoint", "native",
        incremental=True, changelog="2s+log"),
    # ... clears, removals, deleted timers and merging session windows in the change log
    # (ChangelogOps.java), the log alone and on top of a RocksDB base
    _fx("changelog-ops-hashmap-checkpoint", "changelog-ops", "hashmap", "checkpoint", "native",
        changelog="1h"),
    _fx("changelog-ops-rocksdb-checkpoint", "changelog-ops", "rocksdb", "checkpoint", "native",
        incremental=True, changelog="2s+log"),
    # ... the file-system change log snappy-compressed
    # TTL'd value/list/map state and a variable-length (POJO) window namespace
    # (ChangelogTtl.java): a base and a non-empty log, on the hashmap and on RocksDB
    _fx("changelog-ttl-hashmap-checkpoint", "changelog-ttl", "hashmap", "checkpoint", "native",
        changelog="2s+log"),
    _fx("changelog-ttl-rocksdb-checkpoint", "changelog-ttl", "rocksdb", "checkpoint", "native",
        incremental=True, changelog="2s+log"),
    # the changelog TTL job without the changelog (PIPELINE labels: the labels operator keyed by
    # the empty string, a NUL and a non-BMP character among others): String key + LabelWindow
    # (POJO) namespace, both of variable length, so RocksDB's composite keys carry length suffixes
    _fx("labels-rocksdb-native", "labels", "rocksdb", "savepoint", "native"),
    _fx("labels-rocksdb-incremental-checkpoint", "labels", "rocksdb", "checkpoint", "native",
        incremental=True),
    _fx("labels-rocksdb-canonical", "labels", "rocksdb", "savepoint", "canonical"),
    _fx("labels-hashmap-canonical", "labels", "hashmap", "savepoint", "canonical"),
    _fx("changelog-hashmap-snappy-checkpoint", "datastream", "hashmap", "checkpoint", "native",
        changelog="1h@snappy"),
    # ... with the in-memory changelog storage: the change log inline in _metadata
    _fx("changelog-hashmap-memory-checkpoint", "datastream", "hashmap", "checkpoint", "native",
        changelog="1h@memory"),
    _fx("ttl-kryo-hashmap-canonical", "ttl-kryo", "hashmap", "savepoint", "canonical"),
    _fx("ttl-kryo-rocksdb-native", "ttl-kryo", "rocksdb", "savepoint", "native"),
    # GenericRecord state through flink-avro's AvroSerializer (needs FLINK_AVRO_CLASSPATH)
    _fx("types-avro-hashmap-canonical", "types-avro", "hashmap", "savepoint", "canonical"),
    _fx("types-avro-rocksdb-native", "types-avro", "rocksdb", "savepoint", "native"),
    # a V1 run's savepoint restored with a compatible V2 schema (Flink migrates every value)
    _fx("types-avro-evolved-hashmap-canonical", "types-avro-evolved", "hashmap", "savepoint",
        "canonical"),
    _fx("types-avro-evolved-rocksdb-native", "types-avro-evolved", "rocksdb", "savepoint",
        "native"),
    # issue 32: classes Flink serializes with Kryo, decoded with the job's jar (job.jar beside)
    _fx("types-kryo-hashmap-canonical", "kryo-types", "hashmap", "savepoint", "canonical"),
    _fx("types-kryo-rocksdb-native", "kryo-types", "rocksdb", "savepoint", "native"),
    # issue 32: Protobuf messages through Kryo in chill-protobuf's form (descriptors.pb and
    # job.jar beside)
    _fx("types-protobuf-hashmap-canonical", "proto-types", "hashmap", "savepoint", "canonical"),
    _fx("types-protobuf-rocksdb-native", "proto-types", "rocksdb", "savepoint", "native"),
    # an operator's own raw keyed and raw operator state (listed with a reason, never hidden)
    _fx("raw-state-hashmap-canonical", "raw-state", "hashmap", "savepoint", "canonical"),
    _fx("raw-state-rocksdb-native", "raw-state", "rocksdb", "savepoint", "native"),
    # every stateful SQL operator (sql_operators_job.py), run from its compiled plan
    _fx("sql-ops-hashmap-native", "sql-ops", "hashmap", "savepoint", "native", max_parallelism=8),
    _fx("sql-ops-rocksdb-native", "sql-ops", "rocksdb", "savepoint", "native", max_parallelism=8),
    _fx("sql-minibatch-hashmap-native", "sql-minibatch", "hashmap", "savepoint", "native",
        max_parallelism=8),
    _fx("sql-minibatch-rocksdb-native", "sql-minibatch", "rocksdb", "savepoint", "native",
        max_parallelism=8),
    # every built-in aggregate function and window aggregate shape (sql_operators_job.py --job
    # aggs), and the same with mini-batch, two-phase and split distinct aggregation
    _fx("sql-aggs-hashmap-canonical", "sql-aggs", "hashmap", "savepoint", "canonical",
        max_parallelism=8),
    _fx("sql-aggs-minibatch-rocksdb-native", "sql-aggs-minibatch", "rocksdb", "savepoint",
        "native", max_parallelism=8),
    # MATCH_RECOGNIZE with partial matches, SQL state TTL, the window join and the upsert
    # materializer of Flink 2.x (sql_operators_job.py --job cep) on every backend and format
    _fx("sql-cep-hashmap-canonical", "sql-cep", "hashmap", "savepoint", "canonical",
        max_parallelism=8),
    _fx("sql-cep-hashmap-native", "sql-cep", "hashmap", "savepoint", "native", max_parallelism=8),
    _fx("sql-cep-hashmap-checkpoint", "sql-cep", "hashmap", "checkpoint", "native",
        max_parallelism=8),
    _fx("sql-cep-rocksdb-native", "sql-cep", "rocksdb", "savepoint", "native", max_parallelism=8),
    _fx("sql-cep-rocksdb-incremental-checkpoint", "sql-cep", "rocksdb", "checkpoint", "native",
        incremental=True, max_parallelism=8),
    # the same job with the upsert materializer's MAP strategy (its linked sequenced multiset)
    _fx("sql-cep-map-hashmap-native", "sql-cep-map", "hashmap", "savepoint", "native",
        max_parallelism=8),
    # every OVER aggregation function with fired frames and rows waiting for the watermark
    # (sql_operators_job.py --job over)
    _fx("sql-over-hashmap-canonical", "sql-over", "hashmap", "savepoint", "canonical",
        max_parallelism=8),
    _fx("sql-over-rocksdb-native", "sql-over", "rocksdb", "savepoint", "native",
        max_parallelism=8),
    # the DataStream CEP library (CepStreamJob.java): partial matches of Event POJOs
    _fx("cep-stream-hashmap-canonical", "cep-stream", "hashmap", "savepoint", "canonical",
        max_parallelism=8),
    _fx("cep-stream-rocksdb-native", "cep-stream", "rocksdb", "savepoint", "native",
        max_parallelism=8),
    # GROUP BY keys of every common SQL type, nulls included (sql_keys_job.py)
    _fx("keys-sql-hashmap-native", "sql-keys", "hashmap", "savepoint", "native"),
    _fx("keys-sql-hashmap-canonical", "sql-keys", "hashmap", "savepoint", "canonical"),
    _fx("keys-sql-rocksdb-native", "sql-keys", "rocksdb", "savepoint", "native"),
    # edge values of every type (edge_model.py); max parallelism 96 (not a power of two)
    _edge("datastream", "hashmap", "savepoint", "canonical", large=True),
    _edge("datastream", "rocksdb", "savepoint", "native", large=True),
    _edge("datastream", "hashmap", "savepoint", "native"),
    _edge("datastream", "rocksdb", "savepoint", "canonical"),
    _edge("datastream", "hashmap", "checkpoint", "native"),
    _edge("datastream", "rocksdb", "checkpoint", "native"),
    _edge("datastream", "rocksdb", "checkpoint", "native", incremental=True),
    # the SQL one (sql_edge_job.py): parallelism 1, max parallelism 300, run from its compiled plan
    _edge("sql", "hashmap", "savepoint", "canonical", max_parallelism=300),
    _edge("sql", "rocksdb", "savepoint", "native", max_parallelism=300),
    _edge("sql", "hashmap", "savepoint", "native", max_parallelism=300),
    _edge("sql", "rocksdb", "savepoint", "canonical", max_parallelism=300),
    _edge("sql", "hashmap", "checkpoint", "native", max_parallelism=300),
    _edge("sql", "rocksdb", "checkpoint", "native", max_parallelism=300),
    _edge("sql", "rocksdb", "checkpoint", "native", incremental=True, max_parallelism=300),
    # PyFlink DataStream jobs (pyflink_job.py, pyflink_model.py): Python functions in thread mode
    # (pemja, EmbeddedPython*Operator) and process mode (Beam, ExternalPython*Operator)
    _fx("pyflink-thread-hashmap-canonical", "pyflink-thread", "hashmap", "savepoint",
        "canonical"),
    _fx("pyflink-thread-rocksdb-native", "pyflink-thread", "rocksdb", "savepoint", "native"),
    _fx("pyflink-process-hashmap-canonical", "pyflink-process", "hashmap", "savepoint",
        "canonical"),
    _fx("pyflink-process-rocksdb-native", "pyflink-process", "rocksdb", "savepoint", "native"),
]
SQL_OPERATOR_JOBS = {"sql-ops": "ops", "sql-minibatch": "minibatch", "sql-aggs": "aggs",
                     "sql-aggs-minibatch": "aggs-minibatch", "sql-cep": "cep",
                     "sql-cep-map": "cep", "sql-over": "over"}
# SQL jobs run from a compiled plan: operator ids from the plan
PLAN_JOBS = {*SQL_OPERATOR_JOBS, "edge-sql"}
# jobs whose manifest states come from the dump and whose expected file is a subset of it
SUBSET_JOBS = {*PLAN_JOBS, "sql-keys", "changelog-ops", "changelog-ttl", "labels", "cep-stream"}
BY_NAME = {f["name"]: f for f in MATRIX}
PYFLINK_JOBS = {"pyflink-thread", "pyflink-process"}
# process mode: every value is in PyFlink's own (Beam) coder bytes; the model covers the
# LONG, STRING and pickled states and the timers, the dump everything
SUBSET_JOBS.add("pyflink-process")

# Series: one job run, several snapshots (consecutive retained checkpoints chk-1..3 and a
# canonical savepoint after them), each recorded as its own fixture "<series>-chk-N" /
# "<series>-savepoint" with "series" and "series_index" in the manifest.
SERIES = [
    {"name": "sequence-rocksdb-incremental", "job": "sequence", "backend": "rocksdb",
     "incremental": True},
]
SERIES_BY_NAME = {s["name"]: s for s in SERIES}


# --------------------------------------------------------------------------------------------
# Operator ids: Flink hashes a uid with Guava's murmur3_128 (seed 0); OperatorID.toString() is the
# hex of the 16 hash bytes. Own implementation of MurmurHash3 x64 128.
# --------------------------------------------------------------------------------------------

_M64 = (1 << 64) - 1


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _fmix(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _M64
    return k ^ (k >> 33)


def murmur3_x64_128(data: bytes, seed: int = 0) -> bytes:
    c1, c2 = 0x87C37B91114253D5, 0x4CF5AD432745937F
    h1 = h2 = seed
    nblocks = len(data) // 16
    for i in range(nblocks):
        k1 = int.from_bytes(data[16 * i:16 * i + 8], "little")
        k2 = int.from_bytes(data[16 * i + 8:16 * i + 16], "little")
        h1 ^= (_rotl((k1 * c1) & _M64, 31) * c2) & _M64
        h1 = (((_rotl(h1, 27) + h2) & _M64) * 5 + 0x52DCE729) & _M64
        h2 ^= (_rotl((k2 * c2) & _M64, 33) * c1) & _M64
        h2 = (((_rotl(h2, 31) + h1) & _M64) * 5 + 0x38495AB5) & _M64
    tail = data[16 * nblocks:]
    if len(tail) > 8:
        k2 = int.from_bytes(tail[8:], "little")
        h2 ^= (_rotl((k2 * c2) & _M64, 33) * c1) & _M64
    if tail:
        k1 = int.from_bytes(tail[:8], "little")
        h1 ^= (_rotl((k1 * c1) & _M64, 31) * c2) & _M64
    h1 ^= len(data)
    h2 ^= len(data)
    h1 = (h1 + h2) & _M64
    h2 = (h2 + h1) & _M64
    h1, h2 = _fmix(h1), _fmix(h2)
    h1 = (h1 + h2) & _M64
    h2 = (h2 + h1) & _M64
    return h1.to_bytes(8, "little") + h2.to_bytes(8, "little")


def operator_id_for_uid(uid: str) -> str:
    return murmur3_x64_128(uid.encode("utf-8")).hex()


# --------------------------------------------------------------------------------------------
# Entry helpers (docs/fixtures.md "Entry format")
# --------------------------------------------------------------------------------------------


def canonical(entry: dict) -> str:
    return json.dumps(entry, sort_keys=True, separators=(",", ":"))


def b64(data: bytes) -> dict:
    return {"$bytes": base64.b64encode(data).decode("ascii")}


def java_utf(s: str) -> bytes:
    raw = s.encode("utf-8")  # the fixture strings are ASCII: modified UTF-8 == UTF-8
    return struct.pack(">H", len(raw)) + raw


# --------------------------------------------------------------------------------------------
# The DataStream job, modelled (DataStreamStateJob.java / FixtureFunctions.java)
# --------------------------------------------------------------------------------------------

N_EVENTS = 200
N_USERS = 20
CATEGORIES = ["books", "games", "music", "food"]
TS_BASE = 1_700_000_000_000
TIMER_BASE = 4102444800000
HOUR_MS = 3_600_000
TIERS = ["GOLD", "SILVER", "BRONZE"]


def ds_event(i: int) -> dict:
    return {"id": i, "user": f"user-{i % N_USERS}", "u": i % N_USERS,
            "amount": (i * 37) % 101, "category": CATEGORIES[(i // 20) % 4],
            "ts": TS_BASE + i * 60_000}


DS_UIDS = {
    "fixture-source": "Source: Fixture Source",
    "operator-state": "Operator State",
    "user-state": "User State",
    "window-agg": "Window Agg",
    "fixture-sink": "Fixture Sink: Writer",
    "window-sink": "Window Sink: Writer",
}


def _st(name, kind, value_type, key_type=None, namespace_type=None, user_key_type=None,
        ttl=False, decodable=True):
    st = {"name": name, "kind": kind}
    if key_type is not None:
        st["key_type"] = key_type
        st["namespace_type"] = namespace_type
    if user_key_type is not None:
        st["user_key_type"] = user_key_type
    st["value_type"] = value_type
    if ttl:
        st["ttl"] = True
    if not decodable:
        st["decodable"] = False
    return st


PROFILE_TYPE = ("POJO<statequery.fixtures.UserProfile>{name STRING, totalAmount BIGINT, "
                "lastAmount INT NULL, "
                "address POJO<statequery.fixtures.Address>{city STRING, zip INT}, "
                "tier ENUM<statequery.fixtures.Tier>}")

DS_STATES = {
    "fixture-source": [_st("SourceReaderState", "operator_list",
                           "BYTES (SimpleVersionedSerialization of FixtureSplit)")],
    "operator-state": [
        _st("buffered-ids", "operator_list", "BIGINT"),
        _st("union-markers", "operator_union", "STRING"),
        _st("rules", "broadcast", "STRING", user_key_type="STRING"),
    ],
    "user-state": [
        _st("count", "value", "BIGINT", "STRING", "VOID"),
        _st("recent-categories", "list", "STRING", "STRING", "VOID"),
        _st("amount-by-category", "map", "BIGINT", "STRING", "VOID", user_key_type="STRING"),
        _st("sum-amount", "reducing", "BIGINT", "STRING", "VOID"),
        _st("avg-amount", "aggregating", "TUPLE2<BIGINT, BIGINT> (accumulator: sum, count)",
            "STRING", "VOID"),
        _st("profile", "value", PROFILE_TYPE, "STRING", "VOID"),
        _st("_timer_state/event_user-timers", "event_timer", None, "STRING", "VOID"),
        _st("_timer_state/processing_user-timers", "processing_timer", None, "STRING", "VOID"),
    ],
    "window-agg": [
        _st("window-contents", "aggregating", "BIGINT (accumulator)", "STRING", "TimeWindow"),
        _st("_timer_state/event_window-timers", "event_timer", None, "STRING", "TimeWindow"),
        _st("_timer_state/processing_window-timers", "processing_timer", None, "STRING",
            "TimeWindow"),
    ],
}


def changelog_ops_expected() -> list[dict]:
    """The ``ops`` operator of the changelog operations pipeline (ChangelogOps.java), replayed
    per user; the session windows (merged namespaces) are left to the oracle (subset)."""
    entries: list[dict] = []
    ids = {uid: operator_id_for_uid(uid) for uid in ("fixture-source", "ops")}

    def add(uid, state, kind, **fields):
        entries.append({"operator_uid": uid, "operator_id": ids[uid], "state": state,
                        "kind": kind, **fields})

    source_expected(add)
    for u in range(N_USERS):
        last = None
        slots: dict[str, int] = {}
        history: list[int] = []
        timers: set[int] = set()
        for n in range(N_EVENTS // N_USERS):
            i = 20 * n + u
            last = None if (n + u) % 3 == 2 else i
            slots[f"s{n % 4}"] = i
            if (n + u) % 5 == 4:
                slots.pop(f"s{(n + 1) % 4}", None)
            if (n + u) % 6 == 5:
                slots[f"p{n % 2}"] = -i
            if (n + u) % 8 == 7:
                slots = {}
            history.append(i)
            if (n + u) % 4 == 3:
                history = [i]
            if (n + u) % 6 == 1:
                history += [-i, i + 1000]
            if (n + u) % 7 == 6:
                history = []
            timers.add(TIMER_BASE + i)
            if n > 0 and (n + u) % 2 == 0:
                timers.discard(TIMER_BASE + i - 20)
        ks = {"key": f"user-{u}", "namespace": None}
        if last is not None:
            add("ops", "last-id", "value", value=last, **ks)
        for k, v in slots.items():
            add("ops", "slots", "map", user_key=k, value=v, **ks)
        if history:
            add("ops", "history", "list", value=history, **ks)
        for t in sorted(timers):
            add("ops", "_timer_state/event_user-timers", "event_timer", timestamp=t, **ks)
    return entries


def changelog_ttl_expected() -> list[dict]:
    """The ``ttl`` operator of the changelog TTL pipeline (ChangelogTtl.java), replayed per
    user (``last_access``: processing time, any); the ``labels`` windows (a POJO namespace) are
    left to the oracle (subset)."""
    entries: list[dict] = []
    ids = {uid: operator_id_for_uid(uid) for uid in ("fixture-source", "ttl")}

    def add(uid, state, kind, **fields):
        entries.append({"operator_uid": uid, "operator_id": ids[uid], "state": state,
                        "kind": kind, **fields})

    source_expected(add)
    for u in range(N_USERS):
        mine = [ds_event(i) for i in range(u, N_EVENTS, N_USERS)]
        history: list[str] = []
        sums: dict[str, int] = {}
        for e in mine:
            history.append(e["category"])
            if e["id"] % 7 == 6:
                history = []
            sums[e["category"]] = sums.get(e["category"], 0) + e["amount"]
            if e["id"] % 9 == 8:
                sums.pop(e["category"])
        ks = {"key": f"user-{u}", "namespace": None}
        add("ttl", "ttl-count", "value", value=ttl(len(mine)), **ks)
        if history:
            add("ttl", "ttl-list", "list", value=[ttl(c) for c in history], **ks)
        for k, v in sums.items():
            add("ttl", "ttl-map", "map", user_key=k, value=ttl(v), **ks)
    return entries


def source_expected(add) -> None:
    """fixture-source: the reader got split-0 then split-1 and read both to the end. Each list
    element is SimpleVersionedSerialization: int version, int length, then the split bytes
    (FixtureSplitSerializer v1: writeUTF(id), writeLong(next))."""
    for index, (split_id, nxt) in enumerate([("split-0", 100), ("split-1", 200)]):
        payload = java_utf(split_id) + struct.pack(">q", nxt)
        data = struct.pack(">ii", 1, len(payload)) + payload
        add("fixture-source", "SourceReaderState", "operator_list", subtask=0, index=index,
            value=b64(data))


def datastream_expected() -> list[dict]:
    entries: list[dict] = []
    ids = {uid: operator_id_for_uid(uid) for uid in DS_UIDS}

    def add(uid, state, kind, **fields):
        entries.append({"operator_uid": uid, "operator_id": ids[uid], "state": state,
                        "kind": kind, **fields})

    source_expected(add)

    # operator-state
    for subtask in range(2):
        for index, v in enumerate([subtask * 1000 + 1, subtask * 1000 + 2]):
            add("operator-state", "buffered-ids", "operator_list", subtask=subtask, index=index,
                value=v)
        add("operator-state", "union-markers", "operator_union", subtask=subtask, index=0,
            value=f"subtask-{subtask}")
    for k, v in {"books": "discount-10", "games": "discount-20", "music": "none"}.items():
        add("operator-state", "rules", "broadcast", subtask=0, user_key=k, value=v)

    # user-state: per user, its events in input order (all of a user's events travel through the
    # same operator-state subtask: 20 users, strict round-robin over 2 channels).
    events = [ds_event(i) for i in range(N_EVENTS)]
    for u in range(N_USERS):
        user = f"user-{u}"
        mine = [e for e in events if e["u"] == u]
        total = sum(e["amount"] for e in mine)
        ks = {"key": user, "namespace": None}
        add("user-state", "count", "value", value=len(mine), **ks)
        add("user-state", "recent-categories", "list", value=[e["category"] for e in mine], **ks)
        by_cat: dict[str, int] = {}
        for e in mine:
            by_cat[e["category"]] = by_cat.get(e["category"], 0) + e["amount"]
        for cat, amount in by_cat.items():
            add("user-state", "amount-by-category", "map", user_key=cat, value=amount, **ks)
        add("user-state", "sum-amount", "reducing", value=total, **ks)
        add("user-state", "avg-amount", "aggregating", value={"f0": total, "f1": len(mine)}, **ks)
        profile = {
            "name": user,
            "totalAmount": total,
            "lastAmount": None if u % 2 == 0 else mine[-1]["amount"],
            "address": {"city": f"city-{u % 3}", "zip": 10000 + u},
            "tier": TIERS[u % 3],
        }
        add("user-state", "profile", "value", value=profile, **ks)
        add("user-state", "_timer_state/event_user-timers", "event_timer",
            timestamp=TIMER_BASE + u, **ks)
        add("user-state", "_timer_state/processing_user-timers", "processing_timer",
            timestamp=TIMER_BASE + 1000 + u, **ks)

        # window-agg: 1 h tumbling event-time windows, nothing ever fired.
        windows: dict[int, int] = {}
        for e in mine:
            start = e["ts"] - e["ts"] % HOUR_MS
            windows[start] = windows.get(start, 0) + e["amount"]
        for start, amount in windows.items():
            ns = {"start": start, "end": start + HOUR_MS}
            add("window-agg", "window-contents", "aggregating", key=user, namespace=ns,
                value=amount)
            add("window-agg", "_timer_state/event_window-timers", "event_timer", key=user,
                namespace=ns, timestamp=start + HOUR_MS - 1)
    return entries


# AsyncStateJob.java: the DataStream job's source and user-state (on State V2), no operator-state
# and window-agg; keyed directly after the source, so per-key order is input order as before.
ASYNC_DS_UIDS = ("fixture-source", "user-state")


def async_datastream_expected() -> list[dict]:
    return [e for e in datastream_expected() if e["operator_uid"] in ASYNC_DS_UIDS]


# --------------------------------------------------------------------------------------------
# The TTL + Kryo job, modelled (TtlKryoJob.java)
# --------------------------------------------------------------------------------------------

TK_KEYS = 10
ANY = "$any"  # expected-file wildcard: any integer (TTL last_access is processing time)
NOTE_CLASS = "statequery.fixtures.Note"
NOTE_TYPE = "KRYO<statequery.fixtures.Note> (no public no-arg constructor: KryoSerializer)"

TK_UIDS = {
    "fixture-source": "Source: Fixture Source",
    "ttl-kryo-state": "TTL Kryo State",
    "fixture-sink": "Fixture Sink: Writer",
}

TK_STATES = {
    "fixture-source": DS_STATES["fixture-source"],
    "ttl-kryo-state": [
        _st("ttl-count", "value", "BIGINT", "STRING", "VOID", ttl=True),
        _st("ttl-list", "list", "STRING", "STRING", "VOID", ttl=True),
        _st("ttl-map", "map", "BIGINT", "STRING", "VOID", user_key_type="STRING", ttl=True),
        _st("kryo-value", "value", NOTE_TYPE, "STRING", "VOID", decodable=False),
        _st("kryo-map", "map", NOTE_TYPE, "STRING", "VOID", user_key_type="STRING",
            decodable=False),
        # registered by KeyedProcessOperator, never used: empty
        _st("_timer_state/event_user-timers", "event_timer", None, "STRING", "VOID"),
        _st("_timer_state/processing_user-timers", "processing_timer", None, "STRING", "VOID"),
    ],
}


def _zigzag_varlong(v: int) -> bytes:
    z = ((v << 1) ^ (v >> 63)) & _M64
    out = bytearray()
    while True:
        b = z & 0x7F
        z >>= 7
        if z:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def kryo_note(label: str, total: int) -> dict:
    """Note(label, total) as Flink's KryoSerializer (Kryo 5) writes it: class id 0x57 (varint of
    registration id 85 + 2, the id the restored KryoSerializer gives Note), the
    reference marker 0x01 (new object), then the FieldSerializer fields in name order: ``label``
    (0x01 not-null, then an ASCII string whose last char has bit 7 set) and ``total`` (zigzag
    varlong)."""
    assert label and label.isascii()
    raw = label.encode("ascii")
    data = b"\x57\x01\x01" + raw[:-1] + bytes([raw[-1] | 0x80]) + _zigzag_varlong(total)
    return {"$raw": base64.b64encode(data).decode("ascii"), "$class": NOTE_CLASS}


def ttl(value) -> dict:
    return {"value": value, "last_access": ANY}


def ttl_kryo_expected() -> list[dict]:
    entries: list[dict] = []
    ids = {uid: operator_id_for_uid(uid) for uid in TK_UIDS}

    def add(uid, state, kind, **fields):
        entries.append({"operator_uid": uid, "operator_id": ids[uid], "state": state,
                        "kind": kind, **fields})

    source_expected(add)
    events = [ds_event(i) for i in range(N_EVENTS)]
    for k in range(TK_KEYS):
        key = f"k{k}"
        mine = [e for e in events if e["id"] % TK_KEYS == k]  # input order
        ks = {"key": key, "namespace": None}
        add("ttl-kryo-state", "ttl-count", "value", value=ttl(len(mine)), **ks)
        add("ttl-kryo-state", "ttl-list", "list", value=[ttl(e["category"]) for e in mine], **ks)
        by_cat: dict[str, list[int]] = {}
        for e in mine:
            by_cat.setdefault(e["category"], []).append(e["amount"])
        for cat, amounts in by_cat.items():
            add("ttl-kryo-state", "ttl-map", "map", user_key=cat, value=ttl(sum(amounts)), **ks)
            add("ttl-kryo-state", "kryo-map", "map", user_key=cat,
                value=kryo_note(cat, len(amounts)), **ks)
        add("ttl-kryo-state", "kryo-value", "value",
            value=kryo_note(key, sum(e["amount"] for e in mine)), **ks)
    return entries


# --------------------------------------------------------------------------------------------
# The Avro job, modelled (src-avro/.../AvroStateJob.java): GenericRecords through Flink's
# AvroSerializer, in the oracle's rendering (DumpAvro.java, docs/avro.md): null + T as T, other
# unions as {"branch", one member per non-null branch}, decimal as plain text, timestamps as
# epoch nanoseconds, uuid as text, bytes and fixed as {"$bytes"}.
# --------------------------------------------------------------------------------------------

AV_KEYS = 8
AV_UIDS = {
    "fixture-source": "Source: Fixture Source",
    "avro-state": "Avro State",
    "fixture-sink": "Fixture Sink: Writer",
}
AV_STATES = {
    "fixture-source": DS_STATES["fixture-source"],
    "avro-state": [
        _st("everything", "value", "AVRO<statequery.avro.Everything>", "STRING", "VOID"),
        _st("items", "map", "AVRO<statequery.avro.Item>", "STRING", "VOID",
            user_key_type="STRING"),
        _st("history", "list", "AVRO<statequery.avro.Item>", "STRING", "VOID"),
        _st("seen", "value", "BIGINT", "STRING", "VOID"),
        _st("specific", "value", "AVRO<statequery.avro.Reading>", "STRING", "VOID"),
        _st("_timer_state/event_user-timers", "event_timer", None, "STRING", "VOID"),
        _st("_timer_state/processing_user-timers", "processing_timer", None, "STRING", "VOID"),
    ],
}
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_FLOAT_MAX = struct.unpack(">f", b"\x7f\x7f\xff\xff")[0]


def _avro_item(name: str, qty: int, note) -> dict:
    return {"name": name, "qty": qty, "note": note}


def _union(index: int, names: list[str], branch: str, value) -> dict:
    out = dict.fromkeys(names)
    out["branch"] = index
    out[branch] = value
    return out


def _map(pairs: dict) -> list[dict]:
    return [{"key": k, "value": v} for k, v in sorted(pairs.items(),
                                                      key=lambda kv: canonical(kv[0]))]


def _dec(unscaled: int, scale: int) -> str:
    from decimal import Decimal

    return format(Decimal(unscaled).scaleb(-scale), "f")


def _uuid16(hi: int, lo: int) -> str:
    import uuid

    return str(uuid.UUID(bytes=struct.pack(">qq", hi, lo)))


def _f32(x: float) -> float:
    return struct.unpack(">f", struct.pack(">f", x))[0]


def avro_everything(k: int) -> dict:
    """AvroStateJob.everything(k) as the oracle renders it."""
    colors = ["RED", "GREEN", "BLUE"]
    multi_names = ["int", "string", "Item", "array"]
    r: dict = {"n": None, "color": colors[k % 3],
               "fx": b64(bytes([k, 0, 0xFF, (k * 37) & 0xFF]))}
    if k == 0:
        r.update(b=False, i=0, l=0, f=0.0, d=0.0, s="", by=b64(b""), ints=[], items=[], longs=[],
                 opt_strings=[], opt_s=None, opt_item=None, multi=None,
                 either=_union(0, ["string", "long"], "string", ""),
                 dec_bytes=_dec(0, 4), dec_fixed=_dec(0, 2), day=0, t_ms=0, t_us=0, ts_ms=0,
                 ts_us=0, lts_ms=0, lts_us=0, id="00000000-0000-0000-0000-000000000000",
                 uid16=_uuid16(0, 0), opt_day=None, opt_list=[])
        nested = {"label": "", "inner": {"grid": [], "tag": None}}
    elif k == 1:
        r.update(b=True, i=_INT_MIN, l=_LONG_MIN, f=-_FLOAT_MAX, d=-0.0, s="\0", by=b64(b"\0"),
                 ints=[_INT_MIN, -1, 0], items=[_avro_item("", _LONG_MIN, None)],
                 longs=_map({"": _LONG_MIN, "\0": -1}),
                 opt_strings=_map({"null": None, "empty": ""}), opt_s="",
                 opt_item=_avro_item("\0", -1, ""),
                 multi=_union(1, multi_names, "int", _INT_MIN),
                 either=_union(1, ["string", "long"], "long", _LONG_MIN),
                 dec_bytes=_dec(-99999999999999999999, 4),
                 dec_fixed=_dec(-999999999999999999999, 2), day=-719162, t_ms=1, t_us=1,
                 ts_ms=-62135596800000 * 10**6, ts_us=-62135596800000000 * 1000,
                 lts_ms=-1 * 10**6, lts_us=-1000, id="ffffffff-ffff-ffff-ffff-ffffffffffff",
                 uid16=_uuid16(-1, -1), opt_day=-1, opt_list=None)
        nested = {"label": "\0x\0", "inner": {"grid": [[]], "tag": "BLUE"}}
    elif k == 2:
        smile, clef = "\U0001F600", "\U0001D11E"
        r.update(b=False, i=_INT_MAX, l=_LONG_MAX, f="NaN", d="NaN",
                 s=f"{smile} {clef} \u00e9\u4e2d", by=b64(b"\xff\x00\x7f"), ints=[_INT_MAX],
                 items=[_avro_item(smile, _LONG_MAX, clef), _avro_item("two", 2, None)],
                 longs=_map({smile: _LONG_MAX}), opt_strings=_map({clef: smile}), opt_s=smile,
                 opt_item=None, multi=_union(2, multi_names, "string", smile),
                 either=_union(0, ["string", "long"], "string", clef),
                 dec_bytes=_dec(99999999999999999999, 4),
                 dec_fixed=_dec(999999999999999999999, 2), day=2932896, t_ms=86399999,
                 t_us=86399999999, ts_ms=253402300799999 * 10**6,
                 ts_us=253402300799999999 * 1000, lts_ms=253402300799999 * 10**6,
                 lts_us=253402300799999999 * 1000, id="123e4567-e89b-12d3-a456-426614174000",
                 uid16=_uuid16(0x123e4567e89b12d3, 0xa456426614174000 - (1 << 64)),
                 opt_day=2932896, opt_list=["", "\0", smile])
        cell = _map({"nan": "NaN", "inf": "Infinity", "ninf": "-Infinity", "null": None})
        nested = {"label": smile, "inner": {"grid": [cell, []], "tag": None}}
    else:
        dec = k * 123456789 - 500_000_000
        multis = [
            _union(1, multi_names, "int", k),
            _union(2, multi_names, "string", f"m{k}"),
            _union(3, multi_names, "Item", _avro_item(f"mi{k}", k, "n")),
            _union(4, multi_names, "array", [k + 0.5, -0.0]),
            None,
        ]
        r.update(b=k % 2 == 0, i=k * 1000 - 3, l=k * 1_000_000_007, f=_f32(k + 0.25),
                 d=k / 3.0, s=f"value-{k}", by=b64(f"b{k}".encode()),
                 ints=[j * k for j in range(k)],
                 items=[_avro_item(f"i{k}", k, None if k % 2 == 0 else "odd")],
                 longs=_map({f"m{j}": j - k for j in range(k)}),
                 opt_strings=_map({"k": None if k % 2 == 0 else f"v{k}"}),
                 opt_s=None if k % 2 == 0 else f"s{k}", opt_item=_avro_item(f"opt{k}", -k, None),
                 multi=multis[k % 5],
                 either=(_union(0, ["string", "long"], "string", f"e{k}") if k % 2 == 0
                         else _union(1, ["string", "long"], "long", -k)),
                 dec_bytes=_dec(dec, 4), dec_fixed=_dec(-dec, 2), day=19000 + k,
                 t_ms=k * 3_600_000 + 1, t_us=k * 3_600_000_000 + 7,
                 ts_ms=(1_700_000_000_000 + k) * 10**6,
                 ts_us=(1_700_000_000_000_000 + k) * 1000,
                 lts_ms=(1_600_000_000_000 - k) * 10**6,
                 lts_us=(1_600_000_000_000_000 - k) * 1000,
                 id=f"00000000-0000-4000-8000-{k:012d}", uid16=_uuid16(k, -k),
                 opt_day=None if k % 2 == 0 else -k,
                 opt_list=None if k % 2 == 0 else [f"a{k}"])
        nested = {"label": f"outer-{k}",
                  "inner": {"grid": [_map({"x": float(k), "y": None})],
                            "tag": colors[(k + 1) % 3]}}
    r["nested"] = nested
    return r


AV_EVOLVE_UIDS = {
    "fixture-source": "Source: Fixture Source",
    "avro-evolve": "Avro Evolve",
    "fixture-sink": "Fixture Sink: Writer",
}
AV_EVOLVE_STATES = {
    "fixture-source": DS_STATES["fixture-source"],
    "avro-evolve": [
        _st("latest", "value", "AVRO<statequery.avro.Evolving>", "STRING", "VOID"),
        _st("firsts", "list", "AVRO<statequery.avro.Evolving>", "STRING", "VOID"),
        _st("seen", "value", "BIGINT", "STRING", "VOID"),
        _st("_timer_state/event_user-timers", "event_timer", None, "STRING", "VOID"),
        _st("_timer_state/processing_user-timers", "processing_timer", None, "STRING", "VOID"),
    ],
}


def avro_evolved_expected() -> list[dict]:
    """AvroEvolveJob: the V1 run's records, as Flink migrated them to V2 (``scratch`` dropped,
    ``qty`` a long)."""
    entries: list[dict] = []
    ids = {uid: operator_id_for_uid(uid) for uid in AV_EVOLVE_UIDS}

    def add(uid, state, kind, **fields):
        entries.append({"operator_uid": uid, "operator_id": ids[uid], "state": state,
                        "kind": kind, **fields})

    def record(e: dict) -> dict:
        return {"name": f"e{e['id']}", "qty": e["amount"],
                "note": e["category"] if e["amount"] % 2 == 1 else None}

    source_expected(add)
    events = [ds_event(i) for i in range(N_EVENTS)]
    for k in range(AV_KEYS):
        mine = [e for e in events if e["id"] % AV_KEYS == k]
        ks = {"key": f"k{k}", "namespace": None}
        add("avro-evolve", "latest", "value", value=record(mine[-1]), **ks)
        add("avro-evolve", "firsts", "list", value=[record(e) for e in mine[:2]], **ks)
        add("avro-evolve", "seen", "value", value=len(mine), **ks)
    return entries


def avro_expected() -> list[dict]:
    entries: list[dict] = []
    ids = {uid: operator_id_for_uid(uid) for uid in AV_UIDS}

    def add(uid, state, kind, **fields):
        entries.append({"operator_uid": uid, "operator_id": ids[uid], "state": state,
                        "kind": kind, **fields})

    source_expected(add)
    events = [ds_event(i) for i in range(N_EVENTS)]
    for k in range(AV_KEYS):
        key = f"k{k}"
        mine = [e for e in events if e["id"] % AV_KEYS == k]  # input order
        ks = {"key": key, "namespace": None}
        add("avro-state", "everything", "value", value=avro_everything(k), **ks)
        add("avro-state", "seen", "value", value=len(mine), **ks)
        last = mine[-1]
        add("avro-state", "specific", "value", value={
            "sensor": key, "reading": last["amount"] / 4.0, "at": last["ts"] * 10**6,
            "level": "HIGH" if last["amount"] > 50 else "LOW",
            "samples": [last["id"], last["amount"]],
            "tags": _map({"category": last["category"], "user": last["user"]}),
            "remark": None if last["amount"] % 2 == 1 else "even"}, **ks)
        add("avro-state", "history", "list",
            value=[_avro_item(f"e{e['id']}", e["amount"], None) for e in mine[:3]], **ks)
        by_cat: dict[str, int] = {}
        for e in mine:
            by_cat[e["category"]] = by_cat.get(e["category"], 0) + 1
        for cat, n in by_cat.items():
            add("avro-state", "items", "map", user_key=cat, value=_avro_item(cat, n, key), **ks)
    return entries


# --------------------------------------------------------------------------------------------
# The Kryo types job, modelled (src/statequery/kryotypes/KryoTypesJob.java, Order.java, Shape.java)
# The oracle dumps a Kryo value's fields by reflection (-Dstatequery.dump.kryoFields=true):
# {"class": name, SimpleName: fields} where the declared type is an interface or abstract class.
# --------------------------------------------------------------------------------------------

KT_KEYS = 8
KT_PKG = "statequery.kryotypes"
KT_NAMES = ["", "a", "plain ascii", "nul\x00inside", "non-BMP \U0001F600 smile",
            "\u00fcn\u00efc\u00f6d\u00e9",
            "a long ascii string of more than thirty-two characters", "\u65e5\u672c"]
KT_STATES = {
    "fixture-source": DS_STATES["fixture-source"],
    "kryo-types": [
        _st("order", "value", f"KRYO<{KT_PKG}.Order> (final fields, no no-arg constructor)",
            "STRING", "VOID", decodable=False),
        _st("shapes", "map", f"KRYO<{KT_PKG}.Shape> (an interface)", "STRING", "VOID",
            user_key_type="STRING", decodable=False),
        _st("shape-log", "list", f"KRYO<{KT_PKG}.Shape> (an interface)", "STRING", "VOID",
            decodable=False),
        _st("_timer_state/event_user-timers", "event_timer", None, "STRING", "VOID"),
        _st("_timer_state/processing_user-timers", "processing_timer", None, "STRING", "VOID"),
    ],
}
KT_JAR_CLASSES = "statequery/kryotypes"


def _kt_shape(k: int, n: int) -> dict:
    r = (k + n) % 3
    if r == 0:
        cls, fields = "Circle", {"radius": k + n / 4.0}
    elif r == 1:
        cls, fields = "Rect", {"width": k, "height": n}
    else:
        cls, fields = "Rect", {"width": -k, "height": n * 1000}
    return {"class": f"{KT_PKG}.{cls}", cls: fields}


def _kt_epoch_nanos(y, mo, d, h=0, mi=0, s=0, nano=0) -> int:
    days = (dt.date(y, mo, d) - dt.date(1970, 1, 1)).days
    return ((days * 24 + h) * 60 + mi) * 60_000_000_000 + s * 1_000_000_000 + nano


def kt_order(k: int, n: int) -> dict:
    """Order.make(k, n) as the oracle renders it (every non-static, non-transient field)."""
    name = KT_NAMES[k]
    counts = None
    if k != 6:
        counts = [] if k == 7 else [{"key": "a", "value": k},
                                    {"key": "b", "value": None if k == 1 else n}]
    return {
        "address": None if k == 5 else {"city": f"city{k}", "zip": 10000 + k},
        "alias": name, "customer": name, "byteBox": k - 4,
        "color": None if k == 7 else ["RED", "GREEN", "BLUE"][k % 3],
        "count": n, "counts": counts,
        "created": -999_999_995 if k == 0 else (1_700_000_000 + k * 86_400) * 10**9 + k * 1000,
        "due": (dt.date(2024, 1 + k, 1 + k) - dt.date(1970, 1, 1)).days,
        "flag": k % 2 == 1, "floatBox": 1.5 * k, "grade": chr(ord("A") + k),
        "id": k * 1000 + n,
        "items": [None if (k == 3 and i == 1) else f"item{i}" for i in range(k % 4)],
        "letter": "\u00e9" if k == 4 else chr(ord("a") + k),
        "lines": ([{"qty": k, "sku": f"sku{k}"}, {"qty": 2, "sku": f"sku{k}b"}]
                  if k % 2 == 0 else []),
        "millis": 1_700_000_000_000 + k, "paid": k % 2 == 0,
        "payload": None if k == 2 else b64(bytes((i * 77) & 0xFF for i in range(k))),
        "price": -k * 0.25, "quantity": None if k % 3 == 0 else k * n - 50,
        "ratio": None if k == 5 else k / 4.0, "readings": [k * 0.5, -0.0],
        "scores": [i * 1000 if i % 2 == 0 else -i for i in range(k)],
        "seen": None if k == 3 else _kt_epoch_nanos(2024, 2, 29, k, 30, 15, k * 1_000_000),
        "shape": None if k % 4 == 3 else _kt_shape(k, n),
        "shortBox": -k * 300, "small": k * 1000 - 4000,
        "stamps": None if k == 1 else [k, -k, 2**63 - 1, -(2**63)],
        "tags": None if k == 6 else [name, None, f"t{k}"],
        "tiny": -k, "total": -(1 << 40) * k, "weight": k * 0.5,
    }


def kryo_types_expected() -> list[dict]:
    entries: list[dict] = []
    ids = {uid: operator_id_for_uid(uid) for uid in ("fixture-source", "kryo-types")}

    def add(uid, state, kind, **fields):
        entries.append({"operator_uid": uid, "operator_id": ids[uid], "state": state,
                        "kind": kind, **fields})

    source_expected(add)
    n = N_EVENTS // KT_KEYS
    for k in range(KT_KEYS):
        ks = {"key": f"k{k}", "namespace": None}
        add("kryo-types", "order", "value", value=kt_order(k, n), **ks)
        for r in range(3):
            last = max(i for i in range(1, n + 1) if i % 3 == r)
            add("kryo-types", "shapes", "map", user_key=f"s{r}", value=_kt_shape(k, last), **ks)
        add("kryo-types", "shape-log", "list",
            value=[_kt_shape(k, i) for i in range(1, n + 1) if i % 5 == 0], **ks)
    return entries


def write_job_jar(dest: Path) -> None:
    """The job's classes and their sources as ``dest/job.jar`` (what classpath= reads)."""
    build()
    subprocess.run(["jar", "--create", "--file", str(dest / "job.jar"),
                    "--date=2026-01-01T00:00:00Z", "-C", str(BUILD), KT_JAR_CLASSES,
                    "-C", str(HERE / "src"), KT_JAR_CLASSES], check=True)


# --------------------------------------------------------------------------------------------
# The Protobuf types job, modelled (src/statequery/prototypes/ProtoTypesJob.java, reading.proto)
# The message of event id (k = id % 8, n = id // 8 + 1, the key's n-th event) is pt_message(k,
# n), written with Python's protobuf; the oracle renders a Reading (kryoFields) as its bytes.
# --------------------------------------------------------------------------------------------

PT_PKG = "statequery.prototypes"
PT_PROTO = HERE / "src" / "statequery" / "prototypes" / "reading.proto"
PT_STATES = {
    "fixture-source": DS_STATES["fixture-source"],
    "proto-types": [
        _st("reading", "value", f"KRYO<{PT_PKG}.Reading> (a Protobuf message, "
            "chill-protobuf's form)", "STRING", "VOID", decodable=False),
        _st("readings", "map", f"KRYO<{PT_PKG}.Reading> (a Protobuf message, "
            "chill-protobuf's form)", "STRING", "VOID", user_key_type="STRING", decodable=False),
        _st("count", "value", "INT", "STRING", "VOID"),
        _st("_timer_state/event_user-timers", "event_timer", None, "STRING", "VOID"),
        _st("_timer_state/processing_user-timers", "processing_timer", None, "STRING", "VOID"),
    ],
}
PT_JAR_CLASSES = "statequery/prototypes"


def pt_descriptors(dest: Path) -> Path:
    """``dest/descriptors.pb``: reading.proto's FileDescriptorSet with its imports (protoc, or
    grpcio-tools' protoc)."""
    out = dest / "descriptors.pb"
    args = ["--include_imports", f"--descriptor_set_out={out}", f"-I{PT_PROTO.parent}",
            PT_PROTO.name]
    if shutil.which("protoc"):
        subprocess.run(["protoc", *args], check=True)
    else:
        import grpc_tools
        from grpc_tools import protoc

        inc = str(Path(grpc_tools.__file__).parent / "_proto")
        if protoc.main(["protoc", f"-I{inc}", *args]) != 0:
            raise RuntimeError("protoc failed on reading.proto")
    return out


def _pt_classes(descriptors: Path) -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fds = descriptor_pb2.FileDescriptorSet.FromString(descriptors.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName("statequery.proto.Reading")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName("statequery.proto.Point")))


def pt_message(reading_cls: Any, point_cls: Any, k: int, n: int) -> bytes:
    """The message of key index k's n-th event: edge values by key (k 0: every field at its
    default, the empty message; 1: maxima; 2: minima; 3: non-BMP text, nested messages; ...)."""
    m = reading_cls()
    if k == 0:
        return m.SerializeToString(deterministic=True)  # empty: every field at its default
    names = ["", "max", "min", "non-BMP \U0001F600 \u65e5\u672c", "", "nul\x00inside", "e\u0301",
             "a long ascii string of more than thirty-two characters"]
    m.name = names[k]
    m.payload = bytes((i * 37 + n) & 0xFF for i in range(k * 3))
    if k == 1:
        m.i32, m.i64, m.u32, m.u64 = 2**31 - 1, 2**63 - 1, 2**32 - 1, 2**64 - 1
        m.s32, m.s64, m.f32, m.f64 = 2**31 - 1, 2**63 - 1, 2**32 - 1, 2**64 - 1
        m.sf32, m.sf64, m.fl, m.db = 2**31 - 1, 2**63 - 1, 3.0e38, 1.7976931348623157e308
        m.flag, m.level = True, 2
    elif k == 2:
        m.i32, m.i64, m.s32, m.s64 = -(2**31), -(2**63), -(2**31), -(2**63)
        m.sf32, m.sf64, m.fl, m.db = -(2**31), -(2**63), -1.5, -0.0
        m.level = -1  # BELOW: a negative enum number
    else:
        m.i32, m.i64, m.u32 = k * n - 60, -k * 10**12 - n, k * n
        m.fl, m.db, m.flag, m.level = k / 4, n / 3, n % 2 == 0, k % 3
    if k >= 3:
        m.point.CopyFrom(point_cls(x=k, y=-n, label=f"p{k}"))
        for i in range(k - 3):  # k 3: empty repeated
            m.points.add(x=i, y=i * n, label="" if i == 0 else f"q{i}")
        m.samples.extend([n, -n, 2**63 - 1, -(2**63)][: k - 2])
        m.tags.extend([f"t{i}" for i in range(k % 3)] + ([""] if k == 5 else []))
        m.levels.extend([1, 2, -1, 0][: k % 4])
    if k >= 4:
        m.counts.update({f"c{i}": i * n - 3 for i in range(k - 3)})
        m.counts[""] = -(2**31)
    choice = (k + n) % 4  # 0: the oneof unset
    if choice == 1:
        m.text = f"text{n}" if k != 6 else ""
    elif choice == 2:
        m.at.CopyFrom(point_cls(x=n, label=f"at{k}"))
    elif choice == 3:
        m.number = -n * 10**10
    if k in (3, 5, 7):
        m.seen.seconds = -3_155_760_000 if k == 3 else 1_700_000_000 + n  # k 3: 1870
        m.seen.nanos = 0 if k == 3 else 999_999_999 if k == 5 else n * 1000
    if k in (2, 6):
        m.maybe = 0 if k == 2 else -n  # optional: set to the default is present
    return m.SerializeToString(deterministic=True)


def pt_messages(descriptors: Path) -> list[bytes]:
    """The message of every event id (line id of the job's MESSAGES file)."""
    reading_cls, point_cls = _pt_classes(descriptors)
    return [pt_message(reading_cls, point_cls, i % KT_KEYS, i // KT_KEYS + 1)
            for i in range(N_EVENTS)]


def proto_types_expected() -> list[dict]:
    entries: list[dict] = []
    ids = {uid: operator_id_for_uid(uid) for uid in ("fixture-source", "proto-types")}
    msgs = pt_messages(_PT_DESCRIPTORS[0])

    def add(uid, state, kind, **fields):
        entries.append({"operator_uid": uid, "operator_id": ids[uid], "state": state,
                        "kind": kind, **fields})

    source_expected(add)
    n = N_EVENTS // KT_KEYS
    for k in range(KT_KEYS):
        ks = {"key": f"k{k}", "namespace": None}
        add("proto-types", "reading", "value", value={"bytes": b64(msgs[(n - 1) * KT_KEYS + k])},
            **ks)
        add("proto-types", "count", "value", value=n, **ks)
        for r in range(3):
            last = max(i for i in range(1, n + 1) if i % 3 == r)
            add("proto-types", "readings", "map", user_key=f"m{r}",
                value={"bytes": b64(msgs[(last - 1) * KT_KEYS + k])}, **ks)
    return entries


#: the descriptor set of the run (pt_descriptors into the scratch directory)
_PT_DESCRIPTORS: list[Path] = []


def write_proto_files(dest: Path) -> None:
    """The job's classes (job.jar) and descriptors.pb beside the savepoint."""
    build()
    subprocess.run(["jar", "--create", "--file", str(dest / "job.jar"),
                    "--date=2026-01-01T00:00:00Z", "-C", str(BUILD), PT_JAR_CLASSES,
                    "-C", str(HERE / "src"), PT_JAR_CLASSES], check=True)
    shutil.copyfile(_PT_DESCRIPTORS[0], dest / "descriptors.pb")


# --------------------------------------------------------------------------------------------
# The DataStream CEP job, modelled (CepStreamJob.java): events 0..59 keyed by "k" + (id % 4),
# watermark five minutes behind the last one. The model covers the source and the events still
# queued for the watermark (ids 54..59, with one watermark callback each); the NFA and the shared
# buffer are fixed by the oracle (tests/operators/test_cep_stream.py asserts what they mean).
# --------------------------------------------------------------------------------------------

CEP_STREAM_EVENTS = 60
CEP_STREAM_KEYS = 4
CEP_STREAM_QUEUED = range(54, 60)  # ts > watermark = ts(59) - 5 min - 1 ms


def cep_stream_expected() -> list[dict]:
    entries: list[dict] = []
    ids = {uid: operator_id_for_uid(uid) for uid in ("fixture-source", "cep-pattern")}

    def add(uid, state, kind, **fields):
        entries.append({"operator_uid": uid, "operator_id": ids[uid], "state": state,
                        "kind": kind, **fields})

    source_expected(add)
    for i in CEP_STREAM_QUEUED:
        e = {k: v for k, v in ds_event(i).items() if k != "u"}
        key = f"k{i % CEP_STREAM_KEYS}"
        add("cep-pattern", "eventQueuesStateName", "map", key=key, namespace=None,
            user_key=e["ts"], value=[e])
        add("cep-pattern", "_timer_state/event_watermark-callbacks", "event_timer", key=key,
            namespace=None, timestamp=e["ts"])
    return entries


# --------------------------------------------------------------------------------------------
# The raw-state job, modelled (RawStateJob.java)
# --------------------------------------------------------------------------------------------

RAW_UIDS = {
    "fixture-source": "Source: Fixture Source",
    "raw-state": "Raw State",
    "fixture-sink": "Fixture Sink: Writer",
}
RAW_STATES = {
    "fixture-source": DS_STATES["fixture-source"],
    "raw-state": [
        _st("count", "value", "BIGINT", "STRING", "VOID"),
        # the operator's own raw keyed / raw operator bytes: listed, with a reason, never read
        _st("(raw keyed state)", "raw", None, decodable=False),
        _st("(raw operator state)", "raw", None, decodable=False),
    ],
}


def raw_state_expected() -> list[dict]:
    entries: list[dict] = []
    ids = {uid: operator_id_for_uid(uid) for uid in RAW_UIDS}

    def add(uid, state, kind, **fields):
        entries.append({"operator_uid": uid, "operator_id": ids[uid], "state": state,
                        "kind": kind, **fields})

    source_expected(add)
    events = [ds_event(i) for i in range(N_EVENTS)]
    for user in sorted({e["user"] for e in events}):
        n = sum(1 for e in events if e["user"] == user)
        add("raw-state", "count", "value", key=user, namespace=None, value=n)
    return entries


# --------------------------------------------------------------------------------------------
# The edge-value DataStream job (EdgeDataStreamJob.java), modelled in edge_model.py
# --------------------------------------------------------------------------------------------

EDGE_DS_STATES = {"fixture-source": DS_STATES["fixture-source"],
                  **edge_model.edge_ds_states(_st)}


def sql_edge_expected(ids: dict[str, str]) -> list[dict]:
    """The agg_words operator of sql_edge_job.py: the second global aggregation of the plan."""
    import sql_edge_job

    entries: list[dict] = []
    glob = sorted((u for u in ids if u.endswith("_global-group-aggregate")),
                  key=lambda u: int(u.split("_")[0]))
    uid = glob[1]

    def add(state, kind, key, **fields):
        entries.append({"operator_uid": uid, "operator_id": ids[uid], "state": state,
                        "kind": kind, "key": key, "namespace": None, **fields})

    edge_model.sql_edge_entries(add, sql_edge_job.EDGE_ROWS)
    return entries


def edge_datastream_expected(fx: dict) -> list[dict]:
    entries: list[dict] = []
    ids = {uid: operator_id_for_uid(uid) for uid in edge_model.EDGE_DS_UIDS}

    def add(uid, state, kind, **fields):
        entries.append({"operator_uid": uid, "operator_id": ids[uid], "state": state,
                        "kind": kind, **fields})

    source_expected(add)
    edge_model.edge_datastream_entries(add, bool(fx.get("large")))
    return entries


# --------------------------------------------------------------------------------------------
# The SQL job, modelled (sql_job.py)
# --------------------------------------------------------------------------------------------

def pyflink_states(mode: str) -> dict[str, list[dict]]:
    """The states pyflink_job.py's Python operators register, as Flink records them (both modes
    register every descriptor in ``open``, thread mode leaves ``tags`` and ``ts`` empty)."""
    k, kb = "ROW<f0 STRING>", "ROW<f0 BYTES>"
    p = "BYTES (pickle)"

    def timers(key, ns="VOID", name="user"):
        return [_st(f"_timer_state/event_{name}-timers", "event_timer", None, key, ns),
                _st(f"_timer_state/processing_{name}-timers", "processing_timer", None, key, ns)]

    if mode == "thread":
        typed = [
            _st("count", "value", "BIGINT", k, "VOID"),
            _st("label", "value", "STRING", k, "VOID"),
            _st("recent", "list", "BIGINT", k, "VOID"),
            _st("detail-by-category", "map", p, k, "VOID", user_key_type="STRING"),
            _st("sum", "value", "BIGINT (ReducingStateDescriptor)", k, "VOID"),
            _st("avg", "value", p + " (AggregatingStateDescriptor, TUPLE accumulator)", k, "VOID"),
            _st("dec", "value", "BIGDECIMAL", k, "VOID"),
            _st("ts", "value", "BYTES (SQL_TIMESTAMP: unwritable in thread mode)", k, "VOID"),
            _st("tags", "value", "BYTES (LIST: unwritable in thread mode)", k, "VOID"),
            _st("attrs", "value", "MAP<STRING, BIGINT>", k, "VOID"),
            _st("extremes", "value", p + " (ROW)", k, "VOID"),
            _st("blob", "value", p, k, "VOID"),
            _st("blobs", "list", p, k, "VOID"),
            *timers(k),
        ]
        return {
            "py-typed": typed,
            "py-pickled": [_st("pair-count", "value", "BIGINT", kb, "VOID"), *timers(kb)],
            "py-window": [_st("window-contents", "value", p + " (the reduced tuple)", k,
                              "TimeWindow"), *timers(k, "TimeWindow", "window")],
            "py-broadcast": [_st("rules", "broadcast", "STRING", user_key_type="STRING"),
                             *timers(k)],
        }
    c = "BYTES (PyFlink coder)"
    kinds = {"recent": "list", "blobs": "list", "detail-by-category": "map"}
    typed = [_st(f"python-state-{n}", kinds.get(n, "list"), c, k, "VOID",
                 user_key_type=c if n == "detail-by-category" else None)
             for n in ("count", "label", "recent", "detail-by-category", "sum", "avg", "dec",
                       "ts", "tags", "attrs", "extremes", "blob", "blobs")]
    return {
        "py-typed": [*typed, *timers(k)],
        "py-pickled": [_st("python-state-pair-count", "list", c, kb, "VOID"), *timers(kb)],
        "py-window": [_st("python-state-window-contents", "list", c, k, "TimeWindow"),
                      *timers(k, "TimeWindow")],
        "py-broadcast": [_st("python-state-rules", "broadcast", c, user_key_type=c), *timers(k)],
    }


def pyflink_expected(mode: str) -> list[dict]:
    """pyflink_job.py's keyed and broadcast state (pyflink_model.py). Thread mode: the state
    descriptors as PyFlink declares them to Java (pyflink/fn_execution/embedded/java_utils.py):
    reducing and aggregating states are value states; ROW and TUPLE values, PICKLED_BYTE_ARRAY
    and undeclared keys are ``pickle.dumps`` bytes. Process mode: every state is named
    ``python-state-<name>``, value/reducing/aggregating states are list states of one element,
    values are PyFlink's coder bytes (LONG int64, STRING int32 length + UTF-8, pickled: int32
    length + ``pickle.dumps``), map and broadcast keys too (ByteArrayWrapper); undeclared keys
    ``cloudpickle.dumps`` bytes (protocol 5, where thread mode's are ``pickle.dumps``, 4). The
    process model covers the LONG, STRING and pickled states."""
    import pickle

    import cloudpickle
    import pyflink_model as pm
    from pyflink.common import Row

    thread = mode == "thread"
    prefix = "" if thread else "python-state-"
    out: list[dict] = []
    ids = {u: operator_id_for_uid(u) for u in ("py-typed", "py-pickled", "py-window",
                                               "py-broadcast")}

    def add(uid, state, kind, key, value=None, **extra):
        e = {"operator_id": ids[uid], "operator_uid": uid, "state": state, "kind": kind,
             "key": key, "namespace": extra.pop("namespace", None), **extra}
        if value is not None or kind in ("value", "list", "map"):
            e["value"] = value
        out.append(e)

    def long_(v: int):
        return v if thread else b64(struct.pack(">q", v))

    def string(v: str) -> bytes:
        raw = v.encode("utf-8")
        return struct.pack(">i", len(raw)) + raw

    def pickled(v) -> dict:
        if thread:
            return b64(pickle.dumps(v))
        data = pickle.dumps(v)
        return b64(struct.pack(">i", len(data)) + data)

    def one(v):  # process mode: a value state is a list state of one element
        return v if thread else [v]

    for user, s in sorted(pm.typed_state().items()):
        key = {"f0": user}
        u = pm.user_index(user)
        add("py-typed", prefix + "count", "value" if thread else "list", key,
            one(long_(s["count"])))
        add("py-typed", prefix + "sum", "value" if thread else "list", key, one(long_(s["sum"])))
        add("py-typed", prefix + "label", "value" if thread else "list", key,
            s["label"] if thread else [b64(string(s["label"]))])
        add("py-typed", prefix + "recent", "list", key, [long_(a) for a in s["recent"]])
        add("py-typed", prefix + "blob", "value" if thread else "list", key,
            one(pickled(s["blob"])))
        add("py-typed", prefix + "blobs", "list", key, [pickled(b) for b in s["blobs"]])
        if thread:
            for cat, d in sorted(s["detail-by-category"].items()):
                row = Row(d["total"], d["last"], Row(d["where"]["city"], d["where"]["zip"]))
                add("py-typed", "detail-by-category", "map", key, pickled(row), user_key=cat)
            add("py-typed", "avg", "value", key, pickled(tuple(s["avg"])))
            add("py-typed", "dec", "value", key, format(s["dec"], "f"))
            add("py-typed", "attrs", "value", key,
                [{"key": k, "value": v} for k, v in sorted(s["attrs"].items())])
            add("py-typed", "extremes", "value", key, pickled(Row(*s["extremes"])))
        # process mode: ROW, TUPLE, BIG_DEC, SQL_TIMESTAMP, MAP and LIST values in PyFlink's
        # coders are not modelled (the dump has them)
        add("py-typed", "_timer_state/event_user-timers", "event_timer", key,
            timestamp=pm.TIMER_BASE + u)
        add("py-typed", "_timer_state/processing_user-timers", "processing_timer", key,
            timestamp=pm.TIMER_BASE + 1000 + u)
    for (user, parity), n in sorted(pm.pair_counts().items()):
        k = (user, parity)
        add("py-pickled", prefix + "pair-count", "value" if thread else "list",
            {"f0": b64(pickle.dumps(k) if thread else cloudpickle.dumps(k))}, one(long_(n)))
    timers = "_timer_state/event_window-timers" if thread else "_timer_state/event_user-timers"
    for (user, start), reduced in sorted(pm.window_sums().items()):
        ns = {"start": start, "end": start + pm.HOUR_MS}
        if thread:
            add("py-window", "window-contents", "value", {"f0": user}, pickled(reduced),
                namespace=ns)
        add("py-window", timers, "event_timer", {"f0": user}, namespace=ns,
            timestamp=start + pm.HOUR_MS - 1)
    for k, v in pm.RULES:
        e = {"operator_id": ids["py-broadcast"], "operator_uid": "py-broadcast",
             "state": prefix + "rules", "kind": "broadcast", "subtask": 0,
             "user_key": k if thread else b64(string(k)),
             "value": v if thread else b64(string(v))}
        out.append(e)
    return out


SQL_ROWS = 500
SQL_TS_BASE_NANOS = (int(dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc).timestamp())
                     * 1_000_000_000 + 123_456_000)

SQL_ACC_TYPE = ("ROW<f0 BIGINT (COUNT(*) count1), f1 BIGINT (SUM sum), f2 BIGINT (COUNT DISTINCT "
                "count), f3 DECIMAL(12, 2) (MAX), f4 DECIMAL(30, 6) (MAX), f5 TIMESTAMP(6) (MAX), "
                "f6 STRING (MAX), f7 RAW('org.apache.flink.table.api.dataview.MapView', "
                "NullSerializer): placeholder of the state-backed distinct view, read as null>")

SQL_STATES = [
    _st("accState", "value", SQL_ACC_TYPE, "ROW<f0 STRING>", "VOID"),
    _st("distinctAcc_0", "map", "BIGINT (bit set: bit 0 = seen by distinct agg 0)",
        "ROW<f0 STRING>", "VOID", user_key_type="INT"),
    _st("distinctAcc_0_null_state", "value", "BIGINT", "ROW<f0 STRING>", "VOID"),
]


# sql_job.py --async-state: COUNT(MOD(id, 5)) instead of the distinct count, so no MapView and
# no distinct map state; the asynchronous GroupAggregate keeps accState as a State V2 value.
SQL_ASYNC_ACC_TYPE = ("ROW<f0 BIGINT (COUNT(*) count1), f1 BIGINT (SUM sum), f2 BIGINT (COUNT "
                      "count), f3 DECIMAL(12, 2) (MAX), f4 DECIMAL(30, 6) (MAX), f5 TIMESTAMP(6) "
                      "(MAX), f6 STRING (MAX)>")

SQL_ASYNC_STATES = [_st("accState", "value", SQL_ASYNC_ACC_TYPE, "ROW<f0 STRING>", "VOID")]


def sql_async_expected(agg_operator_id: str) -> list[dict]:
    """The SQL job's accumulators without the distinct count (its ``f2`` counts every row)."""
    entries = []
    for e in sql_expected(agg_operator_id):
        if e["state"] == "accState":
            acc = dict(e["value"])
            del acc["f7"]
            acc["f2"] = acc["f0"]
            entries.append({**e, "value": acc})
    return entries


def _decimal_str(numerator: int, denominator: int, scale: int) -> str:
    """numerator/denominator as a plain decimal with `scale` digits (exact in our data)."""
    scaled = numerator * 10**scale
    assert scaled % denominator == 0
    q = scaled // denominator
    s = str(q).rjust(scale + 1, "0")
    return f"{s[:-scale]}.{s[-scale:]}" if scale else s


def sql_expected(agg_operator_id: str) -> list[dict]:
    entries: list[dict] = []
    groups: dict[str, list[int]] = {}
    for i in range(1, SQL_ROWS + 1):
        groups.setdefault(f"w{i % 17}", []).append(i)

    def add(state, kind, word, **fields):
        entries.append({"operator_uid": "", "operator_id": agg_operator_id, "state": state,
                        "kind": kind, "key": {"f0": word}, "namespace": None, **fields})

    for word, ids in groups.items():
        mx = max(ids)
        distinct = sorted({i % 5 for i in ids})
        acc = {
            "f0": len(ids),
            "f1": sum(ids),
            "f2": len(distinct),
            "f3": _decimal_str(mx, 4, 2),
            "f4": _decimal_str(mx, 1, 6),
            "f5": SQL_TS_BASE_NANOS + mx * 1_000_000_000,
            "f6": max(f"longer-than-seven-{i}" for i in ids),
            # The distinct MapView lives in its own MapState ("distinctAcc_0"); the accumulator row
            # keeps a RAW placeholder (one 0x00 byte) whose stored serializer, NullSerializer,
            # reads it as null.
            "f7": None,
        }
        add("accState", "value", word, value=acc)
        for m in distinct:
            add("distinctAcc_0", "map", word, user_key=m, value=1)
    return entries


# --------------------------------------------------------------------------------------------
# The SQL keys job (sql_keys_job.py): the composite-key and the DATE-key aggregations, modelled
# from the job's rows (a subset of the dump: the other aggregations hold the same kind of state).
# The plan numbers the GROUP BY operators in query order: by_composite is GroupAggregate[4],
# by_date GroupAggregate[12].
# --------------------------------------------------------------------------------------------


def _sql_keys_rows() -> list[dict]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("sql_keys_job", HERE / "sql_keys_job.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.ROWS)


def sql_keys_expected(infos: list[dict]) -> list[dict]:
    ids = {i["name"]: i["operator_id"] for i in infos}
    entries: list[dict] = []

    def days(text):
        return None if text is None else (dt.date.fromisoformat(text) - dt.date(1970, 1, 1)).days

    def cents(text):
        if text is None:
            return None
        units, _, frac = text.partition(".")
        return f"{units}.{(frac + '00')[:2]}"

    composite: dict[str, tuple[dict, list[int]]] = {}
    by_date: dict[str, tuple[dict, list[int]]] = {}
    for r in _sql_keys_rows():
        bs = r.get("bs")
        key = {"f0": days(r.get("ds")), "f1": cents(r.get("amt")),
               "f2": None if bs is None else b64(bs.encode("utf-8")),
               "f3": r.get("flag"), "f4": r.get("s")}
        composite.setdefault(canonical(key), (key, []))[1].append(r["n"])
        dkey = {"f0": days(r.get("ds"))}
        by_date.setdefault(canonical(dkey), (dkey, []))[1].append(r["n"])
    for key, ns in composite.values():
        entries.append({"operator_uid": "", "operator_id": ids["GroupAggregate[4]"],
                        "state": "accState", "kind": "value", "key": key, "namespace": None,
                        "value": {"f0": len(ns), "f1": sum(ns)}})
    for key, ns in by_date.values():
        entries.append({"operator_uid": "", "operator_id": ids["GroupAggregate[12]"],
                        "state": "accState", "kind": "value", "key": key, "namespace": None,
                        "value": {"f0": len(ns)}})
    return entries


# --------------------------------------------------------------------------------------------
# The SQL operators jobs, modelled where the state is plain (sql_operators_job.py). The expected
# file of these fixtures is a subset of the dump (manifest "expected": "subset"): entries of
# operators whose state follows from the input alone (joins, deduplication, Top-N, the upsert
# materializer). Accumulators holding processing time (FIRST_VALUE's order) are left to the
# oracle.
# --------------------------------------------------------------------------------------------

OPS_EVENTS = 60
OPS_USERS = 6
OPS_CATEGORIES = ["books", "games", "music"]
OPS_TS_BASE = 1_700_000_000_000


def ops_event(i: int) -> dict:
    return {"id": i, "user": f"user-{i % OPS_USERS}", "amount": (i * 37) % 101,
            "category": OPS_CATEGORIES[(i // 10) % 3]}


def sql_ops_expected(ids: dict[str, str], backend: str = "hashmap") -> list[dict]:
    """``ids``: uid -> operator id of the savepoint (uids are ``<plan node id>_<kind>``)."""
    entries: list[dict] = []
    events = [ops_event(i) for i in range(OPS_EVENTS)]

    def add(uid, state, kind, key, **fields):
        entries.append({"operator_uid": uid, "operator_id": ids[uid], "state": state,
                        "kind": kind, "key": key, "namespace": None, **fields})

    def uid(kind: str, index: int = 0) -> str:
        found = sorted((u for u in ids if u.endswith("_" + kind)),
                       key=lambda u: int(u.split("_")[0]))
        return found[index]

    joins = [u for u in sorted(ids, key=lambda u: int(u.split("_")[0])) if u.endswith("_join")]
    inner, left, unique, _full = joins
    # join_inner: no unique key on either side: MapState<row, count>
    for e in events:
        if e["id"] % 2 == 0:
            add(inner, "left-records", "map", {"f0": e["user"]},
                user_key={"f0": e["user"], "f1": e["id"]}, value=1)
        if e["id"] % 3 == 0:
            add(inner, "right-records", "map", {"f0": e["user"]},
                user_key={"f0": e["user"], "f1": e["id"]}, value=1)
    # join_left: the outer side keeps (count, number of associated right rows)
    right_rows = [e for e in events if e["id"] % 5 == 0 and e["category"] != "games"]
    for e in events:
        if e["id"] % 2 == 0:
            assoc = sum(1 for r in right_rows if r["category"] == e["category"])
            add(left, "left-records", "map", {"f0": e["category"]},
                user_key={"f0": e["category"], "f1": e["id"]}, value={"f0": 1, "f1": assoc})
    for r in right_rows:
        add(left, "right-records", "map", {"f0": r["category"]},
            user_key={"f0": r["category"], "f1": r["id"]}, value=1)
    # join_unique: both sides are keyed by user (unique): ValueState<row>
    for u in range(OPS_USERS):
        mine = [e for e in events if e["user"] == f"user-{u}"]
        # a join erases the kind of the rows it stores (+I)
        add(unique, "left-records", "value", {"f0": f"user-{u}"},
            value={"row_kind": "+I", "f0": f"user-{u}", "f1": len(mine)})
        add(unique, "right-records", "value", {"f0": f"user-{u}"},
            value={"row_kind": "+I", "f0": f"user-{u}", "f1": sum(e["amount"] for e in mine)})
    # deduplication: keep first row (processing time) keeps a flag, keep last row the row
    first, last = uid("deduplicate", 0), uid("deduplicate", 1)
    for u in range(OPS_USERS):
        mine = [e for e in events if e["user"] == f"user-{u}"]
        add(first, "deduplicate-state", "value", {"f0": f"user-{u}"}, value=True)
        add(last, "deduplicate-state", "value", {"f0": f"user-{u}"},
            # the kind the row was stored with: RocksDB serializes the input row (+I); the heap
            # backend keeps the row object, which the operator then emits as +U
            value={"row_kind": "+U" if len(mine) > 1 and backend == "hashmap" else "+I",
                   "f0": mine[-1]["id"],
                   "f1": mine[-1]["user"], "f2": mine[-1]["amount"], "f3": None})
    # Top-3 per category (append-only input): sort key -> rows with that key, the top 3 kept
    for cat in OPS_CATEGORIES:
        mine = [e for e in events if e["category"] == cat]
        kept: list[dict] = []
        for e in mine:
            kept.append(e)
            kept.sort(key=lambda x: -x["amount"])
            kept = kept[:3]
        for amount in sorted({e["amount"] for e in kept}):
            rows = [{"row_kind": "+I", "f0": e["id"], "f1": e["amount"], "f2": cat} for e in mine
                    if e in kept and e["amount"] == amount]
            add(uid("rank"), "data-state-with-append", "map", {"f0": cat},
                user_key={"f0": amount}, value=rows)
    # the upsert materializer keeps every (category, user) row of its key, in arrival order
    for cat in OPS_CATEGORIES:
        order: list[str] = []
        totals: dict[str, int] = {}
        seen: dict[str, int] = {}
        for e in events:
            if e["category"] == cat:
                if e["user"] in order:
                    order.remove(e["user"])  # an update replaces the row and moves it last
                order.append(e["user"])
                totals[e["user"]] = totals.get(e["user"], 0) + e["amount"]
                seen[e["user"]] = seen.get(e["user"], 0) + 1
        add(uid("upsert-materialize"), "values", "value", {"f0": cat},
            # the row as the aggregation last sent it: +I first, +U after an update
            value=[{"row_kind": "+U" if seen[u] > 1 else "+I", "f0": cat, "f1": u,
                    "f2": totals[u]} for u in order])
    return entries


def sql_aggs_expected(ids: dict[str, str]) -> list[dict]:
    """The distinct users of each category of COUNT(DISTINCT `user`) ... GROUP BY category
    (agg_plain, the first aggregation of the job): its ``distinctAcc_0`` MapState, user -> 1."""
    aggs = sorted((u for u in ids if u.endswith("_group-aggregate")),
                  key=lambda u: int(u.split("_")[0]))
    entries = []
    for cat in OPS_CATEGORIES:
        users = sorted({e["user"] for e in map(ops_event, range(OPS_EVENTS))
                        if e["category"] == cat})
        for user in users:
            entries.append({"operator_uid": aggs[0], "operator_id": ids[aggs[0]],
                            "state": "distinctAcc_0", "kind": "map", "key": {"f0": cat},
                            "namespace": None, "user_key": user, "value": 1})
    return entries


def sql_minibatch_expected(ids: dict[str, str]) -> list[dict]:
    """The global aggregations of the two-phase plans: COUNT(*), SUM, MAX per category, and the
    final aggregation of the split distinct count (sum of the per-bucket distinct counts, SUM)."""
    entries: list[dict] = []
    events = [ops_event(i) for i in range(OPS_EVENTS)]
    glob = sorted((u for u in ids if u.endswith("_global-group-aggregate")),
                  key=lambda u: int(u.split("_")[0]))
    totals, distinct = glob
    for cat in OPS_CATEGORIES:
        mine = [e for e in events if e["category"] == cat]
        base = {"operator_uid": totals, "operator_id": ids[totals], "state": "accState",
                "kind": "value", "key": {"f0": cat}, "namespace": None}
        entries.append({**base, "value": {"f0": len(mine), "f1": sum(e["amount"] for e in mine),
                                          "f2": max(e["amount"] for e in mine)}})
        entries.append({**base, "operator_uid": distinct, "operator_id": ids[distinct],
                        "value": {"f0": len({e["user"] for e in mine}),
                                  "f1": sum(e["amount"] for e in mine)}})
    return entries


def sql_cep_expected(ids: dict[str, str]) -> list[dict]:
    """The two TTL aggregations of ``--job cep`` (COUNT(*), SUM(amount)): per user under the
    STATE_TTL hint (expired when the snapshot is taken) and per category under the job's TTL;
    ``last_access`` is processing time ("$any"). The pattern, window join and materializer
    states are left to the oracle."""
    entries: list[dict] = []
    events = [ops_event(i) for i in range(OPS_EVENTS)]
    aggs = sorted((u for u in ids if u.endswith("_group-aggregate")),
                  key=lambda u: int(u.split("_")[0]))
    per_user, per_category = aggs[0], aggs[1]
    for uid, field, keys in ((per_user, "user", [f"user-{u}" for u in range(OPS_USERS)]),
                             (per_category, "category", OPS_CATEGORIES)):
        for k in keys:
            mine = [e for e in events if e[field] == k]
            entries.append({"operator_uid": uid, "operator_id": ids[uid], "state": "accState",
                            "kind": "value", "key": {"f0": k}, "namespace": None,
                            "value": ttl({"f0": len(mine),
                                          "f1": sum(e["amount"] for e in mine)})})
    return entries


OVER_WATERMARK_ID = OPS_EVENTS - 1 - 5  # the watermark is five minutes behind: ids 0..54 fired


def sql_over_expected(ids: dict[str, str]) -> list[dict]:
    """The accumulators of the event-time OVER aggregations of ``--job over`` after the frames of
    every row up to the watermark (ids 0..OVER_WATERMARK_ID) fired, and the last fired
    timestamp of the bounded ones. The processing-time functions' states and the buffered rows
    are left to the oracle (tests/operators/test_sql_over.py asserts what they mean)."""
    entries: list[dict] = []
    fired = [{**ops_event(i), "ts": OPS_TS_BASE + i * 60_000} for i in range(OVER_WATERMARK_ID + 1)]
    overs = sorted((u for u in ids if u.endswith("_over-aggregate")),
                   key=lambda u: int(u.split("_")[0]))
    rows3, range30, rows_unbounded, range_unbounded = overs[:4]

    def add(uid, state, key, value):
        entries.append({"operator_uid": uid, "operator_id": ids[uid], "state": state,
                        "kind": "value", "key": {"f0": key}, "namespace": None, "value": value})

    for u in range(OPS_USERS):
        mine = [e for e in fired if e["user"] == f"user-{u}"]
        last = mine[-1]
        frame = mine[-3:]  # ROWS BETWEEN 2 PRECEDING AND CURRENT ROW
        add(rows3, "accState", last["user"], {"f0": len(frame),
                                              "f1": sum(e["amount"] for e in frame),
                                              "f2": len(frame)})
        add(rows3, "lastTriggeringTsState", last["user"], last["ts"])
        # RANGE BETWEEN INTERVAL '30' MINUTE PRECEDING AND CURRENT ROW
        frame = [e for e in mine if e["ts"] >= last["ts"] - 30 * 60_000]
        amounts = [e["amount"] for e in frame]
        add(range30, "accState", last["user"],
            {"f0": {"max": max(amounts), "mapSize": len(set(amounts)), "map": None},
             "f1": len(frame), "f2": sum(amounts), "f3": len(frame)})
        add(range30, "lastTriggeringTsState", last["user"], last["ts"])
        add(range_unbounded, "accState", last["user"],
            {"f0": max(e["id"] for e in mine), "f1": len(mine)})
    for cat in OPS_CATEGORIES:
        mine = [e for e in fired if e["category"] == cat]
        add(rows_unbounded, "accState", cat,
            {"f0": min(e["amount"] for e in mine), "f1": len(mine)})
    return entries


# --------------------------------------------------------------------------------------------
# Running Flink
# --------------------------------------------------------------------------------------------

_classpath: str | None = None


# --------------------------------------------------------------------------------------------
# The sequence job, modelled (SequenceJob.java): DataGeneratorSource 0..999 gated to 100
# records per checkpoint; snapshot n (1..3 checkpoints, 4 the savepoint) holds records 0..100n-1.
# --------------------------------------------------------------------------------------------

SEQ_COUNT = 1000
SEQ_PER_CHECKPOINT = 100
SEQ_UIDS = {
    "sequence-source": "Source: Sequence Source",
    "sequence-state": "Sequence State",
    "sequence-sink": "Sequence Sink: Writer",
}
SEQ_STATES = {
    "sequence-source": [_st("SourceReaderState", "operator_list",
                            "BYTES (SimpleVersionedSerialization of NumberSequenceSplit)")],
    "sequence-state": [
        _st("count", "value", "BIGINT", "STRING", "VOID"),
        _st("flag", "value", "BIGINT", "STRING", "VOID"),
        _st("buckets", "map", "BIGINT", "STRING", "VOID", user_key_type="STRING"),
        _st("recent", "list", "BIGINT", "STRING", "VOID"),
        _st("_timer_state/processing_user-timers", "processing_timer", None, "STRING", "VOID"),
    ],
}


def sequence_key(i: int) -> str:
    return f"user-{i % 10 + 3 * (i // SEQ_PER_CHECKPOINT)}"


def number_sequence_split(split_id: str, start: int, end: int) -> bytes:
    """NumberSequenceSource.NumberSequenceSplit in SimpleVersionedSerialization (version 1):
    writeUTF(splitId), writeLong(from), writeLong(to)."""
    payload = java_utf(split_id) + struct.pack(">qq", start, end)
    return struct.pack(">ii", 1, len(payload)) + payload


def sequence_expected(records: int) -> list[dict]:
    """The state after the first ``records`` records (SequenceJob.SequenceStateFunction)."""
    entries: list[dict] = []
    ids = {uid: operator_id_for_uid(uid) for uid in SEQ_UIDS}

    def add(uid, state, kind, **fields):
        entries.append({"operator_uid": uid, "operator_id": ids[uid], "state": state,
                        "kind": kind, **fields})

    add("sequence-source", "SourceReaderState", "operator_list", subtask=0, index=0,
        value=b64(number_sequence_split("1", records, SEQ_COUNT - 1)))
    per_key: dict[str, dict] = {}
    for i in range(records):
        c = i // SEQ_PER_CHECKPOINT
        st = per_key.setdefault(sequence_key(i), {"count": 0, "flag": None, "buckets": {},
                                                  "recent": [], "timers": set()})
        st["count"] += 1
        st["flag"] = i if c % 2 == 0 else None
        if c % 2 == 1 and i % 3 == 0:
            st["buckets"].pop("b0", None)
        else:
            b = f"b{i % 3}"
            st["buckets"][b] = st["buckets"].get(b, 0) + i
        st["recent"] = (st["recent"] + [i])[-3:]
        st["timers"].add(TIMER_BASE + c)
        if c > 0:
            st["timers"].discard(TIMER_BASE + c - 1)
    for key, st in per_key.items():
        ks = {"key": key, "namespace": None}
        add("sequence-state", "count", "value", value=st["count"], **ks)
        if st["flag"] is not None:
            add("sequence-state", "flag", "value", value=st["flag"], **ks)
        for b, v in st["buckets"].items():
            add("sequence-state", "buckets", "map", user_key=b, value=v, **ks)
        add("sequence-state", "recent", "list", value=st["recent"], **ks)
        for t in sorted(st["timers"]):
            add("sequence-state", "_timer_state/processing_user-timers", "processing_timer",
                timestamp=t, **ks)
    return entries


def build() -> str:
    """Compile the Java programs; if the oracle does not compile yet, compile the rest alone."""
    global _classpath
    if _classpath:
        return _classpath
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(HERE / "build.sh")], env=env, capture_output=True, text=True)
    if proc.returncode == 0:
        _classpath = proc.stdout.strip().splitlines()[-1]
        return _classpath
    print("warning: build.sh failed, compiling without SavepointDump.java:\n" + proc.stderr[-3000:],
          file=sys.stderr)
    import pyflink

    lib = Path(pyflink.__file__).parent / "lib"
    sources = sorted(str(p) for p in (HERE / "src").rglob("*.java")
                     if p.name != "SavepointDump.java")
    BUILD.mkdir(exist_ok=True)
    subprocess.run(["javac", "-nowarn", "-encoding", "UTF-8", "-d", str(BUILD), "-cp",
                    f"{lib}/*", *sources], check=True)
    shutil.copytree(HERE / "src" / "META-INF", BUILD / "META-INF", dirs_exist_ok=True)
    _classpath = f"{lib}/*:{BUILD}"
    return _classpath


def _run(cmd: list[str], log: Path, timeout: int = 300,
         env: dict[str, str] | None = None) -> dict[str, str]:
    with open(log, "w") as out:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=out, text=True, timeout=timeout,
                              env={**os.environ, **env} if env else None)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{cmd[:4]}... failed ({proc.returncode}), see {log}:\n{proc.stdout[-2000:]}")
    result = {}
    for line in proc.stdout.splitlines():
        if "=" in line and line.split("=", 1)[0] in ("SNAPSHOT_PATH", "JOB_ID"):
            k, v = line.split("=", 1)
            result[k] = v
    if "SNAPSHOT_PATH" not in result:
        raise RuntimeError(f"no SNAPSHOT_PATH from {cmd[:4]}, see {log}:\n{proc.stdout[-2000:]}")
    return result


S3_BUCKET = "statequery-test"  # tests/support/s3server.py's bucket: the fixture's s3:// paths are its


def run_job(fx: dict, scratch: Path, s3_endpoint: str | None = None) -> dict[str, str]:
    out = scratch / "out"
    if fx.get("s3"):
        # checkpoints and ForSt's primary directory on the S3 test server, through the fixture
        # programs' s3:// file system (src/statequery/fixtures/s3: the wheel ships no S3 plugin)
        base = f"s3://{S3_BUCKET}/{fx['name']}"
        cmd = ["java", "-cp", build(), "statequery.fixtures.AsyncStateJob", "checkpoint",
               f"{base}/checkpoints", f"{base}/primary"]
        return _run(cmd, scratch / "job.log", env={"AWS_ENDPOINT_URL": s3_endpoint or ""})
    if fx["job"] in ("datastream", "changelog-ops", "changelog-ttl", "labels"):
        kind = "checkpoint" if fx["snapshot"] == "checkpoint" else f"savepoint-{fx['format']}"
        cmd = ["java", "-cp", build(), "statequery.fixtures.DataStreamStateJob", fx["backend"],
               str(fx["incremental"]).lower(), str(fx["max_parallelism"]),
               str(fx["compression"]).lower(), str(fx["inline"]).lower(), kind, str(out),
               fx.get("timers", "rocksdb"), fx.get("changelog", "off"),
               {"changelog-ops": "ops", "changelog-ttl": "ttl",
                "labels": "labels"}.get(fx["job"], "fixture")]
    elif fx["job"] == "async-datastream":
        kind = "checkpoint" if fx["snapshot"] == "checkpoint" else f"savepoint-{fx['format']}"
        cmd = ["java", "-cp", build(), "statequery.fixtures.AsyncStateJob", kind, str(out)]
    elif fx["job"] == "async-sql":
        cmd = [sys.executable, str(HERE / "sql_job.py"), "--backend", fx["backend"], "--kind",
               f"savepoint-{fx['format']}", "--out", str(out), "--max-parallelism",
               str(fx["max_parallelism"]), "--async-state"]
    elif fx["job"] == "edge-sql":
        kind = "checkpoint" if fx["snapshot"] == "checkpoint" else f"savepoint-{fx['format']}"
        cmd = [sys.executable, str(HERE / "sql_edge_job.py"), "--backend", fx["backend"],
               "--kind", kind, "--out", str(out), "--plan", str(scratch / "plan.json"),
               "--max-parallelism", str(fx["max_parallelism"])]
        cmd += ["--incremental"] if fx["incremental"] else []
    elif fx["job"] == "edge-datastream":
        kind = "checkpoint" if fx["snapshot"] == "checkpoint" else f"savepoint-{fx['format']}"
        cmd = ["java", "-cp", build(), "statequery.fixtures.EdgeDataStreamJob", fx["backend"],
               str(fx["incremental"]).lower(), str(fx["max_parallelism"]),
               str(fx.get("large", False)).lower(), kind, str(out)]
    elif fx["job"] in PYFLINK_JOBS:
        cmd = [sys.executable, str(HERE / "pyflink_job.py"), "--mode", fx["job"].split("-")[1],
               "--backend", fx["backend"], "--kind", f"savepoint-{fx['format']}", "--out",
               str(out), "--max-parallelism", str(fx["max_parallelism"])]
    elif fx["job"] == "cep-stream":
        cmd = ["java", "-cp", build(), "statequery.fixtures.CepStreamJob", fx["backend"],
               f"savepoint-{fx['format']}", str(out)]
    elif fx["job"] == "ttl-kryo":
        cmd = ["java", "-cp", build(), "statequery.fixtures.TtlKryoJob", fx["backend"],
               f"savepoint-{fx['format']}", str(out)]
    elif fx["job"] in ("types-avro", "types-avro-evolved"):
        if not os.environ.get("FLINK_AVRO_CLASSPATH"):
            raise RuntimeError(f"{fx['job']} needs FLINK_AVRO_CLASSPATH (docs/fixtures.md)")
        main = "AvroStateJob" if fx["job"] == "types-avro" else "AvroEvolveJob"
        cmd = ["java", "-cp", build(), f"statequery.fixtures.{main}", fx["backend"],
               f"savepoint-{fx['format']}", str(out)]
    elif fx["job"] == "kryo-types":
        cmd = ["java", "-cp", build(), "statequery.kryotypes.KryoTypesJob", fx["backend"],
               f"savepoint-{fx['format']}", str(out)]
    elif fx["job"] == "proto-types":
        _PT_DESCRIPTORS[:] = [pt_descriptors(scratch)]
        messages = scratch / "messages.txt"
        messages.write_text("".join(base64.b64encode(m).decode("ascii") + "\n"
                                    for m in pt_messages(_PT_DESCRIPTORS[0])))
        cmd = ["java", "-cp", build(), "statequery.prototypes.ProtoTypesJob", fx["backend"],
               f"savepoint-{fx['format']}", str(out), str(messages)]
    elif fx["job"] == "sql-keys":
        cmd = [sys.executable, str(HERE / "sql_keys_job.py"), "--backend", fx["backend"],
               "--kind", f"savepoint-{fx['format']}", "--out", str(out), "--max-parallelism",
               str(fx["max_parallelism"])]
    elif fx["job"] == "raw-state":
        cmd = ["java", "-cp", build(), "statequery.fixtures.RawStateJob", fx["backend"],
               f"savepoint-{fx['format']}", str(out)]
    elif fx["job"] in SQL_OPERATOR_JOBS:
        kind = "checkpoint" if fx["snapshot"] == "checkpoint" else f"savepoint-{fx['format']}"
        cmd = [sys.executable, str(HERE / "sql_operators_job.py"), "--job",
               SQL_OPERATOR_JOBS[fx["job"]], "--backend", fx["backend"], "--kind",
               kind, "--out", str(out), "--plan",
               str(scratch / "plan.json"), "--max-parallelism", str(fx["max_parallelism"])]
        cmd += ["--incremental"] if fx["incremental"] else []
        cmd += ["--upsert-strategy", "MAP"] if fx["job"] == "sql-cep-map" else []
    else:
        cmd = [sys.executable, str(HERE / "sql_job.py"), "--backend", fx["backend"], "--kind",
               f"savepoint-{fx['format']}", "--out", str(out), "--max-parallelism",
               str(fx["max_parallelism"])]
        cmd += ["--incremental"] if fx["incremental"] else []
        cmd += ["--compression"] if fx["compression"] else []
        cmd += ["--inline"] if fx["inline"] else []
    return _run(cmd, scratch / "job.log")


def _run_on_s3(fx: dict, scratch: Path, dest: Path) -> dict[str, str]:
    """Run the job against moto's S3 (the test server of tests/support/s3server.py), then mirror every
    object under ``<name>/`` into ``tests/fixtures/<name>/`` (the same keys: a test uploads them
    back to the paths the checkpoint's ``_metadata`` names)."""
    sys.path.insert(0, str(REPO / "tests"))
    from s3server import moto_s3_server

    with moto_s3_server(S3_BUCKET) as s3:
        res = run_job(fx, scratch, s3.endpoint_url)
        shutil.rmtree(dest, ignore_errors=True)
        client = s3.client()
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=S3_BUCKET, Prefix=f"{fx['name']}/")
        for page in pages:
            for obj in page.get("Contents", []):
                target = FIXTURES / obj["Key"]
                target.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(S3_BUCKET, obj["Key"], str(target))
    return res


def snapshot_info(snapshot_dir: Path) -> list[dict]:
    proc = subprocess.run(["java", "-cp", build(), "statequery.fixtures.SnapshotInfo",
                           str(snapshot_dir)], capture_output=True, text=True, check=True)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def dump_available() -> bool:
    return (BUILD / "statequery" / "fixtures" / "SavepointDump.class").exists()


def run_dump(snapshot_dir: Path, out: Path, log: Path, backend: str | None = None,
             kryo_fields: bool = False) -> bool:
    """``backend`` ``forst``: restore RocksDB-format handles with ForSt's own backend;
    ``kryo_fields``: Kryo values as their fields (the job's classes are on the classpath)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    flags = [f"--backend={backend}"] if backend == "forst" else []
    props = ["-Dstatequery.dump.kryoFields=true"] if kryo_fields else []
    with open(log, "w") as err:
        proc = subprocess.run(["java", *props, "-cp", build(), "statequery.fixtures.SavepointDump",
                               *flags, str(snapshot_dir), str(out)], stdout=err, stderr=err,
                              timeout=300)
    return proc.returncode == 0


# --------------------------------------------------------------------------------------------
# One fixture
# --------------------------------------------------------------------------------------------


def write_jsonl(path: Path, entries: list[dict]) -> None:
    lines = sorted(canonical(e) for e in entries)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))


def _mask_any(got, want):
    """``got`` with every integer that ``want`` has as ``"$any"`` replaced by ``"$any"``."""
    if want == ANY and isinstance(got, int) and not isinstance(got, bool):
        return ANY
    if isinstance(got, dict) and isinstance(want, dict):
        return {k: _mask_any(v, want.get(k)) for k, v in got.items()}
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return [_mask_any(g, w) for g, w in zip(got, want, strict=True)]
    return got


def _entry_id(e: dict) -> str:
    return canonical({k: e.get(k) for k in ("operator_id", "state", "key", "namespace",
                                              "user_key", "timestamp", "subtask", "index")})


def compare(expected: Path, dump: Path, subset: bool = False) -> list[str]:
    """Differences between the expected file and the dump (key_group ignored; ``"$any"`` in an
    expected entry matches any integer at that place of the dump's entry with the same identity).
    With ``subset`` the expected entries need only be in the dump."""
    exp_entries = [json.loads(line) for line in expected.read_text().splitlines() if line.strip()]
    exp = {canonical(e) for e in exp_entries}
    by_id = {_entry_id(e): e for e in exp_entries}
    got = set()
    for line in dump.read_text().splitlines():
        if line.strip():
            e = json.loads(line)
            e.pop("key_group", None)
            got.add(canonical(_mask_any(e, by_id.get(_entry_id(e)))))
    problems = [f"missing from dump: {x}" for x in sorted(exp - got)]
    if not subset:
        problems += [f"only in dump:      {x}" for x in sorted(got - exp)]
    return problems


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def generate(fx: dict, scratch_root: Path, attempts: int = 2) -> dict:
    name = fx["name"]
    dest = FIXTURES / name
    exp_path = FIXTURES / "expected" / f"{name}.jsonl"
    dump_path = FIXTURES / "dump" / f"{name}.jsonl"
    for p in (exp_path, dump_path):
        p.unlink(missing_ok=True)
    shutil.rmtree(dest, ignore_errors=True)

    for attempt in range(1, attempts + 1):
        scratch = scratch_root / f"{name}-{attempt}"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        t0 = time.time()
        if fx.get("s3"):
            res = _run_on_s3(fx, scratch, dest)
            snap = FIXTURES / res["SNAPSHOT_PATH"][len(f"s3://{S3_BUCKET}/"):]
        else:
            res = run_job(fx, scratch)
            snap = Path(res["SNAPSHOT_PATH"])
        print(f"  {name}: job {res.get('JOB_ID')} took {time.time() - t0:.1f}s -> {snap}")

        # copy the snapshot
        if fx.get("s3"):
            rel = str(snap.relative_to(FIXTURES))  # the bucket's objects, already mirrored
        elif fx["snapshot"] == "savepoint":
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(snap, dest / snap.name)
            rel = f"{name}/{snap.name}"
        else:
            shutil.rmtree(dest, ignore_errors=True)
            job_dir = snap.parent
            shutil.copytree(job_dir, dest / job_dir.name)
            rel = f"{name}/{job_dir.name}/{snap.name}"
        fixture_dir = FIXTURES / rel

        infos = snapshot_info(fixture_dir)
        if fx["job"] in ("datastream", "ttl-kryo", "types-avro", "types-avro-evolved",
                         "raw-state", "edge-datastream",
                         "changelog-ops", "changelog-ttl", "labels", "async-datastream",
                         "cep-stream", "kryo-types", "proto-types"):
            for info in infos:
                if info["uid"] and info["operator_id"] != operator_id_for_uid(info["uid"]):
                    raise RuntimeError(f"operator id mismatch for uid {info['uid']}: {info}")
            entries = {"datastream": datastream_expected, "ttl-kryo": ttl_kryo_expected,
                       "types-avro": avro_expected,
                       "types-avro-evolved": avro_evolved_expected,
                       "kryo-types": kryo_types_expected,
                       "proto-types": proto_types_expected,
                       "cep-stream": cep_stream_expected,
                       "raw-state": raw_state_expected,
                       "changelog-ops": changelog_ops_expected,
                       "changelog-ttl": changelog_ttl_expected,
                       "labels": changelog_ttl_expected,
                       "async-datastream": async_datastream_expected,
                       "edge-datastream": lambda: edge_datastream_expected(fx)}[fx["job"]]()
        elif fx["job"] in PYFLINK_JOBS:
            for info in infos:
                if info["uid"] and info["operator_id"] != operator_id_for_uid(info["uid"]):
                    raise RuntimeError(f"operator id mismatch for uid {info['uid']}: {info}")
            entries = pyflink_expected(fx["job"].split("-")[1])
        elif fx["job"] == "sql-keys":
            entries = sql_keys_expected(infos)
        elif fx["job"] in PLAN_JOBS:
            save_plan(fx["job"], scratch / "plan.json", scratch / "out")
            ids = {i["uid"]: i["operator_id"] for i in infos if i["uid"]}
            entries = {"sql-ops": lambda i: sql_ops_expected(i, fx["backend"]),
                       "sql-minibatch": sql_minibatch_expected,
                       "sql-aggs": sql_aggs_expected, "sql-aggs-minibatch": sql_aggs_expected,
                       "edge-sql": sql_edge_expected, "sql-cep": sql_cep_expected,
                       "sql-cep-map": sql_cep_expected,
                       "sql-over": sql_over_expected}[fx["job"]](ids)
        else:
            aggs = [i for i in infos if i["name"].startswith("GroupAggregate")]
            if len(aggs) != 1:
                raise RuntimeError(f"expected one GroupAggregate operator, got {infos}")
            entries = (sql_async_expected if fx["job"] == "async-sql" else sql_expected)(
                aggs[0]["operator_id"])
        write_jsonl(exp_path, entries)

        problems: list[str] = []
        if dump_available():
            if fx["job"] == "kryo-types":
                write_job_jar(dest)
            if fx["job"] == "proto-types":
                write_proto_files(dest)
            if run_dump(fixture_dir, dump_path, scratch / "dump.log", fx["backend"],
                        kryo_fields=fx["job"] in ("kryo-types", "proto-types")):
                problems = compare(exp_path, dump_path, subset=fx["job"] in SUBSET_JOBS)
            else:
                problems = [f"SavepointDump failed, see {scratch / 'dump.log'}"]
                dump_path.unlink(missing_ok=True)
        else:
            print(f"  warning: SavepointDump is not built; no dump for {name}", file=sys.stderr)
        if problems and attempt < attempts:
            print(f"  {name}: dump differs from expected ({len(problems)} lines), retrying:\n    "
                  + "\n    ".join(problems[:10]), file=sys.stderr)
            continue
        break

    size = du(dest)
    if size > MAX_FIXTURE_BYTES:
        raise RuntimeError(f"{name} is {size} bytes, over the {MAX_FIXTURE_BYTES} byte budget")
    if problems:
        print(f"  WARNING {name}: dump differs from expected ({len(problems)} lines):\n    "
              + "\n    ".join(problems[:20]), file=sys.stderr)
    else:
        print(f"  {name}: {size} bytes, {len(entries)} expected entries"
              + (", dump matches" if dump_path.exists() else ""))
    return manifest_record(fx, rel, infos)


def _states_in_dump(name: str) -> dict[str, list[dict]]:
    """operator id -> the states (name, kind) Flink's restore found, for the SQL operator
    fixtures, whose state names depend on the planner (e.g. ``agg2$map`` of an aggregate)."""
    path = FIXTURES / "dump" / f"{name}.jsonl"
    seen: dict[str, dict[str, str]] = {}
    ttl: set[tuple[str, str]] = set()
    if path.exists():
        for line in path.read_text().splitlines():
            e = json.loads(line)
            seen.setdefault(e["operator_id"], {})[e["state"]] = e["kind"]
            if _is_ttl_value(e.get("value")):
                ttl.add((e["operator_id"], e["state"]))
    return {op: [{"name": n, "kind": k, **({"ttl": True} if (op, n) in ttl else {})}
                 for n, k in sorted(states.items())]
            for op, states in seen.items()}


def _is_ttl_value(v) -> bool:
    """A dumped TtlValue (docs/fixtures.md): ``{"value", "last_access"}``, per list element."""
    if isinstance(v, list):
        return bool(v) and all(_is_ttl_value(x) for x in v)
    return isinstance(v, dict) and set(v) == {"value", "last_access"}


def save_plan(job: str, plan: Path, out: Path) -> None:
    """The compiled plan, with the scratch input paths replaced by a placeholder, minified, as
    ``tests/fixtures/plans/<job>.json`` (shared by the job's fixtures: it must not change)."""
    doc = json.loads(plan.read_text().replace("file://" + str(out.resolve()), "file:///FIXTURE"))
    text = json.dumps(doc, separators=(",", ":"), sort_keys=False) + "\n"
    dest = FIXTURES / "plans" / f"{job}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists() and dest.read_text() != text:
        print(f"  note: {dest} changed (new plan written)", file=sys.stderr)
    dest.write_text(text)


def generate_series(series: dict, scratch_root: Path) -> list[dict]:
    """One run of the series' job: its retained checkpoints chk-1..3 and the savepoint after them,
    copied with the job's whole output tree (incremental checkpoints share ``shared/``)."""
    name = series["name"]
    dest = FIXTURES / name
    shutil.rmtree(dest, ignore_errors=True)
    scratch = scratch_root / name
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    out = scratch / "out"
    cmd = ["java", "-cp", build(), "statequery.fixtures.SequenceJob", series["backend"],
           str(series["incremental"]).lower(), str(out)]
    t0 = time.time()
    with open(scratch / "job.log", "w") as log:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"SequenceJob failed ({proc.returncode}), see {scratch / 'job.log'}")
    lines = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    snaps = [(f"chk-{n}", Path(lines[f"CHECKPOINT_{n}"])) for n in (1, 2, 3)]
    snaps.append(("savepoint", Path(lines["SNAPSHOT_PATH"])))
    print(f"  {name}: job {lines.get('JOB_ID')} took {time.time() - t0:.1f}s")
    shutil.copytree(out, dest)
    records = []
    for index, (suffix, snap) in enumerate(snaps, 1):
        fx_name = f"{name}-{suffix}"
        rel = f"{name}/{snap.relative_to(out)}"
        exp_path = FIXTURES / "expected" / f"{fx_name}.jsonl"
        dump_path = FIXTURES / "dump" / f"{fx_name}.jsonl"
        write_jsonl(exp_path, sequence_expected(index * SEQ_PER_CHECKPOINT))
        problems = []
        if dump_available():
            if run_dump(FIXTURES / rel, dump_path, scratch / f"dump-{suffix}.log"):
                problems = compare(exp_path, dump_path)
            else:
                problems = [f"SavepointDump failed, see {scratch / f'dump-{suffix}.log'}"]
        if problems:
            print(f"  WARNING {fx_name}: dump differs from expected ({len(problems)} lines):\n    "
                  + "\n    ".join(problems[:20]), file=sys.stderr)
        savepoint = suffix == "savepoint"
        fx = {"name": fx_name, "job": series["job"], "backend": series["backend"],
              "snapshot": "savepoint" if savepoint else "checkpoint",
              "format": "canonical" if savepoint else "native",
              "incremental": series["incremental"] and not savepoint, "max_parallelism": 128,
              "compression": False, "inline": False}
        rec = manifest_record(fx, rel, snapshot_info(FIXTURES / rel))
        rec["series"] = name
        rec["series_index"] = index
        records.append(rec)
    size = du(dest)
    if size > MAX_FIXTURE_BYTES:
        raise RuntimeError(f"{name} is {size} bytes, over the {MAX_FIXTURE_BYTES} byte budget")
    print(f"  {name}: {size} bytes, {len(records)} snapshots")
    return records


def manifest_record(fx: dict, rel: str, infos: list[dict]) -> dict:
    dump_states = _states_in_dump(fx["name"]) if fx["job"] in SUBSET_JOBS else {}
    operators = []
    for info in sorted(infos, key=lambda i: (i["uid"] or "~", i["name"])):
        if fx["job"] == "datastream":
            states = DS_STATES.get(info["uid"], [])
        elif fx["job"] == "async-datastream":
            states = DS_STATES.get(info["uid"], []) if info["uid"] in ASYNC_DS_UIDS else []
        elif fx["job"] == "async-sql":
            states = SQL_ASYNC_STATES if info["name"].startswith("GroupAggregate") else []
        elif fx["job"] == "ttl-kryo":
            states = TK_STATES.get(info["uid"], [])
        elif fx["job"] == "kryo-types":
            states = KT_STATES.get(info["uid"], [])
        elif fx["job"] == "proto-types":
            states = PT_STATES.get(info["uid"], [])
        elif fx["job"] == "types-avro":
            states = AV_STATES.get(info["uid"], [])
        elif fx["job"] == "types-avro-evolved":
            states = AV_EVOLVE_STATES.get(info["uid"], [])
        elif fx["job"] == "raw-state":
            states = RAW_STATES.get(info["uid"], [])
        elif fx["job"] == "edge-datastream":
            states = EDGE_DS_STATES.get(info["uid"], [])
        elif fx["job"] in PYFLINK_JOBS:
            states = pyflink_states(fx["job"].split("-")[1]).get(info["uid"], [])
        elif fx["job"] in SUBSET_JOBS:
            states = dump_states.get(info["operator_id"], [])
        elif fx["job"] == "sequence":
            states = SEQ_STATES.get(info["uid"], [])
        else:
            states = SQL_STATES if info["name"].startswith("GroupAggregate") else []
        op = {"uid": info["uid"], "name": info["name"], "operator_id": info["operator_id"],
              "parallelism": info["parallelism"], "max_parallelism": info["max_parallelism"],
              "states": states}
        if info["fully_finished"]:
            op["fully_finished"] = True
        if info["coordinator_state_bytes"] >= 0:
            op["coordinator_state_bytes"] = info["coordinator_state_bytes"]
        operators.append(op)
    rec = {k: fx[k] for k in ("name", "job", "backend", "snapshot", "format")}
    if fx["backend"] == "forst":
        # ForSt writes RocksDB's files and handles: the layout statequery reads is "rocksdb"
        rec["backend"], rec["state_backend"] = "rocksdb", "forst"
        if fx["job"].startswith("async-"):
            # State V2 headers (KEY_VALUE_V2) and ForSt's working-directory file paths say ForSt;
            # a ForSt job on State V1 with its primary directory local says nothing more than
            # RocksDB does (docs/format-notes.md)
            rec["state_meta_backend"] = "forst"
    rec["flink_version"] = fx.get("flink_version", FLINK_VERSION)
    rec["path"] = rel
    rec.update({k: fx[k] for k in ("incremental", "max_parallelism", "compression", "inline")})
    for extra in ("timers", "changelog", "large", "s3"):
        if extra in fx:
            rec[extra] = fx[extra]
    rec["operators"] = operators
    if fx["job"] in SUBSET_JOBS:
        rec["expected"] = "subset"
    if fx["job"] in PLAN_JOBS:
        rec["plan"] = f"plans/{fx['job']}.json"
    return rec


def write_manifest(records: dict[str, dict]) -> None:
    """``fixtures``: one snapshot per fixture (the matrix); ``series``: the snapshots of the series
    runs (several snapshots of one job, in order); ``unread``: snapshots whose keyed state
    statequery lists with a reason but does not read yet (not in the fixture suites, each has
    its own tests); ``changelog``: the changelog state backend's checkpoints (model and oracle
    dump as for every fixture; read by their own tests, not by the other fixture suites)."""
    path = FIXTURES / "manifest.json"
    old = {}
    data: dict = {}
    if path.exists():
        data = json.loads(path.read_text())
        old = {r["name"]: r for r in data.get("fixtures", []) + data.get("series", [])
               + data.get("unread", []) + data.get("changelog", [])}
    old.update(records)
    for r in old.values():
        if BY_NAME.get(r["name"], {}).get("unread"):
            r["unread"] = BY_NAME[r["name"]]["unread"]
    ordered = [old[f["name"]] for f in MATRIX if f["name"] in old and "unread" not in f
               and "changelog" not in f]
    # fixtures of other generators (generate_version_fixtures.py: other Flink versions) stay
    ordered += [r for r in data.get("fixtures", []) if r["name"] not in BY_NAME]
    unread = [old[f["name"]] for f in MATRIX if f["name"] in old and "unread" in f]
    # the changelog state backend's checkpoints: their own list (tests/backends/test_changelog.py
    # and the oracle test read them; the other fixture suites do not)
    changelog = [old[f["name"]] for f in MATRIX if f["name"] in old and "changelog" in f
                 and "unread" not in f]
    series = sorted((r for r in old.values() if "series" in r),
                    key=lambda r: (r["series"], r["series_index"]))
    path.write_text(json.dumps({"fixtures": ordered,
                                "series": series, "unread": unread,
                                "changelog": changelog}, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", action="append", choices=sorted([*BY_NAME, *SERIES_BY_NAME]),
                    metavar="NAME",
                    help="regenerate only this fixture (repeatable)")
    ap.add_argument("--keep-scratch", action="store_true", help="keep the scratch directory")
    args = ap.parse_args()

    selected = [BY_NAME[n] for n in args.only if n in BY_NAME] if args.only else MATRIX
    series = [SERIES_BY_NAME[n] for n in args.only if n in SERIES_BY_NAME] if args.only else SERIES
    t0 = time.time()
    build()
    scratch_root = Path(tempfile.mkdtemp(prefix="statequery-fixtures-"))
    records = {}
    try:
        for fx in selected:
            records[fx["name"]] = generate(fx, scratch_root)
            write_manifest(records)
        for ser in series:
            for rec in generate_series(ser, scratch_root):
                records[rec["name"]] = rec
            write_manifest(records)
    finally:
        if args.keep_scratch:
            print(f"scratch kept in {scratch_root}")
        else:
            shutil.rmtree(scratch_root, ignore_errors=True)
    print(f"done: {len(selected) + len(series)} fixture(s) in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
