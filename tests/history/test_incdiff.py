"""Diffs of RocksDB incremental versions reading only the keys of the SST files that differ
(statequery.incdiff) give exactly the rows of the full read, on both decode paths."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from support.readcost import bytes_read
from support.series import FIXTURES

import statequery
from statequery import incdiff
from statequery.diff import DIFF_SCHEMA, diff_batches
from statequery.history import Job
from statequery.incdiff import IncrementalDiff
from statequery.io import FileIO
from statequery.savepoint import Savepoint

INCREMENTAL = ("history-rocksdb-incremental", "history-rescaled")


def _feed(fixture: str, enabled: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[pa.Table, int]:
    monkeypatch.setattr(incdiff, "ENABLED", enabled)
    io = FileIO()
    with statequery.open_job(str(FIXTURES / fixture), io=io) as job:
        for v in job.complete_versions():
            job.version(v.checkpoint_id)  # opened before counting: _metadata is not the diff's
        io.stats.reset()
        return job.changes(), bytes_read(io)


@pytest.mark.parametrize("fixture", INCREMENTAL)
def test_change_feed_by_keys_equals_the_full_read(
    fixture: str, decode_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every consecutive pair's rows, in order, as the full read gives them; fewer bytes."""
    full, full_bytes = _feed(fixture, False, monkeypatch)
    by_keys, keyed_bytes = _feed(fixture, True, monkeypatch)
    assert full.num_rows > 0
    assert by_keys.to_pylist() == full.to_pylist()
    assert keyed_bytes < full_bytes


@pytest.mark.parametrize("fixture", INCREMENTAL)
def test_diff_of_any_two_versions_by_keys_equals_the_full_read(
    fixture: str, decode_path: str
) -> None:
    """Every pair of versions (not only consecutive ones): the same rows, and at least one
    subtask of the job is read by keys (not whole)."""
    used = 0
    with statequery.open_job(str(FIXTURES / fixture)) as job:
        ids = [v.checkpoint_id for v in job.complete_versions()]
        for a, b in itertools.combinations(ids, 2):
            old, new = job.version(a), job.version(b)
            full = pa.Table.from_batches(list(diff_batches(old, new)), schema=DIFF_SCHEMA)
            with IncrementalDiff(old, new) as partial:
                got = pa.Table.from_batches(list(diff_batches(old, new, partial=partial)),
                                            schema=DIFF_SCHEMA)
                used += partial.subtasks_read
            assert got.to_pylist() == full.to_pylist(), (a, b)
    assert used > 0


def test_subtasks_whose_differing_tables_are_most_of_their_bytes_are_read_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Above MAX_CHANGED_SHARE of a subtask's table bytes in differing tables, the subtask is
    read whole (the same rows)."""
    with statequery.open_job(str(FIXTURES / "history-rocksdb-incremental")) as job:
        old, new = job.version(1), job.version(2)
        full = pa.Table.from_batches(list(diff_batches(old, new)), schema=DIFF_SCHEMA)
        counts = []
        for share in (1.0, 0.0):
            monkeypatch.setattr(incdiff, "MAX_CHANGED_SHARE", share)
            with IncrementalDiff(old, new) as partial:
                got = pa.Table.from_batches(list(diff_batches(old, new, partial=partial)),
                                            schema=DIFF_SCHEMA)
                counts.append((partial.subtasks_read, partial.subtasks_whole))
            assert got.to_pylist() == full.to_pylist()
    assert counts == [(2, 0), (0, 2)]


def test_the_feed_keeps_the_tables_read_from_one_version_pair_to_the_next() -> None:
    """Job.changes reads a block of a table several versions hold once: fewer bytes than the
    same diffs each with tables of its own (the same rows)."""
    from statequery.history import unchanged_key_groups

    def opened() -> tuple[FileIO, Job, list[Savepoint]]:
        io = FileIO()
        job = statequery.open_job(str(FIXTURES / "history-rocksdb-incremental"), io=io)
        versions = [job.version(v.checkpoint_id) for v in job.complete_versions()]
        io.stats.reset()
        return io, job, versions

    io, job, _ = opened()
    with job:
        feed = job.changes()
        kept = io.stats.total_bytes
    io, job, versions = opened()
    rows = 0
    with job:
        for old, new in itertools.pairwise(versions):
            same = unchanged_key_groups(old, new)
            with IncrementalDiff(old, new) as partial:
                for b in diff_batches(old, new, unchanged=same, partial=partial):
                    rows += b.num_rows
        apart = io.stats.total_bytes
    assert feed.num_rows == rows > 0
    assert kept < apart


def test_change_feed_by_keys_with_whole_table_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ranged point reads (rocksdb.POINT_READS False: tables fetched whole into the
    file cache) the feed by keys is still the full read's."""
    from statequery.backends import rocksdb

    monkeypatch.setattr(rocksdb, "POINT_READS", False)
    full, _ = _feed("history-rescaled", False, monkeypatch)
    by_keys, _ = _feed("history-rescaled", True, monkeypatch)
    assert full.num_rows > 0
    assert by_keys.to_pylist() == full.to_pylist()
