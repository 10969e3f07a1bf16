"""Every core (issue 33 item 2): large reads run their key-group ranges in worker processes
(statequery.parallel) and return the same tables, in the same order, as one process; errors of
a worker come back typed; small reads never start a pool."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from concurrent.futures import CancelledError
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


def test_slots_whose_lock_nobody_holds_are_removed_and_held_ones_kept() -> None:
    spool = Path(parallel._spool_dir())
    dead = spool / f"{parallel._SLOT_PREFIX}999999-deadbeef-1{parallel._SLOT_SUFFIX}"
    dead_lock = spool / f"{parallel._SLOT_PREFIX}999998-deadbeef{parallel._LOCK_SUFFIX}"
    dead_of_lock = spool / f"{parallel._SLOT_PREFIX}999998-deadbeef-3{parallel._SLOT_SUFFIX}"
    live_stem = f"{parallel._SLOT_PREFIX}{os.getpid()}-livelock"
    fd = parallel._hold_lock(str(spool / (live_stem + parallel._LOCK_SUFFIX)))
    assert fd is not None
    live = spool / f"{live_stem}-1{parallel._SLOT_SUFFIX}"
    for f in (dead, dead_lock, dead_of_lock, live):
        f.write_bytes(b"x" * 100)
    try:
        slots = parallel._Slots()
        assert not dead.exists()  # no lock file: its process is gone
        assert not dead_lock.exists() and not dead_of_lock.exists()  # a lock nobody holds
        assert live.exists()  # held (by this process here; any live process, any namespace)
        slots.remove()
    finally:
        os.close(fd)
        for f in (dead, dead_lock, dead_of_lock, live,
                  spool / (live_stem + parallel._LOCK_SUFFIX)):
            f.unlink(missing_ok=True)


def test_a_new_pool_never_reuses_the_slot_names_of_batches_still_held() -> None:
    from support.pieces import tagged

    parallel.shutdown()
    parallel.start(2)
    held = list(parallel.ordered_map(tagged, [(i, 30_000) for i in range(16)], 2))
    parallel.shutdown()  # the slot files go; the held batches keep their mappings
    parallel.start(2)
    list(parallel.ordered_map(tagged, [(500 + i, 30_000) for i in range(16)], 2))
    assert [b.column("value")[0].as_py() for _, b in held if b.num_rows] == [
        i for i in range(16) for _ in range(2)]
    assert all(len(set(b.column("value").to_pylist())) == 1 for _, b in held if b.num_rows)
    # a read suspended across shutdown() and another read: its own rows or an error, never
    # the other read's (its results are not found under a name the other read reuses)
    suspended = parallel.ordered_map(tagged, [(i, 30_000) for i in range(16)], 2)
    first = [next(suspended) for _ in range(3)]
    parallel.shutdown()
    parallel.start(2)
    list(parallel.ordered_map(tagged, [(700 + i, 30_000) for i in range(16)], 2))
    seen: list[int] = [v for _, b in first for v in set(b.column("value").to_pylist())]
    try:
        for _, b in suspended:
            seen.extend(set(b.column("value").to_pylist()))
    except (OSError, CancelledError):
        pass
    assert seen and all(v < 16 for v in seen)
    parallel.shutdown()


def _in_thread(fn: Any, timeout: float = 120) -> None:
    import threading

    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "hung"
    if errors:
        raise errors[0]


def test_another_worker_count_while_the_pool_warms_or_is_in_use_does_not_hang() -> None:
    from support.pieces import tagged

    parallel.shutdown()

    def reads() -> None:
        # over before the worker is up (its warm-up still running), then another size
        assert sum(b.num_rows for _, b in parallel.ordered_map(tagged, [(1, 10), (2, 10)], 2)) == 20
        assert sum(b.num_rows for _, b in parallel.ordered_map(
            tagged, [(i, 1_000) for i in range(20)], 3)) == 20_000
        # a read inside another's iteration asks for a third size: the pool in use stays
        outer = parallel.ordered_map(tagged, [(i, 1_000) for i in range(20)], 3)
        n = 0
        for _, b in outer:
            n += b.num_rows
            if n == 1_000:
                inner = list(parallel.ordered_map(tagged, [(i, 100) for i in range(10)], 2))
                assert sum(x.num_rows for _, x in inner) == 1_000
        assert n == 20_000

    _in_thread(reads)
    parallel.shutdown()


def test_a_pool_whose_worker_died_is_replaced() -> None:
    import signal
    import time

    from support.pieces import tagged

    parallel.shutdown()
    parallel.start(2)
    pool = parallel._pool
    assert pool is not None
    for proc in list(pool._processes.values()):
        os.kill(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while not pool._broken and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool._broken
    got = list(parallel.ordered_map(tagged, [(i, 1_000) for i in range(12)], 2))
    assert sum(b.num_rows for _, b in got) == 12_000
    assert parallel._pool is not pool
    parallel.shutdown()


def test_a_worker_that_dies_mid_read_leaves_its_items_to_the_caller() -> None:
    from support.pieces import dying_in_worker

    parallel.shutdown()
    parallel.start(2)
    got = list(parallel.ordered_map(dying_in_worker, [(i, os.getpid()) for i in range(10)], 2))
    assert [b.column("value")[0].as_py() for _, b in got if b.num_rows] == [
        i for i in range(10) for _ in range(2)]
    assert {b.column("pid")[0].as_py() for _, b in got if b.num_rows} == {os.getpid()}
    parallel.shutdown()


def test_a_forked_child_leaves_the_parents_pool_and_slots_alone() -> None:
    from support.pieces import tagged

    parallel.shutdown()
    parallel.start(2)
    held = list(parallel.ordered_map(tagged, [(i, 20_000) for i in range(12)], 2))
    files = _slot_files()
    assert files
    pid = os.fork()
    if pid == 0:  # the child ends as a script would: its exit handlers run
        try:
            parallel.shutdown()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert _slot_files() == files
    again = list(parallel.ordered_map(tagged, [(i, 20_000) for i in range(12)], 2))
    assert sum(b.num_rows for _, b in again) == sum(b.num_rows for _, b in held) == 240_000
    parallel.shutdown()


def test_a_slot_with_no_room_hands_the_item_back(monkeypatch: pytest.MonkeyPatch) -> None:
    from support.pieces import tagged

    from statequery.backends.fastpath import PURE_ENV

    monkeypatch.setattr(parallel, "_in_worker", False)  # run here as a worker would
    # /dev/full takes no allocation: the worker side gives the item back unwritten
    result = parallel._run_piece(tagged, (1, 10), "/dev/full", os.environ.get(PURE_ENV))
    assert result[:4] == ("/dev/full", -1, [], True)
    assert "/dev/full" not in parallel._SlotSink.maps


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


def _in_process(monkeypatch: pytest.MonkeyPatch, fn: Any, item: Any
                ) -> tuple[Any, list[tuple[str, Any]], Any]:
    """``fn(item)`` run here as a worker runs it (into a slot of this process's), and read back
    as the caller reads it: (the worker's result, the pairs read, the slots)."""
    from statequery.backends.fastpath import PURE_ENV

    monkeypatch.setattr(parallel, "_in_worker", False)
    monkeypatch.setattr(parallel, "_arena_off", False)
    slots = parallel._Slots()
    slot = slots.take()
    result = parallel._run_piece(fn, item, slot, os.environ.get(PURE_ENV))
    region = parallel._open_result(result, slots)
    assert region is not None
    pairs = list(parallel._read_result(region, result[2]))
    return result, pairs, slots


def _forget(slots: Any) -> None:
    for path in list(parallel._SlotSink.maps):
        if path.startswith(os.path.join(slots.spool, slots.stem)):
            fd, _mm = parallel._SlotSink.maps.pop(path)
            os.close(fd)
    slots.remove()


@pytest.mark.parametrize("rows", [1, 7, 2_000])
def test_every_arrow_type_comes_back_from_a_slot_as_it_was(
    rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from support.pieces import zoo

    result, pairs, slots = _in_process(monkeypatch, zoo, (rows, rows))
    try:
        expected = list(zoo((rows, rows)))
        assert [n for n, _ in pairs] == [n for n, _ in expected]
        for (_, got), (_, want) in zip(pairs, expected, strict=True):
            got.validate(full=True)
            assert got.schema == want.schema
            assert repr(got.to_pylist()) == repr(want.to_pylist())  # NaN and -0.0 as they were
        kinds = [kind for _, kind, _ in result[2]]
        assert kinds.count(parallel._RAW) == len(expected) - 1  # each batch but the dictionary
        assert kinds[-1] == parallel._IPC
        # slices of one batch share their buffers in the slot, as they did in the worker
        first, second = pairs[0][1], pairs[1][1]
        if rows > 1:
            assert first.column("string").buffers()[2].address == \
                second.column("string").buffers()[2].address
    finally:
        del pairs
        _forget(slots)


def test_a_reads_buffers_are_built_in_the_slot_not_copied(
    monkeypatch: pytest.MonkeyPatch, decode_path: str
) -> None:
    from support.pieces import decoded_piece

    from statequery.backends import _read

    path = str(fixture_dir("datastream-hashmap-canonical"))
    key_group = _busiest_key_group(path)
    copied: list[int] = []
    put = parallel._SlotSink.put

    def counting_put(self: Any, address: int, size: int) -> int:
        copied.append(size)
        return put(self, address, size)

    monkeypatch.setattr(parallel._SlotSink, "put", counting_put)
    result, pairs, slots = _in_process(monkeypatch, decoded_piece, (path, key_group))
    try:
        expected = list(decoded_piece((path, key_group)))
        assert [n for n, _ in pairs] == [n for n, _ in expected]
        for (_, got), (_, want) in zip(pairs, expected, strict=True):
            assert got.equals(want)
        assert result[3] is True and _read.arena_live() == 0  # nothing outlived the item
        total = sum(b.size for _, b in pairs for c in b.columns for b in c.buffers() if b)
        if decode_path == "compiled":
            assert sum(copied) < total / 4  # only the validity bitmaps built in Python
        else:
            assert sum(copied) >= total / 2  # no arena on the pure path: every buffer copied
    finally:
        del pairs
        _forget(slots)


def _busiest_key_group(path: str) -> int:
    sp = statequery.open(path, use_snapshot=False)
    counts: dict[int, int] = {}
    for op in sp.keyed_operators():
        for table in sp.read_states(op).values():
            for kg in table.column("key_group").to_pylist():
                counts[kg] = counts.get(kg, 0) + 1
    return max(counts, key=lambda kg: counts[kg])


def test_a_buffer_kept_after_its_item_retires_its_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    import support.pieces as pieces

    from statequery.backends import fastpath

    if fastpath.compiled() is None:
        pytest.fail("the compiled path is not built")
    path = str(fixture_dir("datastream-hashmap-canonical"))
    key_group = _busiest_key_group(path)
    monkeypatch.setattr(pieces, "_kept", [])
    result, pairs, slots = _in_process(monkeypatch, pieces.keeping, (path, key_group))
    try:
        kept = pieces._kept[0]
        before = kept.to_pylist()
        assert result[3] is False  # not reused: the kept batch's bytes stay in it
        assert parallel._arena_off  # and this worker builds no more buffers in slots
        slot = result[0]
        del pairs
        import gc

        gc.collect()
        assert slot not in slots.free
        # the next item is written as copies into another slot; the kept batch is unchanged
        other = slots.take()
        assert other != slot
        second = parallel._run_piece(pieces.decoded_piece, (path, key_group), other, None)
        assert second[3] is True and all(k != parallel._IPC for _, k, _ in second[2])
        assert kept.to_pylist() == before
    finally:
        pieces._kept.clear()
        _forget(slots)


def test_a_pool_started_without_waiting_is_ready_soon_and_reads_the_same() -> None:
    import time

    from support.pieces import tagged

    parallel.shutdown()
    parallel.start(2, wait=False)  # returns at once: the worker starts meanwhile
    got = list(parallel.ordered_map(tagged, [(i, 1_000) for i in range(20)], 2))
    assert [b.column("value")[0].as_py() for _, b in got if b.num_rows] == [
        i for i in range(20) for _ in range(2)]
    deadline = time.monotonic() + 60
    while parallel._ready_pool is not parallel._pool and time.monotonic() < deadline:
        time.sleep(0.05)
    assert parallel._ready_pool is parallel._pool is not None
    parallel.start(2, wait=False)  # a ready pool: nothing more to do
    assert parallel._ready_pool is parallel._pool
    parallel.shutdown()


_RSS_AFTER_WARM_UP = """
import sys
import statequery.scan
from statequery import parallel

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10

before = rss()
parallel._warm_up(("statequery.scan",), sys.argv[1] == "fault-in")
print(rss() - before)
"""


@pytest.mark.parametrize("fault_in", [True, False])
def test_a_worker_faults_in_its_heap_only_when_asked(fault_in: bool) -> None:
    """A worker warmed up ahead of the reads faults in a piece's heap (kept by glibc: its first
    piece faults in nothing); one warmed up by a read that waits for it does not."""
    import platform
    import subprocess
    import sys

    assert platform.libc_ver()[0] == "glibc"  # the malloc settings are glibc's
    out = subprocess.run(
        [sys.executable, "-c", _RSS_AFTER_WARM_UP, "fault-in" if fault_in else "no"],
        capture_output=True, text=True, check=True)
    grown = int(out.stdout)
    if fault_in:
        assert grown >= parallel._HEAP_BYTES * 9 // 10
    else:
        assert grown < 16 << 20


def test_a_read_starting_the_pool_does_not_wait_for_a_fault_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from support.pieces import tagged

    asked: list[bool] = []
    submit = parallel._submit_warm_ups

    def recorded(pool: Any, size: int, modules: tuple[str, ...], fault_in: bool) -> Any:
        asked.append(fault_in)
        return submit(pool, size, modules, fault_in)

    monkeypatch.setattr(parallel, "_submit_warm_ups", recorded)
    parallel.shutdown()
    got = list(parallel.ordered_map(tagged, [(i, 1_000) for i in range(8)], 2))
    assert len(got) == 16
    parallel.shutdown()
    parallel.start(2)  # ahead of the reads, waited for
    parallel.shutdown()
    parallel.start(2, wait=False)  # the CLI: its read comes at once
    parallel.shutdown()
    assert asked == [False, True, False]
