"""A StateMeta snapshot of an older format: the model is derived again, and what the snapshot
holds that cannot be derived (the SQL plan attached with ``statequery snapshot --plan``, the job
it was captured from) is kept, on open and when ``statequery snapshot`` writes it again.

The snapshots were written by statequery's format-5 code over the fixtures
(tests/fixtures/statemeta-format5/README.md)."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import msgpack
import pytest

import statequery
from statequery.cli import main
from statequery.exceptions import SnapshotIgnoredWarning
from statequery.io import FileIO
from statequery.metadata.statemeta import (
    FORMAT_VERSION,
    SNAPSHOT_FILE_NAME,
    StateInfo,
    kept_parts,
    read_snapshot,
)
from statequery.savepoint import Savepoint
from tests.conftest import FIXTURES, fixture_dir

OLD = FIXTURES / "statemeta-format5"
PLAN = FIXTURES / "plans" / "sql-minibatch.json"
CAPTURED = FIXTURES / "capture-sql" / "savepoint-b47921-3cc5c05d03f7"


def _with_old_snapshot(tmp_path: Path, fixture: str, snapshot: str) -> Path:
    """A copy of the fixture savepoint with the format-5 snapshot next to its ``_metadata``."""
    src = CAPTURED if fixture == "capture-sql" else fixture_dir(fixture)
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    shutil.copy(OLD / snapshot, dst / SNAPSHOT_FILE_NAME)
    return dst


def _envelope_version(path: Path) -> int:
    return int(msgpack.unpackb(path.read_bytes(), raw=False)["format_version"])


def _global_agg(sp: Savepoint) -> StateInfo:
    """The accumulators of the first two-phase global aggregation (``GlobalGroupAggregate[n]``
    with the smallest ``n``), as tests/metadata/test_plan.py reads them."""
    ops = sorted((o for o in sp.operators if o.name.split("[")[0] == "GlobalGroupAggregate"),
                 key=lambda o: int(o.name.split("[")[1].split("]")[0]))
    return sp.state(ops[0].operator_id, "accState")


def test_the_fixtures_are_of_the_older_format() -> None:
    assert FORMAT_VERSION > 5
    assert _envelope_version(OLD / "sql-minibatch-hashmap-native.msgpack") == 5
    assert _envelope_version(OLD / "capture-sql.msgpack") == 5


def test_an_older_snapshot_keeps_its_plan(tmp_path: Path) -> None:
    path = _with_old_snapshot(tmp_path, "sql-minibatch-hashmap-native",
                              "sql-minibatch-hashmap-native.msgpack")
    with pytest.warns(SnapshotIgnoredWarning, match=r"format 5, this statequery writes "
                      rf"{FORMAT_VERSION}: .* keeping its SQL plan;"):
        sp = statequery.open(str(path))
    assert not sp.from_snapshot  # derived from _metadata and the headers
    assert sp.sql_plan is not None and sp.sql_plan.text == PLAN.read_text()
    # the plan's names, as with `open(plan=...)`: the two-phase aggregate's accumulators
    named = statequery.open(str(path), use_snapshot=False, plan=str(PLAN))
    assert [(s.table_name, s.key_type, s.value_type) for s in sp.states] == [
        (s.table_name, s.key_type, s.value_type) for s in named.states]
    acc = _global_agg(sp)
    assert acc.value_type == "ROW<cnt BIGINT, total INTEGER, max_amount INTEGER>"
    rows = sp.read(acc, key={"category": "games"}).to_pylist()
    assert rows[0]["value"]["cnt"] == 20
    # without the snapshot: f0, f1, ... (the names came from the kept plan)
    bare = statequery.open(str(path), use_snapshot=False)
    assert bare.sql_plan is None
    assert bare.state(acc.operator_id, "accState").value_type.startswith("ROW<f0 ")


def test_statequery_snapshot_writes_it_again_with_the_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _with_old_snapshot(tmp_path, "sql-minibatch-hashmap-native",
                              "sql-minibatch-hashmap-native.msgpack")
    assert main(["snapshot", str(path)]) == 0  # no --plan: the old snapshot's is kept
    out = capsys.readouterr().out
    assert "operators named by the plan it kept" in out
    snap = path / SNAPSHOT_FILE_NAME
    assert _envelope_version(snap) == FORMAT_VERSION
    assert read_snapshot(FileIO(), str(snap)).plan == PLAN.read_text()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SnapshotIgnoredWarning)
        sp = statequery.open(str(path))
    assert sp.from_snapshot and sp.sql_plan is not None
    assert _global_agg(sp).value_type == "ROW<cnt BIGINT, total INTEGER, max_amount INTEGER>"
    # and once more, now from a current snapshot: still kept
    assert main(["snapshot", str(path)]) == 0
    assert read_snapshot(FileIO(), str(snap)).plan == PLAN.read_text()


def test_an_older_captured_snapshot_keeps_its_job(tmp_path: Path) -> None:
    path = _with_old_snapshot(tmp_path, "capture-sql", "capture-sql.msgpack")
    with pytest.warns(SnapshotIgnoredWarning, match="keeping its captured job;"):
        sp = statequery.open(str(path))
    assert not sp.from_snapshot
    assert sp.job is not None and sp.job.job_id == "b4792120de26cf72cdf707ad20ff9ad1"
    assert sp.job.job_name == "statequery-capture-sql"
    assert [v.name for v in sp.job.vertices] == [
        "Source: orders[1] -> Calc[2]", "GroupAggregate[4] -> order_stats[5]: Writer"]
    # the job graph names the SQL columns, as it did in the captured snapshot
    acc = sp.state("groupaggregate_4__accstate")
    assert acc.key_type == "ROW<category STRING>"
    assert acc.value_type == "ROW<cnt BIGINT, max_amount INTEGER>"
    rows = sp.read(acc).to_pylist()
    assert sorted(r["key"]["category"] for r in rows) == ["c0", "c1", "c2", "c3", "c4"]
    # written again: the job is in the current format's snapshot
    assert main(["snapshot", str(path)]) == 0
    again = statequery.open(str(path))
    assert again.from_snapshot and again.job == sp.job
    assert again.state("groupaggregate_4__accstate").value_type == acc.value_type


def test_an_older_snapshot_of_another_savepoint_keeps_nothing(tmp_path: Path) -> None:
    # the plan of sql-minibatch next to another savepoint's _metadata: not this savepoint's
    path = _with_old_snapshot(tmp_path, "sql-ops-hashmap-native",
                              "sql-minibatch-hashmap-native.msgpack")
    with warnings.catch_warnings():
        warnings.simplefilter("error", SnapshotIgnoredWarning)
        sp = statequery.open(str(path))
    assert not sp.from_snapshot and sp.sql_plan is None and sp.job is None
    raw = (OLD / "sql-minibatch-hashmap-native.msgpack").read_bytes()
    assert kept_parts(raw, (path / "_metadata").read_bytes()) is None
    mine = (fixture_dir("sql-minibatch-hashmap-native") / "_metadata").read_bytes()
    kept = kept_parts(raw, mine)
    assert kept is not None and kept.format_version == 5 and kept.job is None
    assert kept.plan == PLAN.read_text()


def test_a_damaged_older_snapshot_is_ignored_with_its_reason(tmp_path: Path) -> None:
    path = _with_old_snapshot(tmp_path, "sql-minibatch-hashmap-native",
                              "sql-minibatch-hashmap-native.msgpack")
    envelope = msgpack.unpackb((path / SNAPSHOT_FILE_NAME).read_bytes(), raw=False)
    body = bytearray(envelope["body"])
    body[len(body) // 2] ^= 0x01
    envelope["body"] = bytes(body)
    (path / SNAPSHOT_FILE_NAME).write_bytes(msgpack.packb(envelope, use_bin_type=True))
    with pytest.warns(SnapshotIgnoredWarning, match="checksum mismatch"):
        sp = statequery.open(str(path))
    assert sp.sql_plan is None and not sp.from_snapshot
