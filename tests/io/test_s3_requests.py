"""Reading a canonical fixture from an S3-compatible server on loopback (moto in server mode):
the requests follow the scan tasks, not the key groups; the rows equal the local read."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest
from conftest import fixture_dir
from support.s3server import RequestCounter, S3Server, moto_s3_server

import statequery
from statequery.io import FileIO
from statequery.scan import execute

NAME = "datastream-hashmap-canonical"


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[S3Server, str, RequestCounter]]:
    with moto_s3_server() as s:
        uri = s.upload_tree(fixture_dir(NAME), "canonical")
        yield s, uri, s.count_requests()


def _rows(table: pa.Table) -> list[object]:
    return sorted(table.to_pylist(), key=repr)


def test_requests_follow_the_tasks_not_the_key_groups(
    server: tuple[S3Server, str, RequestCounter],
) -> None:
    s3, uri, requests = server
    local = statequery.open(str(fixture_dir(NAME))).read("user-state", "recent-categories")
    key_groups = set(local.column("key_group").to_pylist())
    sp = statequery.open(uri, storage_options=s3.storage_options, use_snapshot=False)
    tasks = sp.plan("user-state", "recent-categories")
    requests.take()
    batches = [b for t in tasks for _, b in execute(t, resolver=sp.resolver)]
    got = requests.take()
    assert _rows(pa.Table.from_batches(batches, schema=local.schema)) == _rows(local)
    # the headers were read through the same open files: one ranged GET per task (its key
    # groups are adjacent: one coalesced read), where each key group used to cost an open and
    # a read (2 requests)
    assert got == {"GET (ranged)": len(tasks)}, got
    assert len(tasks) == 2 and len(key_groups) > 10

    # tasks of 8 key groups, each with its own FileIO (as Spark executors run them): at most
    # one open (a HEAD, unless s3fs knows the size already) and one ranged GET per task; a task
    # whose key groups hold no data reads nothing
    small = sp.plan("user-state", "recent-categories", split=8)
    requests.take()
    again = []
    for task in small:
        io = FileIO(s3.storage_options)
        again.extend(b for _, b in execute(task, io))
        io.close()
    got = requests.take()
    assert _rows(pa.Table.from_batches(again, schema=local.schema)) == _rows(local)
    assert set(got) <= {"HEAD", "GET (ranged)"}, got
    assert 0 < got["GET (ranged)"] <= len(small) and got.get("HEAD", 0) <= len(small), got


def test_with_the_run_index_remote_reads_join_runs_across_small_gaps(
    server: tuple[S3Server, str, RequestCounter],
) -> None:
    """On object storage the runs of one state are read through the other states' bytes between
    them (gaps up to REMOTE_READ_GAP): one ranged GET per task, as without the index."""
    from statequery.backends.keygroups import REMOTE_READ_GAP, read_gap

    s3, uri, requests = server
    assert read_gap(uri + "/x") == REMOTE_READ_GAP and read_gap(str(fixture_dir(NAME))) == 0
    sp = statequery.open(uri, storage_options=s3.storage_options, use_snapshot=False)
    local = statequery.open(str(fixture_dir(NAME))).read("user-state", "count")
    sp.read("user-state", "recent-categories")  # a whole walk: records the run index
    tasks = sp.plan("user-state", "count")
    assert len(tasks) == 2 and all(t.runs is not None for t in tasks)
    # each task's runs lie within REMOTE_READ_GAP of each other: one span per task
    assert all(len(t.byte_ranges) == 1 for t in tasks)
    requests.take()
    batches = [b for t in tasks for _, b in execute(t, resolver=sp.resolver)]
    assert requests.take() == {"GET (ranged)": len(tasks)}
    assert _rows(pa.Table.from_batches(batches, schema=local.schema)) == _rows(local)
