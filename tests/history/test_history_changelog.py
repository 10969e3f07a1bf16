"""The changelog history fixture (issue 34): a job on the changelog state backend whose first
checkpoints are the change log alone, and session windows merged in that log (``MERGE_NS``).

The change feed of ``history-changelog`` against the oracle's dumps is checked with the other
history fixtures (tests/test_history.py). Here: the fixture's shape (log-only versions, then
versions on a materialized base), and the session-window operators of a log-only version: list
contents merged by concatenation (against the oracle), reducing state merged without the job's
function where Flink needs none (against the oracle), and the values that only the job's function
could merge shown as ``<state>/unmerged`` rows (the oracle cannot restore that operator: Flink's
own restore fails on such a merge; the expected rows follow from ``ChangelogHistoryJob.java``).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pytest
from support.series import FIXTURES, canonical

import statequery
from statequery.metadata.changelog import UNMERGED_SUFFIX
from statequery.metadata.handles import ChangelogHandle

FIXTURE = FIXTURES / "history-changelog"
#: HistoryJob.KEYS; cycle 0 touches the first four
KEYS = ("user-0", "user-1", "", "\0", "\U0001f600", "user-5", "k\0x", "user-7")
MINUTE = 60_000


def _window(start_min: int, end_min: int) -> dict[str, datetime]:
    def at(m: int) -> datetime:
        return datetime.fromtimestamp(m * 60, tz=timezone.utc)

    return {"start": at(start_min), "end": at(end_min)}


def _plain(namespace: dict[str, Any]) -> tuple[int, int]:
    return (int(namespace["start"].timestamp() * 1000), int(namespace["end"].timestamp() * 1000))


def _dump(checkpoint_id: int) -> list[dict[str, Any]]:
    path = FIXTURES / "dump" / f"history-changelog-chk-{checkpoint_id}.jsonl"
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_the_first_versions_are_the_change_log_alone_then_a_materialized_base() -> None:
    job = statequery.open_job(str(FIXTURE))
    shapes = {}
    for v in job.versions():
        assert v.checkpoint_id is not None and v.complete
        sp = job.version(v.checkpoint_id)
        handles = [sub.managed_keyed for op in sp.metadata.operators for sub in op.subtasks
                   if isinstance(sub.managed_keyed, ChangelogHandle)]
        assert len(handles) == 8  # four keyed operators at parallelism 2
        shapes[v.checkpoint_id] = {bool(h.materialized) for h in handles}
    assert shapes == {1: {False}, 2: {False}, 3: {True}, 4: {True}, 5: {True}, 6: {True}}
    job.close()


@pytest.mark.parametrize("state", ["window-contents", "_timer_state/event_window-timers"])
def test_sessions_merged_in_a_log_only_version_equal_flinks_restore(
    state: str, decode_path: str
) -> None:
    """Checkpoint 1 is the change log alone: each key's sessions [0, 30) and [50, 80) minutes
    merge when the record at 25 minutes bridges them. ``sessions`` (list contents: merged by
    concatenation) and ``session-sums`` (reducing: its sessions only grow at their end, so each
    merge has at most one value and needs no function) equal the oracle's restore."""
    sp = statequery.open_job(str(FIXTURE)).version(1)
    dump = _dump(1)
    for uid in ("sessions", "session-sums"):
        op = sp.operator(uid).operator_id
        want = {
            (e["key"], canonical(e["namespace"]), canonical(e.get("value")), e.get("timestamp"))
            for e in dump if e["operator_id"] == op and e["state"] == state
        }
        assert want, (uid, state)
        got = set()
        for r in sp.read(uid, state).to_pylist():
            start, end = _plain(r["namespace"])
            ts = r.get("timestamp")
            got.add((r["key"], canonical({"start": start, "end": end}),
                     canonical(r.get("value")),
                     None if ts is None else int(ts.timestamp() * 1000)))
        assert got == want, (uid, state)


def test_reducing_state_merges_that_need_the_function_are_unmerged_rows(decode_path: str) -> None:
    """``session-bridged`` in checkpoint 1: its ContinuousEventTimeTrigger's ``fire-time``
    (reducing, Min) of the sessions [0, 30) (fire at 20 min) and [50, 80) (fire at 60 min) of
    each of cycle 0's keys merges into the merged session [0, 80) (a trigger's state is in the
    window's own namespace) when the record at 25 minutes bridges them, and
    is not written again: both values are rows of ``fire-time/unmerged``, at the window each was
    in, each with the window it merges into and why. The operator's other states read whole:
    the sums (the window operator logs the job's sum after the merge), the timers."""
    sp = statequery.open_job(str(FIXTURE)).version(1)
    uid = "session-bridged"
    names = {r["state_name"] for r in sp.state_meta().to_pylist()
             if r["operator_id"] == sp.operator(uid).operator_id}
    assert "fire-time" + UNMERGED_SUFFIX in names
    rows = sp.read(uid, "fire-time" + UNMERGED_SUFFIX).to_pylist()
    got = {(r["key"], _plain(r["namespace"]), _plain(r["value"]["merges_into"]),
            r["value"]["value"]) for r in rows}
    want = set()
    for key in KEYS[:4]:
        want.add((key, (0, 30 * MINUTE), (0, 80 * MINUTE), 20 * MINUTE))
        want.add((key, (50 * MINUTE, 80 * MINUTE), (0, 80 * MINUTE), 60 * MINUTE))
    assert got == want
    assert len(rows) == len(want)
    assert {r["value"]["reason"] for r in rows} == {
        "MERGE_NS of a reducing state in the change log: merging two or more values needs the "
        "job's ReduceFunction, which the checkpoint does not hold"}
    # not merged: the target window holds no value of its own
    fire = sp.read(uid, "fire-time")
    assert fire.filter(pa.compute.is_in(fire["key"], pa.array(KEYS[:4]))).num_rows == 0
    sums = {(r["key"], _plain(r["namespace"]), r["value"])
            for r in sp.read(uid, "window-contents").to_pylist()}
    # key m's records m, m + 4, m + 8, in the session's state window [0, 30)
    assert sums == {(k, (0, 30 * MINUTE), 3 * m + 12) for m, k in enumerate(KEYS[:4])}
    timers = sp.read(uid, "_timer_state/event_window-timers")
    assert timers.num_rows > 0


def test_each_change_log_file_is_read_once_per_version() -> None:
    """One change-log file holds the change sets of every subtask of a task: the subtasks'
    handles, the model's listing of the log's states and the merges share one read of it per
    version (they read it once each before: 4.6 times the bytes over the change feed)."""
    from statequery.io import FileIO

    io = FileIO()
    job = statequery.open_job(str(FIXTURE), io=io)
    sp = job.version(2)  # the change log alone
    files = set()
    for op in sp.metadata.operators:
        for sub in op.subtasks:
            h = sub.managed_keyed
            if isinstance(h, ChangelogHandle):
                for part in h.non_materialized:
                    files |= {str(sp.resolver.location(s)) for s, _ in part.streams}
    assert len(files) > 1
    sizes = {f: len(io.new_input(f)) for f in files}
    io.stats.reset()
    rows = 0
    for r in sp.state_meta().to_pylist():
        if r["kind"] not in ("operator_list", "operator_union", "broadcast"):
            rows += sp.read(r["operator_id"], r["state_name"]).num_rows
    assert rows > 0
    assert {f: io.stats.bytes_read[f] for f in files} == sizes
    job.close()


def _keyed_reads(sp: Any) -> dict[tuple[str, str], list[str]]:
    out = {}
    for r in sp.state_meta().to_pylist():
        if r["kind"] not in ("operator_list", "operator_union", "broadcast"):
            rows = sp.read(r["operator_id"], r["state_name"]).to_pylist()
            out[(r["operator_id"], r["state_name"])] = sorted(repr(x) for x in rows)
    return out


def _log_files(sp: Any) -> set[str]:
    return {str(sp.resolver.location(s)) for op in sp.metadata.operators for sub in op.subtasks
            if isinstance(sub.managed_keyed, ChangelogHandle)
            for part in sub.managed_keyed.non_materialized for s, _ in part.streams}


@pytest.mark.parametrize(("before", "version"), [(1, 2), (3, 4), (4, 5), (5, 6)])
def test_a_version_resumes_from_the_one_before_on_the_same_base(
    before: int, version: int, decode_path: str
) -> None:
    """Versions on the same materialized base (or both the log alone): the later log starts
    with the earlier one's change sets, so reading the later version after the earlier one
    through the same FileIO (as a job's change feed does) applies only its own change sets to
    the earlier result: the base is not read again (only its headers, for the listing of the
    states), nor the earlier change sets' files, and every state reads as a fresh read of that
    version alone."""
    from statequery.io import FileIO

    io = FileIO()
    job = statequery.open_job(str(FIXTURE), io=io)
    old, new = job.version(before), job.version(version)
    _keyed_reads(old)
    io.stats.reset()
    new.state_meta()
    headers = {f: n for f, n in io.stats.bytes_read.items() if "/taskowned/" in f}
    got = _keyed_reads(new)
    read = {f for f, n in io.stats.bytes_read.items() if n}
    # the materialized base: only the headers the listing of the states reads
    assert {f: n for f, n in io.stats.bytes_read.items() if "/taskowned/" in f} == headers
    new_files = _log_files(new) - _log_files(old)
    assert read & _log_files(new) == new_files and new_files
    fresh = _keyed_reads(statequery.open_job(str(FIXTURE), io=FileIO()).version(version))
    assert got == fresh
    assert sum(len(v) for v in got.values()) > 0
