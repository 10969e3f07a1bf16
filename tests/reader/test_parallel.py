"""Every core (issue 33 item 2): large reads run their key-group ranges in worker processes
(statequery.parallel) and return the same tables, in the same order, as one process; errors of
a worker come back typed; small reads never start a pool."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import fixture_dir

import statequery
from statequery import parallel, scan
from statequery.exceptions import CorruptStateError, InvalidOptionError, StatequeryError

NAMES = [
    "datastream-hashmap-canonical",
    "datastream-rocksdb-canonical",
    "datastream-hashmap-checkpoint",
    "datastream-hashmap-checkpoint-snappy",
    "datastream-rocksdb-native",
]


@pytest.fixture
def every_read_parallel(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fixtures are small: every read goes to the pool, cut into one-key-group ranges."""
    monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(parallel, "PIECES_PER_WORKER", 64)
    parallel.start(2)  # the worker takes pieces from the first one on (a cold pool would
    yield              # start while this process read such small reads alone)
    parallel.shutdown()


def _open(name: str) -> Any:
    return statequery.open(str(fixture_dir(name)), use_snapshot=False)


@pytest.mark.parametrize("name", NAMES)
def test_parallel_reads_equal_one_process(
    name: str, decode_path: str, every_read_parallel: None
) -> None:
    sp = _open(name)
    compared = 0
    for op in sp.keyed_operators():
        one = sp.read_states(op, workers=1)
        two = sp.read_states(op, workers=2)
        assert list(one) == list(two)
        for state, table in one.items():
            assert two[state].equals(table), f"{op.display_name}/{state}"
            compared += table.num_rows
        for s in op.states:
            if s.keyed_rows:
                assert sp.read(s, workers=2).equals(sp.read(s, workers=1))
    assert compared > 0
    assert parallel._pool is not None  # the pool did run them


def test_parallel_pieces_are_key_group_ranges_in_order(every_read_parallel: None) -> None:
    sp = _open("datastream-hashmap-canonical")
    op = sp.keyed_operators()[0]
    tasks = scan.plan_states(sp.model, sp.context,
                                        [s for s in op.states if s.keyed_rows])
    pieces = scan.plan_pieces(tasks, 2)
    assert pieces is not None and len(pieces) > len(tasks)
    groups = [kg for p in pieces if p.key_groups for kg in p.key_groups]
    per_subtask = {t.subtask: [kg for p in pieces if p.subtask == t.subtask
                               for kg in p.key_groups or ()] for t in tasks}
    for kgs in per_subtask.values():
        assert kgs == sorted(kgs)
    assert len(groups) == len(set(groups))


def _corrupted(tmp_path: Path) -> Path:
    """A copy of a canonical fixture with the first bytes of a key group in the middle of the
    first keyed subtask's stream overwritten."""
    dst = tmp_path / "sp"
    shutil.copytree(fixture_dir("datastream-hashmap-canonical"), dst)
    sp = statequery.open(str(dst), use_snapshot=False)
    st = next(st for st in sp.keyed_operators()[0].subtasks if st.keyed_handle is not None)
    handle = st.keyed_handle
    offsets = [o for o in handle.offsets if o > 0]
    target = Path(sp.resolver.location(handle.delegate))
    data = bytearray(target.read_bytes())
    at = offsets[len(offsets) // 2]
    data[at:at + 16] = b"\x7f" * 16
    target.write_bytes(bytes(data))
    sp.close()
    return dst


def test_worker_errors_are_the_same_typed_errors(
    tmp_path: Path, every_read_parallel: None
) -> None:
    path = _corrupted(tmp_path)
    errors = []
    for workers in (1, 2):
        sp = statequery.open(str(path), use_snapshot=False)
        op = sp.keyed_operators()[0]
        with pytest.raises(StatequeryError) as e:
            sp.read_states(op, workers=workers)
        errors.append(e.value)
    assert type(errors[1]) is type(errors[0])
    assert str(errors[1]) == str(errors[0])
    if isinstance(errors[0], CorruptStateError):
        assert errors[1].__dict__ == errors[0].__dict__


def test_workers_option_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(parallel.WORKERS_ENV, raising=False)
    assert parallel.resolve_workers() == parallel.default_workers() >= 1
    assert parallel.resolve_workers(3) == 3
    monkeypatch.setenv(parallel.WORKERS_ENV, "5")
    assert parallel.resolve_workers() == 5
    assert parallel.resolve_workers(1) == 1
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(parallel.WORKERS_ENV, bad)
        with pytest.raises(InvalidOptionError, match=parallel.WORKERS_ENV):
            parallel.resolve_workers()
    monkeypatch.delenv(parallel.WORKERS_ENV)
    with pytest.raises(InvalidOptionError):
        parallel.resolve_workers(0)
    sp = _open("datastream-hashmap-canonical")
    with pytest.raises(InvalidOptionError):
        sp.read(sp.keyed_operators()[0].states[0], workers=0)


def test_small_reads_and_lookups_stay_in_process() -> None:
    parallel.shutdown()
    sp = _open("datastream-hashmap-canonical")
    op = sp.keyed_operators()[0]
    sp.read_states(op, workers=2)  # a few KB: below MIN_PARALLEL_BYTES
    tasks = scan.plan_states(sp.model, sp.context,
                                        [s for s in op.states if s.keyed_rows],
                                        keys=["no-such-key"])
    assert scan.plan_pieces(tasks, 2) is None
    assert parallel._pool is None


@pytest.mark.parametrize(("old", "new"), [("chk-1", "chk-2"), ("savepoint", "chk-1")])
def test_parallel_diff_equals_one_process(old: str, new: str, every_read_parallel: None) -> None:
    from support.series import series_dir

    a = statequery.open(str(series_dir(old)))
    b = statequery.open(str(series_dir(new)))
    one = a.diff(b, workers=1)
    two = a.diff(b, workers=2)
    assert one.num_rows > 20
    assert two.equals(one)
    assert parallel._pool is not None


@pytest.mark.parametrize("name", ["datastream-hashmap-canonical", "datastream-rocksdb-native",
                                  "datastream-hashmap-checkpoint"])
@pytest.mark.parametrize("top", [3, 10])
def test_parallel_stats_equal_one_process(name: str, top: int, every_read_parallel: None) -> None:
    sp = _open(name)
    one = sp.stats(top=top, workers=1)
    two = sp.stats(top=top, workers=2)
    assert one.table.num_rows > 10
    assert two.table.equals(one.table)
    assert two.heaviest_keys.equals(one.heaviest_keys)
    assert (two.max_parallelism, two.parallelism) == (one.max_parallelism, one.parallelism)
    assert parallel._pool is not None


# -- the schedule and the result slots (statequery.parallel.ordered_map) ------------------------


def _slot_files() -> list[str]:
    spool = parallel._spool_dir()
    mine = f"{parallel._SLOT_PREFIX}{os.getpid()}-"
    return [n for n in os.listdir(spool) if n.startswith(mine)]


def test_the_calling_process_and_a_worker_share_the_items_in_order() -> None:
    from support.pieces import tagged

    parallel.shutdown()
    parallel.start(2)  # the worker ready: it takes items from the first one on
    items = [(i, 20_000) for i in range(40)]
    got = list(parallel.ordered_map(tagged, items, 2))
    values = [v for _, b in got for v in b.column("value").to_pylist()]
    assert values == [i for i in range(40) for _ in range(20_000)]
    by_item = {b.column("value")[0].as_py(): b.column("pid")[0].as_py()
               for _, b in got if b.num_rows}
    pids = set(by_item.values())
    assert os.getpid() in pids and len(pids) == 2  # workers=2: this process and one worker
    assert parallel._pool_size == 1
    parallel.shutdown()


def test_batches_stay_valid_while_held_and_their_slots_are_reused_once_dropped() -> None:
    from support.pieces import tagged

    parallel.shutdown()
    parallel.start(2)
    held = list(parallel.ordered_map(tagged, [(i, 50_000) for i in range(24)], 2))
    assert len({b.column("pid")[0].as_py() for _, b in held if b.num_rows}) == 2
    files_held = len(_slot_files())
    # a second read while the first one's batches are held: their slots must not be reused
    second = list(parallel.ordered_map(tagged, [(1000 + i, 50_000) for i in range(24)], 2))
    assert [b.column("value")[0].as_py() for _, b in held if b.num_rows] == [
        i for i in range(24) for _ in range(2)]
    assert all(set(b.column("value").to_pylist()) == {b.column("value")[0].as_py()}
               for _, b in held if b.num_rows)
    assert len(_slot_files()) > files_held  # new slots: the held ones are taken
    del held, second
    import gc

    gc.collect()
    before = len(_slot_files())
    for _ in range(3):  # batches dropped as they are read: the same few slots go round
        for _, b in parallel.ordered_map(tagged, [(i, 50_000) for i in range(24)], 2):
            del b
    assert len(_slot_files()) == before
    parallel.shutdown()
    assert _slot_files() == []


def test_an_early_stop_and_an_error_leave_no_slot_and_the_pool_reads_on() -> None:
    from support.pieces import failing_at, tagged

    parallel.shutdown()
    parallel.start(2)
    it = parallel.ordered_map(tagged, [(i, 10_000) for i in range(30)], 2)
    first = [next(it) for _ in range(5)]
    it.close()
    assert [b.column("value")[0].as_py() for _, b in first if b.num_rows][:3] == [0, 0, 1]
    seen: list[int] = []
    with pytest.raises(CorruptStateError, match="item 13 is broken"):
        for _, b in parallel.ordered_map(failing_at, [(i, 1_000) for i in range(30)], 2):
            seen.extend(set(b.column("value").to_pylist()))
    # every item before 13, then the error (with 13's first batch when this process had it)
    assert set(range(13)) <= set(seen) <= set(range(14))
    again = list(parallel.ordered_map(tagged, [(i, 1_000) for i in range(30)], 2))
    assert sum(b.num_rows for _, b in again) == 30_000
    del first, again
    parallel.shutdown()
    assert _slot_files() == []


def test_slots_left_by_a_process_that_died_are_removed(tmp_path: Path) -> None:
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    spool = parallel._spool_dir()
    orphan = Path(spool) / f"{parallel._SLOT_PREFIX}{dead}-1{parallel._SLOT_SUFFIX}"
    alive = Path(spool) / f"{parallel._SLOT_PREFIX}1-1{parallel._SLOT_SUFFIX}"  # pid 1 lives
    orphan.write_bytes(b"x" * 100)
    alive.write_bytes(b"x" * 100)
    try:
        parallel._Slots()
        assert not orphan.exists()
        assert alive.exists()
    finally:
        orphan.unlink(missing_ok=True)
        alive.unlink(missing_ok=True)


def test_an_error_in_the_worker_comes_back_typed_with_its_attributes() -> None:
    from support.pieces import failing_in_worker

    parallel.shutdown()
    parallel.start(2)
    with pytest.raises(CorruptStateError) as e:
        for _ in parallel.ordered_map(failing_in_worker, [(i, os.getpid()) for i in range(8)], 2):
            pass
    # item 1 is the worker's (the pool was ready: its first claim is the item after the one
    # this process reads first); raised here as the same class, message and attributes
    assert str(e.value) == "item-1 at byte 1: item 1 failed in worker: bad bytes"
    assert (e.value.source, e.value.offset, e.value.reason) == (
        "item-1", 1, "item 1 failed in worker: bad bytes")
    parallel.shutdown()
