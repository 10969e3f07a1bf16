"""statequery.capture against recorded REST conversations of a real Flink 2.3.0 session cluster
(tests/fixtures/rest/, recorded with tests/support/flinkcluster.py) and the savepoints that
cluster wrote during them (tests/fixtures/capture-sql/, capture-datastream/). The live test
(tests/capture/test_capture_live.py) runs the same captures against a cluster started for it."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from support.restreplay import Conversation, ReplayRest, replay_server

import statequery
from statequery.capture import (
    CaptureError,
    CaptureTimeoutError,
    SavepointFailedError,
    captured_databases,
    database_name,
    prune,
)
from statequery.cli import main
from statequery.io import FileIO
from statequery.metadata.plan import apply_descriptions, parse_description
from statequery.metadata.statemeta import (
    SNAPSHOT_FILE_NAME,
    JobInfo,
    JobVertex,
    dumps,
    loads,
)

FIXTURES = Path(__file__).parents[1] / "fixtures"


def _copy(name: str, tmp_path: Path) -> Path:
    """A copy of a captured savepoint fixture; returns its parent (the target directory)."""
    src = FIXTURES / f"capture-{name}"
    dst = tmp_path / "savepoints"
    shutil.copytree(src, dst)
    return dst


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _sql_capture(tmp_path: Path) -> statequery.capture:  # type: ignore[valid-type]
    conv = Conversation.load("capture-sql")
    parent = _copy("sql", tmp_path)
    conv.relocate(str(parent))
    return statequery.capture(ReplayRest(conv), conv.job_id)


def test_sql_capture_names_columns_without_a_plan(tmp_path: Path) -> None:
    result = _sql_capture(tmp_path)
    assert result.job.job_name == "statequery-capture-sql"
    assert Path(result.snapshot) == Path(result.location) / SNAPSHOT_FILE_NAME
    assert Path(result.snapshot).is_file()
    sp = statequery.open(result.location)
    assert sp.from_snapshot and sp.sql_plan is None
    assert sp.job is not None and sp.job.job_id == "b4792120de26cf72cdf707ad20ff9ad1"
    assert [v.name for v in sp.job.vertices] == [
        "Source: orders[1] -> Calc[2]", "GroupAggregate[4] -> order_stats[5]: Writer"]
    acc = sp.state("groupaggregate_4__accstate")
    assert acc.key_type == "ROW<category STRING>"
    assert acc.value_type == "ROW<cnt BIGINT, max_amount INTEGER>"
    assert acc.reason is None
    rows = sp.read(acc).to_pylist()
    assert sorted(r["key"]["category"] for r in rows) == ["c0", "c1", "c2", "c3", "c4"]
    assert all(r["value"]["cnt"] > 0 and 1 <= r["value"]["max_amount"] <= 100 for r in rows)
    # the timers of the aggregation are keyed by the same named key
    timers = sp.state("groupaggregate_4__timer_state_processing_user_timers")
    assert timers.key_type == "ROW<category STRING>"
    # without the snapshot the same savepoint is f0, f1 (the names come from the capture)
    bare = statequery.open(result.location, use_snapshot=False)
    assert bare.state("groupaggregate_4__accstate").value_type == "ROW<f0 BIGINT, f1 INTEGER>"


def test_datastream_capture_records_job_and_vertices(tmp_path: Path) -> None:
    conv = Conversation.load("capture-datastream")
    conv.relocate(str(_copy("datastream", tmp_path)))
    result = statequery.capture(ReplayRest(conv), conv.job_id)
    sp = statequery.open(result.location)
    job = sp.job
    assert job is not None and job.job_name == "statequery-capture-datastream"
    assert job.trigger == "savepoint" and job.flink_version == "2.3.0"
    assert {v.name for v in job.vertices} == {"Source: Numbers",
                                              "Count Per User -> Discard: Writer"}
    op = sp.operator("Count Per User")
    vertex = job.vertex(op.operator_id)
    assert vertex is not None and vertex.name == "Count Per User -> Discard: Writer"
    assert vertex.description == "Count Per User<br/>+- Discard: Writer<br/>"
    table = sp.read(sp.state("Count Per User", "count"))
    assert sorted(table.column("key").to_pylist()) == [f"user-{i}" for i in range(5)]
    assert job.config["state.backend.type"] == "hashmap"
    assert job.checkpoint_config["state_backend"] == "HashMapStateBackend"


def test_failed_savepoint_is_typed_and_writes_nothing(tmp_path: Path) -> None:
    conv = Conversation.load("savepoint-failed")
    before = _files(tmp_path)
    with pytest.raises(SavepointFailedError, match="Failed to create savepoint directory"):
        statequery.capture(ReplayRest(conv), conv.job_id,
                           savepoint="file:///proc/statequery-not-writable")
    assert _files(tmp_path) == before


def test_savepoint_timeout_is_typed_and_writes_nothing(tmp_path: Path) -> None:
    conv = Conversation.load("savepoint-timeout")
    with pytest.raises(CaptureTimeoutError, match="did not complete within 0 s"):
        statequery.capture(ReplayRest(conv), conv.job_id, timeout=0.0)
    assert _files(tmp_path) == []


def test_cancelled_job_and_missing_checkpoint(tmp_path: Path) -> None:
    conv = Conversation.load("job-cancelled")
    with pytest.raises(CaptureError, match="is CANCELED: no savepoint taken"):
        statequery.capture(ReplayRest(conv), conv.job_id)
    assert not any(c["method"] == "POST" for c in conv.calls)
    conv = Conversation.load("no-checkpoint")
    with pytest.raises(CaptureError, match="has no completed checkpoint yet"):
        statequery.capture(ReplayRest(conv), conv.job_id, latest_checkpoint=True)


def test_cli_capture_over_http(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conv = Conversation.load("capture-sql")
    conv.relocate(str(_copy("sql", tmp_path)))
    with replay_server(conv) as url:
        assert main(["capture", "--rest", url, conv.job_id]) == 0
    out = capsys.readouterr().out
    assert "captured savepoint of job 'statequery-capture-sql'" in out
    location = next((tmp_path / "savepoints").glob("savepoint-*"))
    assert main(["inspect", str(location), "--json"]) == 0
    doc = capsys.readouterr().out
    assert '"value_type": "ROW<cnt BIGINT, max_amount INTEGER>"' in doc
    assert '"job_name": "statequery-capture-sql"' in doc


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conv = Conversation.load("savepoint-failed")
    with replay_server(conv) as url:
        status = main(["capture", "--rest", url, conv.job_id,
                       "--savepoint", "file:///proc/statequery-not-writable"])
    err = capsys.readouterr().err
    assert status == 1 and err.startswith("statequery: job ") and "Traceback" not in err
    assert main(["capture", "--rest", "ftp://x", "0" * 32]) == 1
    assert "expected an http://" in capsys.readouterr().err
    assert main(["capture", "--rest", "http://127.0.0.1:9", "not-a-job"]) == 1
    assert "is not a Flink job id" in capsys.readouterr().err
    # nothing listens on port 9 (discard) of loopback: a typed error, not a traceback
    assert main(["capture", "--rest", "http://127.0.0.1:9", "0" * 32]) == 1
    assert capsys.readouterr().err.startswith("statequery: GET http://127.0.0.1:9/jobs/")


# -- the job section of the snapshot -----------------------------------------------------------


def test_job_section_round_trip_and_optional(tmp_path: Path) -> None:
    result = _sql_capture(tmp_path)
    sp = statequery.open(result.location)
    data = Path(result.snapshot).read_bytes()
    meta = loads(data)
    assert meta.job == sp.job
    # a snapshot without the section (every snapshot before capture) still loads: job is None
    plain = loads(dumps(replace(meta, job=None)))
    assert plain.job is None and plain.operators == meta.operators
    # a section of another version is dropped, the rest is used
    import hashlib

    import msgpack

    env = msgpack.unpackb(data, raw=False)
    body = msgpack.unpackb(env["body"], raw=False, strict_map_key=False)
    body["job"]["version"] = 99
    env["body"] = msgpack.packb(body, use_bin_type=True)
    env["sha256"] = hashlib.sha256(env["body"]).hexdigest()
    assert loads(msgpack.packb(env, use_bin_type=True)).job is None


def test_secrets_are_not_recorded(tmp_path: Path) -> None:
    result = _sql_capture(tmp_path)
    assert all("password" not in k and "secret" not in k for k in result.job.config)
    assert set(result.job.config) <= {
        k for k in result.job.config
        if k.startswith(("state.", "execution.checkpointing.", "pipeline.", "parallelism."))
    }


# -- names from vertex descriptions ------------------------------------------------------------


def _job(*vertices: JobVertex) -> JobInfo:
    return JobInfo("0" * 32, "j", "2026-01-01T00:00:00Z", vertices=vertices)


def test_parse_description() -> None:
    (scan, calc) = parse_description(
        "[1]:TableSourceScan(table=[[default_catalog, default_database, orders]], "
        "fields=[id, amount])<br/>+- [2]:Calc(select=[CONCAT('c', CAST(MOD(id, 5) AS "
        "VARCHAR(2147483647))) AS category, amount])<br/>")
    assert (scan.node_id, scan.kind, scan.names("fields")) == (1, "TableSourceScan",
                                                               ("id", "amount"))
    assert calc.kind == "Calc" and len(calc.names("select") or ()) == 2
    assert parse_description("Count Per User<br/>+- Discard: Writer<br/>") == []


def _captured_meta(tmp_path: Path) -> tuple[object, JobVertex]:
    result = _sql_capture(tmp_path)
    sp = statequery.open(result.location, use_snapshot=False)
    meta = sp.meta
    job = result.job
    vertex = next(v for v in job.vertices if v.name.startswith("GroupAggregate"))
    return meta, vertex


def _acc(meta: object) -> object:
    return next(s for s in meta.states if s.name == "accState")  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("select", "why"),
    [
        ("[category, AVG(amount) AS a, MAX(amount) AS m]", "accumulator width of AVG"),
        ("[category, COUNT(*) AS cnt, MAX(amount) AS cnt]", "without distinct names"),
        ("[category, COUNT(*) AS cnt]", "the accumulator has 2 fields, the description names 1"),
        ("[category, COUNT(*), MAX(amount) AS m]", "without distinct names"),
    ],
)
def test_descriptions_refuse_to_guess(tmp_path: Path, select: str, why: str) -> None:
    meta, vertex = _captured_meta(tmp_path)
    desc = f"[4]:GroupAggregate(groupBy=[category], select={select})<br/>"
    named = apply_descriptions(meta, _job(replace(vertex, description=desc)))
    acc = _acc(named)
    assert acc.value_type == "ROW<f0 BIGINT, f1 INTEGER>"  # type: ignore[attr-defined]
    assert acc.decodable  # type: ignore[attr-defined]
    assert why in acc.reason  # type: ignore[attr-defined]
    assert acc.key_type == "ROW<category STRING>"  # type: ignore[attr-defined]


def test_descriptions_ambiguous_vertex(tmp_path: Path) -> None:
    meta, vertex = _captured_meta(tmp_path)
    # two vertices describe [4]:GroupAggregate: which one is the operator's? refuse
    twin = replace(vertex, id="f" * 32)
    named = apply_descriptions(meta, _job(vertex, twin))
    acc = _acc(named)
    assert acc.value_type == "ROW<f0 BIGINT, f1 INTEGER>"  # type: ignore[attr-defined]
    assert "2 vertices describe GroupAggregate[4]: ambiguous" in acc.reason  # type: ignore
    # the vertex of the operator's id headed by another operator: refuse
    other = replace(vertex, description="[9]:Calc(select=[a])<br/>+- " + vertex.description)
    acc = _acc(apply_descriptions(meta, _job(other)))
    assert "headed by another operator" in acc.reason  # type: ignore[attr-defined]
    # a description for another job's node number: no match, no note, no names
    moved = replace(vertex, description=vertex.description.replace("[4]", "[5]"))
    acc = _acc(apply_descriptions(meta, _job(moved)))
    assert acc.value_type == "ROW<f0 BIGINT, f1 INTEGER>"  # type: ignore[attr-defined]
    assert acc.reason is None  # type: ignore[attr-defined]


def test_description_layout_with_retraction_and_distinct(tmp_path: Path) -> None:
    meta, vertex = _captured_meta(tmp_path)
    # retracting calls: Flink adds count1 after the calls (3 fields here): the 2-field
    # accumulator does not fit, names refused
    desc = ("[4]:GroupAggregate(groupBy=[category], select=[category, COUNT_RETRACT(*) AS c, "
            "MAX_RETRACT(amount) AS m])")
    acc = _acc(apply_descriptions(meta, _job(replace(vertex, description=desc))))
    assert "has 2 fields, the description names 3 (c, m, count1)" in acc.reason  # type: ignore
    desc = "[4]:GroupAggregate(groupBy=[category], select=[category, MAX_RETRACT(amount) AS m])"
    acc = _acc(apply_descriptions(meta, _job(replace(vertex, description=desc))))
    assert acc.value_type == "ROW<m BIGINT, count1 INTEGER>"  # type: ignore[attr-defined]
    desc = ("[4]:GroupAggregate(groupBy=[category], select=[category, $SUM0(amount) AS s, "
            "MIN(amount) AS m])")
    acc = _acc(apply_descriptions(meta, _job(replace(vertex, description=desc))))
    assert acc.value_type == "ROW<s BIGINT, m INTEGER>"  # type: ignore[attr-defined]
    desc = "[4]:GroupAggregate(groupBy=[category], select=[category, COUNT(DISTINCT amount) AS d])"
    acc = _acc(apply_descriptions(meta, _job(replace(vertex, description=desc))))
    assert acc.value_type == "ROW<d BIGINT, d_distinct_view INTEGER>"  # type: ignore


def test_operator_without_a_name_takes_its_vertex_name(tmp_path: Path) -> None:
    """_metadata before version 5 (Flink < 1.15) names no operator: the vertex name it heads is
    used, and its tables are named after it."""
    conv = Conversation.load("capture-datastream")
    conv.relocate(str(_copy("datastream", tmp_path)))
    result = statequery.capture(ReplayRest(conv), conv.job_id)
    meta = statequery.open(result.location, use_snapshot=False).meta
    nameless = replace(meta, operators=tuple(
        replace(op, name="", states=tuple(replace(s, operator_name="") for s in op.states))
        for op in meta.operators))
    named = apply_descriptions(nameless, result.job)
    (count,) = [s for s in named.states if s.name == "count"]
    assert count.operator_name == "Count Per User -> Discard: Writer"
    assert count.table_name == "count_per_user_discard_writer__count"


def test_plan_wins_over_descriptions(tmp_path: Path) -> None:
    """A compiled plan, when given, names state; descriptions are the fallback."""
    import json

    result = _sql_capture(tmp_path)
    plan = {
        "flinkVersion": "2.3",
        "nodes": [
            {"id": 2, "type": "stream-exec-calc_1",
             "outputType": "ROW<`grp` VARCHAR(2147483647), `amount` INT>"},
            {"id": 4, "type": "stream-exec-group-aggregate_1", "grouping": [0],
             "aggCalls": [{"name": "n"}, {"name": "top"}], "needRetraction": False,
             "outputType": "ROW<`grp` VARCHAR(2147483647), `n` BIGINT, `top` INT>"},
        ],
        "edges": [{"source": 2, "target": 4}],
    }
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    sp = statequery.open(result.location, plan=str(plan_file))
    acc = next(s for s in sp.states if s.name == "accState")
    assert (acc.key_type, acc.value_type) == ("ROW<grp STRING>", "ROW<n BIGINT, top INTEGER>")
    sp = statequery.open(result.location)
    acc = sp.state("groupaggregate_4__accstate")
    assert (acc.key_type, acc.value_type) == ("ROW<category STRING>",
                                              "ROW<cnt BIGINT, max_amount INTEGER>")


# -- a catalog following a job ---------------------------------------------------------------


def test_database_names_and_prune(tmp_path: Path) -> None:
    import datetime

    when = datetime.datetime(2026, 11, 25, 19, 5, 1, tzinfo=datetime.timezone.utc)
    assert database_name("Order Stats", when) == "order_stats_20261125t190501z"
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    captured = []
    for i in range(3):
        conv = Conversation.load("capture-sql")
        db = catalog / f"statequery_capture_sql_2026112{i}t000000z"
        conv.relocate(str(_copy("sql", tmp_path / f"x{i}")))
        result = statequery.capture(ReplayRest(conv), conv.job_id)
        shutil.move(str(Path(result.location).parent), str(db))
        captured.append(db.name)
    (catalog / "someone-elses").mkdir()
    shutil.copytree(FIXTURES / "capture-datastream", catalog / "someone-elses" / "x")
    io = FileIO()
    assert [n for _, n in captured_databases(io, str(catalog), "b4792120de26cf72cdf707ad20ff9ad1")
            ] == captured
    assert prune(io, str(catalog), "b4792120de26cf72cdf707ad20ff9ad1", 2) == [captured[0]]
    assert sorted(os.listdir(catalog)) == sorted([*captured[1:], "someone-elses"])
    # the kept databases are the catalog's, with their names
    from statequery.catalog import Catalog

    cat = Catalog(str(catalog))
    sp = cat.savepoint(captured[2])
    assert sp.state("groupaggregate_4__accstate").value_type.startswith("ROW<cnt")


@pytest.mark.spark
@pytest.mark.slow
def test_spark_attach_of_a_captured_savepoint(  # type: ignore[no-untyped-def]
    spark, tmp_path: Path,
) -> None:
    """``statequery attach`` of a captured savepoint: the SQL job's columns by name, no --plan."""
    from statequery.spark.catalog import attach

    result = _sql_capture(tmp_path)
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    assert attach(spark, result.location, database="captured") == ["captured"]
    rows = spark.sql("SELECT key.category AS category, value.cnt AS cnt, "
                     "value.max_amount AS max_amount "
                     "FROM captured.groupaggregate_4__accstate ORDER BY category").collect()
    assert [r["category"] for r in rows] == ["c0", "c1", "c2", "c3", "c4"]
    assert all(r["cnt"] > 0 and 1 <= r["max_amount"] <= 100 for r in rows)
    spark.sql("DROP DATABASE captured CASCADE")


def test_cli_inspect_shows_the_job_and_option_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _sql_capture(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["inspect", result.location]) == 0
    out = capsys.readouterr().out
    assert "captured from job 'statequery-capture-sql' (b4792120de26cf72cdf707ad20ff9ad1)" in out
    assert "ROW<cnt BIGINT, max_amount INTEGER>" in out
    assert main(["capture", "--rest", "http://127.0.0.1:9", "0" * 32, "--every", "5"]) == 1
    assert "--every and --count need --catalog DIR" in capsys.readouterr().err
    assert main(["capture", "--rest", "http://127.0.0.1:9", "0" * 32, "--catalog",
                 str(tmp_path), "--keep", "0"]) == 1
    assert "--keep must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["capture", "--rest", "http://x", "0" * 32, "--savepoint", "d",
              "--latest-checkpoint"])
    assert "not allowed with argument" in capsys.readouterr().err
